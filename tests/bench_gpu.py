"""The round measured four ways beside PFLlib's, prepared for the first lent GPU (issue 90, item 1; run by hand,
pytest does not collect it; docs/speed.md, "Measuring on the first lent GPU"):

    python tests/bench_gpu.py --pfllib .pfllib          # on a CUDA GPU: the leaderboard's shape, about 6 minutes
    python tests/bench_gpu.py                           # on a CPU: the tiny shape, seconds; graph rows skipped

One table, FedAvg at the FedALA leaderboard's shape: Fashion-MNIST-shaped random data (uint8 1x28x28, 10 classes,
70,000 images; the content does not matter for speed), 20 clients by Dir(0.1), the 4-layer CNN (--model cnn), batch
10, one local epoch, K = 1, 5 and 20 clients a round, each K's rounds on the same clients and seeds in every row:

  eager-1         the loop, one client at a time (--parallel-clients 1): common.ClientPool with one model,
                  fedavg.client_update
  default         the loop as the scripts run it today: ClientPool.build, parallel_clients(args, device) models
                  (4 on a GPU, one torch thread each on threads; 1 on a CPU's one thread)
  graphs          the loop, one client at a time, common.local_train's full-size step replayed from a CUDA graph
                  captured once per worker model (GraphedLocalTrain below; the last, shorter batch eager)
  stacked         tools/together.py's train_together: the round's clients as one vmap'd computation
  stacked-graphs  the same step over static tensors, one CUDA graph per number of clients still training
                  (StackedSGD below)
  pfllib          PFLlib's own FedAvg (d832e76: its main.py's defaults, its FedAvgCNN, its clients' DataLoaders) on
                  the same clients' data and device, K = 20, from the clone --pfllib names (its `system/` read with
                  git archive into a temporary folder, as tools/pfllib_crosscheck.py run does)

then FedALA (its ALA step and local training, fedala.client_update; the initial stage marked done, so the steady
round) and pFedLA (pfedla.client_update from one start; the hypernetworks' step left out) at K = 20 with the two
fastest FedAvg K = 20 variants. A round: the K client updates, FedAvg's weighted average (FedALA's too), one host
sync per client for the loss; no evaluation. Columns: median s/round of the timed rounds, samples/s (samples trained
/ seconds), GPU busy % (nvidia-smi's utilization.gpu sampled as tests/bench_round.py does; n/a on a CPU), peak GPU
MB (torch.cuda.max_memory_allocated over the row: setup, graphs and the dataset included), and max |diff| of the
first timed round's trained models against eager-1's (float32 rounding; 0 is bit for bit).

The graph code runs only where torch.cuda.is_available(); on a CPU its rows say skipped. The CPU shape (--tiny,
automatic on a CPU) is 1,000 images. --budget-s (330 s on a GPU) caps the measuring: rows run in order of what the
issue's goals need (K = 1 for the rates, then K = 20, PFLlib, FedALA, pFedLA, then K = 5), each given fewer timed
rounds or skipped, said so in its row, when its estimate (from the K = 1 rates) does not fit what is left.
"""
import argparse
import contextlib
import gc
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import fedala  # noqa: E402
import fedavg  # noqa: E402
import pfedla  # noqa: E402
from bench_round import UtilisationSampler  # noqa: E402
from bench_together import LEADERBOARD, make_fmnist_shaped  # noqa: E402
from tools import together  # noqa: E402

PFLLIB_COMMIT = "d832e76"  # tools/pfllib_crosscheck.py's pin
PFLLIB_HOW = ("give --pfllib CLONE, a clone of https://github.com/TsingZ0/PFLlib holding d832e76, and a python "
              "(--pfllib-python) with scikit-learn and h5py, which PFLlib's code imports")
VARIANTS = ["eager-1", "default", "graphs", "stacked", "stacked-graphs"]
GRAPHED = {"graphs", "stacked-graphs"}
CLIENTS = (1, 5, 20)
IMAGES = {"full": 70000, "tiny": 1000}
SLOWER = {"fedala": 1.2, "pfedla": 1.5}  # a round's cost over FedAvg's (FedALA's: besides its ALA), for estimates


