"""FedACD (Zhou et al., IJCAI 2025): adaptability of local models over client distributions.

Each round (Eq. 11, Appendix A.1; our choices where the paper is silent: docs/fedacd.md):
  1. the server samples round(join_ratio * N) clients and sends them the global model;
  2. each client m estimates its probability matrix P^m with the received model, then
     trains on L = L1 + lambda * L2 (Eq. 7-9) with input mixup, re-estimating P^m from
     the softmax outputs of every epoch;
  3. each client scores its trained model, V_m = sigmoid(1 / KL(P^m || Q)) (Eq. 10), the KL
     averaged over the client's classes (Table 9's scale; --score-kl sum sums them);
  4. the server averages the local models with weights V_m / sum_k V_k (Eq. 11);
     --uniform-agg gives the plain mean (FedACD_base, Table 8).
--fedavg is the FedAvg of FedACD's Tables 3, 5 and 9: plain cross-entropy in step 2 and the
sample-weighted mean in step 4 (FedAvg, as fedavg.py), with step 3's diagnostics still logged;
input mixup stays on unless --no-mixup (Table 5's "FedAvg w/ Input Mixup" keeps it, Tables 3
and 9's plain FedAvg turn it off).
Evaluation (--test-split global): the global model on the uniform test set (Table 1, the
headline), on per-client test sets with each client's label proportions (Table 2), and
the average risk of the round's local models over the client distributions (Table 3).

    python fedacd.py --dataset synthetic --rounds 20        # offline quick start
    python fedacd.py --dataset cifar100 --beta 0.1          # Table 1, CIFAR-100, 46.24
"""
import common  # first, before torch: common.py's first lines make a Ctrl-C while starting one line

import math

import torch
import torch.nn.functional as F

import run_folder

HEADLINE_METRIC = "global_acc"  # what the paper reports, in metrics.csv
HEADLINE = ("global_acc: global model on the uniform test set (FedACD Table 1; the paper does not say "
            "best or final round)")
AUTO_IMAGE = "simplecnn"  # --model auto on images (resnet18 on tinyimagenet)


def parse_args(argv=None):
    def resolve(args):
        if args.weight_decay is None:
            args.weight_decay = 1e-3 if args.dataset == "tinyimagenet" else 1e-5

    parser = common.base_parser(
        __doc__.splitlines()[0], script="fedacd", num_clients=20, join_ratio=0.4, local_epochs=5, batch_size=64,
        lr=0.01, momentum=0.9, weight_decay=None, rounds=200, beta=0.1, partition="dir", test_split="global",
        helps={"weight_decay": "local SGD weight decay (default: 1e-3 on tinyimagenet, else 1e-5)"})
    a = parser.add_argument
    a("--lam", type=float, default=1.0, help="lambda: the weight of L2 in L = L1 + lambda L2")
    a("--tau", type=float, default=1 - 1e-5, help="tau: the diagonal of the template matrix Q of the score V_m")
    a("--missing-delta", type=float, default=0.01,
      help="Delta_yi for classes i the client has no samples of (Sec. 3, 'a small value')")
    a("--no-mixup", dest="mixup", action="store_false",
      help="turn input mixup off (Table 5, w/o Input Mixup; default: mixup on)")
    a("--uniform-agg", action="store_true", help="plain mean of the local models (FedACD_base)")
    a("--fedavg", action="store_true",
      help="FedAvg with FedACD's diagnostics (Tables 3, 5, 9): cross-entropy and the sample-weighted mean in place of "
           "FedACD's loss and score weights; local_risk and local_kl still logged; mixup as --no-mixup says")
    a("--score-kl", default="mean", choices=["mean", "sum"],
      help="KL(P^m||Q) in the score V_m: mean over the client's present rows (Table 9's scale) or their sum")
    return common.parse_args(parser, argv, resolve, checks=lambda args: [
        (0 < args.tau < 1, f"--tau must be in (0, 1), got {args.tau}"),
        (math.isfinite(args.missing_delta) and args.missing_delta > 0,
         f"--missing-delta must be a finite number > 0, got {args.missing_delta}"),
        (math.isfinite(args.lam) and args.lam >= 0, f"--lam must be a finite number >= 0, got {args.lam}"),
        (not (args.fedavg and args.uniform_agg), "--fedavg aggregates by sample counts: drop --uniform-agg")])


# ----------------------------------------------------------------------------- local objective (Eq. 7-9)

