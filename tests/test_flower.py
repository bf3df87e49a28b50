"""flower/app.py: each algorithm as a Flower simulation gives the plain script's metrics.

One Flower simulation (one Ray start-up, about 15 s here) runs every job below one after
another on the same 4 nodes; the scripts run in this process. The whole file takes about
40 s on 2 cores."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, metrics_rows, run_dir

pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
import common  # noqa: E402
from flower import app as flower_app  # noqa: E402
import run_folder  # noqa: E402

SMALL = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "3"]
JOBS = {  # name: (algorithm, flags); the extra jobs cover a partial join and HeurpFedLA
    **{algorithm: (algorithm, SMALL) for algorithm in flower_app.ALGORITHMS},
    "fedala-join": ("fedala", SMALL + ["--join-ratio", "0.5"]),
    "pfedla-k1": ("pfedla", SMALL + ["--k", "1", "--join-ratio", "0.5"]),
}
NOT_COMPARED = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}  # timing and memory


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{job: (script run folder, Flower run folder)}."""
    out = tmp_path_factory.mktemp("flower")
    for name, (algorithm, flags) in JOBS.items():
        importlib.import_module(algorithm).main(flags + ["--out", str(out / "script" / name)])
    flower_app.simulate([[algorithm, *flags, "--out", str(out / "flower" / name)]
                         for name, (algorithm, flags) in JOBS.items()])
    return {name: (run_dir(str(out / "script" / name)), run_dir(str(out / "flower" / name))) for name in JOBS}


@pytest.mark.slow  # end to end, tens of seconds: runs in CI with the full suite
@pytest.mark.parametrize("name", list(JOBS))
def test_flower_simulation_equals_script(runs, name):
    script, flower = runs[name]
    assert sorted(f for f in os.listdir(flower) if not f.startswith(".")) == \
        ["checkpoint.pt", "config.json", "metrics.csv", "partition.json", "summary.json"]
    with open(os.path.join(script, "partition.json")) as a, open(os.path.join(flower, "partition.json")) as b:
        assert json.load(a) == json.load(b)
    expected, got = metrics_rows(script), metrics_rows(flower)
    assert [r["round"] for r in got] == [r["round"] for r in expected] == ["1", "2", "3"]
    assert [k for k in got[0] if k not in ("clients_answered", "clients_left_out")] == list(expected[0])
    assert all(r["clients_answered"] == str(got_clients(name, r)) for r in got)
    for e, g in zip(expected, got):
        for key in set(e) - NOT_COMPARED:
            assert float(g[key]) == pytest.approx(float(e[key]), abs=1e-4), (name, e["round"], key)
    with open(os.path.join(script, "summary.json")) as a, open(os.path.join(flower, "summary.json")) as b:
        expected, got = json.load(a), json.load(b)
    assert set(got) == set(expected)
    for key in set(expected) - {"seconds", "peak_host_mb", "peak_device_mb"}:
        assert close(got[key], expected[key]), (name, key, got[key], expected[key])


def got_clients(name, row):
    """Clients per round: the script's round(join ratio x clients), every one of which answers here."""
    algorithm, flags = JOBS[name]
    return common.clients_per_round(importlib.import_module(algorithm).parse_args(flags))


