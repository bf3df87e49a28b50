"""Each script's own main(): its real round loop, run on tiny synthetic data with partial participation
(--join-ratio 0.6 of 5 clients of unequal size), --local-epochs 2 and 2 rounds, against a plain
re-implementation here: the clients sampled by the same rules (numpy's choice without replacement from
the generator seeded [seed, 1]; batch orders from SeedSequence([seed, round, client, tag])), each trained
by a plain SGD loop, the server's step written from the paper's equation, every client's test data
evaluated by hand. The run's metrics.csv and the model state its last checkpoint holds (the run's
result, never the expected value) must equal the re-implementation's.

Tolerances: local training here is float32 in the scripts' arithmetic order (forward, cross-entropy,
autograd, p - lr g), so a client trained from the same model gives the same bits; the server's step is
summed here in float64 in another order than the scripts' float32 matmul, and FedACD's loss is written
in another form, which leaves the models a few float32 ulps apart after two rounds: measured on an Intel
Xeon (cpu family 6, model 167), the largest difference of a parameter 3.9e-6 (PARAMS_ATOL 1e-5), of a
loss column 2.8e-6 (LOSS_TOL 1e-5). Accuracies count samples, so they must be equal to metrics.csv's 6
decimals. tests/rounds.py, which other tests drive rounds with, is held to each main() bit for bit at
the end."""
import copy
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
           "--rounds", "2", "--model", "mlp", "--lr", "0.05", "--batch-size", "20", "--device", "cpu", "--seed", "3"]
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


def sgd(model, loss, lr, momentum=0.0, weight_decay=0.0, buffers=None):
    """One step of SGD with weight decay and (heavy-ball) momentum, torch.optim.SGD's rule: d = g + wd p,
    b = d (first step) or momentum b + d, p <- p - lr b; ``buffers`` (a list, empty at the client's start) keeps b."""
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for k, (p, g) in enumerate(zip(model.parameters(), grads)):
            d = g.add(p, alpha=weight_decay) if weight_decay else g
            if momentum:
                if len(buffers) <= k:
                    buffers.append(d.clone())
                else:
                    buffers[k].mul_(momentum).add_(d)
                d = buffers[k]
            p.add_(d, alpha=-lr)


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


def global_test(model, flat, data):
    """--test-split global: the model on the uniform test set (accuracy and mean loss, %)."""
    vector_to_parameters(flat.clone(), model.parameters())
    idx = data.global_test_idx
    with torch.no_grad():
        logits = model(data.x[idx])
    return {"global_acc": 100 * float((logits.argmax(1) == data.y[idx]).double().mean()),
            "global_loss": float(F.cross_entropy(logits.double(), data.y[idx]))}


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
    assert len({len(idx) for idx in data.train_idx}) == args.num_clients  # clients of unequal sizes
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


# ----------------------------------------------------------------------------- FedACD and its diagnostics

def class_mean_softmax(model, x, y, num_classes):
    """Sec. 3's P^m: P_ij the mean softmax output j over the samples of class i (zero rows for absent classes)."""
    with torch.no_grad():
        probs = model(x).softmax(1)
    sums = F.one_hot(y, num_classes).to(probs.dtype).T @ probs
    counts = sums.sum(1, keepdim=True)
    return torch.where(counts > 0, sums / counts.clamp_min(1e-12), torch.zeros_like(sums))


def margins_of(P, present, missing_delta):
    """Eq. (8)'s Delta_yi = P_yi / P_iy (clamped to >= 1e-8) for held classes i, ``missing_delta`` for the
    others, 1 on the diagonal."""
    D = torch.full_like(P, missing_delta)
    for y in range(len(P)):
        for i in range(len(P)):
            if i == y:
                D[y, i] = 1.0
            elif present[i]:
                D[y, i] = max(float(P[y, i]) / max(float(P[i, y]), 1e-8), 1e-8)
    return D