def flattening_loss(logits, y):
    """L1, Eq. (7), per sample: KL(p || q) with p = softmax(logits), q_y = p_y and
    q_k = (1 - p_y) / (C - 1) for k != y. q is a function of p (not detached). Computed in
    log space: log(1 - p_y) = logsumexp of the other log-probabilities."""
    num_classes = logits.shape[1]
    log_p = F.log_softmax(logits, 1)
    is_label = F.one_hot(y, num_classes).bool()
    log_q_wrong = torch.logsumexp(log_p.masked_fill(is_label, -math.inf), 1, keepdim=True) - math.log(num_classes - 1)
    # the k = y term is p_y log(p_y / p_y) = 0
    return (log_p.exp() * (log_p - log_q_wrong)).masked_fill(is_label, 0).sum(1)


def margin_deltas(P, present, missing_delta, eps=1e-8):
    """Delta_yi = P_yi / P_iy of Eq. (8), clamped to >= eps. For a class i the client has no
    samples of, P_iy is unknown and Delta_yi = ``missing_delta`` (Sec. 3, missing classes).
    ``present`` is the client's (C,) boolean class mask; the diagonal is 1."""
    delta = (P / P.T.clamp_min(eps)).clamp_min(eps)
    delta = torch.where(present[None, :], delta, torch.full_like(delta, missing_delta))
    return delta.fill_diagonal_(1.0)


def adjusted_margin_loss(logits, y, delta):
    """L2, Eq. (8), per sample: log(1 + sum_{i != y} exp(f_i - f_y + log Delta_yi)). This is
    the cross-entropy of the logits f_i + log Delta_yi with log Delta_yy := 0, so Delta = 1
    gives plain cross-entropy."""
    log_delta = delta.log().fill_diagonal_(0)
    return F.cross_entropy(logits + log_delta[y], y, reduction="none")


def fedacd_loss(logits, y, delta, lam):
    """L = L1 + lambda L2, Eq. (9), per sample."""
    return flattening_loss(logits, y) + lam * adjusted_margin_loss(logits, y, delta)


def batch_loss(logits, y_a, y_b, mix, delta, lam, fedavg=False, mixup=True):
    """The minibatch loss of the local update: the batch mean of FedACD's L (Eq. 9) or, with
    ``fedavg`` (--fedavg), of FedAvg's cross-entropy; with input mixup, mix * loss(y_a) +
    (1 - mix) * loss(y_b)."""
    if fedavg and not mixup:
        return F.cross_entropy(logits, y_a)  # fedavg.py's loss, to the bit

    def per_sample(logits, y):
        return F.cross_entropy(logits, y, reduction="none") if fedavg else fedacd_loss(logits, y, delta, lam)

    if not mixup:
        return per_sample(logits, y_a).mean()
    per_label = per_sample(logits.repeat(2, 1), torch.cat([y_a, y_b])).view(2, -1).mean(1)  # both labels, one call
    return mix * per_label[0] + (1 - mix) * per_label[1]


# ----------------------------------------------------------------------------- probability matrix P^m

def accumulate_probabilities(sums, probs, y_a, y_b, mix):
    """Add a batch's softmax outputs to the running P^m: row y_a gets ``mix * p``, row y_b gets
    ``(1 - mix) * p`` (the mixup weights; y_b = y_a and mix = 1 without mixup)."""
    sums.index_add_(0, y_a, probs, alpha=mix)
    if mix != 1:
        sums.index_add_(0, y_b, probs, alpha=1 - mix)


def rows_to_matrix(sums, fallback):
    """P^m from the accumulated outputs: P_ij = mean of p_j over the samples of class i (Sec. 3).
    Each softmax output sums to 1, so row i of ``sums`` sums to the weight of class i. Rows
    without weight (classes absent from the batch stream) keep ``fallback``."""
    weights = sums.sum(1, keepdim=True)
    return torch.where(weights > 0, sums / weights.clamp_min(1e-12), fallback)


