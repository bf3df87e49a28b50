"""FedACD's round against FedAvg's in FedACD's setting, timed interleaved in one process (run by hand;
pytest does not collect it).

    python tests/bench_fedacd.py --data-dir /usr/share/datasets/fashion-mnist
    python tests/bench_fedacd.py --data-dir ... --before /path/to/older/checkout   # also that fedacd.py

Fashion-MNIST (or --dataset), 20 clients, Dir(0.1), 5 local epochs, batch 64, SGD 0.01 momentum 0.9,
the simple CNN, the global test split: fedacd.py's defaults, which fedavg.py is given too. One torch
thread. In turn, --reps times (A, B, A, B, ...): one client's update as fedavg.py runs it
(fedavg.client_update), as fedacd.py runs it by default, and as tools/fedacd_diagnostics.py runs it with
--log-risk on an evaluation round (Table 3's average risk: the local model on the whole test set), and with --before
the older fedacd.py's client update on an evaluation round (it computed the risk every evaluation,
and every round is one by default). The evaluation of the global model, common to both scripts, is
timed once per rep. Each is timed in CPU seconds of this process (time.process_time: one torch
thread, so the work done, which other jobs on a loaded machine change little) and in wall seconds.
A round's estimate: clients per round x the client's median CPU time + the evaluation's (clients
run one after another; --parallel-clients only divides the client part). Machine load
(os.getloadavg) is printed before and after.
"""
import argparse
import importlib.util
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
import fedacd  # noqa: E402
from tools import fedacd_diagnostics  # noqa: E402
import fedavg  # noqa: E402

SETTING = ["--num-clients", "20", "--join-ratio", "0.4", "--local-epochs", "5", "--batch-size", "64", "--lr", "0.01",
           "--momentum", "0.9", "--weight-decay", "1e-5", "--partition", "dir", "--beta", "0.1", "--model", "simplecnn",
           "--test-split", "global", "--device", "cpu"]


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--client", type=int, default=None, help="default: the round-1 client of median size")
    p.add_argument("--before", default=None, help="an older checkout whose fedacd.py is timed too")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    flags = ["--dataset", a.dataset, "--data-dir", a.data_dir, *SETTING]
    args_acd, args_avg = fedacd.parse_args(flags), fedavg.parse_args(flags)
    args_risk = fedacd_diagnostics.parse_args(flags + ["--log-risk"])
    rng = common.seed_everything(0)
    data = common.load_federated_data(args_acd, torch.device("cpu"))
    clients = common.sample_clients(rng, args_acd.num_clients, args_acd.join_ratio)
    by_size = sorted(clients, key=lambda c: len(data.train_idx[c]))
    client = a.client if a.client is not None else by_size[len(clients) // 2]
    global_model = common.build_model("simplecnn", data)
    worker = common.build_model("simplecnn", data)
    global_state = common.flatten_state(global_model)
    present, classes = torch.as_tensor(data.train_counts > 0), fedacd.held_classes(data)  # before: the host mask
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64)
    test = data.global_test_idx
    risk = ([test[data.y[test] == c] for c in range(data.num_classes)], counts / counts.sum(1, keepdim=True))
    before = load_module(os.path.join(a.before, "fedacd.py"), "fedacd_before") if a.before else None

    runs = {"fedavg.py": lambda: fedavg.client_update(worker, global_state, data, client, args_avg, 1),
            "fedacd.py": lambda: fedacd.client_update(worker, global_state, data, client, classes, args_acd, 1),
            "fedacd_diagnostics.py --log-risk (eval round)": lambda: fedacd_diagnostics.client_update(
                worker, global_state, data, client, classes, args_risk, 1, risk)}
    if before:
        runs["fedacd.py before (eval round)"] = lambda: before.client_update(
            worker, global_state, data, client, present, args_acd, 1, risk)
    runs["evaluate_global (both)"] = lambda: common.evaluate_global(global_model, data)
    print(f"{a.dataset}: client {client} ({len(data.train_idx[client])} train samples), {len(clients)} clients per "
          f"round; load average before {os.getloadavg()}", flush=True)
    seconds = {name: [] for name in runs}
    for rep in range(a.reps):
        for name, run in runs.items():
            start, wall = time.process_time(), time.perf_counter()
            run()
            seconds[name].append(time.process_time() - start)
            print(f"  rep {rep + 1} {name}: {seconds[name][-1]:.2f} CPU s, {time.perf_counter() - wall:.2f} wall s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    median = {name: float(np.median(v)) for name, v in seconds.items()}
    evaluation, k = median.pop("evaluate_global (both)"), len(clients)
    print(f"load average after {os.getloadavg()}")
    print(f"| client update | CPU s (median of {a.reps}) | x FedAvg's | round estimate CPU s | x FedAvg's round |")
    print("|---|---|---|---|---|")
    base = k * median["fedavg.py"] + evaluation
    for name, s in median.items():
        round_s = k * s + evaluation
        print(f"| {name} | {s:.2f} | {s / median['fedavg.py']:.2f} | {round_s:.1f} | {round_s / base:.2f} |")


if __name__ == "__main__":
    main()
