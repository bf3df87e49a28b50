"""FedACD (fedacd.py): losses Eq. (7)-(9), P^m, score Eq. (10), aggregation Eq. (11), the
evaluation protocol (Tables 1-3) and the command line."""
import copy
import json
import math
import os
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import common
import fedacd
import run_folder
from rounds import fedacd_local_train as local_train, fedacd_round
from conftest import metrics_rows, run_dir
from test_main_loops import class_mean_softmax, fedacd_objective, kl_score, margins_of
from tools import fedacd_diagnostics, run_records

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """2 shared cores: torch's intra-op thread pool slows tiny models down many-fold."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def log_probs(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


# ----------------------------------------------------------------------------- 1. L1, Eq. (7)

def test_l1_zero_when_misclassification_is_flat_positive_otherwise():
    p = log_probs([0.6, 0.2, 0.2], [0.1, 0.45, 0.45], [0.6, 0.3, 0.1], [0.3, 0.2, 0.5])
    loss = fedacd.flattening_loss(p, torch.tensor([0, 0, 0, 1]))
    assert (loss[:2].abs() < 1e-12).all()  # the wrong classes are equally likely: already flat
    assert loss[2] > 0 and loss[3] > 0  # wrong classes (0.3, 0.1), and (0.3, 0.5) for label 1


def test_l1_hand_computation_three_classes():
    # p = (0.7, 0.2, 0.1), y = 0: q = (0.7, 0.15, 0.15)
    expected = 0.2 * math.log(0.2 / 0.15) + 0.1 * math.log(0.1 / 0.15)
    got = fedacd.flattening_loss(log_probs([0.7, 0.2, 0.1]), torch.tensor([0]))
    assert got.item() == pytest.approx(expected, abs=1e-12)
    # label 2: q = (0.45, 0.45, 0.1)
    expected = 0.7 * math.log(0.7 / 0.45) + 0.2 * math.log(0.2 / 0.45)
    assert fedacd.flattening_loss(log_probs([0.7, 0.2, 0.1]), torch.tensor([2])).item() == pytest.approx(expected)


def test_l1_gradient_matches_undetached_q_and_is_finite_for_tiny_probabilities():
    logits = torch.tensor([[1.0, -0.5, 0.3, 2.0], [0.2, 0.1, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, 1])
    fedacd.flattening_loss(logits, y).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    p = logits.softmax(1)  # naive KL(p || q) with q built from p (q is not detached)
    p_y = p.gather(1, y[:, None])
    q = torch.where(F.one_hot(y, 4).bool(), p_y, (1 - p_y) / 3)
    (p * (p / q).log()).sum().backward()
    assert torch.allclose(ours, logits.grad, atol=1e-12)

    extreme = torch.tensor([[60.0, -60.0, 0.0], [0.0, 90.0, -90.0], [300.0, 0.0, 0.0]], requires_grad=True)
    loss = fedacd.flattening_loss(extreme, torch.tensor([0, 0, 0])).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(extreme.grad).all()


# ----------------------------------------------------------------------------- 2. L2, Eq. (8)

def test_l2_with_unit_deltas_is_cross_entropy_and_matches_eq8():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 1, 0])
    ones = torch.ones(4, 4, dtype=torch.float64)
    assert torch.allclose(fedacd.adjusted_margin_loss(logits, y, ones), F.cross_entropy(logits, y, reduction="none"))
    delta = torch.rand(4, 4, generator=g, dtype=torch.float64) + 0.2
    direct = torch.stack([torch.log(1 + sum(torch.exp(logits[n, i] - logits[n, y[n]]) * delta[y[n], i]
                                            for i in range(4) if i != y[n])) for n in range(6)])
    assert torch.allclose(fedacd.adjusted_margin_loss(logits, y, delta), direct)


def test_l2_delta_below_one_lowers_and_above_one_raises_the_term_for_that_class():
    logits, y = torch.tensor([[0.5, 0.2, -0.3]]), torch.tensor([0])
    base = fedacd.adjusted_margin_loss(logits, y, torch.ones(3, 3))
    for value, relation in ((0.5, "lower"), (2.0, "higher")):
        delta = torch.ones(3, 3)
        delta[0, 2] = value  # Delta_{y=0, i=2}
        changed = fedacd.adjusted_margin_loss(logits, y, delta)
        assert (changed < base).all() if relation == "lower" else (changed > base).all()
        other = torch.ones(3, 3)
        other[1, 2] = value  # a row for another label leaves this sample's loss alone
        assert torch.allclose(fedacd.adjusted_margin_loss(logits, y, other), base)


def test_margin_deltas_ratio_and_missing_classes():
    P = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.2, 0.7, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.2, 0.6]])
    present = torch.tensor([True, True, False, True])
    delta = fedacd.margin_deltas(P, present, missing_delta=0.01)
    assert delta[0, 1] == pytest.approx(0.3 / 0.2) and delta[1, 0] == pytest.approx(0.2 / 0.3)
    assert delta[3, 0] == pytest.approx(0.1 / 1e-8, rel=1e-5)  # P_30 / P_03 with P_03 = 0 clamped to 1e-8
    assert delta[0, 3] == pytest.approx(1e-8)  # P_03 / P_30 = 0, clamped away from 0
    assert torch.allclose(delta[:, 2][present], torch.full((3,), 0.01))  # class 2 absent: --missing-delta
    assert torch.allclose(delta.diagonal(), torch.ones(4))


def test_fedacd_loss_is_l1_plus_lambda_l2():
    logits, y, delta = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0]), torch.rand(3, 3) + 0.5
    want = fedacd.flattening_loss(logits, y) + 1.5 * fedacd.adjusted_margin_loss(logits, y, delta)
    assert torch.allclose(fedacd.fedacd_loss(logits, y, delta, 1.5), want)


# ----------------------------------------------------------------------------- 3. probability matrix P^m

def test_probability_matrix_is_the_per_class_mean_softmax():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 4))
    x, y = torch.randn(30, 5), torch.tensor([0, 1, 3] * 10)
    idx = torch.arange(2, 29)
    P = fedacd.probability_matrix(model, ((x[b], y[b]) for b in idx.split(7)), 4)
    with torch.no_grad():
        probs = model(x).softmax(1)
    for c in range(4):
        members = [int(i) for i in idx if y[i] == c]
        want = probs[members].mean(0) if members else torch.zeros(4)
        assert torch.allclose(P[c], want, atol=1e-6)
    assert (P[2] == 0).all()  # no samples of class 2


def test_mixup_accumulation_uses_the_mixing_weights():
    sums = torch.zeros(3, 3)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]])
    fedacd.accumulate_probabilities(sums, p, torch.tensor([0, 1]), torch.tensor([1, 2]), 0.25)
    want = torch.zeros(3, 3)
    want[0] += 0.25 * p[0]
    want[1] += 0.75 * p[0] + 0.25 * p[1]
    want[2] += 0.75 * p[1]
    assert torch.allclose(sums, want)
    P = fedacd.rows_to_matrix(sums, torch.full((3, 3), -1.0))
    assert torch.allclose(P[1], (0.75 * p[0] + 0.25 * p[1]) / 1.0)
    assert torch.allclose(P[0], p[0]) and torch.allclose(P[2], p[1])  # weights 0.25 and 0.75 normalised away


def batches_of(data, idx, size=1024):
    """The client's unmixed (x, y) train batches, as fedacd.client_update gives them to P^m."""
    return ((data.x[b], data.y[b]) for b in idx.split(size))


