"""tools/reproduce.py's report when one seed of a row is taken past the others (a run continued toward the
table's length): every seed is counted to the round all of them reached, and the column at the table's length
shows what the longer run reached, beside the paper's number."""
import csv
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "results", "pfllib-fmnist")


def report(out):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "reproduce.py"), "pfllib-fmnist", "--out",
                           str(out), "--report"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def row(text, cell, method):
    lines = [line for line in text.splitlines() if line.startswith(f"| {cell} | {method} |")]
    assert len(lines) == 1, text
    return [c.strip() for c in lines[0].strip("|").split(" | ")]


def header(text):
    line = next(line for line in text.splitlines() if line.startswith("| cell |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def copy_table(out, rounds=100):
    """The committed table's small files, each run's metrics.csv cut to its first ``rounds`` rounds."""
    shutil.copytree(TABLE, out / "pfllib-fmnist")
    for path in (out / "pfllib-fmnist").rglob("metrics.csv"):
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[:1 + rounds]))


def extend(folder, rounds, value):
    """Add evaluations after the last round of the run folder's metrics.csv, each with test_acc ``value``."""
    (path,) = [os.path.join(folder, d, "metrics.csv") for d in os.listdir(folder)
               if os.path.isfile(os.path.join(folder, d, "metrics.csv"))]
    with open(path, newline="") as f:
        table = list(csv.DictReader(f))
    last = table[-1]
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(last))
        for r in range(int(last["round"]) + 1, int(last["round"]) + 1 + rounds):
            writer.writerow({**last, "round": r, "test_acc": value,
                             "seconds": float(last["seconds"]) * r / int(last["round"])})


@pytest.mark.slow
def test_a_seed_taken_further_is_counted_to_the_common_round(tmp_path):
    out = tmp_path / "out"
    copy_table(out)
    before = report(out)
    assert "ours at 2000" not in header(before)  # no seed past the others: the report as before

    extend(out / "pfllib-fmnist" / "dir" / "fedavg" / "seed0", 20, 99.25)
    after = report(out)
    columns = header(after)
    assert columns[6] == "ours at 2000"
    old, new = row(before, "dir", "FedAvg"), row(after, "dir", "FedAvg")
    assert new[3] == old[3] and new[4] == "3"  # ours: every seed at round 100, the longer one too
    assert new[6] == "seed 0: 99.25 at round 120"  # its best so far, past round 100
    assert new[columns.index("rounds")] == "100/2000"
    notes = new[columns.index("notes")]
    assert "seed 0: counted to round 100 as the others (it ran to 120)" in notes
    assert "slope over rounds 81-100" in notes  # the slope at the common round, not over rounds 101-120
    assert row(after, "dir", "FedALA")[6] == "-"  # no seed of it ran further
    assert [c for i, c in enumerate(row(after, "pat", "FedAvg")) if i != 6] == row(before, "pat", "FedAvg")


@pytest.mark.slow
def test_the_column_averages_the_seeds_that_reached_the_tables_length(tmp_path):
    out = tmp_path / "out"
    copy_table(out)
    seeds = out / "pfllib-fmnist" / "pat" / "fedpake"
    extend(seeds / "seed0", 1900, 80.0)
    extend(seeds / "seed1", 1900, 82.0)
    text = report(out)
    fedpake = row(text, "pat", "FedPake")
    assert fedpake[6] == "81.00 ± 1.41 (n = 2)"  # seeds 0 and 1 at round 2000; seed 2 at 100 is not in it
    assert fedpake[4] == "3"
