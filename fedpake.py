"""FedPake (arXiv 2408.11278 v2): FedAvg local training with a parameter-skew-aware aggregation.

Each round (Alg. 1): the clients train as in FedAvg (--local-epochs of SGD from the global model), and the
server aggregates the K returned models with ``fedpake_aggregate`` instead of the sample-weighted mean. The
equations (2)-(11) are lost in our copy of the paper and no code is public: every formula below is our
reconstruction, implemented exactly (docs/fedpake.md: what and why). Over the stack X (K clients x D):

  1. Parameter division, Eq. (2)-(5): CV = population std / (|mean| + 1e-12) over clients;
     high-dispersion set H = {j : CV_j > kappa}, the rest L.
  2. Low dispersion, Eq. (10): L is the sample-weighted mean over clients (FedAvg).
  3. Micro-Class, Eq. (6)-(7): for j in H, [min_k X_kj, max_k X_kj] is cut into n_micro equal bins;
     MIC_kj = floor((X_kj - min) / (max - min) * n_micro), the maximum in the last bin.
  4. Macro-Class, Eq. (8): D(a, b) = ||MIC_a - MIC_b||_0 / |H| over all of H; average-linkage clustering
     merges the closest pair while it is <= delta, and while there are more than n_macro clusters.
  5. Tendency, Eq. (9): T_cj = the most frequent Micro-Class of j among the clients of Macro-Class c
     (ties: the tied class nearest the median class, then the lower class).
  6. Aggregation, Eq. (11): in Macro-Class c, parameter j is the sample-weighted mean of the clients with
     MIC_kj = T_cj; the global value is the mean of the Macro-Class values weighted by their sample counts.

kappa = inf makes H empty: fedavg.py's aggregation. --ablate micro, macro or both (Table 4) draws those
classes at random, afresh each round, from two independent seeds of (seed, round). Logged per evaluated
round: |H| / D, the number of Macro-Classes, the aggregation time. The global model is evaluated on every
client's test data; the headline is last10_mean of test_acc (the paper's mean over the last 10 rounds).

    python fedpake.py --dataset synthetic --rounds 20      # offline quick start
    python fedpake.py --dataset cifar10                    # Table 1, Dir(0.1), ResNet-18
"""
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common

import time

import torch

import datasets
import run_folder

HEADLINE_METRIC = "test_acc"  # what the paper reports, in metrics.csv
HEADLINE = "last10_mean of test_acc (FedPake Table 1: mean over the last 10 rounds)"
AUTO_IMAGE = "resnet18"  # --model auto on images

MICRO_MACRO = {"cifar10": 4, "cifar100": 5, "tinyimagenet": 8}  # Sec. 4.1; 4 (the smallest) elsewhere
MICRO_TAG, MACRO_TAG = 7, 8  # client_seed tags of --ablate's per-round seeds: independent Micro and Macro draws


def parse_args(argv=None):
    def resolve(args):
        default = MICRO_MACRO.get(args.dataset, 4)
        args.n_micro, args.n_macro = (default if n is None else n for n in (args.n_micro, args.n_macro))

    parser = common.base_parser(__doc__.splitlines()[0], script="fedpake", rounds=1000,
                                helps={"model": common.model_help(AUTO_IMAGE)})
    a = parser.add_argument
    a("--kappa", type=float, default=0.2, help="CV threshold kappa of high dispersion; inf gives FedAvg")
    a("--n-micro", type=int, default=None, help="number of Micro-Classes "
      "(default: 4 on cifar10, 5 on cifar100, 8 on tinyimagenet, 4 otherwise)")
    a("--n-macro", type=int, default=None, help="maximum Macro-Classes (default: as --n-micro)")
    a("--delta", type=float, default=0.2, help="merge clusters whose dissimilarity D is at most this")
    a("--ablate", choices=["micro", "macro"], nargs="+", default=None, help="replace the Micro-Classes, the "
      "Macro-Classes or both (--ablate micro macro) by random ones (Table 4; default: none)")
    a("--aggregation", choices=["auto", "one-pass", "chunked"], default="auto", help="auto: the one-pass "
      "fedpake_aggregate where its memory is free on the device, else fedpake_aggregate_chunked, the same aggregation "
      "in chunks of 2^20 values, equal to float32 rounding; decided once at the start, recorded (docs/fedpake.md)")
    return common.parse_args(parser, argv, resolve, checks=lambda args: [
        (args.kappa >= 0, f"--kappa must be >= 0 (inf for FedAvg), got {args.kappa}"),
        (1 <= args.n_micro <= 255, f"--n-micro must be in [1, 255], got {args.n_micro}"),
        (args.n_macro >= 1, f"--n-macro must be >= 1, got {args.n_macro}"),
        (args.delta >= 0, f"--delta must be >= 0, got {args.delta}")])