def _tiny_data(num_clients=3, seed=0):
    args = fedacd.parse_args(["--dataset", "synthetic", "--num-clients", str(num_clients), "--seed", str(seed),
                              "--device", "cpu"])
    return args, common.load_federated_data(args, CPU)


@pytest.mark.parametrize("mixup", [True, False])
def test_local_training_mixes_losses_and_replaces_p_with_the_epochs_mixup_weighted_outputs(mixup):
    """The schedule of fedacd_local_training on a frozen model (lr 0), two epochs, recomputed by hand:
    epoch 1's margins from the received model's unmixed P^m, epoch 2's from epoch 1's outputs weighted
    by mixup; the returned P^m is the trained model's unmixed one. P^m, Eq. (8)'s margins and the loss of
    Eq. (9) are test_main_loops' plain ones, never fedacd's."""
    args, data = _tiny_data()
    args.local_epochs, args.lr, args.momentum, args.weight_decay, args.mixup = 2, 0.0, 0.0, 0.0, mixup  # frozen model
    torch.manual_seed(1)
    model = common.build_model("auto", data)
    idx, present = data.train_idx[0], torch.as_tensor(data.train_counts[0] > 0)
    loss, P = local_train(model, data, idx, present, args, batch_seed=5, mixup_seed=7)
    clean = class_mean_softmax(model, data.x[idx], data.y[idx], 10)
    torch.testing.assert_close(P, clean, rtol=1e-5, atol=1e-6)  # the trained model's P^m, for V_m
    margins, losses, g = margins_of(clean, present, 0.01), [], torch.Generator().manual_seed(7)
    epochs = list(common.epoch_batches(idx, args.batch_size, 2, 5))
    per_epoch = len(epochs) // 2
    for epoch in (epochs[:per_epoch], epochs[per_epoch:]):
        sums = torch.zeros(10, 10)
        with torch.no_grad():
            for batch in epoch:
                xb, yb = data.x[batch], data.y[batch]
                if mixup:
                    mix = float(torch.rand((), generator=g))
                    perm = torch.randperm(len(batch), generator=g)
                    logits = model(mix * xb + (1 - mix) * xb[perm])
                    weights = mix * F.one_hot(yb, 10) + (1 - mix) * F.one_hot(yb[perm], 10)  # sample n -> class rows
                    losses.append(mix * fedacd_objective(logits, yb, margins, 1.0).mean()
                                  + (1 - mix) * fedacd_objective(logits, yb[perm], margins, 1.0).mean())
                else:
                    logits = model(xb)
                    weights = F.one_hot(yb, 10).float()
                    losses.append(fedacd_objective(logits, yb, margins, 1.0).mean())
                sums += weights.T @ logits.softmax(1)
        rows = sums.sum(1) > 0
        epoch_P = clean.clone()
        epoch_P[rows] = sums[rows] / sums[rows].sum(1, keepdim=True)
        margins = margins_of(epoch_P, present, 0.01)  # the next epoch's
    assert loss.item() == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)
    if mixup:  # the mixed outputs moved P^m, so epoch 2 trained with other margins than epoch 1
        assert not torch.allclose(epoch_P, clean, atol=1e-3)