def close(a, b):
    """Equal, numbers within 1e-4, through lists and dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-4
    return a == b

@pytest.mark.slow  # end to end, tens of seconds: runs in CI with the full suite
def test_refusals_exit_2_with_one_line(tmp_path):
    """--resume, bad flags, an unknown algorithm, and a missing Flower (a shadowing ``flwr``
    that fails to import): exit status 2 and one line, before any simulation starts."""
    shadow = tmp_path / "no_flwr"
    shadow.mkdir()
    (shadow / "flwr.py").write_text("raise ImportError('no flwr here')\n")
    cases = {
        "resume": (["fedavg", "--resume", str(tmp_path)], {}, "is missing or not the config of a flower/app.py run"),
        "option": (["fedavg", "--min-clients", "0"], {}, "--min-clients must be >= 1, got 0"),
        "bad flag": (["fedala", "--dataset", "synthetic", "--rounds", "0"], {}, "--rounds must be >= 1"),
        "unknown flag": (["pfedla", "--no-such-flag"], {}, "unrecognized arguments"),
        "algorithm": (["fedprox"], {}, "unknown algorithm"),
        "not fedavg.py's": (["fedavg", "--dataset", "synthetic", "--local-training"], {},
                            "unrecognized arguments: --local-training"),
        "no flwr": (["fedavg"], {"PYTHONPATH": str(shadow)}, "pip install -r requirements-flower.txt"),
    }
    procs = {name: subprocess.Popen([sys.executable, os.path.join(ROOT, "flower", "app.py"), *argv], cwd=tmp_path,
                                    env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
             for name, (argv, env, _) in cases.items()}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, (name, stdout, stderr)
        assert len(stderr.strip().splitlines()) == 1 and cases[name][2] in stderr, (name, stderr)
    assert os.listdir(tmp_path) == ["no_flwr"]  # no run folder, no runs/


@pytest.mark.parametrize("values, words", [
    ([], "it takes SOCKET KEY_FILE WATCH_PID IDLE_SECONDS, got 0 value(s)"),
    (["s.sock", "nokey", "0", "60"], "KEY_FILE 'nokey' is not a file"),
    (["s.sock", "KEY", "pid", "60"], "WATCH_PID must be a process id >= 0, got 'pid'"),
    (["s.sock", "KEY", "0", "nan"], "IDLE_SECONDS must be a number > 0, got 'nan'"),
])
def test_node_worker_typed_by_hand_is_one_line_exit_2(values, words, tmp_path, capsys):
    """flower/node.py starts ``app.py --node-worker SOCKET KEY_FILE WATCH_PID IDLE_SECONDS``; typed by hand
    with anything else it says so in one line (run_main, as ``python flower/app.py``), and makes nothing."""
    (tmp_path / "KEY").write_bytes(b"k" * 32)
    values = [str(tmp_path / v) if v in ("s.sock", "KEY") else v for v in values]
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(flower_app.main, ["--node-worker", *values])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and line.startswith("error: --node-worker is flower/node.py's") and words in line, line
    assert os.listdir(tmp_path) == ["KEY"]


@pytest.mark.parametrize("name", ["config.json", "checkpoint.pt"])
def test_resume_refuses_a_named_pipe_in_the_run_folder_never_opens_it(name, tmp_path):
    """As the scripts: flower/app.py --resume DIR with a named pipe in DIR is one line, and never blocks."""
    import signal
    folder = tmp_path / "run"
    folder.mkdir()
    if name != "config.json":
        (folder / "config.json").write_text(json.dumps({"flower": {"algorithm": "fedavg", "flags": []}}))
    os.mkfifo(folder / name)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"blocked opening the named pipe {name}"))
    signal.alarm(30)
    try:
        with pytest.raises(common.UserError) as refused:
            flower_app.plan(["fedavg", "--resume", str(folder)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert str(refused.value) == f"cannot resume: {folder / name} is not a regular file; move it away"


@pytest.mark.parametrize("algorithm, flag", [("fedavg", "--local-training"), ("fedavg", "--eval-local-models"),
                                             ("fedacd", "--fedavg"), ("fedacd", "--log-risk")])
def test_the_modes_that_left_the_scripts_are_refused_not_ignored(algorithm, flag):
    """Flower runs the scripts' own client and server steps: the modes of tools/ are not run there, and their
    flags are refused as any flag the script does not have, in one line."""
    with pytest.raises(common.UserError, match=f"^unrecognized arguments: {flag}$"):
        flower_app.Job(algorithm, ["--dataset", "synthetic", "--num-clients", "4", flag])


def test_help_prints_the_usage_and_exits_0(capsys):
    assert flower_app.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python flower/app.py {fedavg,fedala,pfedla,fedpake,fedacd}")


@pytest.mark.parametrize("algorithm,flags,expected", [("fedala", ["--p", "9"], "--p 9"),
                                                      ("pfedla", ["--k", "9"], "--k 9 is more than")])
def test_server_setup_refuses_what_the_script_refuses_after_set_up(algorithm, flags, expected):
    """Found only once the model exists: the server says so in one line before any node trains
    (not as a ClientApp traceback from every node)."""
    job = flower_app.job_for(algorithm, ["--dataset", "synthetic", "--num-clients", "4", *flags])
    with pytest.raises(common.UserError, match=expected):
        flower_app.SERVERS[algorithm][0](job, {})


def test_clients_together_is_refused_not_ignored():
    """The removed flag is refused in one line, not ignored."""
    with pytest.raises(common.UserError, match="^unrecognized arguments: --clients-together$"):
        flower_app.Job("fedavg", ["--dataset", "synthetic", "--num-clients", "4", "--clients-together"])


def test_resume_of_a_config_json_nested_too_deeply_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text('{"flower": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(common.UserError, match="is missing or not the config of a flower/app.py run"):
        flower_app.plan(["fedavg", "--resume", str(folder)])


def test_checks_that_need_no_data_refuse_before_ray_starts(tmp_path, monkeypatch):
    """An --out that cannot hold a run folder and --min-clients above --num-clients: one line, before the simulation
    (Ray and its session folder) starts, and nothing is made. (A --resume with a --stop-after the run's checkpoint has
    reached is refused by Run.resume, as the script refuses it: tests/test_stop_after.py.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(flower_app, "simulate", lambda *a, **k: pytest.fail("Ray started before the refusal"))
    (tmp_path / "afile").write_text("")
    small = ["fedavg", "--dataset", "synthetic", "--num-clients", "2", "--rounds", "2"]
    with pytest.raises(common.UserError, match="cannot create a run folder under --out afile/x"):
        flower_app.main([*small, "--out", "afile/x"])
    with pytest.raises(common.UserError, match="--min-clients 3 is more than the run's 2 clients"):
        flower_app.main([*small, "--min-clients", "3"])
    assert sorted(os.listdir(tmp_path)) == ["afile"]
