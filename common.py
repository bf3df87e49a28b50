"""What two or more of the algorithm scripts share, in reading order: the command line (with ``--resume``'s
rules), the data (datasets.py, reached through here: loaded once into tensors on the training device; a client is
a pair of index tensors, a batch an index slice), one round (sampling, the clients' training, on threads at once,
the server's average) and evaluation; the models are models.py's, passed on (``common.build_model``). The errors
and ``run_main`` are in exits.py, the run folder in run_folder.py; imports go down only (docs/layout.md).
"""
import argparse
import contextlib
import math
import os
import queue
import shlex
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

import datasets
from datasets import check_fits, synthetic_setting  # the scripts' too: common.check_fits
from exits import DivergedError, FileFault, UserError, check_regular, quoted, shortened  # scripts: common.UserError
from run_folder import RESUME_MAY_CHANGE, RUN_FILES, read_json
from models import (MODELS, CNN, MLP, FastText, GlobalAvgPool, LeNet, PFedLACNN, SimpleCNN, build_model,  # noqa: F401
                    deterministic_pooling, layers)  # the scripts' too: common.build_model


# ----------------------------------------------------------------------------- command line

MAX_THREADS = 1024  # --threads: more is a typing error, not a machine
LR_HELP = "local learning rate (default: 0.1 on mnist and agnews and for fasttext and resnet18, else 0.005)"
# the flags of the label partition, which synthetic data (generated per client) does not use
PARTITION_FLAGS = ("partition", "beta", "classes_per_client", "balance", "samples_per_client", "dominant_share")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UserError(message)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a help text that states its own default keeps it
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def _auto_or_count(text):  # argparse type of --parallel-clients and --samples-per-client
    if text == "auto" or text.isdigit() and int(text) >= 1:
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 1, got {text!r}")


def _thread_count(text):  # argparse type of --threads
    if text == "auto" or text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_THREADS:
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be 'auto' or an integer in [1, {MAX_THREADS}], got {text!r}")


