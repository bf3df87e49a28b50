"""--threads: the CPU torch thread count that decides a run's arithmetic is resolved, recorded in config.json's
args and command, set whatever OMP_NUM_THREADS says, and kept by --resume; a run made before the flag is refused
as of an older form until tools/run_records.py --upgrade --threads N records the count it ran with (every committed
run records it already). The runs here use
--parallel-clients 1 (each client on all --threads threads). Where a test needs 1 and 2 threads to give other
weights, it trains the CNN on a small image .npz (``images``): FedProx's synthetic MLP gave the same weights at
both counts on an Intel Xeon (AVX512), where this CNN's did not; each such test checks that its weights differ
at 1 and 2 threads here, so that a resume at the wrong count cannot pass."""
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import common
import fedavg
import run_folder
from conftest import ROOT, metrics_rows, run_dir
from tools import reproduce, run_records

TIMING = {"seconds", "sec_per_round", "host_mb"}
BASE = ["--dataset", "synthetic", "--num-clients", "4"]
FLAGS = [*BASE, "--rounds", "2", "--parallel-clients", "1", "--checkpoint-every", "1"]


@pytest.fixture
def images(tmp_path):
    """FLAGS on 240 random 28x28 grey images (a user's .npz, docs/datasets.md), trained by the default CNN."""
    rng = np.random.default_rng(0)
    path = tmp_path / "images.npz"
    np.savez(path, x=rng.integers(0, 256, (240, 28, 28), dtype=np.uint8), y=rng.integers(0, 10, 240))
    return [*FLAGS, "--dataset", str(path)]


