"""Signals and faults. SIGTERM and SIGHUP stop a run as Ctrl-C does: a checkpoint at the end of the
round, one line, exit status 143 or 129, and --resume ends with the uninterrupted metrics; a SIGHUP
ignored when the script started (nohup) stays ignored. A signal while a script starts is one line.
A file the run cannot write (a folder in its place, a read-only folder, a full disk) is one line
naming it, exit status 1, the lock released and the last checkpoint kept. A run that fails in set-up
leaves nothing behind; a named pipe in a run folder is refused, never read; --resume refuses data
that changed since the run started. The faults are real (the OS refuses the write); only the moment
they happen is chosen by the test."""
import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import common
import fedavg
import run_folder
from conftest import ROOT, metrics_rows, run_dir, run_in_process, sighup_as_in_a_terminal
from tools import run_records

SMALL = ["--dataset", "synthetic", "--num-clients", "4"]
TIMING = {"seconds", "sec_per_round", "host_mb", "device_mb"}  # the columns that differ between runs of the same flags


def results(folder):
    """metrics.csv without its timing columns."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in metrics_rows(folder)]


def run(capsys, *argv):
    """fedavg.py in this process, as on the command line: (exit status, the lines on stderr)."""
    capsys.readouterr()
    code = run_in_process("fedavg.py", *argv)
    return code, capsys.readouterr().err.strip().splitlines()


def checkpoint_round(folder):
    return torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)["round"]


def assert_released(folder):
    """No lock and no temporary file of a failed write left in the run folder."""
    left = [name for name in os.listdir(folder) if name == ".lock" or name.startswith(".tmp-")]
    assert left == [], left


def start(script, *argv, sighup=sighup_as_in_a_terminal):
    """Start ``python script argv`` as a user would from a terminal (one torch thread, as run_in_process)."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, script), *map(str, argv)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sighup,
                            env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})


def wait_for_line(process, text):
    for line in process.stdout:
        if text in line:
            return line
    raise AssertionError(f"the run ended before printing {text!r}: {process.communicate()[1]}")


def catches(pid, signum):
    """Whether process ``pid`` has a handler for ``signum`` (Linux: the SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(mask >> (signum - 1) & 1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round FedAvg run folder (cases copy it before touching it)."""
    out = tmp_path_factory.mktemp("finished")
    assert run_in_process("fedavg.py", *SMALL, "--rounds", "2", "--out", out) == 0
    return run_dir(out)


@pytest.fixture
def copy_of(tmp_path):
    def make(folder):
        shutil.copytree(folder, tmp_path / "run")
        return str(tmp_path / "run")
    return make


@pytest.fixture
def after_checkpoint(monkeypatch):
    """``after_checkpoint(k, fault)``: ``fault(run folder)`` right after the training loop's
    checkpoint() call of round k (which writes a checkpoint only every --checkpoint-every rounds)."""
    def arm(round_, fault):
        original = run_folder.Run.checkpoint

        def checkpoint(self, r, state, rng):
            original(self, r, state, rng)
            if r == round_:
                fault(self.dir)
        monkeypatch.setattr(run_folder.Run, "checkpoint", checkpoint)
    return arm


def folder_in_place_of(name):
    def fault(folder):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            os.remove(path)
        os.mkdir(path)
    return fault


# ----------------------------------------------------------------------------- signals

SCRIPTS = ["fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py"]
# every program that runs a script's rounds or starts runs: startup.py's handlers are theirs while they start
PROGRAMS = [*SCRIPTS, "tools/reproduce.py", "tools/fedavg_variants.py", "tools/fedacd_diagnostics.py",
            "docs/examples/fedprox.py"]