def base_parser(description, script=None, helps=None, **defaults):
    """The flags every script shares: ``defaults``, its paper setting; ``helps``, help of data-dependent defaults."""
    p = _Parser(prog=f"{script}.py" if script else None, description=description, formatter_class=_HelpFormatter)
    lr = defaults.get("lr", 0.005)  # a script's lr of None: its helps text says what it depends on
    helps = {**({"lr": f"local learning rate (default: {lr:g} on every dataset and model)"}
                if isinstance(lr, float) else {}), **(helps or {})}

    def a(*names, **kw):  # the script's help text where its default depends on the data
        return p.add_argument(*names, **{**kw, "help": helps.get(names[0][2:].replace("-", "_"), kw.get("help"))})

    a("--dataset", default="cifar10", help="mnist, fmnist, emnist, cifar10, cifar100, tinyimagenet, agnews, "
      "synthetic (FedProx's Synthetic(1,1)), synthetic(ALPHA,BETA), synthetic(iid), path/to/file.npz with x, y "
      "(optional x_test, y_test), or a PFLlib dataset folder (config.json, train/<i>.npz, test/<i>.npz: client i's "
      "data as it is; docs/datasets.md)")
    a("--data-dir", default="./data", help="where datasets are downloaded and read")
    a("--agnews-vocab", default="authors", choices=["authors", "train"], help="AG News vocabulary. authors (default): "
      "every word of the train and test texts, id 0 both padding and unknown, as TsingZ0/PFLlib "
      "dataset/generate_agnews.py @ 45e310d; train (ours): the train texts' words, unknown test words get id 1")
    a("--partition", default="dir", choices=["iid", "pat", "dir", "pfedla1", "pfedla2"], help="label partition")
    a("--beta", type=float, default=0.1, help="Dirichlet concentration for --partition dir")
    a("--classes-per-client", type=int, default=None,
      help="classes per client (default: by --partition): pat 2 (10 for 100 classes, 20 for 200); "
      "pfedla1 4 (12 for 100 classes); pfedla2 2 dominant classes (6 for 100 classes)")
    a("--balance", action="store_true", help="pat: equal shares of each class")
    a("--dominant-share", type=float, default=0.8,
      help="pfedla2: the share of each client's data its dominant classes hold together (the paper gives none)")
    a("--samples-per-client", type=_auto_or_count, default="auto",
      help="pfedla1, pfedla2: samples per client before the train/test split, the same for any --num-clients "
      "(pFedLA Sec. 4.2); default: auto, what a split over max(N, 100) clients gives (600 on CIFAR-10)")
    a("--num-clients", type=int, default=20, help="number of clients N")
    a("--join-ratio", type=float, default=1.0, help="fraction of clients sampled each round")
    a("--rounds", type=int, default=2000, help="communication rounds")
    a("--local-epochs", type=int, default=1, help="local epochs per round")
    a("--batch-size", type=int, default=10, help="local minibatch size")
    a("--lr", type=float, default=0.005, help="local learning rate")
    a("--momentum", type=float, default=0.0, help="local SGD momentum")
    a("--weight-decay", type=float, default=0.0, help="local SGD weight decay")
    a("--model", default="auto", help=model_help("the script's own model"))
    a("--test-split", default="client", choices=["client", "global"],
      help="client: merge train+test and split each client's data; global: the official test set")
    a("--train-ratio", type=float, default=0.75, help="share of each client's data used for training")
    a("--eval-every", type=int, default=1, help="evaluate every this many rounds (and each of the last 10)")
    a("--checkpoint-every", type=int, default=50, help="write a checkpoint every this many rounds")
    a("--seed", type=int, default=0, help="fixes partition, sampling, initialisation and batch order")
    a("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    a("--deterministic", default="auto", choices=["auto", "on", "off"], help="on: deterministic GPU kernels, no "
      "TF32 (repeatable on one GPU model, driver, torch); auto: on for CUDA only (a CPU repeats anyway)")
    a("--parallel-clients", type=_auto_or_count, default="auto",
      help="train this many clients at once on CPU threads, one torch thread each (1: one client at a time on "
      "all --threads threads; auto: one per --threads thread on CPU, up to 4 on a GPU); on a CPU results "
      "depend on whether this is 1, not on the schedule; on a GPU they do not depend on it")
    a("--threads", type=_thread_count, default="auto", help="CPU torch threads, which decide a CPU run's arithmetic "
      "(its results repeat bit for bit at the same count); auto (default): torch's own count, set by OMP_NUM_THREADS "
      "or the cores; config.json records the count taken. On a GPU it sets the threads of the CPU work")
    a("--out", default="runs", help="folder under which the run folder is created")
    a("--resume", default=None, metavar="RUN_DIR",
      help="continue a stopped run from its last checkpoint (default: a new run)")
    a("--stop-after", type=int, metavar="N", help="end after round N, as if killed; --resume: from the last checkpoint")
    p.set_defaults(**defaults)
    return p


def model_help(images):
    """--help of --model: what ``auto`` picks on each kind of data (build_model), ``images`` on images."""
    return (f"auto (default): {images} on images, mlp on vectors (synthetic, an .npz of vectors), fasttext on token "
            f"ids (agnews); or {', '.join(MODELS)}")


def fedala_learning_rate(args):
    """FedALA's setup, as a ``resolve`` of parse_args (its --help: LR_HELP): --lr 0.005 for the 4-layer CNN, 0.1 on
    MNIST and for fastText and ResNet-18."""
    if args.lr is None:
        fast = args.dataset in ("mnist", "agnews") or args.model in ("fasttext", "resnet18")
        args.lr = 0.1 if fast else 0.005