def log(message):
    print(f"[bench_gpu] {message}", file=sys.stderr, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- the graphed loop (CUDA only)

class GraphedLocalTrain:
    """common.local_train for one worker model, its full-size minibatch step (forward, cross-entropy, backward,
    torch.optim.SGD's step with momentum and weight decay, the running loss) replayed from one CUDA graph.

    Made once per worker model: the optimizer and its momentum buffers exist before the capture (two warm-up steps
    on a side stream make them), the step reads its batch's indices from a static tensor, the loss adds into a
    static total, lr is the Python float the graph bakes in (constant in every script). Per client the momentum
    buffers are zeroed in place, so the first step's buffer is 0 * m + g = g, torch's first step (buf = g), and the
    total is zeroed. A batch of another size (the client's last, shorter one) runs eagerly on the same model and
    optimizer. Without CUDA (``capture`` False) every step runs eagerly: the same arithmetic as local_train."""

    def __init__(self, model, data, args, capture):
        self.model, self.data, self.args, self.graph = model, data, args, None
        device = data.x.device
        self.optimizer = common.make_optimizer(model, args)
        self.batch = torch.zeros(args.batch_size, dtype=torch.long, device=device)  # the replayed step's indices
        self.total = torch.zeros((), device=device)
        model.train()
        if not capture:
            self.warm_up()
            return
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.warm_up()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients, static
        with torch.cuda.graph(self.graph):
            self.step(self.batch)

    def warm_up(self):  # two steps: the momentum buffers made, cuDNN and cuBLAS set up (the model reloads per client)
        for _ in range(2):
            self.eager_step(self.batch)

    def step(self, batch):
        loss = F.cross_entropy(self.model(self.data.x[batch]), self.data.y[batch])
        loss.backward()
        self.optimizer.step()
        self.total.add_(loss.detach())

    def eager_step(self, batch):
        self.optimizer.zero_grad(set_to_none=True)
        self.step(batch)

    def local_train(self, idx, seed):
        """common.local_train(self.model, data, idx, args, seed)."""
        self.model.train()
        for state in self.optimizer.state.values():
            if state.get("momentum_buffer") is not None:
                state["momentum_buffer"].zero_()
        self.total.zero_()
        steps = 0
        for batch in common.epoch_batches(idx, self.args.batch_size, self.args.local_epochs, seed):
            if self.graph is not None and len(batch) == len(self.batch):
                self.batch.copy_(batch)
                self.graph.replay()
            else:
                self.eager_step(batch)
            steps += 1
        return self.total / max(steps, 1)


@contextlib.contextmanager
def graphed_local_train(trainers):
    """common.local_train, for the worker models of ``trainers`` ({model: GraphedLocalTrain}), their graphed loop: the
    scripts' client_update run unchanged. Only here, only while the graphs row runs (one thread)."""
    original = common.local_train

    def local_train(model, data, idx, args, seed):
        trainer = trainers.get(model)
        return trainer.local_train(idx, seed) if trainer is not None else original(model, data, idx, args, seed)

    common.local_train = local_train
    try:
        yield
    finally:
        common.local_train = original


def local_train_update(model, start, data, client, args, round_):
    """FedAvg's client update as common.local_train: pfedla.client_update's three lines (fedavg.client_update writes
    the same loop out, equal bit for bit: tests/test_local_training.py)."""
    common.load_flat_state(model, start)
    loss = common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, round_, client))
    return common.flatten_state(model), loss


# ----------------------------------------------------------------------------- the stacked step over static tensors

