"""Host-device syncs and memory layout ("Ready for the GPU"): the per-round code paths issue no
op that makes the host wait for a GPU in a loop (per client, chunk or batch), and every change
gives the numbers of the code it replaced bit for bit (verbatim copies of the old functions at
the end of this file). Syncs are counted on the CPU by the ops that would wait on CUDA tensors:
``.item()``/``int()``/``float()``/``bool()``, ``nonzero``, boolean-mask indexing,
``repeat_interleave`` without ``output_size`` and ``.tolist()``."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import common
import datasets
import fedacd
import fedpake
import fedavg
import pfedla
from common import UserError
from rounds import fedacd_local_train
from fedacd import accumulate_probabilities, fedacd_loss, margin_deltas, probability_matrix, rows_to_matrix

aten = torch.ops.aten
WAITING_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
               aten._unique2.default, aten.unique_consecutive.default}
INDEXING_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


class HostSyncs(TorchDispatchMode):
    """Records, by name, the ops run inside it that wait for the GPU when their tensors are on CUDA."""

    def __init__(self):
        super().__init__()
        self.names, self.active = [], False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked = func in INDEXING_OPS and any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        unsized = func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
        if func in WAITING_OPS or masked or unsized:
            self.names.append(str(func))
        return func(*args, **kwargs)


@pytest.fixture
def host_syncs(monkeypatch):
    """``with host_syncs() as syncs:`` records the syncs of the block in ``syncs.names`` (``.tolist()``,
    which dispatches no op, through a wrapper)."""
    counters, tolist = [], torch.Tensor.tolist

    def counted_tolist(tensor):
        for syncs in counters:
            if syncs.active:
                syncs.names.append("tolist")
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    return lambda: counters.append(HostSyncs()) or counters[-1]


# ----------------------------------------------------------------------------- 5. per-client evaluation

def vector_data(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    idx = list(torch.randperm(n, generator=g).split(sizes))
    return datasets.FedData(x=torch.randn(n, 6, generator=g), y=torch.randint(4, (n,), generator=g), num_classes=4,
                          train_idx=idx, test_idx=idx)


def test_evaluate_gives_the_old_numbers_without_a_sync(host_syncs):
    data = vector_data([50, 0, 120, 7, 123])
    torch.manual_seed(0)
    model = common.MLP(6, 4)
    with host_syncs() as syncs:
        new = common.evaluate(model, data, data.test_idx, batch_size=64)
    assert syncs.names == []
    with host_syncs() as syncs:
        old = old_evaluate(model, data, data.test_idx, batch_size=64)
    assert syncs.names  # the counter sees the old repeat_interleave
    for a, b in zip(new, old):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(common.evaluate(model, data, [data.test_idx[2]]), old_evaluate(model, data, [data.test_idx[2]])):
        assert torch.equal(a, b)  # one client, as FedALA, pFedLA and FedACD call it


def test_with_retained_layers_gives_the_old_result_without_a_sync(host_syncs):
    g = torch.Generator().manual_seed(1)
    sizes, clients = [3, 5, 2, 4], torch.tensor([0, 2])
    theta_bar, client_models = torch.randn(2, 14, generator=g), torch.randn(3, 14, generator=g)
    keep = torch.rand(2, 4, generator=g) > 0.5
    with host_syncs() as syncs:
        new = pfedla.with_retained_layers(theta_bar, client_models, clients, sizes, keep)
    assert syncs.names == []
    assert torch.equal(new, old_with_retained_layers(theta_bar, client_models, clients, sizes, keep))


# ----------------------------------------------------------------------------- 6. FedPake's aggregation

def clustered_stack(num_clients, dim, groups, seed):
    """Clients in ``groups`` clusters around parameters near 0 (high dispersion), the first half of
    the columns almost equal across clients (low dispersion: whole chunks without a column of H)."""
    g = torch.Generator().manual_seed(seed)
    group = torch.randint(groups, (num_clients,), generator=g)
    x = 0.05 * torch.randn(dim, generator=g) + 0.03 * torch.randn(groups, dim, generator=g)[group]
    x += 0.01 * torch.randn(num_clients, dim, generator=g)
    x[:, : dim // 2] = 1 + 0.001 * x[:, : dim // 2]
    return x, torch.randint(10, 200, (num_clients,), generator=g).tolist()


CASES = [  # clients, dim, groups, kappa, n_micro, n_macro, delta
    (3, 1000, 2, 0.2, 4, 4, 0.2),
    (7, 2000, 3, 0.05, 2, 2, 0.0),
    (12, 3000, 4, 0.5, 8, 5, 0.5),
    (20, 4000, 3, 0.2, 5, 1, 0.2),
    (20, 4000, 5, 0.3, 4, 4, 0.3),
    (9, 2500, 9, 1.0, 3, 6, 0.1),
]


@pytest.mark.parametrize("case", CASES)
def test_fedpake_aggregate_gives_the_old_result(case):
    num_clients, dim, groups, kappa, n_micro, n_macro, delta = case
    x, w = clustered_stack(num_clients, dim, groups, seed=sum(case[:3]))
    flags = dict(kappa=kappa, n_micro=n_micro, n_macro=n_macro, delta=delta, chunk_elems=num_clients * 256)
    stats_new, stats_old = {}, {}
    new = fedpake.fedpake_aggregate_chunked(x, w, stats=stats_new, **flags)
    old = old_fedpake_aggregate(x, w, stats=stats_old, **flags)
    assert dim // 256 >= 3 and 0 < stats_new["high_fraction"] < 1
    assert torch.equal(new, old) and stats_new == stats_old


def test_the_cases_have_several_macro_classes():
    macro = []
    for num_clients, dim, groups, kappa, n_micro, n_macro, delta in CASES:
        stats = {}
        fedpake.fedpake_aggregate(*clustered_stack(num_clients, dim, groups, seed=num_clients + dim + groups),
                                  kappa=kappa, n_micro=n_micro, n_macro=n_macro, delta=delta, stats=stats)
        macro.append(stats["macro_classes"])
    assert sum(m > 1 for m in macro) >= 3 and 1 in macro


def test_fedpake_syncs_do_not_grow_with_the_chunks(host_syncs):
    x, w = clustered_stack(12, 3000, 4, seed=3)
    counts = {}
    for aggregate in (fedpake.fedpake_aggregate_chunked, old_fedpake_aggregate):
        for chunks in (1, 12):
            with host_syncs() as syncs:
                aggregate(x, w, chunk_elems=x.numel() // chunks + 12)
            counts[aggregate, chunks] = syncs.names
    one, many = counts[fedpake.fedpake_aggregate_chunked, 1], counts[fedpake.fedpake_aggregate_chunked, 12]
    assert one == many and "aten.nonzero.default" not in many  # the host's clustering loop only, as one chunk
    assert len(counts[old_fedpake_aggregate, 12]) > len(counts[old_fedpake_aggregate, 1]) + 30  # the counter sees it


# ----------------------------------------------------------------------------- 7. FedACD

def test_mixup_draws_are_the_stream_drawn_batch_by_batch():
    args, data = tiny_fedacd()
    idx, g = data.train_idx[1], torch.Generator().manual_seed(7)
    batches = list(common.epoch_batches(idx, args.batch_size, args.local_epochs, 5))
    mixed = [b for epoch in fedacd.mixup_epochs(data, idx, args, batch_seed=5, mixup_seed=7) for b in epoch]
    assert len(common.batch_bounds(len(idx), args.batch_size)) > 1 and args.local_epochs > 1
    for batch, (x, y_a, y_b, mix) in zip(batches, mixed, strict=True):
        want, perm = float(torch.rand((), generator=g)), torch.randperm(len(batch), generator=g)
        assert mix == want and torch.equal(y_a, data.y[batch]) and torch.equal(y_b, data.y[batch][perm])
        assert torch.equal(x, want * data.x[batch] + (1 - want) * data.x[batch][perm])


def tiny_fedacd(mixup=True):
    args = fedacd.parse_args(["--dataset", "synthetic", "--num-clients", "3", "--device", "cpu"])
    args.local_epochs, args.batch_size, args.mixup = 2, 16, mixup
    return args, common.load_federated_data(args, torch.device("cpu"))


@pytest.mark.parametrize("mixup", [True, False])
def test_fedacd_local_train_gives_the_old_result(mixup):
    args, data = tiny_fedacd(mixup)
    idx, present = data.train_idx[1], torch.as_tensor(data.train_counts[1] > 0)
    results = []
    for train in (fedacd_local_train, old_local_train):
        torch.manual_seed(1)
        model = common.build_model("mlp", data)
        loss, P = train(model, data, idx, present, args, batch_seed=5, mixup_seed=7)
        results.append((loss, P, common.flatten_state(model)))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_fedacd_copies_mixup_permutations_once_per_update_not_per_batch(monkeypatch):
    args, data = tiny_fedacd()
    idx, present = data.train_idx[1], torch.as_tensor(data.train_counts[1] > 0)
    copies, to = [], torch.Tensor.to  # the dtype of every tensor moved with .to

    def recorded_to(tensor, *args, **kwargs):
        copies.append(tensor.dtype)
        return to(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recorded_to)
    per_batch_size = {}
    for batch_size in (8, 40):
        args.batch_size, copies[:] = batch_size, []
        fedacd_local_train(common.build_model("mlp", data), data, idx, present, args, batch_seed=5, mixup_seed=7)
        per_batch_size[batch_size] = list(copies)
    assert len(common.batch_bounds(len(idx), 8)) > 2 * len(common.batch_bounds(len(idx), 40))
    assert per_batch_size[8] == per_batch_size[40]


def test_aggregation_score_with_class_indices_equals_the_mask_without_a_sync(host_syncs):
    g = torch.Generator().manual_seed(2)
    for num_classes in (3, 10, 100):
        P = torch.rand(num_classes, num_classes, generator=g).softmax(1)
        present = torch.rand(num_classes, generator=g) > 0.4
        present[0] = True
        classes = present.nonzero().flatten()  # client_update finds them on the host
        for reduction in ("mean", "sum"):
            with host_syncs() as syncs:
                by_index = fedacd.aggregation_score(P, classes, 0.99, reduction)
            assert syncs.names == []
            with host_syncs() as syncs:
                by_mask = fedacd.aggregation_score(P, present, 0.99, reduction)
            assert syncs.names == ["aten.index.Tensor"]
            assert all(torch.equal(a, b) for a, b in zip(by_index, by_mask))


# ----------------------------------------------------------------------------- 8. memory layout

def test_integer_images_come_channels_last_with_the_old_values():
    images = np.random.default_rng(0).integers(0, 256, (20, 3, 8, 8), dtype=np.uint8)
    new, old = datasets.to_tensor(images), old_to_tensor(images)
    assert new.is_contiguous(memory_format=torch.channels_last) and torch.equal(new, old)


def test_images_are_channels_last_before_they_move_to_the_device(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    path = tmp_path / "images.npz"
    np.savez(path, x=rng.integers(0, 256, (40, 3, 16, 16), dtype=np.uint8), y=np.arange(40) % 4)
    moved, to = [], torch.Tensor.to  # whether each float image tensor is channels-last when it moves

    def recorded_to(tensor, *args, **kwargs):
        if tensor.dim() == 4 and tensor.is_floating_point():
            moved.append(tensor.is_contiguous(memory_format=torch.channels_last))
        return to(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recorded_to)
    args = fedavg.parse_args(["--dataset", str(path), "--num-clients", "2", "--partition", "iid", "--device", "cpu"])
    data = common.load_federated_data(args, torch.device("cpu"))
    assert moved and all(moved) and data.x.is_contiguous(memory_format=torch.channels_last)
    assert all(p.is_contiguous() for p in common.build_model("cnn", data).parameters())  # the CPU keeps the layout


@pytest.mark.parametrize("make", [lambda: common.CNN(3, 10, 32), lambda: common.PFedLACNN(3, 10, 32)])
def test_flat_state_of_a_channels_last_model_is_in_logical_order(make):
    torch.manual_seed(0)
    default = make()
    torch.manual_seed(0)
    channels_last = make().to(memory_format=torch.channels_last)
    assert not channels_last.conv1.weight.is_contiguous()
    assert torch.equal(common.flatten_state(channels_last), common.flatten_state(default))
    flat = torch.randn(common.flatten_state(default).numel(), generator=torch.Generator().manual_seed(1))
    common.load_flat_state(default, flat)
    common.load_flat_state(channels_last, flat)
    assert channels_last.conv1.weight.is_contiguous(memory_format=torch.channels_last)  # loading keeps the layout
    assert torch.equal(common.flatten_state(channels_last), flat)
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), channels_last.state_dict().values()))


# ----------------------------------------------------------------------------- the old code, verbatim
@torch.no_grad()
def old_evaluate(model, data, idx_list, batch_size=2048):
    """Per-client (correct, count, summed loss) of ``model`` on each index tensor in ``idx_list``,
    as tensors on the data's device; all clients go through the model in large batches."""
    was_training = model.training
    model.eval()
    device = data.x.device
    sizes = torch.tensor([len(i) for i in idx_list], device=device)
    owner = torch.repeat_interleave(torch.arange(len(idx_list), device=device), sizes)
    all_idx = torch.cat(list(idx_list)) if len(idx_list) else torch.zeros(0, dtype=torch.long, device=device)
    correct = torch.zeros(len(all_idx), device=device)
    losses = torch.zeros(len(all_idx), device=device)
    for start in range(0, len(all_idx), batch_size):
        batch = all_idx[start: start + batch_size]
        logits = model(data.x[batch])
        correct[start: start + len(batch)] = (logits.argmax(1) == data.y[batch]).float()
        losses[start: start + len(batch)] = F.cross_entropy(logits, data.y[batch], reduction="none")
    model.train(was_training)
    zeros = torch.zeros(len(idx_list), device=device)
    return zeros.index_add(0, owner, correct), sizes.float(), zeros.index_add(0, owner, losses)