def parse_args(parser, argv=None, resolve=None, checks=()):
    """Parse and validate every flag before anything is written. ``resolve(args)`` fills the dataset-dependent
    defaults; ``checks``: the script's own (ok, message) pairs, or a function of args giving them. With ``--resume``
    the run's saved settings are used (resumed_args)."""
    args, given = parser.parse_args(argv), given_flags(parser, argv)
    if args.resume is not None and not args.resume.strip():
        raise UserError("--resume needs the run folder to continue (given: an empty name)")
    if args.resume:
        args = resumed_args(parser, argv)
    elif resolve:
        resolve(args)
    if not args.resume and datasets.is_pfllib_folder(args.dataset):
        pfllib_folder_settings(args, given)
    if args.threads == "auto":  # the count the run takes, recorded (torch's own: OMP_NUM_THREADS or the cores)
        args.threads = torch.get_num_threads()
    finite = lambda v: v is not None and math.isfinite(v)
    shared = [
        (finite(args.beta) and args.beta > 0, f"--beta must be a finite number > 0, got {args.beta} "
                                              "(for identical label mixes use --partition iid)"),
        (finite(args.join_ratio) and 0 < args.join_ratio <= 1,
         f"--join-ratio must be in (0, 1], got {args.join_ratio}"),
        (args.num_clients >= 1, f"--num-clients must be >= 1, got {args.num_clients}"),
        (synthetic_setting(args.dataset) is None or args.num_clients <= 10000,
         f"--num-clients {args.num_clients} is too many for synthetic data (at most 10000)"),
        (args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}"),
        (args.local_epochs >= 1, f"--local-epochs must be >= 1, got {args.local_epochs}"),
        (args.batch_size >= 1, f"--batch-size must be >= 1, got {args.batch_size}"),
        (finite(args.lr) and args.lr > 0, f"--lr must be a finite number > 0, got {args.lr}"),
        (finite(args.momentum) and 0 <= args.momentum < 1, f"--momentum must be in [0, 1), got {args.momentum}"),
        (finite(args.weight_decay) and args.weight_decay >= 0,
         f"--weight-decay must be a finite number >= 0, got {args.weight_decay}"),
        (finite(args.train_ratio) and 0 < args.train_ratio < 1,
         f"--train-ratio must be in (0, 1), got {args.train_ratio}"),
        (args.eval_every >= 1, f"--eval-every must be >= 1, got {args.eval_every}"),
        (args.checkpoint_every >= 1, f"--checkpoint-every must be >= 1, got {args.checkpoint_every}"),
        (0 <= args.seed < 2 ** 63, f"--seed must be an integer in [0, 2^63), got {args.seed}"),
        (finite(args.dominant_share) and 0 < args.dominant_share < 1,
         f"--dominant-share must be in (0, 1), got {args.dominant_share}"),
        (args.classes_per_client is None or args.classes_per_client >= 1,
         f"--classes-per-client must be >= 1, got {args.classes_per_client}"),
        (args.stop_after is None or args.stop_after >= 1, "--stop-after must be >= 1"),
        *((getattr(args, k) == "auto" or type(getattr(args, k)) is int and getattr(args, k) >= 1,
           f"--{k.replace('_', '-')} must be 'auto' or an integer >= 1, got {getattr(args, k)!r}")
          for k in ("parallel_clients", "samples_per_client")),
        (bool(args.out.strip()), "--out must name a folder (. for the current one)"),
    ]
    for ok, message in [*shared, *(checks(args) if callable(checks) else checks)]:
        flag = message.split()[0].rstrip(":,;").removeprefix("--").replace("-", "_")
        if not ok:  # with --resume, a value not given now is config.json's
            raise UserError(message if not args.resume or flag in given else f"cannot resume: {args.resume}/config."
                            f"json holds an invalid setting: {message} (the file was edited or damaged)")
    if not args.resume:
        check_out_folder(args.out)  # before any data is loaded: an --out that cannot hold a run folder
        ignored = [f"--{dest.replace('_', '-')}" for dest in PARTITION_FLAGS if dest in given]
        if ignored and synthetic_setting(args.dataset) is not None:  # recorded, compare.py would label runs by them
            raise UserError(f"{', '.join(ignored)} does not apply to synthetic data: each client's data is generated "
                            "as its own (set the heterogeneity with synthetic(ALPHA,BETA) or synthetic(iid)); "
                            "leave the flag out")
    return args


def pfllib_folder_settings(args, given):
    """--dataset names a PFLlib dataset folder: its clients are taken as they are, so the flags that partition or split
    data (``given`` now) are refused, --num-clients is the folder's and each client is tested on its own test file."""
    resplit = [f"--{dest.replace('_', '-')}" for dest in (*PARTITION_FLAGS, *datasets.PFLLIB_RESPLIT_FLAGS)
               if dest in given]
    if resplit:
        raise UserError(f"{', '.join(resplit)} {'does' if len(resplit) == 1 else 'do'} not apply to a PFLlib "
                        "dataset folder: client i trains on its train/i.npz and is tested on its test/i.npz as they "
                        "are; leave the flag out")
    clients = datasets.read_pfllib_config(args.dataset)["num_clients"]
    if "num_clients" in given and args.num_clients != clients:
        raise UserError(f"--num-clients {args.num_clients}, but {quoted(args.dataset)} holds {clients} "
                        f"clients (its config.json); leave --num-clients out or give {clients}")
    args.num_clients, args.test_split = clients, "client"