@torch.no_grad()
def probability_matrix(model, x, y, idx, num_classes, batch_size=1024):
    """P^m of ``model`` on the samples ``x[idx]``: one no-grad pass in eval mode, no mixup.
    Rows of classes without samples are zero."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(num_classes, num_classes, device=x.device)
    for start in range(0, len(idx), batch_size):
        batch = idx[start: start + batch_size]
        accumulate_probabilities(sums, model(x[batch]).softmax(1), y[batch], y[batch], 1.0)
    model.train(was_training)
    return rows_to_matrix(sums, torch.zeros_like(sums))


# ----------------------------------------------------------------------------- aggregation (Eq. 10-11)

def template_matrix(num_classes, tau, dtype=torch.float64, device=None):
    """Q of Eq. (10): tau on the diagonal, (1 - tau) / (C - 1) elsewhere."""
    Q = torch.full((num_classes, num_classes), (1 - tau) / (num_classes - 1), dtype=dtype, device=device)
    return Q.fill_diagonal_(tau)


def aggregation_score(P, present, tau, reduction="mean"):
    """V_m = sigmoid(1 / KL(P^m || Q)), Eq. (10). KL of the two matrices: the mean over the rows i
    of classes the client holds of sum_j P_ij log(P_ij / Q_ij), the scale of Table 9 (0.60-5.59
    on CIFAR-100); ``reduction="sum"`` sums the rows instead (tens of times larger, every V_m
    near 0.5). ``present``: those classes as a (C,) boolean mask or as indices (on a GPU a mask
    costs a host sync, indices do not). Returns (V_m, KL) as 0-dim float64 tensors."""
    P = P.double()
    Q = template_matrix(P.shape[0], tau, device=P.device)
    kl_rows = (torch.xlogy(P, P) - P * Q.log()).sum(1)[present]
    kl = kl_rows.sum() if reduction == "sum" else kl_rows.mean()
    return torch.sigmoid(1 / kl), kl


def aggregation_weights(scores, uniform=False):
    """Eq. (11): V_m / sum_k V_k; ``uniform`` gives 1/K (FedACD_base, Table 8)."""
    return torch.full_like(scores, 1 / len(scores)) if uniform else scores / scores.sum()


# ----------------------------------------------------------------------------- client and round

def mixup_draws(seed, batch_sizes, device):
    """Input mixup's draws for one local update: per batch, mix ~ U(0, 1) and the permutation that
    pairs its samples, from one CPU generator in the batches' order (the same draws on every
    device); the permutations go to ``device`` in one copy, not one per batch."""
    generator = torch.Generator().manual_seed(seed)
    mixes, perms = [], []
    for n in batch_sizes:
        mixes.append(float(torch.rand((), generator=generator)))
        perms.append(torch.randperm(n, generator=generator))
    return mixes, common.to_device(torch.cat(perms), device).split(batch_sizes)


def local_train(model, data, idx, present, args, batch_seed, mixup_seed):
    """The local update (Sec. 3, Appendix A.1): minimise fedacd_loss from the received model, with input mixup
    (x = mix x_a + (1 - mix) x_b, mix ~ Beta(1, 1) = U(0, 1), one per batch). P^m is estimated
    before the first epoch with the received model, accumulated (detached, with the mixup
    weights) during each epoch and replaced at the end of it. Returns the mean loss (0-dim)
    and the last epoch's P^m."""
    C, device = data.num_classes, data.x.device
    P = probability_matrix(model, data.x, data.y, idx, C)
    delta = margin_deltas(P, present, args.missing_delta)
    sums = torch.zeros(C, C, device=device)
    bounds = common.batch_bounds(len(idx), args.batch_size)  # those of epoch_batches
    steps_per_epoch = len(bounds)
    if args.mixup:
        mixes, perms = mixup_draws(mixup_seed, [end - start for start, end in bounds] * args.local_epochs, device)
    optimizer = common.make_optimizer(model, args)
    model.train()
    total = torch.zeros((), device=device)
    for step, batch in enumerate(common.epoch_batches(idx, args.batch_size, args.local_epochs, batch_seed)):
        x, y_a, y_b, mix = data.x[batch], data.y[batch], data.y[batch], 1.0
        if args.mixup:
            mix, perm = mixes[step], perms[step]
            x, y_b = mix * x + (1 - mix) * x[perm], y_a[perm]
        logits = model(x)
        loss = batch_loss(logits, y_a, y_b, mix, delta, args.lam, args.fedavg, args.mixup)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach()
        accumulate_probabilities(sums, logits.detach().softmax(1), y_a, y_b, mix)
        if (step + 1) % steps_per_epoch == 0:  # end of an epoch: the accumulated P^m replaces the old one
            P = rows_to_matrix(sums, P)
            delta = margin_deltas(P, present, args.missing_delta)
            sums.zero_()
    return total / (steps_per_epoch * args.local_epochs), P


def per_class_errors(model, data, class_test_idx):
    """eps(w): per-class error rates on the uniform test set (0 for a class it lacks)."""
    correct, count, _ = common.evaluate(model, data, class_test_idx)
    return torch.where(count > 0, 1 - correct / count.clamp_min(1), torch.zeros_like(count))


