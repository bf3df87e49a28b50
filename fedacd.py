"""FedACD (Zhou et al., IJCAI 2025): adaptability of local models over client distributions.

Each round (Eq. 11, Appendix A.1; our choices where the paper is silent: docs/fedacd.md):
  1. the server samples round(join_ratio * N) clients and sends them the global model;
  2. each client m estimates its probability matrix P^m with the received model, then
     trains on L = L1 + lambda * L2 (Eq. 7-9) with input mixup, re-estimating P^m from
     the softmax outputs of every epoch;
  3. each client scores its trained model, V_m = sigmoid(1 / KL(P^m || Q)) (Eq. 10), the KL
     averaged over the client's classes (our choice, Table 9's scale; --score-kl sum: the printed sum);
  4. the server averages the local models with weights V_m / sum_k V_k (Eq. 11);
     --uniform-agg gives the plain mean (FedACD_base, Table 8).
Evaluation (--test-split global): the global model on the uniform test set (Table 1, the
headline) and on per-client test sets with each client's label proportions (Table 2); the
clients' KL and scores (Table 9). The FedAvg of Tables 3, 5 and 9 and Table 3's average risk
are a diagnostic built of this file's pieces: tools/fedacd_diagnostics.py.

    python fedacd.py --dataset synthetic --rounds 20        # offline quick start
    python fedacd.py --dataset cifar100 --beta 0.1          # Table 1, CIFAR-100, 46.24
"""
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common

import math

import torch
import torch.nn.functional as F

import run_folder

HEADLINE_METRIC = "global_acc"  # what the paper reports, in metrics.csv
HEADLINE = ("global_acc: global model on the uniform test set (FedACD Table 1; the paper does not say "
            "best or final round)")
AUTO_IMAGE = "simplecnn"  # --model auto on images (resnet18 on tinyimagenet)


def make_parser(script="fedacd"):
    """fedacd.py's flags, the paper's defaults (tools/fedacd_diagnostics.py adds its own)."""
    parser = common.base_parser(
        __doc__.splitlines()[0], script=script, num_clients=20, join_ratio=0.4, local_epochs=5, batch_size=64,
        lr=0.01, momentum=0.9, weight_decay=None, rounds=200, beta=0.1, partition="dir", test_split="global",
        helps={"weight_decay": "local SGD weight decay (default: 1e-3 on tinyimagenet, else 1e-5)",
               "model": common.model_help(f"{AUTO_IMAGE} (resnet18 on tinyimagenet)")})
    a = parser.add_argument
    a("--lam", type=float, default=1.0, help="lambda: the weight of L2 in L = L1 + lambda L2")
    a("--tau", type=float, default=1 - 1e-5, help="tau: the diagonal of the template matrix Q of the score V_m")
    a("--missing-delta", type=float, default=0.01,
      help="Delta_yi for classes i the client has no samples of (Sec. 3, 'a small value')")
    a("--no-mixup", dest="mixup", action="store_false",
      help="turn input mixup off (Table 5, w/o Input Mixup; default: mixup on)")
    a("--uniform-agg", action="store_true", help="plain mean of the local models (FedACD_base)")
    a("--score-kl", default="mean", choices=["mean", "sum"],
      help="KL(P^m||Q) in the score V_m: mean over the client's present rows (ours, Table 9's scale) or their sum "
           "(the printed equation)")
    return parser


def resolve(args):
    if args.weight_decay is None:
        args.weight_decay = 1e-3 if args.dataset == "tinyimagenet" else 1e-5


def checks(args):
    return [(0 < args.tau < 1, f"--tau must be in (0, 1), got {args.tau}"),
            (math.isfinite(args.missing_delta) and args.missing_delta > 0,
             f"--missing-delta must be a finite number > 0, got {args.missing_delta}"),
            (math.isfinite(args.lam) and args.lam >= 0, f"--lam must be a finite number >= 0, got {args.lam}")]


