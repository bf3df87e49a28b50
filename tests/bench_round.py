"""Round-time benchmark (run by hand; pytest does not collect it).

    python tests/bench_round.py                  # every algorithm, CIFAR-10-shaped data, ~8.5 min on 2 CPU cores
    python tests/bench_round.py --only fedavg fedala --samples 60000   # the full CIFAR-10 size
    python tests/bench_round.py --scale          # 1000 clients at join ratio 0.1: memory over rounds
    python tests/bench_round.py --gpu            # the five scripts on a CUDA GPU: s/round, GPU use, memory

For each algorithm at its paper's shape it runs the real script on CIFAR-10-shaped random
data (uint8 3x32x32, 10 classes, written once as an .npz) and reads seconds per round,
peak host memory and peak device memory from the run folder. The scripts run with their
defaults, so on a CPU several clients train at once (--parallel-clients auto); the row
fedavg-1-at-a-time shows FedAvg without that. In the same run it times the same round done
the straightforward way: per client a deep copy of the global model and a torch Dataset +
DataLoader over that client's host data, then a key-by-key average of the state dicts and a
DataLoader evaluation. Two such baselines: 'naive-image', the torchvision pattern (uint8 HWC
images, ToTensor + Normalize per sample), and 'naive-tensor' (4-layer CNN rows only), a
TensorDataset over already normalised tensors, the cheapest straightforward loop. They cover
local training, FedAvg aggregation and evaluation; the algorithm-specific server work (ALA,
the hypernetworks, FedPake's clustering, FedACD's scores) is only in our column, so for those
rows the ratio understates our advantage. Timed rounds skip the first two (warm-up and
FedALA's initial ALA stage).

``--gpu`` (docs/speed.md, "On a GPU") runs each of the five scripts as a user would, with its
defaults (``--model auto``, its paper's clients, epochs and batch size), on CIFAR-10-shaped
data of the real size (60,000 images: 50,000 train and 10,000 test), and prints per script
seconds per round (median of rounds 2 on, from metrics.csv), local SGD steps per round, the
GPU's utilisation while rounds 2 on ran (nvidia-smi sampled in a background thread; pynvml
through torch.cuda.utilization() where there is no nvidia-smi; "n/a" without either), and
peak device memory (summary.json's peak_device_mb and nvidia-smi's largest memory.used).
The scripts' defaults train up to four clients at once on host threads on a GPU, whose kernel
launches overlap; a last row, fedavg-p1, is FedAvg with ``--parallel-clients 1``, one client at a
time. ``--gpu --device cpu`` runs the same flow on the CPU
(the test uses it with tiny sizes).

The rows run one after another, and this machine's speed drifts between runs, so the
ratios that matter are measured once more with the rounds interleaved in one process
(``interleaved``): FedAvg against both straightforward loops, and FedALA against FedAvg.
"""
import argparse
import copy
import csv
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision import transforms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
import fedala  # noqa: E402
import fedavg  # noqa: E402
from rounds import fedala_round, fedavg_round  # noqa: E402

# algorithm -> (script, flags of the paper's shape, share of the samples it gets)
SETTINGS = {
    "fedavg": ("fedavg.py", ["--model", "cnn", "--num-clients", "20", "--batch-size", "10", "--local-epochs", "1"], 1.0),
    "fedavg-1-at-a-time": ("fedavg.py", ["--model", "cnn", "--num-clients", "20", "--batch-size", "10",
                                         "--local-epochs", "1", "--parallel-clients", "1"], 1.0),
    "fedala": ("fedala.py", ["--model", "cnn", "--num-clients", "20", "--batch-size", "10", "--local-epochs", "1"], 1.0),
    "pfedla": ("pfedla.py", ["--model", "pfedlacnn", "--num-clients", "10", "--batch-size", "32", "--local-epochs", "10",
                             "--partition", "pfedla1"], 1.0),
    "fedacd": ("fedacd.py", ["--model", "simplecnn", "--num-clients", "20", "--join-ratio", "0.4", "--batch-size", "64",
                             "--local-epochs", "5", "--momentum", "0.9", "--weight-decay", "1e-5"], 1.0),
    # FedAvg in FedACD's setting (its lr and test split too): the base of FedACD's round-time ratio
    "fedavg-fedacd-setting": ("fedavg.py", ["--model", "simplecnn", "--num-clients", "20", "--join-ratio", "0.4",
                                            "--batch-size", "64", "--local-epochs", "5", "--momentum", "0.9",
                                            "--weight-decay", "1e-5", "--lr", "0.01", "--test-split", "global"], 1.0),
    "fedavg-resnet18": ("fedavg.py", ["--model", "resnet18", "--num-clients", "20", "--batch-size", "10",
                                      "--local-epochs", "1"], 1 / 3),
    "fedpake": ("fedpake.py", ["--model", "resnet18", "--num-clients", "20", "--batch-size", "10",
                               "--local-epochs", "1"], 1 / 3),
}


