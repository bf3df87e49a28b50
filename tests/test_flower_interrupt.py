"""flower/app.py stopped by Ctrl-C, and a node that fails: one line on stderr, the documented
exit status, and no Ray process left. The Ctrl-C case starts a simulation of its own (about
30 s here, on 2 shared cores); the failure of a node is checked without Ray."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, metrics_rows, run_dir

pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
import common  # noqa: E402
from flower import app as flower_app  # noqa: E402


def live_members(group):
    """The processes of process group ``group`` that are still running (zombies are not)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds Ray's processes in /proc")
def test_ctrl_c_in_a_simulation_is_one_line_exit_130_and_stops_ray(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "flower", "app.py"), "fedavg", "--dataset", "synthetic",
                             "--num-clients", "4", "--rounds", "200", "--checkpoint-every", "1", "--out", str(out)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = queue.Queue()  # stdout, read on a thread so that waiting for a line can time out
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while "round 1/200" not in lines.get(timeout=max(deadline - time.monotonic(), 0.1)):
            pass
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground process group
        proc.wait(timeout=60)
        stderr = proc.stderr.read()
        deadline = time.monotonic() + 5
        while live_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = live_members(proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 130, stderr
    (line,) = [ln for ln in stderr.splitlines() if ln.strip()]
    folder = run_dir(out)
    done = metrics_rows(folder)[-1]["round"]
    assert line == f"interrupted; the checkpoint of round {done} is kept; continue with: python flower/app.py " \
                   f"--resume {folder}"
    assert sorted(os.listdir(folder)) == ["checkpoint.pt", "config.json", "metrics.csv", "partition.json"]  # unlocked
    assert left == [], "Ray processes still running after flower/app.py ended"


def test_a_nodes_failure_reaches_the_server_as_one_line(monkeypatch):
    """A ClientApp's UserError (e.g. data the model cannot take, found while the node sets up) is
    bad input for the server (it stops the run), any other failure a fault (the client is left
    out of the round); both one line, never a traceback."""
    from flwr.app import Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    for name in ("_run_id", "_task_id", "_node_id"):  # as run_simulation sets them, for messages outside it
        monkeypatch.setattr(TaskIdentity, name, 1)
    message = Message(RecordDict(), 5, "train")

    def bad_data():
        raise common.UserError("--model cnn does not take samples of shape (1, 32, 8)")

    refused = flower_app.reply(message, bad_data)
    assert (refused.error.code, refused.error.reason) == \
        (flower_app.USER_ERROR, "--model cnn does not take samples of shape (1, 32, 8)")
    failed = flower_app.reply(message, lambda: 1 / 0)
    assert failed.error.code == flower_app.NODE_FAULT
    assert failed.error.reason.startswith("ZeroDivisionError: division by zero (test_flower_interrupt.py:")
    assert "\n" not in failed.error.reason
    assert not flower_app.reply(message, RecordDict).has_error()