def test_schedule_piece_needs_only_torch_and_gives_client_update_s_result():
    """fedacd_local_training pasted alone (with the pieces it calls) into torch-only code, fed plain
    (x, y_a, y_b, mix) batches, gives the script's client update bit for bit (trained model, loss, and the
    score from P^m)."""
    from test_paste import paste_pieces
    args, data = _tiny_data()
    args.local_epochs, client, round_ = 2, 1, 3
    idx, present = data.train_idx[client], torch.as_tensor(data.train_counts > 0)
    seeds = common.client_seed(args.seed, round_, client), common.client_seed(args.seed, round_, client, tag=1)
    torch.manual_seed(1)
    model = common.build_model("auto", data)
    initial = common.flatten_state(model).clone()
    trained, loss, score, kl = fedacd.client_update(model, initial, data, client, fedacd.held_classes(data), args,
                                                    round_)
    train = paste_pieces("fedacd.py", "fedacd_local_training")["fedacd_local_training"]
    common.load_flat_state(model, initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    pasted_loss, P = train(model, optimizer, fedacd.mixup_epochs(data, idx, args, *seeds),
                           lambda: batches_of(data, idx), 10, present[client], args.lam, args.missing_delta)
    assert torch.equal(pasted_loss, loss) and torch.equal(common.flatten_state(model), trained)
    assert torch.equal(fedacd.aggregation_score(P, present[client], args.tau, reduction="mean")[0], score)


def test_each_epoch_s_batches_do_not_depend_on_the_others_being_read():
    """mixup_epochs draws every batch's mix and pairing at once: epoch 2 read alone gives what it gives
    after epoch 1 (no iterable sliced from one shared stream)."""
    args, data = _tiny_data()
    args.local_epochs = 3
    idx = data.train_idx[0]
    in_order = [list(epoch) for epoch in fedacd.mixup_epochs(data, idx, args, 5, 7)]
    alone = list(fedacd.mixup_epochs(data, idx, args, 5, 7)[1])
    assert len(alone) == len(in_order[1]) > 0
    for (x, y_a, y_b, mix), (x2, y_a2, y_b2, mix2) in zip(alone, in_order[1]):
        assert torch.equal(x, x2) and torch.equal(y_a, y_a2) and torch.equal(y_b, y_b2) and mix == mix2 != 1


def test_mixup_loss_mixes_the_two_labels_losses():
    """Input mixup's loss: mix * CE(y_a) + (1 - mix) * CE(y_b), computed here by hand from log-softmax;
    mix = 1 is the plain batch mean. --fedavg's local update feeds it cross-entropy, FedACD L1 + L2."""
    g = torch.Generator().manual_seed(3)
    logits, y_a, y_b = (torch.randn(7, 5, generator=g), torch.randint(5, (7,), generator=g),
                        torch.randint(5, (7,), generator=g))
    cross_entropy = lambda logits, y: F.cross_entropy(logits, y, reduction="none")  # noqa: E731
    by_hand = lambda y: -F.log_softmax(logits, 1)[torch.arange(7), y].mean()  # noqa: E731
    assert fedacd.mixup_loss(cross_entropy, logits, y_a, y_b, 0.3).item() == \
        pytest.approx((0.3 * by_hand(y_a) + 0.7 * by_hand(y_b)).item(), rel=1e-6)
    assert fedacd.mixup_loss(cross_entropy, logits, y_a, y_b, 1.0).item() == pytest.approx(by_hand(y_a).item())
    margins = torch.rand(5, 5, generator=g) + 0.5
    fedacd_loss = lambda logits, y: fedacd.fedacd_loss(logits, y, margins, 1.0)  # noqa: E731
    assert fedacd.mixup_loss(fedacd_loss, logits, y_a, y_b, 0.25).item() == pytest.approx(
        (0.25 * fedacd_loss(logits, y_a).mean() + 0.75 * fedacd_loss(logits, y_b).mean()).item(), rel=1e-6)


def test_fedavg_flag_gives_fedavg_py_metrics_and_fedacd_diagnostics(tmp_path):
    """tools/fedacd_diagnostics.py --fedavg --no-mixup is FedAvg: every column fedavg.py writes is equal on
    the same settings (timing aside), and local_risk and local_kl are written besides when asked (--log-risk,
    --log-kl); without them, not. Without --fedavg its columns are fedacd.py's."""
    import fedavg
    flags = ["--dataset", "synthetic", "--num-clients", "6", "--rounds", "3", "--join-ratio", "0.5",
             "--local-epochs", "2", "--batch-size", "16", "--lr", "0.01", "--momentum", "0.9", "--weight-decay", "1e-5",
             "--test-split", "global", "--parallel-clients", "1"]  # synthetic data: no partition flags
    fedavg.main(flags + ["--out", str(tmp_path / "fedavg")])
    fedacd_diagnostics.main(flags + ["--fedavg", "--no-mixup", "--log-risk", "--log-kl", "--out",
                                     str(tmp_path / "diag")])
    fedacd_diagnostics.main(flags + ["--fedavg", "--no-mixup", "--out", str(tmp_path / "bare")])
    fedacd.main(flags + ["--no-mixup", "--out", str(tmp_path / "fedacd")])
    fedacd_diagnostics.main(flags + ["--no-mixup", "--log-risk", "--out", str(tmp_path / "acd-risk")])
    plain, diag, bare, acd, acd_risk = (metrics_rows(run_dir(tmp_path / name))
                                        for name in ("fedavg", "diag", "bare", "fedacd", "acd-risk"))
    timing = {"seconds", "sec_per_round", "host_mb", "device_mb"}
    columns = [c for c in plain[0] if c not in timing]
    assert "global_acc" in columns and "mb_up" in columns
    assert [{c: r[c] for c in columns} for r in diag] == [{c: r[c] for c in columns} for r in plain]
    assert [{c: r[c] for c in columns} for r in bare] == [{c: r[c] for c in columns} for r in plain]
    assert [{c: r[c] for c in columns} for r in acd] != [{c: r[c] for c in columns} for r in plain]
    assert not {"local_risk", "local_kl", "score_min", "score_max"} & set(bare[0])  # nothing computed unasked
    assert "local_kl" in acd[0] and "local_risk" not in acd[0]  # FedACD's KL comes with its score
    timing = timing | {"local_risk"}
    assert [{c: r[c] for c in r if c not in timing} for r in acd_risk] == \
        [{c: r[c] for c in r if c not in timing} for r in acd]
    for r in diag:
        assert 0 <= float(r["local_risk"]) <= 1 and math.isfinite(float(r["local_kl"])) and float(r["local_kl"]) > 0
    assert os.path.basename(run_dir(tmp_path / "diag")).startswith("fedacd-fedavg-")


def test_fedavg_flag_excludes_uniform_aggregation():
    with pytest.raises(common.UserError, match="--uniform-agg"):
        fedacd_diagnostics.parse_args(["--dataset", "synthetic", "--fedavg", "--uniform-agg"])


def test_p_matrix_is_replaced_at_every_epoch_end_when_a_single_sample_batch_is_merged():
    args, data = _tiny_data()
    args.local_epochs, args.lr, args.momentum, args.weight_decay, args.mixup = 3, 0.0, 0.0, 0.0, False
    args.batch_size = 10
    torch.manual_seed(1)
    model = common.build_model("auto", data)
    idx, present = data.train_idx[0][:21], torch.as_tensor(data.train_counts[0] > 0)  # batches of 10 and 11
    loss, P = local_train(model, data, idx, present, args, batch_seed=5, mixup_seed=7)
    rows = torch.bincount(data.y[idx], minlength=10) > 0
    expected = class_mean_softmax(model, data.x[idx], data.y[idx], 10)  # frozen: every epoch's P^m is this
    assert torch.allclose(P[rows], expected[rows], atol=1e-5)
    with torch.no_grad():  # test_main_loops' plain P^m, margins and loss, never fedacd's
        by_hand = torch.stack([fedacd_objective(model(data.x[b]), data.y[b], margins_of(expected, present, 0.01),
                                                1.0).mean()
                               for b in common.epoch_batches(idx, 10, 3, 5)]).mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)  # the mean over the 6 steps taken


