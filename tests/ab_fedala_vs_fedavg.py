"""FedALA's round against FedAvg's, interleaved in one process (run by hand, not by pytest).

    python tests/ab_fedala_vs_fedavg.py

Alternating the two rounds on the same data makes the ratio robust to the machine's
speed drifting between separate runs. 4-layer CNN, 20 clients, batch 10, CIFAR-10-shaped
random data (6,000 images); each round includes its evaluation; rounds 3-8 are compared
(FedALA's initial stage is round 2).
"""
import os
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_round  # noqa: E402
import common  # noqa: E402
import fedala  # noqa: E402
import fedavg  # noqa: E402

npz = os.path.join(tempfile.mkdtemp(), "cifar_6000.npz")
bench_round.make_cifar_shaped(npz, 6000)
args = fedala.parse_args(["--dataset", npz, "--model", "cnn"])
data = common.load_federated_data(args, torch.device("cpu"))
clients = list(range(args.num_clients))
global_avg, worker_avg = common.build_model("cnn", data), common.build_model("cnn", data)
global_ala, worker_ala = common.build_model("cnn", data), common.build_model("cnn", data)
stack = torch.empty(len(clients), sum(v.numel() for v in common.float_state(global_avg)))
ala = fedala.ALA(global_ala, args.num_clients, batch_size=args.batch_size)
local_models = common.flatten_state(global_ala).repeat(args.num_clients, 1)
seconds = {"fedavg": [], "fedala": []}
for round_ in range(1, 9):
    start = time.perf_counter()
    fedavg.fedavg_round(global_avg, worker_avg, data, clients, args, round_, stack)
    common.evaluate_global(global_avg, data)
    seconds["fedavg"].append(time.perf_counter() - start)
    start = time.perf_counter()
    fedala.fedala_round(global_ala, worker_ala, local_models, ala, data, clients, args, round_, evaluate=True)
    seconds["fedala"].append(time.perf_counter() - start)
for name, values in seconds.items():
    print(f"{name}: " + " ".join(f"{v:.2f}" for v in values))
avg, ala_s = np.median(seconds["fedavg"][2:]), np.median(seconds["fedala"][2:])
print(f"median of rounds 3-8: FedAvg {avg:.3f} s, FedALA {ala_s:.3f} s, FedALA / FedAvg = {ala_s / avg:.2f}x (paper: 1.21x)")
