"""What one local SGD step costs, counted on the CPU (run by hand; pytest does not collect it).

    python tests/step_cost.py

For the model each script trains on CIFAR-10 with ``--model auto`` (FedAvg and FedALA: the
4-layer CNN; pFedLA: its CNN; FedPake: ResNet-18; FedACD: the simple CNN), at the script's
batch size: parameters; FLOPs per sample of the forward pass and of forward + backward
(torch.utils.flop_counter.FlopCounterMode, which counts matrix products and convolutions
only, not ReLU, pooling, BatchNorm or the loss); and the aten operators that do work in one
step of the script's own local update (forward, loss, backward, optimizer step, the running
loss), counted with a TorchDispatchMode. On a GPU each of these is at least one kernel launch
(views, detach and allocations are not counted). The optimizer is torch.optim.SGD with
foreach=True, what it defaults to when the parameters are on a CUDA device (on a CPU it loops
over the parameters). FedALA's row is followed by the ops of one step of its ALA epoch
(after the initial stage). docs/speed.md, "On a GPU", turns these counts into times.
"""
import argparse
import collections
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
import fedacd  # noqa: E402
import fedala  # noqa: E402
from rounds import fedacd_local_train  # noqa: E402

# script -> (model with --model auto on CIFAR-10, batch size, lr, momentum, weight decay), the scripts' defaults
SCRIPTS = {
    "fedavg": ("cnn", 10, 0.005, 0.0, 0.0), "fedala": ("cnn", 10, 0.005, 0.0, 0.0),
    "pfedla": ("pfedlacnn", 32, 0.01, 0.0, 0.0), "fedpake": ("resnet18", 10, 0.005, 0.0, 0.0),
    "fedacd": ("simplecnn", 64, 0.01, 0.9, 1e-5)}

NO_WORK = {  # operators that launch no kernel: views, metadata, allocation, profiler marks
    "detach", "view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "slice", "select", "unsqueeze",
    "squeeze", "permute", "alias", "_reshape_alias", "split", "split_with_sizes", "unbind", "empty", "empty_like",
    "empty_strided", "new_empty_strided", "new_empty", "_record_function_enter_new", "_record_function_exit",
    "lift_fresh", "resolve_conj", "resolve_neg", "is_same_size", "_local_scalar_dense"}


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_WORK:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def fake_data(n, num_classes=10):
    x = torch.randn(n, 3, 32, 32).contiguous(memory_format=torch.channels_last)  # as load_federated_data keeps it
    return SimpleNamespace(x=x, y=torch.arange(n) % num_classes, num_classes=num_classes, info={})


def flops(model, batch):
    x, y = batch
    with FlopCounterMode(display=False) as count:
        F.cross_entropy(model(x), y)
    forward = count.get_total_flops()
    with FlopCounterMode(display=False) as count:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return forward / len(y), count.get_total_flops() / len(y)


def phase_ops(model, data, batch_size, args):
    """aten ops of one step as common.local_train does it, by phase (after a warm-up step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, foreach=True)
    total = torch.zeros(())
    counts = []
    for _ in range(2):
        batch = torch.randperm(len(data.y))[:batch_size]
        phases = [CountOps() for _ in range(3)]
        with phases[0]:
            loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
        with phases[1]:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with phases[2]:
            optimizer.step()
            total += loss.detach()
        counts = phases
    return [sum(p.ops.values()) for p in counts], counts


def local_update_ops(script, model, data, args):
    """aten ops per step of the script's own local update over all of ``data`` (one epoch):
    common.local_train, or fedacd.client_update's local training with its P^m pass, mixup and loss."""
    make_optimizer = common.make_optimizer
    common.make_optimizer = lambda m, a: torch.optim.SGD(m.parameters(), lr=a.lr, momentum=a.momentum,
                                                         weight_decay=a.weight_decay, foreach=True)
    idx = torch.arange(len(data.y))
    steps = len(common.batch_bounds(len(idx), args.batch_size)) * args.local_epochs
    try:
        with CountOps() as count:
            if script == "fedacd":
                present = torch.ones(data.num_classes, dtype=torch.bool)
                fedacd_local_train(model, data, idx, present, args, batch_seed=1, mixup_seed=2)
            else:
                common.local_train(model, data, idx, args, seed=1)
    finally:
        common.make_optimizer = make_optimizer
    return sum(count.ops.values()) / steps, count


def ala_ops(model, data, batch_size):
    """aten ops per step of FedALA's ALA epoch after the initial stage (fedala.ALA.initialise on
    one client: forward, gradients into the top layer only, the W update), and its steps."""
    ala = fedala.ALA(model, 1, batch_size=batch_size)
    ala.initial_stage[0] = False  # after the initial stage: one epoch over s% of the data
    local = common.build_model("cnn", data)
    generator = torch.Generator().manual_seed(0)
    with CountOps() as count:
        ala.initialise(0, model, local, data.x, data.y, generator)
    subset = max(1, round(ala.s / 100 * len(data.y)))
    steps = len(common.batch_bounds(subset, batch_size))
    return sum(count.ops.values()) / steps, count


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(SCRIPTS), choices=list(SCRIPTS))
    p.add_argument("--show-ops", action="store_true", help="list the operators of the first script's step")
    a = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; FLOPs: FlopCounterMode (matrix products and convolutions); ops: aten "
          "operators that do work, foreach SGD")
    print(f"{'script':8s} {'model':10s} {'batch':>5s} {'parameters':>11s} {'fwd MFLOP/sample':>16s} "
          f"{'fwd+bwd MFLOP/sample':>20s} {'GFLOP/step':>10s} {'ops fwd/bwd/opt':>15s} "
          f"{'ops/step in local update':>24s}")
    for script in a.only:
        name, batch_size, lr, momentum, wd = SCRIPTS[script]
        data = fake_data(4 * batch_size * 5)
        model = common.build_model(name, data)
        params = sum(t.numel() for t in model.parameters())
        forward, both = flops(model, (data.x[:batch_size], data.y[:batch_size]))
        args = SimpleNamespace(batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=wd, local_epochs=1,
                               mixup=True, lam=1.0, missing_delta=0.01)
        phases, counted = phase_ops(model, data, batch_size, args)
        per_step, whole = local_update_ops(script, model, data, args)
        print(f"{script:8s} {name:10s} {batch_size:5d} {params:11,d} {forward / 1e6:16.2f} {both / 1e6:20.2f} "
              f"{both * batch_size / 1e9:10.3f} {'/'.join(map(str, phases)):>15s} {per_step:24.1f}", flush=True)
        if script == "fedala":
            ala_step, ala_count = ala_ops(model, data, batch_size)
            print(f"{'  ALA':8s} {name:10s} {batch_size:5d} {'':11s} {'':16s} {'':20s} {'':10s} {'':>15s} "
                  f"{ala_step:24.1f}   (an ALA step: forward, gradient into the top layer, W update)", flush=True)
        if a.show_ops and script == a.only[0]:
            for phase, ops in zip(("forward + loss", "zero_grad + backward", "optimizer step + running loss"),
                                  counted):
                print(f"  {phase}: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ops.ops.items()))
            print("  whole local update: " + ", ".join(f"{k} x{v}" for k, v in whole.ops.most_common()))


if __name__ == "__main__":
    np.set_printoptions(suppress=True)
    main()
