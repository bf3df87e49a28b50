"""FedPake (arXiv 2408.11278 v2): FedAvg local training with a parameter-skew-aware aggregation.

Each round (Alg. 1): the server samples clients, each runs --local-epochs of SGD from the
global model exactly as in FedAvg, and the server aggregates the K returned models with
``fedpake_aggregate`` instead of the sample-weighted mean. The equations (2)-(11) were lost
in our copy of the paper and no code is public: every formula below is our reconstruction,
implemented exactly (docs/fedpake.md says what was reconstructed and why). Over the stack X
(K clients x D parameters, the flat model of each client, float buffers included):

  1. Parameter division, Eq. (2)-(5): mu = mean over clients, sigma = population std,
     CV = sigma / (|mu| + 1e-12); high-dispersion set H = {j : CV_j > kappa}, the rest L.
  2. Low dispersion, Eq. (10): L is the sample-weighted mean over clients (FedAvg).
  3. Micro-Class, Eq. (6)-(7): for j in H, [min_k X_kj, max_k X_kj] is cut into n_micro
     equal bins; MIC_kj = floor((X_kj - min) / (max - min) * n_micro), the maximum in the
     last bin. Integer, in [0, n_micro), order preserving.
  4. Macro-Class, Eq. (8): D(a, b) = ||MIC_a - MIC_b||_0 / |H| over all of H; average-linkage
     agglomerative clustering merges the closest pair while it is <= delta, and goes on
     merging while there are more than n_macro clusters.
  5. Tendency, Eq. (9): T_cj = the most frequent Micro-Class of j among the clients of
     Macro-Class c (ties: the tied class nearest the median class, then the lower class).
  6. Aggregation, Eq. (11): in Macro-Class c, parameter j is the sample-weighted mean of the
     clients with MIC_kj = T_cj; the global value is the mean of the Macro-Class values
     weighted by each Macro-Class's sample count. Each client's weight is counted once.

kappa = inf makes H empty and gives FedAvg bit for bit. --ablate micro, macro or both
(`--ablate micro macro`) replaces the Micro-Classes, the Macro-Classes or both by random ones
(Table 4's three ablated rows), drawn afresh each round from (seed, round): micro, a uniform
class in [0, n_micro) per client and parameter; macro, each client in a uniform one of n_macro
Macro-Classes (empty ones dropped). Logged per evaluated round: the
share of parameters in H, the number of Macro-Classes and the aggregation time. The global
model is evaluated on every client's test data; the paper reports the mean over the last
10 rounds (the headline: last10_mean of test_acc).

    python fedpake.py --dataset synthetic --rounds 20      # offline quick start
    python fedpake.py --dataset cifar10                    # Table 1, Dir(0.1), ResNet-18
"""
import startup  # first, before torch loads (seconds): a Ctrl-C while starting ends in one line (startup.py)
import common

import time

import torch

import run_folder

HEADLINE_METRIC = "test_acc"  # what the paper reports, in metrics.csv
HEADLINE = "last10_mean of test_acc (FedPake Table 1: mean over the last 10 rounds)"
AUTO_IMAGE = "resnet18"  # --model auto on images

MICRO_MACRO = {"cifar10": 4, "cifar100": 5, "tinyimagenet": 8}  # Sec. 4.1; 4 (the smallest) elsewhere
ABLATE_TAG = 7  # client_seed tag of the per-round ablation generator


def parse_args(argv=None):
    def resolve(args):
        default = MICRO_MACRO.get(args.dataset, 4)
        args.n_micro = default if args.n_micro is None else args.n_micro
        args.n_macro = default if args.n_macro is None else args.n_macro

    parser = common.base_parser(__doc__.splitlines()[0], script="fedpake", rounds=1000)
    a = parser.add_argument
    a("--kappa", type=float, default=0.2, help="CV threshold kappa of high dispersion; inf gives FedAvg")
    a("--n-micro", type=int, default=None, help="number of Micro-Classes "
      "(default: 4 on cifar10, 5 on cifar100, 8 on tinyimagenet, 4 otherwise)")
    a("--n-macro", type=int, default=None, help="maximum Macro-Classes (default: as --n-micro)")
    a("--delta", type=float, default=0.2, help="merge clusters whose dissimilarity D is at most this")
    a("--ablate", choices=["micro", "macro"], nargs="+", default=None,
      help="replace the Micro-Classes, the Macro-Classes or both (--ablate micro macro) by random ones "
           "(Table 4; default: none)")
    return common.parse_args(parser, argv, resolve, checks=lambda args: [
        (args.kappa >= 0, f"--kappa must be >= 0 (inf for FedAvg), got {args.kappa}"),
        (1 <= args.n_micro <= 255, f"--n-micro must be in [1, 255], got {args.n_micro}"),
        (args.n_macro >= 1, f"--n-macro must be >= 1, got {args.n_macro}"),
        (args.delta >= 0, f"--delta must be >= 0, got {args.delta}")])