def fedacd_objective(logits, y, D, lam):
    """Eq. (9) per sample: L1 (Eq. 7, KL(p || q), q_y = p_y, q_k = (1 - p_y) / (C - 1)) + lam L2 (Eq. 8)."""
    C = logits.shape[1]
    p = logits.softmax(1)
    p_y = p.gather(1, y[:, None])
    q = ((1 - p_y) / (C - 1)).expand_as(p)
    off = ~F.one_hot(y, C).bool()
    l1 = ((torch.xlogy(p, p) - p * q.log()) * off).sum(1)
    f_y = logits.gather(1, y[:, None])[:, 0]
    l2 = torch.log1p(((logits - f_y[:, None] + D[y].log()).exp() * off).sum(1))
    return l1 + lam * l2


def kl_score(P, present, tau):
    """Eq. (10) with the KL averaged over the held classes' rows (--score-kl mean): (V_m, KL)."""
    P, C = P.double(), len(P)
    Q = torch.full((C, C), (1 - tau) / (C - 1), dtype=torch.float64)
    Q.fill_diagonal_(tau)
    kl = float((torch.xlogy(P, P) - P * Q.log()).sum(1)[present].mean())
    return 1 / (1 + np.exp(-1 / kl)), kl


def fedacd_client(model, start, data, client, args, round_, fedavg_loss=False, mixup=True, margins_seen=None):
    """Client m: mixup minibatches (per batch mix ~ U(0, 1), then the pairing, from the tag-1 generator), FedACD's
    loss with P^m re-estimated at each epoch's end from its (mixup-weighted) outputs, or cross-entropy under
    ``fedavg_loss``. Returns (trained flat model, mean loss, P^m of the trained model); ``margins_seen``, a
    list, receives each epoch's margins."""
    vector_to_parameters(start.clone(), model.parameters())
    idx, C = data.train_idx[client], data.num_classes
    present = torch.as_tensor(data.train_counts[client] > 0)
    epochs = minibatches(idx, args.batch_size, args.local_epochs, seed_of(args.seed, round_, client))
    draws = torch.Generator().manual_seed(seed_of(args.seed, round_, client, 1))
    mixing = [[(float(torch.rand((), generator=draws)), torch.randperm(len(b), generator=draws)) if mixup else
               (1.0, torch.arange(len(b))) for b in epoch] for epoch in epochs]  # --no-mixup: mix 1, y_b = y_a
    P = class_mean_softmax(model, data.x[idx], data.y[idx], C)  # the received model's
    losses, buffers = [], []  # one optimizer for the client's whole update
    for epoch, epoch_mixing in zip(epochs, mixing):
        D, sums = margins_of(P, present, args.missing_delta), torch.zeros(C, C)
        if margins_seen is not None:
            margins_seen.append(D)
        for b, (mix, perm) in zip(epoch, epoch_mixing):
            x, y_a, y_b = data.x[b], data.y[b], data.y[b][perm]
            logits = model(mix * x + (1 - mix) * x[perm])
            if fedavg_loss:
                loss = mix * F.cross_entropy(logits, y_a) + (1 - mix) * F.cross_entropy(logits, y_b)
            else:
                loss = (mix * fedacd_objective(logits, y_a, D, args.lam).mean()
                        + (1 - mix) * fedacd_objective(logits, y_b, D, args.lam).mean())
            sgd(model, loss, args.lr, args.momentum, args.weight_decay, buffers)
            losses.append(float(loss.detach()))
            sums += (mix * F.one_hot(y_a, C) + (1 - mix) * F.one_hot(y_b, C)).T @ logits.detach().softmax(1)
        seen = sums.sum(1, keepdim=True) > 0
        P = torch.where(seen, sums / sums.sum(1, keepdim=True).clamp_min(1e-12), P)  # the epoch's end
    trained = parameters_to_vector(model.parameters()).detach().clone()
    return trained, sum(losses) / len(losses), class_mean_softmax(model, data.x[idx], data.y[idx], C)


def average_risk(model, flat, data):
    """FedACD's Eq. (3): 1/M sum_n eps(w) . pi^n, eps the per-class test errors, pi^n client n's label priors."""
    vector_to_parameters(flat.clone(), model.parameters())
    idx = data.global_test_idx  # the uniform test set (FedACD's default --test-split global)
    with torch.no_grad():
        wrong = (model(data.x[idx]).argmax(1) != data.y[idx]).double()
    errors = torch.tensor([float(wrong[data.y[idx] == k].mean()) if (data.y[idx] == k).any() else 0.0
                           for k in range(data.num_classes)], dtype=torch.float64)
    counts = torch.as_tensor(np.asarray(data.train_counts), dtype=torch.float64)
    return float(((counts / counts.sum(1, keepdim=True)) @ errors).mean())