class StackedSGD:
    """tools/together.py's train_together step by step over static tensors, so that a step of k clients can be one
    CUDA graph: the K clients' stacked parameters, momentum buffers and summed losses, and a step's (K, batch)
    indices and 0/1 weights are made once; a round copies its sorted start rows in and zeroes the rest, each step
    copies its indices and weights and replays the graph of its k (one graph per k = 1..K, warmed up twice on a side
    stream before capture), or runs eagerly without CUDA. The step is train_together's: vmap(grad) of the clients'
    mean cross-entropy over their real samples, weight decay, momentum (buffers zeroed per round: 0 * m + g = g, the
    first step's copy), the update. tests/test_bench_gpu_table.py holds the eager path equal to train_together."""

    def __init__(self, model, data, args, max_clients, capture):
        self.model, self.data, self.args, self.max_clients = model, data, args, max_clients
        self.names, self.shapes = zip(*[(n, p.shape) for n, p in model.named_parameters()])
        device, dtype = data.x.device, next(model.parameters()).dtype
        self.params = [torch.zeros(max_clients, *shape, device=device, dtype=dtype) for shape in self.shapes]
        self.buffers = [torch.zeros_like(p) for p in self.params] if args.momentum else []
        self.total = torch.zeros(max_clients, device=device, dtype=dtype)
        self.index = torch.zeros(max_clients, args.batch_size, dtype=torch.long, device=device)
        self.weight = torch.zeros(max_clients, args.batch_size, device=device, dtype=dtype)
        self.grad = vmap(grad(self.loss, has_aux=True))
        self.graphs = {}
        model.train()
        if capture:
            side = torch.cuda.Stream(device)
            for k in range(1, max_clients + 1):
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self.step(k, args.batch_size)
                torch.cuda.current_stream(device).wait_stream(side)
                self.graphs[k] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graphs[k]):
                    self.step(k, args.batch_size)

    def loss(self, client_params, xb, yb, wb):  # train_together's: one client's mean loss over its real samples
        per_sample = F.cross_entropy(functional_call(self.model, dict(zip(self.names, client_params)), (xb,)), yb,
                                     reduction="none")
        mean = (per_sample * wb).sum() / wb.sum()
        return mean, mean

    def step(self, k, width):
        rows, index = [p[:k] for p in self.params], self.index[:k, :width]
        grads, losses = self.grad(rows, self.data.x[index], self.data.y[index], self.weight[:k, :width])
        if self.args.weight_decay:
            grads = [g.add(p, alpha=self.args.weight_decay) for g, p in zip(grads, rows)]
        if self.args.momentum:
            momentum_rows = [b[:k] for b in self.buffers]
            for b, g in zip(momentum_rows, grads):
                b.mul_(self.args.momentum).add_(g)
            grads = momentum_rows
        for p, g in zip(rows, grads):
            p.add_(g, alpha=-self.args.lr)
        self.total[:k].add_(losses.detach())

    def train(self, starts, batches):
        """train_together(model, starts, batches, data.x, data.y, lr, momentum, weight_decay)."""
        clients, steps = len(batches), [len(b) for b in batches]
        order = sorted(range(clients), key=lambda k: -steps[k])
        index, real = together.stack_batches([batches[k] for k in order], self.data.x.device)
        width = index.shape[2]
        graphed = bool(self.graphs) and width == self.index.shape[1]  # else (no client has a full batch) eagerly
        sorted_rows = starts[torch.as_tensor(order, device=starts.device)]
        for p, piece, shape in zip(self.params, sorted_rows.split([s.numel() for s in self.shapes], 1), self.shapes):
            p[:clients].copy_(piece.reshape(clients, *shape))
        for tensor in (*self.buffers, self.total, self.index, self.weight):
            tensor.zero_()
        training = [sum(n > s for n in steps) for s in range(index.shape[0])]  # k_s: the clients still training
        for s, k in enumerate(training):
            self.index[:clients, :width].copy_(index[s])
            self.weight[:clients, :width].copy_(real[s])
            if graphed:
                self.graphs[k].replay()
            else:
                self.step(k, width)
        back = torch.as_tensor(sorted(range(clients), key=order.__getitem__), device=starts.device)
        trained = torch.cat([p[:clients].reshape(clients, -1) for p in self.params], 1)[back]
        mean = self.total[:clients] / torch.as_tensor([max(steps[k], 1) for k in order], dtype=self.total.dtype,
                                                      device=self.total.device)
        return trained, mean[back]


# ----------------------------------------------------------------------------- the variants, one round each

def round_batches(data, clients, args, round_):
    """Each client's minibatches in a round, in the loop's order (common.epoch_batches, the client's seed)."""
    return [list(common.epoch_batches(data.train_idx[c], args.batch_size, args.local_epochs,
                                      common.client_seed(args.seed, round_, c))) for c in clients]


class Variant:
    """One row's way of training a round's clients, built for a script's ``args`` and model builder ``build``: a
    pool of worker models for the loops (``loop``), or ``stacked(starts, clients, round_)``."""

    def __init__(self, name, args, data, build, device, max_clients):
        self.name, self.args, self.data, self.trainers, self.stack = name, args, data, {}, None
        sizes = [len(i) for i in data.train_idx]
        if name == "default":
            self.pool = common.ClientPool.build(args, build, device, data)
        else:
            self.pool = common.ClientPool([build().to(device)], sizes)
        model = self.pool.models[0]
        if name == "graphs":
            self.trainers = {model: GraphedLocalTrain(model, data, args, capture=device.type == "cuda")}
        elif name == "stacked-graphs":
            self.stack = StackedSGD(model, data, args, max_clients, capture=device.type == "cuda")

    @property
    def is_stacked(self):
        return self.name.startswith("stacked")

    def loop(self, client_update, clients):
        """pool.train(client_update, clients), through the graphs where this is the graphs row."""
        with graphed_local_train(self.trainers) if self.trainers else contextlib.nullcontext():
            return self.pool.train(client_update, clients)

    def stacked(self, starts, clients, round_):
        batches = round_batches(self.data, clients, self.args, round_)
        if self.stack is not None:
            return self.stack.train(starts, batches)
        a = self.args
        return together.train_together(self.pool.models[0], starts, batches, self.data.x, self.data.y, a.lr, a.momentum,
                                       a.weight_decay)


