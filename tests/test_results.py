"""Every reference run committed under results/ can be checked by anyone: its own config.json command, run
as it stands for its first rounds in a process whose environment says OMP_NUM_THREADS=2 (not the one
thread the runs were made with: the command's --threads decides), gives the committed metrics.csv rows bit
for bit (timing and memory columns aside). Only where the data lies, the rounds, the device and the output
folder are given after it. Fashion-MNIST is read where test_real_data finds it. CI's sample holds only runs CI
can repeat (CPU-made, no PFLlib folder: not_repeatable_in_ci).
One subprocess per run. The default suite (CI) checks a fixed SAMPLE, 2 rounds each (1 where the run's
first round took SLOW_ROUND seconds or more when it was made): one run of every table and of every script
(sample_of); the whole re-check, every run's first 4 rounds, is
``python -m pytest tests/test_results.py --recheck-all`` (about an hour on 2 cores; run it before committing
a run); ``-k synthetic`` or ``-k fmnist`` picks a part.

Bit for bit holds on the CPU kind a run was made on (torch's CPU capability: AVX2, AVX512, ...; and the CPU
model with its family and model numbers: config.json records them as ``cpu_capability`` and ``cpu_model``
since they were added): the vector width and blocking of torch's kernels change the order of float sums, and
runs made on an earlier machine, its model name also "AMD EPYC", give other last digits on this one. A run
made before that record, or on another CPU kind, is checked to the first rounds within SYNTHETIC_DRIFT or
FMNIST_DRIFT instead (measured across the kinds we have; the communication columns exactly), and says so.
Measured on this project's AVX2 machine against runs made on an earlier machine: round 3 of the pFedLA Table 1
Fashion-MNIST run gives 54.476 against the committed 54.286, a synthetic pFedLA test loss 2.164053 against
2.164052 (also with the code of the commit that made it); the rounds before agree bit for bit. A run made on a GPU
(config.json's device) is skipped: a CPU does not repeat GPU arithmetic, and CI has no GPU. A run
continued on another machine (config.json's ``continued_on``) is checked bit for bit up to the round
it moved at, within SYNTHETIC_DRIFT or FMNIST_DRIFT after it."""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, metrics_rows, run_dir
from run_folder import cpu_model
from tools.run_records import MOVED, todays_command
from test_real_data import fmnist_dir  # noqa: F401  the fixture

pytestmark = pytest.mark.slow
RESULTS = os.path.join(ROOT, "results")
RUNS = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(RESULTS, "**", "config.json"), recursive=True))
TIMING = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}
ROUNDS, SAMPLE_ROUNDS = 4, 2
SLOW_ROUND = 10.0  # s: a sampled run this slow (Fashion-MNIST, ten local epochs) checks its first round only
EXACT = {"round", "mb_down", "mb_up"}
# A run made on another CPU kind, within these of the committed rows (the communication columns exactly).
# Synthetic data: the accuracy columns exactly, the others to one unit of metrics.csv's 6th decimal. Measured:
# the first 4 rounds of 15 synthetic runs (every synthetic/synthetic-1-1 and synthetic-sweep/0-0 algorithm at
# seed 0) made on an AMD EPYC (cpu family 25, model 1, AVX2) and rerun on an Intel Xeon (cpu family 6, model
# 167, AVX512): every accuracy column equal, train_loss 1e-6 apart in 2 runs, test_loss 1e-6 in 1, the rest 0.
SYNTHETIC_DRIFT = 1e-6
# Fashion-MNIST (the CNNs' convolutions sum in another order on another kind): accuracy columns 0.5 points
# absolute, the others 5e-4 relative. Measured on the same Intel Xeon against runs made on AMD EPYCs of cpu
# families 23 and 25 (CI's four Fashion-MNIST samples at the rounds CI checks, and pfedla-t1's pFedLA seed 0):
# round 1 accuracies equal, losses within 8e-6; round 2 test_acc 0.11 apart (one test image of 900),
# test_acc_std 0.40, train_loss 3.0e-4 (2.9e-4 relative), test_loss 2.4e-4 (1.4e-4 relative).
FMNIST_DRIFT = (0.5, 5e-4)
HERE = torch.backends.cpu.get_cpu_capability()
HERE_MODEL = cpu_model()