def average_risk(errors, priors):
    """Eq. (3): R(w_m) = 1/M sum_n eps(w_m) . pi^n, ``priors`` the (M, C) client label priors."""
    return (priors @ errors.to(priors.dtype)).mean()


def client_update(model, global_state, data, client, present, args, round_, risk=None, out=None):
    """Client m (Appendix A.1): local training from the global model (flat), then P^m of the
    trained model and its score V_m. With ``risk = (class_test_idx, priors)`` also the trained
    model's average risk (Table 3). Returns (the trained model, flat, written into ``out`` if
    given; mean loss; V_m; KL; risk)."""
    common.load_flat_state(model, global_state)
    idx, device = data.train_idx[client], data.x.device
    # the client's classes as indices, found where the mask is: with main's host mask, no GPU sync
    present = present[client]
    classes = common.to_device(present.nonzero().flatten(), device)
    seeds = common.client_seed(args.seed, round_, client), common.client_seed(args.seed, round_, client, tag=1)
    loss, _ = local_train(model, data, idx, common.to_device(present, device), args, *seeds)
    P = probability_matrix(model, data.x, data.y, idx, data.num_classes)  # P^m of the trained model
    score, kl = aggregation_score(P, classes, args.tau, args.score_kl)
    local_risk = average_risk(per_class_errors(model, data, risk[0]), risk[1]) if risk is not None else None
    return common.flatten_state(model, out=out), loss, score, kl, local_risk


def server_update(client_states, scores, uniform=False, num_samples=None):
    """The server's step: the score-weighted average of the local models (FedACD_base: the mean);
    given the clients' ``num_samples`` (--fedavg), FedAvg's sample-weighted mean instead."""
    weights = num_samples if num_samples is not None else aggregation_weights(torch.stack(scores), uniform)
    return common.weighted_average(common.as_rows(client_states), weights)


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    if args.mixup and not data.x.is_floating_point():
        raise common.UserError("input mixup needs real-valued inputs; use --no-mixup for token data")
    auto_image = "resnet18" if args.dataset == "tinyimagenet" else AUTO_IMAGE
    global_model = common.build_model(args.model, data, auto_image=auto_image).to(device)
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=auto_image), device,
                                   data)
    model_bytes = common.state_bytes(global_model)
    client_stack = torch.empty(common.clients_per_round(args), common.flatten_state(global_model).numel(),
                               device=device)  # the models the round's clients send back, one row each
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64, device=device)
    present = torch.as_tensor(data.train_counts > 0)  # on the host: see client_update
    priors = counts / counts.sum(1, keepdim=True)  # pi^n of the average risk
    risk_test = data.global_test_idx if data.global_test_idx is not None else torch.cat(data.test_idx)
    class_test_idx = [risk_test[data.y[risk_test] == c] for c in range(data.num_classes)]
    run = run_folder.Run("fedacd-fedavg" if args.fedavg else "fedacd", args, data, device, script="fedacd",
                         headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedacd] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} "
          f"parameters, {model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time"
          + ("; --fedavg: FedAvg's loss and aggregation, FedACD's diagnostics" if args.fedavg else ""))

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        evaluate = run.should_eval(round_)
        risk = (class_test_idx, priors) if evaluate else None
        global_state = common.flatten_state(global_model)
        row = dict(zip(clients, client_stack))  # where each client's model lands: no copies per client
        updates = pool.map(lambda model, client: client_update(model, global_state, data, client, present, args,
                                                               round_, risk, out=row[client]), clients)
        losses = [common.check_finite(u[1], round_, client) for client, u in zip(clients, updates)]
        _, _, scores, kls, risks = zip(*updates)
        num_samples = [len(data.train_idx[client]) for client in clients] if args.fedavg else None
        common.load_flat_state(global_model, server_update(client_stack[:len(clients)], scores, args.uniform_agg,
                                                           num_samples))
        score_bytes = 0 if args.fedavg else 8  # FedAvg's server does not need the score V_m
        run.add_bytes(down=model_bytes * len(clients), up=(model_bytes + score_bytes) * len(clients))
        if evaluate:
            scores = torch.stack(scores)
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses),
                             "local_kl": float(torch.stack(kls).mean()), "score_min": float(scores.min()),
                             "score_max": float(scores.max()), "local_risk": float(torch.stack(risks).mean())})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    risks = [float(r["local_risk"]) for r in run.rows]  # Table 3: lower is better, so "best" is the minimum
    run.finish({"local_risk": {"best": min(risks), "final": risks[-1],
                               "last10_mean": sum(risks[-10:]) / len(risks[-10:])}})


if __name__ == "__main__":
    run_folder.run_main(main)