class FedAvgRounds:
    """FedAvg's rounds: the clients from the global model, then fedavg.server_update."""
    name, first_round = "fedavg", 1

    def __init__(self, args, data, device):
        self.args, self.data = args, data
        torch.manual_seed(args.seed)
        self.global_model = self.build().to(device)

    def build(self):
        return common.build_model(self.args.model, self.data, auto_image=fedavg.AUTO_IMAGE)

    def round(self, variant, clients, round_):
        args, data = self.args, self.data
        start = common.flatten_state(self.global_model)
        if variant.is_stacked:
            rows, losses = variant.stacked(start.expand(len(clients), -1), clients, round_)
        elif variant.trainers:
            rows, losses = variant.loop(lambda m, c: local_train_update(m, start, data, c, args, round_), clients)
        else:
            rows, losses = variant.loop(lambda m, c: fedavg.client_update(m, start, data, c, args, round_), clients)
        common.load_flat_state(self.global_model, fedavg.server_update(rows, [len(data.train_idx[c]) for c in clients]))
        return rows, [float(loss) for loss in losses]


class FedALARounds(FedAvgRounds):
    """FedALA's steady round: each client's ALA (one epoch: the initial stage marked done) and local training, as
    fedala.client_update (the stacked rows: its ALA lines per client, then the clients' training stacked), the local
    models kept, the weighted average. Rounds from 2 (round 1 has no ALA)."""
    name, first_round = "fedala", 2

    def __init__(self, args, data, device):
        super().__init__(args, data, device)
        a = args
        self.ala = fedala.ALA(self.global_model, a.num_clients, p=a.p, eta=a.eta, s=a.s, batch_size=a.batch_size,
                              threshold=a.threshold, num_pre_loss=a.num_pre_loss, max_init_epochs=a.max_init_epochs)
        self.ala.initial_stage = [False] * a.num_clients
        self.local_models = common.flatten_state(self.global_model).repeat(a.num_clients, 1)

    def round(self, variant, clients, round_):
        args, data, ala, global_model = self.args, self.data, self.ala, self.global_model
        if variant.is_stacked:
            model, starts = variant.pool.models[0], []
            for c in clients:  # fedala.client_update's ALA lines
                common.load_flat_state(model, self.local_models[c])
                generator = torch.Generator().manual_seed(common.client_seed(args.seed, round_, c, tag=1))
                idx = data.train_idx[c]
                ala.initialise(c, global_model, model, data.x[idx], data.y[idx], generator)
                starts.append(common.flatten_state(model))
            rows, losses = variant.stacked(torch.stack(starts), clients, round_)
        else:
            rows, losses, _, _ = variant.loop(lambda m, c: fedala.client_update(
                m, global_model, self.local_models[c], ala, data, c, args, round_), clients)
        self.local_models[clients] = rows
        common.load_flat_state(global_model, common.weighted_average(rows, [len(data.train_idx[c]) for c in clients]))
        return rows, [float(loss) for loss in losses]


class PFedLARounds(FedAvgRounds):
    """pFedLA's clients (pfedla.client_update, its CNN and lr), every client from the global start; the
    hypernetworks' aggregation and step are left out."""
    name = "pfedla"

    def build(self):
        return common.build_model(self.args.model, self.data, auto_image=pfedla.AUTO_IMAGE)

    def round(self, variant, clients, round_):
        args, data, start = self.args, self.data, common.flatten_state(self.global_model)
        if variant.is_stacked:
            rows, losses = variant.stacked(start.expand(len(clients), -1), clients, round_)
        else:
            rows, losses = variant.loop(lambda m, c: pfedla.client_update(m, start, data, c, args, round_), clients)
        return rows, [float(loss) for loss in losses]


ALGORITHMS = {"fedavg": (fedavg.parse_args, FedAvgRounds, []), "fedala": (fedala.parse_args, FedALARounds, []),
              "pfedla": (pfedla.parse_args, PFedLARounds, ["--model", "pfedlacnn"])}


def script_args(algorithm, path, device, out, threads=None):
    """The script's own flags at the table's shape (the leaderboard's), the script's defaults besides."""
    parse, _, extra = ALGORITHMS[algorithm]
    flags = ["--dataset", path, *LEADERBOARD, *extra, "--rounds", "1", "--device", str(device), "--out", out]
    return parse(flags + (["--threads", str(threads)] if threads else []))


# ----------------------------------------------------------------------------- one row

def row_clients(args, k, rounds):
    """The clients of each timed round at K = k: common.sample_clients from one stream per k, so every row at k
    trains the same clients."""
    rng = np.random.default_rng([args.seed, k])
    return [common.sample_clients(rng, args.num_clients, k / args.num_clients) for _ in range(rounds)]