# ----------------------------------------------------------------------------- 4. score Eq. (10), aggregation Eq. (11)

def test_score_hand_example_and_absent_rows_left_out():
    P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    tau = 0.99999
    off = (1 - tau) / 2
    kl = sum(P[i, j].item() * math.log(P[i, j].item() / (tau if i == j else off)) for i in range(3) for j in range(3))
    V, got_kl = fedacd.aggregation_score(P, torch.ones(3, dtype=torch.bool), tau, reduction="sum")
    assert got_kl.item() == pytest.approx(kl, rel=1e-6)
    assert V.item() == pytest.approx(1 / (1 + math.exp(-1 / kl)), rel=1e-9)
    V_mean, kl_mean = fedacd.aggregation_score(P, torch.ones(3, dtype=torch.bool), tau, reduction="mean")  # ours
    assert fedacd.aggregation_score(P, torch.ones(3, dtype=torch.bool), tau) == (V_mean, kl_mean)  # the default
    assert kl_mean.item() == pytest.approx(kl / 3, rel=1e-6)
    assert V_mean.item() == pytest.approx(1 / (1 + math.exp(-3 / kl)), rel=1e-9)
    Q = fedacd.template_matrix(3, tau)
    assert torch.allclose(Q.sum(1), torch.ones(3, dtype=torch.float64)) and Q[0, 0] == tau

    present = torch.tensor([True, False, True])
    kl_present = sum(P[i, j].item() * math.log(P[i, j].item() / (tau if i == j else off))
                     for i in (0, 2) for j in range(3))
    V1, kl1 = fedacd.aggregation_score(P, present, tau, reduction="sum")
    garbage = P.clone()
    garbage[1] = torch.tensor([0.0, 0.0, 1.0])
    V2, _ = fedacd.aggregation_score(garbage, present, tau, reduction="sum")
    assert kl1.item() == pytest.approx(kl_present, rel=1e-6) and V1 == V2
    _, kl_mean = fedacd.aggregation_score(P, present, tau, reduction="mean")
    assert kl_mean.item() == pytest.approx(kl_present / 2, rel=1e-6)