def fedacd_reference(module, flags=(), fedavg_loss=False, log_kl=True, log_risk=False):
    args, data, model, rng = setup(module, flags)
    global_ = parameters_to_vector(model.parameters()).detach().clone()
    rows = []
    for round_ in (1, 2):
        clients = sampled(rng, args.num_clients, args.join_ratio)
        trained, losses, scores, kls, risks = [], [], [], [], []
        for c in clients:
            flat, loss, P = fedacd_client(model, global_, data, c, args, round_, fedavg_loss)
            score, kl = kl_score(P, torch.as_tensor(data.train_counts[c] > 0), args.tau)
            trained.append(flat), losses.append(loss), scores.append(score), kls.append(kl)
            if log_risk:
                risks.append(average_risk(model, flat, data))
        # FedAvg: sum_k n_k / n w^k; FedACD Eq. (11): sum_m V_m / sum_k V_k w^m
        global_ = weighted_mean(trained, [len(data.train_idx[c]) for c in clients] if fedavg_loss else scores)
        row = {**accuracy([evaluated(model, global_, data, c) for c in range(args.num_clients)]),
               **global_test(model, global_, data), "train_loss": sum(losses) / len(losses)}
        if log_kl:
            row.update(local_kl=sum(kls) / len(kls), score_min=min(scores), score_max=max(scores))
        if log_risk:
            row["local_risk"] = sum(risks) / len(risks)
        rows.append(row)
    return rows, global_


def test_fedacd_main_trains_fedacd_s_loss_and_aggregates_by_the_scores_of_eq_11(tmp_path):
    flags = ["--local-epochs", "3"]  # P^m of epoch 1's and epoch 2's outputs each set an epoch's margins
    rows, checkpoint = run("fedacd.py", flags, tmp_path)
    expected, global_ = fedacd_reference(fedacd, flags)
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)


@pytest.mark.parametrize("flags", [["--fedavg", "--log-kl", "--log-risk"], ["--log-risk", "--local-epochs", "3"]],
                         ids=["fedavg-log-kl-log-risk", "fedacd-log-risk"])
def test_fedacd_diagnostics_main_matches_the_re_implementation(flags, tmp_path):
    rows, checkpoint = run("tools/fedacd_diagnostics.py", flags, tmp_path)
    expected, global_ = fedacd_reference(fedacd_diagnostics, flags, fedavg_loss="--fedavg" in flags, log_risk=True)
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)


@pytest.mark.parametrize("mixup", [True, False], ids=["mixup", "no-mixup"])
def test_fedacd_client_update_re_estimates_p_at_each_epoch_s_end_on_a_client_of_many_classes(mixup):
    """Sec. 3's schedule on the client holding the most classes, 4 epochs at lr 0.1 with momentum: the trained
    model, its mean loss and its score V_m (from P^m of the trained model) against the re-implementation, whose
    margins must move from epoch to epoch (else this client could not tell a stale P^m from a fresh one)."""
    args, data, model, _ = setup(fedacd, ["--local-epochs", "4", "--lr", "0.1", "--momentum", "0.5",
                                          *([] if mixup else ["--no-mixup"])])
    client = int(np.argmax((np.asarray(data.train_counts) > 0).sum(1)))
    present = torch.as_tensor(data.train_counts[client] > 0)
    assert int(present.sum()) >= 3
    start = parameters_to_vector(model.parameters()).detach().clone()
    trained, loss, score, kl = fedacd.client_update(copy.deepcopy(model), start, data, client,
                                                    fedacd.held_classes(data), args, round_=2)
    seen = []  # each epoch's margins in the re-implementation
    want, want_loss, P = fedacd_client(model, start, data, client, args, 2, mixup=mixup, margins_seen=seen)
    assert len(seen) == 4 and all((seen[e] - seen[e + 1]).abs().max() > 1e-2 for e in range(3))
    want_score, want_kl = kl_score(P, present, args.tau)
    assert (trained - want).abs().max() <= PARAMS_ATOL
    assert float(loss) == pytest.approx(want_loss, rel=LOSS_TOL)
    assert float(kl) == pytest.approx(want_kl, rel=LOSS_TOL) and float(score) == pytest.approx(want_score, rel=1e-6)


