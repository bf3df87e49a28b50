"""tools/pfllib_crosscheck.py: PFLlib's own FedAvg/FedALA beside ours, round by round.

The report aligns PFLlib's evaluation k (at the start of a round: after k rounds) with our FedAvg's round
k and our FedALA's round k+1, and docs/results.md pastes what it prints for the committed files. `run`
is checked on a stand-in for PFLlib's `system/` with the same names (its real code needs the network)."""
import csv
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from tools import pfllib_crosscheck as xc

TOOL = os.path.join(ROOT, "tools", "pfllib_crosscheck.py")


def write_csv(path, header, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def fake_results(root, pfllib, ours):
    """pfllib: {method: [test_acc of evaluation 0, 1, ...]}; ours: {method: {seed: [test_acc of round 1, ...]}}."""
    for method, accs in pfllib.items():
        write_csv(os.path.join(root, "crosscheck-pfllib", f"{method}-dir-s0.csv"), ["round", "test_acc"],
                  list(enumerate(accs)))
    for method, seeds in ours.items():
        for seed, accs in seeds.items():
            run = os.path.join(root, "pfllib-fmnist", "dir", method, f"seed{seed}", f"{method}-x-s{seed}-20261128-000000")
            write_csv(os.path.join(run, "metrics.csv"), ["round", "test_acc", "seconds"],
                      [(r, a, 1.0) for r, a in enumerate(accs, 1)])


def test_the_rows_align_pfllib_s_evaluation_k_with_our_fedavg_round_k_and_fedala_round_k_plus_1(tmp_path, capsys):
    fake_results(str(tmp_path), {"fedavg": [10, 20, 30], "fedala": [10, 80, 90]},
                 {"fedavg": {0: [19, 29], 1: [21, 31]}, "fedala": {0: [10, 81, 91], 1: [12, 79, 87]}})
    xc.report(str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| 0 | 10.00 | - | 10.00 | 10.00 / 12.00 (11.00 ± 1.41) |"
    # k = 1: FedAvg's round 1 (19, 21), FedALA's round 2 (81, 79)
    assert lines[3] == "| 1 | 20.00 | 19.00 / 21.00 (20.00 ± 1.41) | 80.00 | 81.00 / 79.00 (80.00 ± 1.41) |"
    assert lines[4] == "| 2 | 30.00 | 29.00 / 31.00 (30.00 ± 1.41) | 90.00 | 91.00 / 87.00 (89.00 ± 2.83) |"
    # the summary leaves out k = 0 (the initial model, set by the seed): FedALA +0 and +1 -> +0.50
    assert "- FedAvg: 2 evaluations (k = 1-2); PFLlib minus our seeds' mean: +0.00 on average, from +0.00 to " \
           "+0.00; above our best seed in 0, below our worst in 0" in lines
    assert "- FedALA: 2 evaluations (k = 1-2); PFLlib minus our seeds' mean: +0.50 on average, from +0.00 to " \
           "+1.00; above our best seed in 0, below our worst in 0" in lines


def test_each_seed_s_newest_run_is_read(tmp_path, capsys):
    fake_results(str(tmp_path), {"fedavg": [10, 20]}, {"fedavg": {0: [25]}})
    older = tmp_path / "pfllib-fmnist" / "dir" / "fedavg" / "seed0" / "fedavg-x-s0-20261101-000000"
    write_csv(str(older / "metrics.csv"), ["round", "test_acc"], [(1, 99)])
    xc.report(str(tmp_path))
    assert "| 1 | 20.00 | 25.00 | - | - |" in capsys.readouterr().out


def test_docs_paste_the_report_of_the_committed_files(capsys):
    xc.report(os.path.join(ROOT, "results"))
    printed = [line for line in capsys.readouterr().out.splitlines() if line]
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        doc = f.read()
    section = doc.split("### Cross-check: PFLlib's own FedAvg and FedALA", 1)[1].split("\n## ", 1)[0]
    assert "python tools/pfllib_crosscheck.py report" in section
    table = [line for line in printed if line.startswith("|")]
    assert "\n".join(table) in section, "\n".join(printed)
    for line in printed[len(table):]:
        assert line in section, line


def test_main_py_s_defaults_are_read_from_its_source_without_running_it(tmp_path):
    (tmp_path / "main.py").write_text(
        "import argparse\nraise SystemExit('module level ran')\n"
        "if __name__ == '__main__':\n    total_start = time.time()\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('-lr', '--local_learning_rate', type=float, default=0.005)\n"
        "    parser.add_argument('-nc', '--num_clients', type=int, default=20)\n"
        "    args = parser.parse_args()\n    run(args)\n")
    args = xc.main_parser_defaults(str(tmp_path)).parse_args([])
    assert (args.local_learning_rate, args.num_clients) == (0.005, 20)


STAND_IN = {  # PFLlib's names, with a server whose train() evaluates at the start of each round
    "main.py": "import argparse\nif __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n"
               "    parser.add_argument('-data', '--dataset', default='MNIST')\n"
               "    parser.add_argument('-m', '--model', default='CNN')\n"
               "    parser.add_argument('-algo', '--algorithm', default='FedAvg')\n"
               "    parser.add_argument('-dev', '--device', default='cuda')\n"
               "    parser.add_argument('-ncl', '--num_classes', type=int, default=10)\n"
               "    args = parser.parse_args()\n",
    "flcore/__init__.py": "", "flcore/trainmodel/__init__.py": "", "flcore/servers/__init__.py": "",
    "flcore/trainmodel/models.py": "import torch\ndef FedAvgCNN(in_features, num_classes, dim):\n"
                                   "    return torch.nn.Linear(dim, num_classes)\n",
    "flcore/servers/serverbase.py": "import torch\nclass Server:\n    def __init__(self, args, times):\n"
                                    "        self.args, self.rs_test_acc, self.rs_train_loss = args, [], []\n"
                                    "    def evaluate(self, acc=None, loss=None):\n"
                                    "        self.rs_test_acc.append(float(torch.rand(())))\n"
                                    "        self.rs_train_loss.append(len(self.rs_test_acc) / 10)\n"
                                    "    def train(self):\n        for i in range(2001):\n            self.evaluate()\n",
    "flcore/servers/serveravg.py": "from flcore.servers.serverbase import Server\nclass FedAvg(Server):\n    pass\n",
    "flcore/servers/serverala.py": "from flcore.servers.serverbase import Server\nclass FedALA(Server):\n    pass\n",
}


def stand_in(tmp_path):
    system = tmp_path / "system"
    for name, text in STAND_IN.items():
        (system / name).parent.mkdir(parents=True, exist_ok=True)
        (system / name).write_text(text)
    return str(system)


def test_drive_writes_the_asked_evaluations_seeded_as_main_py(tmp_path, monkeypatch):
    system = stand_in(tmp_path)
    monkeypatch.chdir(system)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = str(tmp_path / "fedavg.csv")
    try:
        xc.drive("fedavg", 3, out, system)
    finally:
        for name in [m for m in sys.modules if m == "flcore" or m.startswith("flcore.")]:
            del sys.modules[name]
    with open(out) as f:
        rows = list(csv.DictReader(f))
    import torch
    torch.manual_seed(0)
    torch.nn.Linear(1024, 10)  # the model is built after seeding, before the first evaluation draws
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert [float(r["test_acc"]) for r in rows] == pytest.approx([100 * float(torch.rand(())) for _ in range(3)], abs=1e-6)
    assert [r["train_loss"] for r in rows] == ["0.100000", "0.200000", "0.300000"]
    with pytest.raises(FileExistsError):  # never over another run's rows
        xc.drive("fedavg", 1, out, system)
    for name in [m for m in sys.modules if m == "flcore" or m.startswith("flcore.")]:
        del sys.modules[name]


@pytest.mark.parametrize("case", ["out exists", "no clients", "evaluations"])
def test_bad_input_is_one_line_and_status_2(tmp_path, case):
    out = tmp_path / "x.csv"
    data = tmp_path / "data"
    (data / "FashionMNIST-dir" / "train").mkdir(parents=True)
    if case == "out exists":
        out.write_text("round,test_acc\n0,5.8\n")
    if case == "no clients":
        data = tmp_path / "elsewhere"
    extra = ["--evaluations", "0"] if case == "evaluations" else []
    p = subprocess.run([sys.executable, TOOL, "run", "fedavg", "--pfllib", str(tmp_path), "--data-dir", str(data),
                        "--out", str(out), *extra], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
    assert {"out exists": "exists", "no clients": "pfllib_fmnist.sh", "evaluations": "at least 1"}[case] in p.stderr
    if case == "out exists":
        assert out.read_text() == "round,test_acc\n0,5.8\n"
