"""pFedLA / HeurpFedLA (pfedla.py): Eq. (3)-(6) aggregation, the Eq. (10)-(11) hypernetwork step
and its sign, Alg. 2 / Eq. (12) top-k retention and its byte count, group discovery, memory, CLI."""
import argparse
import copy
import gc
import json
import os
import re
import time

import numpy as np
import pytest
import torch

import common
import datasets
import pfedla
from rounds import pfedla_round
from conftest import metrics_rows, run_dir, run_in_process, layer_state_keys
from test_main_loops import HN_TENSORS, hypernetwork_alpha, hypernetwork_step, layerwise, top_self_weight


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run faster on one thread


def seeded_setup(data):
    """Seed 0: an MLP worker, its layer sizes, every client's stored model (the worker's initial
    state, Alg. 1 l. 1) and the N hypernetworks."""
    torch.manual_seed(0)
    worker = common.MLP(20, data.num_classes)
    sizes = pfedla.layer_sizes(worker)
    stored_models = common.flatten_state(worker).detach().repeat(data.num_clients, 1)
    return worker, sizes, stored_models, pfedla.LayerHypernetworks(data.num_clients, len(sizes))


def make_args(**kw):
    base = dict(lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=16, local_epochs=1, seed=0, k=0, hn_lr=2.0)
    return argparse.Namespace(**{**base, **kw})