# ----------------------------------------------------------------------------- the aggregation, Eq. (2)-(11)

def parameter_division(values, kappa):
    """Eq. (2)-(5) as reconstructed: True where the coefficient of variation over clients (rows), CV = population std /
    (|mean| + 1e-12), exceeds kappa. Caveat (ours): a parameter whose mean over clients is near zero has a large CV
    whatever its spread, so every such parameter is "high-dispersion"."""
    mu = values.mean(0)
    sigma = (values - mu).square_().mean(0).sqrt_()  # population std
    return sigma / (mu.abs() + 1e-12) > kappa


def micro_classes(values, n_micro):
    """Eq. (6)-(7) as reconstructed: each column's [min, max] over clients in n_micro equal bins (the maximum in the
    last bin); uint8 classes."""
    lo, hi = values.amin(0), values.amax(0)
    scaled = (values - lo).div_((hi - lo).clamp_min(torch.finfo(values.dtype).tiny))  # in [0, 1]
    return scaled.mul_(n_micro).clamp_(max=n_micro - 1).to(torch.uint8)  # >= 0: the cast to uint8 is the floor


def micro_class_disagreements(mic, n_micro):
    """Numerator of Eq. (8): [a, b] = #columns where clients a and b have different Micro-Classes, via one (K x h) @ (h
    x K) product per class instead of a K x K x h comparison."""
    agree = torch.zeros(mic.shape[0], mic.shape[0], device=mic.device)
    for m in range(n_micro):
        one_hot = (mic == m).view(torch.uint8).float()  # via uint8: bool -> float is slow on CPU
        agree += one_hot @ one_hot.T  # exact: counts stay far below 2^24
    return mic.shape[1] - agree.double()


def cluster_macro_classes(disagreements, num_high, n_macro, delta):
    """Eq. (8) and the clustering after it, as reconstructed: average-linkage agglomerative clustering on D(a, b) =
    disagreements[a, b] / num_high, ONE clustering over all of H across layers (our choice; the paper does not say
    per layer or not). Merge the closest pair while D <= delta (the paper's threshold), and while there are more
    than n_macro clusters. Returns labels 0..C-1 numbered by each cluster's smallest client (ties between pairs: the
    first in row-major order)."""
    pair_sums = disagreements.double().cpu().clone()  # summed over the client pairs of two clusters
    cluster_sizes = torch.ones(len(pair_sums), dtype=torch.float64)
    labels = torch.arange(len(pair_sums))
    while len(cluster_sizes) > 1:
        # average linkage; integer sums divided once, so ties with delta compare exactly
        linkage = pair_sums / (cluster_sizes[:, None] * cluster_sizes[None, :] * num_high)
        linkage.fill_diagonal_(float("inf"))
        a, b = divmod(int(linkage.argmin()), len(cluster_sizes))  # a < b: the matrix is symmetric
        if linkage[a, b] > delta and len(cluster_sizes) <= n_macro:
            break
        pair_sums[a] += pair_sums[b]
        pair_sums[:, a] += pair_sums[:, b]
        cluster_sizes[a] += cluster_sizes[b]
        keep = torch.arange(len(cluster_sizes)) != b
        pair_sums, cluster_sizes = pair_sums[keep][:, keep], cluster_sizes[keep]
        labels[labels == b] = a
        labels[labels > b] -= 1
    return labels