def parse_args(argv=None):
    return common.parse_args(make_parser(), argv, resolve, checks)


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
    """Delta_yi = P_yi / P_iy of Eq. (8), clamped to >= eps (ours: the paper does not say how a zero P_iy
    is handled). For a class i the client has no samples of, P_iy is unknown and Delta_yi =
    ``missing_delta`` (Sec. 3: "a small value"; 0.01 is our choice). ``present``: the classes the client
    holds, a (C,) boolean mask or their indices; the diagonal is 1."""
    margins = torch.full_like(P, missing_delta)
    margins[:, present] = (P / P.T.clamp_min(eps)).clamp_min(eps)[:, present]
    return margins.fill_diagonal_(1.0)


def adjusted_margin_loss(logits, y, margins):
    """L2, Eq. (8), per sample: log(1 + sum_{i != y} exp(f_i - f_y + log Delta_yi)), ``margins`` the
    (C, C) matrix Delta of ``margin_deltas``. This is the cross-entropy of the logits f_i + log Delta_yi
    with log Delta_yy := 0, so Delta = 1 gives plain cross-entropy."""
    log_margins = margins.log().fill_diagonal_(0)
    return F.cross_entropy(logits + log_margins[y], y, reduction="none")


def fedacd_loss(logits, y, margins, lam):
    """L = L1 + lambda L2, Eq. (9), per sample."""
    return flattening_loss(logits, y) + lam * adjusted_margin_loss(logits, y, margins)


