"""tools/reproduce.py: a tiny table run end to end (its report's numbers are the runs' own metrics), a table
stopped in the middle that continues without re-running finished runs and ends with the same report,
a failing run, Ctrl-C, --dry-run of every paper table, --list, the generated section of
docs/results.md, and bad input. The tiny tables run fedavg.py and fedala.py on synthetic data with 4
clients for 2 rounds (each run is a subprocess: about 3 s of start-up)."""
import argparse
import copy
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tools import compare, paper_tables, reproduce
from conftest import ROOT, metrics_rows, sighup_as_in_a_terminal

SEEDS = ["0", "1"]
# --checkpoint-every 1 lets a run stopped after round 1 continue (it does not change results); --rounds 9 is
# overridden by the table's rounds, which come later on the command line
COMMON = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "9", "--checkpoint-every", "1"]


def tiny_tables(fedala_flags=(), fedavg_flags=(), rounds=2, extra_methods=()):
    """One table 'tiny': one cell, FedAvg (the table's metric: last10 test_acc) and FedALA (its own
    metric: best test_acc_mean)."""
    return {"tiny": {
        "title": "Tiny: FedAvg and FedALA on synthetic data", "source": "synthetic",
        "metric": {"summary": "last10", "column": "test_acc", "protocol": "pooled over clients, last 10 rounds"},
        "rounds": rounds, "common": list(COMMON),
        "cells": [{"name": "syn-4", "flags": [], "methods": [
            {"method": "FedAvg", "script": "fedavg.py", "flags": list(fedavg_flags), "paper": 50.0,
             "paper_std": 1.5},
            {"method": "FedALA", "script": "fedala.py", "flags": list(fedala_flags), "paper": None,
             "metric": {"summary": "best", "column": "test_acc_mean", "protocol": "client mean, best"}},
            *extra_methods]}]}}


def call(argv, tables=None):
    """reproduce.main in this process; the exit status (bad input exits with SystemExit)."""
    try:
        return reproduce.main([*map(str, argv)], tables)
    except SystemExit as e:
        return e.code


def table_rows(text):
    """The report's markdown table as {method: [cells...]} (cell, method, paper, ours, n, ours vs paper,
    apart, rounds, s/round, hardware, notes), without the column at the table's length where a report has it
    (a seed ran past the others: tests/test_report_lengths.py)."""
    long_column = any(line.startswith("| cell ") and "| ours at " in line for line in text.splitlines())
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| cell ")]
    return {r[1]: r[:6] + r[7:] if long_column else r for r in rows}


def test_apart_is_two_pooled_standard_deviations_by_hand():
    # a = 1, 2, 3 and b = 4, 5, 6: both sample variances 1, pooled sd 1, means 3 apart: more than 2
    assert reproduce.pooled_sd([1, 2, 3], [4, 5, 6]) == pytest.approx(1.0)
    assert reproduce.apart([1, 2, 3], [("B", [4, 5, 6])]) == "below B"
    assert reproduce.apart([4, 5, 6], [("A", [1, 2, 3])]) == "above A"
    # 3, 4, 5 is 1 from either mean: not apart
    assert reproduce.apart([3, 4, 5], [("A", [1, 2, 3]), ("B", [4, 5, 6])]) == "-"
    # unequal spreads pool by their degrees of freedom: (2 * 1 + 1 * 0) / 3 = 2/3
    assert reproduce.pooled_sd([1, 2, 3], [10, 10]) == pytest.approx((2 / 3) ** 0.5)
    # one seed has no spread: never called apart, either way
    assert reproduce.apart([1, 2, 3], [("C", [100.0])]) == "-" and reproduce.apart([100.0], [("A", [1, 2, 3])]) == "-"
    assert reproduce.apart([10, 10.1, 10.2], [("A", [1, 2, 3]), ("B", [20, 21, 22])]) == "above A; below B"


def jobs_of(tables, out, seeds=(0, 1)):
    args = argparse.Namespace(rounds=None, only=None, seeds=list(seeds), out=str(out))
    return reproduce.table_jobs("tiny", tables["tiny"], args)


def summary_of(job):
    (folder,) = reproduce.run_folders(job["dir"])
    with open(os.path.join(folder, "summary.json")) as f:
        return folder, json.load(f)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The tiny table run uninterrupted: (out folder, exit status, its report OUT/tiny.md, the tables)."""
    out = tmp_path_factory.mktemp("reproduce") / "out"
    tables = tiny_tables()
    code = call(["tiny", "--seeds", *SEEDS, "--out", out, "--workers", 2], tables)
    with open(out / "tiny.md") as f:
        report = f.read()
    return out, code, report, tables


# ----------------------------------------------------------------------------------------- runs

@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_tiny_table_end_to_end(finished):
    out, code, report, tables = finished
    assert code == 0
    rows = table_rows(report)
    assert set(rows) == {"FedAvg", "FedALA"}
    assert "Tiny: FedAvg and FedALA" in report and "--seeds 0 1" in report and "last 10" in report
    assert rows["FedAvg"][2] == "50.00 ± 1.50" and rows["FedALA"][2] == "-"
    key = {"FedAvg": ("test_acc", "last10_mean"), "FedALA": ("test_acc_mean", "best")}
    for job in jobs_of(tables, out):
        folder, summary = summary_of(job)
        assert summary["status"] == "finished"
        assert os.path.isfile(os.path.join(job["dir"], "run.log"))
    for method, (column, field) in key.items():
        values = [summary_of(j)[1][column][field] for j in jobs_of(tables, out) if j["method"] == method]
        assert rows[method][3] == compare.fmt(values, 2)  # mean ± std (n-1), as the runs' summary.json has it
        assert rows[method][4] == "2" and rows[method][7] == "2/2"
    assert rows["FedAvg"][10] == "-" and rows["FedALA"][10] == "metric: best test_acc_mean"
    avg = [summary_of(j)[1]["test_acc"]["last10_mean"] for j in jobs_of(tables, out) if j["method"] == "FedAvg"]
    assert rows["FedAvg"][5] == f"{sum(avg) / 2 - 50:+.2f}"  # ours vs paper: the difference
    assert os.path.isfile(out / "tiny-syn-4.png")
    # exactly the runs' own numbers: summary.json's for the finished runs, metrics.csv's for mb_total
    collected = reproduce.collect(jobs_of(tables, out))
    assert list(collected) == [("syn-4", "fedavg"), ("syn-4", "fedala")]  # (cell, method folder)
    for row in collected.values():
        column, field = key[row["jobs"][0]["method"]]
        for seed in row["seeds"]:
            summary = summary_of(next(j for j in row["jobs"] if j["seed"] == seed["seed"]))[1]
            assert seed["value"] == summary[column][field]
            assert seed["done"] == 2 and seed["state"] == "finished"
            last = metrics_rows(seed["folder"])[-1]
            assert reproduce.summarise(seed["run"], {"summary": "final", "column": "mb_total"}) == \
                float(last["mb_down"]) + float(last["mb_up"])
    # run again: every run is done already, nothing is re-run, and the report is the same
    mtimes = {f: os.stat(os.path.join(f, "metrics.csv")).st_mtime_ns
              for j in jobs_of(tables, out) for f in reproduce.run_folders(j["dir"])}
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--workers", 2], tables) == 0
    assert {f: os.stat(os.path.join(f, "metrics.csv")).st_mtime_ns for f in mtimes} == mtimes
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tables) == 0
    with open(out / "tiny.md") as f:
        again = table_rows(f.read())
    assert {m: r[:8] for m, r in again.items()} == {m: r[:8] for m, r in rows.items()}


@pytest.mark.slow  # end to end, tens of seconds: runs in CI with the full suite
def test_stopped_table_continues_where_it_was(tmp_path, finished):
    """FedALA stops after round 1 as if killed (--stop-after); the same command without it resumes
    FedALA, skips the finished FedAvg runs, and the report equals the uninterrupted table's."""
    out = tmp_path / "out"
    argv = ["tiny", "--seeds", *SEEDS, "--out", out, "--workers", 2]
    stopped = tiny_tables(fedala_flags=["--stop-after", "1"])
    assert call(argv, stopped) == 1  # two runs did not finish
    with open(out / "tiny.md") as f:
        partial = table_rows(f.read())
    assert partial["FedALA"][7] == "1/2" and "unfinished" in partial["FedALA"][10]
    assert partial["FedAvg"][7] == "2/2"
    tables = tiny_tables()
    avg = [j for j in jobs_of(tables, out) if j["method"] == "FedAvg"]
    mtimes = {j["dir"]: os.stat(os.path.join(summary_of(j)[0], "metrics.csv")).st_mtime_ns for j in avg}
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--dry-run"], tables) == 0
    assert call(argv, tables) == 0
    assert {j["dir"]: os.stat(os.path.join(summary_of(j)[0], "metrics.csv")).st_mtime_ns for j in avg} == mtimes
    for job in jobs_of(tables, out):
        assert len(reproduce.run_folders(job["dir"])) == 1  # resumed in place, not started again
        with open(os.path.join(job["dir"], "run.log")) as f:
            starts = f.read().count("== ")
        assert starts == (2 if job["method"] == "FedALA" else 1)
    with open(out / "tiny.md") as f:
        resumed = table_rows(f.read())
    uninterrupted = table_rows(finished[2])
    assert {m: r[:7] for m, r in resumed.items()} == {m: r[:7] for m, r in uninterrupted.items()}


