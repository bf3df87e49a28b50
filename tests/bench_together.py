"""--clients-together against the loop (issue 61): the one prepared command for a lent GPU (run by hand,
about 5 minutes on an H200), and a tiny shape that proves it on a CPU.

    python tests/bench_together.py                                  # on the GPU (cuda)
    python tests/bench_together.py --pfllib CLONE --pfllib-data DIR --pfllib-python VENV/bin/python
    python tests/bench_together.py --device cpu --tiny              # the same table on a CPU, tiny shapes
    python tests/bench_together.py --device cpu --tiny --cpu-seconds  # one FedAvg round's training, CPU seconds

Rows: FedAvg, FedALA and pFedLA at the FedALA leaderboard's shape (Fashion-MNIST-shaped random data:
uint8 1x28x28, 10 classes, 70,000 images; 20 clients, Dir(0.1), the 4-layer CNN --model cnn, batch 10,
one local epoch; FedALA's initial stage capped at one ALA epoch, --max-init-epochs 1, so that round 2
costs what every later round does) and FedPake at its ResNet-18 shape (CIFAR-shaped, tests/bench_round.py's data; ResNet-18
has BatchNorm, which --clients-together refuses: its row says so), each three ways: one client at a time
(--parallel-clients 1), today's default (--parallel-clients auto) and --clients-together. Columns: s/round
(median of rounds 2 on, from metrics.csv, evaluation included), train samples/s, GPU busy % (NVML's
utilization.gpu while rounds 2 on ran: the share of time a kernel was running; tests/bench_round.py's
sampler), peak device MB (torch.cuda.max_memory_allocated, summary.json), and together / loop ratios.
With --pfllib: PFLlib's own FedAvg round (d832e76, tools/pfllib_crosscheck.py run fedavg --device) on
the same device, on PFLlib's FashionMNIST-dir clients in --pfllib-data (tools/pfllib_fmnist.sh writes
them), from the times of its evaluations; nothing of PFLlib is copied here.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_round import device_name, make_cifar_shaped, measure_script  # noqa: E402

LEADERBOARD = ["--model", "cnn", "--num-clients", "20", "--batch-size", "10", "--local-epochs", "1",
               "--partition", "dir", "--beta", "0.1"]
# FedALA: its initial stage (round 2, up to 100 ALA epochs per client) capped at one epoch, as every later round
ROWS = [("fedavg", LEADERBOARD, "fmnist"), ("fedala", [*LEADERBOARD, "--max-init-epochs", "1"], "fmnist"),
        ("pfedla", [*LEADERBOARD, "--lr", "0.005", "--train-ratio", "0.75"], "fmnist"),
        ("fedpake", ["--model", "resnet18", "--num-clients", "20", "--batch-size", "10", "--local-epochs", "1"],
         "cifar")]
MODES = [("one at a time", ["--parallel-clients", "1"]), ("default", []), ("together", ["--clients-together"])]


def make_fmnist_shaped(path, samples, seed=0):
    """Random Fashion-MNIST-shaped data (uint8 28x28, 10 classes), learnable from a class-dependent mean."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, samples)
    base = rng.integers(0, 256, (10, 28, 28))
    x = np.clip(base[y] * 0.5 + rng.integers(0, 128, (samples, 28, 28)), 0, 255).astype(np.uint8)
    np.savez(path, x=x, y=y)


def train_samples(out):
    """Train samples of one round of the run under ``out`` (every client joins)."""
    (name,) = os.listdir(out)
    return sum(json.load(open(os.path.join(out, name, "partition.json")))["train_sizes"])


def pfllib_round(a, work):
    """(s/round, GPU busy %) of PFLlib's own FedAvg: the median time between its evaluations 1.. (each
    follows one round of training and its evaluation), busy over the whole run (start-up included)."""
    from bench_round import UtilisationSampler
    out = os.path.join(work, "pfllib.csv")
    cmd = [a.pfllib_python, os.path.join(ROOT, "tools", "pfllib_crosscheck.py"), "run", "fedavg", "--pfllib",
           a.pfllib, "--data-dir", a.pfllib_data, "--evaluations", str(a.rounds + 1), "--out", out,
           "--device", "cpu" if a.device == "cpu" else "cuda"]
    with UtilisationSampler(common.resolve_device(a.device)) as sampler:
        start = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        end = time.perf_counter()
    if r.returncode:
        raise RuntimeError((r.stderr.strip().splitlines() or ["failed"])[-1])
    seconds = [float(row["seconds"]) for row in csv.DictReader(open(out))]
    util, _ = sampler.between(start, end)
    return float(np.median(np.diff(seconds)[1:] if len(seconds) > 2 else np.diff(seconds))), util