def make_cifar_shaped(path, samples, seed=0):
    """Random CIFAR-10-shaped data; labels are learnable from a class-dependent mean."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, samples)
    base = rng.integers(0, 256, (10, 3, 32, 32))
    x = np.clip(base[y] * 0.5 + rng.integers(0, 128, (samples, 3, 32, 32)), 0, 255).astype(np.uint8)
    test = samples // 6  # an official test split as in CIFAR-10 (10k of 60k), for --test-split global
    np.savez(path, x=x[test:], y=y[test:], x_test=x[:test], y_test=y[:test])


def flag(flags, name, default):
    return type(default)(flags[flags.index(name) + 1]) if name in flags else default


def run_ours(script, flags, npz, rounds, device, out):
    cmd = [sys.executable, os.path.join(ROOT, script), "--dataset", npz, "--rounds", str(rounds), "--eval-every", "1",
           "--checkpoint-every", str(10 ** 6), "--device", device, "--out", out, *flags]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{script} failed: {r.stderr.strip()[-500:]}")
    return read_run(out)[1:]


def read_run(out):
    """(the single run folder under ``out``, its metrics.csv rows, its summary.json)."""
    (name,) = os.listdir(out)
    folder = os.path.join(out, name)
    with open(os.path.join(folder, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return folder, rows, json.load(open(os.path.join(folder, "summary.json")))


class ImageDataset(Dataset):
    """How a client's data usually reaches the model: uint8 HWC images on the host, converted
    and normalised sample by sample (torchvision's ToTensor + Normalize) as the DataLoader asks."""

    def __init__(self, images, labels, mean, std):
        self.images, self.labels = images, labels
        self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), int(self.labels[i])


def client_loader(kind, x, y, idx, raw, batch_size, shuffle):
    if kind == "tensor":
        return DataLoader(TensorDataset(torch.tensor(x[idx]), torch.tensor(y[idx])), batch_size=batch_size,
                          shuffle=shuffle)
    images, mean, std = raw
    return DataLoader(ImageDataset(images[idx], y[idx], mean, std), batch_size=batch_size, shuffle=shuffle)


def straightforward(kind, flags, npz, device):
    """The straightforward round: deep copies, per-client DataLoaders, state-dict averaging.
    ``kind`` 'tensor': a TensorDataset over already normalised host tensors; 'image': the
    torchvision pattern, uint8 images transformed per sample. Returns (one_round, train
    samples per round); ``one_round()`` runs a round with its evaluation and returns seconds."""
    parser = common.base_parser("bench")
    args = common.parse_args(parser, ["--dataset", npz, "--device", device, *flags])
    device = common.resolve_device(device)
    torch.manual_seed(0)
    data = common.load_federated_data(args, torch.device("cpu"))  # same partition, host arrays
    x, y = data.x.contiguous().numpy(), data.y.numpy()  # plain NCHW, as a straightforward loop keeps it
    arrays = np.load(npz)
    images = np.concatenate([arrays["x"], arrays["x_test"]]).transpose(0, 2, 3, 1)
    images = np.ascontiguousarray(images)  # HWC uint8, as torchvision keeps CIFAR
    raw = (images, tuple(images.reshape(-1, 3).mean(0) / 255), tuple(images.reshape(-1, 3).std(0) / 255))
    global_model = common.build_model(args.model, data).to(device)
    rng = np.random.default_rng(0)

    def one_round():
        start = time.perf_counter()
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        states, sizes = [], []
        for c in clients:
            model = copy.deepcopy(global_model)
            idx = data.train_idx[c].numpy()
            loader = client_loader(kind, x, y, idx, raw, args.batch_size, shuffle=True)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                  weight_decay=args.weight_decay)
            model.train()
            for _ in range(args.local_epochs):
                for xb, yb in loader:
                    xb, yb = xb.to(device), yb.to(device)
                    loss = F.cross_entropy(model(xb), yb)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            states.append(copy.deepcopy(model.state_dict()))
            sizes.append(len(idx))
        avg = {}
        for key, value in states[0].items():
            if value.is_floating_point():
                avg[key] = sum(s[key] * n for s, n in zip(states, sizes)) / sum(sizes)
            else:
                avg[key] = value
        global_model.load_state_dict(avg)
        global_model.eval()
        correct = total = 0
        with torch.no_grad():
            for c in range(args.num_clients):
                idx = data.test_idx[c].numpy()
                for xb, yb in client_loader(kind, x, y, idx, raw, args.batch_size, shuffle=False):
                    xb, yb = xb.to(device), yb.to(device)
                    correct += (global_model(xb).argmax(1) == yb).sum().item()
                    total += len(yb)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    train_samples = sum(len(i) for i in data.train_idx) * args.join_ratio * args.local_epochs
    return one_round, train_samples