def mixup_loss(per_sample_loss, logits, y_a, y_b, mix):
    """Input mixup's minibatch loss (Zhang et al. 2018; FedACD Sec. 3 and Table 5 cite it, without
    details): mix * mean loss(y_a) + (1 - mix) * mean loss(y_b) for the logits of the mixed inputs
    mix x_a + (1 - mix) x_b, ``per_sample_loss(logits, y)`` a per-sample loss (e.g. ``fedacd_loss``
    with its margins and lambda bound). mix = 1 (no mixup) gives the batch mean of loss(y_a)."""
    if mix == 1:
        return per_sample_loss(logits, y_a).mean()
    per_label = per_sample_loss(logits.repeat(2, 1), torch.cat([y_a, y_b])).view(2, -1).mean(1)  # one call
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
def probability_matrix(model, batches, num_classes):
    """P^m of ``model`` (Sec. 3: P_ij the mean probability output j over the client's samples of class
    i) from one no-grad pass in eval mode, no mixup, over ``batches``: the client's (x, y) train data.
    Rows of classes without samples are zero."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(num_classes, num_classes, device=next(model.parameters()).device)
    for x, y in batches:
        accumulate_probabilities(sums, model(x).softmax(1), y, y, 1.0)
    model.train(was_training)
    return rows_to_matrix(sums, torch.zeros_like(sums))


def fedacd_local_training(model, optimizer, epochs, clean_batches, num_classes, present, lam=1.0,
                          missing_delta=0.01):
    """Client m's local update (Sec. 3, Appendix A.1), with the schedule of its estimates of P^m, which
    is ours (the paper says how P^m is computed, not when):
      1. P^m of the received model, one no-grad eval-mode pass over ``clean_batches()``, gives the
         margins Delta of L2 (Eq. 8) for the first epoch;
      2. each epoch minimises L1 + lambda L2 (Eq. 9) through ``mixup_loss`` and accumulates the batch
         softmax outputs (train mode, detached, with the mixup weights); at the epoch's end they replace
         P^m, and Delta with it, for the next epoch (rows of classes the epoch did not see keep theirs).
         Caveat (ours): with mixup these are outputs of MIXED inputs, a departure from Sec. 3's P^m (the
         mean output over the client's samples of a class), which steps 1 and 3 follow;
      3. P^m of the trained model, a fresh pass as in 1, for the score V_m (Eq. 10).
    ``epochs``: one iterable per epoch of minibatches (x, y_a, y_b, mix), input mixup already applied
    (x = mix x_a + (1 - mix) x_b; mix = 1 and y_b = y_a without mixup). ``clean_batches``: a function
    returning the client's train data as (x, y) batches, unmixed; it is called twice. ``present``: the
    classes the client holds, a (C,) boolean mask or their indices, on the model's device. Returns (the
    mean minibatch loss, 0-dim; P^m of the trained model)."""
    P = probability_matrix(model, clean_batches(), num_classes)
    margins = margin_deltas(P, present, missing_delta)
    sums = torch.zeros_like(P)
    model.train()
    total, steps = torch.zeros((), device=P.device), 0
    for epoch in epochs:
        for x, y_a, y_b, mix in epoch:
            logits = model(x)
            loss = mixup_loss(lambda logits, y: fedacd_loss(logits, y, margins, lam), logits, y_a, y_b, mix)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            steps += 1
            accumulate_probabilities(sums, logits.detach().softmax(1), y_a, y_b, mix)
        P = rows_to_matrix(sums, P)  # end of an epoch: its outputs replace P^m
        margins = margin_deltas(P, present, missing_delta)
        sums.zero_()
    return total / steps, probability_matrix(model, clean_batches(), num_classes)


# ----------------------------------------------------------------------------- aggregation (Eq. 10-11)

def template_matrix(num_classes, tau, dtype=torch.float64, device=None):
    """Q of Eq. (10): tau on the diagonal, (1 - tau) / (C - 1) elsewhere."""
    Q = torch.full((num_classes, num_classes), (1 - tau) / (num_classes - 1), dtype=dtype, device=device)
    return Q.fill_diagonal_(tau)


def aggregation_score(P, present, tau, reduction="mean"):
    """V_m = sigmoid(1 / KL(P^m || Q)), Eq. (10). KL of the two matrices: over the rows i of classes the client
    holds, of sum_j P_ij log(P_ij / Q_ij) (rows of absent classes, zero in ``probability_matrix``, add nothing),
    their mean (our choice, Table 9's scale; fedacd.py's default) or, ``reduction="sum"``, their sum as printed.
    Caveat: summed over tens of rows the KL is tens of times Table 9's 0.60-5.59 (CIFAR-100) and every V_m is
    near 0.5, i.e. uniform weights. ``present``: those classes as a (C,) boolean mask or as indices. Returns
    (V_m, KL) as 0-dim float64 tensors."""
    P = P.double()
    Q = template_matrix(P.shape[0], tau, device=P.device)
    kl_rows = (torch.xlogy(P, P) - P * Q.log()).sum(1)[present]
    kl = kl_rows.sum() if reduction == "sum" else kl_rows.mean()
    return torch.sigmoid(1 / kl), kl


def aggregation_weights(scores):
    """Eq. (11): V_m / sum_k V_k, over the clients whose scores are given (Eq. (11) sums over all M
    clients; only the sampled ones have a score, so we normalise over them)."""
    return scores / scores.sum()


# ----------------------------------------------------------------------------- client and round

def mixup_epochs(data, idx, args, batch_seed, mixup_seed):
    """The local update's minibatches as ``fedacd_local_training`` takes them: per epoch, (x, y_a, y_b, mix)
    of index slices of the client's data (common.epoch_batches) with input mixup (Zhang et al. 2018): per
    batch, mix ~ U(0, 1) and the permutation that pairs its samples, drawn in the batches' order from one CPU
    generator (the same draws on every device), x = mix x_a + (1 - mix) x_b. --no-mixup: mix = 1, y_b = y_a.
    The draws are made here, so each epoch's iterable is independent of the others."""
    batches = list(common.epoch_batches(idx, args.batch_size, args.local_epochs, batch_seed))
    mixes, perms = [1.0] * len(batches), [None] * len(batches)
    if args.mixup:
        generator = torch.Generator().manual_seed(mixup_seed)
        for k, batch in enumerate(batches):
            mixes[k] = float(torch.rand((), generator=generator))  # first the mix, then the pairing: the stream's order
            perms[k] = torch.randperm(len(batch), generator=generator)
        perms = common.to_device(torch.cat(perms), data.x.device).split([len(b) for b in batches])  # one copy

    def epoch(steps):
        for k in steps:
            x, y = data.x[batches[k]], data.y[batches[k]]
            if perms[k] is not None:
                mixed = mixes[k] * x  # keeps x's strides (channels-last images: the fast convolutions)
                mixed += (1 - mixes[k]) * x[perms[k]]  # the sum as mix * x + (1 - mix) * x[perm], to the bit
            yield (x, y, y, 1.0) if perms[k] is None else (mixed, y, y[perms[k]], mixes[k])

    per_epoch = len(batches) // args.local_epochs
    return [epoch(range(e * per_epoch, (e + 1) * per_epoch)) for e in range(args.local_epochs)]