def measure(algorithm, variant_name, k, rounds, ctx):
    """One row: setup (not timed), a warm-up round on the first round's smallest clients (not timed), then
    ``rounds`` timed rounds. Returns the row's dict; ``ctx['reference']`` keeps eager-1's first round's models."""
    device, data, sampler = ctx["device"], ctx["data"], ctx["sampler"]
    args = ctx["args"][algorithm]
    rounds_of = ALGORITHMS[algorithm][1]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    algo = rounds_of(args, data, device)
    variant = Variant(variant_name, args, data, algo.build, device, k)
    plan = row_clients(args, k, rounds)
    warm = sorted(plan[0], key=lambda c: len(data.train_idx[c]))[:min(k, len(variant.pool))]
    initial = common.flatten_state(algo.global_model).clone()
    ala_weights = algo.ala.weights.clone() if algorithm == "fedala" else None
    algo.round(variant, warm, algo.first_round)
    common.load_flat_state(algo.global_model, initial)  # the warm-up leaves the models as they were
    if algorithm == "fedala":
        algo.local_models[:] = initial
        algo.ala.weights.copy_(ala_weights)
    sync(device)
    seconds, samples = [], 0
    start = time.perf_counter()
    for r, clients in enumerate(plan):
        t = time.perf_counter()
        rows, _ = algo.round(variant, clients, algo.first_round + r)
        sync(device)
        seconds.append(time.perf_counter() - t)
        samples += sum(len(data.train_idx[c]) for c in clients) * args.local_epochs
        if r == 0:
            key = (algorithm, k)
            if variant_name == "eager-1":
                ctx["reference"][key] = rows.detach().clone()
            first = rows.detach()
        del rows
    end = time.perf_counter()
    reference = ctx["reference"].get((algorithm, k))
    diff = float((first - reference).abs().max()) if reference is not None else None
    util, _ = sampler.between(start, end) if sampler.source else (None, None)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None
    del variant, algo, first
    return {"algorithm": algorithm, "variant": variant_name, "k": k, "rounds": len(seconds),
            "sec": float(np.median(seconds)), "samples_per_s": samples / sum(seconds), "util": util, "peak_mb": peak,
            "diff": diff, "note": ""}


# ----------------------------------------------------------------------------- PFLlib's round

def write_pfllib_folder(data, folder):
    """Our clients' data as a PFLlib dataset folder (train/<i>.npz, test/<i>.npz, each {'data': {'x', 'y'}}, x float32
    N x 1 x 28 x 28), which PFLlib's read_client_data reads."""
    x, y = data.x.float().contiguous().cpu(), data.y.cpu()
    for split, idx_list in (("train", data.train_idx), ("test", data.test_idx)):
        os.makedirs(os.path.join(folder, split))
        for i, idx in enumerate(idx_list):
            idx = idx.cpu()
            with open(os.path.join(folder, split, f"{i}.npz"), "wb") as f:
                np.savez(f, data={"x": x[idx].numpy(), "y": y[idx].numpy()})


