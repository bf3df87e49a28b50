"""tools/compare.py: the table (grouping over seeds, settings kept apart, best/final per metric,
statuses of unfinished, diverged, older-format, unreadable and damaged runs), the plot, and bad input.
Most run folders are fabricated; one end-to-end case runs fedavg.py and fedala.py."""
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from conftest import ROOT, metrics_rows, run_script
from tools import compare as compare_tool

ARGS = {"dataset": "synthetic", "data_dir": "./data", "partition": "dir", "beta": 0.1, "num_clients": 20,
        "rounds": 5, "lr": 0.005, "seed": 0, "device": "auto", "out": "runs", "resume": None,
        "parallel_clients": "auto", "stop_after": None, "eval_every": 1, "checkpoint_every": 50}
HEADLINES = {"fedavg": "best test_acc (FedALA Table 2 reports FedAvg's best)",
             "pfedla": "test_acc_mean (unweighted mean over clients; Table 1 after 600 rounds)",
             "fedacd": "global_acc: global model on the uniform test set (FedACD Table 1)",
             "fedpake": "last10_mean of test_acc (FedPake Table 1: mean over the last 10 rounds)"}


def make_run(parent, name, algo="fedavg", acc=(10, 30, 20, 40, 35), summary=True, config=True, **args):
    """Write a run folder as the scripts do: config.json, metrics.csv (test_acc = ``acc``,
    test_loss = 100 - acc, other metric columns derived) and, unless ``summary`` is False,
    summary.json (a dict given as ``summary`` is merged in)."""
    folder = os.path.join(parent, name)
    os.makedirs(folder)
    full = {**ARGS, **args}
    if config:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({"algorithm": algo, "args": full, "command": [f"{algo}.py"], "device": "cpu"}, f)
    with open(os.path.join(folder, "metrics.csv"), "w") as f:
        f.write("round,test_acc,test_acc_mean,global_acc,test_loss,seconds,sec_per_round,mb_down,mb_up,host_mb\n")
        for r, a in enumerate(map(float, acc), 1):
            f.write(f"{r},{a},{a / 2},{a + 1},{100 - a},{0.5 * r},0.5,{1.5 * r},{0.5 * r},700\n")
    if summary:
        body = {"algorithm": algo, "rounds": full["rounds"], "paper_reports": HEADLINES.get(algo, HEADLINES["fedavg"])}
        with open(os.path.join(folder, "summary.json"), "w") as f:
            json.dump({**body, **(summary if isinstance(summary, dict) else {})}, f)
    return folder


def compare(*args):
    """Run tools/compare.py; returns (CompletedProcess, table rows as dicts keyed by the header)."""
    proc = run_script("tools/compare.py", *args, timeout=60)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith(("---", "plot written"))]
    if not lines:
        return proc, []
    header = re.split(r"\s{2,}", lines[0].strip())
    return proc, [dict(zip(header, re.split(r"\s{2,}", ln.strip()))) for ln in lines[1:]]


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values)


def cell(text):
    """'12.50 ± 3.10' -> (12.5, 3.1); '12.50' -> (12.5, None)."""
    parts = text.split(" ± ")
    return float(parts[0]), (float(parts[1]) if len(parts) > 1 else None)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr


@pytest.mark.slow  # end to end, tens of seconds: runs in CI with the full suite
def test_end_to_end_real_runs_table_and_plot(tmp_path):
    parent = tmp_path / "runs"
    for algo in ("fedavg", "fedala"):
        proc = run_script(f"{algo}.py", "--dataset", "synthetic", "--rounds", 3, "--num-clients", 5, "--out", parent)
        assert proc.returncode == 0, proc.stderr
    png = tmp_path / "x.png"
    proc, rows = compare(parent, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["algorithm"] for r in rows) == ["fedala", "fedavg"]
    for row in rows:
        (folder,) = [d for d in parent.iterdir() if d.name.startswith(row["algorithm"] + "-")]
        accs = [float(r["test_acc"]) for r in metrics_rows(folder)]
        best_round = max(range(len(accs)), key=accs.__getitem__) + 1
        assert row["metric"] == "test_acc" and row["status"] == "ok" and row["rounds"] == "3/3"
        assert cell(row["best"])[0] == pytest.approx(max(accs), abs=0.006)
        assert cell(row["final"])[0] == pytest.approx(accs[-1], abs=0.006)
        assert row["@round"] == str(best_round) and row["clients"] == "5" and row["seeds"] == "0"
    data = png.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400


def test_seeds_of_equal_settings_share_one_row_with_mean_and_std(tmp_path):
    curves = {0: (10, 30, 20, 40, 35), 1: (12, 25, 45, 41, 44), 2: (5, 50, 20, 33, 30)}
    for seed, acc in curves.items():  # flags that cannot change results differ too
        parent = tmp_path / "deeper" / "still" if seed == 2 else tmp_path  # found recursively
        make_run(parent, f"fedavg-synthetic-s{seed}", acc=acc, seed=seed, out=f"o{seed}",
                 device=["cpu", "cuda", "auto"][seed], eval_every=seed + 1, parallel_clients=seed + 1)
    make_run(tmp_path, "fedavg-synthetic-s3-lr", acc=(1, 2, 3, 4, 99), seed=3, lr=0.1)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(rows) == 2
    (group,) = [r for r in rows if r["seeds"] != "3"]
    assert group["seeds"] == "0,1,2" and group["status"] == "ok"
    for column, values in (("best", [max(a) for a in curves.values()]), ("final", [a[-1] for a in curves.values()])):
        mean, std = cell(group[column])
        assert (mean, std) == pytest.approx(mean_std(values), abs=0.006)
    assert group["@round"] == "2-4"  # the seeds' best rounds are 4, 3 and 2
    assert cell(group["MB"])[0] == pytest.approx(10.0) and cell(group["s/round"])[0] == pytest.approx(0.5)
    (single,) = [r for r in rows if r["seeds"] == "3"]
    assert cell(single["best"]) == (99.0, None) and single["settings"] == "lr=0.1"


