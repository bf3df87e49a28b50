"""One FedAvg round's local training stacked (tools/together.py) against the loop the scripts run, on any
device (run by hand; docs/speed.md, "Clients together"):

    python tests/bench_together.py                            # on the GPU (cuda), the leaderboard's shape
    python tests/bench_together.py --device cpu --tiny        # a CPU, small shapes (3,000 images)

The round: FedAvg at the FedALA leaderboard's shape (Fashion-MNIST-shaped random data: uint8 1x28x28, 10
classes, 70,000 images; 20 clients, Dir(0.1), the 4-layer CNN --model cnn, batch 10, one local epoch), every
client from one global model, K = 20 client updates. Timed three ways, in turn (A B C A B C), each repeat
ending in a device sync: the loop one client at a time (--parallel-clients 1, fedavg.client_update through
common.ClientPool.train), the loop at the default (--parallel-clients auto), and stacked
(together.train_together on the same minibatches, common.epoch_batches'). Printed: the median wall seconds of
each, stacked / best loop, the largest |loop - stacked| of the trained models (float32 rounding) and, for a
CPU, the load average. The stacked path would go on the round's path only at stacked / best loop <= 1/3.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import fedavg  # noqa: E402
from bench_round import device_name  # noqa: E402
from tools import together  # noqa: E402

LEADERBOARD = ["--model", "cnn", "--num-clients", "20", "--batch-size", "10", "--local-epochs", "1",
               "--partition", "dir", "--beta", "0.1"]


def make_fmnist_shaped(path, samples, seed=0):
    """Random Fashion-MNIST-shaped data (uint8 28x28, 10 classes), learnable from a class-dependent mean."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, samples)
    base = rng.integers(0, 256, (10, 28, 28))
    x = np.clip(base[y] * 0.5 + rng.integers(0, 128, (samples, 28, 28)), 0, 255).astype(np.uint8)
    np.savez(path, x=x, y=y)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fedavg_round(path, device_name_, parallel_clients, repeats):
    """(median seconds of the loop's round, of the stacked round, the largest |loop - stacked|) at --parallel-clients
    ``parallel_clients``, the two interleaved ``repeats`` times."""
    args = fedavg.parse_args(["--dataset", path, *LEADERBOARD, "--rounds", "1", "--parallel-clients",
                              str(parallel_clients), "--device", device_name_])
    device = common.resolve_device(args.device)
    data = common.load_federated_data(args, device)
    torch.manual_seed(0)
    build = lambda: common.build_model(args.model, data)  # noqa: E731
    pool = common.ClientPool.build(args, build, device, data)
    start = common.flatten_state(pool.models[0]).detach().clone()
    clients = list(range(args.num_clients))
    seconds = {"loop": [], "stacked": []}
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        loop, _ = pool.train(lambda model, client: fedavg.client_update(model, start, data, client, args, 1), clients)
        sync(device)
        seconds["loop"].append(time.perf_counter() - t)
        t = time.perf_counter()
        batches = [list(common.epoch_batches(data.train_idx[c], args.batch_size, args.local_epochs,
                                             common.client_seed(args.seed, 1, c))) for c in clients]
        stacked, _ = together.train_together(pool.models[0], start.expand(len(clients), -1), batches, data.x, data.y,
                                             args.lr, args.momentum, args.weight_decay)
        sync(device)
        seconds["stacked"].append(time.perf_counter() - t)
    return np.median(seconds["loop"]), np.median(seconds["stacked"]), float((loop - stacked).abs().max())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--tiny", action="store_true", help="3,000 images instead of 70,000, for a CPU")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each (after one warm-up round)")
    a = p.parse_args()
    try:
        common.resolve_device(a.device)
    except common.UserError as e:
        sys.exit(f"error: {e}")
    print(f"device: {device_name(a.device)}")
    with tempfile.TemporaryDirectory(prefix="bench-together-") as work:
        path = os.path.join(work, "fmnist.npz")
        make_fmnist_shaped(path, 3000 if a.tiny else 70000)
        times = {}
        for parallel in ("1", "auto"):
            fedavg_round(path, a.device, parallel, 1)  # warm-up: kernels, allocator, vmap's tracing
            loop, stacked, diff = fedavg_round(path, a.device, parallel, a.repeats)
            times[parallel] = loop
            times.setdefault("stacked", []).append(stacked)
            print(f"one FedAvg round's training, 20 clients: loop (--parallel-clients {parallel}) {loop:.3f} s, "
                  f"stacked {stacked:.3f} s, stacked / loop {stacked / loop:.2f}x; max |loop - stacked| {diff:.2g}")
    stacked, best = float(np.median(times["stacked"])), min(times["1"], times["auto"])
    load = f"; load average {os.getloadavg()[0]:.1f}" if a.device == "cpu" else ""
    print(f"stacked {stacked:.3f} s / best loop {best:.3f} s = {stacked / best:.2f}x (the round's path needs <= 0.33x)"
          f"{load}")


if __name__ == "__main__":
    main()