# ----------------------------------------------------------------------------- pFedLA and HeurpFedLA

# The hypernetworks HN_i(v_i; psi_i) of Eq. (3)-(4) written out here as a dict of plain tensors, one row per client
# (never pfedla.LayerHypernetworks or its .parameters(): a tensor the script fails to train, a v_i registered as a
# buffer, must differ from what is trained here). The tensors the paper trains, by the names the script's state
# uses: the embedding v_i, then psi_i: the MLP's weights and biases and one linear head per model layer.
HN_TENSORS = ["embedding", "mlp_weight.0", "mlp_weight.1", "mlp_weight.2", "mlp_bias.0", "mlp_bias.1", "mlp_bias.2",
              "head_weight", "head_bias"]


def hypernetwork_init(num_clients, num_layers, embed_dim, hidden_dim, generator):
    """The initialisation docs/pfedla.md gives (as nn.Embedding and nn.Linear: N(0, 1), U(+-1/sqrt(fan_in))), drawn
    from ``generator`` in the order embedding, MLP weights, MLP biases, head weights, head biases."""
    def uniform(*shape, fan_in):
        bound = 1 / fan_in ** 0.5
        return torch.empty(*shape).uniform_(-bound, bound, generator=generator)

    n, dims = num_clients, [embed_dim, hidden_dim, hidden_dim, hidden_dim]
    tensors = {"embedding": torch.randn(n, embed_dim, generator=generator)}
    tensors.update({f"mlp_weight.{k}": uniform(n, a, b, fan_in=a) for k, (a, b) in enumerate(zip(dims, dims[1:]))})
    tensors.update({f"mlp_bias.{k}": uniform(n, b, fan_in=a) for k, (a, b) in enumerate(zip(dims, dims[1:]))})
    tensors["head_weight"] = uniform(n, hidden_dim, num_layers, n, fan_in=hidden_dim)
    tensors["head_bias"] = uniform(n, num_layers, n, fan_in=hidden_dim)
    return tensors


def hypernetwork_alpha(tensors, i):
    """Eq. (3)-(4) for client i: v_i -> 3 x (Linear, ReLU) -> per layer l a linear head of N scores -> softmax over
    the clients; alpha_i as a (layers, N) tensor."""
    h = tensors["embedding"][i]
    for k in range(3):
        h = torch.relu(h @ tensors[f"mlp_weight.{k}"][i] + tensors[f"mlp_bias.{k}"][i])
    return (torch.einsum("h,hlj->lj", h, tensors["head_weight"][i]) + tensors["head_bias"][i]).softmax(-1)


def layerwise(alpha_i, stored, blocks, i, retained=()):
    """Eq. (5)-(6): theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l per layer (``blocks`` the layers' lengths in the
    flat model); Alg. 2 l. 7: the layers in ``retained`` are client i's own stored ones."""
    parts, offset = [], 0
    for layer, size in enumerate(blocks):
        own = stored[i, offset:offset + size]
        mixed = sum(alpha_i[layer, j] * stored[j, offset:offset + size] for j in range(len(stored)))
        parts.append(own if layer in retained else mixed)
        offset += size
    return torch.cat(parts)


def top_self_weight(alpha_i, i, k):
    """Eq. (12): the k layers of largest self-weight alpha_i^{l,i}."""
    return set(torch.argsort(alpha_i[:, i].detach(), descending=True)[:k].tolist())


def hypernetwork_step(tensors, clients, stored, blocks, deltas, hn_lr):
    """Alg. 1 l. 8, Eq. (10)-(11) (Alg. 2 l. 10 alike): v_i, psi_i += hn_lr (d theta_bar_i / d(v_i, psi_i))^T
    Delta theta_i, theta_bar_i the full layer-wise aggregate of l. 5 (every layer aggregated) and Delta theta_i
    (``deltas``, one row per client of ``clients``) over all layers; autograd of the plain forward above. Returns
    the new tensors (new leaves) and the step of each."""
    leaves = {name: value.detach().clone().requires_grad_() for name, value in tensors.items()}
    theta_bar = torch.stack([layerwise(hypernetwork_alpha(leaves, i), stored, blocks, i) for i in clients])
    grads = torch.autograd.grad(theta_bar, list(leaves.values()), deltas)
    steps = {name: hn_lr * g for name, g in zip(leaves, grads)}
    return {name: (leaves[name] + steps[name]).detach() for name in leaves}, steps