def held_classes(data):
    """The classes each client holds, as index tensors on the data's device: found once, on the host, so that
    no client waits for a GPU to find them (and indices, not masks, select the score's rows without a sync)."""
    return [common.to_device(torch.as_tensor(c > 0).nonzero().flatten(), data.x.device) for c in data.train_counts]


def client_update(model, global_state, data, client, classes, args, round_):
    """Client m (Appendix A.1): ``fedacd_local_training`` from the global model (flat) on its minibatches
    with input mixup, then its score V_m from P^m of the trained model. ``classes``: ``held_classes``,
    every client's. Returns (the trained model, flat; mean loss; V_m; KL)."""
    common.load_flat_state(model, global_state)
    idx = data.train_idx[client]
    seeds = common.client_seed(args.seed, round_, client), common.client_seed(args.seed, round_, client, tag=1)
    loss, P = fedacd_local_training(model, common.make_optimizer(model, args), mixup_epochs(data, idx, args, *seeds),
                                    lambda: ((data.x[b], data.y[b]) for b in idx.split(1024)),  # unmixed, for P^m
                                    data.num_classes, classes[client], args.lam, args.missing_delta)
    # the score with the KL averaged over the client's classes (--score-kl mean), our default: docs/fedacd.md
    score, kl = aggregation_score(P, classes[client], args.tau, reduction=args.score_kl)
    return common.flatten_state(model), loss, score, kl


def server_update(client_states, scores, uniform=False):
    """The server's step: the score-weighted average of the local models (aggregation_weights); ``uniform``: their
    plain mean (FedACD_base, Table 8)."""
    if uniform:
        weights = torch.full((len(scores),), 1 / len(scores), dtype=torch.float64)
    else:
        weights = aggregation_weights(torch.stack(scores))
    return common.weighted_average(client_states, weights)


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
    classes = held_classes(data)
    # plumbing: the run folder (config.json, partition.json, the partition printed), its lock, Ctrl-C at a round's end
    run = run_folder.Run("fedacd", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedacd] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} "
          f"parameters, {model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time")

    # plumbing, not the algorithm: progress=, check_finite, run.add_bytes, log, checkpoint, stop (run_folder.py)
    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        global_state = common.flatten_state(global_model)
        client_states, losses, scores, kls = pool.train(lambda model, client: client_update(
            model, global_state, data, client, classes, args, round_), clients,
                                                        progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        common.load_flat_state(global_model, server_update(client_states, scores, args.uniform_agg))
        del client_states  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        run.add_bytes(down=model_bytes * len(clients), up=(model_bytes + 8) * len(clients))  # + the score V_m
        if run.should_eval(round_):
            scores = torch.stack(scores)  # Table 9
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses),
                             "local_kl": float(torch.stack(kls).mean()), "score_min": float(scores.min()),
                             "score_max": float(scores.max())})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