def within_drift(column, again, committed, dataset):
    a, c = float(again), float(committed)
    if column in EXACT:
        return a == c
    if dataset.startswith("synthetic"):
        return a == c if "acc" in column else abs(a - c) <= SYNTHETIC_DRIFT * (1 + 1e-9)
    if "acc" in column:
        return abs(a - c) <= FMNIST_DRIFT[0]
    return abs(a - c) <= FMNIST_DRIFT[1] * max(abs(c), 1e-3)


def drift_of(dataset):
    return f"synthetic: accuracies exact, others {SYNTHETIC_DRIFT}" if dataset.startswith("synthetic") else \
        f"accuracies {FMNIST_DRIFT[0]} points, others {FMNIST_DRIFT[1]:.0e} relative"


def read_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


SCRIPTS = {"fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py", "tools/fedavg_variants.py",
           "tools/fedacd_diagnostics.py"}
# scripts no committed run of which CI can repeat (none: tools/fedacd_diagnostics.py's Table 9 run was made on a
# GPU, and results/quick-look/fedacd-diagnostics-fedavg-synthetic-10-rounds is its CPU run): the coverage test
# fails once a script's runs are committed and none is sampled
NO_RUN_CI_CAN_REPEAT = set()


def table_of(folder):
    return os.path.relpath(folder, RESULTS).split(os.sep)[0]


def script_of(config):
    """The program that runs the run's command today (a flag that moved to tools/: MOVED)."""
    return todays_command(config["command"])[0]


def not_repeatable_in_ci(config):
    """Why CI (CPU only, offline, Debian's Fashion-MNIST; .ci/run) cannot repeat a run, else None: a run made on a
    GPU, or one on a PFLlib dataset folder (made by PFLlib's generator, not in CI)."""
    if str(config.get("device", "cpu")).startswith("cuda"):
        return (f"made on a GPU ({config.get('device_name')}): a CPU does not repeat GPU arithmetic (README: which "
                "guarantees hold on which device)")
    if os.sep in config["args"]["dataset"]:
        return "a PFLlib dataset folder: PFLLIB_DATA_DIR (the folder holding FashionMNIST-dir and -pat) not given"
    return None


def sample_of(runs):
    """One run CI can repeat (not_repeatable_in_ci) of each table (results/TABLE/...) and of each script: table
    by table, the first run whose script no earlier pick has, else the table's first run; then the first run of
    each script still missing. Synthetic runs first within a table (seconds where Fashion-MNIST takes a minute), then
    by folder (an algorithm's own folder before its variants': fedpake/ before fedpake-kappa-inf/)."""
    configs = {f: read_config(f) for f in runs}
    repeatable = [f for f in runs if not_repeatable_in_ci(configs[f]) is None]
    repeatable.sort(key=lambda f: (table_of(f), not configs[f]["args"]["dataset"].startswith("synthetic"),
                                   f.split(os.sep)))  # by folder: fedacd/ before fedacd-uniform-agg/
    chosen, scripts = [], set()
    for name in dict.fromkeys(table_of(f) for f in repeatable):
        in_table = [f for f in repeatable if table_of(f) == name]
        pick = next((f for f in in_table if script_of(configs[f]) not in scripts), in_table[0])
        chosen.append(pick)
        scripts.add(script_of(configs[pick]))
    for f in repeatable:
        if script_of(configs[f]) not in scripts:
            chosen.append(f)
            scripts.add(script_of(configs[f]))
    return chosen


SAMPLE = sample_of(RUNS)


def sample_rounds(folder):
    """The rounds the default suite checks of a sampled run: SAMPLE_ROUNDS, or 1 where its first round took
    SLOW_ROUND seconds or more when it was made (metrics.csv's seconds)."""
    return 1 if float(metrics_rows(folder)[0].get("seconds") or 0) >= SLOW_ROUND else SAMPLE_ROUNDS


def test_the_sample_covers_every_table_and_script_with_runs_ci_repeats():
    """Every sampled run is one CI repeats (none would skip under CI=true: Fashion-MNIST missing there is a
    failure), every table that has such a run is sampled, and so is every script but those without one."""
    assert [os.path.relpath(f, RESULTS) for f in SAMPLE if not_repeatable_in_ci(read_config(f))] == []
    repeatable = [f for f in RUNS if not_repeatable_in_ci(read_config(f)) is None]
    assert {table_of(f) for f in SAMPLE} == {table_of(f) for f in repeatable}
    assert {script_of(read_config(f)) for f in SAMPLE} == SCRIPTS - NO_RUN_CI_CAN_REPEAT
    assert not NO_RUN_CI_CAN_REPEAT & {script_of(read_config(f)) for f in repeatable}
    assert len(SAMPLE) == len(set(SAMPLE)) <= len({table_of(f) for f in repeatable}) + len(SCRIPTS)