def test_runs_of_different_settings_are_never_averaged(tmp_path):
    real = {"dataset": "cifar10"}  # a partitioned dataset: --beta is a setting
    make_run(tmp_path, "base-s0", seed=0, **real)
    make_run(tmp_path, "base-s1", seed=1, **real)
    make_run(tmp_path, "lr", seed=1, lr=0.01, **real)
    make_run(tmp_path, "beta", seed=1, beta=0.5, **real)
    make_run(tmp_path, "rounds", seed=1, rounds=6, acc=(10, 30, 20, 40, 35, 36), **real)
    make_run(tmp_path, "other-algo", algo="fedala", seed=1, **real)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(rows) == 5
    assert sorted(r["seeds"] for r in rows) == ["0,1", "1", "1", "1", "1"]
    assert {r["rounds"] for r in rows} == {"5/5", "6/6"}
    assert {r["partition"] for r in rows} == {"dir(0.1)", "dir(0.5)"}
    assert any("lr=0.01" in r["settings"] for r in rows)
    assert {r["algorithm"] for r in rows} == {"fedavg", "fedala"}


def test_unfinished_diverged_older_and_unreadable_runs_are_shown_with_their_status(tmp_path):
    make_run(tmp_path, "fedavg-synthetic-s0-ok", seed=0)
    make_run(tmp_path, "no-summary", seed=1, rounds=10, summary=False)
    make_run(tmp_path, "short", seed=2, rounds=10, summary={"rounds": 10})
    make_run(tmp_path, "all-rounds-no-summary", seed=9, summary=False)
    make_run(tmp_path, "flagged", seed=3, summary={"status": "diverged"})
    make_run(tmp_path, "nan", seed=4, acc=(10, 30, "nan", "inf", "nan"))
    make_run(tmp_path, "fedala-cifar10-s7-20240101-120000", config=False)
    old = make_run(tmp_path, "pfedla-mnist-s2-20240101-120000", algo="pfedla")
    with open(os.path.join(old, "config.json"), "w") as f:
        json.dump({"args_of_old": 1}, f)  # config without "algorithm"/"args"
    bad = make_run(tmp_path, "fedavg-synthetic-s5-badjson", seed=5)
    with open(os.path.join(bad, "config.json"), "w") as f:
        f.write("{not json")
    empty = make_run(tmp_path, "empty-csv", seed=6)
    open(os.path.join(empty, "metrics.csv"), "w").close()
    garbage = make_run(tmp_path, "garbage", seed=8)
    with open(os.path.join(garbage, "metrics.csv"), "wb") as f:
        f.write(b"\xff\xfe\x00garbage,,\n\x00\x01")
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(rows) == 11  # nothing dropped, nothing grouped
    status = {r["seeds"]: r["status"] for r in rows if r["algorithm"] == "fedavg"}
    assert status["0"] == "ok"
    assert status["1"] == "unfinished 5/10 (by its headline)"
    assert status["2"] == "unfinished 5/10 (by its headline)"
    assert status["9"] == "unfinished 5/5 (by its headline)"  # killed before summary.json was written
    assert status["3"] == "diverged" and status["4"] == "diverged"
    assert status["5"] == "unreadable config.json"
    assert status["6"] == "unreadable metrics.csv" and status["8"] == "unreadable metrics.csv"
    assert {r["settings"] for r in rows} == {"-"}  # older/unreadable configs make no setting look varied
    (nan_row,) = [r for r in rows if r["seeds"] == "4"]
    assert nan_row["best"] == "30.00" and nan_row["@round"] == "2" and nan_row["final"] == "nan"
    (older,) = [r for r in rows if r["algorithm"] == "fedala"]
    assert (older["dataset"], older["seeds"], older["status"]) == ("cifar10", "7", "older format")
    (older2,) = [r for r in rows if r["algorithm"] == "pfedla"]
    assert (older2["dataset"], older2["seeds"], older2["status"]) == ("mnist", "2", "older format")


def test_default_metric_is_each_algorithms_headline_and_loss_is_minimised(tmp_path):
    make_run(tmp_path, "avg", algo="fedavg")
    make_run(tmp_path, "acd", algo="fedacd")
    make_run(tmp_path, "acd-unfinished", algo="fedacd", seed=1, rounds=10, summary=False)
    make_run(tmp_path, "la", algo="pfedla")
    make_run(tmp_path, "pake", algo="fedpake")
    make_run(tmp_path, "named", algo="newalgo", summary={"headline_metric": "test_acc_mean",
                                                         "paper_reports": "best test_acc"})
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    metric = {(r["algorithm"], r["seeds"]): r["metric"] for r in rows}
    assert metric == {("fedavg", "0"): "test_acc", ("fedacd", "0"): "global_acc", ("fedacd", "1"): "global_acc",
                      ("pfedla", "0"): "test_acc_mean", ("fedpake", "0"): "test_acc",
                      ("newalgo", "0"): "test_acc_mean"}
    (acd,) = [r for r in rows if r["algorithm"] == "fedacd" and r["seeds"] == "0"]
    assert acd["best"] == "41.00" and acd["@round"] == "4"
    proc, rows = compare(tmp_path / "avg", "--metric", "test_loss")
    assert proc.returncode == 0, proc.stderr
    (row,) = rows
    assert (row["metric"], cell(row["best"])[0], row["@round"], cell(row["final"])[0]) == ("test_loss", 60.0, "4", 65.0)


