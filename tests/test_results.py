"""Every reference run committed under results/ can be checked by anyone: its own config.json command, run
as it stands for its first 4 rounds in a process whose environment says OMP_NUM_THREADS=2 (not the one
thread the runs were made with: the command's --threads decides), gives the committed metrics.csv rows bit
for bit (timing and memory columns aside). Only where the data lies, the rounds, the device and the output
folder are given after it. Fashion-MNIST is read where test_real_data finds it. The quick-look runs record
no thread count (no reproduce.json was kept), so they run at the one thread their rows were checked at.
One subprocess per run (measured on the busy 2-core machine here: 9 synthetic runs in 325 s; a
Fashion-MNIST pFedLA run 4 rounds in about 400 s); ``-k synthetic`` or ``-k fmnist`` picks a part."""
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, metrics_rows, run_dir
from test_real_data import fmnist_dir  # noqa: F401  the fixture

pytestmark = pytest.mark.slow
RUNS = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "results", "**", "config.json"), recursive=True))
TIMING = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}
ROUNDS = 4


@pytest.mark.parametrize("folder", RUNS, ids=[os.path.relpath(f, os.path.join(ROOT, "results")) for f in RUNS])
def test_a_committed_run_s_command_repeats_its_first_rounds_at_another_omp_num_threads(folder, tmp_path, request):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    # Fashion-MNIST where test_real_data finds it (skipped without it, a failure under CI)
    data_dir = request.getfixturevalue("fmnist_dir") if config["args"]["dataset"] == "fmnist" else \
        config["args"]["data_dir"]
    script, *flags = config["command"]
    recorded = config["args"].get("threads")
    environment = "2" if recorded is not None else "1"  # the quick-look runs: see above
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *flags, "--rounds", str(ROUNDS), "--device",
                           "cpu", "--data-dir", data_dir, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": environment, "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    again, committed = metrics_rows(run_dir(tmp_path)), metrics_rows(folder)[:ROUNDS]
    columns = [c for c in committed[0] if c not in TIMING]
    assert len(again) == len(committed) and [[r[c] for c in columns] for r in again] == [[r[c] for c in columns]
                                                                                     for r in committed]