def tendency(mic, n_micro):
    """Eq. (9) as reconstructed, for one Macro-Class (``mic``: its clients x h): the most frequent Micro-Class
    of each column; ties (ours) go to the class nearest the median class, then to the lower class.
    (A loop over the classes: reductions over a few rows are slow on CPU.)"""
    size = len(mic)
    counts = [(mic == m).sum(0, dtype=torch.int32) for m in range(n_micro)]
    below, twice_median = torch.zeros_like(counts[0]), torch.zeros_like(counts[0])
    for count in counts:  # the two middle order statistics of the column, from the cumulative counts
        below += count
        twice_median += (below < (size + 1) // 2).int() + (below < size // 2 + 1).int()
    classes = torch.arange(n_micro, dtype=torch.uint8, device=mic.device)  # 0-dim tensors: where() is faster
    best_class = torch.zeros_like(mic[0])
    best_score = torch.full_like(below, torch.iinfo(torch.int32).min)
    for m, count in enumerate(counts):
        score = count * 1024 - (2 * m - twice_median).abs_()  # frequency first; 2 |m - median| < 1024
        best_class = torch.where(score > best_score, classes[m], best_class)  # strict: on a tie the lower class stays
        best_score = torch.maximum(best_score, score)
    return best_class


def macro_class_members(labels, device):
    """The clients (rows) of each Macro-Class c = 0..C-1 as index tensors on ``device``, found on the host from the
    clustering's labels and copied in one go (no GPU sync per class or chunk)."""
    labels = labels.tolist()
    members = [[k for k, label in enumerate(labels) if label == c] for c in range(max(labels) + 1)]
    rows = torch.tensor(sum(members, [])).to(device, non_blocking=True)
    return rows.split([len(m) for m in members])


def tendency_weights(mic, members, num_samples, n_micro):
    """Eq. (9) and (11) as reconstructed: the weight of client k (in Macro-Class c) for column j is [MIC_kj = T_cj] *
    n_k / (sum of n over the matching clients of c) * N_c / N, n_k = ``num_samples[k]`` (the clients' sample counts,
    a float tensor), ``members`` the rows of each Macro-Class (``macro_class_members``). Each client is in one
    Macro-Class, so its weight is counted once; columns sum to 1."""
    weights = torch.empty(mic.shape, dtype=num_samples.dtype, device=mic.device)
    for rows in members:
        matched = (mic[rows] == tendency(mic[rows], n_micro)).view(torch.uint8).to(num_samples.dtype)
        matched *= num_samples[rows, None]  # the mode has a client: the sum below is > 0
        weights[rows] = matched / matched.sum(0) * (num_samples[rows].sum() / num_samples.sum())
    return weights


def random_micro_classes(num_clients, num_high, n_micro, generator):
    """Table 4 without Micro-Classes: a uniform class in [0, n_micro) per client and column of H (uint8, clients x
    columns) from ``generator`` (a CPU one), column by column: chunks of H drawn in turn get one draw's classes."""
    return torch.randint(n_micro, (num_high, num_clients), generator=generator, dtype=torch.uint8).T


def random_macro_classes(num_clients, n_macro, generator):
    """Table 4 without Macro-Classes: each client in a uniform one of n_macro Macro-Classes, from ``generator``
    (a CPU one), empty ones dropped; labels 0..C-1 as ``cluster_macro_classes`` returns them."""
    draw = torch.randint(min(n_macro, num_clients), (num_clients,), generator=generator)
    return torch.unique(draw, return_inverse=True)[1]


def fedpake_aggregate(stacked, num_samples, kappa=0.2, n_micro=4, n_macro=4, delta=0.2, random_micro=None,
                      random_macro=None, stats=None):
    """FedPake's server aggregation, Eq. (2)-(11) AS RECONSTRUCTED BY US (missing from our copy of the paper, no
    public code; docs/fedpake.md), in place of FedAvg's average of the rows of ``stacked`` (K clients x D) weighted
    by ``num_samples``; ``kappa = inf`` leaves H empty, and the result is (num_samples / their sum) @ stacked.
    ``random_micro``, ``random_macro``: a CPU torch.Generator that draws those classes at random (Table 4; None: the
    paper's). ``stats``, a dict, receives ``high_fraction`` (|H| / D) and ``macro_classes``. All of H at once."""
    num_samples = torch.as_tensor(num_samples, dtype=stacked.dtype).to(stacked.device, non_blocking=True)
    out = (num_samples / num_samples.sum()) @ stacked  # 2. Eq. (10) on L: the sample-weighted mean (ours); H below
    high, members = parameter_division(stacked, kappa).nonzero().flatten(), ()  # 1. Eq. (2)-(5): H
    if len(high):
        values = stacked.index_select(1, high)
        mic = micro_classes(values, n_micro) if random_micro is None else random_micro_classes(  # 3. Eq. (6)-(7)
            len(stacked), len(high), n_micro, random_micro).to(stacked.device)
        labels = (cluster_macro_classes(micro_class_disagreements(mic, n_micro), len(high), n_macro, delta)
                  if random_macro is None else random_macro_classes(len(stacked), n_macro, random_macro))  # 4. Eq. (8)
        members = macro_class_members(labels, stacked.device)
        out[high] = tendency_weights(mic, members, num_samples, n_micro).mul_(values).sum(0)  # 5-6. Eq. (9), (11)
    if stats is not None:
        stats.update(high_fraction=len(high) / max(stacked.shape[1], 1), macro_classes=len(members))
    return out


def fedpake_aggregate_chunked(stacked, num_samples, kappa=0.2, n_micro=4, n_macro=4, delta=0.2, random_micro=None,
                              random_macro=None, stats=None, chunk_elems=2 ** 20):
    """``fedpake_aggregate`` over chunks of H of about ``chunk_elems`` values, in two passes (the Micro-Classes
    are recomputed, not stored): memory bounded whatever the model's size; a GPU waits twice (|H| per chunk, the
    clustering's input). The same result (tests/test_fedpake.py)."""
    num_samples = torch.as_tensor(num_samples, dtype=stacked.dtype).to(stacked.device, non_blocking=True)
    out, members = (num_samples / num_samples.sum()) @ stacked, ()
    starts = range(0, stacked.shape[1], max(1, chunk_elems // len(stacked)))
    high = [parameter_division(stacked[:, s:s + starts.step], kappa) for s in starts]
    counts = torch.stack([h.sum() for h in high]).tolist()  # |H| of every chunk: one host sync
    drawn_from = random_micro.get_state() if random_micro is not None else None

    def high_columns():  # (columns, values, Micro-Classes) of H, chunk by chunk; the same on every call
        generator = random_micro.set_state(drawn_from) if random_micro is not None else None
        for s, high_in_c, num in zip(starts, high, counts):
            columns = torch.nonzero_static(high_in_c, size=num).flatten() + s  # size known: no GPU sync
            values = stacked.index_select(1, columns)
            yield columns, values, micro_classes(values, n_micro) if generator is None else random_micro_classes(
                len(stacked), num, n_micro, generator).to(values.device, non_blocking=True)

    if sum(counts):
        labels = random_macro_classes(len(stacked), n_macro, random_macro) if random_macro is not None else \
            cluster_macro_classes(sum(micro_class_disagreements(mic, n_micro) for *_, mic in high_columns()),
                                  sum(counts), n_macro, delta)
        members = macro_class_members(labels, stacked.device)
        for columns, values, mic in high_columns():
            out[columns] = tendency_weights(mic, members, num_samples, n_micro).mul_(values).sum(0)
    if stats is not None:
        stats.update(high_fraction=sum(counts) / max(stacked.shape[1], 1), macro_classes=len(members))
    return out


# ----------------------------------------------------------------------------- client and server steps, main

def client_update(model, global_state, data, client, args, round_):
    """Alg. 1's clients train as in FedAvg: local SGD (common.local_train) from the global model (flat) on client k's
    training data. Returns (the trained model, flat; the mean training loss, 0-dim)."""
    common.load_flat_state(model, global_state)
    loss = common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, round_, client))
    return common.flatten_state(model), loss


def one_pass_peak_bytes(num_clients, num_values, itemsize, n_micro):
    """Upper estimate of what ``fedpake_aggregate`` takes beyond the K x D stack (H = every column: the most): per
    value H's values, the tendency weights, a Macro-Class's three products, byte-wide classes and masks and the
    allocator's slack; per column the class counts of ``tendency`` (measured: docs/fedpake.md)."""
    return num_clients * num_values * (5 * itemsize + 8) + num_values * (4 * n_micro + 48)


def aggregation_form(args, model, device):
    """--aggregation, decided once for the run at its start: "one-pass" or "chunked". auto: "one-pass" where a round's
    K x D stack of ``model`` and one_pass_peak_bytes beyond it fit in the memory free on ``device`` now (or it cannot
    be read), else "chunked": the same aggregation to float32 rounding, the form never changes within a run."""
    if args.aggregation != "auto":
        return args.aggregation
    k, flat, free = common.clients_per_round(args), common.flatten_state(model), datasets.memory_available(device)
    d, size = flat.numel(), flat.element_size()
    need = k * d * size + one_pass_peak_bytes(k, d, size, args.n_micro)  # a round's stack, the one-pass form beyond it
    return "one-pass" if free is None or need <= free else "chunked"


def server_update(client_states, num_samples, args, round_, form):
    """Alg. 1's server step: ``fedpake_aggregate`` of the clients' trained models in place of FedAvg's mean, in the
    run's ``form`` ("chunked": ``fedpake_aggregate_chunked``; ``aggregation_form``). Returns the new global model
    (flat) and the statistics, with the time in seconds."""
    stats, start, stacked = {}, time.perf_counter(), common.as_rows(client_states)
    ablate = args.ablate or ()  # Table 4: random classes from two seeds of (seed, round); None: the paper's classes
    micro_seed, macro_seed = (common.client_seed(args.seed, round_, 0, tag) for tag in (MICRO_TAG, MACRO_TAG))
    random_micro = torch.Generator().manual_seed(micro_seed) if "micro" in ablate else None
    random_macro = torch.Generator().manual_seed(macro_seed) if "macro" in ablate else None
    aggregate = {"one-pass": fedpake_aggregate, "chunked": fedpake_aggregate_chunked}[form]
    new_global = aggregate(stacked, num_samples, kappa=args.kappa, n_micro=args.n_micro, n_macro=args.n_macro,
                           delta=args.delta, random_micro=random_micro, random_macro=random_macro, stats=stats)
    if new_global.is_cuda:
        torch.cuda.synchronize(new_global.device)
    stats["agg_seconds"] = time.perf_counter() - start
    return new_global, stats


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    global_model = common.build_model(args.model, data, auto_image=AUTO_IMAGE).to(device)
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=AUTO_IMAGE), device,
                                   data)
    model_bytes = common.state_bytes(global_model)
    form = aggregation_form(args, global_model, device)  # once, before config.json records args
    if not args.resume:  # resumed: the recorded form (a run begun before it was recorded says auto: decided now)
        args.aggregation = form
    # plumbing: the run folder (config.json, partition.json, the partition printed), its lock, Ctrl-C at a round's end
    run = run_folder.Run("fedpake", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedpake] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} "
          f"parameters, {model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time; kappa {args.kappa}, "
          f"n_micro {args.n_micro}, n_macro {args.n_macro}, delta {args.delta}"
          + (f", ablate {' and '.join(args.ablate)}" if args.ablate else "") + f"; aggregation {form}")

    # plumbing, not the algorithm: progress=, check_finite, run.add_bytes, log, checkpoint, stop (run_folder.py)
    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        global_state = common.flatten_state(global_model)
        client_states, losses = pool.train(lambda model, client: client_update(model, global_state, data, client,
                                                                               args, round_), clients,
                                           progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        num_samples = [len(data.train_idx[client]) for client in clients]
        new_global, stats = server_update(client_states, num_samples, args, round_, form)
        common.load_flat_state(global_model, new_global)
        del client_states  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses),
                             **stats})
            print(f"[fedpake]   high-dispersion {100 * stats['high_fraction']:.1f}% | "
                  f"{stats['macro_classes']} Macro-Classes | aggregation {stats['agg_seconds']:.3f} s")
        if stats["macro_classes"] == len(clients) > 1:  # one client a Macro-Class each: FedAvg's weights
            print(f"[fedpake]   round {round_}: each client is its own Macro-Class: the aggregation is FedAvg's")
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
