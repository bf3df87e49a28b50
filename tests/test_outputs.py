"""Odd stdouts and pasted commands: a stdout that cannot be written is one line naming it; a closed stdout and a
second SIGTERM end in the one line and 143, the checkpoint kept; the printed --resume command pastes into a shell
whatever the run folder's path holds; on a narrow terminal the progress line fits, so that it rewrites in place."""
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

import common
import fedavg
import run_folder
from conftest import ROOT, metrics_rows, run_dir

SMALL = ["--dataset", "synthetic", "--num-clients", "4", "--threads", "1"]
TIMING = {"seconds", "sec_per_round", "host_mb", "device_mb"}


def python(*argv, **kw):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, **kw)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.slow  # subprocesses: with the full suite
def test_a_full_stdout_is_one_line_naming_it_and_leaves_no_folder(tmp_path):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "fedavg.py", *SMALL, "--rounds", "2", "--out", str(tmp_path)],
                              cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["error: cannot write to standard output (No space left on device)"]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # subprocesses: with the full suite
def test_a_closed_stdout_and_a_second_sigterm_end_in_one_line_with_143(tmp_path):
    proc = subprocess.Popen([sys.executable, "fedavg.py", *SMALL, "--rounds", "20", "--local-epochs", "200",
                             "--checkpoint-every", "1", "--parallel-clients", "2", "--out", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.close(1), env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while not any(os.path.exists(os.path.join(tmp_path, d, "checkpoint.pt")) for d in os.listdir(tmp_path)):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    time.sleep(0.3)  # round 2 is under way
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    folder = run_dir(tmp_path)
    assert proc.returncode == 143 and len(err.splitlines()) == 1, err
    assert err.startswith("stopped by SIGTERM; the checkpoint of round ") and "Traceback" not in err


@pytest.mark.slow  # subprocesses: with the full suite
def test_the_printed_resume_command_pastes_whatever_the_folder_s_path_holds(tmp_path):
    out = tmp_path / "runs with 'quotes', spaces and $HOME"
    full = python("fedavg.py", *SMALL, "--rounds", "3", "--out", tmp_path / "full")
    cut = python("fedavg.py", *SMALL, "--rounds", "3", "--stop-after", "2", "--out", out)
    assert full.returncode == 0 and cut.returncode == 0, cut.stderr
    (line,) = [line for line in cut.stdout.splitlines() if "continue with: " in line]
    command = shlex.split(line.split("continue with: ", 1)[1])  # as a shell reads the pasted line
    assert command[:2] == ["python", "fedavg.py"] and command[-1] == run_dir(out)
    resumed = python(*command[1:])
    assert resumed.returncode == 0, resumed.stderr
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    assert strip(metrics_rows(run_dir(out))) == strip(metrics_rows(run_dir(tmp_path / "full")))


def test_on_a_narrow_terminal_the_progress_line_fits_its_width(tmp_path, monkeypatch, capsys):
    now = [1000.0]
    monkeypatch.setattr(run_folder, "clock", lambda: now[0])
    monkeypatch.setattr(run_folder, "is_terminal", lambda stream: True)
    monkeypatch.setattr(run_folder.shutil, "get_terminal_size", lambda *a: os.terminal_size((60, 24)))
    args = fedavg.parse_args([*SMALL, "--rounds", "3", "--out", str(tmp_path)])
    data = common.load_federated_data(args, torch.device("cpu"))
    run = run_folder.Run("fedavg", args, data, torch.device("cpu"), headline="x")
    try:
        capsys.readouterr()
        report = run.progress(1)
        for client in range(4):
            report(client, 4, False)
            now[0] += 3.0
            report(client, 4, True)
        shown = [part for part in capsys.readouterr().out.split("\r") if part.strip()]
        assert shown and all(len(part) <= 59 for part in shown), shown
        assert all("clients done" in part for part in shown)
    finally:
        run.close()