def interleaved(npz, rounds, device):
    """FedAvg's round (what fedavg.py's main runs each round: client_update on every client,
    server_update, evaluate_global; tests/rounds.py) with all clients' threads and one client at
    a time, FedALA's round (likewise, with evaluation)
    and the two straightforward rounds, taken in turn in one process: the machine's speed drifts
    by 20% and more between runs on a shared VM, and alternating cancels that out of the ratios."""
    flags = SETTINGS["fedavg"][1]
    args = fedavg.parse_args(["--dataset", npz, "--device", device, *flags])
    args_ala = fedala.parse_args(["--dataset", npz, "--device", device, *flags])
    dev = common.resolve_device(device)
    data = common.load_federated_data(args, dev)
    clients = list(range(args.num_clients))
    build = lambda: common.build_model("cnn", data)  # noqa: E731
    torch.manual_seed(0)
    global_avg, global_seq, global_ala = build().to(dev), build().to(dev), build().to(dev)
    workers = common.ClientPool.build(args, build, dev, data).models
    ala = fedala.ALA(global_ala, args.num_clients, batch_size=args.batch_size)
    local_models = common.flatten_state(global_ala).repeat(args.num_clients, 1)
    naive_image, _ = straightforward("image", flags, npz, device)
    naive_tensor, _ = straightforward("tensor", flags, npz, device)

    def timed(fn):
        start = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    seconds = {name: [] for name in ("fedavg", "fedavg-1-at-a-time", "fedala", "naive-image", "naive-tensor")}
    for round_ in range(1, rounds + 1):
        seconds["fedavg"].append(timed(lambda: (
            fedavg_round(global_avg, workers, data, clients, args, round_),
            common.evaluate_global(global_avg, data))))
        seconds["fedavg-1-at-a-time"].append(timed(lambda: (
            fedavg_round(global_seq, workers[:1], data, clients, args, round_),
            common.evaluate_global(global_seq, data))))
        seconds["fedala"].append(timed(lambda: fedala_round(
            global_ala, workers, local_models, ala, data, clients, args_ala, round_, evaluate=True)))
        seconds["naive-image"].append(naive_image())
        seconds["naive-tensor"].append(naive_tensor())
    return {name: float(np.median(values[2:])) for name, values in seconds.items()}, len(workers)


# ----------------------------------------------------------------------------- --gpu

GPU_SCRIPTS = ["fedavg", "fedala", "pfedla", "fedpake", "fedacd"]  # each run with its own defaults
# the --gpu rows: (label, script, flags added to the script's defaults); the defaults train up to 4 clients
# at once on host threads (ClientPool), which overlaps their kernel launches (docs/speed.md, "On a GPU");
# fedavg-p1 trains one at a time
GPU_ROWS = [(name, name, []) for name in GPU_SCRIPTS] + [("fedavg-p1", "fedavg", ["--parallel-clients", "1"])]


