"""Clients together: K clients' local SGD in one vmap'd step, against the loop (run by hand;
pytest runs a tiny case of it in tests/test_bench_gpu.py).

    python tests/bench_vmap.py                      # 20 clients, 4-layer CNN, batch 10, 25 steps each
    python tests/bench_vmap.py --ragged             # clients of different sizes (fewer steps, partial batches)
    python tests/bench_vmap.py --device cuda        # the same on a GPU
    python tests/bench_vmap.py --threads 2          # both paths on two torch threads (default one)
    python tests/bench_vmap.py --count-ops          # operators (kernel launches on a GPU) per stacked step

(i) the loop: one client after another, each exactly as the scripts train it,
``common.local_train`` (torch.optim.SGD, cross-entropy, ``common.epoch_batches``' batch
order) on one reused model loaded with the start state. (ii) together: the K clients'
parameters stacked (K, ...), one step for all of them at once,
``vmap(grad(loss))(params, x, y, weights)`` with ``functional_call`` on the same model, then
``p -= lr * g`` in place on the stacked parameters (one ``add_`` per parameter). Step s of client k
uses the same indices as the loop's step s (the clients' batch lists are stacked; a shorter
batch is padded with weight-0 samples). With clients of different sizes (``--ragged``) the
clients are sorted by their number of steps, so those still training at step s are the first
k_s rows of the stack, and a stacked step computes and updates only those.

Both start from the same state. The script times both, alternately (A, B, A, B, ...) in one
process after a warm-up, and reports the largest absolute difference between the two results
in float32 and, run again, in float64: the same computation agrees to float64 rounding there,
while in float32 the sums run in another order (vmap turns a convolution over K clients into
one grouped convolution), and a rounding difference that flips a max-pool or ReLU decision
changes one gradient term outright, so float32 differences can exceed a few ulps.
"""
import argparse
import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402


