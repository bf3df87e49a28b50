"""The fast path stays fast: no model is built or deep-copied per client or per round, every
script trains several clients at once when asked to, and the benchmark still runs."""
import copy
import re

import pytest
import torch

import common
import fedacd
import fedala
import fedavg
import fedpake
import pfedla
from conftest import metrics_rows, run_dir, run_script

SCRIPTS = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "fedpake": fedpake, "fedacd": fedacd}


def count_model_copies(monkeypatch, tmp_path, module, rounds, clients, workers):
    """Runs ``module.main`` on synthetic data; returns (build_model calls, deepcopy calls)."""
    calls = {"build": 0, "deepcopy": 0}
    build, deepcopy = common.build_model, copy.deepcopy

    def counting_build(*a, **kw):
        calls["build"] += 1
        return build(*a, **kw)

    def counting_deepcopy(*a, **kw):
        calls["deepcopy"] += 1
        return deepcopy(*a, **kw)

    monkeypatch.setattr(common, "build_model", counting_build)
    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    out = tmp_path / f"r{rounds}c{clients}w{workers}"
    module.main(["--dataset", "synthetic", "--rounds", str(rounds), "--num-clients", str(clients),
                 "--parallel-clients", str(workers), "--out", str(out), "--checkpoint-every", "1000"])
    assert len(metrics_rows(run_dir(out))) == rounds
    monkeypatch.undo()
    return calls["build"], calls["deepcopy"]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_models_are_built_once_not_per_client_or_round(name, monkeypatch, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        small = count_model_copies(monkeypatch, tmp_path, SCRIPTS[name], rounds=1, clients=4, workers=2)
        large = count_model_copies(monkeypatch, tmp_path, SCRIPTS[name], rounds=3, clients=10, workers=2)
        one = count_model_copies(monkeypatch, tmp_path, SCRIPTS[name], rounds=1, clients=4, workers=1)
    finally:
        torch.set_num_threads(threads)
    assert small == large  # the same number of models for more rounds and more clients
    assert small[0] - one[0] == 1 and small[1] == 0  # one model per worker, no deep copies


@pytest.mark.slow  # end to end, tens of seconds: runs in CI with the full suite
def test_benchmark_prints_its_table_and_the_interleaved_ratios(tmp_path):
    r = run_script("tests/bench_round.py", "--only", "fedavg", "--samples", "300", "--num-clients", "4", "--rounds", "3",
                   timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("device: CPU")
    (line,) = [l for l in lines if l.startswith("fedavg ")]
    assert len(re.findall(r"\d+\.\d+x", line)) == 2, line  # against naive-image and naive-tensor
    assert re.search(r"FedAvg \(\d client\(s\) at a time\) against the straightforward loop: \d+\.\d\dx", r.stdout)
    assert re.search(r"FedALA / FedAvg round time after the initial stage: \d+\.\d\dx", r.stdout)
