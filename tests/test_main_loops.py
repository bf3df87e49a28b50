"""Each script's own main(): its real round loop, run on tiny synthetic data with partial participation
(--join-ratio 0.6 of 5 clients of unequal size), --local-epochs 2 and 2 rounds, against a plain
re-implementation here: the clients sampled by the same rules (numpy's choice without replacement from
the generator seeded [seed, 1]; batch orders from SeedSequence([seed, round, client, tag])), each trained
by a plain SGD loop, the server's step written from the paper's equation, every client's test data
evaluated by hand. The run's metrics.csv and the model state its last checkpoint holds (the run's
result, never the expected value) must equal the re-implementation's.

Tolerances: local training here is float32 in the scripts' arithmetic order (forward, cross-entropy,
autograd, p - lr g), so a client trained from the same model gives the same bits; the server's step is
summed here in float64 in another order than the scripts' float32 matmul, which leaves the models within
a few float32 ulps after two rounds (measured max abs difference of the parameters: below 1e-6);
accuracies count samples, so they must be equal, and losses agree to 1e-5."""
import csv
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import common
import fedacd
import fedala
import fedavg
import fedpake
import pfedla
from conftest import run_dir, run_in_process
from tools import fedacd_diagnostics, fedavg_variants

SETTING = ["--dataset", "synthetic", "--num-clients", "5", "--join-ratio", "0.6", "--local-epochs", "2",
           "--rounds", "2", "--model", "mlp", "--lr", "0.05", "--device", "cpu", "--seed", "3"]
PARAMS_ATOL, LOSS_TOL = 1e-5, 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the plain re-implementation

def sampled(rng, num_clients, join_ratio):
    """FedAvg's Alg. 1: max(1, round(C K)) clients, uniformly without replacement (listed in increasing order)."""
    return sorted(int(c) for c in rng.choice(num_clients, max(1, int(round(join_ratio * num_clients))),
                                             replace=False))


def seed_of(seed, round_, client, tag=0):
    return int(np.random.SeedSequence([seed, round_, client, tag]).generate_state(1)[0])


def minibatches(idx, batch_size, epochs, seed):
    """Per epoch, the index batches of a fresh permutation; a last batch of one sample joins the one before."""
    shuffle, out = torch.Generator().manual_seed(seed), []
    for _ in range(epochs):
        order = idx[torch.randperm(len(idx), generator=shuffle)]
        cuts = list(range(0, len(idx), batch_size))
        if len(cuts) > 1 and len(idx) - cuts[-1] == 1:
            cuts.pop()
        out.append([order[a:b] for a, b in zip(cuts, cuts[1:] + [len(idx)])])
    return out


def sgd(model, loss, lr):
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p.add_(g, alpha=-lr)


def train_plain(model, start, data, idx, epochs_of_batches, lr):
    """Cross-entropy SGD from the flat model ``start``: (trained flat model, mean minibatch loss)."""
    vector_to_parameters(start.clone(), model.parameters())
    losses = []
    for epoch in epochs_of_batches:
        for b in epoch:
            loss = F.cross_entropy(model(data.x[b]), data.y[b])
            sgd(model, loss, lr)
            losses.append(float(loss.detach()))
    return parameters_to_vector(model.parameters()).detach().clone(), sum(losses) / len(losses)


def weighted_mean(rows, weights):
    """sum_k w_k theta_k / sum_k w_k, summed in float64."""
    weights = [float(w) for w in weights]
    total = sum(w * row.double() for w, row in zip(weights, rows))
    return (total / sum(weights)).float()


@torch.no_grad()
def evaluated(model, flat, data, client):
    """(correct, count, summed loss) of the flat model on the client's test data."""
    vector_to_parameters(flat.clone(), model.parameters())
    idx = data.test_idx[client]
    logits = model(data.x[idx])
    return (int((logits.argmax(1) == data.y[idx]).sum()), len(idx),
            float(F.cross_entropy(logits.double(), data.y[idx], reduction="sum")))


def accuracy(results, prefix="test"):
    """Pooled accuracy, the mean and (population) std over clients of their accuracies, the mean loss (%)."""
    correct, count, loss = (np.array([r[i] for r in results], dtype=np.float64) for i in range(3))
    per_client = correct / count
    return {f"{prefix}_acc": 100 * correct.sum() / count.sum(), f"{prefix}_acc_mean": 100 * per_client.mean(),
            f"{prefix}_acc_std": 100 * per_client.std(), f"{prefix}_loss": loss.sum() / count.sum()}


