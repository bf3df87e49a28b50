"""Every reference run committed under results/ can be checked by anyone: its own config.json command,
re-run for its first rounds (on this machine's copy of the data), gives the committed metrics.csv rows
bit for bit (timing and memory columns aside)."""
import glob
import importlib
import json
import os

import pytest

import run_folder
from conftest import ROOT, metrics_rows, run_dir
from test_real_data import fmnist_dir  # noqa: F401  the fixture

pytestmark = pytest.mark.slow
RUNS = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "results", "**", "config.json"), recursive=True))
TIMING = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}
ROUNDS = 2


@pytest.mark.parametrize("folder", RUNS, ids=[os.path.relpath(f, os.path.join(ROOT, "results")) for f in RUNS])
def test_the_first_rounds_of_a_committed_run_repeat_exactly(folder, tmp_path, one_thread, request):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    # Fashion-MNIST where test_real_data finds it (skipped without it, a failure under CI)
    data_dir = request.getfixturevalue("fmnist_dir") if config["args"]["dataset"] == "fmnist" else \
        config["args"]["data_dir"]
    script, *flags = config["command"]
    # fedacd.py's diagnostics were written unasked before they took a flag: ask for them where the run has them
    if script == "fedacd.py":
        flags += [f for f, column in (("--log-risk", "local_risk"), ("--log-kl", "local_kl"))
                  if column in metrics_rows(folder)[0] and f not in flags]
    module = importlib.import_module(script.removesuffix(".py"))
    # the run's own command; where the data lies, the rounds, the device and the output folder aside
    run_folder.run_main(module.main, [*flags, "--rounds", str(ROUNDS), "--device", "cpu", "--data-dir", data_dir,
                                      "--out", str(tmp_path)])
    again, committed = metrics_rows(run_dir(tmp_path)), metrics_rows(folder)[:ROUNDS]
    columns = [c for c in committed[0] if c not in TIMING]
    assert len(again) == ROUNDS and [[r[c] for c in columns] for r in again] == [[r[c] for c in columns]
                                                                               for r in committed]