@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_failing_run_is_reported_and_the_others_go_on(tmp_path, capsys):
    bad = {"method": "FedAvg lr -1", "script": "fedavg.py", "flags": ["--lr", "-1"], "paper": None}
    tables = tiny_tables(extra_methods=[bad])
    tables["tiny"]["cells"][0]["methods"] = tables["tiny"]["cells"][0]["methods"][::2]  # FedAvg and the bad one
    capsys.readouterr()
    assert call(["tiny", "--seeds", 0, "--out", tmp_path, "--workers", 2], tables) == 1
    err = capsys.readouterr().err.strip().splitlines()
    failed = [line for line in err if line.startswith("failed")]
    assert len(failed) == 1 and "--lr -1" in failed[0] and "run.log" in failed[0] and "--lr must be" in failed[0]
    assert err[-1].startswith("1 of 2 runs failed")
    with open(tmp_path / "tiny.md") as f:
        rows = table_rows(f.read())
    assert rows["FedAvg"][4] == "1" and rows["FedAvg lr -1"][4] == "0" and "not run" in rows["FedAvg lr -1"][10]


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_ctrl_c_stops_the_runs_with_a_checkpoint(tmp_path):
    """SIGINT to tools/reproduce.py: forwarded once to the running script, which writes a checkpoint and
    stops; one line says how to continue; exit status 130."""
    tables = tiny_tables(rounds=100000)
    tables["tiny"]["cells"][0]["methods"] = tables["tiny"]["cells"][0]["methods"][:1]
    code = ("import json, os, sys; sys.path.insert(0, os.environ['ROOT']); from tools import reproduce; "
            "sys.exit(reproduce.main(sys.argv[1:], json.loads(os.environ['TABLES'])))")
    proc = subprocess.Popen([sys.executable, "-c", code, "tiny", "--seeds", "0", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ROOT": ROOT, "TABLES": json.dumps(tables), "OMP_NUM_THREADS": "1"})
    seed_dir = tmp_path / "tiny" / "syn-4" / "fedavg" / "seed0"
    deadline = time.time() + 60
    while time.time() < deadline and not any(os.path.exists(os.path.join(f, "metrics.csv"))
                                             for f in reproduce.run_folders(seed_dir)):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (f"interrupted: the stopped runs kept their checkpoints; continue "
                                               f"with: python tools/reproduce.py tiny --seeds 0 --out {tmp_path}")
    (folder,) = reproduce.run_folders(seed_dir)
    assert os.path.exists(os.path.join(folder, "checkpoint.pt"))
    assert not os.path.exists(os.path.join(folder, "summary.json"))
    with open(seed_dir / "run.log") as f:
        assert "interrupted after round" in f.read()


# ----------------------------------------------------------------------------------------- no runs

def test_dry_run_of_every_paper_table(tmp_path, capsys):
    for table_id, table in paper_tables.TABLES.items():
        capsys.readouterr()
        assert call([table_id, "--dry-run", "--out", tmp_path]) == 0
        text = capsys.readouterr().out
        assert table["title"] in text
        for cell in table["cells"]:
            assert f"\ncell {cell['name']}\n" in text
            for method in cell["methods"]:
                paper = reproduce.paper_number(method)
                assert f"  {method['method']}: paper {paper}" in text
        commands = [line for line in text.splitlines() if "[new]: python " in line]
        assert len(commands) == 3 * sum(len(c["methods"]) for c in table["cells"])
        assert f"--rounds {table['rounds']} --seed 2 " in text
    assert os.listdir(tmp_path) == []  # nothing was run or written


def test_methods_chooses_the_runs_not_the_report(tmp_path, capsys):
    assert call(["pfllib-fmnist", "--dry-run", "--out", tmp_path, "--methods", "pFedLA", "FedALA"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "[new]: python " in line]
    assert len(commands) == 3 * 2 * 2  # seeds x cells x the two methods
    assert {c.split("[new]: python ")[1].split()[0] for c in commands} == {"pfedla.py", "fedala.py"}
    assert call(["pfllib-fmnist", "--report", "--out", tmp_path, "--methods", "pFedLA"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| dir | ")]
    assert [r.split(" | ")[1] for r in rows] == ["FedAvg", "FedALA", "FedPake", "FedACD", "pFedLA"]


@pytest.mark.parametrize("name", ["fedala-t2", "FedALA Table 2", "fedala-table2", "fedala_t2", "fedala2"])
def test_a_table_may_be_named_as_the_paper_names_it(name, tmp_path, capsys):
    assert call([name, "--dry-run", "--out", tmp_path]) == 0
    assert paper_tables.TABLES["fedala-t2"]["title"] in capsys.readouterr().out


def test_list_names_every_table_and_cell(capsys):
    assert call(["--list"]) == 0
    text = capsys.readouterr().out
    for table_id, table in paper_tables.TABLES.items():
        assert f"{table_id}: {table['title']}" in text
        for cell in table["cells"]:
            assert f"  {cell['name']}: " in text


def test_results_doc_has_the_generated_paper_tables():
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        doc = f.read()
    section = reproduce.paper_tables_markdown(paper_tables.TABLES)
    assert section in doc, "docs/results.md is stale: python tools/reproduce.py --markdown-paper-tables docs/results.md"


def test_method_folders_are_distinct():
    cell = {"methods": [{"method": "FedALA --no-ala"}, {"method": "FedALA  no ala"}, {"method": "FedALA"}]}
    assert reproduce.method_slugs(cell) == ["fedala-no-ala", "fedala-no-ala-2", "fedala"]
    for table in paper_tables.TABLES.values():
        for cell in table["cells"]:
            assert len(set(reproduce.method_slugs(cell))) == len(cell["methods"])


@pytest.mark.parametrize("argv, words", [
    (["nosuch"], "unknown table 'nosuch'; known: tiny"),
    (["tiny", "--only", "nosuch"], "unknown cell 'nosuch' in table tiny; its cells: syn-4"),
    (["tiny", "--methods", "FedAvg", "nosuch"], "unknown method 'nosuch' in table tiny; its methods: FedAvg, FedALA"),
    (["tiny", "--workers", "0"], "--workers must be an integer >= 1, got '0'"),
    (["tiny", "--workers", "abc"], "--workers must be an integer >= 1, got 'abc'"),
    (["tiny", "--seeds", "x"], "--seeds must be an integer >= 0, got 'x'"),
    (["tiny", "--seeds", "1", "1"], "--seeds: a seed is given twice"),
    (["tiny", "--rounds", "0"], "--rounds must be an integer >= 1"),
    (["tiny", "--device", "gpu"], "--device: unknown device 'gpu'"),
    ([], "name a table"),
    (["tiny", "--data-dir", ""], "--data-dir must name the folder the datasets are read from"),
    (["tiny", "--data-dir", "/nonexistent/data"], "--data-dir /nonexistent/data does not exist"),
    (["tiny", "--data-dir", "/etc/hostname"], "--data-dir /etc/hostname is not a folder"),
])
def test_bad_input_one_line_exit_2(argv, words, tmp_path, capsys):
    assert call([*argv, "--out", tmp_path], tiny_tables()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change, words", [
    ({"fedavg_flags": ["--lr", "0.02"]}, "--lr not given (now 0.02)"),
    ({"rounds": 1}, "--rounds 2 (now 1; --rounds may only extend a run)"),
])
def test_out_holding_runs_of_other_settings(finished, change, words, capsys):
    out = finished[0]
    before = sorted(os.walk(out))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tiny_tables(**change)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run of other settings" in err and words in err, err
    assert sorted(os.walk(out)) == before
    # a changed setting of the same flag names both values
    tables = copy.deepcopy(tiny_tables())
    tables["tiny"]["common"][tables["tiny"]["common"].index("4")] = "5"
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tables) == 2
    assert "--num-clients 4 (now 5)" in capsys.readouterr().err


def test_more_rounds_extend_and_a_diverged_run_is_not_run_again(finished, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    tables = tiny_tables()
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--dry-run", "--rounds", 5], tables) == 0
    text = capsys.readouterr().out
    assert text.count("[resume]: python ") == 4 and text.count("--rounds 5 --device auto") == 4
    job = jobs_of(tables, out)[0]
    folder, summary = summary_of(job)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({**summary, "status": "diverged"}, f)
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tables) == 1
    captured = capsys.readouterr()
    assert "diverged before (not run again): syn-4 / FedAvg / seed 0" in captured.err
    assert "start " not in captured.out
    assert "seed 0: diverged" in table_rows(captured.out)["FedAvg"][10]


def test_a_flag_stating_the_value_the_run_took_is_the_same_setting(finished):
    same = tiny_tables(fedavg_flags=["--momentum", "0.0", "--lr", "5e-3"])  # fedavg.py took these anyway
    assert call(["tiny", "--seeds", *SEEDS, "--out", finished[0], "--report"], same) == 0


def test_data_dir_goes_to_every_run_and_is_no_setting(finished, tmp_path, capsys):
    """--data-dir is passed to every run it starts or resumes; runs made with another data folder are the same
    setting (the scripts check on --resume that the data itself is the same)."""
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    data_dir = str(tmp_path / "data")  # reproduce.py refuses a --data-dir that does not exist
    os.makedirs(data_dir)
    tables = tiny_tables()
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--dry-run", "--rounds", 3, "--data-dir", data_dir],
                tables) == 0
    text = capsys.readouterr().out
    assert text.count("[resume]: python ") == 4 and text.count(f"--data-dir {data_dir}") == 4
    assert call(["tiny", "--seeds", "7", "--out", out, "--dry-run", "--data-dir", data_dir], tables) == 0
    text = capsys.readouterr().out
    assert text.count("[new]: python ") == 2 and text.count(f"--data-dir {data_dir}") == 2


# ----------------------------------------------------------------------------------------- supervision (issue 28)

def test_workers_beyond_the_bound_is_one_line_before_anything_is_made(tmp_path, capsys):
    out = tmp_path / "out"
    assert call(["tiny", "--out", out, "--workers", "1000000000000000"], tiny_tables()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is more than {reproduce.max_workers()}" in err and "per CPU" in err, err
    assert not out.exists()


def _seed_dir(out, seed=0, method="fedavg"):
    return out / "tiny" / "syn-4" / method / f"seed{seed}"


def _file(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _folder(path):
    path.mkdir(parents=True)


# every path reproduce.py reads or writes, made what it must not be: one line naming it, exit 2, nothing changed
PATH_CASES = [
    ("seed folder a regular file", lambda out: _file(_seed_dir(out)), "seed0 must be a folder but is a regular file"),
    ("method folder a regular file", lambda out: _file(_seed_dir(out).parent), "fedavg must be a folder"),
    ("TABLE.md a folder", lambda out: _folder(out / "tiny.md"), "tiny.md must be a regular file but is a folder"),
    ("run.log a named pipe", lambda out: (_folder(_seed_dir(out)), os.mkfifo(_seed_dir(out) / "run.log")),
     "run.log must be a regular file but is a named pipe"),
    ("reproduce.json launches [null]", lambda out: _file(_seed_dir(out) / "reproduce.json", '{"launches": [null]}'),
     "reproduce.json has launches[0] = None, which must be a mapping"),
    ("reproduce.json launches a number", lambda out: _file(_seed_dir(out) / "reproduce.json", '{"launches": 5}'),
     "reproduce.json has launches = 5, which must be a list"),
    ("reproduce.json a list", lambda out: _file(_seed_dir(out) / "reproduce.json", "[1, 2]"),
     "reproduce.json cannot be read (unreadable)"),
    ("reproduce.json a launch without its command",
     lambda out: _file(_seed_dir(out) / "reproduce.json", '{"launches": [{"time": "now"}]}'),
     "reproduce.json lacks the field launches[0].command"),
    ("a newline in --out", lambda out: _file(_seed_dir(out)), "must be a folder"),
]


@pytest.mark.parametrize("mode", [[], ["--report"], ["--dry-run"]])
@pytest.mark.parametrize("name, make, words", PATH_CASES, ids=[c[0] for c in PATH_CASES])
def test_a_path_that_is_not_what_it_must_be_is_one_line(name, make, words, mode, tmp_path, capsys):
    out = tmp_path / ("out\nx" if "newline" in name else "out")
    make(out)
    before = sorted(os.walk(tmp_path))
    assert call(["tiny", "--seeds", "0", "--out", out, *mode], tiny_tables()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert sorted(os.walk(tmp_path)) == before


def test_a_config_cut_short_is_damaged_and_left_out_of_the_report(finished, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    tables = tiny_tables()
    job = jobs_of(tables, out)[0]
    (folder,) = reproduce.run_folders(job["dir"])
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:len(text) // 2])
    before = sorted(os.walk(out))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tables) == 2  # running: refused before anything starts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json is damaged (not a JSON object: cut short" in err
    assert "other settings" not in err
    assert sorted(os.walk(out)) == before
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tables) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("left out of the report: ") and \
        "config.json" in captured.err, captured.err
    assert table_rows(captured.out)["FedAvg"][4] == "1"  # the other seed is reported


@pytest.mark.parametrize("holder", ["lock", "launch"])
def test_a_job_running_already_is_never_started_again(holder, finished, tmp_path, capsys):
    """A run folder locked by a live process (the run of a reproduce.py killed with kill -9), or the
    process reproduce.json last started and still running that job: one line, the others go on."""
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    tables = tiny_tables()
    job = jobs_of(tables, out)[0]
    (folder,) = reproduce.run_folders(job["dir"])
    os.remove(os.path.join(folder, "summary.json"))  # resumable: reproduce.py would continue it
    # a live process that is not ours to stop; for "lock" it holds the run folder's lock as a run does
    # (run_folder.Run.take_lock: filelock, "PID HOST" in the file), for "launch" its command line names the job's
    # script and folder
    hold = ("import os, socket, sys, time, filelock\n"
            "lock = filelock.FileLock(sys.argv[1], timeout=0)\n"
            "lock.acquire()\n"
            "open(sys.argv[1], 'w').write(f'{os.getpid()} {socket.gethostname()}\\n')\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n")
    lock = os.path.join(folder, ".lock")
    sleeper = subprocess.Popen([sys.executable, "-c", hold if holder == "lock" else "import time; time.sleep(120)",
                                lock, "fedavg.py", job["dir"]], stdout=subprocess.PIPE, text=True)
    try:
        if holder == "lock":
            assert sleeper.stdout.readline() == "held\n"
        else:
            with open(os.path.join(job["dir"], "reproduce.json"), "w") as f:
                json.dump({"launches": [{"time": "x", "host": socket.gethostname(), "command": ["python"],
                                         "pid": sleeper.pid}]}, f)
        before = os.listdir(job["dir"])
        assert call(["tiny", "--seeds", *SEEDS, "--out", out], tables) == 1
        err = capsys.readouterr().err
        assert f"already running (process {sleeper.pid}), not started again: syn-4 / FedAvg / seed 0" in err, err
        assert sorted(os.listdir(job["dir"])) == sorted(before)  # no second run folder, no run.log line
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def _reproduce_process(tables, out, *argv):
    """A real ``python tools/reproduce.py`` (run as __main__, with the tiny tables in place of the papers')."""
    code = ("import json, os, runpy, sys; sys.path.insert(0, os.environ['ROOT']); from tools import paper_tables; "
            "paper_tables.TABLES.clear(); paper_tables.TABLES.update(json.loads(os.environ['TABLES'])); "
            "sys.argv = ['tools/reproduce.py', *sys.argv[1:]]; "
            "runpy.run_path(os.path.join(os.environ['ROOT'], 'tools', 'reproduce.py'), run_name='__main__')")
    return subprocess.Popen([sys.executable, "-c", code, "tiny", "--out", str(out), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sighup_as_in_a_terminal,
                            env={**os.environ, "ROOT": ROOT, "TABLES": json.dumps(tables), "OMP_NUM_THREADS": "1"})


@pytest.mark.slow  # real runs end to end, tens of seconds
@pytest.mark.parametrize("signum, status, what", [(signal.SIGTERM, 143, "stopped by SIGTERM"),
                                                  (signal.SIGHUP, 129, "stopped by SIGHUP")])
def test_sigterm_and_sighup_are_passed_on_and_nothing_is_left_running(signum, status, what, tmp_path):
    tables = tiny_tables(rounds=100000)
    proc = _reproduce_process(tables, tmp_path, "--seeds", "0", "--workers", "2")
    seed_dirs = [_seed_dir(tmp_path, 0, m) for m in ("fedavg", "fedala")]
    deadline = time.time() + 90
    while time.time() < deadline and not all(any(os.path.exists(os.path.join(f, "metrics.csv"))
                                                 for f in reproduce.run_folders(d)) for d in seed_dirs):
        time.sleep(0.1)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == status, stderr
    assert stderr.strip().splitlines()[-1] == (f"{what}: the stopped runs kept their checkpoints; continue with: "
                                               f"python tools/reproduce.py tiny --out {tmp_path} --seeds 0 --workers 2")
    from tools.run_records import process_alive
    for d in seed_dirs:
        (folder,) = reproduce.run_folders(d)
        assert os.path.exists(os.path.join(folder, "checkpoint.pt"))
        assert not os.path.exists(os.path.join(folder, ".lock"))
        with open(d / "reproduce.json") as f:
            pid = json.load(f)["launches"][-1]["pid"]
        assert not process_alive(pid)  # waited for: nothing of the table is left running
        with open(d / "run.log") as f:
            assert f"{what} after round" in f.read()
    assert not os.path.exists(tmp_path / "tiny" / ".lock")


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_reproduce_starts_is_one_line(signum, status, tmp_path):
    """The real python tools/reproduce.py: a signal while numpy and torch load (common's start-up handler)."""
    from test_faults import catches
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "reproduce.py"), "synthetic", "--dry-run",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sighup_as_in_a_terminal)
    deadline = time.time() + 30
    while time.time() < deadline and not catches(proc.pid, signal.SIGTERM):
        time.sleep(0.005)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == status and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(f"stopped by {signal.Signals(signum).name}"), stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- reports that could mislead

def fabricated_row(values, seeds=(0, 1)):
    """A report row's collected runs: finished runs with these values (no run folders needed)."""
    return {"jobs": [{"seed": s} for s in seeds],
            "seeds": [{"seed": s, "value": v, "done": 2, "state": "finished", "sec_per_round": 1.0,
                       "hardware": "cpu"} for s, v in zip(seeds, values)]}


def test_every_row_of_a_reconstructed_algorithm_says_so():
    table = paper_tables.TABLES["fedpake-t1"]
    cell = table["cells"][0]
    scripts = {m["script"]: m for m in cell["methods"]}
    assert {"fedpake.py", "fedavg.py"} <= set(scripts)
    notes = {script: reproduce.report_row(table, cell, method, fabricated_row([80.0, 82.0]), 1000).split(" | ")[-1]
             for script, method in scripts.items()}
    assert "reconstructed by us" in notes["fedpake.py"] and "docs/fedpake.md" in notes["fedpake.py"]
    assert "reconstructed" not in notes["fedavg.py"]


def test_communication_cost_is_compared_by_the_ratio_the_paper_shows_never_by_difference():
    """pFedLA Table 3: ours (every transfer of every round) and the paper's (about 1500 models) count
    different things, so the row shows ours / k=0 beside the paper's 418.97 / 693.98, computed here by hand."""
    table = paper_tables.TABLES["pfedla-t3-cost"]
    cell = next(c for c in table["cells"] if c["name"] == "cifar10")
    k0, k1 = cell["methods"][0], cell["methods"][1]
    assert (k0["paper"], k1["paper"]) == (693.98, 418.97)
    first = ([5000.0, 5100.0], 693.98)
    row = reproduce.report_row(table, cell, k1, fabricated_row([3000.0, 3030.0]), 600, first).split(" | ")
    assert row[5] == f"ratio to the first: ours {3015 / 5050:.3f}, paper {418.97 / 693.98:.3f}"
    assert row[5] == "ratio to the first: ours 0.597, paper 0.604"
    row = reproduce.report_row(table, cell, k0, fabricated_row([5000.0, 5100.0]), 600, first).split(" | ")
    assert row[5] == "ratio to the first: ours 1.000, paper 1.000"
    # a table that measures the same quantity keeps the difference
    accuracy = paper_tables.TABLES["pfedla-t1"]
    acc_cell = accuracy["cells"][0]
    method = next(m for m in acc_cell["methods"] if m["paper"] is not None)
    row = reproduce.report_row(accuracy, acc_cell, method, fabricated_row([50.0, 52.0]), 600).split(" | ")
    assert row[5] == f"{51.0 - method['paper']:+.2f}"


def test_one_run_is_singular(capsys):
    tables = tiny_tables()
    tables["tiny"]["cells"][0]["methods"] = tables["tiny"]["cells"][0]["methods"][:1]
    reproduce.list_tables(tables)
    assert "(1 cell, 1 run per seed, 2 rounds)" in capsys.readouterr().out
    assert reproduce.plural(2, "run") == "2 runs" and reproduce.plural(0, "cell") == "0 cells"


def test_a_flag_with_several_values_is_one_setting():
    """fedpake.py --ablate micro macro (Table 4's row without both) is another setting than --ablate micro."""
    assert reproduce.given_flags(["--ablate", "micro", "macro", "--lr", "-0.5", "--no-ala"]) == \
        {"ablate": ["micro", "macro"], "lr": "-0.5", "no_ala": True}
    assert reproduce.given_flags(["--ablate", "micro"]) == {"ablate": "micro"}


def test_a_run_under_a_changed_default_is_another_setting(tmp_path):
    """A finished FedALA run made at the former default --threshold 0.1: the same command line now runs
    0.01 (the paper's), so the run is named as another setting, not taken as done."""
    import fedala
    (job,) = [j for j in jobs_of(tiny_tables(), tmp_path, seeds=(0,)) if j["method"] == "FedALA"]
    command = reproduce.new_command(job, "auto")
    args = vars(fedala.parse_args(command[2:]))
    folder = tmp_path / "run"
    os.makedirs(folder)

    def write(threshold):
        with open(folder / "config.json", "w") as f:
            json.dump({"script": "fedala", "command": command[1:], "args": {**args, "threshold": threshold}}, f)

    write(0.01)
    assert reproduce.other_settings(job, str(folder)) == []
    write(0.1)
    assert reproduce.other_settings(job, str(folder)) == ["--threshold 0.1 (now 0.01; a default changed)"]


def test_a_fedacd_run_made_when_its_diagnostics_were_on_by_default_is_the_table_s_run(tmp_path):
    """fedacd.py logged --log-kl and --log-risk unasked before they took flags: such a run trained the same
    (the diagnostics only add columns), so a table cell without the flags takes it as its run, not as
    another setting; a real setting of it (--lam) still differs."""
    import fedacd
    method = {"method": "FedACD", "script": "fedacd.py", "flags": [], "paper": None}
    (job,) = [j for j in jobs_of(tiny_tables(extra_methods=[method]), tmp_path, seeds=(0,)) if j["method"] == "FedACD"]
    command = reproduce.new_command(job, "auto")
    args = vars(fedacd.parse_args(command[2:]))
    folder = tmp_path / "run"
    os.makedirs(folder)

    def write(saved_command, **changed):
        with open(folder / "config.json", "w") as f:
            json.dump({"script": "fedacd", "command": saved_command, "args": {**args, **changed}}, f)

    write(command[1:] + ["--log-kl", "--log-risk"], log_kl=True, log_risk=True)
    assert reproduce.other_settings(job, str(folder)) == []
    write(command[1:], log_kl=True, log_risk=True)  # recorded before the flags: on, though not on the command
    assert reproduce.other_settings(job, str(folder)) == []
    write(command[1:] + ["--lam", "0.5"], lam=0.5)
    assert reproduce.other_settings(job, str(folder)) == ["--lam 0.5 (now not given)"]


def test_a_run_of_a_flag_that_moved_to_tools_is_the_cell_s_run_of_that_program(tmp_path):
    """Runs made as fedavg.py --local-training keep that command in their config.json; the flag now belongs to
    tools/fedavg_variants.py, whose cell takes them as its runs (same flags), not another setting; a run of plain
    fedavg.py is one (--local-training differs), and so is a run of another script."""
    from tools import fedavg_variants
    method = {"method": "Local Training", "script": paper_tables.FEDAVG_VARS, "flags": ["--local-training"],
              "paper": None}
    (job,) = [j for j in jobs_of(tiny_tables(extra_methods=[method]), tmp_path, seeds=(0,))
              if j["method"] == "Local Training"]
    command = reproduce.new_command(job, "auto")
    args = vars(fedavg_variants.parse_args(command[2:]))
    folder = tmp_path / "run"
    os.makedirs(folder)

    def write(script, saved_command, **changed):
        with open(folder / "config.json", "w") as f:
            json.dump({"script": script, "command": saved_command, "args": {**args, **changed}}, f)

    write("fedavg", ["fedavg.py", *command[2:]])
    assert reproduce.other_settings(job, str(folder)) == []
    write("tools/fedavg_variants", ["tools/fedavg_variants.py", *command[2:]])
    assert reproduce.other_settings(job, str(folder)) == []
    write("fedavg", ["fedavg.py", *[f for f in command[2:] if f != "--local-training"]], local_training=False)
    assert reproduce.other_settings(job, str(folder)) == ["--local-training not given (now True)"]
    write("fedala", ["fedala.py", *command[2:]])
    assert reproduce.other_settings(job, str(folder)) == [f"a run of fedala.py (now {paper_tables.FEDAVG_VARS})"]


# ----------------------------------------------------------------------------------------- issue 37: damaged results

def _damage_copy(finished, tmp_path):
    """A copy of the finished tiny table and its FedAvg seed-0 run folder."""
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    job = jobs_of(tiny_tables(), out)[0]
    (folder,) = reproduce.run_folders(job["dir"])
    return out, folder


def _edit(folder, name, edit):
    path = os.path.join(folder, name)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(edit(text))


def _edit_json(folder, name, edit):
    def change(text):
        data = json.loads(text)
        edit(data)
        return json.dumps(data)
    _edit(folder, name, change)


def _lines(text):
    return text.splitlines(keepends=True)


DAMAGE = [  # (name, what is done to FedAvg's seed-0 run folder, words in its notes, averaged)
    ("last row lost", lambda d: _edit(d, "metrics.csv", lambda t: "".join(_lines(t)[:-1])),
     "seed 0: damaged: metrics.csv ends at round 1, summary.json says 2 were done; not averaged; seed 0: 1/2, "
     "unfinished", False),
    ("last row lost, no summary", lambda d: (_edit(d, "metrics.csv", lambda t: "".join(_lines(t)[:-1])),
                                             os.remove(os.path.join(d, "summary.json"))),
     "seed 0: 1/2, unfinished", True),
    ("nan", lambda d: (_edit(d, "metrics.csv", lambda t: "".join(_lines(t)[:2]) + _lines(t)[2].replace(
        _lines(t)[2].split(",")[1], "nan", 1)), os.remove(os.path.join(d, "summary.json"))),
     "seed 0: test_acc is nan at round 2; not averaged", False),
    ("inf, summary.json unchanged", lambda d: _edit(d, "metrics.csv", lambda t: "".join(_lines(t)[:2]) + _lines(t)[2].replace(
        _lines(t)[2].split(",")[1], "inf", 1)), "seed 0: damaged: summary.json has test_acc best", False),
    ("summary.json edited", lambda d: _edit_json(d, "summary.json", lambda s: s["test_acc"].update(last10_mean=99.0)),
     "seed 0: damaged: summary.json has test_acc last10_mean 99.0", False),
    ("config.json of another seed", lambda d: _edit_json(d, "config.json", lambda c: c["args"].update(seed=1)),
     "seed 0: damaged: config.json has seed 1, its seed folder seed0; not averaged", False),
    ("a row duplicated", lambda d: _edit(d, "metrics.csv", lambda t: t + _lines(t)[-1]),
     "seed 0: damaged: metrics.csv line 4 repeats round 2; not averaged", False),
    ("rows reversed", lambda d: _edit(d, "metrics.csv", lambda t: "".join([_lines(t)[0], *_lines(t)[:0:-1]])),
     "seed 0: damaged: metrics.csv line 3 has round 1 after round 2; not averaged", False),
    ("summary.json garbage", lambda d: open(os.path.join(d, "summary.json"), "wb").write(b"\x00\xff garbage"),
     "seed 0: damaged: summary.json is not a JSON object (cut short or garbage); not averaged", False),
    ("a metrics.csv line over csv's field limit", lambda d: _edit(d, "metrics.csv", lambda t: "".join(
        [*_lines(t)[:2], "2," + "7" * 200000 + _lines(t)[2][_lines(t)[2].index(",", 2):]])),
     "seed 0: damaged: metrics.csv line 3 cannot be read as csv (field larger than field limit (131072)); not "
     "averaged", False),
    ("two run folders", lambda d: shutil.copytree(d, d + "-copy"),
     "seed 0: ambiguous: 2 run folders in its seed folder", False),
    ("a run folder stopped before its first checkpoint beside it",  # reproduce.py started the run after it
     lambda d: (shutil.copytree(d, d[:-1] + "0-stale", ignore=shutil.ignore_patterns("summary.json", "checkpoint.pt"))),
     "-stale, stopped before its first checkpoint", True),
]


@pytest.mark.parametrize("name, damage, words, averaged", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_a_damaged_run_is_named_in_the_report_and_not_averaged(name, damage, words, averaged, finished, tmp_path,
                                                                capsys):
    out, folder = _damage_copy(finished, tmp_path)
    damage(folder)
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    rows = table_rows(capsys.readouterr().out)
    assert words in rows["FedAvg"][10], rows["FedAvg"][10]
    assert rows["FedAvg"][4] == ("2" if averaged else "1")
    assert rows["FedALA"][4] == "2" and rows["FedALA"][10] == "metric: best test_acc_mean"
    assert "nan" not in rows["FedAvg"][3] and "inf" not in rows["FedAvg"][3]


def test_the_hardware_cell_names_the_cpu_the_run_s_config_json_records_before_its_launcher_s(finished, tmp_path,
                                                                                                capsys):
    """A run made on one CPU and started by reproduce.py on a machine recorded without family and model: the
    hardware cell names config.json's cpu_model and threads (where the run was made); a run whose config.json
    predates that record falls back to its last launch."""
    out, folder = _damage_copy(finished, tmp_path)
    _edit_json(os.path.dirname(folder), "reproduce.json", lambda r: r["launches"][-1].update(cpu="AMD EPYC", threads=4))
    _edit_json(folder, "config.json", lambda c: (c.update(cpu_model="Some CPU (cpu family 9, model 8)"),
                                                 c["args"].update(threads=1)))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    assert table_rows(capsys.readouterr().out)["FedAvg"][9].split("; ") == \
        sorted(["Some CPU (cpu family 9, model 8), 1 torch thread", hardware_of_seed_1(out)])
    _edit_json(folder, "config.json", lambda c: c.pop("cpu_model"))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    assert "AMD EPYC, 4 torch threads" in table_rows(capsys.readouterr().out)["FedAvg"][9].split("; ")


def hardware_of_seed_1(out):
    job = next(j for j in jobs_of(tiny_tables(), out) if j["method"] == "FedAvg" and j["seed"] == 1)
    (folder,) = reproduce.run_folders(job["dir"])
    return reproduce.hardware({"folder": folder}, job)


def test_a_table_with_a_damaged_run_does_not_end_with_0(finished, tmp_path, capsys):
    """Running the table (every run finished already, so none starts): the report names the damaged run, and
    the exit status is 1, as for a run that did not finish."""
    out, folder = _damage_copy(finished, tmp_path)
    _edit_json(folder, "summary.json", lambda s: s["test_acc"].update(best=1.0))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tiny_tables()) == 1
    captured = capsys.readouterr()
    assert "start " not in captured.out and "damaged" in table_rows(captured.out)["FedAvg"][10]
    assert captured.err.strip().splitlines()[-1] == \
        "1 run not averaged (damaged, ambiguous, nan or inf): see the report's notes"


# ----------------------------------------------------------------------------------------- issue 37: a full disk

def _tmp_files(folder):
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.startswith(".tmp-")]


def full_disk(monkeypatch):
    """From here on each temporary file that run_folder.atomic_write (os.open of a .tmp- name) and
    run_records.atomic_write_all (tempfile.mkstemp) make is on a full disk: made, but every write to it fails with
    ENOSPC (its descriptor is /dev/full's)."""
    import tempfile
    real_open, real_mkstemp = os.open, tempfile.mkstemp

    def on_full_disk(fd):
        full = real_open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        return fd

    def open_(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        return on_full_disk(fd) if os.path.basename(str(path)).startswith(".tmp-") else fd

    def mkstemp(*args, **kwargs):
        fd, path = real_mkstemp(*args, **kwargs)
        return on_full_disk(fd), path

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_a_report_on_a_full_disk_keeps_the_previous_files(finished, tmp_path, monkeypatch):
    out, _ = _damage_copy(finished, tmp_path)
    before = {name: (out / name).read_bytes() for name in ("tiny.md", "tiny-syn-4.png")}
    full_disk(monkeypatch)
    with pytest.raises(OSError) as caught:
        call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables())
    assert caught.value.filename == str(out / "tiny-syn-4.png") and caught.value.errno == 28
    assert {name: (out / name).read_bytes() for name in before} == before and _tmp_files(out) == []
    doc = tmp_path / "results.md"
    shutil.copy(os.path.join(ROOT, "docs", "results.md"), doc)
    text = doc.read_text()
    with pytest.raises(OSError) as caught:
        call(["--markdown-paper-tables", doc])
    assert caught.value.filename == str(doc) and doc.read_text() == text and _tmp_files(tmp_path) == []


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_a_report_on_a_full_disk_is_one_line_and_exit_1(finished, tmp_path):
    """python tools/reproduce.py TABLE --report as a user runs it, on a full disk: one line naming the file."""
    from test_files_written import ON_A_FULL_DISK
    out, _ = _damage_copy(finished, tmp_path)
    png = (out / "tiny-syn-4.png").read_bytes()
    tables = ("from tools import paper_tables; import json; paper_tables.TABLES.clear(); "
              "paper_tables.TABLES.update(json.loads(os.environ['TABLES']))\n")
    proc = subprocess.run([sys.executable, "-c", "import os, sys; sys.path.insert(0, os.environ['ROOT'])\n" + tables
                           + ON_A_FULL_DISK, os.path.join(ROOT, "tools", "reproduce.py"), "tiny", "--seeds", *SEEDS,
                           "--out", str(out), "--report"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ROOT": ROOT, "TABLES": json.dumps(tiny_tables())})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"error: cannot write {out / 'tiny-syn-4.png'} (No space left on device); the runs are kept\n"
    assert (out / "tiny-syn-4.png").read_bytes() == png and _tmp_files(out) == []


def test_no_value_in_a_run_folder_can_add_a_row_to_the_report(finished, tmp_path, capsys):
    out, folder = _damage_copy(finished, tmp_path)
    forged = "Some CPU\n| syn-4 | FedProx | 99.00 | 99.00 ± 0.00 | 2 | - | 2/2 | 1.0 | cpu | - |"
    _edit_json(folder, "config.json", lambda c: c.update(cpu_model=forged))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    text = capsys.readouterr().out
    assert sorted(table_rows(text)) == ["FedALA", "FedAvg"]  # no FedProx row
    assert "Some CPU\\n\\| syn-4 \\| FedProx" in table_rows(text)["FedAvg"][9]
    assert compare.one_line("a|b\r\nc\x00", markdown=True) == "a\\|b\\r\\nc\\x00"


def test_the_reports_command_carries_data_dir_and_stop_after(finished, tmp_path, capsys):
    tables = tiny_tables()
    args = reproduce.parse_args(["tiny", "--seeds", "0", "--out", str(tmp_path), "--data-dir", str(tmp_path),
                                 "--stop-after", "1"], tables)
    command = shlex.split(reproduce.reproduce_command("tiny", args))
    assert command[command.index("--data-dir") + 1] == str(tmp_path) and "--stop-after" in command
    out, folder = _damage_copy(finished, tmp_path)  # launched with --data-dir; the report alone given none
    _edit_json(os.path.dirname(folder), "reproduce.json",
               lambda r: r["launches"][-1].update(command=[*r["launches"][-1]["command"], "--data-dir", "/data/x"]))
    for job in jobs_of(tables, out)[1:]:
        _edit_json(job["dir"], "reproduce.json",
                   lambda r: r["launches"][-1].update(command=[*r["launches"][-1]["command"], "--data-dir", "/data/x"]))
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tables) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("- command: ")]
    command = shlex.split(line.removeprefix("- command: ").strip("`"))
    assert command[command.index("--data-dir") + 1] == "/data/x"


def test_seeds_on_a_folder_are_averaged_only_when_they_read_the_same_data():
    def seed(number, data, value):
        run = {"args": {"data": data}, "folder_partition": {"partition": "pat"}}
        return {"seed": number, "value": value, "done": 2, "state": "finished", "sec_per_round": 1.0,
                "hardware": "cpu", "run": run, "problem": None}
    seeds = [seed(0, "a" * 12, 50.0), seed(1, "b" * 12, 90.0), seed(2, "a" * 12, 52.0)]
    reproduce.set_apart_other_data(seeds)
    assert [s["value"] for s in seeds] == [50.0, None, 52.0]
    assert seeds[1]["problem"] == (f"its data fingerprint {'b' * 12}... differs from seed 0's {'a' * 12}... (the "
                                   "dataset folder changed between the runs)")
    table = tiny_tables()["tiny"]
    row = reproduce.report_row(table, table["cells"][0], table["cells"][0]["methods"][0],
                               {"jobs": [{"seed": s["seed"]} for s in seeds], "seeds": seeds}, 2).split(" | ")
    assert row[3] == "51.00 ± 1.41" and row[4] == "2" and "seed 1: its data fingerprint" in row[10]
    agreeing = [seed(0, "a" * 12, 50.0), seed(1, "a" * 12, 90.0), seed(2, "unrecorded", 1.0)]
    reproduce.set_apart_other_data(agreeing)
    assert [s["problem"] for s in agreeing] == [None, None, None]


def test_the_line_after_a_signal_says_the_runs_kept_checkpoints_only_where_they_are(finished, tmp_path):
    out, folder = _damage_copy(finished, tmp_path)
    jobs = jobs_of(tiny_tables(), out)
    assert reproduce.what_the_stopped_runs_kept(jobs) == "the stopped runs kept their checkpoints"
    os.remove(os.path.join(folder, "checkpoint.pt"))  # the run folder's content deleted under the table
    line = reproduce.what_the_stopped_runs_kept(jobs)
    assert "kept their checkpoints" not in line
    assert line.startswith(f"1 stopped run of {len(jobs)} has no checkpoint") and "syn-4 / FedAvg / seed 0" in line


def test_the_last_line_of_a_failed_runs_log_keeps_its_end(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("started\nerror: cannot resume: " + "/deep" * 60 + "/checkpoint.pt is not a valid checkpoint\n\n")
    line = reproduce.last_line(str(log))
    assert len(line) <= 200 and line.startswith("error: cannot resume: ") and line.endswith("is not a valid checkpoint")


def test_only_the_end_of_a_long_log_is_read_for_its_last_line(tmp_path):
    import tracemalloc
    log = tmp_path / "run.log"
    log.write_text("[fedavg] round 1/2000 | test acc 10.00%\n" * 200000 + "error: the last line\n")  # 8 MB
    tracemalloc.start()
    try:
        assert reproduce.last_line(str(log)) == "error: the last line"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * reproduce.LOG_TAIL_BYTES, peak


# ----------------------------------------------------------------------------------------- the report: all or nothing

def test_a_report_whose_last_file_cannot_be_written_changes_none_of_its_files(finished, tmp_path, monkeypatch):
    """The curves and the report are written together: the report's own file failing (a full disk after the
    curve) leaves the curve as it was too, and no temporary file."""
    import tempfile
    out, _ = _damage_copy(finished, tmp_path)
    for name in ("tiny.md", "tiny-syn-4.png"):
        (out / name).write_bytes(b"the previous " + name.encode())
    real, made = tempfile.mkstemp, []

    def mkstemp(*args, **kwargs):  # the second temporary file (the report's) is on a full disk
        fd, path = real(*args, **kwargs)
        made.append(path)
        if len(made) == 2:
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, path
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(OSError) as caught:
        call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables())
    assert caught.value.filename == str(out / "tiny.md") and caught.value.errno == 28
    assert {n: (out / n).read_bytes() for n in ("tiny.md", "tiny-syn-4.png")} == \
        {n: b"the previous " + n.encode() for n in ("tiny.md", "tiny-syn-4.png")}
    assert _tmp_files(out) == []


@pytest.mark.slow  # a report in a subprocess (torch's start-up), then one in this process: about 15 s
def test_a_report_killed_mid_write_keeps_its_files_and_the_next_report_clears_up(finished, tmp_path, capsys):
    out, _ = _damage_copy(finished, tmp_path)
    for name in ("tiny.md", "tiny-syn-4.png"):
        (out / name).write_bytes(b"the previous " + name.encode())
    tables = ("from tools import paper_tables; import json, signal; paper_tables.TABLES.clear(); "
              "paper_tables.TABLES.update(json.loads(os.environ['TABLES']))\n"
              "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", "import os, sys; sys.path.insert(0, os.environ['ROOT'])\n" + tables
                           + "sys.argv = sys.argv[1:]; import runpy; runpy.run_path(sys.argv[0], run_name='__main__')\n",
                           os.path.join(ROOT, "tools", "reproduce.py"), "tiny", "--seeds", *SEEDS, "--out", str(out),
                           "--report"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ROOT": ROOT, "TABLES": json.dumps(tiny_tables())})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = [n for n in os.listdir(out) if n.startswith(".tmp-report-")]
    assert len(left) == 2 and (out / "tiny.md").read_bytes() == b"the previous tiny.md"
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    assert capsys.readouterr().err.count("(left by a killed report)") == 2
    assert [n for n in os.listdir(out) if n.startswith(".tmp")] == []
    assert (out / "tiny.md").read_text().startswith("# tiny: ") and (out / "tiny-syn-4.png").read_bytes()[:4] == \
        b"\x89PNG"


# ----------------------------------------------------------------------------------------- issue 89

def _run_folder(seed_dir, name, started_utc, state="resumable"):
    """A run folder as a script leaves it, with the config.json fields run_folders checks, and the start time
    it recorded (None: a run made before config.json recorded it); ``state``: resumable (a checkpoint) or
    stale."""
    folder = os.path.join(seed_dir, name)
    os.makedirs(folder)
    config = {"algorithm": "fedavg", "script": "fedavg", "args": {"rounds": 2, "seed": 0, "dataset": "synthetic"}}
    if started_utc:
        config["started_utc"] = started_utc
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    if state == "resumable":
        open(os.path.join(folder, "checkpoint.pt"), "wb").close()
    return folder


def test_a_seed_folder_s_run_is_the_one_started_last_whatever_its_name(tmp_path):
    """The clock went back an hour between two runs in one seed folder (summer time ended): the newer run's
    folder name sorts first. run_folders orders them by the UTC start their config.json recorded, and
    current_run takes the newer of two as far along; runs that recorded none go by their names' time."""
    job = jobs_of(tiny_tables(), tmp_path)[0]
    older = _run_folder(job["dir"], "fedavg-synthetic-s0-20261025-023000", "2026-10-25T00:30:00Z")
    newer = _run_folder(job["dir"], "fedavg-synthetic-s0-20261025-020000", "2026-10-25T01:00:00Z")
    assert reproduce.run_folders(job["dir"]) == [older, newer]
    assert reproduce.current_run(job) == (newer, "resumable")
    assert reproduce.action(job) == ("resume", newer)
    before = _run_folder(job["dir"], "fedavg-synthetic-s0-20000101-000000", None)  # older, by its name
    assert reproduce.run_folders(job["dir"]) == [before, older, newer]


@pytest.mark.parametrize("stdout, why", [("/dev/full", "No space left on device"), (None, "it is closed")])
def test_a_report_that_cannot_be_printed_ends_in_one_line_naming_standard_output(stdout, why, tmp_path):
    """python tools/reproduce.py TABLE --report > /dev/full, and with stdout closed: one line naming what could
    not be written, status 1; the report's file is written all the same."""
    out = tmp_path / "out"
    with open(stdout or os.devnull, "w") as sink:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "reproduce.py"), "synthetic", "--report",
                               "--out", str(out)], stdout=sink, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              timeout=120, preexec_fn=None if stdout else lambda: os.close(1))
    assert proc.returncode == 1 and proc.stderr == f"error: cannot write to standard output ({why})\n", proc.stderr
    assert (out / "synthetic.md").read_text().startswith("# synthetic: ")