def pfedla_reference(k):
    args, data, model, rng = setup(pfedla, ["--k", str(k)])
    N = args.num_clients
    # the hypernetworks' initialisation is drawn after the model's from --seed's stream
    hypernetworks = hypernetwork_init(N, 2, args.embed_dim, args.hidden_dim, torch.default_generator)
    blocks = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()
              if any(True for _ in m.parameters(recurse=False))]
    stored = parameters_to_vector(model.parameters()).detach().repeat(N, 1)  # Alg. 1 l. 1

    rows = []
    for round_ in (1, 2):
        clients = sampled(rng, N, args.join_ratio)
        with torch.no_grad():
            alpha = [hypernetwork_alpha(hypernetworks, i) for i in clients]
            received = [layerwise(alpha[s], stored, blocks, i, top_self_weight(alpha[s], i, k))
                        for s, i in enumerate(clients)]
        trained, losses = [], []
        for s, i in enumerate(clients):
            flat, loss = train_plain(model, received[s], data, data.train_idx[i],
                                     minibatches(data.train_idx[i], args.batch_size, args.local_epochs,
                                                 seed_of(args.seed, round_, i)), args.lr)
            trained.append(flat), losses.append(loss)
        hypernetworks, _ = hypernetwork_step(hypernetworks, clients, stored, blocks,  # Alg. 1 l. 8
                                             torch.stack([t - r for t, r in zip(trained, received)]), args.hn_lr)
        for s, i in enumerate(clients):  # l. 7: theta_i := theta_bar_i + Delta theta_i
            stored[i] = trained[s]
        with torch.no_grad():  # evaluated: what each client receives next
            alpha = [hypernetwork_alpha(hypernetworks, i) for i in range(N)]
            results = [evaluated(model, layerwise(alpha[i], stored, blocks, i, top_self_weight(alpha[i], i, k)),
                                 data, i) for i in range(N)]
        rows.append({**accuracy(results), "train_loss": sum(losses) / len(losses),
                     "self_weight": float(torch.stack([alpha[i][:, i] for i in range(N)]).mean())})
    return rows, stored, hypernetworks


@pytest.mark.parametrize("k", [0, 1], ids=["pfedla", "heurpfedla-k1"])
def test_pfedla_main_aggregates_layerwise_steps_the_hypernetworks_and_evaluates_what_clients_receive(k, tmp_path):
    rows, checkpoint = run("pfedla.py", ["--k", str(k)], tmp_path)
    expected, stored, hypernetworks = pfedla_reference(k)
    assert_rows(rows, expected)
    assert (checkpoint["state"]["stored_models"] - stored).abs().max() <= PARAMS_ATOL
    saved = checkpoint["state"]["hypernetworks"]
    assert sorted(saved) == sorted(HN_TENSORS)  # v_i and psi_i, nothing else
    for name in HN_TENSORS:  # each trained as Eq. (10)-(11) trains it here
        assert (saved[name] - hypernetworks[name]).abs().max() <= PARAMS_ATOL, name


# ----------------------------------------------------------------------------- FedPake