def make_clients(k, steps, batch_size, ragged, device, seed=0):
    """CIFAR-shaped random images (normalised floats, channels-last as the scripts keep them) and
    per client an index tensor: ``steps * batch_size`` samples each, or with ``ragged`` between
    a third of that and all of it, with sizes that leave partial last batches."""
    g = torch.Generator().manual_seed(seed)
    sizes = [steps * batch_size] * k
    if ragged:
        sizes = [int(s) for s in torch.randint(steps * batch_size // 3, steps * batch_size + 1, (k,), generator=g)]
        sizes[0] = steps * batch_size  # the longest client sets the number of stacked steps
    n = sum(sizes)
    x = torch.randn(n, 3, 32, 32, generator=g).to(device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    starts = np.cumsum([0] + sizes)
    idx = [torch.arange(starts[c], starts[c + 1], device=device) for c in range(k)]
    return SimpleNamespace(x=x, y=y, num_classes=10, info={}), idx


def loop(model, start, data, idx, args, seeds):
    """The scripts' way: each client from ``start`` with common.local_train; (K, D) results."""
    out = torch.empty(len(idx), start.numel(), dtype=start.dtype, device=start.device)
    for c, (client_idx, seed) in enumerate(zip(idx, seeds)):
        common.load_flat_state(model, start)
        common.local_train(model, data, client_idx, args, seed)
        out[c] = common.flatten_state(model)
    return out


def stacked_batches(idx, args, seeds):
    """The loop's batches, stacked: (S, K, B) indices, (S, K, B) sample weights (0: padding) and
    (S, K) active steps, where S is the most steps of any client and B the largest batch."""
    per_client = [list(common.epoch_batches(i, args.batch_size, args.local_epochs, s)) for i, s in zip(idx, seeds)]
    steps = max(len(b) for b in per_client)
    width = max(len(batch) for b in per_client for batch in b)
    device = idx[0].device
    index = torch.zeros(steps, len(idx), width, dtype=torch.long, device=device)
    weight = torch.zeros(steps, len(idx), width, device=device)
    for c, batches in enumerate(per_client):
        for s, batch in enumerate(batches):
            index[s, c, :len(batch)] = batch
            weight[s, c, :len(batch)] = 1
    return index, weight, weight.sum(2) > 0


def together(model, start, data, idx, args, seeds):
    """All clients at once: vmap over the stacked parameters; plain SGD in place on them. The
    clients are sorted by their number of steps (most first), so the clients still training at
    step s are the first k_s rows of the stack: a stacked step computes and updates those only."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    # the start state as K stacked copies, in named_parameters order (= the flat state's order
    # for models without buffers, which is what this prototype covers)
    pieces = start.split([int(np.prod(s)) for s in shapes])
    params = [piece.view(s).expand(len(idx), *s).clone() for piece, s in zip(pieces, shapes)]

    def loss(p, x, y, w):  # the mean cross-entropy of the real samples of one client's batch
        per_sample = F.cross_entropy(functional_call(model, dict(zip(names, p)), (x,)), y, reduction="none")
        return (per_sample * w).sum() / w.sum()

    step_grads = vmap(grad(loss))
    index, weight, active = stacked_batches(idx, args, seeds)
    order = torch.argsort(active.sum(0), descending=True, stable=True).to(index.device)  # most steps first
    index, weight = index[:, order], weight[:, order]
    training = active.sum(1).tolist()  # k_s: how many clients train at step s, the first k_s after sorting
    model.train()
    for s, k in enumerate(training):
        x, y = data.x[index[s, :k]], data.y[index[s, :k]]  # (k, B, 3, 32, 32), (k, B): one gather
        rows = [p[:k] for p in params]
        for p, g in zip(rows, step_grads(rows, x, y, weight[s, :k])):
            p.add_(g, alpha=-args.lr)
    result = torch.cat([p.reshape(len(idx), -1) for p in params], 1)
    return result[torch.argsort(order)]  # back to the clients' order


def timed(fn, device):
    """(wall seconds, this process's CPU seconds, fn()): on a shared VM the CPU seconds of a
    one-thread run vary much less than the wall time, which includes waiting for a core."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu, result


def setup(clients, steps, batch_size, model_name, ragged, device, lr, dtype):
    """The data, model, start state, args and per-client seeds of one comparison, in ``dtype``."""
    torch.manual_seed(0)
    data, idx = make_clients(clients, steps, batch_size, ragged, device)
    model = common.build_model(model_name, data).to(device, dtype)
    if any(True for _ in model.buffers()):
        raise SystemExit(f"error: --model {model_name} has buffers (BatchNorm); this prototype stacks parameters only")
    data.x = data.x.to(dtype)
    start = common.flatten_state(model).clone()
    args = SimpleNamespace(batch_size=batch_size, lr=lr, momentum=0.0, weight_decay=0.0, local_epochs=1)
    seeds = [common.client_seed(0, 1, c) for c in range(clients)]
    return model, start, data, idx, args, seeds


def run(clients=20, steps=25, batch_size=10, model_name="cnn", ragged=False, repeats=3, device="cpu", lr=0.005,
        quiet=False):
    """Times both paths alternately in float32 after a warm-up, then checks them against each
    other in float32 and float64. Returns {"float32": max |loop - together|, "float64": the same,
    "loop_vs_float64": max |float32 loop - float64 loop| (the scale of float32 rounding),
    "change": largest |result - start|, "loop", "together": wall seconds per repeat,
    "loop_cpu", "together_cpu": this process's CPU seconds per repeat}."""
    device = torch.device(device)
    model, start, data, idx, args, seeds = setup(clients, steps, batch_size, model_name, ragged, device, lr,
                                                   torch.float32)
    warm = min(2, clients)
    loop(model, start, data, idx[:warm], args, seeds[:warm])  # first calls set up kernels (oneDNN, cuDNN)
    together(model, start, data, idx[:warm], args, seeds[:warm])
    out = {"loop": [], "together": [], "loop_cpu": [], "together_cpu": []}
    for r in range(repeats):
        t_loop, c_loop, a = timed(lambda: loop(model, start, data, idx, args, seeds), device)
        t_tog, c_tog, b = timed(lambda: together(model, start, data, idx, args, seeds), device)
        out["loop"].append(t_loop)
        out["together"].append(t_tog)
        out["loop_cpu"].append(c_loop)
        out["together_cpu"].append(c_tog)
        out["float32"], out["change"] = float((a - b).abs().max()), float((a - start).abs().max())
        if not quiet:
            print(f"repeat {r + 1}: loop {t_loop:.3f} s (CPU {c_loop:.3f} s), together {t_tog:.3f} s "
                  f"(CPU {c_tog:.3f} s)", flush=True)
    m64, s64, d64, i64, args64, seeds64 = setup(clients, steps, batch_size, model_name, ragged, device, lr,
                                                  torch.float64)
    a64 = loop(m64, s64, d64, i64, args64, seeds64)
    out["float64"] = float((a64 - together(m64, s64, d64, i64, args64, seeds64)).abs().max())
    out["loop_vs_float64"] = float((a.double() - a64).abs().max())
    return out


def ops_per_stacked_step(clients, batch_size=10, model_name="cnn"):
    """aten operators that do work (tests/step_cost.py's count) per stacked step of ``together``,
    from the difference between 4 and 2 steps, less the building of the stacked batch indices."""
    from step_cost import CountOps
    counts = {}
    for steps in (2, 4):
        model, start, data, idx, args, seeds = setup(clients, steps, batch_size, model_name, False,
                                                       torch.device("cpu"), 0.005, torch.float32)
        together(model, start, data, idx, args, seeds)
        with CountOps() as everything:
            together(model, start, data, idx, args, seeds)
        with CountOps() as batches:
            stacked_batches(idx, args, seeds)
        counts[steps] = sum(everything.ops.values()) - sum(batches.ops.values())
    return (counts[4] - counts[2]) / 2


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--steps", type=int, default=25, help="local SGD steps of the longest client")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--model", default="cnn", help="a model of common.py without buffers: cnn, simplecnn, mlp")
    p.add_argument("--ragged", action="store_true", help="clients of different sizes (masked trailing steps)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--count-ops", action="store_true",
                   help="only count the operators per stacked step at K = 1 and K = --clients (CPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared VM, two threads wait on each other while other "
                   "jobs run)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.count_ops:
        for k in sorted({1, a.clients}):
            print(f"K = {k}: {ops_per_stacked_step(k, a.batch_size, a.model):.0f} operators per stacked step "
                  f"(the loop: one client-step is 34 for the CNN, tests/step_cost.py)")
        return
    try:
        device = common.resolve_device(a.device)
    except common.UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{a.clients} clients, {a.model}, batch {a.batch_size}, {a.steps} steps{' (ragged)' if a.ragged else ''}, "
          f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
          f"load average {load:.2f}")
    r = run(a.clients, a.steps, a.batch_size, a.model, a.ragged, a.repeats, device)
    t_loop, t_tog = np.median(r["loop"]), np.median(r["together"])
    c_loop, c_tog = np.median(r["loop_cpu"]), np.median(r["together_cpu"])
    print(f"median: loop {t_loop:.3f} s, together {t_tog:.3f} s, loop / together {t_loop / t_tog:.2f}x; "
          f"CPU seconds: loop {c_loop:.3f}, together {c_tog:.3f}, {c_loop / c_tog:.2f}x")
    print(f"max |loop - together|: float32 {r['float32']:.3g}, float64 {r['float64']:.3g} (largest change of a "
          f"parameter {r['change']:.3g}; float32 loop against float64 loop {r['loop_vs_float64']:.3g})")

if __name__ == "__main__":
    main()