def run(argv, threads=1, monkeypatch=None):
    """fedavg.py ``argv`` in this process as ``python fedavg.py argv`` with torch's own count at ``threads`` (what
    OMP_NUM_THREADS gives a process); returns the exit status."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "argv", ["fedavg.py", *argv])
    try:
        run_folder.run_main(fedavg.main, list(argv))
        return 0
    except SystemExit as e:
        return e.code
    finally:
        torch.set_num_threads(before)


def weights(folder):
    return torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)["state"]["global_model"]


def same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def rows(folder):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics_rows(folder)]


def config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", "", "1025", "10000000000", "²"])
def test_a_bad_thread_count_is_one_line(value):
    with pytest.raises(run_folder.UserError, match=r"--threads: must be 'auto' or an integer in \[1, 1024\]"):
        fedavg.parse_args([*FLAGS, "--threads", value])


def test_auto_is_torch_s_count_and_the_command_keeps_the_count_taken(tmp_path, monkeypatch):
    assert fedavg.parse_args(FLAGS).threads == torch.get_num_threads()
    assert fedavg.parse_args([*FLAGS, "--threads", "3"]).threads == 3
    assert run([*FLAGS, "--threads", "auto", "--out", str(tmp_path)], threads=1, monkeypatch=monkeypatch) == 0
    saved = config(run_dir(tmp_path))
    assert saved["args"]["threads"] == 1
    # the command as given, and the count auto took after it (argparse takes the last --threads)
    assert saved["command"] == ["fedavg.py", *FLAGS, "--threads", "auto", "--out", str(tmp_path), "--threads", "1"]
    assert fedavg.parse_args(saved["command"][1:]).threads == 1
    # the CPU kind it repeats on: torch's kernels and the model name (the same capability differed elsewhere)
    assert saved["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert saved["cpu_model"] == run_folder.cpu_model() and saved["cpu_model"]
    assert run_folder.with_threads(["a.py", "--threads", "2"], 2) == ["a.py", "--threads", "2"]
    assert run_folder.with_threads(["a.py", "--threads=2", "--x"], 3) == ["a.py", "--threads=2", "--x", "--threads", "3"]
    assert run_folder.with_threads(["a.py", "--threads", "2", "--threads=3"], 3) == ["a.py", "--threads", "2",
                                                                                    "--threads=3"]  # the last one
    assert run_folder.with_threads(["a.py", "--threads", "3", "--threads", "auto"], 3) == \
        ["a.py", "--threads", "3", "--threads", "auto", "--threads", "3"]


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_the_command_repeats_under_another_omp_num_threads(images, tmp_path, monkeypatch):
    """A run made on one thread; its config.json command, run as it stands by a process whose environment
    says OMP_NUM_THREADS=2, gives its metrics and weights bit for bit; at --threads 2 the weights differ
    (so the thread count matters here, and the environment did not decide it)."""
    made, at_two = tmp_path / "made", tmp_path / "two"
    assert run([*images, "--out", str(made)], threads=1, monkeypatch=monkeypatch) == 0
    assert run([*images, "--out", str(at_two), "--threads", "2"], threads=1) == 0
    first = run_dir(made)
    assert not same_weights(weights(first), weights(run_dir(at_two)))
    script, *flags = config(first)["command"]
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *flags, "--out", str(again)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr
    assert config(run_dir(again))["args"]["threads"] == 1
    assert rows(run_dir(again)) == rows(first) and same_weights(weights(run_dir(again)), weights(first))


def test_resume_keeps_the_recorded_count_and_refuses_another(images, tmp_path):
    whole, part, at_two = tmp_path / "whole", tmp_path / "part", tmp_path / "two"
    assert run([*images, "--out", str(whole)], threads=1) == 0
    assert run([*images, "--out", str(at_two), "--threads", "2"], threads=1) == 0
    assert not same_weights(weights(run_dir(whole)), weights(run_dir(at_two)))  # a resume at 2 threads would show
    assert run([*images, "--out", str(part), "--stop-after", "1"], threads=1) == 0
    folder = run_dir(part)
    with pytest.raises(run_folder.UserError, match=r"other settings: --threads 1 \(now 2\)"):
        fedavg.parse_args(["--resume", folder, "--threads", "2"])
    assert fedavg.parse_args(["--resume", folder, "--threads", "auto"]).threads == 1
    assert fedavg.parse_args(["--resume", folder, "--threads", "1"]).threads == 1
    assert run(["--resume", folder], threads=2) == 0  # the environment's count is not the run's
    assert config(folder)["args"]["threads"] == 1
    assert rows(folder) == rows(run_dir(whole)) and same_weights(weights(folder), weights(run_dir(whole)))


def make_pre_flag_run(out, flags):
    """A run of ``flags`` stopped after round 1, then made to look as one made before --threads: no count in
    config.json (args, command) nor in its checkpoint."""
    assert run([*flags, "--out", str(out), "--stop-after", "1"], threads=1) == 0
    folder = run_dir(out)
    saved = config(folder)
    del saved["args"]["threads"]
    assert saved["command"][-2:] == ["--threads", "1"]
    saved["command"] = saved["command"][:-2]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(saved, f)
    blob = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)
    del blob["args"]["threads"]
    torch.save(blob, os.path.join(folder, "checkpoint.pt"))
    return folder


@pytest.mark.slow  # four CNN runs: 35 s on a loaded machine (load 12 on 2 cores)
def test_a_run_from_before_the_flag_is_refused_until_the_upgrade_records_its_count_then_resumes_as_it_ran(
        images, tmp_path, capsys):
    whole, at_two = tmp_path / "whole", tmp_path / "two"
    assert run([*images, "--out", str(whole)], threads=1) == 0
    assert run([*images, "--out", str(at_two), "--threads", "2"], threads=1) == 0
    assert not same_weights(weights(run_dir(whole)), weights(run_dir(at_two)))  # the count shows in the weights
    folder = make_pre_flag_run(tmp_path / "seed0", images)
    saved = config(folder)
    with pytest.raises(run_folder.UserError, match="older version of fedavg.py.*tools/run_records.py --upgrade"):
        fedavg.parse_args(["--resume", folder])
    assert run_records.main(["--upgrade", folder]) == 2  # no evidence of its count: it asks, and changes nothing
    assert "give --threads N" in capsys.readouterr().err and config(folder) == saved
    assert run_records.main(["--upgrade", folder, "--threads", "1"]) == 0
    assert config(folder)["args"]["threads"] == 1
    assert torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)["args"]["threads"] == 1
    assert run(["--resume", folder], threads=2) == 0  # the count recorded, not the environment's
    assert rows(folder) == rows(run_dir(whole)) and same_weights(weights(folder), weights(run_dir(whole)))


def test_reproduce_gives_new_runs_the_count_it_records_and_resumes_keep_theirs(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert reproduce.launch_threads(workers=2) == 3 and reproduce.child_env(2)["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(reproduce, "cpu_count", lambda: 8)
    assert reproduce.launch_threads(workers=2) == 4 and reproduce.child_env(2)["OMP_NUM_THREADS"] == "4"
    job = {"script": "fedavg.py", "flags": BASE, "rounds": 2, "seed": 0, "dir": str(tmp_path / "seed0"),
           "data_dir": None}
    assert reproduce.new_command(job, "cpu", 4)[-2:] == ["--threads", "4"]
    assert "--threads" not in reproduce.resume_command(job, "f", "cpu")
    os.makedirs(job["dir"])
    reproduce.record_launch(job, reproduce.new_command(job, "cpu", 4), 4, "cpu")
    with open(os.path.join(job["dir"], "reproduce.json")) as f:
        assert json.load(f)["launches"][-1]["threads"] == 4
    folder = tmp_path / "run"
    os.makedirs(folder)
    with open(folder / "config.json", "w") as f:
        json.dump({"script": "fedavg", "command": ["fedavg.py", *BASE, "--threads", "1"],
                   "args": {**vars(fedavg.parse_args([*BASE, "--rounds", "2"])), "threads": 1}}, f)
    assert reproduce.run_threads(str(folder), {"OMP_NUM_THREADS": "4"}) == 1
    assert reproduce.other_settings(job, str(folder)) == []  # a count is no setting of the table
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    with pytest.raises(SystemExit) as e:
        reproduce.launch_threads(workers=1)
    assert e.value.code == 2


def test_committed_runs_record_one_thread():
    """Every committed run records the count it was made with in its args and its command: one thread."""
    for path in glob.glob(os.path.join(ROOT, "results", "**", "config.json"), recursive=True):
        saved = config(os.path.dirname(path))
        command = saved["command"]
        assert saved["args"].get("threads") == 1 and ["--threads", "1"] in [command[i:i + 2] for i in
                                                                            range(len(command) - 1)], path


def test_cpu_model_is_the_first_processor_s_name_family_and_model_else_platform_s(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(info if p == "/proc/cpuinfo" else p, *a, **k))
    block = "processor\t: {}\nvendor_id\t: AuthenticAMD\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: AMD EPYC\n" \
            "stepping\t: 1\nflags\t\t: avx2\n\n"
    info.write_text(block.format(0, 25, 1) + block.format(1, 23, 49))
    assert run_folder.cpu_model() == "AMD EPYC (cpu family 25, model 1)"
    info.write_text(block.format(0, 23, 49))  # a VM's generic name: the numbers tell Zen 2 from Zen 3
    assert run_folder.cpu_model() == "AMD EPYC (cpu family 23, model 49)"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core\nflags\t: avx2\n")
    assert run_folder.cpu_model() == "AMD EPYC 7B13 64-Core"
    monkeypatch.setattr(run_folder.platform, "processor", lambda: "")
    monkeypatch.setattr(run_folder.platform, "machine", lambda: "aarch64")
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n\nHardware\t: x\n")  # ARM: no name
    assert run_folder.cpu_model() == "aarch64"
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    monkeypatch.setattr(run_folder.platform, "machine", lambda: "arm64")
    assert run_folder.cpu_model() == "arm64"


def made_elsewhere(folder, **record):
    """Rewrite a run's config.json as if its first rounds ran elsewhere (``record`` overrides where_it_runs)."""
    saved = config(folder)
    saved.update(record)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(saved, f, indent=1)