def test_an_unfinished_run_alone_is_judged_by_its_own_headline_and_says_so(tmp_path):
    """No finished run of its algorithm beside it: config.json's headline_metric, or (runs from before it recorded
    one) the algorithm's, not test_acc."""
    make_run(tmp_path, "la-unfinished", algo="pfedla", rounds=10, summary=False)
    make_run(tmp_path, "acd-unfinished", algo="fedacd", rounds=10, summary=False)
    folder = make_run(tmp_path, "new-unfinished", algo="newalgo", rounds=10, summary=False)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "headline_metric": "test_acc_mean"}, f)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {r["algorithm"]: (r["metric"], r["best"], r["status"]) for r in rows} == {
        "pfedla": ("test_acc_mean", "20.00", "unfinished 5/10 (by its headline)"),
        "fedacd": ("global_acc", "41.00", "unfinished 5/10 (by its headline)"),
        "newalgo": ("test_acc_mean", "20.00", "unfinished 5/10 (by its headline)")}
    proc, rows = compare(tmp_path, "--metric", "test_acc")
    assert {r["status"] for r in rows} == {"unfinished 5/10"}


def test_the_headline_of_each_algorithm_is_its_script_s():
    import fedacd, fedavg, fedpake, pfedla  # noqa: E401  tools/compare.py itself imports no script (no torch)
    fedala = __import__("fedala")
    scripts = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "heurpfedla": pfedla, "fedpake": fedpake,
               "fedacd": fedacd, "fedacd-fedavg": fedacd}
    assert {a: compare_module().HEADLINE_METRICS[a] for a in scripts} == \
        {a: m.HEADLINE_METRIC for a, m in scripts.items()}
    assert compare_module().HEADLINE_METRICS["local"] == "test_acc_mean"  # tools/fedavg_variants.py --local-training