def test_every_program_imports_startup_first_when_it_runs_as_the_program():
    """startup.py installs its handlers when imported and imports nothing heavy; every program imports it under
    ``if __name__ == "__main__":`` before anything of ours, numpy or torch (only os and sys before it)."""
    for name in PROGRAMS:
        body = ast.parse(open(os.path.join(ROOT, name)).read()).body
        first = next(i for i, node in enumerate(body) if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
        guarded = body[first]
        assert ast.unparse(guarded.test) == "__name__ == '__main__'", name
        assert [ast.unparse(n) for n in guarded.body] == ["import startup"], name
        before = {a.name.split(".")[0] for node in body[:first] if isinstance(node, (ast.Import, ast.ImportFrom))
                  for a in node.names}
        assert before <= {"os", "sys"}, (name, before)
    body = ast.parse(open(os.path.join(ROOT, "startup.py")).read()).body
    imported = {a.name.split(".")[0] for node in body if isinstance(node, (ast.Import, ast.ImportFrom))
                for a in node.names}
    assert imported == {"os", "signal"} and isinstance(body[-1], ast.For)  # the handlers, installed on import
    assert sorted(SCRIPTS) == sorted(
        name for name in os.listdir(ROOT) if name.endswith(".py") and "run_folder.run_main(main)" in
        open(os.path.join(ROOT, name)).read())


def test_importing_a_program_installs_no_handler():
    """Tests, tools and flower/app.py import the scripts: their own handling of signals stays theirs."""
    code = ("import signal; before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]; "
            "import fedavg, fedacd, tools.fedavg_variants, tools.fedacd_diagnostics, tools.reproduce; "
            "print([signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "True", r.stderr


def renamed_copies(tmp_path):
    """A copy of the top-level modules in ``tmp_path`` with fedavg.py as my_fedavg.py and docs/examples/fedprox.py
    as docs/examples/my_prox.py: programs of another name."""
    (tmp_path / "docs" / "examples").mkdir(parents=True)
    for name in os.listdir(ROOT):
        if name.endswith(".py") and name not in SCRIPTS:
            shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    shutil.copy(os.path.join(ROOT, "fedavg.py"), tmp_path / "my_fedavg.py")
    shutil.copy(os.path.join(ROOT, "docs", "examples", "fedprox.py"), tmp_path / "docs" / "examples" / "my_prox.py")
    return {"fedavg.py": tmp_path / "my_fedavg.py", "docs/examples/fedprox.py": tmp_path / "docs/examples/my_prox.py"}


@pytest.mark.slow  # four short runs in subprocesses; in CI with the full suite
def test_a_renamed_copy_of_a_script_gives_the_originals_metrics(tmp_path):
    copies = renamed_copies(tmp_path / "copy")
    for original, copy in copies.items():
        runs = {}
        for program in (os.path.join(ROOT, original), copy):
            out = tmp_path / "runs" / os.path.basename(program)
            r = subprocess.run([sys.executable, program, *SMALL, "--rounds", "2", "--parallel-clients", "1",
                                "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
            assert r.returncode == 0, r.stderr
            runs[program] = [{k: v for k, v in row.items() if k not in {"seconds", "sec_per_round", "host_mb"}}
                             for row in metrics_rows(run_dir(out))]
        original_rows, copy_rows = runs.values()
        assert len(original_rows) == 2 and original_rows == copy_rows, original


@pytest.mark.parametrize("program", ["fedavg.py", "docs/examples/fedprox.py"])
def test_a_sigint_while_a_renamed_copy_starts_is_one_line(program, tmp_path):
    copy = renamed_copies(tmp_path / "copy")[program]
    process = subprocess.Popen([sys.executable, copy, *SMALL, "--rounds", "2", "--out", tmp_path / "runs"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not catches(process.pid, signal.SIGTERM):  # startup.py's handlers: torch is loading now
        assert time.monotonic() < deadline and process.poll() is None, "the copy never installed the handlers"
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err == "interrupted while starting; nothing was written\n", err
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_script_imports_torch_is_one_line(signum, tmp_path):
    process = start("fedavg.py", *SMALL, "--rounds", "2", "--out", tmp_path / "runs")
    while not catches(process.pid, signal.SIGTERM):  # common's start-up handlers: torch is loading now
        time.sleep(0.005)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    what = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert process.returncode == 128 + signum and err == f"{what} while starting; nothing was written\n", err
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_sigterm_stops_at_the_end_of_the_round_and_resume_ends_with_the_uninterrupted_metrics(tmp_path):
    flags = [*SMALL, "--rounds", "20", "--checkpoint-every", "100"]
    assert run_in_process("fedavg.py", *flags, "--out", tmp_path / "full") == 0
    process = start("fedavg.py", *flags, "--out", tmp_path / "cut")
    wait_for_line(process, "round 2/20")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    cut = run_dir(tmp_path / "cut")
    done = checkpoint_round(cut)  # the checkpoint of the round the signal came in, not one of --checkpoint-every
    assert process.returncode == 143 and err.splitlines() == [
        f"stopped by SIGTERM after round {done}; the checkpoint of round {done} is kept; continue with: "
        f"python fedavg.py --resume {cut}"], err
    assert "SIGTERM: stopping at the end of this round" in out
    assert 2 <= done < 20 and len(metrics_rows(cut)) == done
    assert_released(cut)
    assert run_in_process("fedavg.py", "--resume", cut) == 0
    assert results(cut) == results(run_dir(tmp_path / "full"))


@pytest.mark.slow
def test_a_terminal_that_hangs_up_stops_the_run_at_the_end_of_the_round_with_status_129(tmp_path):
    """The run's terminal (a pseudo-terminal here) closes: SIGHUP, and every write to the terminal
    fails from then on, yet the round ends with its checkpoint."""
    import pty
    import select
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the run, on the terminal
        try:
            os.chdir(ROOT)
            os.environ["OMP_NUM_THREADS"] = "1"
            sighup_as_in_a_terminal()
            os.execv(sys.executable, [sys.executable, "fedavg.py", *SMALL, "--rounds", "400", "--local-epochs", "20",
                                      "--checkpoint-every", "100", "--out", str(tmp_path)])
        finally:
            os._exit(127)  # reached only if the exec failed: never return into pytest
    shown = b""
    while b"round 2/400" not in shown and select.select([terminal], [], [], 120)[0]:
        shown += os.read(terminal, 4096)
    os.close(terminal)  # hang up
    _, status = os.waitpid(pid, 0)
    folder = run_dir(tmp_path)
    assert os.waitstatus_to_exitcode(status) == 129 and 2 <= checkpoint_round(folder) < 400
    assert len(metrics_rows(folder)) == checkpoint_round(folder)
    assert_released(folder)


@pytest.mark.slow  # about 10 s
def test_under_nohup_a_hang_up_is_ignored_and_the_run_goes_on_to_its_last_round(tmp_path):
    """``nohup python fedavg.py``: SIGHUP was ignored when the script started, and stays ignored."""
    process = start("fedavg.py", *SMALL, "--rounds", "3", "--local-epochs", "20", "--out", tmp_path,
                    sighup=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for_line(process, "round 1/3")
    assert process.poll() is None and not catches(process.pid, signal.SIGHUP)
    process.send_signal(signal.SIGHUP)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "SIGHUP" not in out + err and len(metrics_rows(run_dir(tmp_path))) == 3


@pytest.mark.slow
@pytest.mark.parametrize("signum, status, what", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_second_signal_stops_in_the_middle_of_a_round_and_keeps_the_last_checkpoint(tmp_path, signum, status,
                                                                                      what):
    """Slow rounds run on two client threads: the second Ctrl-C or SIGTERM must not wait for the
    round's remaining clients, and the one line says which checkpoint is kept."""
    process = start("fedavg.py", *SMALL, "--rounds", "20", "--local-epochs", "200", "--checkpoint-every", "1",
                    "--parallel-clients", "2", "--out", tmp_path)
    round_seconds = float(wait_for_line(process, "round 1/20").split(" s/round")[0].split()[-1])
    time.sleep(0.3)  # round 1's checkpoint is written; round 2 is under way
    process.send_signal(signum)
    time.sleep(0.1)
    process.send_signal(signum)
    begin = time.perf_counter()
    out, err = process.communicate(timeout=120)
    folder = run_dir(tmp_path)
    assert process.returncode == status and err.splitlines() == [
        f"{what}; the checkpoint of round 1 is kept; continue with: python fedavg.py --resume {folder}"], err
    assert time.perf_counter() - begin < 0.3 * round_seconds
    assert checkpoint_round(folder) == 1 and len(metrics_rows(folder)) == 1
    assert_released(folder)


def test_sigterm_before_the_run_folder_exists_is_one_line(tmp_path):
    """After the imports, while main() sets up (data, models): run_main's handler."""
    code = ("import os, signal, run_folder\n"
            "run_folder.run_main(lambda argv: os.kill(os.getpid(), signal.SIGTERM) or sum(range(10 ** 6)))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 143, r.stderr
    assert r.stderr == "stopped by SIGTERM before the run folder was made; nothing was written\n"


# ----------------------------------------------------------------------------- files that cannot be written

@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted run of FAULT_FLAGS, to compare resumed runs with."""
    out = tmp_path_factory.mktemp("full")
    assert run_in_process("fedavg.py", *FAULT_FLAGS, "--out", out) == 0
    return run_dir(out)


FAULT_FLAGS = [*SMALL, "--rounds", "4", "--checkpoint-every", "2"]


@pytest.mark.parametrize("name,round_", [("metrics.csv", 2), ("summary.json", 4)])
def test_a_folder_in_place_of_a_result_file_is_one_line_and_the_run_resumes(name, round_, full_run, tmp_path, capsys,
                                                                           after_checkpoint):
    after_checkpoint(round_, folder_in_place_of(name))
    code, lines = run(capsys, *FAULT_FLAGS, "--out", tmp_path)
    folder = run_dir(tmp_path)
    assert code == 1 and lines == [
        f"error: cannot write {folder}/{name} (Is a directory); the checkpoint of round {round_} is kept; "
        f"continue with: python fedavg.py --resume {folder}"], lines
    assert checkpoint_round(folder) == round_
    assert_released(folder)
    os.rmdir(os.path.join(folder, name))
    assert run_in_process("fedavg.py", "--resume", folder) == 0
    assert results(folder) == results(full_run)
    assert json.load(open(os.path.join(folder, "summary.json")))["status"] == "finished"


def test_a_failed_first_checkpoint_says_the_run_cannot_be_resumed(tmp_path, capsys, after_checkpoint):
    after_checkpoint(1, folder_in_place_of("checkpoint.pt"))  # round 2 writes the first checkpoint
    code, lines = run(capsys, *FAULT_FLAGS, "--out", tmp_path)
    folder = run_dir(tmp_path)
    assert code == 1 and lines == [
        f"error: cannot write {folder}/checkpoint.pt (Is a directory); no checkpoint yet (--checkpoint-every 2); "
        f"{folder}/metrics.csv keeps rounds up to 2; nothing to resume"], lines
    assert len(metrics_rows(folder)) == 2
    assert_released(folder)
    os.rmdir(os.path.join(folder, "checkpoint.pt"))
    code, lines = run(capsys, "--resume", folder)
    assert code == 2 and lines == [f"error: cannot resume: {folder} has no checkpoint.pt (the run stopped before its "
                                   "first checkpoint; start it again)"]


# fedavg.py as run_in_process runs it, whose run folder becomes read-only after round 2's checkpoint() call by a
# read-only bind mount of itself: for root, whom a folder's permissions do not stop, in a mount namespace of its
# own (unshare -m), so that nothing outside this process sees the mount
READ_ONLY_BY_A_MOUNT = r"""
import subprocess, sys
sys.path[:0] = [".", "tests"]
import run_folder
from conftest import run_in_process
original = run_folder.Run.checkpoint
def checkpoint(self, r, state, rng):
    original(self, r, state, rng)
    if r == 2:
        subprocess.run(["mount", "--bind", self.dir, self.dir], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", self.dir], check=True)
run_folder.Run.checkpoint = checkpoint
sys.exit(run_in_process("fedavg.py", *sys.argv[1:]))
"""


@pytest.mark.slow  # a run and its resume; as root in a subprocess: 20 s on a loaded machine (load 12 on 2 cores)
def test_a_folder_made_read_only_during_the_run_is_one_line_and_keeps_the_checkpoint(tmp_path, capsys,
                                                                                    after_checkpoint):
    """A normal user: the folder's write permission taken away (chmod 555). Root, whom permissions do not stop:
    a read-only bind mount of the folder in a private mount namespace (unshare -m; skipped only without it)."""
    if os.geteuid() != 0:
        after_checkpoint(2, lambda folder: os.chmod(folder, 0o555))
        try:
            code, lines = run(capsys, *FAULT_FLAGS, "--out", tmp_path)
        finally:
            folder = run_dir(tmp_path)
            os.chmod(folder, 0o755)
        why = "Permission denied"
    else:
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True) \
            if shutil.which("unshare") else None
        if probe is None or probe.returncode != 0:
            pytest.skip(f"root, and no private mount namespace to mount the folder read-only in (unshare -m: "
                        f"{probe.stderr.strip() if probe else 'not installed'})")
        done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", READ_ONLY_BY_A_MOUNT,
                               *FAULT_FLAGS, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        code, lines, folder = done.returncode, done.stderr.strip().splitlines(), run_dir(tmp_path)
        why = "Read-only file system"
    assert code == 1 and lines == [
        f"error: cannot write {folder}/metrics.csv ({why}); the checkpoint of round 2 is kept; continue with: "
        f"python fedavg.py --resume {folder}"], lines
    assert checkpoint_round(folder) == 2
    assert not [name for name in os.listdir(folder) if name.startswith(".tmp-")]
    # the .lock file that could not be removed from the read-only folder holds no lock (an OS lock, released
    # with the run): the resume takes it
    assert run_in_process("fedavg.py", "--resume", folder) == 0 and checkpoint_round(folder) == 4


def test_a_run_whose_first_write_fails_leaves_no_folder_nor_the_out_folders_it_made(tmp_path, capsys, monkeypatch):
    take_lock = run_folder.Run.take_lock

    def lock_then_block_config(self):  # a folder where config.json goes: the first write of the run fails
        take_lock(self)
        os.mkdir(os.path.join(self.dir, "config.json"))
    monkeypatch.setattr(run_folder.Run, "take_lock", lock_then_block_config)
    code, lines = run(capsys, *SMALL, "--rounds", "2", "--out", tmp_path / "a" / "b")
    assert code == 1 and len(lines) == 1 and "config.json (Is a directory); nothing was kept" in lines[0], lines
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("out", [["d" * 250] * 20, ["x" * 300]], ids=["a path of 5000 bytes", "a name of 300 bytes"])
def test_an_out_beyond_the_system_limits_is_one_line_and_makes_no_folder(out, tmp_path, capsys):
    """The OS's refusal as it is (issue 86 dropped the wording of path lengths): one line naming the folder it
    could not create, bad input (exit status 2, as before), and nothing made."""
    code, lines = run(capsys, *SMALL, "--rounds", "1", "--out", os.path.join(tmp_path, *out))
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: cannot create {tmp_path}/"), lines
    assert lines[0].endswith(" (File name too long); nothing was made"), lines
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- a full disk (a small tmpfs)

def in_small_filesystem(tmp_path, size_kb, script):
    """Run the shell ``script`` with a tmpfs of ``size_kb`` mounted at $FS, in a user and mount
    namespace (no root needed where the kernel allows them); $KEEP receives a copy of the tmpfs
    afterwards. Skips where no tmpfs can be mounted."""
    fs, keep = tmp_path / "fs", tmp_path / "keep"
    fs.mkdir()
    keep.mkdir()
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {fs}"],
                           capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (unshare -Urm: {probe and probe.stderr.strip()})")
    wrapped = (f'mount -t tmpfs -o size={size_kb}k tmpfs "$FS" || exit 99\n{script}\n'
               'rc=$?\ncp -a "$FS/." "$KEEP/"\nexit $rc')
    return subprocess.run(["unshare", "-Urm", "sh", "-c", wrapped], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "FS": str(fs), "KEEP": str(keep), "OMP_NUM_THREADS": "1",
                                            "PY": sys.executable}), str(keep)


@pytest.mark.slow
@pytest.mark.parametrize("size_kb,kept", [(32, 0), (64, 2)], ids=["at the first checkpoint", "at a later checkpoint"])
def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_checkpoint(size_kb, kept, tmp_path):
    """32 KB hold the small files but no checkpoint (about 29 KB); 64 KB hold one but not a second
    beside it (the new one is written in full before it replaces the old)."""
    r, keep = in_small_filesystem(tmp_path, size_kb, '"$PY" fedavg.py ' + " ".join(FAULT_FLAGS) + ' --out "$FS"')
    folder = run_dir(keep)
    path = os.path.join(folder.replace(keep, str(tmp_path / "fs")), "checkpoint.pt")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: cannot write {path} (No space left on device); ")
    if kept:
        assert "the checkpoint of round 2 is kept" in r.stderr and checkpoint_round(folder) == kept
    else:
        assert "; no checkpoint yet (--checkpoint-every 2); " in r.stderr and r.stderr.endswith("; nothing to resume\n")
        assert not os.path.exists(os.path.join(folder, "checkpoint.pt"))
    assert len(metrics_rows(folder)) == kept + 2
    assert_released(folder)


@pytest.mark.slow
def test_a_full_disk_at_the_lock_leaves_no_folder(tmp_path):
    r, keep = in_small_filesystem(tmp_path, 16, 'dd if=/dev/zero of="$FS/fill" bs=4k count=4 2>/dev/null\n'
                                  '"$PY" fedavg.py ' + " ".join(SMALL) + ' --rounds 2 --out "$FS/runs"')
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: cannot create {tmp_path}/fs/runs/fedavg-synthetic-s0-") and \
        r.stderr.endswith("/.lock (No space left on device)\n"), r.stderr
    assert os.listdir(keep) == ["fill"]


# ----------------------------------------------------------------------------- what --resume reads

@pytest.mark.parametrize("name", ["checkpoint.pt", "config.json", "metrics.csv", "summary.json", ".lock"])
def test_a_named_pipe_in_the_run_folder_is_refused_never_read(name, finished, copy_of, capsys):
    """A run file: refused in one line. .lock is never read (an OS lock on it, issue 86): the run goes on."""
    folder = copy_of(finished)
    path = os.path.join(folder, name)
    if os.path.exists(path):
        os.remove(path)
    os.mkfifo(path)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"blocked reading the named pipe {name}"))
    signal.alarm(60)
    try:
        code, lines = run(capsys, "--resume", folder, "--rounds", "3")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if name == ".lock":
        assert code == 0 and lines == [] and len(metrics_rows(folder)) == 3, lines
        return
    assert code == 2 and lines == [f"error: cannot resume: {path} is not a regular file; move it away"], lines


def test_resume_refuses_data_that_changed_since_the_run_started(tmp_path, capsys):
    data = str(tmp_path / "d.npz")
    x, y = np.random.default_rng(0).normal(size=(80, 8)).astype(np.float32), np.arange(80) % 4
    np.savez(data, x=x, y=y)
    assert run_in_process("fedavg.py", "--dataset", data, "--num-clients", "2", "--rounds", "2",
                          "--out", tmp_path / "runs") == 0
    folder = run_dir(tmp_path / "runs")
    config_path = os.path.join(folder, "config.json")
    saved = json.load(open(config_path))["data_sha256"]
    np.savez(data, x=x + 1, y=y)  # overwritten after the run stopped
    code, lines = run(capsys, "--resume", folder, "--rounds", "3")
    assert code == 2 and len(lines) == 1 and lines[0].startswith(
        f"error: cannot resume: the data of {folder} changed since the run started ({data}: fingerprint {saved[:16]} "
        "now "), lines
    np.savez(data, x=x, y=y)
    config = json.load(open(config_path))
    del config["data_sha256"]  # a run folder from before the fingerprint: an older form, which the tool upgrades
    json.dump(config, open(config_path, "w"))
    code, lines = run(capsys, "--resume", folder, "--rounds", "3")
    assert code == 2 and lines == [f"error: cannot resume: {folder} was made by an older version of fedavg.py; bring "
                                   f"it to today's form with: python tools/run_records.py --upgrade {folder}"], lines
    assert run_records.main(["--upgrade", folder]) == 0 and json.load(open(config_path))["data_sha256"] == saved
    assert run_in_process("fedavg.py", "--resume", folder, "--rounds", "3") == 0


def test_the_fingerprint_is_the_same_on_every_device_and_layout(finished):
    import common
    import fedavg
    data = common.load_federated_data(fedavg.parse_args([*SMALL, "--rounds", "2"]), torch.device("cpu"))
    assert run_folder.data_fingerprint(data) == json.load(open(os.path.join(finished, "config.json")))["data_sha256"]
    data.y = data.y.clone()
    data.y[0] = 1 - data.y[0]
    assert run_folder.data_fingerprint(data) != json.load(open(os.path.join(finished, "config.json")))["data_sha256"]


def test_an_invalid_value_in_config_json_is_named_as_the_config_s(finished, copy_of, capsys):
    folder = copy_of(finished)
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    config["args"]["lr"] = float("nan")
    json.dump(config, open(path, "w"))
    code, lines = run(capsys, "--resume", folder, "--rounds", "3")
    assert code == 2 and lines == [f"error: cannot resume: {path} holds an invalid setting: --lr must be a finite "
                                   "number > 0, got nan (the file was edited or damaged)"], lines
    code, lines = run(capsys, "--resume", folder, "--rounds", "0")  # a flag given now keeps its own message
    assert code == 2 and lines == ["error: --rounds must be >= 1, got 0"], lines


def test_the_script_continues_a_flower_run(finished, copy_of, capsys):
    """A Flower run's checkpoint is the script's (the server keeps all of the algorithm's state)."""
    folder = copy_of(finished)
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    config["script"] = "flower_app"  # what flower/app.py records
    json.dump(config, open(path, "w"))
    code, lines = run(capsys, "--resume", folder)
    assert code == 2 and lines[0].startswith(f"error: cannot resume: {folder} has finished its"), lines


# ----------------------------------------------------------------------------- one schema for --resume (issue 28)

def _edit_json(name, edit):
    def make(folder):
        path = os.path.join(folder, name)
        with open(path) as f:
            data = json.load(f)
        edit(data)
        with open(path, "w") as f:
            json.dump(data, f)
    return make


def _cut(name):
    def make(folder):
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
    return make


def _edit_checkpoint(edit):
    def make(folder):
        path = os.path.join(folder, "checkpoint.pt")
        blob = torch.load(path, weights_only=True)
        edit(blob)
        torch.save(blob, path)
    return make


# each a file --resume reads, off in one field: the script refuses it in one generic line naming the file (exit 2,
# nothing changed); tools/run_records.py RUN_DIR names the field (issue 86: the field-precise checks live there)
RESUME_CASES = [
    ("config.json without rounds", _edit_json("config.json", lambda c: c["args"].pop("rounds")),
     "config.json is not a run's config.json (no 'rounds')", "config.json lacks the field args.rounds"),
    ("data_sha256 a number", _edit_json("config.json", lambda c: c.update(data_sha256=5)),
     "changed since the run started (synthetic: fingerprint 5 now ",
     "config.json has data_sha256 = 5, which must be 64 hexadecimal digits"),
    ("parallel_clients abc", _edit_json("config.json", lambda c: c["args"].update(parallel_clients="abc")),
     "config.json holds an invalid setting: --parallel-clients ",
     "config.json has args.parallel_clients = 'abc', which must be 'auto' or an integer >= 1"),
    ("args a list", _edit_json("config.json", lambda c: c.update(args=[1])),
     "config.json is not a run's config.json (damaged)", "config.json has args = [1]"),
    ("config.json cut short", _cut("config.json"), "config.json cannot be read (not JSON)",
     "config.json cannot be read (not JSON: cut short or damaged)"),
    ("checkpoint of round 2 without rows", _edit_checkpoint(lambda b: b.update(rows=[])),
     "checkpoint.pt is not a valid checkpoint of this run (round 2 with rows of rounds [])",
     "checkpoint.pt is a checkpoint of round 2 without the metric rows of round 1, 2"),
    ("checkpoint with duplicated rows", _edit_checkpoint(lambda b: b.update(rows=[b["rows"][0]] * 2)),
     "checkpoint.pt is not a valid checkpoint of this run (round 2 with rows of rounds [1, 1])",
     "checkpoint.pt has rows[1] of round 1 after round 1, in a checkpoint of round 2 (duplicated or out of order"),
    ("checkpoint with a garbage row", _edit_checkpoint(lambda b: b["rows"].__setitem__(1, "garbage")),
     "checkpoint.pt is not a valid checkpoint of this run (",
     "checkpoint.pt has rows[1] = 'garbage', which is not a metric row"),
]
# the diagnosis names the field of damage that the scripts go on past (a round as a string, negative bytes: nothing
# a resume computes) or refuse in their own line (tests/test_safety.py)
DIAGNOSED_ONLY = [
    ("checkpoint round a string", _edit_checkpoint(lambda b: b.update(round="2")),
     "checkpoint.pt has round = '2', which must be an integer >= 1"),
    ("checkpoint bytes negative", _edit_checkpoint(lambda b: b.update(bytes=[-1, 0])),
     "checkpoint.pt has bytes = [-1, 0], which must be two integers >= 0"),
    ("a config value of the wrong type", _edit_json("config.json", lambda c: c["args"].update(batch_size=2.5)),
     "config.json has args.batch_size = 2.5, which must be an integer >= 1"),
    ("a config naming no algorithm", _edit_json("config.json", lambda c: c.update(algorithm=None)),
     "config.json has algorithm = None, which must be a name"),
]


def _snapshot(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def diagnosis(folder, capsys):
    """python tools/run_records.py RUN_DIR, in this process: (exit status, the lines on stderr)."""
    capsys.readouterr()
    code = run_records.main([folder])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("name, make, words, field", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_what_resume_reads_is_refused_in_one_line_and_the_diagnosis_names_the_field(name, make, words, field,
                                                                                  finished, copy_of, capsys):
    folder = copy_of(finished)
    make(folder)
    before = _snapshot(folder)
    code, lines = run(capsys, "--resume", folder, "--rounds", "3")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: cannot resume") and words in lines[0], lines
    assert _snapshot(folder) == before
    code, lines = diagnosis(folder, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: damaged: ") and field in lines[0], lines
    assert _snapshot(folder) == before


@pytest.mark.parametrize("name, make, field", DIAGNOSED_ONLY, ids=[c[0] for c in DIAGNOSED_ONLY])
def test_the_diagnosis_names_the_field(name, make, field, finished, copy_of, capsys):
    folder = copy_of(finished)
    make(folder)
    before = _snapshot(folder)
    code, lines = diagnosis(folder, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: damaged: ") and field in lines[0], lines
    assert _snapshot(folder) == before


def test_the_schemas_pass_what_the_scripts_write(finished, capsys):
    with open(os.path.join(finished, "config.json")) as f:
        run_records.check_config(json.load(f), "config.json")
    blob = torch.load(os.path.join(finished, "checkpoint.pt"), weights_only=True)
    run_records.check_checkpoint(blob, "checkpoint.pt")
    run_records.check_launches({"launches": [{"time": "t", "command": ["python"], "pid": 12, "threads": None}]}, "r")
    assert diagnosis(finished, capsys) == (0, [])


# ----------------------------------------------------------------------------- every line true

def test_the_resume_refusal_names_the_flags_that_may_change_and_each_of_them_may(finished, copy_of, capsys):
    folder = copy_of(finished)
    code, err = run(capsys, "--resume", folder, "--rounds", "3", "--lr", "0.5")
    assert code == 2 and len(err) == 1 and "(now 0.5)" in err[0]
    assert "only --rounds may change" not in err[0]
    named = sorted(set(re.findall(r"--[a-z-]+", err[0].split("; only ")[1])) - {"--dataset"})
    expected = sorted(f"--{k.replace('_', '-')}" for k in run_folder.RESUME_MAY_CHANGE - {"resume"})
    assert named == expected
    values = {"--rounds": "3", "--device": "cpu", "--parallel-clients": "1", "--data-dir": "elsewhere",
              "--checkpoint-every": "7", "--stop-after": "3", "--out": "elsewhere"}
    for flag in named:  # each flag the line names is one a resume takes
        given = [flag] if values[flag] is True else [flag, values[flag]]
        args = fedavg.parse_args(["--resume", folder, "--rounds", "3", *given])
        assert str(getattr(args, flag[2:].replace("-", "_"))) == str(values[flag]), flag


def test_a_line_promises_a_checkpoint_only_while_it_is_there(tmp_path):
    run = run_folder.Run.__new__(run_folder.Run)  # the state a run has after its checkpoint of round 3
    run.dir, run.program, run.checkpoint_round, run.rows = str(tmp_path), "fedavg.py", 3, [{"round": 3}]
    run.args = argparse.Namespace(resume=None, checkpoint_every=1)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert "the checkpoint of round 3 is kept" in run.kept()
    (tmp_path / "checkpoint.pt").unlink()  # the folder's content moved or deleted under the running job
    line = run.kept()
    assert "is kept" not in line and "continue with" not in line
    assert f"the checkpoint of round 3 is gone from {tmp_path}" in line


def test_a_run_folder_deleted_under_the_run_ends_in_a_line_that_says_its_checkpoint_is_gone(
        tmp_path, capsys, after_checkpoint):
    after_checkpoint(1, shutil.rmtree)
    code, err = run(capsys, *SMALL, "--rounds", "3", "--checkpoint-every", "1", "--out", tmp_path / "runs")
    assert code == 1 and len(err) == 1, err
    assert "cannot write" in err[0] and "the checkpoint of round 1 is gone" in err[0] and "is kept" not in err[0]


@pytest.mark.parametrize("given, expected", [(".", "here-data"), ("./", "here-data"), ("..", "parent"),
                                             ("../here-data/", "here-data"), ("/", "data"), ("mnist", "mnist"),
                                             ("data/x.npz", "x"), ("synthetic(0.5,0.5)", "synthetic-0.5-0.5")])
def test_the_run_folder_names_the_folder_meant_by_dot(given, expected, tmp_path, monkeypatch):
    (tmp_path / "parent" / "here-data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "parent" / "here-data")
    run = run_folder.Run.__new__(run_folder.Run)  # Run.new_folder alone: the folder and its lock
    run.algo, run.made, run.args = "fedavg", [], argparse.Namespace(dataset=given, out=str(tmp_path / "runs"), seed=0)
    run.new_folder()
    try:
        assert re.fullmatch(rf"fedavg-{re.escape(expected)}-s0-\d{{8}}-\d{{6}}", os.path.basename(run.dir)), run.dir
    finally:
        run.lock.release()


def test_a_run_whose_npz_file_moved_resumes_from_its_new_place(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x=rng.normal(size=(120, 6)).astype(np.float32), y=rng.integers(0, 3, 120))
    flags = ["--num-clients", "3", "--rounds", "2", "--checkpoint-every", "1"]
    assert run_in_process("fedavg.py", "--dataset", path, *flags, "--out", tmp_path / "cut", "--stop-after", "1") == 0
    folder = run_dir(tmp_path / "cut")
    moved = tmp_path / "moved.npz"
    os.rename(path, moved)
    code, err = run(capsys, "--resume", folder)
    assert code == 2 and len(err) == 1 and "is not there (moved or deleted)" in err[0], err
    np.savez(tmp_path / "other.npz", x=np.zeros((120, 6), np.float32), y=np.arange(120) % 3)
    code, err = run(capsys, "--resume", folder, "--dataset", tmp_path / "other.npz")
    assert code == 2 and "changed since the run started" in err[0], err
    assert run(capsys, "--resume", folder, "--dataset", moved)[0] == 0
    assert [r["round"] for r in metrics_rows(folder)] == ["1", "2"]


def test_a_run_config_json_is_read_within_its_bound(finished, copy_of, capsys, monkeypatch):
    """tools/run_records.py reads no config.json beyond its bound (the scripts read at most 64 MB of it)."""
    folder = copy_of(finished)
    path = os.path.join(folder, "config.json")
    text = open(path).read()
    open(path, "w").write(text + " " * 300)
    monkeypatch.setattr(run_records, "RUN_JSON_MAX_BYTES", len(text) + 100)
    code, err = diagnosis(folder, capsys)
    assert code == 2 and len(err) == 1 and path in err[0] and "a run's config.json is a few KB" in err[0], err