def test_mean_score_separates_a_good_local_model_from_a_poor_one_where_the_sum_cannot():
    """Table 9's scale: a client whose model is nearly diagonal on its 50 classes (KL per row
    about 0.6, FedACD's CIFAR-100 figure) against one near FedAvg's 5. With the per-row mean the
    weights differ clearly; with the sum over 50 rows every V_m is within 1% of 0.5 and the
    weights are uniform to about 1% (FedACD_base in all but name)."""
    tau, C = 0.99999, 100
    present = torch.zeros(C, dtype=torch.bool)
    present[:50] = True

    def model_matrix(diagonal):
        P = torch.full((C, C), (1 - diagonal) / (C - 1), dtype=torch.float64)
        return P.fill_diagonal_(diagonal)

    good, poor = model_matrix(0.95), model_matrix(0.60)
    kls = {r: [fedacd.aggregation_score(P, present, tau, reduction=r)[1].item() for P in (good, poor)]
           for r in ("mean", "sum")}
    assert 0.3 < kls["mean"][0] < 1.0 and 3.0 < kls["mean"][1] < 8.0  # Table 9: 0.60-0.83 and 4.06-5.59
    for reduction, spread in (("mean", "wide"), ("sum", "uniform")):
        V = torch.stack([fedacd.aggregation_score(P, present, tau, reduction=reduction)[0] for P in (good, poor)])
        weights = fedacd.aggregation_weights(V)
        off_uniform = (weights / 0.5 - 1).abs().max().item()
        assert (off_uniform > 0.05) if spread == "wide" else (off_uniform < 0.02), (reduction, weights)
    assert fedacd.parse_args(["--dataset", "synthetic"]).score_kl == "mean"  # the script's choice, not the piece's