def fedpake_server(rows, n, kappa, n_micro, n_macro, delta, draw_micro=None, draw_macro=None):
    """FedPake's aggregation as docs/fedpake.md reconstructs Eq. (2)-(11), written here column by column in
    float64 numpy: (the new global model, |H| / D, the number of Macro-Classes). --ablate (Table 4):
    ``draw_micro(|H|, K)`` gives the random Micro-Classes (K x |H|), ``draw_macro(K)`` the random Macro-Classes
    (lists of clients) in place of the paper's."""
    W, n = torch.stack(rows).double().numpy(), np.asarray(n, dtype=np.float64)
    out = (n / n.sum()) @ W  # the low-dispersion part: FedAvg's mean
    cv = W.std(0) / (np.abs(W.mean(0)) + 1e-12)  # Eq. (2)-(5), population std over clients
    high = np.flatnonzero(cv > kappa)
    if not len(high):
        return torch.from_numpy(out).float(), 0.0, 0
    V = W[:, high]
    lo, hi = V.min(0), V.max(0)
    mic = np.minimum(np.floor((V - lo) / np.maximum(hi - lo, np.finfo(np.float64).tiny) * n_micro),
                     n_micro - 1).astype(int)  # Eq. (6)-(7): n_micro equal bins of [min, max]
    K = len(W)
    if draw_micro is not None:
        mic = draw_micro(len(high), K)
    D = np.array([[np.mean(mic[a] != mic[b]) for b in range(K)] for a in range(K)])  # Eq. (8)
    clusters = [[k] for k in range(K)] if draw_macro is None else draw_macro(K)
    # average linkage (not under --ablate macro): merge the closest pair while D <= delta or too many clusters
    while len(clusters) > 1 and draw_macro is None:
        best = None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                link = np.mean([D[x, y] for x in clusters[a] for y in clusters[b]])
                if best is None or link < best[0]:
                    best = (link, a, b)
        link, a, b = best
        if link > delta and len(clusters) <= n_macro:
            break
        clusters[a] += clusters.pop(b)
    high_sum = np.zeros(len(high))
    for members in clusters:  # Eq. (9): each column's most frequent Micro-Class, ties to the median's nearest
        m = mic[members]
        counts = np.stack([(m == c).sum(0) for c in range(n_micro)])
        ordered = np.sort(m, 0)
        twice_median = ordered[(len(members) - 1) // 2] + ordered[len(members) // 2]
        key = np.abs(2 * np.arange(n_micro)[:, None] - twice_median[None]) * (n_micro + 1) + np.arange(n_micro)[:, None]
        key = np.where(counts == counts.max(0), key, np.iinfo(int).max)
        tendency = key.argmin(0)
        match = (m == tendency).astype(np.float64) * n[members][:, None]  # Eq. (11)
        weights = match / match.sum(0) * (n[members].sum() / n.sum())
        high_sum += (weights * V[members]).sum(0)
    out[high] = high_sum
    return torch.from_numpy(out).float(), len(high) / W.shape[1], len(clusters)


def test_fedpake_main_aggregates_by_micro_and_macro_classes_as_reconstructed(tmp_path):
    flags = ["--n-macro", "2"]  # 3 clients a round: at least one merge
    rows, checkpoint = run("fedpake.py", flags, tmp_path)
    args, data, model, rng = setup(fedpake, flags)
    global_, expected = parameters_to_vector(model.parameters()).detach().clone(), []
    for round_ in (1, 2):
        clients = sampled(rng, args.num_clients, args.join_ratio)
        trained, losses = [], []
        for c in clients:
            flat, loss = train_plain(model, global_, data, data.train_idx[c],
                                     minibatches(data.train_idx[c], args.batch_size, args.local_epochs,
                                                 seed_of(args.seed, round_, c)), args.lr)
            trained.append(flat), losses.append(loss)
        global_, high_fraction, macro = fedpake_server(trained, [len(data.train_idx[c]) for c in clients], args.kappa,
                                                       args.n_micro, args.n_macro, args.delta)
        assert 0 < high_fraction < 1 and macro <= 2  # the round had both parts and merged
        expected.append({**accuracy([evaluated(model, global_, data, c) for c in range(args.num_clients)]),
                         "train_loss": sum(losses) / len(losses), "high_fraction": high_fraction,
                         "macro_classes": macro})
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)


# ----------------------------------------------------------------------------- FedALA