# ----------------------------------------------------------------------------- the aggregation, Eq. (2)-(11)

def parameter_division(values, kappa):
    """Eq. (2)-(5) as reconstructed: True where the coefficient of variation over clients (rows),
    CV = population std / (|mean| + 1e-12), exceeds kappa. Caveat (ours): a parameter whose mean
    over clients is near zero has a large CV whatever its spread, so every such parameter is
    "high-dispersion"."""
    mu = values.mean(0)
    sigma = (values - mu).square_().mean(0).sqrt_()  # population std
    return sigma / (mu.abs() + 1e-12) > kappa


def micro_classes(values, n_micro):
    """Eq. (6)-(7) as reconstructed: each column's [min, max] over clients in n_micro equal bins
    (the maximum in the last bin); uint8 classes."""
    lo, hi = values.amin(0), values.amax(0)
    scaled = (values - lo).div_((hi - lo).clamp_min(torch.finfo(values.dtype).tiny))  # in [0, 1]
    # >= 0, so the cast to uint8 is the floor; the maximum goes into the last bin
    return scaled.mul_(n_micro).clamp_(max=n_micro - 1).to(torch.uint8)


def micro_class_disagreements(mic, n_micro):
    """Numerator of Eq. (8): [a, b] = #columns where clients a and b have different Micro-Classes,
    via one (K x h) @ (h x K) product per class instead of a K x K x h comparison."""
    agree = torch.zeros(mic.shape[0], mic.shape[0], device=mic.device)
    for m in range(n_micro):
        one_hot = (mic == m).view(torch.uint8).float()  # via uint8: bool -> float is slow on CPU
        agree += one_hot @ one_hot.T  # exact: counts stay far below 2^24
    return mic.shape[1] - agree.double()


def cluster_macro_classes(disagreements, num_high, n_macro, delta):
    """Eq. (8) and the clustering after it, as reconstructed: average-linkage agglomerative
    clustering on D(a, b) = disagreements[a, b] / num_high, ONE clustering over all of H across
    layers (our choice; the paper does not say per layer or not). Merge the closest pair while
    D <= delta (the paper's threshold), and while there are more than n_macro clusters. Returns
    labels 0..C-1 numbered by each cluster's smallest client (ties between pairs: the first in
    row-major order)."""
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
    """Eq. (9) as reconstructed, for one Macro-Class (``mic``: its clients x h): the most frequent
    Micro-Class of each column; ties (ours) go to the class nearest the median class, then to the
    lower class.
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
        # strict: on a tie the lower class stays
        best_class = torch.where(score > best_score, classes[m], best_class)
        best_score = torch.maximum(best_score, score)
    return best_class


def macro_class_members(labels, device):
    """The clients (rows) of each Macro-Class c = 0..C-1 as index tensors on ``device``, found on
    the host from the clustering's labels and copied in one go (no GPU sync per class or chunk)."""
    labels = labels.tolist()
    members = [[k for k, label in enumerate(labels) if label == c] for c in range(max(labels) + 1)]
    rows = torch.tensor(sum(members, [])).to(device, non_blocking=True)
    return rows.split([len(m) for m in members])


def tendency_weights(mic, members, num_samples, n_micro):
    """Eq. (9) and (11) as reconstructed: the weight of client k (in Macro-Class c) for column j is
    [MIC_kj = T_cj] * n_k / (sum of n over the matching clients of c) * N_c / N, n_k =
    ``num_samples[k]`` (the clients' sample counts, a float tensor), ``members`` the rows of each
    Macro-Class (``macro_class_members``). Each client is in one Macro-Class, so its weight is counted
    once; columns sum to 1."""
    weights = torch.empty(mic.shape, dtype=num_samples.dtype, device=mic.device)
    for rows in members:
        matched = (mic[rows] == tendency(mic[rows], n_micro)).view(torch.uint8).to(num_samples.dtype)
        matched *= num_samples[rows, None]
        # the mode has a client, so the sum is > 0
        weights[rows] = matched / matched.sum(0) * (num_samples[rows].sum() / num_samples.sum())
    return weights