def test_aggregation_weights():
    V = torch.tensor([0.6, 0.9, 0.75], dtype=torch.float64)
    assert torch.allclose(fedacd.aggregation_weights(V), V / V.sum())
    stack = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(fedacd.server_update(stack, list(V)), (V / V.sum()) @ stack)
    assert torch.allclose(fedacd.server_update(stack, list(V), uniform=True), stack.mean(0))  # FedACD_base


@pytest.mark.parametrize("uniform", [False, True])
def test_round_aggregates_with_scores_of_the_trained_models(uniform):
    args, data = _tiny_data(num_clients=4)
    args.local_epochs, args.uniform_agg = 1, uniform
    torch.manual_seed(0)
    global_model, worker, check = (common.build_model("auto", data) for _ in range(3))
    clients = [0, 2, 3]
    D = sum(v.numel() for v in common.float_state(global_model))
    stack = torch.empty(len(clients), D)
    present = torch.as_tensor(data.train_counts > 0)
    fedacd_round(global_model, worker, data, clients, args, 1, stack)
    scores = []
    assert args.score_kl == "mean"  # the script's default, which kl_score computes
    for slot, c in enumerate(clients):  # V_m recomputed from each uploaded model, P^m and Eq. (10) by hand
        common.load_flat_state(check, stack[slot])
        idx = data.train_idx[c]
        scores.append(float(kl_score(class_mean_softmax(check, data.x[idx], data.y[idx], 10), present[c], args.tau)[0]))
    w = torch.ones(3) / 3 if uniform else torch.tensor(scores) / sum(scores)
    want = (w[:, None] * stack).sum(0)
    assert torch.allclose(common.flatten_state(global_model), want, atol=1e-6)
    if uniform:
        assert torch.allclose(common.flatten_state(global_model), stack.mean(0), atol=1e-6)


# ----------------------------------------------------------------------------- 5. evaluation protocol

@pytest.fixture
def npz_dataset(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), [300, 200, 150, 50])
    y_test = np.repeat(np.arange(4), 100)
    path = tmp_path / "fabricated.npz"
    np.savez(path, x=(rng.normal(size=(700, 6)) + y[:, None]).astype(np.float32), y=y,
             x_test=(rng.normal(size=(400, 6)) + y_test[:, None]).astype(np.float32), y_test=y_test)
    return str(path)