def ala_weights(model, p):
    """The number of ALA weights: the parameters of the model's top p layers (modules that own parameters)."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    return sum(q.numel() for m in owners[-p:] for q in m.parameters(recurse=False))


def plain_ala(model, data, i, round_, args, global_, local_i, w_i, initial, epoch_losses):
    """FedALA's Alg. 1 l. 7-15 for client i in ``round_``, written here (never fedala.ALA): Theta_hat = Theta_i +
    (Theta - Theta_i) (.) W on the top p layers (Eq. 4), the lower ones the global model's; W <- clip(W - eta dL/dW)
    (Eq. 5-7), one epoch after the initial stage, in it until the std of the last --num-pre-loss epoch losses is below
    --threshold (or --max-init-epochs), on a random s% of the client's data, drawn afresh with this round's seed
    (SeedSequence([seed, round, client, 1])). ``model`` a plain model without buffers (flat = its parameters),
    ``global_``, ``local_i`` flat, ``w_i`` client i's W; ``epoch_losses`` (client i's list) receives the initial
    stage's epoch losses. Returns (Theta_hat_i, the new W_i, the weight-learning epochs, still in the initial stage)."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    top = [p for m in owners[-args.p:] for p in m.parameters(recurse=False)]  # the top p layers
    top_at = parameters_to_vector(top).numel()
    old, update, w = local_i[-top_at:], (global_ - local_i)[-top_at:], w_i.clone()
    g = torch.Generator().manual_seed(seed_of(args.seed, round_, i, 1))
    idx = data.train_idx[i]
    subset = idx[torch.randperm(len(idx), generator=g)[:max(1, round(args.s / 100 * len(idx)))]]
    epochs = 0
    while True:
        order = subset[torch.randperm(len(subset), generator=g)]
        cuts = list(range(0, len(order), args.batch_size))
        if len(cuts) > 1 and len(order) - cuts[-1] == 1:
            cuts.pop()
        losses = []
        for a, b in zip(cuts, cuts[1:] + [len(order)]):
            vector_to_parameters(torch.cat([global_[:-top_at], torch.addcmul(old, update, w)]), model.parameters())
            loss = F.cross_entropy(model(data.x[order[a:b]]), data.y[order[a:b]])
            grad = parameters_to_vector(torch.autograd.grad(loss, top))
            w = torch.addcmul(w, grad, update, value=-args.eta).clamp(0, 1)
            losses.append(float(loss.detach()))
        epochs += 1
        if not initial:
            break
        epoch_losses.append(sum(losses) / len(losses))
        recent = epoch_losses[-args.num_pre_loss:]
        if (len(epoch_losses) >= args.num_pre_loss and np.std(recent) < args.threshold) \
                or epochs >= args.max_init_epochs:
            initial = False
            break
    return torch.cat([global_[:-top_at], torch.addcmul(old, update, w)]), w, epochs, initial


def test_fedala_main_learns_ala_weights_aggregates_the_local_models_and_evaluates_them(tmp_path):
    """Three rounds: round 1 without ALA, then each joining client's initial stage (weights learned until the std
    of the last --num-pre-loss epoch losses is below --threshold), then one ALA epoch a round with its weights kept."""
    flags = ["--rounds", "3"]
    rows, checkpoint = run("fedala.py", flags, tmp_path)
    args, data, model, rng = setup(fedala, flags)
    N = args.num_clients
    global_ = parameters_to_vector(model.parameters()).detach().clone()
    local = [global_.clone() for _ in range(N)]  # Alg. 1 l. 1
    W = [torch.ones(ala_weights(model, args.p)) for _ in range(N)]  # Alg. 1 l. 2
    initial_stage, epoch_losses = [True] * N, [[] for _ in range(N)]

    def ala(i, round_):
        start, W[i], epochs, initial_stage[i] = plain_ala(model, data, i, round_, args, global_, local[i], W[i],
                                                          initial_stage[i], epoch_losses[i])
        return start, epochs

    expected = []
    for round_ in range(1, args.rounds + 1):
        clients = sampled(rng, N, args.join_ratio)
        results, losses, ala_epochs = {}, [], []
        for i in clients:
            start, epochs = (global_.clone(), 0) if round_ == 1 else ala(i, round_)
            results[i] = evaluated(model, start, data, i)  # the ALA-initialised model
            local[i], loss = train_plain(model, start, data, data.train_idx[i],
                                         minibatches(data.train_idx[i], args.batch_size, args.local_epochs,
                                                     seed_of(args.seed, round_, i)), args.lr)
            losses.append(loss), ala_epochs.append(epochs)
        global_ = weighted_mean([local[i] for i in clients], [len(data.train_idx[i]) for i in clients])  # l. 18
        for i in set(range(N)) - set(clients):
            results[i] = evaluated(model, local[i], data, i)
        pooled = accuracy([evaluated(model, global_, data, i) for i in range(N)])["test_acc"]
        expected.append({**accuracy([results[i] for i in range(N)]), "train_loss": sum(losses) / len(losses),
                         "ala_epochs": sum(ala_epochs) / len(ala_epochs), "global_model_acc": pooled})
    assert max(r["ala_epochs"] for r in expected) > 1 and not all(initial_stage)  # an initial stage ran and ended
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)
    assert (checkpoint["state"]["local_models"] - torch.stack(local)).abs().max() <= PARAMS_ATOL
    assert (checkpoint["state"]["ala"]["weights"] - torch.stack(W)).abs().max() <= PARAMS_ATOL