def cpu_seconds(a, work, repeats=2):
    """--cpu-seconds: one FedAvg round's training at the leaderboard's shape (all 20 clients from one model), in
    this process on one torch thread, the loop (--parallel-clients 1) and together in turn, A B A B: this
    process's CPU seconds (time.process_time), which other jobs on the machine change far less than wall time."""
    import fedavg
    path = os.path.join(work, "fmnist.npz")
    make_fmnist_shaped(path, 3000 if a.tiny else 70000)
    torch.set_num_threads(1)
    seconds, rows = {False: [], True: []}, {}
    for _ in range(repeats):
        for stacked in (False, True):
            args = fedavg.parse_args(["--dataset", path, *LEADERBOARD, "--rounds", "1", "--parallel-clients", "1",
                                      "--threads", "1", "--device", a.device, *(["--clients-together"] * stacked)])
            device = common.resolve_device(args.device)
            data = common.load_federated_data(args, device)
            torch.manual_seed(0)
            pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data), device, data)
            start = common.flatten_state(pool.models[0]).clone()
            cpu = time.process_time()
            rows[stacked], _ = pool.train(lambda model, client: common.client_update(model, start, data, client, args,
                                                                                     1), list(range(20)))
            seconds[stacked].append(time.process_time() - cpu)
    loop, together = np.median(seconds[False]), np.median(seconds[True])
    print(f"one FedAvg round's training, 20 clients, CPU seconds (median of {repeats}, interleaved): loop {loop:.2f}, "
          f"together {together:.2f}: together / loop {together / loop:.2f}x; max |loop - together| "
          f"{float((rows[False] - rows[True]).abs().max()):.2g} (float32); load average {os.getloadavg()[0]:.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=3, help="rounds per run (round 1 is warm-up)")
    p.add_argument("--tiny", action="store_true", help="small shapes (3,000 and 1,200 images), for a CPU")
    p.add_argument("--only", nargs="*", default=[r[0] for r in ROWS], choices=[r[0] for r in ROWS])
    p.add_argument("--pfllib", help="a clone of TsingZ0/PFLlib holding d832e76: adds PFLlib's FedAvg round")
    p.add_argument("--pfllib-data", help="the folder holding PFLlib's FashionMNIST-dir clients")
    p.add_argument("--pfllib-python", default=sys.executable, help="a Python with scikit-learn and h5py")
    p.add_argument("--cpu-seconds", action="store_true", help="only one FedAvg round's training: CPU seconds of "
                   "the loop and together, interleaved in this process (a loaded CPU's ratio)")
    a = p.parse_args()
    try:
        common.resolve_device(a.device)
    except common.UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if a.cpu_seconds:
        with tempfile.TemporaryDirectory(prefix="bench-together-") as work:
            return cpu_seconds(a, work)
    fmnist, cifar = (3000, 1200) if a.tiny else (70000, 6000)
    print(f"device: {device_name(a.device)}{'' if a.device == 'cpu' else f', torch {torch.__version__}'}; "
          f"{a.rounds} rounds per run, "
          f"s/round the median of rounds 2 on; data: {fmnist} Fashion-MNIST-shaped images (1x28x28), "
          f"{cifar} CIFAR-shaped (3x32x32) for FedPake's ResNet-18", flush=True)
    print(f"{'script':8s} {'mode':14s} {'s/round':>8s} {'samples/s':>10s} {'GPU busy %':>10s} "
          f"{'peak dev MB':>11s} {'loop/this':>9s} {'default/this':>12s}", flush=True)
    na = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-together-") as work:
        data = {"fmnist": os.path.join(work, "fmnist.npz"), "cifar": os.path.join(work, "cifar.npz")}
        make_fmnist_shaped(data["fmnist"], fmnist)
        make_cifar_shaped(data["cifar"], cifar)
        for script, flags, kind in ROWS:
            if script not in a.only:
                continue
            seconds = {}
            for mode, extra in MODES:
                out = os.path.join(work, f"{script}-{mode.replace(' ', '-')}")
                os.mkdir(out)
                try:
                    r = measure_script(script, data[kind], a.rounds, a.device, out, [*flags, *extra])
                except RuntimeError as e:  # FedPake's ResNet-18 with --clients-together: refused (BatchNorm)
                    print(f"{script:8s} {mode:14s} {' '.join(str(e).split())[-200:]}", flush=True)
                    continue
                seconds[mode] = s = r["sec_per_round"]
                ratio = lambda m: f"{seconds[m] / s:.2f}x" if m in seconds else "n/a"  # noqa: E731
                print(f"{script:8s} {mode:14s} {s:8.3f} {train_samples(out) / s:10.0f} {na(r['util'], '.0f'):>10s} "
                      f"{na(r['peak_device_mb'], '.0f'):>11s} {ratio('one at a time'):>9s} {ratio('default'):>12s}",
                      flush=True)
        if a.pfllib:
            try:
                s, util = pfllib_round(a, work)
                print(f"{'PFLlib':8s} {'FedAvg':14s} {s:8.3f} {'':>10s} {na(util, '.0f'):>10s} (its own "
                      "FashionMNIST-dir clients, 20, batch 10, one epoch)", flush=True)
            except RuntimeError as e:
                print(f"PFLlib   FedAvg         failed: {e}", flush=True)


if __name__ == "__main__":
    main()