def test_a_run_continued_elsewhere_records_where_and_from_which_round_and_ends_as_if_never_moved(tmp_path, capsys):
    whole, part = tmp_path / "whole", tmp_path / "part"
    flags = [*BASE, "--rounds", "3", "--parallel-clients", "1", "--checkpoint-every", "1"]
    assert run([*flags, "--out", str(whole)]) == 0
    assert run([*flags, "--out", str(part), "--stop-after", "1"]) == 0
    folder = run_dir(part)
    assert run(["--resume", folder, "--stop-after", "2"]) == 0  # the same machine: nothing to record
    assert "continued_on" not in config(folder)
    made_elsewhere(folder, device="cuda", device_name="NVIDIA H200", cpu_capability="AVX512",
                   cpu_model="Intel(R) Xeon(R) Processor")
    assert run(["--resume", folder]) == 0
    assert f"from round 3 on {run_folder.cpu_model()} (recorded in config.json)" in capsys.readouterr().out
    moved = config(folder)["continued_on"]
    here = run_folder.where_it_runs(torch.device("cpu"))
    assert moved == [{"from_round": 3, **json.loads(json.dumps(here))}]
    assert here["cpu_model"] == run_folder.cpu_model() and here["device"] == "cpu"
    assert rows(folder) == rows(run_dir(whole))  # a CPU's arithmetic throughout: the same rows
    assert reproduce.hardware({"folder": folder}, None) == \
        f"NVIDIA H200; from round 3: {run_folder.cpu_model()}, 1 torch thread"


