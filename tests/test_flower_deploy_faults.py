"""flower/app.py deployed on localhost (a SuperLink and 4 SuperNodes, tests/deploy.py) as a
user runs it, ``python flower/app.py ALGORITHM --federation local ...``: a node killed in round
2 is left out and the run finishes; a node started again takes its client back; a run stopped
by the server resumes to the metrics of the script's uninterrupted run; a failed run exits non-zero.
Minutes each (the SuperLink notices a dead node after two missed 30 s heartbeats): the stopped server runs
with the suite; the killed node and the failed run only with ``python -m pytest -q --flower-faults
tests/test_flower_deploy_faults.py tests/test_flower_deploy.py`` (after a change to flower/ or tests/deploy.py),
their logic checked in the suite against a stand-in grid (tests/test_flower_resilience.py)."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, metrics_rows, run_dir, run_script

pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
from deploy import Deployment, missing_tools  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing_tools()), reason="Flower's commands are not installed")]
MEASURED = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}


def submit(deployment, *argv, timeout=900):
    """``python flower/app.py ARGV --federation local`` from the deployment's folder, started."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "flower", "app.py"), *map(str, argv),
                             "--federation", "local"], cwd=deployment.folder, env=deployment.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=900):
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"flower/app.py --federation did not end in {timeout} s:\n{output[-3000:]}")
    return proc.returncode, output


def run_folders(folder):
    runs = os.path.join(folder, "runs")
    return sorted(os.path.join(runs, d) for d in os.listdir(runs)) if os.path.isdir(runs) else []


def only_folder(out):
    (name,) = os.listdir(out)
    return os.path.join(str(out), name)


def wait_for_round(folder, round_, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in run_folders(folder):
            if os.path.exists(os.path.join(run, "metrics.csv")) and \
                    any(int(r["round"]) >= round_ for r in metrics_rows(run)):
                return run
        time.sleep(0.2)
    raise AssertionError(f"round {round_} not reached in {timeout} s")


@pytest.mark.flower_faults
def test_a_node_killed_in_round_2_is_left_out_and_the_run_finishes(tmp_path):
    flags = ["fedavg", "--dataset", "synthetic", "--num-clients", "4", "--rounds", "3", "--out", "runs"]
    with Deployment(tmp_path, num_nodes=4) as d:
        proc = submit(d, *flags)
        wait_for_round(d.folder, 1)
        d.kill_node(3)  # SIGKILL to the node, its SuperExec, its ClientApp and its worker
        code, output = finish(proc)
    assert code == 0, output[-3000:]
    (run,) = run_folders(str(tmp_path))
    rows = metrics_rows(run)
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    answered = [int(r["clients_answered"]) for r in rows]
    assert answered[0] == 4 and answered[-1] == 3 and set(answered) <= {3, 4}, answered
    assert json.load(open(os.path.join(run, "summary.json")))["status"] == "finished"
    assert "client 3 left out" in output and "finished:completed" in output


def test_a_stopped_server_resumes_to_the_script_s_metrics_and_a_node_can_come_back(tmp_path):
    """The run stopped after round 1 (--stop-after), node 1 replaced, then --resume: the rounds equal
    fedala.py's uninterrupted run of the same flags (a whole deployed run equals the script's too:
    tests/test_flower_deploy.py)."""
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "2", "--join-ratio", "0.5",
             "--checkpoint-every", "1"]
    started = time.monotonic()
    with Deployment(tmp_path, num_nodes=4, env={"OMP_NUM_THREADS": "1"}) as d:
        up = time.monotonic()
        code, output = finish(submit(d, "fedala", *flags, "--out", "runs/parts", "--stop-after", "1"))
        assert code == 0 and "continue with: python flower/app.py --resume" in output, output[-3000:]
        assert "Flower: 4 clients on 4 nodes" in output and "round 1/2" in output, output[-3000:]
        parts = only_folder(tmp_path / "runs" / "parts")
        d.kill_node(1)
        d.start_node(1)  # a new SuperNode process (a new node id) for partition-id 1, before the run goes on
        code, output = finish(submit(d, "--resume", os.path.relpath(parts, str(tmp_path))))
        assert code == 0 and "round 2/2" in output, output[-3000:]
    ran = time.monotonic()
    script = run_script("fedala.py", *flags, "--out", tmp_path / "script", timeout=300)
    assert script.returncode == 0, script.stderr
    expected, resumed = metrics_rows(run_dir(str(tmp_path / "script"))), metrics_rows(parts)
    assert [r["round"] for r in resumed] == [r["round"] for r in expected] == ["1", "2"]
    assert [r["clients_answered"] for r in resumed] == ["2", "2"]  # the replaced node answered if asked
    for e, g in zip(expected, resumed):
        for key in set(e) - MEASURED:
            assert float(g[key]) == pytest.approx(float(e[key]), abs=1e-4), (e["round"], key)
    print(f"\ndeployment: {up - started:.1f} s to start, {ran - up:.1f} s for the two runs of a round each, "
          f"{os.getloadavg()[0]:.1f} load")


@pytest.mark.flower_faults
def test_a_failed_deployed_run_exits_non_zero_with_its_line(tmp_path):
    with Deployment(tmp_path, num_nodes=2) as d:
        code, output = finish(submit(d, "fedavg", "--dataset", "synthetic", "--num-clients", "2", "--rounds", "2",
                                     "--round-timeout", "0.01", "--min-clients", "2", "--out", "runs"))
    assert code == 1, output[-3000:]
    assert "error: round 1: 0 of 2 clients answered, fewer than --min-clients 2" in output
    assert "finished:failed" in output and "Traceback" not in output
    assert run_folders(str(tmp_path)) == []  # a run that failed before any result leaves no folder, as a script's