# ----------------------------------------------------------------------------- tests/rounds.py equals each main()

def rounds_py_run(name, flags):
    """Two rounds composed from tests/rounds.py as its tests drive them, set up as the script's main() sets up
    (seed, data, model, then the algorithm's state, then the worker): (each round's train loss, final state)."""
    import rounds
    module = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "fedacd": fedacd,
              "diagnostics": fedacd_diagnostics}[name]
    args = module.parse_args([*SETTING, *flags])
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, "cpu")
    model = common.build_model(args.model, data)
    if name == "fedala":
        ala = fedala.ALA(model, args.num_clients, p=args.p, eta=args.eta, s=args.s, batch_size=args.batch_size,
                         threshold=args.threshold, num_pre_loss=args.num_pre_loss,
                         max_init_epochs=args.max_init_epochs)
        local_models = common.flatten_state(model).repeat(args.num_clients, 1)
    if name == "pfedla":
        sizes = pfedla.layer_sizes(model)
        stored = pfedla.flatten_state(model).repeat(args.num_clients, 1)
        hypernetworks = pfedla.LayerHypernetworks(args.num_clients, len(sizes), args.embed_dim, args.hidden_dim,
                                                  generator=torch.default_generator)
    worker = common.build_model(args.model, data)
    losses = []
    for round_ in range(1, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        stack = torch.empty(len(clients), common.flatten_state(model).numel())
        if name == "fedavg":
            losses.append(rounds.fedavg_round(model, worker, data, clients, args, round_))
        elif name == "fedala":
            losses.append(rounds.fedala_round(model, worker, local_models, ala, data, clients, args, round_)[0])
        elif name == "pfedla":
            losses.append(rounds.pfedla_round(hypernetworks, stored, worker, data, clients, args, round_, sizes)[0])
        else:
            risk = None
            if name == "diagnostics":  # Table 3's risk: tools/fedacd_diagnostics.py's client
                counts = torch.as_tensor(data.train_counts, dtype=torch.float64)
                risk = ([data.global_test_idx[data.y[data.global_test_idx] == c] for c in range(data.num_classes)],
                        counts / counts.sum(1, keepdim=True))
            losses.append(rounds.fedacd_round(model, worker, data, clients, args, round_, stack, risk)["train_loss"])
    state = {"pfedla": lambda: stored, "fedala": lambda: local_models}.get(name, lambda: common.flatten_state(model))()
    return losses, state


@pytest.mark.parametrize("name, script, flags", [
    ("fedavg", "fedavg.py", []), ("fedala", "fedala.py", ["--rounds", "3"]), ("pfedla", "pfedla.py", ["--k", "1"]),
    ("fedacd", "fedacd.py", []), ("diagnostics", "tools/fedacd_diagnostics.py", ["--log-risk"])],
    ids=["fedavg", "fedala", "pfedla-k1", "fedacd", "fedacd-diagnostics"])
def test_tests_rounds_py_gives_each_main_s_rounds_bit_for_bit(name, script, flags, tmp_path):
    rows, checkpoint = run(script, flags, tmp_path)
    losses, state = rounds_py_run(name, flags)
    assert [r["train_loss"] for r in rows] == [round(loss, 6) for loss in losses]
    saved = checkpoint["state"]
    got = {"pfedla": lambda: saved["stored_models"], "fedala": lambda: saved["local_models"]}.get(
        name, lambda: torch.cat([v.reshape(-1) for v in saved["global_model"].values() if v.is_floating_point()]))()
    assert torch.equal(got, state)