def test_per_client_test_sets_follow_client_label_proportions(npz_dataset):
    args = fedacd.parse_args(["--dataset", npz_dataset, "--num-clients", "4", "--batch-size", "8", "--beta", "0.3",
                              "--device", "cpu"])
    assert args.test_split == "global"  # the FedACD default: the official test set
    data = common.load_federated_data(args, CPU)
    assert torch.equal(data.global_test_idx, torch.arange(700, 1100))  # the whole, uniform official test set
    assert np.bincount(data.y[data.global_test_idx].numpy(), minlength=4).tolist() == [100] * 4
    for n in range(4):
        test = data.test_idx[n]
        assert len(test) > 0 and (test >= 700).all()  # drawn from the official test set only
        prior = data.train_counts[n] / data.train_counts[n].sum()
        counts = np.bincount(data.y[test].numpy(), minlength=4)
        assert np.all(np.abs(counts - prior * len(test)) <= 1.0)
        assert np.all(counts[prior == 0] == 0)
        assert counts.tolist() == data.test_counts[n].tolist()


def test_average_risk_matches_independent_computation(npz_dataset):
    args = fedacd.parse_args(["--dataset", npz_dataset, "--num-clients", "4", "--batch-size", "8", "--beta", "0.3",
                              "--device", "cpu"])
    data = common.load_federated_data(args, CPU)
    torch.manual_seed(3)
    model = common.build_model("auto", data)
    test = data.global_test_idx
    class_idx = [test[data.y[test] == c] for c in range(4)]
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64)
    risk = fedacd_diagnostics.average_risk(fedacd_diagnostics.per_class_errors(model, data, class_idx),
                                           counts / counts.sum(1, keepdim=True))
    with torch.no_grad():
        pred = model(data.x[test]).argmax(1).numpy()
    labels = data.y[test].numpy()
    eps = np.array([np.mean(pred[labels == c] != c) for c in range(4)])
    pis = data.train_counts / data.train_counts.sum(1, keepdims=True)
    want = sum(float(eps @ pis[n]) for n in range(4)) / 4  # Eq. (3)
    assert risk.item() == pytest.approx(want, abs=1e-6)  # error rates come in float32


# ----------------------------------------------------------------------------- 6. command line

METRICS = ("round", "global_acc", "global_loss", "test_acc", "test_acc_mean", "test_acc_std", "test_loss",
           "train_loss", "local_kl", "score_min", "score_max", "local_risk", "mb_down", "mb_up")




@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_default_synthetic_run_is_fast_and_logs_all_three_tables(script, tmp_path):
    start = time.time()
    result = script("tools/fedacd_diagnostics.py", "--dataset", "synthetic", "--rounds", "10", "--device", "cpu",
                    "--log-risk",
                    "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert time.time() - start < 60
    folder = run_dir(tmp_path)
    rows = metrics_rows(folder)
    assert len(rows) == 10
    for key in ("global_acc", "test_acc", "test_acc_mean", "local_risk", "local_kl", "train_loss"):
        assert all(r[key] != "" and math.isfinite(float(r[key])) for r in rows), key
    assert all(0 <= float(r["local_risk"]) <= 1 for r in rows)
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert "global_acc" in summary["paper_reports"] and summary["local_risk"]["best"] == min(
        float(r["local_risk"]) for r in rows)
    config = json.load(open(os.path.join(folder, "config.json")))["args"]
    assert (config["num_clients"], config["join_ratio"], config["local_epochs"], config["batch_size"], config["lr"],
            config["momentum"], config["weight_decay"], config["mixup"]) == (20, 0.4, 5, 64, 0.01, 0.9, 1e-5, True)


def test_resume_gives_the_uninterrupted_result(tmp_path, capsys):
    # in-process: the same path as the command line, minus three interpreter start-ups
    flags = ["--dataset", "synthetic", "--num-clients", "5", "--rounds", "4", "--local-epochs", "1",
             "--checkpoint-every", "2", "--device", "cpu"]
    run_folder.run_main(fedacd.main, [*flags, "--out", str(tmp_path / "full")])
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedacd.main, [*flags, "--out", str(tmp_path / "part"), "--stop-after", "3"])
    assert stop.value.code == 0
    folder = run_dir(tmp_path / "part")
    assert len(metrics_rows(folder)) == 3  # and round 3 has its checkpoint: --stop-after writes one
    run_folder.run_main(fedacd.main, ["--resume", folder])
    assert "resumed" in capsys.readouterr().out
    metrics = lambda rows: [[r[k] for k in METRICS if k != "local_risk"] for r in rows]  # all but time and memory
    assert metrics(metrics_rows(folder)) == metrics(metrics_rows(run_dir(tmp_path / "full")))


