"""The scripts read like their papers: the paper's pieces paste into torch-only code, functions
that cite an equation need neither common nor args, main() shows its loop over clients, every
flag shows its default, nothing cites a document our users do not have; and the refactor that
made them so changed no number."""
import ast
import copy
import csv
import inspect
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import common
import fedacd
import fedala
import fedavg
import fedpake
import pfedla
import run_folder
from conftest import ROOT, run_dir
from tools import fedacd_diagnostics

SCRIPTS = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "fedpake": fedpake, "fedacd": fedacd}


def paste(obj):
    """``obj``'s source alone, run in a namespace that holds only torch, nn, F, numpy and math."""
    namespace = {"torch": torch, "nn": nn, "F": F, "np": np, "numpy": np, "math": math}
    exec(inspect.getsource(obj), namespace)
    return namespace[obj.__name__]


def test_ala_pasted_alone_equals_ours():
    torch.manual_seed(0)
    global_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    local_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(30, 4), torch.randint(0, 3, (30,))
    pasted, ours = paste(fedala.ALA)(global_model, 3, p=2), fedala.ALA(global_model, 3, p=2)
    results = []
    for ala in (pasted, ours):
        local = copy.deepcopy(local_model)
        epochs = [ala.initialise(1, global_model, local, x, y, torch.Generator().manual_seed(r)) for r in range(3)]
        results.append((epochs, common.flatten_state(local), ala.weights.clone()))
    assert results[0][0] == results[1][0] and results[0][0][0] > 1  # the initial stage, then one epoch
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])


def test_fedpake_aggregate_pasted_with_its_stages_equals_ours_with_only_stacked_and_weights():
    """The driver and the top-level stages it calls, pasted as a user would copy them."""
    from test_paste import paste_pieces
    torch.manual_seed(0)
    stacked = torch.randn(7, 3000) * torch.rand(3000) + 0.05
    weights = [3, 1, 4, 1, 5, 9, 2]
    pasted = paste_pieces("fedpake.py", "fedpake_aggregate")["fedpake_aggregate"](stacked, weights)
    assert torch.equal(pasted, fedpake.fedpake_aggregate(stacked, weights))
    assert not torch.allclose(pasted, common.weighted_average(stacked, weights))  # not just FedAvg


def test_other_paper_pieces_paste_alone():
    torch.manual_seed(0)
    logits, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    delta = torch.rand(4, 4) + 0.5
    for piece in (fedacd.flattening_loss, fedacd.adjusted_margin_loss):
        args = (logits, y, delta) if piece is fedacd.adjusted_margin_loss else (logits, y)
        assert torch.equal(paste(piece)(*args), piece(*args))
    scores = torch.tensor([0.6, 0.7, 0.9], dtype=torch.float64)
    assert torch.equal(paste(fedacd.aggregation_weights)(scores), fedacd.aggregation_weights(scores))
    torch.manual_seed(1)
    pasted = paste(pfedla.LayerHypernetworks)(5, 3, 8, 8)
    torch.manual_seed(1)
    ours = pfedla.LayerHypernetworks(5, 3, 8, 8)
    assert torch.equal(pasted(torch.tensor([0, 3])), ours(torch.tensor([0, 3])))


def module_functions(module):
    tree = ast.parse(inspect.getsource(module))
    return [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


@pytest.mark.parametrize("name", SCRIPTS)
def test_functions_citing_an_equation_need_neither_common_nor_args(name):
    for node in module_functions(SCRIPTS[name]):
        source = ast.get_source_segment(inspect.getsource(SCRIPTS[name]), node)
        if "Eq." not in source:
            continue
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        assert not {"common", "args"} & used, f"{name}.{node.name} cites an equation but uses {used & {'common', 'args'}}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_main_shows_its_loop_over_clients_and_the_client_and_server_steps_are_functions(name):
    main = inspect.getsource(SCRIPTS[name].main)
    assert "for round_ in range(start, args.rounds + 1):" in main
    assert "pool.train(lambda model, client:" in main and "client_update(" in main
    assert "out=" not in main and "out" not in inspect.signature(SCRIPTS[name].client_update).parameters
    names = {node.name for node in module_functions(SCRIPTS[name])}
    assert "client_update" in names
    assert "server_update" in names or name == "fedala"  # FedALA's server step is FedAvg's average


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_every_default(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        SCRIPTS[name].parse_args(["--help"])
    options = capsys.readouterr().out.split("options:")[1].split("\n  -")[1:]
    missing = [o.split()[0] for o in options if "default" not in o and not o.startswith("h,")]
    assert not missing and len(options) >= 25


def test_no_file_cites_a_document_users_do_not_have_and_sizes_stay_readable():
    for name in os.listdir(ROOT):
        if name.endswith((".py", ".md")):
            assert "SPEC" not in open(os.path.join(ROOT, name)).read(), name
    assert sum(1 for _ in open(os.path.join(ROOT, "README.md"))) <= 250  # the rest is in docs/
    assert sum(1 for _ in open(os.path.join(ROOT, "common.py"))) <= 850


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_same_seed_gives_the_metrics_of_the_code_before_the_refactor(tmp_path):
    """tests/data/metrics_before_refactor.json: the metrics the scripts wrote before they were
    restructured into client_update / server_update (same flags, --parallel-clients 1)."""
    before = json.load(open(os.path.join(ROOT, "tests", "data", "metrics_before_refactor.json")))
    for name, rows in before.items():  # in-process: the command line's path, minus five start-ups
        main = fedacd_diagnostics.main if name == "fedacd" else SCRIPTS[name].main  # fedacd: with --log-risk
        run_folder.run_main(main, ["--dataset", "synthetic", "--num-clients", "5", "--rounds", "3",
                                   "--join-ratio", "0.6", "--local-epochs", "1", "--seed", "3",
                                   "--parallel-clients", "1", "--out", str(tmp_path / name),
                                   *(["--score-kl", "sum", "--log-risk"] if name == "fedacd" else []),
                                   *(["--threshold", "0.1"] if name == "fedala" else [])])
        with open(os.path.join(run_dir(tmp_path / name), "metrics.csv")) as f:
            now = list(csv.DictReader(f))
        assert len(now) == len(rows)
        for old, new in zip(rows, now):
            for key, value in old.items():
                assert float(new[key]) == pytest.approx(value, rel=1e-4, abs=1e-4), (name, key)
