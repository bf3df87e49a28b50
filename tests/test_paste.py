"""Each algorithm's paper pieces, cut out of its script's text (not imported: nothing of common.py
comes with them) and pasted into a minimal federated loop written here in plain torch, give the
script's own run bit for bit: the same final models (checkpoint.pt) and the same train losses
(metrics.csv), on FedProx's synthetic data with its seed. The loop is what a foreign framework has
already (sampling every client, seeded minibatch SGD, the sample-weighted mean); the glue around
each piece is the few lines marked ``# glue`` below.

The loop uses the project's seeding conventions (per-client seeds from numpy's SeedSequence, the
batch order of common.epoch_batches) so that the two runs can be compared; the data are the
script's own (datasets.load_federated_data, which needs no common.py)."""
import ast
import csv
import math
import os
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import datasets
from conftest import ROOT, run_dir, run_script

SEED = 0
TINY = ["--dataset", "synthetic", "--num-clients", "3", "--rounds", "2", "--join-ratio", "1.0",
        "--local-epochs", "1", "--batch-size", "16", "--seed", str(SEED), "--device", "cpu",
        "--parallel-clients", "1"]


def paste_pieces(script, *names):
    """The source of the top-level functions or classes ``names`` of ``script`` (and of the ones they
    call there), executed alone in a namespace holding only torch, nn, F, math and numpy: what a
    user gets by pasting them. Returns that namespace."""
    text = open(os.path.join(ROOT, script)).read()
    defs = {node.name: node for node in ast.parse(text).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name) and n.id in defs]
    namespace = {"torch": torch, "nn": nn, "F": F, "math": math, "np": np}
    for node in sorted((defs[name] for name in wanted), key=lambda node: node.lineno):
        exec(compile(ast.Module([node], []), script, "exec"), namespace)
    assert "common" not in namespace and "args" not in namespace
    return namespace


# ----------------------------------------------------------------------------- the foreign loop, plain torch

def client_seed(seed, round_, client, tag=0):
    return int(np.random.SeedSequence([seed, round_, client, tag]).generate_state(1)[0])


def epochs_of(idx, batch_size, epochs, seed):
    """Index minibatches per epoch, reshuffled each epoch; a last batch of one sample joins the one before."""
    g, n = torch.Generator().manual_seed(seed), len(idx)
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    for _ in range(epochs):
        perm = idx[torch.randperm(n, generator=g)]
        yield [perm[s:e] for s, e in zip(starts, starts[1:] + [n])]


def flat(model):
    return torch.cat([v.reshape(-1) for v in model.state_dict().values() if v.is_floating_point()])


def load(model, vector):
    """Copy ``vector`` into the model (an MLP: parameters only); not vector_to_parameters, which aliases."""
    with torch.no_grad():
        for p, v in zip(model.parameters(), vector.split([p.numel() for p in model.parameters()])):
            p.copy_(v.view_as(p))


def mlp(seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(60, 64), nn.ReLU(), nn.Linear(64, 10))  # the scripts' mlp on synthetic data


def sgd(model, lr, momentum=0.0, weight_decay=0.0):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def local_sgd(model, x, y, idx, epochs, batch_size, seed, optimizer):
    """FedAvg's ClientUpdate: minibatch SGD with cross-entropy. Returns the mean loss, summed step by step in
    float32 as the scripts sum it (a vectorised sum rounds otherwise on some CPUs: 1.909980 for 1.909979)."""
    model.train()
    total, steps = torch.zeros(()), 0
    for epoch in epochs_of(idx, batch_size, epochs, seed):
        for batch in epoch:
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            steps += 1
    return total / steps


def weighted_mean(stacked, weights):
    weights = torch.as_tensor(weights, dtype=stacked.dtype)
    return (weights / weights.sum()) @ stacked


def script_run(script, tmp_path, *flags):
    """The script's own run on TINY: (data, final state from checkpoint.pt, train loss per round)."""
    result = run_script(script, *TINY, *flags, "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    folder = run_dir(tmp_path)
    state = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)["state"]
    with open(os.path.join(folder, "metrics.csv")) as f:
        losses = [float(r["train_loss"]) for r in csv.DictReader(f)]
    train_ratio = 0.7 if script == "pfedla.py" else 0.75
    args = types.SimpleNamespace(dataset="synthetic", seed=SEED, num_clients=3, train_ratio=train_ratio,
                                 test_split="global" if script == "fedacd.py" else "client")
    return datasets.load_federated_data(args, "cpu"), state, losses


def same_losses(ours, logged):
    assert [round(float(v), 6) for v in ours] == logged


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


