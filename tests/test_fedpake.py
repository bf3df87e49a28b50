"""FedPake (fedpake.py): every stage of the aggregation (Eq. (2)-(11)) on cases small enough to check by
hand or by an independent computation, then the script end to end."""
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch

import common
import fedavg
import fedpake
from conftest import ROOT, metrics_rows, run_dir, run_script

MEASURED = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}  # differ between identical runs


@pytest.fixture
def one_thread():
    """In-process runs with one thread, as run_script gives subprocesses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def skewed_stack(num_clients=10, dim=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 1 + 0.3 * torch.randn(num_clients, dim, generator=g)
    x[0, : dim // 2] += 20  # one client far away on half the parameters
    return x, torch.randint(10, 100, (num_clients,), generator=g).tolist()


def read_rows(folder, drop=()):
    return [{k: v for k, v in row.items() if k not in drop} for row in metrics_rows(folder)]


# ----------------------------------------------------------------------------- 1. parameter division, FedAvg limit

def test_kappa_inf_is_exactly_weighted_average():
    x, w = skewed_stack()
    stats = {}
    chunked = lambda *a, **k: fedpake.fedpake_aggregate_chunked(*a, **k, chunk_elems=256)  # noqa: E731
    for aggregate in (fedpake.fedpake_aggregate, chunked):
        out = aggregate(x, w, kappa=math.inf, stats=stats)
        assert torch.equal(out, common.weighted_average(x, w))
        assert stats == {"high_fraction": 0.0, "macro_classes": 0}


@pytest.mark.parametrize("kappa", [0.2, 0.0])
def test_identical_clients_give_the_common_value(kappa):
    row = torch.linspace(-3, 3, 101)
    out = fedpake.fedpake_aggregate(row.repeat(6, 1), [5, 1, 7, 2, 2, 9], kappa=kappa)
    assert torch.allclose(out, row, rtol=1e-6, atol=1e-7)


def test_division_matches_independent_cv_and_low_part_is_fedavg():
    x, w = skewed_stack(seed=1)
    x[:, -50:] = 5 + 0.01 * x[:, -50:]  # clearly low dispersion
    xs = x.double().numpy()
    cv = xs.std(0, ddof=0) / (np.abs(xs.mean(0)) + 1e-12)
    high = fedpake.parameter_division(x, 0.2)
    assert np.array_equal(high.numpy(), cv > 0.2) and 0 < high.sum() < x.shape[1]
    stats = {}
    out = fedpake.fedpake_aggregate(x, w, kappa=0.2, stats=stats)
    fedavg = common.weighted_average(x, w)
    assert torch.equal(out[~high], fedavg[~high])  # Eq. (10)
    assert not torch.allclose(out[high], fedavg[high])
    assert stats["high_fraction"] == pytest.approx(high.float().mean().item())


def test_the_aggregation_is_a_short_driver_over_its_stages_at_the_top_level():
    """Each stage a top-level function a reader finds and a test calls; the one-pass driver's body is about ten
    statements over the stages, one pass (no loop: no chunks) and holds no function (no test hook, no nested
    stage)."""
    import ast
    tree = ast.parse(open(fedpake.__file__).read())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    driver = functions["fedpake_aggregate"]
    body = driver.body[1:]  # after the docstring
    assert body[-1].end_lineno - body[0].lineno + 1 <= 15
    assert not [node for node in ast.walk(driver) if isinstance(node, (ast.FunctionDef, ast.For, ast.While,
                                                                       ast.comprehension)) and node is not driver]
    called = {n.func.id for n in ast.walk(driver) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"parameter_division", "micro_classes", "micro_class_disagreements", "cluster_macro_classes",
            "macro_class_members", "tendency_weights", "random_micro_classes", "random_macro_classes"} <= called
    assert {"parameter_division", "micro_classes", "micro_class_disagreements", "cluster_macro_classes", "tendency",
            "macro_class_members", "tendency_weights"} <= set(functions)
    assert not [node for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "values"]


def draws(ablate, seed=5):
    """The CPU generators of --ablate's random classes, fresh, as fedpake.py's server_update makes them."""
    return {f"random_{kind}": torch.Generator().manual_seed(seed + tag)
            for kind, tag in (("micro", 0), ("macro", 1)) if kind in ablate}


@pytest.mark.parametrize("ablate", [(), ("micro",), ("macro",), ("micro", "macro")])
def test_the_chunked_form_equals_the_one_pass_form(ablate):
    """fedpake_aggregate_chunked, which fedpake.py runs where the one-pass form does not fit: the one-pass result for
    any chunk size, with the same H, Micro-Classes (random ones too, drawn column by column), Macro-Classes and
    statistics. Bit for bit with the whole stack in one chunk; with many, the columns' sums over clients (torch's
    sum over a (K x h) block) round in the last bits by h, so there to float32 rounding."""
    x, w = skewed_stack(num_clients=9, dim=400, seed=9)
    x[:, 320:] = 2 + 0.001 * x[:, 320:]  # chunks without a column of H
    stats_one = {}
    one = fedpake.fedpake_aggregate(x, w, stats=stats_one, **draws(ablate))
    for chunk_elems in (x.numel(), 9 * 37, 9 * 330, 5):
        stats = {}
        chunked = fedpake.fedpake_aggregate_chunked(x, w, chunk_elems=chunk_elems, stats=stats, **draws(ablate))
        assert stats == stats_one and 0 < stats["high_fraction"] < 1
        assert torch.equal(chunked, one) if chunk_elems == x.numel() else \
            torch.allclose(chunked, one, rtol=1e-6, atol=1e-7)
    changed = fedpake.fedpake_aggregate(x, w, **draws(ablate, seed=6))  # the draws do count
    assert torch.equal(changed, one) == (ablate == ())


def record_calls(monkeypatch):
    """[(name, keyword arguments)] of the calls of fedpake_aggregate and fedpake_aggregate_chunked, which still run."""
    called = []
    for name in ("fedpake_aggregate", "fedpake_aggregate_chunked"):
        real = getattr(fedpake, name)
        monkeypatch.setattr(fedpake, name, lambda *a, real=real, name=name, **k: called.append((name, k)) or
                            real(*a, **k))
    return called


def free_memory(monkeypatch, *free):
    """datasets.memory_available as fedpake.py reads it, giving ``free`` (bytes; None: unknown) in turn, the last one
    from then on. Returns the list of devices it was asked about."""
    asked = []
    monkeypatch.setattr(fedpake.datasets, "memory_available",
                        lambda device="cpu": asked.append(device) or free[min(len(asked), len(free)) - 1])
    return asked


def test_fedpake_py_runs_the_one_pass_form_on_a_cnn_sized_stack(monkeypatch):
    """With its memory free, auto is the readable fedpake_aggregate for the 4-layer CNN (Fashion-MNIST: 582,026
    values a client, two clients: above 2^20 values), and server_update runs it: its result, bit for bit."""
    data = type("Data", (), {"x": torch.zeros(1, 1, 28, 28), "num_classes": 10})
    model = common.build_model("cnn", data)
    x, w = skewed_stack(num_clients=2, dim=common.flatten_state(model).numel())
    assert x.numel() > 2 ** 20
    free_memory(monkeypatch, 2 ** 40)
    args = fedpake.parse_args(["--dataset", "synthetic", "--num-clients", "2"])
    form = fedpake.aggregation_form(args, model, "cpu")
    called = record_calls(monkeypatch)
    new_global, _ = fedpake.server_update(x, w, args, 3, form)
    assert form == "one-pass" and [name for name, _ in called] == ["fedpake_aggregate"]
    assert torch.equal(new_global, fedpake.fedpake_aggregate(x, w))


@pytest.mark.parametrize("ablate", [(), ("micro",), ("micro", "macro")])
def test_fedpake_py_chunks_only_where_the_one_pass_form_does_not_fit(ablate, monkeypatch):
    """auto by the memory free at the start (monkeypatched): chunked only below a round's K x D stack of the model
    plus one_pass_peak_bytes beyond it (K = round(join ratio x clients)); and the seeds server_update draws the
    ablations from: one generator each, independent."""
    args = fedpake.parse_args(["--dataset", "synthetic", "--num-clients", "20", "--join-ratio", "0.8",
                               *(["--ablate", *ablate] if ablate else [])])
    model, x, w = torch.nn.Linear(29, 10), *skewed_stack(num_clients=16, dim=300)
    need = 16 * 300 * 4 + fedpake.one_pass_peak_bytes(16, 300, 4, args.n_micro)  # D = 29 x 10 + 10 = 300
    called = record_calls(monkeypatch)
    for free, form, function in ((need, "one-pass", "fedpake_aggregate"), (None, "one-pass", "fedpake_aggregate"),
                                 (need - 1, "chunked", "fedpake_aggregate_chunked")):  # None: cannot be read
        asked = free_memory(monkeypatch, free)
        assert fedpake.aggregation_form(args, model, "cpu") == form and asked == ["cpu"]
        called.clear()
        fedpake.server_update(x, w, args, 3, form)
        assert [name for name, _ in called] == [function]
    generators = {k: v for k, v in called[0][1].items() if k.startswith("random_") and v is not None}
    assert set(generators) == {f"random_{kind}" for kind in ablate}
    seeds = [g.initial_seed() for g in generators.values()]
    assert len(set(seeds)) == len(seeds)  # two seeds, not one feeding both


def test_aggregation_one_pass_or_chunked_is_the_form_whatever_the_memory(monkeypatch):
    model = torch.nn.Linear(4, 10)
    for free in (0, 2 ** 40):
        asked = free_memory(monkeypatch, free)
        for form in ("one-pass", "chunked", "auto"):
            args = fedpake.parse_args(["--dataset", "synthetic", "--aggregation", form])
            expected = form if form != "auto" else ("one-pass" if free else "chunked")
            assert fedpake.aggregation_form(args, model, "cpu") == expected
        assert len(asked) == 1  # auto only: a given form reads no memory


def test_the_form_is_decided_once_at_the_start_printed_and_recorded(tmp_path, one_thread, monkeypatch, capsys):
    """auto is decided once, before config.json is written, on the run's device: with the memory free flipping after
    the first reading, every round runs the first decision; config.json's args record it (not auto), and so does the
    start-up line."""
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "3"]
    for first, then, form, function in ((2 ** 40, 0, "one-pass", "fedpake_aggregate"),
                                        (0, 2 ** 40, "chunked", "fedpake_aggregate_chunked")):
        asked, called = free_memory(monkeypatch, first, then), record_calls(monkeypatch)
        fedpake.main([*flags, "--out", str(tmp_path / form)])
        assert asked == [torch.device("cpu")] and [name for name, _ in called] == [function] * 3
        with open(os.path.join(run_dir(tmp_path / form), "config.json")) as f:
            assert json.load(f)["args"]["aggregation"] == form
        assert f"; aggregation {form}\n" in capsys.readouterr().out


PEAK = """
import sys, torch, fedpake
def status(key):  # kB of this process: VmRSS now, VmHWM the peak since the last reset
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
torch.manual_seed(0)
x = 1 + 0.3 * torch.randn(int(sys.argv[1]), int(sys.argv[2]))
x[:, ::2] *= -1  # means near zero everywhere: every column in H, the largest case
fedpake.fedpake_aggregate(x[:, :1000], [1] * len(x), kappa=0.0)  # the code's pages: resident before the count
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS (Linux)
before, stats = status("VmRSS"), {}
fedpake.fedpake_aggregate(x, torch.arange(1, len(x) + 1).tolist(), kappa=0.0, stats=stats)
assert stats["high_fraction"] == 1
print(status("VmHWM") - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak by Linux's /proc")
@pytest.mark.parametrize("num_clients", [2, 50])
def test_the_memory_estimate_bounds_the_one_pass_peak(num_clients):
    """one_pass_peak_bytes bounds from above what fedpake_aggregate takes beyond its stack (the peak resident
    memory of a fresh process, reset before the call), within 2.5 times: a bound too low would run it where it
    does not fit, one too high would chunk where it fits."""
    dim = 2_000_000 // num_clients
    done = subprocess.run([sys.executable, "-c", PEAK, str(num_clients), str(dim)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    peak, need = int(done.stdout), fedpake.one_pass_peak_bytes(num_clients, dim, 4, 4)
    assert 0.4 * need < peak <= need, (peak, need)


def test_kappa_inf_end_to_end_equals_fedavg(tmp_path, one_thread):
    flags = ["--dataset", "synthetic", "--model", "mlp", "--rounds", "2", "--num-clients", "6", "--seed", "3"]
    fedavg.main([*flags, "--out", str(tmp_path / "avg")])
    fedpake.main([*flags, "--kappa", "inf", "--out", str(tmp_path / "pake")])
    avg, pake = read_rows(run_dir(tmp_path / "avg"), MEASURED), read_rows(run_dir(tmp_path / "pake"), MEASURED)
    assert len(avg) == len(pake) == 2
    for ra, rp in zip(avg, pake):
        assert ra == {k: rp[k] for k in ra}
        assert float(rp["high_fraction"]) == 0 and int(rp["macro_classes"]) == 0


# ----------------------------------------------------------------------------- 2. Micro-Class, Eq. (6)-(7)

def test_micro_classes_hand_example():
    values = torch.tensor([0.0, 0.24, 0.25, 0.5, 0.99, 1.0])[:, None]
    assert fedpake.micro_classes(values, 4).flatten().tolist() == [0, 0, 1, 2, 3, 3]


def test_micro_classes_properties():
    x = torch.randn(13, 500, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 3, 500)
    for n in (1, 4, 8):
        mic = fedpake.micro_classes(x, n)
        assert mic.dtype == torch.uint8 and mic.min() >= 0 and mic.max() <= n - 1
        order = x.argsort(0)
        assert (mic.gather(0, order).diff(dim=0) >= 0).all()  # order preserving
        assert (mic.gather(0, x.argmax(0, keepdim=True)) == n - 1).all()  # the maximum in the last class
        assert (mic.gather(0, x.argmin(0, keepdim=True)) == 0).all()
        xs = x.double().numpy()
        lo, hi = xs.min(0), xs.max(0)
        independent = np.minimum(np.floor((xs - lo) / (hi - lo) * n), n - 1)
        assert np.array_equal(mic.numpy(), independent)


# ----------------------------------------------------------------------------- 3. Macro-Class, Eq. (8)

def test_disagreements_match_pairwise_count():
    mic = torch.randint(5, (7, 333), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    brute = (mic[:, None, :] != mic[None, :, :]).sum(-1).double()
    assert torch.equal(fedpake.micro_class_disagreements(mic, 5), brute)


HAND = torch.tensor([[0, 1, 6, 7, 9],  # disagreements out of |H| = 10
                     [1, 0, 5, 6, 8],
                     [6, 5, 0, 2, 9],
                     [7, 6, 2, 0, 10],
                     [9, 8, 9, 10, 0]], dtype=torch.float64)


@pytest.mark.parametrize("n_macro, delta, expected", [
    (4, 0.2, [0, 0, 1, 1, 2]),   # merges 0.1 and 0.2 (= delta); next is 0.6 > delta and 3 <= 4 clusters
    (4, 0.15, [0, 0, 1, 2, 3]),  # 0.2 > delta
    (4, 0.0, [0, 0, 1, 2, 3]),   # nothing <= delta, but 5 > 4 clusters forces one merge
    (2, 0.2, [0, 0, 0, 0, 1]),   # then {0,1}-{2,3} at (6+7+5+6)/4/10 = 0.6
    (1, 0.2, [0, 0, 0, 0, 0]),
])
def test_macro_classes_hand_example(n_macro, delta, expected):
    assert fedpake.cluster_macro_classes(HAND, 10, n_macro, delta).tolist() == expected


def test_macro_classes_use_average_linkage():
    d = torch.tensor([[0, 1, 2, 4], [1, 0, 9, 4], [2, 9, 0, 8], [4, 4, 8, 0]], dtype=torch.float64)
    # after {0,1}: to {2} average 5.5 (single linkage 2), to {3} average 4 -> {0,1,3}
    assert fedpake.cluster_macro_classes(d, 10, 2, 0.0).tolist() == [0, 0, 1, 0]


def test_macro_classes_never_exceed_n_macro_and_stop_above_delta():
    g = torch.Generator().manual_seed(4)
    for trial in range(20):
        k = int(torch.randint(2, 12, (1,), generator=g))
        d = torch.randint(0, 50, (k, k), generator=g).double()
        d = (d + d.T).fill_diagonal_(0)
        n_macro, delta = int(torch.randint(1, 5, (1,), generator=g)), 0.3
        labels = fedpake.cluster_macro_classes(d, 100, n_macro, delta)
        num = int(labels.max()) + 1
        assert num <= n_macro and sorted(set(labels.tolist())) == list(range(num))
        members = torch.nn.functional.one_hot(labels).double()
        linkage = members.T @ d @ members / (torch.outer(members.sum(0), members.sum(0)) * 100)
        off = linkage[~torch.eye(num, dtype=torch.bool)]
        assert num == 1 or (off > delta).all()  # it stops only when no pair is <= delta


# ----------------------------------------------------------------------------- 4. tendency (Eq. 9), weights (Eq. 11)

@pytest.mark.parametrize("column, mode", [
    ([0, 0, 1, 3], 0),
    ([0, 0, 2, 2, 3], 2),     # modes 0 and 2, median 2
    ([0, 0, 1, 3, 3], 0),     # modes 0 and 3, median 1
    ([0, 0, 3, 3], 0),        # median 1.5: equally near, the lower class
    ([1, 3, 3, 1, 2], 1),     # median 2: equally near, the lower class
    ([2], 2),
])
def test_tendency_hand_examples(column, mode):
    assert fedpake.tendency(torch.tensor(column, dtype=torch.uint8)[:, None], 4).item() == mode


def test_tendency_matches_counter_with_median_tie_rule():
    g = torch.Generator().manual_seed(5)
    for size in (1, 2, 3, 6, 7):
        mic = torch.randint(5, (size, 400), generator=g, dtype=torch.uint8)
        got = fedpake.tendency(mic, 5).tolist()
        for j, column in enumerate(mic.T.tolist()):
            counts = Counter(column)
            modes = [m for m in counts if counts[m] == max(counts.values())]
            median = statistics.median(column)
            assert got[j] == min(modes, key=lambda m: (abs(m - median), m))


def test_tendency_weights_sum_to_one_and_count_every_client_once():
    g = torch.Generator().manual_seed(6)
    mic = torch.randint(4, (9, 300), generator=g, dtype=torch.uint8)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 1])
    sizes = torch.tensor([5., 1., 8., 3., 3., 2., 9., 4., 6.])
    w = fedpake.tendency_weights(mic, fedpake.macro_class_members(labels, mic.device), sizes, 4)
    assert torch.allclose(w.sum(0), torch.ones(300))
    for c in range(3):
        rows = labels == c
        share = sizes[rows].sum() / sizes.sum()
        assert torch.allclose(w[rows].sum(0), share.expand(300))  # N_c / N, each client in one class
        matching = mic[rows] == fedpake.tendency(mic[rows], 4)
        assert (w[rows][~matching] == 0).all() and (w[rows][matching] > 0).all()
        ratio = w[rows] / sizes[rows, None]  # the same per-sample weight among the matching clients
        assert torch.allclose(ratio.max(0).values, torch.where(matching, ratio, 0).sum(0) / matching.sum(0))


def test_aggregation_hand_example():
    # one parameter; bins of width 2 over [1, 9]: classes 0, 0, 0, 3; one Macro-Class; mode 0
    x = torch.tensor([[1.0], [1.2], [1.4], [9.0]])
    out = fedpake.fedpake_aggregate(x, [1, 2, 1, 4], n_micro=4, n_macro=1)
    assert out.item() == pytest.approx((1 * 1.0 + 2 * 1.2 + 1 * 1.4) / 4)  # FedAvg: 5.1


# ----------------------------------------------------------------------------- 5. parameter skew

def test_skew_nine_near_one_and_one_at_ten():
    # each parameter: nine clients near 1.0, one at 10.0, the outlier a different client per parameter
    g = torch.Generator().manual_seed(7)
    x = 1 + 0.01 * torch.randn(10, 100, generator=g)
    x[torch.arange(100) % 10, torch.arange(100)] = 10.0
    stats = {}
    out = fedpake.fedpake_aggregate(x, [1] * 10, stats=stats)
    assert torch.allclose(common.weighted_average(x, [1] * 10), torch.full((100,), 1.9), atol=0.01)
    assert torch.allclose(out, torch.ones(100), atol=0.01)
    assert stats == {"high_fraction": 1.0, "macro_classes": 1}  # pairwise dissimilarity 0.2 <= delta


# ----------------------------------------------------------------------------- 6. ablations (Table 4)

@pytest.mark.parametrize("ablate", [("micro",), ("macro",)])
def test_ablations_change_the_result_and_are_reproducible(ablate):
    x, w = skewed_stack(num_clients=12, dim=2000, seed=8)
    plain = fedpake.fedpake_aggregate(x, w)
    a = fedpake.fedpake_aggregate(x, w, **draws(ablate, seed=11))
    b = fedpake.fedpake_aggregate(x, w, **draws(ablate, seed=11))
    c = fedpake.fedpake_aggregate(x, w, **draws(ablate, seed=12))
    assert torch.equal(a, b)
    assert not torch.allclose(a, plain) and not torch.allclose(a, c)


def test_both_ablated_matches_an_independent_computation_of_eq_11_on_random_classes():
    """Table 4's row without Micro- and Macro-Classes: H by Eq. (2)-(5) (the CV computed here in
    numpy), random Micro-Classes (uniform in [0, n_micro), column by column) and random Macro-Classes
    (uniform in [0, n_macro), empty ones dropped), each from its own generator, then Eq. (9)/(11)
    computed column by column in plain Python; L is FedAvg."""
    x, w = skewed_stack(num_clients=9, dim=150, seed=3)
    both = fedpake.fedpake_aggregate(x, w, n_micro=4, n_macro=3, **draws(("micro", "macro")))
    values, sizes = x.double().numpy(), np.array(w, dtype=float)
    cv = values.std(0) / (np.abs(values.mean(0)) + 1e-12)
    high = np.flatnonzero(cv > 0.2)
    assert 0 < len(high) < x.shape[1]
    mic = torch.randint(4, (len(high), 9), generator=torch.Generator().manual_seed(5), dtype=torch.uint8).T.numpy()
    draw = torch.randint(3, (9,), generator=torch.Generator().manual_seed(6)).tolist()
    classes = [[k for k in range(9) if draw[k] == c] for c in sorted(set(draw))]
    expected = sizes @ values / sizes.sum()
    for i, j in enumerate(high):
        total = 0.0
        for members in classes:
            column = [int(mic[k, i]) for k in members]
            counts = Counter(column)
            modes = [m for m in counts if counts[m] == max(counts.values())]
            mode = min(modes, key=lambda m: (abs(m - statistics.median(column)), m))  # Eq. (9)
            matching = [k for k in members if mic[k, i] == mode]
            mean = sum(sizes[k] * values[k, j] for k in matching) / sum(sizes[k] for k in matching)
            total += mean * sum(sizes[k] for k in members) / sizes.sum()  # Eq. (11)
        expected[j] = total
    assert np.allclose(both.double().numpy(), expected, atol=1e-5)
    for one in ("micro", "macro"):
        assert not torch.allclose(both, fedpake.fedpake_aggregate(x, w, n_micro=4, n_macro=3, **draws((one,))))


def test_ablate_takes_micro_macro_or_both():
    parse = lambda *flags: fedpake.parse_args(["--dataset", "synthetic", *flags]).ablate
    assert (parse(), parse("--ablate", "micro"), parse("--ablate", "micro", "macro")) == \
        (None, ["micro"], ["micro", "macro"])
    with pytest.raises(common.UserError, match="--ablate"):  # one line, exit status 2
        parse("--ablate", "micro", "meso")


def test_both_ablations_draw_from_two_independent_generators_on_the_cpu(monkeypatch):
    """--ablate micro macro with n_micro = n_macro: the Macro-Class draw is not client 0's first
    Micro-Classes (one seed feeding both made it so), and every draw comes from a CPU generator (a
    CUDA one's stream differs from the CPU's for the same seed), the same classes on every device."""
    real_generator, made, drawn = torch.Generator, [], {}
    monkeypatch.setattr(torch, "Generator", lambda *a, **k: made.append((a, k)) or real_generator(*a, **k))
    for name in ("random_micro_classes", "random_macro_classes"):
        real = getattr(fedpake, name)
        monkeypatch.setattr(fedpake, name, lambda *a, real=real, name=name: drawn.setdefault(name, real(*a)))
    args = fedpake.parse_args(["--dataset", "synthetic", "--ablate", "micro", "macro", "--n-micro", "4"])
    x, w = skewed_stack(num_clients=20, dim=500, seed=8)
    fedpake.server_update(x, w, args, 1, "one-pass")
    monkeypatch.undo()
    assert made and all(m == ((), {}) for m in made)  # no device given: CPU generators
    micro, macro = drawn["random_micro_classes"], drawn["random_macro_classes"]
    assert micro.shape == (20, micro.shape[1]) and len(macro) == 20 and args.n_macro == 4
    same_seed = torch.randint(4, (20,), generator=real_generator().manual_seed(
        common.client_seed(args.seed, 1, 0, fedpake.MICRO_TAG)))
    assert torch.equal(micro[:, 0].long(), same_seed)  # what one seed for both would have given the Macro-Classes
    assert not torch.equal(torch.unique(same_seed, return_inverse=True)[1], macro)


# ----------------------------------------------------------------------------- 7. the script

def test_bad_flags_are_user_errors():
    for flags in (["--kappa", "-1"], ["--n-micro", "0"], ["--n-macro", "0"], ["--delta", "-0.1"]):
        with pytest.raises(common.UserError):
            fedpake.parse_args(["--dataset", "synthetic", *flags])
    args = fedpake.parse_args(["--dataset", "cifar100"])
    assert (args.n_micro, args.n_macro, args.rounds, args.model) == (5, 5, 1000, "auto")


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_quick_start_runs_on_cpu_in_under_a_minute(tmp_path):
    start = time.perf_counter()
    result = run_script("fedpake.py", "--dataset", "synthetic", "--rounds", 20, "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - start < 60
    folder = run_dir(tmp_path)
    rows = read_rows(folder)
    assert len(rows) == 20 and {"high_fraction", "macro_classes", "agg_seconds"} <= set(rows[0])
    assert all(0 <= float(r["high_fraction"]) <= 1 and 1 <= int(r["macro_classes"]) <= 4 for r in rows)
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    assert "last10_mean" in summary["paper_reports"]
    assert summary["test_acc"]["last10_mean"] == pytest.approx(np.mean([float(r["test_acc"]) for r in rows[-10:]]))


def test_resume_gives_the_uninterrupted_result(tmp_path, one_thread):
    flags = ["--dataset", "synthetic", "--num-clients", "8", "--rounds", "6", "--checkpoint-every", "3"]
    fedpake.main([*flags, "--out", str(tmp_path / "whole")])
    with pytest.raises(SystemExit) as stopped:
        fedpake.main([*flags, "--stop-after", "3", "--out", str(tmp_path / "parts")])
    assert stopped.value.code == 0 and len(read_rows(run_dir(tmp_path / "parts"))) == 3
    fedpake.main(["--resume", run_dir(tmp_path / "parts")])
    assert read_rows(run_dir(tmp_path / "parts"), MEASURED) == read_rows(run_dir(tmp_path / "whole"), MEASURED)


def test_last10_mean_is_over_the_last_10_rounds_whatever_eval_every(tmp_path):
    """Sec. 4.1 reports "the average testing accuracy of the global model over the last 10
    rounds": with --eval-every 5 every one of the last 10 rounds is still evaluated."""
    from conftest import metrics_rows, run_dir, run_in_process
    assert run_in_process("fedpake.py", "--dataset", "synthetic", "--num-clients", 4, "--rounds", 17,
                          "--eval-every", 5, "--model", "mlp", "--out", tmp_path) == 0
    rows = metrics_rows(run_dir(tmp_path))
    assert [int(r["round"]) for r in rows] == [5, *range(8, 18)]
    summary = json.load(open(os.path.join(run_dir(tmp_path), "summary.json")))
    last10 = [float(r["test_acc"]) for r in rows[-10:]]
    assert summary["test_acc"]["last10_mean"] == pytest.approx(sum(last10) / 10, abs=1e-6)


@pytest.mark.parametrize("made", ["recorded", "recorded-auto"])
def test_a_run_resumes_with_the_aggregation_form_it_ran(made, tmp_path, one_thread, monkeypatch):
    """--stop-after then --resume equals the whole run, in the form the run records whatever the memory free now
    (the memory reads chunked at the start, one-pass from then on); --aggregation auto given with --resume is refused
    in one line, not ignored. A run whose config.json and checkpoint say auto (made before the form was decided at
    the start) resumes with the form decided when it resumes, its record unchanged."""
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "3", "--checkpoint-every", "1"]
    free_memory(monkeypatch, 0, 2 ** 40)
    fedpake.main([*flags, "--out", str(tmp_path / "whole")])
    free_memory(monkeypatch, 0, 2 ** 40)
    with pytest.raises(SystemExit):
        fedpake.main([*flags, "--stop-after", "1", "--out", str(tmp_path / "parts")])
    folder = run_dir(tmp_path / "parts")
    config_path, checkpoint_path = os.path.join(folder, "config.json"), os.path.join(folder, "checkpoint.pt")
    assert json.load(open(config_path))["args"]["aggregation"] == "chunked"
    if made == "recorded":
        with pytest.raises(common.UserError, match="cannot resume with other settings: --aggregation chunked"):
            fedpake.main(["--resume", folder, "--aggregation", "auto"])
    else:
        config, blob = json.load(open(config_path)), torch.load(checkpoint_path, weights_only=False)
        config["args"]["aggregation"] = blob["args"]["aggregation"] = "auto"
        json.dump(config, open(config_path, "w"))
        torch.save(blob, checkpoint_path)
    called = record_calls(monkeypatch)
    free_memory(monkeypatch, 2 ** 40, 0)  # one-pass now, for the run that records auto
    fedpake.main(["--resume", folder])
    expected = {"recorded": "fedpake_aggregate_chunked", "recorded-auto": "fedpake_aggregate"}[made]
    assert [name for name, _ in called] == [expected] * 2  # synthetic: one chunk, bit for bit the one-pass form
    assert read_rows(folder, MEASURED) == read_rows(run_dir(tmp_path / "whole"), MEASURED)
    assert json.load(open(config_path))["args"]["aggregation"] == {"recorded": "chunked", "recorded-auto": "auto"}[made]