class _FullStdout:
    """A standard output on a full disk, as ``> /dev/full`` is."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass


def test_the_runs_lines_that_cannot_be_printed_leave_the_table_going(finished, tmp_path, monkeypatch, capsys):
    """Running a table with a full stdout: one line on stderr says so once, the table goes on to its report
    (written to its file), and it ends with status 1."""
    out, _ = _damage_copy(finished, tmp_path)
    os.remove(out / "tiny.md")
    monkeypatch.setattr(sys, "stdout", _FullStdout())
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tiny_tables()) == 1
    err = capsys.readouterr().err
    assert err == ("error: cannot write to standard output (No space left on device); the runs go on (each one's "
                   "lines are in its run.log)\n"), err
    assert (out / "tiny.md").read_text().startswith("# tiny: ")


def test_the_temporary_file_of_reproduce_json_a_kill_left_is_removed_by_the_next_run(finished, tmp_path, capsys):
    """tools/reproduce.py killed with kill -9 while it writes a run's reproduce.json leaves the temporary file
    beside it (and reproduce.json as it was); the next run of the table removes it and says so."""
    out, folder = _damage_copy(finished, tmp_path)
    seed_dir = os.path.dirname(folder)
    summary = os.path.join(folder, "summary.json")
    os.rename(summary, summary + ".aside")  # a run to continue: reproduce.py records its launch first
    launches = open(os.path.join(seed_dir, "reproduce.json"), "rb").read()
    code = ("import json, os, runpy, signal, sys; sys.path.insert(0, os.environ['ROOT']); from tools import "
            "paper_tables; paper_tables.TABLES.clear(); paper_tables.TABLES.update(json.loads(os.environ['TABLES'])); "
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "  # kill -9 as the file takes its name
            "sys.argv = ['tools/reproduce.py', *sys.argv[1:]]; "
            "runpy.run_path(os.path.join(os.environ['ROOT'], 'tools', 'reproduce.py'), run_name='__main__')")
    killed = subprocess.run([sys.executable, "-c", code, "tiny", "--out", str(out), "--seeds", *SEEDS],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ROOT": ROOT, "TABLES": json.dumps(tiny_tables())})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (left,) = [n for n in os.listdir(seed_dir) if n.startswith(".tmp")]
    assert open(os.path.join(seed_dir, "reproduce.json"), "rb").read() == launches
    os.rename(summary + ".aside", summary)  # finished again: the next run starts nothing
    assert call(["tiny", "--seeds", *SEEDS, "--out", out], tiny_tables()) == 0
    assert f"removed {os.path.join(seed_dir, left)} (left by a killed tools/reproduce.py)\n" in \
        capsys.readouterr().err
    assert [n for d, _, names in os.walk(out) for n in names if n.startswith(".tmp")] == []


FORGED = "x\n| forged | row |\x1b\x00"  # a newline, pipes and control characters
FORGED_NAME = FORGED.rstrip("\x00")  # a file name holds no NUL


def _seen(cell):
    """A markdown cell as a reader sees it: each backslash escape of punctuation undone (GitHub's markdown)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", cell)


def _without_cpu_records(folder):
    _edit_json(folder, "config.json", lambda c: (c.pop("cpu_model"), c["args"].pop("threads")))
    _edit_json(os.path.dirname(folder), "reproduce.json", lambda r: r["launches"][-1].pop("cpu"))


RECORDED_FIELDS = [  # (name, what is forged in FedAvg's seed-0 run, the column of its report row that shows it)
    ("config.json cpu_model", lambda d: _edit_json(d, "config.json", lambda c: c.update(cpu_model=FORGED)), 9),
    ("config.json device_name of a GPU", lambda d: _edit_json(d, "config.json", lambda c: c.update(
        device="cuda:0", device_name=FORGED)), 9),
    ("config.json device_name alone", lambda d: (_without_cpu_records(d), _edit_json(
        d, "config.json", lambda c: c.update(device_name=FORGED))), 9),
    ("config.json continued_on", lambda d: _edit_json(d, "config.json", lambda c: c.update(continued_on=[
        {"from_round": 2, "device": "cuda:0", "device_name": FORGED},
        {"from_round": 3, "device": "cpu", "cpu_model": FORGED}])), 9),
    ("reproduce.json cpu", lambda d: (_without_cpu_records(d), _edit_json(
        os.path.dirname(d), "reproduce.json", lambda r: r["launches"][-1].update(cpu=FORGED))), 9),
    ("summary.json status", lambda d: _edit_json(d, "summary.json", lambda s: s.update(status=FORGED)), 10),
    ("summary.json algorithm", lambda d: _edit_json(d, "summary.json", lambda s: s.update(algorithm=FORGED)), 10),
    ("summary.json a metric's name", lambda d: _edit_json(d, "summary.json", lambda s: s.update(
        {FORGED: {"best": "-", "final": 1.0, "last10_mean": 1.0}})), 10),
    ("a run folder's name", lambda d: shutil.copytree(d, os.path.join(os.path.dirname(d), FORGED_NAME)), 10),
    ("a stale run folder's name", lambda d: shutil.copytree(
        d, os.path.join(os.path.dirname(d), "0" + FORGED_NAME),
        ignore=shutil.ignore_patterns("summary.json", "checkpoint.pt")), 10),
]


@pytest.mark.parametrize("name, forge, column", RECORDED_FIELDS, ids=[c[0] for c in RECORDED_FIELDS])
def test_a_newline_pipe_or_control_character_in_any_recorded_field_keeps_the_report_s_rows(
        name, forge, column, finished, tmp_path, capsys):
    """Every column of the report passes through compare.one_line once: a recorded field holding a newline,
    pipes and control characters leaves the report with as many lines and rows as before, and a reader sees
    the value in its cell, escaped once."""
    out, folder = _damage_copy(finished, tmp_path)
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    before = capsys.readouterr().out
    forge(folder)
    assert call(["tiny", "--seeds", *SEEDS, "--out", out, "--report"], tiny_tables()) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) == len(before.splitlines()), text
    assert len([ln for ln in text.splitlines() if ln.startswith("|")]) == 4  # header, rule, FedAvg, FedALA
    assert not any(c in text for c in "\x1b\x00")
    assert sorted(table_rows(text)) == ["FedALA", "FedAvg"]
    cell = table_rows(text)["FedAvg"][column]
    assert compare.one_line(FORGED if "name" not in name else FORGED_NAME) in _seen(cell), cell