# ----------------------------------------------------------------------------- the five algorithms

@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_fedavg_is_the_plain_loop(tmp_path):
    data, state, logged = script_run("fedavg.py", tmp_path)
    x, y, clients = data.x, data.y, range(3)
    global_model, worker, losses = mlp(SEED), mlp(), []
    for round_ in (1, 2):
        stacked, round_losses = [], []
        for c in clients:
            load(worker, flat(global_model))
            round_losses.append(float(local_sgd(worker, x, y, data.train_idx[c], 1, 16, client_seed(SEED, round_, c),
                                                sgd(worker, 0.005))))
            stacked.append(flat(worker))
        load(global_model, weighted_mean(torch.stack(stacked), [len(data.train_idx[c]) for c in clients]))
        losses.append(sum(round_losses) / 3)
    assert torch.equal(flat(global_model), torch.cat([v.reshape(-1) for v in state["global_model"].values()]))
    same_losses(losses, logged)


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_fedala_s_ala_pastes_into_the_loop(tmp_path):
    data, state, logged = script_run("fedala.py", tmp_path)
    ALA = paste_pieces("fedala.py", "ALA")["ALA"]
    x, y, clients = data.x, data.y, range(3)
    global_model, worker, losses = mlp(SEED), mlp(), []
    ala = ALA(global_model, 3, batch_size=16)  # glue: one object for all clients (p=1, eta=1, s=80, threshold 0.01)
    local_models = flat(global_model).repeat(3, 1)
    for round_ in (1, 2):
        round_losses = []
        for c in clients:
            idx = data.train_idx[c]
            if round_ == 1:
                load(worker, flat(global_model))
            else:  # glue: the old local model, then ALA with the client's generator
                load(worker, local_models[c])
                ala.initialise(c, global_model, worker, x[idx], y[idx],
                               torch.Generator().manual_seed(client_seed(SEED, round_, c, tag=1)))
            round_losses.append(float(local_sgd(worker, x, y, idx, 1, 16, client_seed(SEED, round_, c),
                                                sgd(worker, 0.005))))
            local_models[c] = flat(worker)
        load(global_model, weighted_mean(local_models, [len(data.train_idx[c]) for c in clients]))
        losses.append(sum(round_losses) / 3)
    assert torch.equal(local_models, state["local_models"])
    assert torch.equal(ala.weights, state["ala"]["weights"]) and ala.initial_stage == state["ala"]["initial_stage"]
    same_losses(losses, logged)


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_pfedla_s_hypernetworks_and_layerwise_aggregation_paste_into_the_loop(tmp_path):
    data, state, logged = script_run("pfedla.py", tmp_path, "--k", "1")  # HeurpFedLA: every piece
    pieces = paste_pieces("pfedla.py", "LayerHypernetworks", "layer_sizes", "flatten_state", "load_flat_state",
                          "aggregate_layerwise", "retained_layers", "with_retained_layers", "hypernetwork_step")
    flatten, load_flat = pieces["flatten_state"], pieces["load_flat_state"]  # the pieces' own flat layout
    x, y, clients = data.x, data.y, [0, 1, 2]
    model = mlp(SEED)
    sizes = pieces["layer_sizes"](model)  # glue: the layers, the stored models, the hypernetworks
    stored_models = flatten(model).repeat(3, 1)
    hypernetworks = pieces["LayerHypernetworks"](3, len(sizes), generator=torch.default_generator)  # after mlp(SEED)
    worker, losses = mlp(), []
    for round_ in (1, 2):
        alpha = hypernetworks(torch.tensor(clients))  # glue: Alg. 1 l. 5, Alg. 2 l. 6-7
        theta_bar = pieces["aggregate_layerwise"](alpha, stored_models, sizes)
        is_retained = pieces["retained_layers"](alpha.detach(), clients, 1)  # a plain list of ids
        received = pieces["with_retained_layers"](theta_bar.detach(), stored_models, clients, sizes, is_retained)
        trained, round_losses = [], []
        for i, c in enumerate(clients):
            load_flat(worker, received[i])
            round_losses.append(float(local_sgd(worker, x, y, data.train_idx[c], 1, 16, client_seed(SEED, round_, c),
                                                sgd(worker, 0.01))))
            trained.append(flatten(worker))
        trained = torch.stack(trained)
        pieces["hypernetwork_step"](hypernetworks, theta_bar, trained - received, 1.0)  # glue: l. 7-8
        stored_models[clients] = trained
        losses.append(sum(round_losses) / 3)
    assert torch.equal(stored_models, state["stored_models"])
    assert all(torch.equal(v, state["hypernetworks"][k]) for k, v in hypernetworks.state_dict().items())
    same_losses(losses, logged)
    with pytest.raises(ValueError, match="attached"):  # the precondition, stated and checked
        pieces["hypernetwork_step"](hypernetworks, theta_bar.detach(), trained - received, 1.0)


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_fedpake_s_aggregation_pastes_into_the_loop(tmp_path):
    data, state, logged = script_run("fedpake.py", tmp_path)
    fedpake_aggregate = paste_pieces("fedpake.py", "fedpake_aggregate")["fedpake_aggregate"]
    x, y, clients = data.x, data.y, range(3)
    global_model, worker, losses = mlp(SEED), mlp(), []
    high = []
    for round_ in (1, 2):
        stacked, round_losses = [], []
        for c in clients:
            load(worker, flat(global_model))
            round_losses.append(float(local_sgd(worker, x, y, data.train_idx[c], 1, 16, client_seed(SEED, round_, c),
                                                sgd(worker, 0.005))))
            stacked.append(flat(worker))
        stats = {}  # glue: FedAvg's mean replaced, one line
        load(global_model, fedpake_aggregate(torch.stack(stacked), [len(data.train_idx[c]) for c in clients],
                                             stats=stats))
        high.append(stats["high_fraction"])
        losses.append(sum(round_losses) / 3)
    assert torch.equal(flat(global_model), torch.cat([v.reshape(-1) for v in state["global_model"].values()]))
    assert min(high) > 0  # the reconstruction did work: H was not empty
    same_losses(losses, logged)


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_fedacd_s_losses_schedule_and_score_paste_into_the_loop(tmp_path):
    data, state, logged = script_run("fedacd.py", tmp_path)
    pieces = paste_pieces("fedacd.py", "fedacd_local_training", "aggregation_score", "aggregation_weights")
    x, y, clients = data.x, data.y, range(3)
    global_model, worker, losses = mlp(SEED), mlp(), []
    for round_ in (1, 2):
        stacked, scores, round_losses = [], [], []
        for c in clients:
            idx = data.train_idx[c]
            load(worker, flat(global_model))
            present = torch.bincount(y[idx], minlength=10) > 0  # glue: the client's classes, mixup, the update
            g = torch.Generator().manual_seed(client_seed(SEED, round_, c, tag=1))
            epochs = []
            for epoch in epochs_of(idx, 16, 1, client_seed(SEED, round_, c)):
                epochs.append([])
                for batch in epoch:
                    mix, perm = float(torch.rand((), generator=g)), torch.randperm(len(batch), generator=g)
                    epochs[-1].append((mix * x[batch] + (1 - mix) * x[batch][perm], y[batch], y[batch][perm], mix))
            loss, P = pieces["fedacd_local_training"](worker, sgd(worker, 0.01, 0.9, 1e-5), epochs,
                                                      lambda: [(x[idx], y[idx])], 10, present)
            scores.append(pieces["aggregation_score"](P, present, 1 - 1e-5, reduction="mean")[0])  # the script's
            round_losses.append(float(loss))
            stacked.append(flat(worker))
        weights = pieces["aggregation_weights"](torch.stack(scores))  # Eq. (11)
        load(global_model, weighted_mean(torch.stack(stacked), weights.float()))
        losses.append(sum(round_losses) / 3)
    assert torch.equal(flat(global_model), torch.cat([v.reshape(-1) for v in state["global_model"].values()]))
    same_losses(losses, logged)


def test_a_piece_that_reaches_for_common_fails_when_pasted(tmp_path):
    """The extraction proves something: a function that uses common.py cannot run pasted."""
    mixup_epochs = paste_pieces("fedacd.py", "mixup_epochs")["mixup_epochs"]
    with pytest.raises(NameError, match="common"):
        mixup_epochs(None, torch.arange(3), None, 0, 0)


def test_no_two_scripts_define_a_piece_of_the_same_name():
    """A name means one thing across the five files: only the scripts' common skeleton (parse_args, main,
    client_update, server_update) recurs; FedPake's nested stages count as its own names."""
    names = {}
    for script in ("fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py"):
        tree = ast.parse(open(os.path.join(ROOT, script)).read())
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        defined |= {inner.name for node in tree.body if isinstance(node, ast.FunctionDef)
                    for inner in node.body if isinstance(inner, ast.FunctionDef)}
        for name in defined:
            names.setdefault(name, []).append(script)
    shared = {name for name, scripts in names.items() if len(scripts) > 1}
    assert shared <= {"parse_args", "main", "client_update", "server_update", "resolve"}, shared
    assert "macro_classes" not in names and names["aggregation_weights"] == ["fedacd.py"]