def old_with_retained_layers(theta_bar, client_models, clients, sizes, keep):
    """Alg. 2 l. 7 and 13: the model client i starts local training from: the layer-wise
    aggregate theta_bar_i, except for its retained layers (``keep``), where it has its own
    theta_i^l (its last trained model, which is also the server's stored row i, so the
    simulation reads it from there). With no retained layer this is theta_bar_i itself."""
    keep_entries = keep.repeat_interleave(torch.as_tensor(sizes, device=keep.device), dim=1)
    return torch.where(keep_entries, client_models[clients], theta_bar)


def old_fedpake_aggregate(stacked, weights, kappa=0.2, n_micro=4, n_macro=4, delta=0.2, ablate=None, seed=0,
                      stats=None, chunk_elems=2 ** 20):
    """FedPake's server aggregation, Eq. (2)-(11), a drop-in replacement for FedAvg's weighted
    average of the rows of ``stacked`` (K clients x D) with ``weights``
    the clients' sample counts. Columns go in chunks of about ``chunk_elems`` values, in two
    passes (Micro-Classes are recomputed, not stored). ``ablate`` 'micro' or 'macro' draws
    random classes from ``seed`` (Table 4). ``stats``, if a dict, receives the share of
    high-dispersion parameters and the number of Macro-Classes. Needs only torch: its stages
    are defined inside it, so it can be pasted alone; ``fedpake_aggregate(None, None)`` returns
    them by name instead of aggregating (for tests and reuse)."""

    def parameter_division(values, kappa):
        """Eq. (2)-(5): True where the coefficient of variation over clients (rows) exceeds kappa."""
        mu = values.mean(0)
        sigma = (values - mu).square_().mean(0).sqrt_()  # population std
        return sigma / (mu.abs() + 1e-12) > kappa

    def micro_classes(values, n_micro):
        """Eq. (6)-(7): each column's [min, max] over clients in n_micro equal bins; uint8 classes."""
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

    def macro_classes(disagreements, num_high, n_macro, delta):
        """Eq. (8) and the clustering after it: average-linkage agglomerative clustering on
        D(a, b) = disagreements[a, b] / num_high. Merge the closest pair while D <= delta, and
        while there are more than n_macro clusters. Returns labels 0..C-1 numbered by each
        cluster's smallest client (ties between pairs: the first in row-major order)."""
        pair_sums = disagreements.double().cpu().clone()  # summed over the client pairs of two clusters
        sizes = torch.ones(len(pair_sums), dtype=torch.float64)
        labels = torch.arange(len(pair_sums))
        while len(sizes) > 1:
            # average linkage; integer sums divided once, so ties with delta compare exactly
            linkage = pair_sums / (sizes[:, None] * sizes[None, :] * num_high)
            linkage.fill_diagonal_(float("inf"))
            a, b = divmod(int(linkage.argmin()), len(sizes))  # a < b: the matrix is symmetric
            if linkage[a, b] > delta and len(sizes) <= n_macro:
                break
            pair_sums[a] += pair_sums[b]
            pair_sums[:, a] += pair_sums[:, b]
            sizes[a] += sizes[b]
            keep = torch.arange(len(sizes)) != b
            pair_sums, sizes = pair_sums[keep][:, keep], sizes[keep]
            labels[labels == b] = a
            labels[labels > b] -= 1
        return labels

    def tendency(mic, n_micro):
        """Eq. (9) for one Macro-Class (``mic``: its clients x h): the most frequent Micro-Class of
        each column; ties go to the class nearest the median class, then to the lower class.
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

    def aggregation_weights(mic, labels, sizes, n_micro):
        """Eq. (9) and (11): the weight of client k (in Macro-Class c) for column j is
        [MIC_kj = T_cj] * n_k / (sum of n over the matching clients of c) * N_c / N.
        Each client is in one Macro-Class, so its weight is counted once; columns sum to 1."""
        labels = labels.to(mic.device)
        weights = torch.empty(mic.shape, dtype=sizes.dtype, device=mic.device)
        for c in range(int(labels.max()) + 1):
            rows = (labels == c).nonzero().flatten()
            matched = (mic[rows] == tendency(mic[rows], n_micro)).view(torch.uint8).to(sizes.dtype) * sizes[rows, None]
            # the mode has a client, so the sum is > 0
            weights[rows] = matched / matched.sum(0) * (sizes[rows].sum() / sizes.sum())
        return weights

    if stacked is None:
        return {f.__name__: f for f in (parameter_division, micro_classes, micro_class_disagreements,
                                         macro_classes, tendency, aggregation_weights)}
    num_clients, dim = stacked.shape
    sizes = torch.as_tensor(weights, dtype=stacked.dtype, device=stacked.device)
    out = (sizes / sizes.sum()) @ stacked  # Eq. (10) on L; H is overwritten below
    cols = max(1, chunk_elems // num_clients)
    chunks = [slice(s, s + cols) for s in range(0, dim, cols)]
    high = torch.cat([parameter_division(stacked[:, c], kappa) for c in chunks])
    num_high = int(high.sum())
    if stats is not None:
        stats.update(high_fraction=num_high / max(dim, 1), macro_classes=0)
    if num_high == 0:
        return out

    def high_columns():
        """(columns, values, Micro-Classes) of H, chunk by chunk; the same random draws on every call."""
        g = torch.Generator(stacked.device).manual_seed(seed)
        for c in chunks:
            columns = high[c].nonzero().flatten() + c.start
            values = stacked.index_select(1, columns)
            mic = micro_classes(values, n_micro) if ablate != "micro" else \
                torch.randint(n_micro, values.shape, generator=g, device=values.device, dtype=torch.uint8)
            yield columns, values, mic

    if ablate == "macro":
        draw = torch.randint(min(n_macro, num_clients), (num_clients,), generator=torch.Generator().manual_seed(seed))
        labels = torch.unique(draw, return_inverse=True)[1]
    else:
        disagreements = sum(micro_class_disagreements(mic, n_micro) for _, _, mic in high_columns())
        labels = macro_classes(disagreements, num_high, n_macro, delta)
    for columns, values, mic in high_columns():
        out[columns] = aggregation_weights(mic, labels, sizes, n_micro).mul_(values).sum(0)  # Eq. (11)
    if stats is not None:
        stats["macro_classes"] = int(labels.max()) + 1
    return out


def old_to_tensor(x, reference=None, tokens=False):
    """Integer images (uint8, uint16, int32, ...) -> float32 normalised per channel with the mean
    and std of ``reference``, so their range does not matter; float data as it is; integer
    vectors as int64 token ids if ``tokens``, else as float32 numbers. Statistics are accumulated
    in chunks and the conversion is in place, so the peak memory is one float32 copy of ``x``
    (Tiny-ImageNet: 5.4 GB rather than four times that)."""
    if x.dtype.kind in "ui" and x.ndim == 4:
        ref = torch.from_numpy(reference if reference is not None else x)
        total = torch.zeros(2, ref.shape[1], dtype=torch.float64)
        for start in range(0, len(ref), 4096):
            chunk = ref[start: start + 4096].double() / 255
            total += torch.stack([chunk.sum((0, 2, 3)), chunk.square().sum((0, 2, 3))])
        count = ref.numel() / ref.shape[1]
        mean = total[0] / count
        std = (total[1] / count - mean ** 2).clamp_min(0).sqrt() + 1e-8
        shape = (1, -1, 1, 1)
        return torch.from_numpy(x).float().div_(255).sub_(mean.float().view(shape)).div_(std.float().view(shape))
    if tokens and x.min() < 0:
        raise UserError(f"token ids for --model fasttext must be >= 0 (0 pads), but x has ids down to {x.min()}")
    return torch.from_numpy(x.astype(np.int64 if tokens else np.float32))


def old_local_train(model, data, idx, present, args, batch_seed, mixup_seed):
    """The local update (Sec. 3, Appendix A.1): minimise fedacd_loss from the received model, with input mixup
    (x = mix x_a + (1 - mix) x_b, mix ~ Beta(1, 1) = U(0, 1), one per batch). P^m is estimated
    before the first epoch with the received model, accumulated (detached, with the mixup
    weights) during each epoch and replaced at the end of it. Returns the mean loss (0-dim)
    and P^m of the trained model (what client_update scored it with)."""
    C, device = data.num_classes, data.x.device
    clean = lambda: ((data.x[b], data.y[b]) for b in idx.split(1024))  # noqa: E731
    P = probability_matrix(model, clean(), C)
    delta = margin_deltas(P, present, args.missing_delta)
    sums = torch.zeros(C, C, device=device)
    mixup_rng = torch.Generator().manual_seed(mixup_seed)
    steps_per_epoch = len(common.batch_bounds(len(idx), args.batch_size))
    optimizer = common.make_optimizer(model, args)
    model.train()
    total = torch.zeros((), device=device)
    for step, batch in enumerate(common.epoch_batches(idx, args.batch_size, args.local_epochs, batch_seed)):
        x, y_a, y_b, mix = data.x[batch], data.y[batch], data.y[batch], 1.0
        if args.mixup:
            mix = float(torch.rand((), generator=mixup_rng))
            perm = torch.randperm(len(batch), generator=mixup_rng).to(device, non_blocking=True)
            x, y_b = mix * x + (1 - mix) * x[perm], y_a[perm]
        logits = model(x)
        if args.mixup:  # mix * L(y_a) + (1 - mix) * L(y_b), both label sets in one call
            per_label = fedacd_loss(logits.repeat(2, 1), torch.cat([y_a, y_b]), delta, args.lam).view(2, -1).mean(1)
            loss = mix * per_label[0] + (1 - mix) * per_label[1]
        else:
            loss = fedacd_loss(logits, y_a, delta, args.lam).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach()
        accumulate_probabilities(sums, logits.detach().softmax(1), y_a, y_b, mix)
        if (step + 1) % steps_per_epoch == 0:  # end of an epoch: the accumulated P^m replaces the old one
            P = rows_to_matrix(sums, P)
            delta = margin_deltas(P, present, args.missing_delta)
            sums.zero_()
    return total / (steps_per_epoch * args.local_epochs), probability_matrix(model, clean(), C)