def group_data(groups=3, per_group=2, n=120, dim=20, seed=0):
    """Vector data: client c belongs to group c // per_group and sees only that group's two
    classes (2g, 2g+1); class means are random, noise unit Gaussian; 70/30 train/test."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(2 * groups, dim, generator=g)
    xs, ys, train, test = [], [], [], []
    for c in range(groups * per_group):
        grp = c // per_group
        y = torch.randint(2 * grp, 2 * grp + 2, (n,), generator=g)
        xs.append(means[y] + torch.randn(n, dim, generator=g))
        ys.append(y)
        train.append(torch.arange(c * n, c * n + int(0.7 * n)))
        test.append(torch.arange(c * n + int(0.7 * n), (c + 1) * n))
    counts = np.zeros((len(train), 2 * groups), int)
    return datasets.FedData(x=torch.cat(xs), y=torch.cat(ys), num_classes=2 * groups, train_idx=train, test_idx=test,
                          train_counts=counts, test_counts=counts)


def random_lenet_states(num_clients, seed=0):
    """LeNet with BatchNorm (colour input), one random state per client, BN running stats included."""
    torch.manual_seed(seed)
    states = []
    for _ in range(num_clients):
        m = common.LeNet(3, 5, 16)
        with torch.no_grad():
            for k, v in m.state_dict().items():
                if v.is_floating_point():
                    v.copy_(torch.rand_like(v) + 0.1 if "running_var" in k else torch.randn_like(v))
        states.append({k: v.clone() for k, v in m.state_dict().items()})
    return m, states


def own_slices(model):
    """Per layer, the (start, end) of each of its float tensors in the flat state, found from
    state_dict names independently of pfedla.layer_sizes."""
    offsets, offset = {}, 0
    for k, v in model.state_dict().items():
        if v.is_floating_point():
            offsets[k] = (offset, offset + v.numel())
            offset += v.numel()
    return [[offsets[k] for k in keys if k in offsets] for keys in layer_state_keys(model)]


# ----------------------------------------------------------------------------- 1. Eq. (3)-(6)

def test_alpha_on_simplex_and_personalised_model_is_layerwise_weighted_sum():
    n = 4
    model, states = random_lenet_states(n)
    stored_models = torch.stack([torch.cat([v.reshape(-1) for v in s.values() if v.is_floating_point()])
                                 for s in states])
    sizes = pfedla.layer_sizes(model)
    assert len(sizes) == 7 and sum(sizes) == stored_models.shape[1]  # conv, bn, conv, bn, fc, fc, fc
    hn = pfedla.LayerHypernetworks(n, len(sizes), embed_dim=8, hidden_dim=16)
    ids = torch.arange(n)
    with torch.no_grad():
        hn.head_bias.mul_(20)  # far from uniform, so a wrong mixing cannot pass by accident
        alpha = hn(ids)
        theta_bar = pfedla.with_retained_layers(pfedla.aggregate_layerwise(alpha, stored_models, sizes), stored_models,
                                                ids, sizes, pfedla.retained_layers(alpha, ids, 0))
    assert alpha.shape == (n, 7, n)
    assert (alpha >= 0).all()
    torch.testing.assert_close(alpha.sum(-1), torch.ones(n, 7))
    layer_keys = layer_state_keys(model)
    checked_buffers = 0
    for i in range(n):
        common.load_flat_state(model, theta_bar[i])
        got = model.state_dict()
        for l, keys in enumerate(layer_keys):
            for key in keys:
                if not states[0][key].is_floating_point():
                    continue  # num_batches_tracked: not aggregated
                expected = sum(alpha[i, l, j] * states[j][key] for j in range(n))  # Eq. (6)
                torch.testing.assert_close(got[key], expected, rtol=1e-5, atol=1e-5)
                checked_buffers += "running" in key
    assert checked_buffers == n * 4  # running_mean and running_var of both BatchNorm layers


# ----------------------------------------------------------------------------- 2. Eq. (10)-(11)

def test_hypernetwork_step_moves_personalised_model_towards_trained_and_equals_vjp():
    n, clients = 3, [0, 2]
    model, states = random_lenet_states(n, seed=1)
    stored_models = torch.stack([torch.cat([v.reshape(-1) for v in s.values() if v.is_floating_point()])
                                 for s in states]).double()  # float64: the step is compared to 1e-9
    sizes = pfedla.layer_sizes(model)
    slices = own_slices(model)
    torch.manual_seed(2)
    hn = pfedla.LayerHypernetworks(n, len(sizes), embed_dim=8, hidden_dim=16).double()
    ids = torch.tensor(clients)
    theta_bar = pfedla.aggregate_layerwise(hn(ids), stored_models, sizes)
    delta = 0.1 * torch.randn(theta_bar.shape, dtype=torch.float64)
    trained = theta_bar.detach() + delta
    names = [name for name, _ in hn.named_parameters()]
    before = [p.detach().clone() for p in hn.parameters()]

    def independent_theta_bar(*params, client):
        """theta_bar_i as a function of all HN tensors, with the aggregation written out per tensor."""
        h = params[names.index("embedding")][client]
        for w, b in zip([params[names.index(f"mlp_weight.{k}")] for k in range(3)],
                        [params[names.index(f"mlp_bias.{k}")] for k in range(3)]):
            h = torch.relu(h @ w[client] + b[client])
        scores = torch.einsum("h,hlj->lj", h, params[names.index("head_weight")][client]) \
            + params[names.index("head_bias")][client]
        alpha = torch.softmax(scores, dim=-1)
        out = torch.zeros(stored_models.shape[1], dtype=torch.float64)
        for l, spans in enumerate(slices):
            for a, b in spans:
                out[a:b] = sum(alpha[l, j] * stored_models[j, a:b] for j in range(n))
        return out

    # (d theta_bar_i / d psi_i)^T Delta theta_i for each client, summed (clients own disjoint rows)
    vjp = [torch.zeros_like(p) for p in before]
    for s, c in enumerate(clients):
        _, g = torch.autograd.functional.vjp(lambda *p: independent_theta_bar(*p, client=c), tuple(before), delta[s])
        vjp = [a + b for a, b in zip(vjp, g)]
    hn_lr = 1e-3
    pfedla.hypernetwork_step(hn, theta_bar, delta, hn_lr)
    for name, p, p0, g in zip(names, hn.parameters(), before, vjp):
        # Eq. (10)-(11): psi += hn_lr * J^T Delta (descent on the distance), client 1 untouched
        torch.testing.assert_close(p.detach() - p0, hn_lr * g, rtol=1e-7, atol=1e-12, msg=name)
        assert torch.equal(p.detach()[1], p0[1])
    assert any(g.abs().max() > 0 for g in vjp)
    with torch.no_grad():
        new_bar = pfedla.aggregate_layerwise(hn(ids), stored_models, sizes)
    old_dist = (theta_bar.detach() - trained).norm(dim=1)
    new_dist = (new_bar - trained).norm(dim=1)
    assert (new_dist < old_dist).all(), (old_dist, new_dist)


@pytest.mark.parametrize("k", [0, 1], ids=["pfedla", "heurpfedla-k1"])
def test_every_tensor_the_paper_trains_moves_by_eq_10_11_for_each_joining_client(k, monkeypatch):
    """Each tensor Eq. (10)-(11) trains, by name: the embedding v_i, the hypernetwork's weights psi_i (its MLP and
    its heads; under HeurpFedLA the heads of the retained layers too, Alg. 2 l. 10). In a round of the script's
    pieces (tests/rounds.py, as main() runs them), each joining client's row of each moves by hn_lr (d theta_bar_i
    / d(v_i, psi_i))^T Delta theta_i, computed here by autograd of a plain re-implementation (test_main_loops:
    never the script's class, so a tensor it does not train, v_i registered as a buffer, fails); the rows of the
    clients that do not join stay as they were."""
    data = group_data()
    n, joining = data.num_clients, [0, 2, 3]
    worker, sizes, stored_models, hn = seeded_setup(data)
    args = make_args(k=k)
    pfedla_round(hn, stored_models, worker, data, list(range(n)), args, 1, sizes)  # the stored models now differ
    before = {name: value.detach().clone() for name, value in hn.state_dict().items()}
    stored = stored_models.clone()
    log, real_train = [], common.local_train

    def recording_train(model, *a, **kw):
        start = common.flatten_state(model).clone()
        loss = real_train(model, *a, **kw)
        log.append((start, common.flatten_state(model).clone()))
        return loss

    monkeypatch.setattr(common, "local_train", recording_train)
    pfedla_round(hn, stored_models, worker, data, joining, args, 2, sizes)
    received, trained = (torch.stack(t).double() for t in zip(*log))
    assert sorted(before) == sorted(HN_TENSORS)  # the script's hypernetworks hold these, and nothing else
    blocks = [sum(p.numel() for p in m.parameters(recurse=False)) for m in worker.modules()
              if any(True for _ in m.parameters(recurse=False))]  # fc1, fc: found here, not by pfedla.layer_sizes
    plain = {name: value.double() for name, value in before.items()}
    with torch.no_grad():
        retained = [top_self_weight(hypernetwork_alpha(plain, i), i, k) for i in joining]
        want_received = torch.stack([layerwise(hypernetwork_alpha(plain, i), stored.double(), blocks, i, kept)
                                     for i, kept in zip(joining, retained)])
    torch.testing.assert_close(received, want_received, rtol=1e-5, atol=1e-6)  # Alg. 2 l. 7: what each started from
    _, steps = hypernetwork_step(plain, joining, stored.double(), blocks, trained - received, args.hn_lr)
    after = hn.state_dict()
    for name in HN_TENSORS:
        moved = after[name].double() - before[name].double()
        for i in range(n):
            if i not in joining:
                assert torch.equal(after[name][i], before[name][i]), (name, i)
                continue
            want = steps[name][i]
            assert want.abs().max() > 1e-6, (name, i)  # the paper's step moves this row
            torch.testing.assert_close(moved[i], want, rtol=1e-3, atol=1e-3 * float(want.abs().max()),
                                       msg=lambda m: f"{name}, client {i}: {m}")
    if k:  # HeurpFedLA: the head of each joining client's retained layer learns (Alg. 2 l. 10)
        assert all(len(kept) == 1 for kept in retained)
        for i, kept in zip(joining, retained):
            (layer,) = kept
            for name, head in (("head_weight", lambda t: t[i][:, layer]), ("head_bias", lambda t: t[i][layer])):
                want = head(steps[name])
                assert want.abs().max() > 1e-6, (name, i, layer)
                torch.testing.assert_close(head(after[name]).double() - head(before[name]).double(), want,
                                           rtol=1e-3, atol=1e-3 * float(want.abs().max()))


# ----------------------------------------------------------------------------- 3. HeurpFedLA, Alg. 2 / Eq. (12)

def _run_rounds(k, rounds, favour_layer=None, monkeypatch=None):
    """``rounds`` rounds of pfedla_round on group data; records the model each client starts
    from and the model it trained, per round."""
    data = group_data()
    n = data.num_clients
    worker, sizes, stored_models, hn = seeded_setup(data)
    if favour_layer is not None:
        with torch.no_grad():  # make layer `favour_layer` the top self-weight layer of every client
            hn.head_bias[torch.arange(n), favour_layer, torch.arange(n)] += 3.0
    log = []
    real_train = common.local_train

    def recording_train(model, *a, **kw):
        start = common.flatten_state(model).clone()
        loss = real_train(model, *a, **kw)
        log[-1].append((start, common.flatten_state(model).clone()))
        return loss

    monkeypatch.setattr(common, "local_train", recording_train)
    args, traffic = make_args(k=k), []
    for r in range(1, rounds + 1):
        log.append([])
        _, down, up = pfedla_round(hn, stored_models, worker, data, list(range(n)), args, r, sizes)
        traffic.append((down, up))
    return log, traffic, sizes, hn, stored_models


def test_k0_is_pfedla_and_k1_retains_top_self_weight_layer(monkeypatch):
    data_n, layer = 6, 1  # MLP: layer 0 = fc1, layer 1 = fc (the classifier)
    # k = 0: the personalised model is exactly the layer-wise aggregate of Eq. (5)-(6)
    alpha = torch.softmax(torch.randn(data_n, 2, data_n), -1)
    cm = torch.randn(data_n, 30)
    ids = torch.arange(data_n)
    keep0 = pfedla.retained_layers(alpha, ids, 0)
    assert not keep0.any()
    aggregate = pfedla.aggregate_layerwise(alpha, cm, [10, 20])
    assert torch.equal(pfedla.with_retained_layers(aggregate, cm, ids, [10, 20], keep0), aggregate)

    log0, traffic0, sizes, _, models0 = _run_rounds(0, 2, favour_layer=layer, monkeypatch=monkeypatch)
    log1, traffic1, _, hn1, models1 = _run_rounds(1, 2, favour_layer=layer, monkeypatch=monkeypatch)
    with torch.no_grad():
        alpha = hn1(ids)
    self_weight = alpha[ids, :, ids]
    assert (self_weight.argmax(1) == layer).all()
    torch.testing.assert_close(pfedla.retained_layers(alpha, ids, 1),
                               torch.nn.functional.one_hot(torch.full((data_n,), layer), 2).bool())
    a, b = sum(sizes[:layer]), sum(sizes[:layer + 1])
    for client in range(data_n):
        start_r2, _ = log1[1][client]
        _, trained_r1 = log1[0][client]
        assert torch.equal(start_r2[a:b], trained_r1[a:b])  # retained layer = its own trained parameters
        assert not torch.allclose(log0[1][client][0][a:b], trained_r1[a:b])  # (pFedLA would aggregate it)
    # the round-1 models are identical for k=0 and k=1 (all stored models equal the init)
    torch.testing.assert_close(log0[0][0][1], log1[0][0][1])
    for (down0, up0), (down1, up1) in zip(traffic0, traffic1):
        assert down0 == data_n * sum(sizes) * 4 and up0 == up1 == data_n * sum(sizes) * 4
        assert down0 - down1 == data_n * sizes[layer] * 4  # exactly the retained layer is not sent


# ----------------------------------------------------------------------------- 4. groups are discovered

def test_clients_weight_their_own_label_group_highest():
    data = group_data()
    n, group = data.num_clients, torch.arange(data.num_clients) // 2
    worker, sizes, stored_models, hn = seeded_setup(data)
    args = make_args(hn_lr=2.0)
    for r in range(1, 9):
        pfedla_round(hn, stored_models, worker, data, list(range(n)), args, r, sizes)
    with torch.no_grad():
        alpha = hn(torch.arange(n))  # (client, layer, client)
    same = group[:, None] == group[None, :]
    own_group = (alpha * same[:, None, :]).sum(-1)  # (client, layer)
    per_group = torch.stack([alpha[:, :, group == g].sum(-1) for g in range(3)], -1)
    other_best = per_group.masked_fill(torch.nn.functional.one_hot(group, 3).bool()[:, None, :], -1).max(-1).values
    # measured after 8 rounds (seed 0): own-group weight >= 0.73, other groups <= 0.15, margin 0.58
    assert (own_group - other_best).min() > 0.4
    # the same-group partner alone gets more than any client of another group (measured: >= 2.2x)
    partner = alpha[torch.arange(n), :, torch.arange(n) ^ 1]
    stranger = alpha.masked_fill(same[:, None, :], -1).max(-1).values
    assert (partner / stranger).min() > 1.5


# ----------------------------------------------------------------------------- 5. memory

@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_no_tensor_growth_over_rounds():
    data = group_data()
    worker, sizes, stored_models, hn = seeded_setup(data)
    args, counts = make_args(), []
    for r in range(1, 7):
        pfedla_round(hn, stored_models, worker, data, [0, 2, 3], args, r, sizes)
        pfedla.evaluate_personalised(hn, stored_models, worker, data, sizes, 0)
        gc.collect()
        counts.append(sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor)))
    assert counts[-1] == counts[1], counts
    assert all(p.grad is None for p in hn.parameters())


# ----------------------------------------------------------------------------- 6. CLI



@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_quick_start_synthetic_under_a_minute_prints_hn_size_and_counts_bytes(script, tmp_path):
    t0 = time.time()
    r = script("pfedla.py", "--dataset", "synthetic", "--rounds", 10, "--out", tmp_path, timeout=120)
    elapsed = time.time() - t0
    assert r.returncode == 0, r.stderr
    assert elapsed < 60, elapsed
    n, e, h, layers = 10, 100, 100, 2  # mlp on synthetic: fc1, fc
    per_client = e + (e * h + h) + 2 * (h * h + h) + layers * (h * n + n)
    m = re.search(r"hypernetworks: (\d+) x (\d+) = (\d+) parameters", r.stdout)
    assert m and (int(m[1]), int(m[2]), int(m[3])) == (n, per_client, n * per_client), r.stdout
    d = 60 * 64 + 64 + 64 * 10 + 10
    rows = metrics_rows(run_dir(tmp_path))
    assert len(rows) == 10 and float(rows[-1]["test_acc_mean"]) > 50
    with open(os.path.join(run_dir(tmp_path), "summary.json")) as f:
        summary = json.load(f)
    assert summary["mb_down"] == summary["mb_up"] == 10 * n * d * 4 / 2 ** 20


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_resume_gives_the_uninterrupted_result(script, tmp_path):
    common_args = ["--dataset", "synthetic", "--rounds", 4, "--local-epochs", 1, "--num-clients", 5,
                   "--join-ratio", 0.6, "--k", 1, "--checkpoint-every", 2]
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_in_process("pfedla.py", *common_args, "--out", full) == 0
    r = script("pfedla.py", *common_args, "--out", part, "--stop-after", 2)
    assert r.returncode == 0, r.stderr
    r = script("pfedla.py", "--resume", run_dir(part))
    assert r.returncode == 0, r.stderr
    machine = {"seconds", "sec_per_round", "host_mb", "device_mb"}  # wall time and memory differ
    strip = lambda rows: [{k: v for k, v in row.items() if k not in machine} for row in rows]
    assert strip(metrics_rows(run_dir(part))) == strip(metrics_rows(run_dir(full)))


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
@pytest.mark.parametrize("flags", [["--k", "3"], ["--k", "-1"]])
def test_bad_k_is_one_line_exit_2(script, tmp_path, flags):
    r = script("pfedla.py", "--dataset", "synthetic", "--rounds", 1, "--out", tmp_path, *flags)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--k" in r.stderr


def test_clients_in_parallel_give_the_same_rounds_as_one_at_a_time():
    data = group_data()
    outcomes = []
    for num_workers in (1, 3):
        worker, sizes, stored_models, hn = seeded_setup(data)
        workers = [worker] + [copy.deepcopy(worker) for _ in range(num_workers - 1)]
        for r in range(1, 4):
            loss, _, _ = pfedla_round(hn, stored_models, workers, data, [0, 2, 3, 5], make_args(), r, sizes)
        outcomes.append((stored_models, common.flatten_state(hn), loss))
    (m1, h1, l1), (m3, h3, l3) = outcomes
    assert torch.equal(m1, m3) and torch.equal(h1, h3) and l1 == l3
    assert not torch.equal(m1[0], m1[1])  # clients 0 (trained) and 1 (not sampled) differ


# ----------------------------------------------------------------------------- 7. the paper's model (Sec. 4.1, Table 3)

def _fake_images(shape, classes=10):
    return argparse.Namespace(x=torch.zeros(2, *shape), num_classes=classes, vocab_size=0, info={})


def test_auto_model_is_the_cnn_whose_sizes_table_3_implies():
    """Table 3 was computed from the model's size: its k=0 costs are 1500 x (121,278 and 85,822
    float32 parameters) in MiB, and its savings for k = 1..3 are half the share of the retained
    layers (they are not sent server->client, but still sent client->server)."""
    cifar = common.build_model("auto", _fake_images((3, 32, 32)), auto_image=pfedla.AUTO_IMAGE)
    emnist = common.build_model("auto", _fake_images((1, 28, 28)), auto_image=pfedla.AUTO_IMAGE)
    params = lambda m: sum(p.numel() for p in m.parameters())
    assert (params(cifar), params(emnist)) == (121_278, 85_822)
    assert [n for n, _ in common.layers(cifar)] == ["conv1", "bn1", "conv2", "bn2", "fc1", "fc2", "fc3"]
    assert [n for n, _ in common.layers(emnist)] == ["conv1", "conv2", "fc1", "fc2", "fc3"]  # no BN on grey

    for model, k0 in ((cifar, 693.98), (emnist, 491.08)):
        assert 1500 * params(model) * 4 / 2 ** 20 == pytest.approx(k0, rel=0.005)
    assert (params(cifar) / params(emnist)) == pytest.approx(693.98 / 491.08, rel=0.005)

    def cost_ratio(model, retained):  # pfedla.main's count: up all layers, down all but the retained
        sizes = dict(zip((n for n, _ in common.layers(model)), pfedla.layer_sizes(model)))
        total = sum(sizes.values())
        return (2 * total - sum(sizes[name] for name in retained)) / (2 * total)

    table_3 = {cifar: [(["fc1"], 418.97 / 693.98), (["fc1", "conv2"], 382.25 / 693.98),
                       (["fc1", "conv2", "fc3"], 379.82 / 693.98)],
               emnist: [(["fc3"], 488.65 / 491.08), (["fc3", "fc1"], 312.52 / 491.08)]}
    for model, rows in table_3.items():
        for retained, paper in rows:
            assert cost_ratio(model, retained) == pytest.approx(paper, rel=0.005), retained
    lenet = common.build_model("lenet", _fake_images((3, 32, 32)))  # the model we used before: far off
    assert params(lenet) / params(cifar) < 0.6


# ----------------------------------------------------------------------------- 8. HeurpFedLA's step, Alg. 2 l. 10

def test_heurpfedla_step_trains_the_retained_layers_heads_with_the_full_aggregate(monkeypatch):
    """Alg. 2 l. 10 updates v_i, psi_i by Eq. 10-11 with theta_bar_i of l. 5 (every layer
    aggregated) and Delta theta_i over all layers (its return line), so the head of a retained layer moves.
    Its step equals the one computed by hand from the full aggregate."""
    data = group_data()
    n, layer = data.num_clients, 1
    worker, sizes, stored_models, hn = seeded_setup(data)
    with torch.no_grad():
        hn.head_bias[torch.arange(n), layer, torch.arange(n)] += 3.0  # layer 1 is every client's top layer
    args, ids = make_args(k=1), torch.arange(n)
    pfedla_round(hn, stored_models, worker, data, list(range(n)), args, 1, sizes)  # stored models now differ
    before = copy.deepcopy(hn)
    stored = stored_models.clone()
    log = []
    real_train = common.local_train

    def recording_train(model, *a, **kw):
        start = common.flatten_state(model).clone()
        loss = real_train(model, *a, **kw)
        log.append((start, common.flatten_state(model).clone()))
        return loss

    monkeypatch.setattr(common, "local_train", recording_train)
    pfedla_round(hn, stored_models, worker, data, list(range(n)), args, 2, sizes)
    a, b = sum(sizes[:layer]), sum(sizes[:layer + 1])
    received = torch.stack([start for start, _ in log])
    trained = torch.stack([end for _, end in log])
    assert torch.equal(received[:, a:b], stored[:, a:b])  # the client kept its own retained layer
    head_moved = (hn.head_weight[:, :, layer] - before.head_weight[:, :, layer]).abs().amax(dim=(1, 2))
    assert (head_moved > 0).all(), head_moved  # before the fix: exactly zero
    # by hand: the gradient step on 1/2 ||theta_bar - sg(theta_bar + Delta)||^2 with the full aggregate
    theta_bar = pfedla.aggregate_layerwise(before(ids), stored, sizes)
    loss = -(theta_bar * (trained - received)).sum()
    grads = torch.autograd.grad(loss, list(before.parameters()))
    for p_new, p_old, g in zip(hn.parameters(), before.parameters(), grads):
        torch.testing.assert_close(p_new.detach(), p_old.detach() - args.hn_lr * g, rtol=1e-5, atol=1e-6)
    assert torch.equal(stored_models, trained)  # theta_i := received + Delta theta_i, the trained model


def test_hypernetworks_draw_their_initialisation_from_the_given_generator():
    """LayerHypernetworks(generator=g) draws only from g (the same g seed gives the same weights whatever
    the global RNG did); without one it draws from torch's global RNG, as before the argument existed."""
    def weights(**kw):
        return [p.detach().clone() for p in pfedla.LayerHypernetworks(3, 2, 4, 5, **kw).parameters()]

    torch.manual_seed(1)
    a = weights(generator=torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = weights(generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(1)
    c, after = weights(), torch.rand(1)
    torch.manual_seed(1)
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    g = torch.Generator().manual_seed(1)  # the global RNG seeded 1 draws as a generator seeded 1
    assert all(torch.equal(x, y) for x, y in zip(c, weights(generator=g))) and not torch.equal(after, torch.rand(1))