def setup(module, flags):
    """The run's flags as the script parses them, its data and its initial model (torch seeded with --seed
    before the data, as the scripts do)."""
    args = module.parse_args([*SETTING, *flags])
    torch.manual_seed(args.seed)
    data = common.load_federated_data(args, "cpu")
    model = common.build_model(args.model, data)
    return args, data, model, np.random.default_rng([args.seed, 1])


def run(script, flags, tmp_path):
    """The script's own main(argv) in this process; returns (metrics.csv rows as floats, the last checkpoint)."""
    out = tmp_path / script.replace("/", "_")
    assert run_in_process(script, *SETTING, *flags, "--out", out) == 0
    folder = run_dir(out)
    with open(os.path.join(folder, "metrics.csv")) as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return rows, torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)


def assert_rows(rows, expected):
    """The run's metrics equal the re-implementation's: accuracies exactly (they count samples; metrics.csv rounds
    to 6 decimals), losses to LOSS_TOL."""
    assert [int(r["round"]) for r in rows] == list(range(1, len(expected) + 1))
    for row, want in zip(rows, expected):
        for column, value in want.items():
            if "acc" in column:  # metrics.csv keeps 6 decimals
                assert row[column] == round(float(value), 6), (int(row["round"]), column)
            else:
                assert row[column] == pytest.approx(value, abs=LOSS_TOL, rel=LOSS_TOL), (int(row["round"]), column)


def assert_model(state_dict, flat):
    got = torch.cat([v.reshape(-1) for v in state_dict.values() if v.is_floating_point()])
    assert got.shape == flat.shape
    assert (got - flat).abs().max() <= PARAMS_ATOL


# ----------------------------------------------------------------------------- FedAvg and its variants

def fedavg_reference(flags=(), local_training=False, eval_local_models=False):
    args, data, model, rng = setup(fedavg, flags)
    global_ = parameters_to_vector(model.parameters()).detach().clone()
    local = [global_.clone() for _ in range(args.num_clients)]
    rows = []
    for round_ in (1, 2):
        clients = sampled(rng, args.num_clients, args.join_ratio)
        trained, losses = {}, []
        for c in clients:
            start = local[c] if local_training else global_
            trained[c], loss = train_plain(model, start, data, data.train_idx[c],
                                           minibatches(data.train_idx[c], args.batch_size, args.local_epochs,
                                                       seed_of(args.seed, round_, c)), args.lr)
            losses.append(loss)
        if local_training:
            for c in clients:
                local[c] = trained[c]
            row = accuracy([evaluated(model, local[c], data, c) for c in range(args.num_clients)])
        else:  # McMahan et al. Alg. 1: w <- sum_k n_k / n w^k
            global_ = weighted_mean([trained[c] for c in clients], [len(data.train_idx[c]) for c in clients])
            row = accuracy([evaluated(model, global_, data, c) for c in range(args.num_clients)])
        if eval_local_models:
            row.update(accuracy([evaluated(model, trained[c], data, c) for c in clients], prefix="local_model"))
        rows.append({**row, "train_loss": sum(losses) / len(losses)})
    return rows, global_, local


def test_fedavg_main_samples_trains_averages_by_sample_count_and_evaluates(tmp_path):
    rows, checkpoint = run("fedavg.py", [], tmp_path)
    expected, global_, _ = fedavg_reference()
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)


def test_fedavg_variants_local_training_keeps_each_client_s_model_and_evaluates_it_on_its_own_data(tmp_path):
    rows, checkpoint = run("tools/fedavg_variants.py", ["--local-training"], tmp_path)
    expected, _, local = fedavg_reference(local_training=True)
    assert_rows(rows, expected)
    assert (checkpoint["state"]["local_models"] - torch.stack(local)).abs().max() <= PARAMS_ATOL


def test_fedavg_variants_eval_local_models_evaluates_the_round_s_trained_models(tmp_path):
    rows, checkpoint = run("tools/fedavg_variants.py", ["--eval-local-models"], tmp_path)
    expected, global_, _ = fedavg_reference(eval_local_models=True)
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)
