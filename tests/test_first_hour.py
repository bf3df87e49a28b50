"""A newcomer's first hour: a run's config.json holds its command as one line to paste into a shell beside the list
(older runs without it read as before), README's set-up environment is ignored by git."""
import json
import re
import os
import shlex
import subprocess
import sys

import pytest

import fedavg
import run_folder
from conftest import ROOT, needs_flower
from tools import compare, run_records


def test_config_json_has_a_command_line_a_shell_splits_back_into_the_command(tmp_path, monkeypatch):
    out = tmp_path / "runs with 'quotes' and spaces"
    argv = ["fedavg.py", "--dataset", "synthetic", "--num-clients", "3", "--rounds", "1", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    run_folder.run_main(fedavg.main, argv[1:])
    (folder,) = os.listdir(out)
    config = run_folder.read_json(os.path.join(out, folder, "config.json"))
    assert shlex.split(config["command_line"]) == ["python", *config["command"]]
    assert config["command"][:len(argv)] == argv and config["command_line"].startswith("python fedavg.py ")
    assert config["headline_metric"] == fedavg.HEADLINE_METRIC


def test_a_config_json_without_a_command_line_reads_as_before(tmp_path):
    folder = tmp_path / "fedavg-synthetic-s0-20260101-000000"
    folder.mkdir()
    config = {"algorithm": "fedavg", "args": {"dataset": "synthetic", "rounds": 2, "seed": 0},
              "command": ["fedavg.py", "--dataset", "synthetic", "--rounds", "2"]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.csv").write_text("round,test_acc,seconds\n1,10.0,1.0\n2,20.0,2.0\n")
    assert run_folder.read_json(str(folder / "config.json")) == config
    run = compare.load_run(str(folder))
    assert run["config"] and not run["damage"] and run["flags"] == ["unfinished 2/2"]
    (folder / "config.json").write_text(json.dumps({**config, "command_line": ["python"]}))
    assert run_records.main([str(folder)]) == 2  # the diagnosis names the field


def test_the_set_up_s_environment_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0


@needs_flower  # flower/app.py needs requirements-flower.txt, even for --help
def test_flower_app_help_lists_every_mode_and_its_own_flags():
    """Each first argument flower/app.py's main acts on, and each of its own flags, is in its --help."""
    app = subprocess.run([sys.executable, "flower/app.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert app.returncode == 0, app.stderr
    source = open(os.path.join(ROOT, "flower", "app.py")).read().split("\ndef main(", 1)[1]
    modes = set(re.findall(r'argv\[:1\] == \["(--[a-z-]+)"\]', source)) | {"--resume", "--federation"}
    assert {"--app-folder", "--node-worker"} <= modes
    for mode in modes:
        assert mode in app.stdout, mode
    for line in ["python flower/app.py ALGORITHM [flags]", "python flower/app.py --app-folder DIR",
                 "python flower/app.py --resume RUN_DIR", "python flower/app.py ALGORITHM --federation NAME"]:
        assert line in app.stdout, line
    for flag in ["--federation NAME", "--min-clients M", "--round-timeout S", "--wait-for-nodes S",
                 "--clients-per-gpu K"]:
        assert f"  {flag}" in app.stdout, flag


@pytest.mark.parametrize("script, images, lr", [
    ("fedavg", "cnn", "0.1 on mnist and agnews and for fasttext and resnet18, else 0.005"),
    ("fedala", "cnn", "0.1 on mnist and agnews and for fasttext and resnet18, else 0.005"),
    ("pfedla", "pfedlacnn", "0.005 on emnist and fmnist, else 0.01"),
    ("fedpake", "resnet18", "0.005 on every dataset and model"),
    ("fedacd", "simplecnn (resnet18 on tinyimagenet)", "0.01 on every dataset and model")])
def test_help_says_what_model_auto_and_lr_pick_on_each_kind_of_data(script, images, lr, capsys):
    import importlib
    module = importlib.import_module(script)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"auto (default): {images} on images, mlp on vectors" in text and "fasttext on token ids" in text
    assert f"local learning rate (default: {lr})" in text
    # the help is what a run picks: the model on images, the learning rate on fmnist and on cifar10
    assert module.AUTO_IMAGE == images.split()[0]
    picked = [module.parse_args(["--dataset", d]).lr for d in ("fmnist", "cifar10")]
    assert picked == {"fedavg": [0.005, 0.005], "fedala": [0.005, 0.005], "pfedla": [0.005, 0.01],
                      "fedpake": [0.005, 0.005], "fedacd": [0.01, 0.01]}[script]


def test_layout_md_says_what_state_may_hold_as_resume_takes_it(tmp_path):
    """docs/layout.md: an entry of `state` is a module or an object with state_dict (restored by load_state_dict),
    or a tensor (restored in place); anything else is refused on --resume."""
    import argparse
    import numpy as np
    import torch
    import common
    text = " ".join(open(os.path.join(ROOT, "docs", "layout.md")).read().split())
    assert "What `state` may hold." in text and "does not fit this run" in text
    args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "3", "--rounds", "1", "--out",
                              str(tmp_path), "--threads", "1"])
    data = common.load_federated_data(args, torch.device("cpu"))

    def checkpointed(state):
        run = run_folder.Run("fedavg", args, data, torch.device("cpu"), headline="x")
        run.log(1, {"test_acc": 1.0})
        run.checkpoint(1, state, np.random.default_rng(0))
        run.close()
        return run.dir

    model, tensor = torch.nn.Linear(2, 1), torch.arange(3.0)
    folder = checkpointed({"model": model, "tensor": tensor})
    again = argparse.Namespace(**{**vars(args), "resume": folder})
    restored = {"model": torch.nn.Linear(2, 1), "tensor": torch.zeros(3)}
    run = run_folder.Run("fedavg", again, data, torch.device("cpu"), headline="x")
    try:
        assert run.resume(restored, np.random.default_rng(1)) == 2
    finally:
        run.close()
    assert torch.equal(restored["tensor"], tensor) and torch.equal(restored["model"].weight, model.weight)
    folder = checkpointed({"count": 3})
    run = run_folder.Run("fedavg", argparse.Namespace(**{**vars(args), "resume": folder}), data,
                         torch.device("cpu"), headline="x")
    try:
        with pytest.raises(run_folder.UserError, match="entry count does not fit this run"):
            run.resume({"count": 0}, np.random.default_rng(1))
    finally:
        run.close()


def test_layout_md_s_place_for_a_new_algorithm_is_one_the_layout_test_admits():
    import test_layout
    section = open(os.path.join(ROOT, "docs", "layout.md")).read().split("## Adding your own algorithm", 1)[1]
    programs = set(re.findall(r"python (\S+\.py)", section))
    assert programs, section[:200]
    for program in programs:
        top = program.split("/")[0]
        assert top in test_layout.TOP_LEVEL, program
    assert "`SCRIPTS`" in section and "test_layout.py" in section  # how a top-level script joins the five
    assert "`ALGORITHMS`" in section and "`CLIENTS`" in section and "`SERVERS`" in section  # and Flower
    source = open(os.path.join(ROOT, "flower", "app.py")).read()
    assert all(f"\n{name} = " in source for name in ("ALGORITHMS", "CLIENTS", "SERVERS"))


def test_running_md_s_table_of_defaults_is_what_the_parsers_say():
    from tools import flag_table
    table = flag_table.table()
    with open(os.path.join(ROOT, "docs", "running.md")) as f:
        text = f.read()
    pasted = "| flag | `fedavg.py` |" + text.split("\n| flag | `fedavg.py` |", 1)[1].split("\n\n", 1)[0]
    assert pasted == table
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ")[1:] for line in table.splitlines()[2:]}
    assert rows["--lr"][3] == "0.005" and rows["--model"][3] == "auto: resnet18 on images"  # FedPake's own
    assert rows["--rounds"][4].strip(" |") == "200" and rows["--join-ratio"][4].strip(" |") == "0.4"  # FedACD's


TIMES = re.compile(r"\d+\.\d+ s this round, mean \d+\.\d+ s/round \| ETA \S+")


def shown_lines(doc, prefix):
    with open(os.path.join(ROOT, doc)) as f:
        return [line.strip() for line in f if line.startswith(prefix)]


def test_the_quick_start_s_line_in_the_docs_is_what_it_prints_its_times_aside(tmp_path, capsys):
    """README's and docs/running.md's sample line is the quick start's last round, digit for digit but its times."""
    run_folder.run_main(fedavg.main, ["--dataset", "synthetic", "--rounds", "20", "--out", str(tmp_path),
                                      "--threads", "2"])
    (last,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[fedavg] round 20/20 |")]
    for doc in ("README.md", os.path.join("docs", "running.md")):
        (shown,) = shown_lines(doc, "[fedavg] round 20/20 |")
        assert TIMES.sub("TIMES", shown) == TIMES.sub("TIMES", last), doc


def test_the_progress_line_in_running_md_has_the_form_a_run_prints(tmp_path, monkeypatch, capsys):
    """The shape of docs/running.md's in-round progress line (numbers aside) is what Run.progress prints."""
    import common
    import torch
    clock = [1000.0]
    monkeypatch.setattr(run_folder, "clock", lambda: clock[0])
    monkeypatch.setattr(run_folder, "is_terminal", lambda stream: False)
    args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "4", "--rounds", "5", "--out",
                              str(tmp_path), "--threads", "1"])
    data = common.load_federated_data(args, torch.device("cpu"))
    run = run_folder.Run("fedala", args, data, torch.device("cpu"), headline="x")
    try:
        capsys.readouterr()
        report = run.progress(1)
        for client in range(4):
            report(client, 4, False)
        clock[0] += 41.0
        for client in range(3):
            report(client, 4, True)
    finally:
        run.close()
    (printed,) = [line for line in capsys.readouterr().out.splitlines() if "clients done" in line]
    (shown,) = shown_lines(os.path.join("docs", "running.md"), "[fedala] round ")
    digits = re.compile(r"\d+")
    assert digits.sub("N", shown) == digits.sub("N", printed)


ORDER = ["## What the paper does", "## How to run it", "## Choices where the paper is silent",
         "## Differences from the paper and from the official code", "## Results"]


@pytest.mark.parametrize("name", ["fedavg", "fedala", "pfedla", "fedpake", "fedacd"])
def test_each_algorithm_doc_opens_with_a_first_look_on_fashion_mnist_then_its_parts_in_one_order(name):
    import importlib
    with open(os.path.join(ROOT, "docs", f"{name}.md")) as f:
        text = f.read()
    opening = text.split("\n## ", 1)[0]
    (command,) = re.findall(rf"^python {name}\.py .+$", opening, re.M)
    argv = command.split()[2:]
    assert "--dataset fmnist --data-dir /usr/share/datasets/fashion-mnist" in command
    args = importlib.import_module(name).parse_args(argv)  # the script takes it as it stands
    assert args.rounds <= 5 and "FIRSTLOOK" not in opening and re.search(r"\d+ CPU seconds", opening)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ORDER, headings