class UtilisationSampler:
    """GPU utilisation (%) and memory used (MB) of ``device``, sampled in a background thread:
    ``nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits --loop-ms``
    where nvidia-smi is on PATH, else ``torch.cuda.utilization`` / ``torch.cuda.device_memory_used``
    (which need pynvml). ``source`` says which; None on a CPU or with neither (the columns print
    n/a). ``samples`` holds (time.perf_counter(), util %, MB) tuples."""

    def __init__(self, device, interval_ms=200, command=None):
        self.device, self.interval, self.samples, self.source = device, interval_ms / 1000, [], None
        self._stop, self._proc, self._thread = threading.Event(), None, None
        if command is not None:  # tests: a stand-in for nvidia-smi that prints its lines
            self.cmd, self.source = command, "nvidia-smi"
            return
        if device.type != "cuda":
            return
        gpu = self._nvidia_smi_id(device) if shutil.which("nvidia-smi") else None
        if gpu is not None:
            self.cmd = ["nvidia-smi", f"--id={gpu}", "--query-gpu=utilization.gpu,memory.used",
                        "--format=csv,noheader,nounits", f"--loop-ms={interval_ms}"]
            self.source = "nvidia-smi"
        else:
            try:
                torch.cuda.utilization(device)
                self.source = "pynvml"
            except Exception:  # noqa: BLE001  no pynvml (ModuleNotFoundError) or no NVML on this machine
                self.source = None

    @staticmethod
    def _nvidia_smi_id(device):
        """How nvidia-smi names ``device``: its UUID (nvidia-smi's numbering can differ from CUDA's),
        else its index; None if nvidia-smi answers to neither."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        candidates = ([uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]
                      if re.fullmatch(r"(GPU-)?[0-9a-fA-F]{8}(-[0-9a-fA-F]+)+", uuid) else []) + [str(index)]
        for gpu in candidates:
            try:
                probe = subprocess.run(["nvidia-smi", f"--id={gpu}", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                return None
            if probe.returncode == 0:
                return gpu
        return None

    def _read_smi(self):
        for line in self._proc.stdout:
            try:
                util, mb = (float(v) for v in line.split(","))
            except ValueError:  # a "[N/A]" or a message line
                continue
            self.samples.append((time.perf_counter(), util, mb))

    def _poll_nvml(self):
        while not self._stop.wait(self.interval):
            try:
                util = float(torch.cuda.utilization(self.device))
            except Exception:  # noqa: BLE001  a failed read is a missing sample
                continue
            try:
                mb = torch.cuda.device_memory_used(self.device) / 2 ** 20
            except Exception:  # noqa: BLE001
                mb = float("nan")
            self.samples.append((time.perf_counter(), util, mb))

    def __enter__(self):
        if self.source == "nvidia-smi":
            try:
                self._proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.source = None
                return self
            self._thread = threading.Thread(target=self._read_smi, daemon=True)
        elif self.source == "pynvml":
            self._thread = threading.Thread(target=self._poll_nvml, daemon=True)
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._proc:
            self._proc.terminate()
            self._proc.wait()
        if self._thread:
            self._thread.join(timeout=5)

    def between(self, start, end):
        """(mean utilisation %, largest memory MB) of the samples taken in [start, end); Nones if none."""
        inside = [(u, m) for t, u, m in self.samples if start <= t < end]
        if not inside:
            return None, None
        return float(np.mean([u for u, _ in inside])), float(np.nanmax([m for _, m in inside]))

    def baseline_mb(self):
        """The lowest memory reading: the GPU before the measured script started (None if no samples)."""
        return float(np.nanmin([m for _, _, m in self.samples])) if self.samples else None


def rows_written(out):
    """Rows of metrics.csv in the single run folder under ``out`` so far (0 before there is one)."""
    try:
        (name,) = os.listdir(out)
        with open(os.path.join(out, name, "metrics.csv")) as f:
            return max(0, sum(1 for _ in f) - 1)
    except (ValueError, OSError):  # no run folder yet, or no metrics.csv yet
        return 0


def measure_script(name, npz, rounds, device, out, flags=(), log=None, label=None):
    """Run ``name``.py as a user would (its defaults plus ``flags``) for ``rounds`` rounds on ``npz``
    while sampling the GPU, and return what the --gpu table prints: the model, clients and local SGD
    steps per round, median s/round of rounds 2 on (metrics.csv), mean GPU utilisation and largest
    memory used while rounds 2 on ran (less the memory in use before the script started), and
    summary.json's peak_device_mb. Utilisation and memory are None on a CPU or without
    nvidia-smi and pynvml."""
    cmd = [sys.executable, os.path.join(ROOT, f"{name}.py"), "--dataset", npz, "--rounds", str(rounds),
           "--eval-every", "1", "--checkpoint-every", str(10 ** 6), "--device", device, "--out", out, *flags]
    log = log or os.path.join(os.path.dirname(out), f"{name}.log")
    marks = {}  # rows of metrics.csv -> when they were first seen: round 1 ends at marks[1], round R at marks[R]
    with UtilisationSampler(common.resolve_device(device)) as sampler, open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            marks.setdefault(rows_written(out), time.perf_counter())
            time.sleep(0.05)
    if proc.returncode != 0:
        with open(log) as f:
            raise RuntimeError(f"{name}.py failed (exit {proc.returncode}): {f.read().strip()[-800:]}")
    folder, rows, summary = read_run(out)
    config = json.load(open(os.path.join(folder, "config.json")))
    sizes = json.load(open(os.path.join(folder, "partition.json")))["train_sizes"]
    args = argparse.Namespace(**config["args"])
    steps = [len(common.batch_bounds(n, args.batch_size)) * args.local_epochs for n in sizes]
    clients = common.clients_per_round(args)
    timed = [float(r["sec_per_round"]) for r in rows[1:]] or [float(rows[-1]["sec_per_round"])]
    start = min((t for k, t in marks.items() if k >= 1), default=None)
    end = min((t for k, t in marks.items() if k >= len(rows)), default=None)
    util, smi_mb = sampler.between(start, end) if start is not None and end is not None else (None, None)
    if smi_mb is not None:  # the script's own use: less what was in use before it started (this process's context)
        smi_mb -= sampler.baseline_mb()
    return {"script": label or name, "model": model_name(args.model, name), "clients": clients,
            "steps": float(np.mean(steps)) * clients, "sec_per_round": float(np.median(timed)),
            "timed_rounds": len(timed), "util": util, "smi_mb": smi_mb,
            "peak_device_mb": summary.get("peak_device_mb"), "source": sampler.source}


def model_name(flag, script):
    """--model as run: 'auto' resolved the way the script resolves it on images (its AUTO_IMAGE)."""
    return flag if flag != "auto" else getattr(__import__(script), "AUTO_IMAGE", "auto")


def gpu_row(r):
    na = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    return (f"{r['script']:9s} {r['model']:10s} {r['clients']:7d} {r['steps']:10.0f} {r['sec_per_round']:9.3f} "
            f"{1000 * r['sec_per_round'] / r['steps']:9.3f} {na(r['util'], '.0f'):>10s} "
            f"{na(r['smi_mb'], '.0f'):>11s} {na(r['peak_device_mb'], '.0f'):>12s}")


GPU_HEADER = (f"{'script':9s} {'model':10s} {'clients':>7s} {'SGD steps':>10s} {'s/round':>9s} {'ms/step':>9s} "
              f"{'GPU util %':>10s} {'smi max MB':>11s} {'peak dev MB':>12s}")


def gpu_table(a, device):
    """--gpu: every script at its defaults on CIFAR-10-shaped data, one row each."""
    rows = [row for row in GPU_ROWS if row[1] in a.only]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        npz = os.path.join(work, f"cifar_{a.samples}.npz")
        make_cifar_shaped(npz, a.samples)
        test = a.samples // 6
        print(f"data: {a.samples - test} train + {test} test CIFAR-10-shaped images (uint8 3x32x32, 10 classes); "
              f"{a.rounds} rounds per script, the scripts' own defaults"
              + (f", --num-clients {a.num_clients}" if a.num_clients else "")
              + (f", --model {a.model}" if a.model else ""), flush=True)
        print(GPU_HEADER, flush=True)
        results, failed = [], []
        for label, name, extra in rows:
            out = os.path.join(work, label)
            os.mkdir(out)
            flags = (["--num-clients", str(a.num_clients)] if a.num_clients else []) + \
                (["--model", a.model] if a.model else []) + extra
            try:
                r = measure_script(name, npz, a.rounds, device, out, flags, log=os.path.join(work, f"{label}.log"),
                                   label=label)
            except RuntimeError as e:  # one script failing does not lose the others' rows
                failed.append(label)
                print(f"{label:9s} failed: {' '.join(str(e).split())[:300]}", flush=True)
                continue
            results.append(r)
            print(gpu_row(r), flush=True)
    sources = {r["source"] for r in results}
    timed = f"rounds 2-{a.rounds}" if a.rounds > 2 else "round 2"
    print(f"s/round: median of {timed} (metrics.csv; round 1 is warm-up), evaluation included; "
          "SGD steps: local minibatch steps per round (expected number where clients are sampled); ms/step = "
          "s/round / SGD steps (evaluation and server work included); fedavg-p1: fedavg.py --parallel-clients 1 "
          "(one client at a time; the others at their default, up to 4 at once on host threads)")
    print("GPU util %: mean utilization.gpu (share of time a kernel was running) while rounds 2 on ran; from "
          + (", ".join(sorted(s for s in sources if s)) or "n/a: no CUDA GPU in use, or no nvidia-smi and no pynvml")
          + "; smi max MB: largest memory.used then, less the reading before the script started (its CUDA "
          "context and cached blocks included); "
          "peak dev MB: torch.cuda.max_memory_allocated (summary.json)")
    return results, failed


def device_name(device):
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.get_device_name(torch.device(device) if device != "auto" else 0)
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--samples", type=int, default=None,
                   help="CIFAR-shaped samples in all (CIFAR-10 has 60000; default 6000, with --gpu 60000)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per run; the first two are not timed (with --gpu: the first)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 (with --gpu: default cuda)")
    p.add_argument("--gpu", action="store_true",
                   help="the five scripts at their defaults: s/round, GPU utilisation and memory (docs/speed.md)")
    p.add_argument("--no-naive", action="store_true")
    p.add_argument("--scale", action="store_true", help="1000 clients at join ratio 0.1 instead")
    p.add_argument("--num-clients", type=int, default=None, help="replace the papers' numbers of clients (smoke test)")
    p.add_argument("--model", default=None, help="with --gpu: replace the scripts' own models (smoke test)")
    p.add_argument("--naive-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.naive_child:  # internal: the straightforward round in its own process, for a clean memory peak
        kind, npz, rounds, device, *flags = a.naive_child
        one_round, samples = straightforward(kind, flags, npz, device)
        times = [one_round() for _ in range(int(rounds))]
        print(json.dumps({"times": times, "samples": samples,
                          "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
    if a.gpu and a.rounds < 2:
        p.error("--gpu needs --rounds >= 2 (round 1 is not timed)")
    if a.gpu and a.device == "auto":
        a.device = "cuda"
    a.samples = a.samples or (60000 if a.gpu else 6000)
    try:
        device = common.resolve_device(a.device)
    except common.UserError as e:  # e.g. --device cuda on a machine without a CUDA GPU: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if a.gpu:
        print(f"device: {device_name(str(device))}", flush=True)
        _, failed = gpu_table(a, str(device))
        sys.exit(1 if failed else 0)
    for _, flags, _ in SETTINGS.values() if a.num_clients else []:
        flags[flags.index("--num-clients") + 1] = str(a.num_clients)
    work = tempfile.mkdtemp(prefix="bench-")
    print(f"device: {device_name(a.device)}")
    if a.scale:
        return scale(a, work)
    header = f"{'algorithm':16s} {'clients/round':>13s} {'s/round':>9s} {'samples/s':>10s} {'peak host MB':>12s} " \
             f"{'peak dev MB':>11s} | {'naive-image s/round':>19s} {'host MB':>8s} {'speed-up':>8s} | " \
             f"{'naive-tensor s/round':>20s} {'host MB':>8s} {'speed-up':>8s}"
    print(header)
    results = {}
    for name in a.only:
        script, flags, share = SETTINGS[name]
        npz = os.path.join(work, f"cifar_{int(a.samples * share)}.npz")
        if not os.path.exists(npz):
            make_cifar_shaped(npz, int(a.samples * share))
        if not os.path.exists(os.path.join(ROOT, script)):
            print(f"{name:16s} ({script} not found)")
            continue
        out = tempfile.mkdtemp(dir=work)
        rows, summary = run_ours(script, flags, npz, a.rounds, a.device, out)
        timed = [float(r["sec_per_round"]) for r in rows[2:]] or [float(rows[-1]["sec_per_round"])]
        ours = float(np.median(timed))
        clients = max(1, round(flag(flags, "--join-ratio", 1.0) * flag(flags, "--num-clients", 20)))
        epochs = flag(flags, "--local-epochs", 1)
        train = sum(json.load(open(os.path.join(out, os.listdir(out)[0], "partition.json")))["train_sizes"])
        samples = train * clients / flag(flags, "--num-clients", 20) * epochs
        dev = summary.get("peak_device_mb")
        line = f"{name:16s} {clients:13d} {ours:9.3f} {samples / ours:10.0f} {summary['peak_host_mb']:12.0f} " \
               f"{(f'{dev:.0f}' if dev else '-'):>11s}"
        results[name] = {"sec_per_round": ours, "rows": rows}
        for kind in [] if a.no_naive else ["image", "tensor"] if name.startswith("fedavg") and "resnet" not in name \
                else ["image"]:
            r = subprocess.run([sys.executable, __file__, "--naive-child", kind, npz, str(a.rounds - 2), a.device, *flags],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-500:])
            child = json.loads(r.stdout.strip().splitlines()[-1])
            slow = float(np.median(child["times"][1:] or child["times"]))
            width = 19 if kind == "image" else 20
            line += f" | {slow:{width}.3f} {child['peak_host_mb']:8.0f} {slow / ours:7.2f}x"
        print(line, flush=True)
    if not a.no_naive and "fedavg" in a.only:
        npz = os.path.join(work, f"cifar_{a.samples}.npz")
        t, workers = interleaved(npz, a.rounds + 1, a.device)
        print(f"\ninterleaved in one process, median s/round of rounds 3-{a.rounds + 1} (FedALA's initial stage is "
              f"round 2): " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
        print(f"FedAvg ({workers} client(s) at a time) against the straightforward loop: "
              f"{t['naive-image'] / t['fedavg']:.2f}x (naive-image), {t['naive-tensor'] / t['fedavg']:.2f}x "
              f"(naive-tensor); one client at a time: {t['naive-image'] / t['fedavg-1-at-a-time']:.2f}x, "
              f"{t['naive-tensor'] / t['fedavg-1-at-a-time']:.2f}x")
        print(f"FedALA / FedAvg round time after the initial stage: {t['fedala'] / t['fedavg']:.2f}x (paper: 1.21x)")
    if "fedpake" in results and "fedavg-resnet18" in results:
        agg_cols = [k for k in results["fedpake"]["rows"][0] if "agg" in k and "sec" in k]
        if agg_cols:
            agg = float(np.median([float(r[agg_cols[0]]) for r in results["fedpake"]["rows"][2:]]))
            base = results["fedavg-resnet18"]["sec_per_round"]
            print(f"FedPake aggregation with ResNet-18: {agg:.3f} s = {100 * agg / base:.1f}% of FedAvg's "
                  f"{base:.3f} s round (paper: 0.248 vs 0.246 min per round)")


def scale(a, work):
    """1000 clients, join ratio 0.1, CIFAR-shaped: per-round time and memory after each round."""
    npz = os.path.join(work, "cifar_scale.npz")
    make_cifar_shaped(npz, a.samples)
    print(f"{'algorithm':10s} {'rounds':>6s} {'s/round':>8s} {'host MB after round 1 .. last':>40s} {'peak host MB':>12s}")
    for name in [n for n in ("fedavg", "fedala", "fedpake") if n in a.only or a.only == list(SETTINGS)]:
        script = SETTINGS[name][0]
        out = tempfile.mkdtemp(dir=work)
        flags = ["--model", "cnn", "--num-clients", "1000", "--join-ratio", "0.1", "--partition", "pat",
                 "--batch-size", "10"]
        rows, summary = run_ours(script, flags, npz, a.rounds, a.device, out)
        mem = [float(r["host_mb"]) for r in rows]
        dev = [r.get("device_mb") for r in rows]
        sec = float(np.median([float(r["sec_per_round"]) for r in rows[1:]]))
        print(f"{name:10s} {len(rows):6d} {sec:8.3f} {' '.join(f'{m:.0f}' for m in mem):>40s} "
              f"{summary['peak_host_mb']:12.0f}" + (f"  device MB per round: {dev}" if dev[0] else ""), flush=True)


if __name__ == "__main__":
    main()