def test_bad_tau_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedacd.main, ["--dataset", "synthetic", "--tau", "1.5", "--out", str(tmp_path)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and "--tau" in lines[0]


def test_clients_in_parallel_give_the_same_round_as_one_at_a_time():
    """--parallel-clients: several clients trained, scored and risk-evaluated at once on threads
    (one torch thread each, as here) give the same global model and statistics, bit for bit."""
    args, data = _tiny_data(num_clients=4)
    args.local_epochs = 2
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64)
    test = torch.cat(data.test_idx)
    risk = ([test[data.y[test] == c] for c in range(data.num_classes)], counts / counts.sum(1, keepdim=True))
    outcomes = []
    for num_workers in (1, 3):
        torch.manual_seed(0)
        global_model = common.build_model("auto", data)
        workers = [copy.deepcopy(global_model) for _ in range(num_workers)]
        stack = torch.empty(3, sum(v.numel() for v in common.float_state(global_model)))
        stats = fedacd_round(global_model, workers, data, [0, 2, 3], args, 1, stack, risk=risk)
        outcomes.append((common.flatten_state(global_model), stats))
    (g1, s1), (g3, s3) = outcomes
    assert torch.equal(g1, g3) and s1 == s3 and s1["score_min"] < s1["score_max"]


def test_a_run_made_before_the_diagnostic_flags_resumes_logging_them(tmp_path, capsys):
    """Runs made before --log-risk and --log-kl logged both at every evaluation: fedacd.py, which they were made
    with, refuses them in one line naming tools/run_records.py --upgrade, which records both on and makes the run
    tools/fedacd_diagnostics.py's; resumed there, they go on logging both."""
    flags = ["--dataset", "synthetic", "--num-clients", "3", "--rounds", "3", "--local-epochs", "1",
             "--checkpoint-every", "1", "--device", "cpu", "--fedavg", "--log-risk", "--log-kl"]
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedacd_diagnostics.main, [*flags, "--out", str(tmp_path), "--stop-after", "2"])
    assert stop.value.code == 0
    folder = run_dir(tmp_path)
    config_path, checkpoint_path = os.path.join(folder, "config.json"), os.path.join(folder, "checkpoint.pt")
    config = json.load(open(config_path))
    blob = torch.load(checkpoint_path, weights_only=False)
    for saved in (config["args"], blob["args"]):  # as an older fedacd.py wrote them
        del saved["log_risk"], saved["log_kl"]
    config["script"] = "fedacd"
    config["command"] = ["fedacd.py", *[f for f in flags if f not in ("--log-risk", "--log-kl")]]
    json.dump(config, open(config_path, "w"))
    torch.save(blob, checkpoint_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedacd.main, ["--resume", folder])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and f"python tools/run_records.py --upgrade {folder}" in err[0]
    assert run_records.main(["--upgrade", folder]) == 0
    upgraded = json.load(open(config_path))
    assert upgraded["script"] == "tools/fedacd_diagnostics" and upgraded["command"][0] == "tools/fedacd_diagnostics.py"
    assert upgraded["args"]["log_risk"] is True and upgraded["args"]["log_kl"] is True
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedacd.main, ["--resume", folder])
    assert stop.value.code == 2 and "use python tools/fedacd_diagnostics.py --resume" in capsys.readouterr().err
    run_folder.run_main(fedacd_diagnostics.main, ["--resume", folder])
    rows = metrics_rows(folder)
    assert len(rows) == 3 and rows[-1]["local_risk"] != "" and rows[-1]["local_kl"] != ""