def test_a_resume_where_the_run_last_ran_adds_no_entry_and_a_record_without_a_field_is_not_a_move(tmp_path):
    part = tmp_path / "part"
    flags = [*BASE, "--rounds", "4", "--parallel-clients", "1", "--checkpoint-every", "1"]
    assert run([*flags, "--out", str(part), "--stop-after", "1"]) == 0
    folder = run_dir(part)
    here = json.loads(json.dumps(run_folder.where_it_runs(torch.device("cpu"))))
    made_elsewhere(folder, device="cuda", device_name="NVIDIA H200",
                   continued_on=[{"from_round": 2, **here}])  # moved here once already: no second entry
    assert run(["--resume", folder, "--stop-after", "2"]) == 0
    assert config(folder)["continued_on"] == [{"from_round": 2, **here}]
    saved = config(folder)
    del saved["continued_on"], saved["cpu_model"]  # a run recorded before cpu_model, made on this CPU's kind
    saved["device"], saved["device_name"] = here["device"], here["device_name"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(saved, f)
    assert run(["--resume", folder]) == 0
    assert "continued_on" not in config(folder)
    assert run_folder.continued_elsewhere({**here, "versions": {"torch": "2.11.0"}}, 7, torch.device("cpu")) \
        ["continued_on"] == [{"from_round": 8, **here}]


@pytest.mark.parametrize("damaged", ["here", [{"from_round": 1, "device": "cpu"}],
                                     [{"device": "cpu"}], [{"from_round": 3, "device": ""}],
                                     [3]])
def test_a_damaged_continued_on_is_named_by_the_diagnosis_and_the_script_never_fails_in_a_traceback(
        damaged, tmp_path, capsys):
    """The field-by-field check of config.json is tools/run_records.py's (one line naming the file and the field);
    the script resumes or refuses in one line (exit 2)."""
    part = tmp_path / "part"
    assert run([*FLAGS, "--out", str(part), "--stop-after", "1"]) == 0
    folder = run_dir(part)
    made_elsewhere(folder, continued_on=damaged)
    capsys.readouterr()
    assert run_records.main([folder]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"config\.json has continued_on = ", err[0]), err
    code = run(["--resume", folder])
    assert code == 0 or code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- run_records.py --upgrade: all or nothing

def every_file(top):
    paths = [os.path.join(d, n) for d, _, ns in os.walk(top) for n in ns]
    return {p: open(p, "rb").read() if os.path.isfile(p) else None for p in paths}


def test_an_upgrade_on_a_full_disk_is_one_line_exit_1_and_every_file_as_it_was(tmp_path, capsys, monkeypatch):
    """--upgrade writes config.json and checkpoint.pt both or neither: on a full disk each is as it was, no
    temporary file is left, and the one line names the file."""
    import tempfile
    folder = make_pre_flag_run(tmp_path / "seed0", FLAGS)
    before = every_file(folder)
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):  # the upgrade's temporary files are on a full disk
        fd, path = real(*args, **kwargs)
        if os.path.basename(path).startswith(".tmp-"):
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    capsys.readouterr()
    assert run_records.main(["--upgrade", folder, "--threads", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and folder in err[0], err
    assert every_file(folder) == before


def test_resume_of_a_config_json_nested_too_deeply_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text('{"args": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(run_folder.UserError, match="config.json cannot be read"):
        fedavg.parse_args(["--resume", str(folder)])