def pfllib_child(system, dataset, device, clients, rounds):
    """In PFLlib's python, cwd ``system``: its FedAvg server for ``rounds`` timed rounds (its round 0, with its one
    evaluation, untimed), K = ``clients``; prints one line 'PFLLIB_RESULT {json}'."""
    os.chdir(system)
    sys.path.insert(0, system)
    from tools import pfllib_crosscheck
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    parser = pfllib_crosscheck.main_parser_defaults(system)  # its main.py's parser, read from its source
    args = parser.parse_args(["-data", dataset, "-m", "CNN", "-algo", "FedAvg", "-dev", device, "-gr", str(rounds),
                              "-eg", str(10 ** 9), "-nc", "20", "-jr", str(clients / 20)])
    from flcore.servers.serveravg import FedAvg
    from flcore.trainmodel.models import FedAvgCNN
    args.model = FedAvgCNN(in_features=1, num_classes=args.num_classes, dim=1024).to(args.device)
    server = FedAvg(args, 0)
    marks, aggregate = [], server.aggregate_parameters

    def aggregate_and_mark():  # the end of each round, for the GPU sampler's window
        aggregate()
        marks.append(time.perf_counter())

    server.aggregate_parameters = aggregate_and_mark
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    server.train()
    samples = sum(c.train_samples // args.batch_size * args.batch_size for c in server.clients)  # drop_last
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda" else None
    print("PFLLIB_RESULT " + json.dumps({"seconds": server.Budget[1:], "marks": marks, "samples": samples,
                                         "peak_mb": peak}), flush=True)


def pfllib_row(pfllib, python, data, device, rounds, timeout, work, sampler):
    """PFLlib's FedAvg row at K = 20, or a row that says in one line why it did not run."""
    row = {"algorithm": "fedavg", "variant": "pfllib", "k": 20, "rounds": 0, "sec": None, "samples_per_s": None,
           "util": None, "peak_mb": None, "diff": None, "note": ""}
    if pfllib is None:
        return {**row, "note": f"not run: {PFLLIB_HOW}"}
    try:  # its system/ at the pin (the tree itself: a small clone holding only system/'s files will do)
        archive = subprocess.run(["git", "-C", pfllib, "archive", "--prefix=system/", f"{PFLLIB_COMMIT}:system"],
                                 capture_output=True)
        why = (archive.stderr.decode(errors="replace").strip().splitlines() or ["git archive failed"])[-1]
    except OSError as e:  # no git on this machine
        archive, why = None, f"git: {e.strerror}"
    if archive is None or archive.returncode:
        return {**row, "note": f"failed: cannot read PFLlib @ {PFLLIB_COMMIT} from {pfllib}: {why}"}
    folder = os.path.join(work, "pfllib")
    os.makedirs(folder)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    write_pfllib_folder(data, os.path.join(folder, "dataset", "BenchShape"))
    cmd = [python, os.path.abspath(__file__), "--pfllib-child", os.path.join(folder, "system"), "BenchShape",
           device.type, "20", str(rounds)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "note": f"stopped at the budget: {timeout:.0f} s left were not enough"}
    result = [line for line in p.stdout.splitlines() if line.startswith("PFLLIB_RESULT ")]
    if p.returncode or not result:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        hint = f"; {PFLLIB_HOW}" if "No module named" in last else ""
        return {**row, "note": f"failed: {last.strip()[:200]}{hint}"}
    r = json.loads(result[-1].removeprefix("PFLLIB_RESULT "))
    util = sampler.between(r["marks"][0], r["marks"][-1])[0] if sampler.source and len(r["marks"]) > 1 else None
    return {**row, "rounds": len(r["seconds"]), "sec": float(np.median(r["seconds"])),
            "samples_per_s": r["samples"] / float(np.median(r["seconds"])), "util": util, "peak_mb": r["peak_mb"],
            "note": "its round 0 (its evaluation) untimed; its train loader drops a last partial batch"}


# ----------------------------------------------------------------------------- the table

def fmt(value, spec, missing="n/a"):
    return missing if value is None else format(value, spec)


def table_lines(results):
    lines = ["| algorithm | variant | K | rounds timed | s/round | samples/s | GPU busy % | peak GPU MB | "
             "max abs diff to eager-1 | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    order = {v: i for i, v in enumerate(VARIANTS + ["pfllib"])}
    for r in sorted(results, key=lambda r: (list(ALGORITHMS).index(r["algorithm"]), r["k"],
                                            order.get(r["variant"], len(order)))):
        timed = r["sec"] is not None
        lines.append(f"| {r['algorithm']} | {r['variant']} | {r['k']} | {r['rounds']} | "
                     f"{fmt(r['sec'], '.3f', '-')} | {fmt(r['samples_per_s'], '.0f', '-')} | "
                     f"{fmt(r['util'], '.0f') if timed else '-'} | {fmt(r['peak_mb'], '.0f') if timed else '-'} | "
                     f"{fmt(r['diff'], '.3g', '-')} | {r['note']} |")
    return lines


def summary_lines(results):
    """The issue's goals read off the table (FedAvg, K = 20): the fastest row's speed-up over eager-1 (goal 10x), the
    default (5x) and PFLlib (10x), 2,000 rounds' time, and stacked against the loop (the scripts' path needs 1/3)."""
    by = {r["variant"]: r["sec"] for r in results if r["algorithm"] == "fedavg" and r["k"] == 20 and r["sec"]}
    ours = {v: s for v, s in by.items() if v != "pfllib"}
    if not ours:
        return []
    best = min(ours, key=ours.get)
    hours = ours[best] * 2000 / 3600
    parts = [f"FedAvg K = 20: fastest {best}, {ours[best]:.3f} s/round (2,000 rounds: {hours:.2f} h)"]
    parts += [f"speed-up over {other} {by[other] / ours[best]:.2f}x (goal {goal}x)"
              for other, goal in (("eager-1", 10), ("default", 5), ("pfllib", 10)) if other in by and other != best]
    loops = [s for v, s in ours.items() if not v.startswith("stacked")]
    stacked = [s for v, s in ours.items() if v.startswith("stacked")]
    if loops and stacked:
        parts.append(f"best stacked / best loop {min(stacked) / min(loops):.2f} (the scripts' path needs <= 0.33)")
    return ["; ".join(parts)]


def header_lines(ctx, shape):
    device = ctx["device"]
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            driver = "n/a"
        where = f"{name}, driver {driver}"
    else:
        where = f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s)"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    regressed = " (pytorch #174575: graph replay regressed in 2.10)" if torch.__version__.startswith("2.10") else ""
    args, data = ctx["args"]["fedavg"], ctx["data"]
    sizes = [len(i) for i in data.train_idx]
    return [f"device: {where}; torch {torch.__version__}, CUDA {torch.version.cuda or 'n/a'}, cuDNN {cudnn or 'n/a'}"
            f"{regressed}; deterministic {'on' if torch.are_deterministic_algorithms_enabled() else 'off'}",
            f"data: {shape} Fashion-MNIST-shaped random images (uint8 1x28x28, 10 classes), "
            f"{args.num_clients} clients, Dir({args.beta}), {sum(sizes)} train samples ({min(sizes)}-{max(sizes)} a "
            f"client); --model cnn, batch {args.batch_size}, {args.local_epochs} local epoch, lr {args.lr}, momentum "
            f"{args.momentum}, weight decay {args.weight_decay}; default = {common.parallel_clients(args, device)} "
            "client(s) at once"]


# ----------------------------------------------------------------------------- main

def plan_rows(ks):
    """The rows in the order they run: K = 1 (the rates the budget's estimates use), the largest K, PFLlib, FedALA
    and pFedLA, then the other Ks."""
    small, large, rest = min(ks), max(ks), sorted(set(ks) - {min(ks), max(ks)})
    rows = [("fedavg", v, small) for v in VARIANTS]
    if large != small:
        rows += [("fedavg", v, large) for v in VARIANTS]
    rows += [("pfllib", None, large), ("fedala", "best", large), ("pfedla", "best", large)]
    return rows + [("fedavg", v, k) for k in rest for v in VARIANTS]


def estimate(results, algorithm, variant, k, rounds, ctx):
    """Seconds a row would take (its timed rounds and warm-up, from its variant's K = 1 rate), None if unknown."""
    rate = [r["samples_per_s"] for r in results if r["algorithm"] == "fedavg" and r["variant"] == variant
            and r["samples_per_s"]]
    if not rate:
        return None
    data, args = ctx["data"], ctx["args"]["fedavg"]
    samples = sum(len(i) for i in data.train_idx) * k / args.num_clients * args.local_epochs
    per_round = samples / min(rate)
    if algorithm == "fedala":  # its ALA epoch runs eagerly in every variant: about 0.8 of an eager-1 round more
        eager = [r["samples_per_s"] for r in results if r["algorithm"] == "fedavg" and r["variant"] == "eager-1"
                 and r["samples_per_s"]]
        per_round += 0.8 * samples / min(eager or rate)
    return SLOWER.get(algorithm, 1.0) * per_round * (rounds + 0.5) + 2


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda if there is one), cpu, cuda, cuda:1, ...")
    p.add_argument("--tiny", action="store_true", help="1,000 images instead of 70,000 (automatic on a CPU)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per row (default: 2 on a GPU, 1 on a CPU)")
    p.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="the Ks (default: 1 5 20)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds the measuring may take (default: 330 on a GPU, none on a CPU)")
    p.add_argument("--pfllib", default=None, help=f"a clone of TsingZ0/PFLlib holding commit {PFLLIB_COMMIT}")
    p.add_argument("--pfllib-python", default=sys.executable,
                   help="the python that runs PFLlib's code: scikit-learn and h5py, this torch (default: this one)")
    p.add_argument("--pfllib-child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.pfllib_child:
        system, dataset, device, clients, rounds = a.pfllib_child
        return pfllib_child(system, dataset, device, int(clients), int(rounds))
    began = time.perf_counter()
    try:
        device = common.resolve_device(a.device)
    except common.UserError as e:
        sys.exit(f"error: {e}")
    if not all(1 <= k <= 20 for k in a.clients):
        sys.exit("error: --clients takes Ks from 1 to 20")
    cuda = device.type == "cuda"
    tiny = a.tiny or not cuda
    rounds = a.rounds or (2 if cuda else 1)
    budget = a.budget_s if a.budget_s is not None else (330.0 if cuda else None)
    shape = IMAGES["tiny" if tiny else "full"]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work, UtilisationSampler(device) as sampler:
        path = os.path.join(work, "fmnist.npz")
        make_fmnist_shaped(path, shape)
        out = os.path.join(work, "runs")
        ctx = {"device": device, "sampler": sampler, "reference": {},
               "args": {name: script_args(name, path, device, out) for name in ALGORITHMS}}
        ctx["data"] = common.load_federated_data(ctx["args"]["fedavg"], device)
        results = []
        for algorithm, variant, k in plan_rows(a.clients):
            left = None if budget is None else budget - (time.perf_counter() - began)
            if algorithm == "pfllib":
                eager = [r["sec"] for r in results if r["algorithm"] == "fedavg" and r["variant"] == "eager-1"
                         and r["k"] == 20 and r["sec"]]
                # its setup, its round 0 with its evaluation (about 2 rounds) and the timed rounds, each about 1.3
                # of an eager-1 round (its DataLoaders): from eager-1's K = 20 row, else 60 s a round
                need = lambda n: 15 + (n + 2) * 1.3 * (eager[0] if eager else 60)  # noqa: E731
                pfllib_rounds = rounds if left is None or need(rounds) <= left else 1
                if a.pfllib and left is not None and need(pfllib_rounds) > left:
                    results.append({**pfllib_row(None, None, None, device, 0, 0, work, sampler),
                                    "note": f"skipped: budget ({max(left, 0):.0f} s left, about "
                                            f"{need(pfllib_rounds):.0f} s needed)"})
                    continue
                r = pfllib_row(a.pfllib, a.pfllib_python, ctx["data"], device, pfllib_rounds,
                               left if left is not None else 3600, work, sampler)
                if r["sec"] is not None and r["rounds"] < rounds:
                    r["note"] = f"{r['rounds']} of {rounds} rounds: budget; " + r["note"]
                results.append(r)
                log(f"pfllib K=20: {fmt(r['sec'], '.3f', '-')} s/round {r['note'][:100]}")
                continue
            variants = [variant] if variant != "best" else best_two(results, k)
            if not variants:
                results.append({"algorithm": algorithm, "variant": "-", "k": k, "rounds": 0, "sec": None,
                                "samples_per_s": None, "util": None, "peak_mb": None, "diff": None,
                                "note": f"skipped: no FedAvg row at K = {k} ran"})
            for v in variants:
                results.append(run_row(algorithm, v, k, rounds, left, results, ctx, began, budget))
        print("\n".join(header_lines(ctx, shape)))
        print(f"rounds: {rounds} timed per row after one warm-up round on the first round's smallest clients; "
              f"budget {'none' if budget is None else f'{budget:.0f} s'}, measured in "
              f"{time.perf_counter() - began:.0f} s")
        print("\n".join(table_lines(results)))
        print("\n".join(summary_lines(results)))
    return 0


def best_two(results, k):
    """The two fastest FedAvg variants at K = k that ran (FedALA's and pFedLA's rows run with them)."""
    ran = sorted((r["sec"], r["variant"]) for r in results
                 if r["algorithm"] == "fedavg" and r["k"] == k and r["sec"] and r["variant"] != "pfllib")
    return sorted((v for _, v in ran[:2]), key=VARIANTS.index)  # eager-1 first, if it is one: the others' diffs


def run_row(algorithm, variant, k, rounds, left, results, ctx, began, budget):
    device, asked = ctx["device"], rounds
    blank = {"algorithm": algorithm, "variant": variant, "k": k, "rounds": 0, "sec": None, "samples_per_s": None,
             "util": None, "peak_mb": None, "diff": None}
    if variant in GRAPHED and device.type != "cuda":
        return {**blank, "note": "skipped: CUDA graphs need a CUDA GPU (this run is on the CPU)"}
    if left is not None:
        need = estimate(results, algorithm, variant, k, rounds, ctx)
        if need is not None and need > left and rounds > 1:
            rounds = 1
            need = estimate(results, algorithm, variant, k, 1, ctx)
        if left <= 0 or (need is not None and need > left):
            return {**blank, "note": f"skipped: budget ({max(left, 0):.0f} s left"
                                     + (f", about {need:.0f} s needed)" if need is not None else ")")}
    try:
        r = measure(algorithm, variant, k, rounds, ctx)
    except Exception as e:  # noqa: BLE001  one row failing (a capture on this torch, say) keeps the others
        r = {**blank, "note": f"failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    if r["sec"] is not None and r["rounds"] < asked:
        r["note"] = f"{r['rounds']} of {asked} rounds: budget"
    log(f"{algorithm} {variant} K={k}: {fmt(r['sec'], '.3f', '-')} s/round {r['note'][:100]} "
        f"(t = {time.perf_counter() - began:.0f} s" + (f" of {budget:.0f})" if budget else ")"))
    return r


if __name__ == "__main__":
    sys.exit(main())