def test_a_sampled_run_ci_cannot_repeat_fails_the_coverage_test(monkeypatch):
    """The coverage test's own power: a sample holding a GPU-made run or a PFLlib-folder run fails it."""
    for f in RUNS:
        if not_repeatable_in_ci(read_config(f)):
            monkeypatch.setitem(globals(), "SAMPLE", SAMPLE[:-1] + [f])
            with pytest.raises(AssertionError):
                test_the_sample_covers_every_table_and_script_with_runs_ci_repeats()
    assert any(not_repeatable_in_ci(read_config(f)) for f in RUNS)


@pytest.mark.parametrize("folder", [f if f in SAMPLE else pytest.param(f, marks=pytest.mark.recheck) for f in RUNS],
                         ids=[os.path.relpath(f, RESULTS) for f in RUNS])
def test_a_committed_run_s_command_repeats_its_first_rounds_at_another_omp_num_threads(folder, tmp_path, request):
    config = read_config(folder)
    rounds = ROUNDS if request.config.getoption("--recheck-all") else sample_rounds(folder)
    # Fashion-MNIST where test_real_data finds it (skipped without it, a failure under CI)
    if str(config.get("device", "cpu")).startswith("cuda"):
        pytest.skip(not_repeatable_in_ci(config))
    data_dir = request.getfixturevalue("fmnist_dir") if config["args"]["dataset"] == "fmnist" else \
        config["args"]["data_dir"]
    dataset = config["args"]["dataset"]
    script, *flags = config["command"]
    if os.sep in dataset:  # a PFLlib folder, made by PFLlib's generator (docs/datasets.md): minutes a round on a CPU
        here = os.path.join(os.environ.get("PFLLIB_DATA_DIR", ""), os.path.basename(os.path.normpath(dataset)))
        if not os.environ.get("PFLLIB_DATA_DIR") or not os.path.isdir(here):
            pytest.skip("PFLLIB_DATA_DIR (the folder holding FashionMNIST-dir and -pat, docs/datasets.md) not given")
        flags = [here if f == dataset else f for f in flags]
        data_dir = os.environ["PFLLIB_DATA_DIR"]  # the command names it DIR (tools/data_paths.py), as the docs do
    # fedacd.py's diagnostics were written unasked before they took a flag: ask for them where the run has them
    if script == "fedacd.py":
        flags += [f for f, column in (("--log-risk", "local_risk"), ("--log-kl", "local_kl"))
                  if column in metrics_rows(folder)[0] and f not in flags]
    # fedpake.py's aggregation form as config.json records it (runs made before --aggregation ran "chunked")
    if script == "fedpake.py" and "--aggregation" not in flags:
        flags += ["--aggregation", config["args"]["aggregation"]]
    # a flag that left its script for tools/ since (tools/run_records.MOVED): the command runs there (docs/running.md)
    script, *flags = todays_command([script, *flags])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *flags, "--rounds", str(rounds), "--device",
                           "cpu", "--data-dir", data_dir, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    again, committed = metrics_rows(run_dir(tmp_path)), metrics_rows(folder)[:rounds]
    columns = [c for c in committed[0] if c not in TIMING]
    assert len(again) == len(committed)
    # bit for bit the rounds made on this CPU kind: up to a move to another machine (config.json's continued_on)
    moved_at = min([m["from_round"] for m in config.get("continued_on", [])], default=rounds + 1)
    exact_until = moved_at if (config.get("cpu_capability"), config.get("cpu_model")) == (HERE, HERE_MODEL) else 1
    pairs = list(zip(again, committed))
    assert [[a[c] for c in columns] for a, r in pairs if int(r["round"]) < exact_until] == \
        [[r[c] for c in columns] for a, r in pairs if int(r["round"]) < exact_until]
    drifted = [(r["round"], c, a[c], r[c]) for a, r in pairs if int(r["round"]) >= exact_until for c in columns
               if not within_drift(c, a[c], r[c], dataset)]
    assert not drifted, drifted
    if exact_until > rounds:
        return
    made = " ".join(str(config[k]) for k in ("cpu_capability", "cpu_model") if k in config) or "not recorded"
    print(f"made on CPU kind {made}, here {HERE} {HERE_MODEL}: checked within {drift_of(dataset)}")