def given_flags(parser, argv):
    """The flags given on the command line: argparse sets a default only where the namespace lacks the attribute."""
    unset = object()
    namespace = argparse.Namespace(**{k: unset for k in vars(parser.parse_args([]))})
    return {k: v for k, v in vars(parser.parse_args(argv, namespace=namespace)).items() if v is not unset}


def fits(default, value):
    """Whether a value read from config.json has the type of the flag's default (a number for a float)."""
    kinds = (int, float) if isinstance(default, float) else type(default)
    return default is None or value is None or default == "auto" or (
        isinstance(value, kinds) and isinstance(value, bool) == isinstance(default, bool))


def resumed_args(parser, argv):
    """The settings of ``--resume RUN_DIR`` (its config.json) with the flags given now that may change. Another
    value of a flag that changes results is refused in one line, and so is a run folder of an older form."""
    given = {k: v for k, v in given_flags(parser, argv).items() if (k, v) != ("threads", "auto")}  # auto: run's count
    folder, defaults, path = given["resume"], vars(parser.parse_args([])), os.path.join(given["resume"], "config.json")
    for name in RUN_FILES:
        check_regular(os.path.join(folder, name))
    config = read_json(path)
    try:
        saved, script, _ = dict(config["args"]), config["script"], config["args"]["rounds"]
        if not isinstance(script, str) or not isinstance(config["algorithm"], str):
            raise KeyError("script")
        if script == "flower_app":  # flower/app.py's checkpoint is the script's
            script = {"heurpfedla": "pfedla"}.get(config["algorithm"], config["algorithm"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"cannot resume: {quoted(path)} is not a run's config.json "
                        f"({f'no {e}' if isinstance(e, KeyError) else 'damaged'})") from None
    if f"{script}.py" != parser.prog:
        raise UserError(f"cannot resume: {quoted(folder)} is a run of {script}.py, not {parser.prog}; "
                        f"use python {shlex.join([f'{script}.py', '--resume', folder])}")
    unknown = [k for k, v in saved.items() if k not in defaults and v not in (False, None)]  # a mode switch off: none
    if unknown or "data_sha256" not in config or not isinstance(saved.get("threads"), int) \
            or set(defaults) - set(saved) - RESUME_MAY_CHANGE:
        raise UserError(f"cannot resume: {quoted(folder)} was made by an older version of {parser.prog}; "
                        f"bring it to today's form with: python tools/run_records.py --upgrade {shlex.quote(folder)}")
    bad = [k for k in defaults if k in saved and not fits(defaults[k], saved[k])]
    if bad:
        raise UserError(f"cannot resume: {quoted(path)} has {bad[0]} = {shortened(repr(saved[bad[0]]), 40)}, "
                        "which that flag does not take (the file was edited or damaged)")
    moved = lambda k, v: k == "dataset" and not str(saved[k]).startswith("synthetic") and os.path.exists(v)
    changed = [f"--{k.replace('_', '-')} {saved[k]} (now {v})" for k, v in sorted(given.items())
               if k not in RESUME_MAY_CHANGE and k in saved and v != saved[k] and not moved(k, v)]
    if changed:  # a dataset file or folder that moved is taken: Run compares the data's fingerprint
        raise UserError(f"cannot resume with other settings: {'; '.join(changed)}; only --rounds (to extend the "
                        "run), --device, --parallel-clients, --data-dir, --checkpoint-every, --stop-after, --out and "
                        "the new place of a --dataset file or folder that moved may change")
    args = argparse.Namespace(**{**{k: saved.get(k, default) for k, default in defaults.items()},  # then those given
                                 **{k: v for k, v in given.items() if k in RESUME_MAY_CHANGE | {"dataset"}}})
    args.resume, args.stop_after = folder, given.get("stop_after")
    if not os.path.exists(os.path.join(folder, "checkpoint.pt")):
        raise UserError(f"cannot resume: {quoted(folder)} has no checkpoint.pt (the run stopped before its first "
                        "checkpoint; start it again)")
    summary = {}
    with contextlib.suppress(UserError):
        summary = read_json(os.path.join(folder, "summary.json"))
    if isinstance(summary, dict) and summary.get("status") == "finished" and summary.get("rounds_done") == args.rounds:
        raise UserError(f"cannot resume: {quoted(folder)} has finished its {args.rounds} rounds; "
                        f"give --rounds N (more than {args.rounds}) to extend it")
    return args


def check_out_folder(out):
    """Refuse an --out that cannot hold a new run folder before any data is loaded; creates nothing."""
    path = os.path.abspath(out)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise UserError(f"cannot create a run folder under --out {quoted(out)} ({quoted(path)} is not a folder)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise FileFault(path, PermissionError(13, "not writable"), "; nothing was made", verb="create a run folder in")


# ----------------------------------------------------------------------------- data, devices and seeds

def load_federated_data(args, device):
    """datasets.load_federated_data after set_determinism and set_threads: before any GPU work."""
    set_determinism(device, args.deterministic)
    set_threads(args.threads)
    return datasets.load_federated_data(args, device)


def resolve_device(name):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device '{name}'; use auto, cpu or cuda")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name} is not supported; use auto, cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but no CUDA GPU is available; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA GPU(s) (cuda:0 ...)")
    return device


def set_determinism(device, mode):
    """--deterministic for a run on ``device`` (docs/running.md); returns whether it is on. On ('auto' on CUDA):
    deterministic kernels (an op without one raises), no cuDNN autotuning, no TF32 (fp32_precision, allow_tf32's
    successor from torch 2.9: do not mix them) and the cuBLAS workspace cuBLAS reads when it starts (so this runs before
    any GPU work). Off: torch's defaults. Settings are global to the process: each run sets every one, both ways."""
    cuda = torch.device(device).type == "cuda"
    on = mode == "on" or (mode == "auto" and cuda)
    if torch.are_deterministic_algorithms_enabled() != on or torch.is_deterministic_algorithms_warn_only_enabled():
        torch.use_deterministic_algorithms(on)  # only on a change: it imports torch._inductor (2 s on a CPU)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = on, False  # benchmark: torch's default
    torch.backends.cuda.matmul.fp32_precision = "ieee" if on else "none"  # none: torch's default (no TF32)
    torch.backends.cudnn.conv.fp32_precision = torch.backends.cudnn.rnn.fp32_precision = "ieee" if on else "tf32"
    if on and cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return on


def set_threads(threads):
    """--threads: torch's CPU (intra-op) threads for the whole run, whatever OMP_NUM_THREADS says. A CPU run's
    arithmetic depends on this count (how a sum is split over threads), so a run repeats bit for bit only at the count
    it was made with. None (a run made before the flag, which recorded none) or 'auto' (flags not resolved by
    parse_args): torch's default from the environment. Inter-op threads are left as they are: nothing here runs ops
    concurrently through them (parallel clients use their own threads, ClientPool)."""
    if threads not in (None, "auto") and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def seed_everything(seed):
    """Seed torch (model initialisation) and return the numpy generator that samples clients and
    draws the algorithms' own randomness; the data partition has its own stream (seed, 0)."""
    torch.manual_seed(seed)
    return np.random.default_rng([seed, 1])


def to_device(tensor, device):
    """``tensor`` on ``device`` with no GPU sync: from pinned memory (not pageable) a CUDA copy is asynchronous."""
    pin = tensor.device.type == "cpu" and torch.device(device).type == "cuda"
    return (tensor.pin_memory() if pin else tensor).to(device, non_blocking=True)


def clients_per_round(args):
    return max(1, int(round(args.join_ratio * args.num_clients)))


def check_client_models(model, num_clients):
    """Refuse before allocating: the server's ``num_clients`` flat client models that ``model``'s device cannot hold."""
    state = float_state(model)
    params = sum(v.numel() for v in state)
    check_fits(f"{num_clients} client models of {params} parameters", num_clients * params * state[0].element_size(),
               state[0].device)


def state_bytes(model):
    return sum(v.numel() * v.element_size() for v in model.state_dict().values())


# ----------------------------------------------------------------------------- one round (docs/layout.md)

def sample_clients(rng, num_clients, join_ratio):
    """round(join_ratio * N) clients (at least 1), without replacement, in increasing order."""
    return sorted(int(c) for c in rng.choice(num_clients, max(1, int(round(join_ratio * num_clients))), replace=False))


def client_seed(seed, round_, client, tag=0):
    """A seed for one client in one round, independent across (round, client, tag)."""
    return int(np.random.SeedSequence([seed, round_, client, tag]).generate_state(1)[0])


def float_state(model):
    return [v for v in model.state_dict().values() if v.is_floating_point()]  # views, in state_dict order


def flatten_state(model):
    """All floating-point parameters and buffers as one vector: a model as the server keeps it."""
    return torch.cat([v.reshape(-1) for v in float_state(model)])


def load_flat_state(model, flat):
    """flatten_state's inverse, in place. Integer buffers (BatchNorm's batch count) are kept: not averaged."""
    state = float_state(model)
    with torch.no_grad():
        for v, part in zip(state, flat.split([v.numel() for v in state])):
            v.copy_(part.view_as(v))


def batch_bounds(n, batch_size):
    """(start, end) of each minibatch of n samples; a last batch of one joins the one before (for BatchNorm)."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def make_optimizer(model, args):
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


def epoch_batches(idx, batch_size, epochs, seed):
    shuffle = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = idx[to_device(torch.randperm(len(idx), generator=shuffle), idx.device)]
        for start, end in batch_bounds(len(idx), batch_size):
            yield order[start:end]


def local_train(model, data, idx, args, seed):
    """--local-epochs of SGD with cross-entropy on the train indices ``idx``: the mean loss, 0-dim (no host sync)."""
    model.train()
    optimizer = make_optimizer(model, args)
    total, steps = torch.zeros((), device=data.x.device), 0
    for batch in epoch_batches(idx, args.batch_size, args.local_epochs, seed):
        loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total, steps = total + loss.detach(), steps + 1
    return total / max(steps, 1)


def weighted_average(client_states, weights):
    """FedAvg's aggregation: sum_k w_k theta_k / sum_k w_k over the clients' flat models (K x D, or a list)."""
    stacked = client_states if torch.is_tensor(client_states) else torch.stack(list(client_states))
    weights = to_device(torch.as_tensor(weights, dtype=stacked.dtype), stacked.device)
    return (weights / weights.sum()) @ stacked


def check_finite(loss, round_, client):
    """One host sync per client: stop a run that diverged (the data was checked finite: the step size is to blame)."""
    if not math.isfinite(value := float(loss)):
        raise DivergedError(f"training loss became {value} in round {round_} on client {client}; "
                            "lower --lr (metrics so far are in the run folder)")
    return value


def as_rows(client_states):  # the clients' flat models as one (K x D) tensor
    return client_states if torch.is_tensor(client_states) else torch.stack(list(client_states))


# the clients of a round trained at once (--parallel-clients)

def host_cores():  # the CPU cores this process may run on
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def parallel_clients(args, device):
    """How many clients train at once: --parallel-clients, at most the round's clients. auto: one per --threads thread
    on a CPU, where a small batch leaves most cores idle; on a GPU 4 (at most one per host core), since a step there is
    bound by the host's kernel launches, which threads overlap, and the GPU's arithmetic does not depend on the host's
    threads (docs/speed.md). Above 1, each client trains on one torch thread (ClientPool)."""
    n, threads = args.parallel_clients, getattr(args, "threads", None)
    if n == "auto" and device.type == "cpu":
        n = threads if isinstance(threads, int) else torch.get_num_threads()
    elif n == "auto":
        n = min(4, host_cores())
    return max(1, min(n, clients_per_round(args)))


class ClientPool:
    """The reusable models (parallel_clients of them) that run a round's client updates. With one model the clients run
    one after another on all --threads torch threads. With several, that many clients run at once on threads, one torch
    thread each, the largest clients first so the threads finish together; the server's work between rounds runs on all
    --threads. Client updates are independent, so results do not depend on the schedule, only, on a CPU, on whether each
    client ran on one torch thread or on all of them. No model is built or copied per client."""

    def __init__(self, models, client_sizes):
        self.models, self.client_sizes, self.free = models, client_sizes, queue.SimpleQueue()  # free: models not in use
        for model in models:
            self.free.put(model)

    @classmethod
    def build(cls, args, build_model, device, data):
        return cls([build_model().to(device) for _ in range(parallel_clients(args, device))],
                   [len(i) for i in data.train_idx])

    def __len__(self):
        return len(self.models)

    def map(self, client_update, clients):
        """``[client_update(model, client) for client in clients]``, each call given a free model."""
        if len(self.models) == 1:
            return [client_update(self.models[0], client) for client in clients]

        def run(client):
            model = self.free.get()
            try:
                return client_update(model, client)
            finally:
                self.free.put(model)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        executor = ThreadPoolExecutor(len(self.models))
        try:
            futures = {c: executor.submit(run, c) for c in sorted(clients, key=lambda c: -self.client_sizes[c])}
            return [futures[client].result() for client in clients]
        finally:  # after a second Ctrl-C or a failing client no queued client starts
            executor.shutdown(wait=False, cancel_futures=True)
            torch.set_num_threads(threads)

    def train(self, client_update, clients, progress=None):
        """``map`` of ``client_update(model, client)`` -> (the trained model, flat; more): the (K x D) rows, each copied
        in as its client ends (docs/speed.md), then each further value as a list; ``progress`` is told of each."""
        state, report = float_state(self.models[0]), progress or (lambda *_: None)
        rows = torch.empty(len(clients), sum(v.numel() for v in state), dtype=state[0].dtype, device=state[0].device)

        def update(model, client):
            report(client, len(clients), False)
            trained, *rest = client_update(model, client)
            rows[clients.index(client)] = trained
            report(client, len(clients), True)
            return rest

        return (rows, *(list(column) for column in zip(*self.map(update, clients))))


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, data, idx_list, batch_size=2048):
    """Per-client (correct, count, summed loss) of ``model`` on each index tensor in ``idx_list``, as tensors on the
    data's device; all clients go through the model in large batches."""
    was_training, device, lengths = model.training, data.x.device, [len(i) for i in idx_list]  # lengths: no GPU sync
    count = to_device(torch.tensor(lengths, dtype=torch.long), device)
    owner = torch.repeat_interleave(torch.arange(len(idx_list), device=device), count, output_size=sum(lengths))
    all_idx = torch.cat(list(idx_list)) if len(idx_list) else torch.zeros(0, dtype=torch.long, device=device)
    correct, losses = torch.zeros(len(all_idx), device=device), torch.zeros(len(all_idx), device=device)
    model.eval()
    for start in range(0, len(all_idx), batch_size):
        batch = all_idx[start: start + batch_size]
        logits = model(data.x[batch])
        correct[start: start + len(batch)] = (logits.argmax(1) == data.y[batch]).float()
        losses[start: start + len(batch)] = F.cross_entropy(logits, data.y[batch], reduction="none")
    model.train(was_training)
    zeros = torch.zeros(len(idx_list), device=device)
    return zeros.index_add(0, owner, correct), count.float(), zeros.index_add(0, owner, losses)


def accuracy_metrics(correct, count, loss_sum, prefix="test"):
    """In percent: pooled accuracy (the PFLlib number), the mean and std of per-client accuracies; the mean loss."""
    correct, count, loss_sum = (t.detach().double().cpu().numpy() for t in (correct, count, loss_sum))
    has = count > 0
    per_client = correct[has] / count[has]
    return {f"{prefix}_acc": 100 * correct.sum() / max(count.sum(), 1),
            f"{prefix}_acc_mean": 100 * per_client.mean() if has.any() else float("nan"),
            f"{prefix}_acc_std": 100 * per_client.std() if has.any() else float("nan"),
            f"{prefix}_loss": loss_sum.sum() / max(count.sum(), 1)}


def evaluate_global(model, data):
    """The global model on every client's test data (test_acc pooled, test_acc_mean and std over clients) and, under
    --test-split global, on the uniform test set (global_acc, global_loss: one test set has no client spread)."""
    metrics = accuracy_metrics(*evaluate(model, data, data.test_idx))
    if data.global_test_idx is not None:
        uniform = accuracy_metrics(*evaluate(model, data, [data.global_test_idx]), prefix="global")
        metrics.update(global_acc=uniform["global_acc"], global_loss=uniform["global_loss"])
    return metrics