def compare_module():
    from tools import compare as module
    return module


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_bad_input_gives_one_line_and_exit_2(tmp_path):
    assert_one_line_error(compare(tmp_path / "missing")[0], "no such path")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(compare(tmp_path / "empty")[0], "no run folder")
    make_run(tmp_path / "runs", "a")
    proc, _ = compare(tmp_path / "runs", "--metric", "accuracy")
    assert_one_line_error(proc, "accuracy", "test_acc", "test_loss", "global_acc")
    assert "host_mb" not in proc.stderr
    unusable = tmp_path / "unusable" / "run"
    unusable.mkdir(parents=True)
    (unusable / "config.json").write_text("[1, 2")
    assert_one_line_error(compare(unusable.parent)[0], "no readable metrics.csv")
    assert_one_line_error(compare()[0])
    assert_one_line_error(compare(tmp_path / "runs", "--bogus")[0])
    assert_one_line_error(compare(tmp_path / "runs", "--plot", tmp_path / "no" / "dir" / "x.png")[0], "does not exist")
    for plot in ("", "curves", "curves.txt", str(tmp_path / "runs")):  # no image file name: nothing is drawn
        proc, _ = compare(tmp_path / "runs", "--plot", plot)
        assert_one_line_error(proc, "--plot needs a file name ending in .png")
        assert proc.stdout == ""


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_plot_of_groups_and_missing_matplotlib(tmp_path):
    for seed in range(2):
        make_run(tmp_path / "runs", f"s{seed}", seed=seed, acc=(10 + seed, 20, 30 - seed, 40, 50))
    make_run(tmp_path / "runs", "unfinished", seed=5, rounds=10, summary=False)
    png = tmp_path / "curves.png"
    proc, rows = compare(tmp_path / "runs", "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert len(rows) == 2 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # matplotlib that cannot be imported: one line naming the fix, exit 2, no table
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    proc = run_script("tools/compare.py", tmp_path / "runs", "--plot", tmp_path / "y.png",
                      env={"PYTHONPATH": str(shim.parent)})
    assert_one_line_error(proc, "pip install matplotlib")
    assert not (tmp_path / "y.png").exists()


# ----------------------------------------------------------------------------- damaged run folders

def compare_within(seconds, *args, prefix=()):
    """compare() that fails the test (subprocess.TimeoutExpired) if tools/compare.py takes more than
    ``seconds`` (a named pipe must not make it wait); ``prefix`` runs it under another command."""
    proc = subprocess.run([*prefix, sys.executable, os.path.join(ROOT, "tools", "compare.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=seconds)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("---")]
    header = re.split(r"\s{2,}", lines[0].strip()) if lines else []
    return proc, [dict(zip(header, re.split(r"\s{2,}", ln.strip()))) for ln in lines[1:]]


def rewrite_metrics(folder, edit):
    """metrics.csv of ``folder`` with its text replaced by ``edit(text)``."""
    path = os.path.join(folder, "metrics.csv")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(edit(text))


def replace_with(folder, name, kind):
    """Put a folder or a named pipe in the place of the run folder's file ``name``."""
    path = os.path.join(folder, name)
    if os.path.exists(path):
        os.remove(path)
    os.mkdir(path) if kind == "folder" else os.mkfifo(path)


def test_damaged_runs_are_listed_with_what_is_damaged_and_no_number_from_it(tmp_path):
    make_run(tmp_path, "fedavg-synthetic-s0-ok", seed=0)
    last_line = "5,35.0,17.5,36.0,65.0,2.5,0.5,7.5,2.5,700\n"  # make_run's round 5
    rewrite_metrics(make_run(tmp_path, "cut", seed=1), lambda t: t.replace(last_line, "5,35.0,17.5,"))
    rewrite_metrics(make_run(tmp_path, "cut-cell", seed=2), lambda t: t.replace(last_line, last_line[:-4] + "7e"))
    rewrite_metrics(make_run(tmp_path, "inf-round", seed=3), lambda t: t.replace("\n3,", "\ninf,"))
    rewrite_metrics(make_run(tmp_path, "bad-rounds", seed=4),
                    lambda t: t.replace("\n2,", "\nnan,").replace("\n4,", "\n4.5,"))
    rewrite_metrics(make_run(tmp_path, "bad-cell", seed=5), lambda t: t.replace("\n2,30.0,", "\n2,abc,"))
    rewrite_metrics(make_run(tmp_path, "short-line", seed=6),
                    lambda t: t.replace("\n2,30.0,15.0,31.0,70.0,1.0,0.5,3.0,1.0,700\n", "\n2,30.0\n"))
    replace_with(make_run(tmp_path, "csv-folder", seed=7), "metrics.csv", "folder")
    both = make_run(tmp_path, "fedavg-synthetic-s8-both-folders")  # was left out of the table without a word
    replace_with(both, "metrics.csv", "folder")
    replace_with(both, "config.json", "folder")
    replace_with(make_run(tmp_path, "fedavg-synthetic-s9-config-pipe"), "config.json", "pipe")
    replace_with(make_run(tmp_path, "csv-pipe", seed=10), "metrics.csv", "pipe")
    replace_with(make_run(tmp_path, "summary-pipe", seed=11), "summary.json", "pipe")
    proc, rows = compare_within(30, tmp_path)  # tools/compare.py opens no named pipe: it would wait forever
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert len(rows) == 12  # nothing left out, nothing grouped
    status = {r["seeds"]: r["status"] for r in rows}
    assert status["0"] == "ok"
    assert status["1"] == "damaged: metrics.csv line 6 cut off, unfinished 4/5 (by its headline)"
    assert status["2"] == "damaged: metrics.csv line 6 cut off, unfinished 4/5 (by its headline)"
    assert status["3"] == "damaged: metrics.csv line 4 has round 'inf', not a whole number"
    assert status["4"] == "damaged: metrics.csv line 3 has round 'nan', not a whole number (and 1 more bad lines)"
    assert status["5"] == "damaged: metrics.csv line 3 has test_acc 'abc', not a number"
    assert status["6"] == "damaged: metrics.csv line 3 has 2 cells, the header 10"
    assert status["7"] == "damaged: metrics.csv is a folder"
    assert status["8"] == "damaged: config.json is a folder; metrics.csv is a folder"
    assert status["9"] == "damaged: config.json is a named pipe"
    assert status["10"] == "damaged: metrics.csv is a named pipe"
    assert status["11"].startswith("damaged: summary.json is a named pipe")
    row = {r["seeds"]: r for r in rows}
    for cut in ("1", "2"):  # every number from round 4, the last whole line
        assert (row[cut]["rounds"], row[cut]["final"], row[cut]["MB"], row[cut]["s/round"]) == \
            ("4/5", "40.00", "8.0", "0.500")
    assert (row["3"]["best"], row["3"]["@round"], row["3"]["final"]) == ("40.00", "4", "35.00")  # round 3 left out
    assert row["5"]["best"] == "40.00" and row["7"]["best"] == row["8"]["best"] == "-"
    assert row["9"]["best"] == "40.00" and row["9"]["algorithm"] == "fedavg"  # metrics.csv itself is fine


def test_symlinked_run_folders_are_followed_once(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    make_run(elsewhere, "fedavg-synthetic-s0-1", seed=0)
    runs = tmp_path / "runs"
    runs.mkdir()
    os.symlink(elsewhere / "fedavg-synthetic-s0-1", runs / "linked")
    os.symlink(runs, runs / "loop")  # a link back up: walked once, no endless walk
    proc, rows = compare(str(runs))
    assert proc.returncode == 0 and len(rows) == 1 and rows[0]["seeds"] == "0", proc.stdout + proc.stderr


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_a_closed_pipe_ends_quietly(tmp_path):
    for seed in range(600):  # more than a pipe's buffer (64 KB) of table: the write after head exits fails
        make_run(tmp_path, f"fedavg-synthetic-s{seed}-1", seed=seed, lr=0.001 * (seed + 1))
    proc = subprocess.run(f"{shlex.quote(sys.executable)} tools/compare.py {shlex.quote(str(tmp_path))} | head -1",
                          shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stderr == "" and len(proc.stdout.splitlines()) == 1, proc.stderr


def test_a_newline_in_a_path_keeps_the_error_on_one_line(tmp_path):
    proc, _ = compare(str(tmp_path / "no\nsuch"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no\\nsuch" in proc.stderr, proc.stderr


def test_paths_that_are_files_and_folders_with_only_damaged_runs(tmp_path):
    run = make_run(tmp_path / "runs", "a")
    assert_one_line_error(compare_within(30, os.path.join(run, "metrics.csv"))[0], "not a folder")
    cut = make_run(tmp_path / "cut", "fedavg-synthetic-s0")
    rewrite_metrics(cut, lambda t: t.split("\n")[0] + "\n1,10.0,5.0")  # its only round cut off
    replace_with(make_run(tmp_path / "cut", "fedavg-synthetic-s1"), "metrics.csv", "pipe")
    proc, _ = compare_within(30, tmp_path / "cut")  # nothing readable: bad input, naming the damage
    assert_one_line_error(proc, "no readable metrics.csv", "2 damaged", "metrics.csv line 2 cut off")


def without_root_reading_everything():
    """A command prefix under which tools/compare.py cannot read files that forbid it: none for a user,
    for root setpriv without the capabilities to read any file (skips if that is not possible)."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, who reads every file, and setpriv cannot drop that")
    return prefix


def test_unreadable_files_and_folders_are_listed_as_damaged(tmp_path):
    prefix = without_root_reading_everything()
    make_run(tmp_path, "fedavg-synthetic-s0-ok", seed=0)
    config = os.path.join(make_run(tmp_path, "no-config", seed=1), "config.json")
    locked = make_run(tmp_path, "fedavg-synthetic-s2-locked-folder")
    os.chmod(config, 0)
    os.chmod(locked, 0)
    try:
        proc, rows = compare_within(30, tmp_path, prefix=prefix)
    finally:
        os.chmod(config, 0o644)
        os.chmod(locked, 0o755)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    status = {r["seeds"]: r["status"] for r in rows}
    assert status == {"0": "ok", "?": "damaged: config.json cannot be read (permission denied)",
                      "2": "damaged: the folder cannot be read (permission denied)"}
    (no_config,) = [r for r in rows if r["seeds"] == "?"]
    assert no_config["best"] == "40.00"  # metrics.csv could be read


# ----------------------------------------------------------------------------- issue 37: paths, metric, labels, seeds

def test_a_folder_given_twice_or_with_one_of_its_runs_counts_each_run_once(tmp_path):
    runs = tmp_path / "runs"
    first = make_run(runs, "fedavg-synthetic-s0", seed=0)
    make_run(runs, "fedavg-synthetic-s1", seed=1, acc=(12, 25, 45, 41, 44))
    for paths in ([runs, runs], [runs, first], [first, runs], [first, first, runs / ".." / "runs"]):
        proc, rows = compare(*paths)
        assert proc.returncode == 0, proc.stderr
        (row,) = rows
        assert row["seeds"] == "0,1" and cell(row["best"]) == pytest.approx(mean_std([40, 45]), abs=0.006)


def test_an_empty_metric_is_refused(tmp_path):
    make_run(tmp_path / "runs", "a")
    for metric in ("", " "):
        proc, _ = compare(tmp_path / "runs", "--metric", metric)
        assert_one_line_error(proc, f"unknown metric {metric!r}", "test_acc")
        assert proc.stdout == ""


def test_synthetic_runs_are_labelled_by_what_applies(tmp_path):
    """Synthetic data is generated per client: no partition, and partition flags that differ change
    nothing, so those runs are one setting; a partitioned dataset keeps dir(beta) and beta as a setting."""
    import common
    assert compare_tool.PARTITION_FLAGS == common.PARTITION_FLAGS
    make_run(tmp_path, "syn-s0", seed=0, dataset="synthetic(0.5,0.5)")
    make_run(tmp_path, "syn-s1", seed=1, dataset="synthetic(0.5,0.5)", beta=0.5, partition="pat")
    make_run(tmp_path, "cifar-s0", seed=0, dataset="cifar10")
    make_run(tmp_path, "cifar-s1", seed=1, dataset="cifar10", beta=0.5)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    by = {(r["dataset"], r["seeds"]): r for r in rows}
    assert set(by) == {("synthetic(0.5,0.5)", "0,1"), ("cifar10", "0"), ("cifar10", "1")}
    assert by[("synthetic(0.5,0.5)", "0,1")]["partition"] == "generated"
    assert by[("synthetic(0.5,0.5)", "0,1")]["settings"] == "-"
    assert (by[("cifar10", "0")]["partition"], by[("cifar10", "1")]["partition"]) == ("dir(0.1)", "dir(0.5)")
    assert by[("cifar10", "1")]["settings"] == "beta=0.5"


def test_a_run_that_recorded_a_removed_flag_at_its_kept_value_groups_with_runs_made_since(tmp_path):
    """Runs made while --clients-together existed record clients_together: false; runs made since record no such
    flag: one setting. A run recorded with it on stays a setting of its own."""
    from tools import run_records
    assert compare_tool.REMOVED_FLAGS == {k: value for k, (value, _) in run_records.REMOVED_FLAGS.items()}
    make_run(tmp_path, "fedavg-synthetic-s0", seed=0, clients_together=False)
    make_run(tmp_path, "fedavg-synthetic-s1", seed=1)
    make_run(tmp_path, "fedavg-synthetic-s2", seed=2, clients_together=True)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["seeds"] for r in rows) == ["0,1", "2"]


def test_two_runs_of_one_seed_are_not_averaged_as_two_seeds(tmp_path):
    """The group counts each seed once, with the later run (folder names end in their start time); the
    earlier run of that seed is listed on its own row, flagged."""
    make_run(tmp_path, "fedavg-synthetic-s0-20260101-100000", seed=0, acc=(1, 2, 3, 4, 10))
    make_run(tmp_path, "fedavg-synthetic-s0-20260102-100000", seed=0, acc=(1, 2, 3, 4, 20))
    make_run(tmp_path, "fedavg-synthetic-s1-20260101-110000", seed=1, acc=(1, 2, 3, 4, 30))
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (group,) = [r for r in rows if r["status"] == "ok"]
    assert group["seeds"] == "0,1" and cell(group["final"]) == pytest.approx(mean_std([20, 30]), abs=0.006)
    (repeat,) = [r for r in rows if r["status"] != "ok"]
    assert repeat["status"] == "repeat of seed 0, not averaged" and repeat["final"] == "10.00"


def test_headline_is_never_a_bookkeeping_column(tmp_path):
    """FedACD's paper_reports says "... best or final round": a run without global_acc is judged by
    test_acc, not by the column round."""
    make_run(tmp_path, "acd", algo="fedacd", summary={
        "paper_reports": "global_acc: global model on the uniform test set (the paper does not say best or final round)"})
    with open(tmp_path / "acd" / "metrics.csv") as f:
        text = f.read()
    with open(tmp_path / "acd" / "metrics.csv", "w") as f:  # no global_acc column
        f.write("\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != 3) for line in text.splitlines()))
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0 and rows[0]["metric"] == "test_acc", proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- issue 37: results that contradict themselves

def write_summary(folder, **fields):
    path = os.path.join(folder, "summary.json")
    with open(path) as f:
        summary = json.load(f)
    with open(path, "w") as f:
        json.dump({**summary, **fields}, f)


def test_summary_numbers_are_run_folders():
    import run_folder
    for values in ([3.0, 1.0, 2.0], [float(v) for v in range(25)], [5.0, float("nan"), 1.0]):
        ours, theirs = compare_tool.summary_numbers(values, "test_acc"), run_folder.summarise(values)
        assert all(compare_tool.same_number(ours[k], theirs[k]) for k in theirs), (ours, theirs)
    assert compare_tool.summary_numbers([0.3, 0.1, 0.2], "local_risk")["best"] == 0.1  # fedacd.py: lower is better


def test_results_that_contradict_themselves_are_damaged(tmp_path):
    acc = (10, 30, 20, 40, 35)
    finished = {"status": "finished", "rounds_done": 5,
                "test_acc": {"best": 40.0, "final": 35.0, "last10_mean": 27.0}}
    make_run(tmp_path, "ok", seed=0, summary=finished)
    rewrite_metrics(make_run(tmp_path, "last-row-lost", seed=1, summary=finished),
                    lambda t: "".join(t.splitlines(keepends=True)[:-1]))
    make_run(tmp_path, "summary-edited", seed=2, summary={**finished, "test_acc": {**finished["test_acc"], "best": 41.0}})
    rewrite_metrics(make_run(tmp_path, "duplicated", seed=3, summary=finished),
                    lambda t: t.replace("\n3,", "\n2,", 1))
    rewrite_metrics(make_run(tmp_path, "reversed", seed=4, summary=finished),
                    lambda t: t.replace("\n3,", "\nX,").replace("\n4,", "\n3,").replace("\nX,", "\n4,"))
    rewrite_metrics(make_run(tmp_path, "inf-seconds", seed=5), lambda t: t.replace("\n3,20.0,10.0,21.0,80.0,1.5,", "\n3,20.0,10.0,21.0,80.0,inf,"))
    make_run(tmp_path, "past-plan", seed=6, rounds=4)
    make_run(tmp_path, "other-algorithm", seed=7, summary={**finished, "algorithm": "fedala"})
    # a finished 3-round run extended by --resume --rounds 5, stopped at round 4: its summary.json is the 3-round one
    make_run(tmp_path, "extended", seed=8, acc=acc[:4], summary={"status": "finished", "rounds": 3, "rounds_done": 3,
                                                                "test_acc": {"best": 30.0, "final": 20.0,
                                                                             "last10_mean": 20.0}})
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    status = {r["seeds"]: r["status"] for r in rows}
    assert status["0"] == "ok"
    assert status["1"] == "damaged: metrics.csv ends at round 4, summary.json says 5 were done, unfinished 4/5 (by its headline)"
    assert status["2"] == "damaged: summary.json has test_acc best 41.0, metrics.csv 40"
    assert status["3"] == "damaged: metrics.csv line 4 repeats round 2"
    assert status["4"] == "damaged: metrics.csv line 5 has round 3 after round 4"
    assert status["5"] == "damaged: metrics.csv line 4 has seconds 'inf', not a finite number"
    assert status["6"] == "damaged: metrics.csv has round 5, config.json plans 4 rounds"
    assert status["7"] == "damaged: summary.json is of fedala, config.json of fedavg"
    assert status["8"] == "unfinished 4/5 (by its headline)"


# ----------------------------------------------------------------------------- what is read is checked

def edit_config(folder, **fields):
    """config.json of ``folder`` with ``fields`` set (top level)."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, **fields}, f)


def test_a_metrics_line_over_csvs_field_limit_spoils_that_line_only(tmp_path):
    make_run(tmp_path, "fedavg-synthetic-s0-ok", seed=0)
    rewrite_metrics(make_run(tmp_path, "long", seed=1), lambda t: t.replace("\n2,30.0,", "\n2," + "7" * 200000 + ","))
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    row = {r["seeds"]: r for r in rows}
    assert row["1"]["status"] == \
        "damaged: metrics.csv line 3 cannot be read as csv (field larger than field limit (131072))"
    assert (row["1"]["rounds"], row["1"]["best"], row["1"]["@round"], row["1"]["final"]) == \
        ("5/5", "40.00", "4", "35.00")  # the other rows' numbers are kept


def test_a_metrics_line_that_is_not_utf8_spoils_that_line_only(tmp_path):
    folder = make_run(tmp_path, "bytes", seed=1)
    path = os.path.join(folder, "metrics.csv")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data.replace(b"\n2,30.0,", b"\n2,\xff\xfe30.0,"))
    run = compare_tool.load_run(folder)
    assert run["flags"][0] == "damaged: metrics.csv line 3 is not UTF-8 text"
    assert [r for r, _ in run["metrics"]["test_acc"]] == [1, 3, 4, 5]


@pytest.mark.parametrize("content, words", [
    (b"\x00\x9f\x92\x96garbage\xff", "damaged: summary.json is not a JSON object (cut short or garbage)"),
    (b"[1, 2]", "damaged: summary.json is not a JSON object (cut short or garbage)"),
    (b'{"status": "finished", "rounds_done": "5"}', "damaged: summary.json has rounds_done '5', not a whole number"),
    (b'{"status": 3}', "damaged: summary.json has status '3'"),
    (b'{"test_acc": {"best": "40", "final": 35, "last10_mean": 28}}',
     "damaged: summary.json has test_acc values that are not"),
])
def test_a_summary_json_that_is_no_runs_summary_is_damaged(tmp_path, content, words):
    make_run(tmp_path, "fedavg-synthetic-s0-ok", seed=0)
    with open(os.path.join(make_run(tmp_path, "garbage", seed=1), "summary.json"), "wb") as f:
        f.write(content)
    proc, rows = compare(tmp_path)
    status = {r["seeds"]: r["status"] for r in rows}
    assert len(rows) == 2 and status["0"] == "ok" and status["1"].startswith(words), status


def test_a_value_with_a_newline_cannot_add_a_row(tmp_path):
    make_run(tmp_path, "a", seed=0, lr="0.1\nfedavg  forged  dir(0.1)  20  9  5/5  test_acc  99.00")
    make_run(tmp_path, "b", seed=1)
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0 and len(proc.stdout.strip().splitlines()) == 2 + 2, proc.stdout
    assert not any(r["dataset"] == "forged" for r in rows)
    assert any("lr=0.1\\nfedavg" in r["settings"] for r in rows)


FOLDER = "/data/pfllib/FashionMNIST-dir"


def test_seeds_on_a_folder_are_grouped_only_when_their_data_fingerprints_agree(tmp_path):
    for seed, fingerprint in ((0, "a" * 64), (1, "a" * 64), (2, "b" * 64)):
        edit_config(make_run(tmp_path, f"r{seed}", seed=seed, dataset=FOLDER), data_sha256=fingerprint)
    for seed, fingerprint in ((0, "c" * 64), (1, "d" * 64)):  # a named dataset: each seed partitions it anew
        edit_config(make_run(tmp_path, f"m{seed}", seed=seed, dataset="mnist"), data_sha256=fingerprint)
    proc, rows = compare(tmp_path)
    seeds = sorted((r["dataset"], r["seeds"], r["settings"]) for r in rows)
    assert seeds == [("FashionMNIST-dir", "0,1", "data=aaaaaaaaaaaa"), ("FashionMNIST-dir", "2", "data=bbbbbbbbbbbb"),
                     ("mnist", "0,1", "-")], seeds


def test_the_partition_column_of_a_folder_run_is_the_folders(tmp_path):
    edit_config(make_run(tmp_path, "pat", dataset=FOLDER.replace("dir", "pat")),
                dataset_folder={"partition": "pat", "alpha": 0.1, "num_clients": 20})
    edit_config(make_run(tmp_path, "dir", dataset=FOLDER), dataset_folder={"partition": "dir", "alpha": 0.3})
    make_run(tmp_path, "old", dataset="/elsewhere/FashionMNIST-x", beta=0.5)  # made before the record
    make_run(tmp_path, "named", dataset="mnist", beta=0.5)
    proc, rows = compare(tmp_path)
    partition = {r["dataset"]: (r["partition"], r["settings"]) for r in rows}
    assert partition == {"FashionMNIST-pat": ("folder pat", "-"), "FashionMNIST-dir": ("folder dir(0.3)", "-"),
                         "FashionMNIST-x": ("folder", "-"), "mnist": ("dir(0.5)", "-")}, partition


def test_compares_dataset_names_are_the_loaders():
    import datasets
    assert set(compare_tool.NAMED_DATASETS) == set(datasets.VISION) | set(datasets.LOADERS)
    assert set(compare_tool.FOLDER_RESPLIT_FLAGS) == set(datasets.PFLLIB_RESPLIT_FLAGS)


@pytest.mark.parametrize("change, words", [
    ({"rounds": "5"}, "damaged: config.json has args.rounds '5', not an integer >= 1"),
    ({"seed": -1}, "damaged: config.json has args.seed '-1', not an integer >= 0"),
    ({"num_clients": 1e999}, "damaged: config.json has args.num_clients 'inf', not an integer >= 1"),
    ({"dataset": ["mnist"]}, "damaged: config.json has args.dataset"),
])
def test_a_config_json_the_scripts_never_write_is_damaged(tmp_path, change, words):
    folder = make_run(tmp_path, "edited", seed=1)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["args"].update(change)
    with open(path, "w") as f:
        json.dump(config, f)
    run = compare_tool.load_run(folder)
    assert run["flags"][0].startswith(words), run["flags"]


def test_no_more_of_a_run_file_is_read_than_its_bound(tmp_path, monkeypatch):
    folder = make_run(tmp_path, "big", seed=1)
    monkeypatch.setattr(compare_tool, "MAX_RUN_FILE_BYTES", 200)
    assert compare_tool.read_text(os.path.join(folder, "config.json"))[0] is None  # about 400 bytes
    run = compare_tool.load_run(folder)
    assert any(d.startswith("metrics.csv is 0 MB, more than the 0 MB") for d in run["damage"]), run["damage"]


# ------------------------------------------------------------------------- issue 89: the latest run by when it started

def test_the_latest_run_of_a_seed_is_the_one_that_started_last_whatever_its_name(tmp_path):
    """The clock went back an hour between two runs of seed 0 (summer time ended): the newer run's folder name,
    in local time, sorts before the older one's. The group takes the newer, by the UTC start its config.json
    recorded, and the older one (on data since replaced) is the repeat."""
    older = make_run(tmp_path, "fedavg-synthetic-s0-20261025-023000", seed=0, acc=(1, 2, 3, 4, 37.5))
    newer = make_run(tmp_path, "fedavg-synthetic-s0-20261025-020000", seed=0, acc=(1, 2, 3, 4, 90.0))
    edit_config(older, started_utc="2026-10-25T00:30:00Z")  # 02:30 summer time (UTC+2)
    edit_config(newer, started_utc="2026-10-25T01:00:00Z")  # 02:00 winter time (UTC+1): half an hour later
    proc, rows = compare(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (group,) = [r for r in rows if r["status"] == "ok"]
    assert group["seeds"] == "0" and group["final"] == "90.00", rows
    (repeat,) = [r for r in rows if r["status"] != "ok"]
    assert repeat["status"] == "repeat of seed 0, not averaged" and repeat["final"] == "37.50"


def test_runs_that_recorded_no_start_are_placed_by_their_folder_names_local_time(tmp_path, monkeypatch):
    """Runs made before config.json recorded started_utc go by the local time their folder name ends in (read in
    this machine's zone, here Central European with its summer time), among those that recorded it; a start
    that is no time is no start; ties and runs that say neither go by folder name, the latter first."""
    monkeypatch.setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")  # a POSIX rule: no zone database needed
    time.tzset()
    try:
        runs = {  # folder name: started_utc (None: not recorded)
            "fedavg-synthetic-s0-20261025-013000": None,  # 01:30 summer time: 2026-10-24T23:30Z
            "fedavg-synthetic-s0-20261025-020000": "2026-10-25T00:00:00Z",
            "fedavg-synthetic-s0-20261025-030000": None,  # 03:00 winter time: 02:00Z
            "fedavg-synthetic-s0-20261025-030000-1": "2026-10-25T02:00:00Z",  # the same second: by name
            "fedavg-synthetic-s0-20261025-040000": "not a time",  # 04:00 winter time by its name: 03:00Z
            "copied-by-hand": None,
        }
        keys = {}
        for name, started in runs.items():
            config = {"algorithm": "fedavg", "args": {}}
            if started is not None:
                config["started_utc"] = started
            keys[name] = compare_tool.start_order(str(tmp_path / name), config)
        assert sorted(runs, key=keys.get) == ["copied-by-hand", *[n for n in runs if n != "copied-by-hand"]]
        assert keys["fedavg-synthetic-s0-20261025-030000"][:2] == keys["fedavg-synthetic-s0-20261025-030000-1"][:2]
    finally:
        monkeypatch.undo()
        time.tzset()


# --------------------------------------------------------------------------- issue 89: a stdout that cannot be written

@pytest.mark.parametrize("redirect, why", [("> /dev/full", "No space left on device"), (">&-", "it is closed")])
def test_a_table_that_cannot_be_printed_ends_in_one_line_naming_standard_output(tmp_path, redirect, why):
    make_run(tmp_path / "runs", "a", seed=0)
    command = f"{shlex.quote(sys.executable)} tools/compare.py {shlex.quote(str(tmp_path / 'runs'))}"
    proc = subprocess.run(f"{command} {redirect}", shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr == f"error: cannot write to standard output ({why})\n", proc.stderr
    png = tmp_path / "x.png"
    silent = subprocess.run(f"{command} --plot {png} {redirect} 2>&-", shell=True, cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # stderr closed too: nothing to say it on, status 1 all the same
    assert (silent.returncode, silent.stdout, silent.stderr) == (1, "", "")
    assert not png.exists() and os.listdir(tmp_path) == ["runs"]