def high_dispersion_chunks(stacked, high, chunks, n_micro, random_micro=False, seed=0):
    """The columns of H with their values and Micro-Classes (Eq. (6)-(7); random ones from ``seed`` with
    ``random_micro``, Table 4), chunk by chunk: (columns, values, MIC) per chunk ``slice`` of ``chunks``,
    ``high`` its H mask and |H|. The same draws on every call, and on every device (a CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    for c, (high_in_c, num) in zip(chunks, high):
        columns = torch.nonzero_static(high_in_c, size=num).flatten() + c.start  # size known: no GPU sync
        values = stacked.index_select(1, columns)
        mic = micro_classes(values, n_micro) if not random_micro else torch.randint(
            n_micro, values.shape, generator=g, dtype=torch.uint8).to(values.device, non_blocking=True)
        yield columns, values, mic


def fedpake_aggregate(stacked, num_samples, kappa=0.2, n_micro=4, n_macro=4, delta=0.2, ablate=None, seed=0,
                      stats=None, chunk_elems=2 ** 20):
    """FedPake's server aggregation, Eq. (2)-(11) AS RECONSTRUCTED BY US (the equations are missing from our
    copy of the paper, no code is public; docs/fedpake.md): in place of FedAvg's average of the rows of
    ``stacked`` (K clients x D) weighted by the clients' ``num_samples``; ``kappa = inf`` gives that average
    bit for bit. ``ablate``: 'micro', 'macro' or both (a list) draws those classes at random from ``seed``
    (Table 4). ``stats``, if a dict, receives ``high_fraction`` (|H| / D) and ``macro_classes`` (their
    number). Columns go in chunks of about ``chunk_elems`` values, twice (the Micro-Classes are recomputed,
    not stored): memory stays bounded, and a GPU waits twice (|H| per chunk, the clustering's input)."""
    ablate = {ablate} if isinstance(ablate, str) else set(ablate or ())
    num_clients, dim = stacked.shape
    num_samples = torch.as_tensor(num_samples, dtype=stacked.dtype).to(stacked.device, non_blocking=True)
    out = (num_samples / num_samples.sum()) @ stacked  # Eq. (10) on L: the sample-weighted mean (ours); H below
    cols = max(1, chunk_elems // num_clients)
    chunks = [slice(s, s + cols) for s in range(0, dim, cols)]
    high = [parameter_division(stacked[:, c], kappa) for c in chunks]  # Eq. (2)-(5), chunk by chunk
    high = list(zip(high, torch.stack([h.sum() for h in high]).tolist()))  # |H| of every chunk: one host sync
    num_high = sum(num for _, num in high)
    if stats is not None:
        stats.update(high_fraction=num_high / max(dim, 1), macro_classes=0)
    if num_high == 0:
        return out
    high_columns = lambda: high_dispersion_chunks(stacked, high, chunks, n_micro, "micro" in ablate, seed)  # noqa: E731
    if "macro" in ablate:
        draw = torch.randint(min(n_macro, num_clients), (num_clients,), generator=torch.Generator().manual_seed(seed))
        labels = torch.unique(draw, return_inverse=True)[1]
    else:  # Eq. (8)
        disagreements = sum(micro_class_disagreements(mic, n_micro) for _, _, mic in high_columns())
        labels = cluster_macro_classes(disagreements, num_high, n_macro, delta)
    members = macro_class_members(labels, stacked.device)
    for columns, values, mic in high_columns():  # Eq. (9) and (11) on H
        out[columns] = tendency_weights(mic, members, num_samples, n_micro).mul_(values).sum(0)
    if stats is not None:
        stats["macro_classes"] = len(members)
    return out


# ----------------------------------------------------------------------------- server step and main

def server_update(client_states, num_samples, args, round_):
    """Alg. 1's server step: ``fedpake_aggregate`` of the clients' trained models in place of
    FedAvg's mean. Returns the new global model (flat) and the aggregation's statistics (with
    its time in seconds)."""
    stats, start = {}, time.perf_counter()
    new_global = fedpake_aggregate(common.as_rows(client_states), num_samples, kappa=args.kappa, n_micro=args.n_micro,
                                   n_macro=args.n_macro, delta=args.delta, ablate=args.ablate,
                                   seed=common.client_seed(args.seed, round_, 0, ABLATE_TAG), stats=stats)
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
    run = run_folder.Run("fedpake", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedpake] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} "
          f"parameters, {model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time; kappa {args.kappa}, "
          f"n_micro {args.n_micro}, n_macro {args.n_macro}, delta {args.delta}"
          + (f", ablate {' and '.join([args.ablate] if isinstance(args.ablate, str) else args.ablate)}"
             if args.ablate else ""))  # a run made before --ablate took two values saved one string

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        global_state = common.flatten_state(global_model)
        client_states, losses = pool.train(lambda model, client: common.client_update(
            model, global_state, data, client, args, round_), clients)  # FedAvg's clients
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        num_samples = [len(data.train_idx[client]) for client in clients]
        new_global, stats = server_update(client_states, num_samples, args, round_)
        del client_states  # done with them: their memory serves the next round (common.ClientPool.train)
        common.load_flat_state(global_model, new_global)
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses),
                             **stats})
            print(f"[fedpake]   high-dispersion {100 * stats['high_fraction']:.1f}% | "
                  f"{stats['macro_classes']} Macro-Classes | aggregation {stats['agg_seconds']:.3f} s")
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
