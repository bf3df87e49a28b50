"""What two or more of the algorithm scripts share, in reading order: the command line, the
data (loaded once into tensors on the training device; a client is a pair of index tensors,
a batch an index slice), the models, training and evaluation, and the run folder (config,
partition, metrics, summary, checkpoints, ``--resume``). Each algorithm lives in its own file.
"""
import argparse
import atexit
import contextlib
import csv
import gzip
import json
import math
import os
import pickle
import platform
import queue
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import data_partition as dp


# ----------------------------------------------------------------------------- command line

class UserError(Exception):
    """Bad input: reported as one line and exit status 2."""


class DivergedError(Exception):
    """A loss became NaN/inf: reported with round and client, exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UserError(message)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a help text that states its own default keeps it
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def run_main(main, argv=None):
    """Run a script's ``main``. Bad input: one line and exit status 2; divergence: one line and
    status 1; Ctrl-C: status 130 (``main`` returns a status when it stops early)."""
    code = 0
    try:
        code = main(argv) or 0
    except (UserError, dp.PartitionError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except DivergedError as e:
        print(f"stopped: {e}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("interrupted; the run folder keeps its last checkpoint", file=sys.stderr)
        code = 130
    finally:
        close_runs(failed=code != 0, diverged=code == 1)
    if code:
        sys.exit(code)


def _parallel_clients(text):
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 1, got {text!r}")
    return value


def base_parser(description, script=None, helps=None, **defaults):
    """The flags every script shares; ``defaults`` are the script ``script``'s paper setting and
    ``helps`` replaces the help text of flags whose default depends on the data."""
    p = _Parser(prog=f"{script}.py" if script else None, description=description, formatter_class=_HelpFormatter)
    a = p.add_argument
    a("--dataset", default="cifar10", help="mnist, fmnist, emnist, cifar10, cifar100, tinyimagenet, agnews, "
      "synthetic, or path/to/file.npz with x, y (optional x_test, y_test)")
    a("--data-dir", default="./data", help="where datasets are downloaded and read")
    a("--partition", default="dir", choices=["iid", "pat", "dir", "pfedla1", "pfedla2"], help="label partition")
    a("--beta", type=float, default=0.1, help="Dirichlet concentration for --partition dir")
    a("--classes-per-client", type=int, default=None,
      help="pat: classes per client (default 2, 10 for 100 classes, 20 for 200); "
      "pfedla1: 4 (12 for 100 classes); pfedla2: dominant classes 2 (6 for 100 classes)")
    a("--balance", action="store_true", help="pat: equal shares of each class")
    a("--num-clients", type=int, default=20, help="number of clients N")
    a("--join-ratio", type=float, default=1.0, help="fraction of clients sampled each round")
    a("--rounds", type=int, default=2000, help="communication rounds")
    a("--local-epochs", type=int, default=1, help="local epochs per round")
    a("--batch-size", type=int, default=10, help="local minibatch size")
    a("--lr", type=float, default=0.005, help="local learning rate")
    a("--momentum", type=float, default=0.0, help="local SGD momentum")
    a("--weight-decay", type=float, default=0.0, help="local SGD weight decay")
    a("--model", default="auto", help="auto, cnn, lenet, simplecnn, resnet18, resnet34, mlp, fasttext")
    a("--test-split", default="client", choices=["client", "global"],
      help="client: merge train+test and split each client's data; global: the official test set")
    a("--train-ratio", type=float, default=0.75, help="share of each client's data used for training")
    a("--eval-every", type=int, default=1, help="evaluate every this many rounds (and at the last)")
    a("--checkpoint-every", type=int, default=50, help="write a checkpoint every this many rounds")
    a("--seed", type=int, default=0, help="fixes partition, sampling, initialisation and batch order")
    a("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    a("--parallel-clients", type=_parallel_clients, default="auto",
      help="train this many clients at once on CPU threads, one torch thread each (1: one client at a time on "
      "all threads; auto: one per torch thread on CPU, 1 on a GPU); results depend on whether this is 1, "
      "not on the schedule")
    a("--out", default="runs", help="folder under which the run folder is created")
    a("--resume", default=None, metavar="RUN_DIR",
      help="continue a stopped run from its last checkpoint (default: a new run)")
    a("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests: stop after round N as if killed
    p.set_defaults(**defaults)
    for action in p._actions:
        action.help = (helps or {}).get(action.dest, action.help)
    return p


# flags that may differ on --resume: they do not change what is computed (--rounds extends the run)
RESUME_MAY_CHANGE = {"rounds", "device", "parallel_clients", "data_dir", "out", "resume", "stop_after",
                     "checkpoint_every"}


def _given_flags(parser, argv):
    """The flags given on the command line, with their parsed values."""
    defaults, parser_defaults = [(action, action.default) for action in parser._actions], parser._defaults
    for action, _ in defaults:
        action.default = argparse.SUPPRESS
    parser._defaults = {}
    try:
        return vars(parser.parse_args(argv))
    finally:
        parser._defaults = parser_defaults
        for action, default in defaults:
            action.default = default


def _resumed_args(parser, argv):
    """The saved arguments of ``--resume RUN_DIR``, with the flags given now that may change."""
    given = _given_flags(parser, argv)
    folder = given["resume"]
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        saved, script = config["args"], config.get("script")
        if not isinstance(saved, dict):
            raise ValueError("args is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot resume: {path} is missing or not a run's config ({e.__class__.__name__}: {e})")
    if script is None:  # older run folders: the algorithm names the script
        script = {"heurpfedla": "pfedla"}.get(config.get("algorithm"), config.get("algorithm"))
    if f"{script}.py" != parser.prog:
        raise UserError(f"cannot resume: {folder} is a run of {script}.py, not {parser.prog}; "
                        f"use python {script}.py --resume {folder}")
    defaults = vars(parser.parse_args([]))
    missing = sorted(set(defaults) - set(saved) - RESUME_MAY_CHANGE)
    if missing:
        raise UserError(f"cannot resume: {path} lacks the settings {', '.join(missing)}")
    changed = [f"--{k.replace('_', '-')} {saved[k]} (now {v})" for k, v in sorted(given.items())
               if k not in RESUME_MAY_CHANGE and k in saved and v != saved[k]]
    if changed:
        raise UserError(f"cannot resume with other settings: {'; '.join(changed)}; only --rounds may change")
    args = argparse.Namespace(**{**defaults, **{k: v for k, v in saved.items() if k in defaults}})
    for k in RESUME_MAY_CHANGE & set(given):
        setattr(args, k, given[k])
    args.resume, args.stop_after = folder, given.get("stop_after")
    return args


def parse_args(parser, argv=None, resolve=None, checks=()):
    """Parse and validate every flag before anything is written. ``resolve(args)`` fills the
    dataset-dependent defaults; ``checks`` are the script's own (ok, message) pairs as a
    function of args. With ``--resume`` the run's saved settings are used (see _resumed_args)."""
    args = parser.parse_args(argv)
    if args.resume:
        args = _resumed_args(parser, argv)
    elif resolve:
        resolve(args)
    finite = lambda v: v is not None and math.isfinite(v)
    shared = [
        (finite(args.beta) and args.beta > 0, f"--beta must be a finite number > 0, got {args.beta} "
                                              "(for identical label mixes use --partition iid)"),
        (finite(args.join_ratio) and 0 < args.join_ratio <= 1,
         f"--join-ratio must be in (0, 1], got {args.join_ratio}"),
        (args.num_clients >= 1, f"--num-clients must be >= 1, got {args.num_clients}"),
        (args.dataset != "synthetic" or args.num_clients <= 10000,
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
        (args.classes_per_client is None or args.classes_per_client >= 1,
         f"--classes-per-client must be >= 1, got {args.classes_per_client}"),
        (args.stop_after is None or args.stop_after >= 1, "--stop-after must be >= 1"),
    ]
    for ok, message in [*shared, *(checks(args) if callable(checks) else checks)]:
        if not ok:
            raise UserError(message)
    return args


# ----------------------------------------------------------------------------- datasets (SPEC 1.1)

def _fetch(what, folder, expected, download):
    """Run a torchvision download; if it fails, say which file to put where."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(20)
    try:
        download()
    except Exception as e:
        raise UserError(f"{what} not found and could not be downloaded ({e.__class__.__name__}); "
                        f"put {expected} in {folder}")
    finally:
        socket.setdefaulttimeout(old)


def _read_idx(path):
    """An MNIST-format idx file (optionally .gz) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
            raise ValueError("bad magic number")
        ndim = raw[3]
        shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
        data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if data.size != int(np.prod(shape)):
            raise ValueError("truncated")
        return data.reshape(shape)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"{path} is corrupt or truncated ({e}); delete it and run again to re-download")


_IDX = {  # name: (torchvision class, raw folder, file prefix)
    "mnist": ("MNIST", "MNIST", ""),
    "fmnist": ("FashionMNIST", "FashionMNIST", ""),
    "emnist": ("EMNIST", "EMNIST", "emnist-digits-"),
}


def _load_idx_dataset(name, data_dir):
    cls_name, folder, prefix = _IDX[name]
    raw = os.path.join(data_dir, folder, "raw")
    stems = [f"{prefix}{s}" for s in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]

    def find(stem):
        for ext in ("", ".gz"):
            if os.path.exists(os.path.join(raw, stem + ext)):
                return os.path.join(raw, stem + ext)

    if not all(find(s) for s in stems):
        import torchvision
        kwargs = {"split": "digits"} if name == "emnist" else {}
        _fetch(name, raw, f"{stems[0]}(.gz) and the other three idx files",
               lambda: getattr(torchvision.datasets, cls_name)(data_dir, train=True, download=True, **kwargs))
    xtr, ytr, xte, yte = (_read_idx(find(s)) for s in stems)
    if name == "emnist":  # EMNIST stores images transposed
        xtr, xte = xtr.transpose(0, 2, 1), xte.transpose(0, 2, 1)
    return xtr[:, None], ytr.astype(np.int64), xte[:, None], yte.astype(np.int64)


def _load_cifar(name, data_dir):
    import torchvision
    if name == "cifar10":
        folder, train_files, label_key, cls_name = "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], \
            "labels", "CIFAR10"
    else:
        folder, train_files, label_key, cls_name = "cifar-100-python", ["train"], "fine_labels", "CIFAR100"
    root = os.path.join(data_dir, folder)
    files = train_files + (["test_batch"] if name == "cifar10" else ["test"])
    if not all(os.path.exists(os.path.join(root, f)) for f in files):
        archive = "cifar-10-python.tar.gz" if name == "cifar10" else "cifar-100-python.tar.gz"
        _fetch(name, data_dir, f"{archive} (or its extracted folder {folder}/)",
               lambda: getattr(torchvision.datasets, cls_name)(data_dir, train=True, download=True))

    def read(fname):
        path = os.path.join(root, fname)
        try:
            with open(path, "rb") as f:
                d = pickle.load(f, encoding="latin1")
            x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(d[label_key], dtype=np.int64)
            if len(x) != len(y):
                raise ValueError("image and label counts differ")
            return x, y
        except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as e:
            raise UserError(f"{path} is corrupt or truncated ({e.__class__.__name__}: {e}); delete it and run again")

    train = [read(f) for f in train_files]
    xte, yte = read(files[-1])
    return np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train]), xte, yte


def _load_npz(path):
    try:
        d = np.load(path, allow_pickle=False)
        arrays = {k: d[k] for k in d.files}
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"cannot read {path} ({e.__class__.__name__}); it must be an .npz with arrays x, y")
    for key in ("x", "y"):
        if key not in arrays:
            raise UserError(f"{path} has no array '{key}'; it needs x and y (optionally x_test and y_test)")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise UserError(f"{path} must hold both x_test and y_test, or neither")

    def prep(x, y, what):
        if len(x) != len(y):
            raise UserError(f"{path}: {what} x has {len(x)} rows but y has {len(y)}")
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
            raise UserError(f"{path}: {what} labels y must be non-negative integers")
        if x.ndim == 3:
            x = x[:, None]
        elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
            x = x.transpose(0, 3, 1, 2)  # NHWC -> NCHW
        return np.ascontiguousarray(x), y.astype(np.int64)

    xtr, ytr = prep(arrays["x"], arrays["y"], "train")
    if "x_test" in arrays:
        xte, yte = prep(arrays["x_test"], arrays["y_test"], "test")
    else:
        xte, yte = xtr[:0], ytr[:0]
    return xtr, ytr, xte, yte


SYNTHETIC_ALPHA, SYNTHETIC_BETA, SYNTHETIC_DIM, SYNTHETIC_CLASSES = 1.0, 1.0, 60, 10


def synthetic_clients(num_clients, rng, alpha=SYNTHETIC_ALPHA, beta=SYNTHETIC_BETA):
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, Sec. 5.1), one (x, y) per client.

    u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k, b_k ~ N(u_k, 1); v_k ~ N(B_k, 1);
    x ~ N(v_k, Sigma), Sigma_jj = j^-1.2; y = argmax softmax(W_k x + b_k).
    Sample counts: lognormal(4, 2) + 50 as in the FedProx generator, capped at 1000
    so that the quick start stays fast.
    """
    d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES
    sizes = np.minimum(rng.lognormal(4, 2, num_clients).astype(int) + 50, 1000)
    sigma = np.arange(1, d + 1) ** -1.2
    out = []
    for k in range(num_clients):
        u, big_b = rng.normal(0, math.sqrt(alpha)), rng.normal(0, math.sqrt(beta))
        w, b = rng.normal(u, 1, (c, d)), rng.normal(u, 1, c)
        v = rng.normal(big_b, 1, d)
        x = rng.normal(v, np.sqrt(sigma), (sizes[k], d)).astype(np.float32)
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        out.append((x, y))
    return out


def load_arrays(name, data_dir):
    """(x_train, y_train, x_test, y_test) as numpy arrays for a named dataset or .npz file."""
    if name in _IDX:
        return _load_idx_dataset(name, data_dir)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, data_dir)
    if name in EXTRA_DATASETS:
        return EXTRA_DATASETS[name](data_dir)
    if name.endswith(".npz"):
        if not os.path.exists(name):
            raise UserError(f"no such file: {name}")
        return _load_npz(name)
    raise UserError(f"unknown dataset '{name}'; choose mnist, fmnist, emnist, cifar10, cifar100, "
                    f"{', '.join(EXTRA_DATASETS)}{', ' if EXTRA_DATASETS else ''}synthetic or a .npz file")


EXTRA_DATASETS = {}  # name -> loader(data_dir) returning (x_train, y_train, x_test, y_test)


# ----------------------------------------------------------------------------- datasets: Tiny-ImageNet and AG News (SPEC 1.1)
# Self-contained section: the two loaders registered in EXTRA_DATASETS at its end.

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"  # 248,100,043 bytes
TINY_CACHE = "tiny-imagenet-200-uint8.npz"  # decoded once, then reused (delete it to rebuild)
AGNEWS_URL = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
AGNEWS_MAX_LEN = 200  # tokens per text: cut, or padded with PAD_ID (PFLlib's max_len for FedALA)
AGNEWS_MIN_COUNT = 1  # a training word is in the vocabulary if seen this often; no size cap (torchtext default)
PAD_ID, UNK_ID = 0, 1  # FastText averages over tokens != PAD_ID; UNK_ID is a learned embedding


class ChecksumError(Exception):
    """A downloaded file does not have the published md5."""


def _download(url, path, md5=None):
    """Download ``url`` to ``path`` through a temporary file (no half-written file is left
    behind), checking ``md5`` when given. Network reads time out after 20 s."""
    import hashlib
    import urllib.request
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".download-")
    digest = hashlib.md5()
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=20) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                f.write(chunk)
                digest.update(chunk)
        if md5 and digest.hexdigest() != md5:
            raise ChecksumError(f"md5 of {url} is {digest.hexdigest()}, expected {md5}")
        os.chmod(tmp, 0o644)  # mkstemp makes it private to this user
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _save_npz_atomic(path, **arrays):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # uncompressed: loads in about a second
        os.chmod(tmp, 0o644)  # mkstemp makes it private to this user
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _extract_tiny(archive, data_dir):
    """Unzip ``tiny-imagenet-200.zip`` into ``data_dir`` via a temporary folder, so that a
    half-extracted folder is never mistaken for the dataset."""
    import shutil
    import zipfile
    tmp = tempfile.mkdtemp(dir=data_dir, prefix=".extract-")
    try:
        with zipfile.ZipFile(archive) as z:
            if not {"tiny-imagenet-200/wnids.txt", "tiny-imagenet-200/val/val_annotations.txt"} <= set(z.namelist()):
                raise ValueError("it has no tiny-imagenet-200/wnids.txt and val/val_annotations.txt")
            z.extractall(tmp)  # checks every member's CRC
        if not os.path.isdir(os.path.join(data_dir, "tiny-imagenet-200")):  # else another run extracted it meanwhile
            os.replace(os.path.join(tmp, "tiny-imagenet-200"), os.path.join(data_dir, "tiny-imagenet-200"))
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
        raise UserError(f"{archive} is corrupt, truncated or not the Tiny-ImageNet archive ({e}); "
                        "delete it and run again to re-download")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_rgb64(path):
    """One image file as a 3x64x64 uint8 array (grayscale and CMYK JPEGs converted to RGB)."""
    from PIL import Image
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable image ({e.__class__.__name__}); replace it or re-extract the zip")
    if pixels.shape != (64, 64, 3):
        raise UserError(f"{path} is {pixels.shape[1]}x{pixels.shape[0]}, but Tiny-ImageNet images are 64x64")
    return pixels.transpose(2, 0, 1)


def _decode_tiny(root):
    """The extracted tiny-imagenet-200/ folder as (x_train, y_train, x_val, y_val, wnids).

    Label of a class = its line number in wnids.txt. Train: train/<wnid>/images/*.JPEG.
    Val: the label of val/images/<file> is the wnid on that file's line of
    val/val_annotations.txt (file, wnid, x0, y0, x1, y1; tab-separated), never file order.
    The unlabelled test/ folder is not used.
    """
    def incomplete(path):
        return UserError(f"{path} is missing: {root} is incomplete; delete it (keep the zip) to re-extract")

    def lines(path):
        try:
            with open(path) as f:
                return [line.rstrip("\r\n") for line in f if line.strip()]
        except OSError:
            raise incomplete(path)

    def images_in(folder):
        if not os.path.isdir(folder):
            raise incomplete(folder)
        return sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpeg", ".jpg")))

    wnids = [w.strip() for w in lines(os.path.join(root, "wnids.txt"))]
    label_of = {w: i for i, w in enumerate(wnids)}
    if len(label_of) != len(wnids):
        raise UserError(f"{os.path.join(root, 'wnids.txt')} lists a class twice")
    train_files, train_labels = [], []
    for wnid in wnids:
        folder = os.path.join(root, "train", wnid, "images")
        names = images_in(folder)
        train_files += [os.path.join(folder, n) for n in names]
        train_labels += [label_of[wnid]] * len(names)
    annotations = os.path.join(root, "val", "val_annotations.txt")
    val_files, val_labels = [], []
    for number, line in enumerate(lines(annotations), 1):
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label_of:
            raise UserError(f"{annotations} line {number} is not 'file<TAB>wnid<TAB>box' with a wnid of wnids.txt")
        val_files.append(os.path.join(root, "val", "images", fields[0]))
        val_labels.append(label_of[fields[1]])
    if set(images_in(os.path.join(root, "val", "images"))) != {os.path.basename(f) for f in val_files}:
        raise UserError(f"{annotations} does not label exactly the images in {os.path.join(root, 'val', 'images')}")
    print(f"tinyimagenet: decoding {len(train_files)} train and {len(val_files)} val images once "
          f"(about 0.3 ms each) into {TINY_CACHE}", flush=True)

    def decode(files):
        x = np.empty((len(files), 3, 64, 64), dtype=np.uint8)
        for i, path in enumerate(files):
            x[i] = _read_rgb64(path)
        return x

    return (decode(train_files), np.array(train_labels, dtype=np.int64),
            decode(val_files), np.array(val_labels, dtype=np.int64), np.array(wnids))


def load_tinyimagenet(data_dir):
    """Tiny-ImageNet-200 (Le & Yang 2015): 100k train and 10k val images, 3x64x64 uint8, 200 classes.

    Order of preference: the cache ``<data_dir>/tiny-imagenet-200-uint8.npz``; the extracted
    folder ``<data_dir>/tiny-imagenet-200/``; ``<data_dir>/tiny-imagenet-200.zip``
    (extracted); a download of that zip from cs231n.stanford.edu (md5 checked). The val set is
    the test set (its labels come from val_annotations.txt)."""
    cache = os.path.join(data_dir, TINY_CACHE)
    if os.path.exists(cache):
        try:
            with np.load(cache, allow_pickle=False) as d:
                arrays = tuple(d[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise UserError(f"{cache} is corrupt or truncated ({e.__class__.__name__}); delete it to rebuild it")
        if arrays[0].shape[1:] != (3, 64, 64) or arrays[2].shape[1:] != (3, 64, 64):
            raise UserError(f"{cache} does not hold 3x64x64 images; delete it to rebuild it")
        return arrays
    root = os.path.join(data_dir, "tiny-imagenet-200")
    if not os.path.isdir(root):
        archive = os.path.join(data_dir, "tiny-imagenet-200.zip")
        if not os.path.exists(archive):
            _fetch("tinyimagenet", data_dir, "tiny-imagenet-200.zip (or its extracted folder tiny-imagenet-200/)",
                   lambda: _download(TINY_URL, archive, TINY_MD5))
        _extract_tiny(archive, data_dir)
    x_train, y_train, x_test, y_test, wnids = _decode_tiny(root)
    try:
        _save_npz_atomic(cache, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, wnids=wnids)
    except OSError as e:  # a read-only or full data dir: train anyway, decode again next time
        print(f"tinyimagenet: could not write the cache {cache} ({e.__class__.__name__}: {e})", file=sys.stderr)
    return x_train, y_train, x_test, y_test


_BASIC_ENGLISH = [(r"\'", " '  "), (r"\"", ""), (r"\.", " . "), (r"<br \/>", " "), (r",", " , "), (r"\(", " ( "),
                  (r"\)", " ) "), (r"\!", " ! "), (r"\?", " ? "), (r"\;", " "), (r"\:", " "), (r"\s+", " ")]


def basic_english_tokens(text):
    """torchtext's ``basic_english`` tokeniser (used by PFLlib/FedALA for AG News): lower-case,
    put spaces around ' . , ( ) ! ?, drop double quotes, ; and :, split on whitespace."""
    import re
    text = text.lower()
    for pattern, replacement in _BASIC_ENGLISH:
        text = re.sub(pattern, replacement, text)
    return text.split()


def build_vocab(token_lists, min_count=AGNEWS_MIN_COUNT):
    """word -> id for words seen at least ``min_count`` times, most frequent first (ties in
    alphabetical order, as torchtext's build_vocab_from_iterator); ids start after PAD_ID, UNK_ID."""
    from collections import Counter
    counts = Counter(t for tokens in token_lists for t in tokens)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate(words, start=UNK_ID + 1)}


def encode_tokens(token_lists, vocab, max_len=AGNEWS_MAX_LEN):
    """(N, max_len) int64 ids: the first ``max_len`` tokens, unknown words -> UNK_ID, padded with PAD_ID."""
    x = np.full((len(token_lists), max_len), PAD_ID, dtype=np.int64)
    for row, tokens in enumerate(token_lists):
        ids = [vocab.get(t, UNK_ID) for t in tokens[:max_len]]
        x[row, :len(ids)] = ids
    return x


def _read_agnews_csv(path):
    """Rows "class index","title","description" (no header, class 1-4) -> (title + " " + description, class - 1)."""
    texts, labels = [], []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for number, row in enumerate(csv.reader(f), 1):
                if len(row) < 2 or row[0].strip() not in ("1", "2", "3", "4"):
                    raise ValueError(f"line {number} is not \"class 1-4\",\"title\",\"description\"")
                texts.append(" ".join(row[1:]))
                labels.append(int(row[0]) - 1)
    except (OSError, ValueError, csv.Error) as e:
        raise UserError(f"{path} is corrupt or truncated ({e}); delete it and run again to re-download")
    if not labels:
        raise UserError(f"{path} is empty; delete it and run again to re-download")
    return texts, np.array(labels, dtype=np.int64)


def load_agnews(data_dir):
    """AG News (Zhang et al. 2015): 120k train and 7.6k test news texts, 4 classes, as
    (N, 200) int64 token ids. The vocabulary is built from the training texts only; a test
    word not in it becomes UNK_ID. Files: ``<data_dir>/ag_news_csv/{train,test}.csv``."""
    folder = os.path.join(data_dir, "ag_news_csv")
    paths = [os.path.join(folder, name) for name in ("train.csv", "test.csv")]
    for path in paths:
        if not os.path.exists(path):
            _fetch("agnews", folder, f"train.csv and test.csv (the AG News CSVs at {AGNEWS_URL})",
                   lambda: _download(AGNEWS_URL + os.path.basename(path), path))
    (train_texts, y_train), (test_texts, y_test) = (_read_agnews_csv(p) for p in paths)
    train_tokens = [basic_english_tokens(t) for t in train_texts]
    vocab = build_vocab(train_tokens)
    return (encode_tokens(train_tokens, vocab), y_train,
            encode_tokens([basic_english_tokens(t) for t in test_texts], vocab), y_test)


EXTRA_DATASETS.update(tinyimagenet=load_tinyimagenet, agnews=load_agnews)
# ----------------------------------------------------------------------------- end of Tiny-ImageNet and AG News


def to_tensor(x, reference=None):
    """uint8 images -> float32 normalised per channel with the statistics of ``reference``.
    Statistics are accumulated in chunks and the conversion is in place, so the peak memory
    is one float32 copy of ``x`` (Tiny-ImageNet: 5.4 GB rather than four times that)."""
    if x.dtype == np.uint8 and x.ndim == 4:
        ref = torch.from_numpy(reference if reference is not None else x)
        total = torch.zeros(2, ref.shape[1], dtype=torch.float64)
        for start in range(0, len(ref), 4096):
            chunk = ref[start: start + 4096].double() / 255
            total += torch.stack([chunk.sum((0, 2, 3)), chunk.square().sum((0, 2, 3))])
        count = ref.numel() / ref.shape[1]
        mean = total[0] / count
        std = (total[1] / count - mean ** 2).clamp_min(0).sqrt() + 1e-8
        shape = (1, -1, 1, 1)
        return torch.from_numpy(x).float().div_(255).sub_(mean.float().view(shape)).div_(std.float().view(shape))
    if np.issubdtype(x.dtype, np.integer):
        return torch.from_numpy(x.astype(np.int64))  # token ids
    return torch.from_numpy(x.astype(np.float32))


@dataclass
class FedData:
    """All samples in ``x``/``y`` on one device; clients are index tensors into them."""
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    train_idx: list
    test_idx: list
    global_test_idx: torch.Tensor = None  # --test-split global: the uniform official test set
    train_counts: np.ndarray = None  # (clients, classes)
    test_counts: np.ndarray = None
    vocab_size: int = 0
    info: dict = field(default_factory=dict)

    @property
    def num_clients(self):
        return len(self.train_idx)

    def train_sizes(self):
        return np.array([len(i) for i in self.train_idx])


def default_classes_per_client(partition, num_classes):
    if partition == "pat":
        return {100: 10, 200: 20}.get(num_classes, 2)
    if partition == "pfedla1":
        return 12 if num_classes >= 100 else 4
    return 6 if num_classes >= 100 else 2  # pfedla2: dominant classes


def partition(labels, args, rng, num_classes, min_size):
    cpc = args.classes_per_client or default_classes_per_client(args.partition, num_classes)
    if args.partition in ("pat", "pfedla1") and cpc > num_classes:
        raise UserError(f"--classes-per-client {cpc} is more than the {num_classes} classes of {args.dataset}")
    if args.partition == "iid":
        return dp.iid(labels, args.num_clients, rng)
    if args.partition == "pat":
        return dp.pathological(labels, args.num_clients, rng, cpc, balance=args.balance)
    if args.partition == "dir":
        return dp.dirichlet(labels, args.num_clients, rng, args.beta, min_size=min_size)
    if args.partition == "pfedla1":
        return dp.pfedla1(labels, args.num_clients, rng, cpc)
    return dp.pfedla2(labels, args.num_clients, rng, dominant_classes=min(cpc, num_classes - 1))


def load_federated_data(args, device):
    """Load the dataset, partition it over clients (SPEC 1.2-1.3) and move it to ``device`` once."""
    rng = np.random.default_rng([args.seed, 0])  # data and partition: independent of training randomness
    if args.dataset == "synthetic":
        clients = synthetic_clients(args.num_clients, rng)
        x = np.concatenate([c[0] for c in clients])
        y = np.concatenate([c[1] for c in clients])
        starts = np.cumsum([0] + [len(c[1]) for c in clients])
        client_idx = [np.arange(starts[k], starts[k + 1]) for k in range(args.num_clients)]
        train, test = dp.train_test_split(client_idx, rng, args.train_ratio)
        num_classes = SYNTHETIC_CLASSES
        # no official test set: under 'global' the union of the clients' test data stands in for it
        global_test = np.concatenate(test) if args.test_split == "global" else None
    else:
        xtr, ytr, xte, yte = load_arrays(args.dataset, args.data_dir)
        num_classes = int(max(ytr.max(), yte.max() if len(yte) else 0)) + 1
        x = np.concatenate([xtr, xte]) if len(xte) else xtr
        y = np.concatenate([ytr, yte])
        if args.test_split == "client":
            if args.num_clients > len(y):
                raise UserError(f"{args.num_clients} clients but only {len(y)} samples; use fewer --num-clients")
            min_size = math.ceil(args.batch_size / args.train_ratio) + 1
            train, test = dp.train_test_split(partition(y, args, rng, num_classes, min_size), rng, args.train_ratio)
            global_test = None
        else:
            if not len(yte):
                raise UserError(f"--test-split global needs a test set; {args.dataset} has none (add x_test, y_test)")
            train = partition(ytr, args, rng, num_classes, args.batch_size)
            test = [t + len(ytr) for t in dp.proportional_test_sets([ytr[i] for i in train], yte, rng, num_classes)]
            global_test = np.arange(len(ytr), len(y))
        x = to_tensor(x, reference=xtr if args.dataset != "synthetic" else None)
    if args.dataset == "synthetic":
        x = to_tensor(x)
    if min(len(t) for t in train) == 0:
        raise UserError("a client received no training data; use fewer --num-clients or another partition")
    on = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64)).to(device)
    x = x.to(device)
    if x.dim() == 4:  # channels-last images: faster convolutions and pooling (index batches keep the layout)
        x = x.contiguous(memory_format=torch.channels_last)
    data = FedData(
        x=x, y=torch.from_numpy(y).to(device), num_classes=num_classes,
        train_idx=[on(t) for t in train], test_idx=[on(t) for t in test],
        global_test_idx=None if global_test is None else on(global_test),
        train_counts=dp.class_counts(y, train, num_classes), test_counts=dp.class_counts(y, test, num_classes),
        vocab_size=int(x.max()) + 1 if not x.is_floating_point() else 0)
    return data


# ----------------------------------------------------------------------------- models

def _pooled_side(size, convs=2):
    for _ in range(convs):
        size = (size - 4) // 2  # conv5x5 (no padding) then maxpool 2
    return size


class CNN(nn.Module):
    """FedAvg's 4-layer CNN (McMahan et al. 2017) as used by FedALA / PFLlib."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * _pooled_side(image_size) ** 2, 512)  # 1024 / 1600 / 10816 for 28 / 32 / 64
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(F.relu(self.fc1(x.flatten(1))))


class LeNet(nn.Module):
    """LeNet-5 of pFedLA; BatchNorm after each conv for colour inputs only."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        bn = in_channels == 3
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.bn1 = nn.BatchNorm2d(6) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16) if bn else nn.Identity()
        self.fc1 = nn.Linear(16 * _pooled_side(image_size) ** 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class SimpleCNN(nn.Module):
    """The "simple CNN" of FedRoD / FedNH used by FedACD."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.fc1 = nn.Linear(64 * _pooled_side(image_size) ** 2, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class MLP(nn.Module):
    """fc(d, 64) ReLU fc(64, classes), for vector data (synthetic, user npz of vectors)."""

    def __init__(self, in_features, num_classes, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(F.relu(self.fc1(x.flatten(1))))


class FastText(nn.Module):
    """Embedding(vocab, 32), mean over the non-padding tokens (id 0 pads), fc(32, 32), fc(32, classes)."""

    def __init__(self, vocab_size, num_classes, embed_dim=32, hidden=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        mask = (tokens != 0).unsqueeze(-1).float()
        mean = (self.embedding(tokens) * mask).sum(1) / mask.sum(1).clamp_min(1)
        return self.fc(self.fc1(mean))


MODELS = ["cnn", "lenet", "simplecnn", "resnet18", "resnet34", "mlp", "fasttext"]


def build_model(name, data, auto_image="cnn"):
    """The model ``name`` for ``data``; ``auto`` picks ``auto_image`` for images, mlp for vectors,
    fasttext for token ids."""
    x = data.x
    if name == "auto":
        name = "fasttext" if not x.is_floating_point() else ("mlp" if x.dim() == 2 else auto_image)
    if name not in MODELS:
        raise UserError(f"unknown model '{name}'; choose auto, {', '.join(MODELS)}")
    k = data.num_classes
    if name == "mlp":
        return MLP(int(np.prod(x.shape[1:])), k)
    if name == "fasttext":
        if x.is_floating_point():
            raise UserError("--model fasttext needs token-id data (e.g. --dataset agnews)")
        return FastText(data.vocab_size, k)
    if x.dim() != 4:
        raise UserError(f"--model {name} needs image data (N, C, H, W); {data.info.get('name', 'this dataset')} "
                        f"has shape {tuple(x.shape[1:])}; use --model mlp")
    channels, size = x.shape[1], x.shape[2]
    if name in ("cnn", "lenet", "simplecnn") and _pooled_side(size) < 1:
        raise UserError(f"--model {name} needs images of at least 16x16, got {size}x{size}")
    if name == "cnn":
        return CNN(channels, k, size)
    if name == "lenet":
        return LeNet(channels, k, size)
    if name == "simplecnn":
        return SimpleCNN(channels, k, size)
    import torchvision
    model = getattr(torchvision.models, name)(weights=None, num_classes=k)
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model


def layers(model):
    """Modules that own parameters, in registration (= forward) order: the "layers" that FedALA's
    p and pFedLA's layer-wise weights count."""
    return [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]


def layer_state_keys(model):
    """For each layer, the state_dict keys of its own parameters and buffers (weight and bias
    move together; BatchNorm's running statistics travel with their layer)."""
    out = []
    for name, m in layers(model):
        prefix = f"{name}." if name else ""
        own = [k for k, _ in m.named_parameters(recurse=False)] + [k for k, _ in m.named_buffers(recurse=False)]
        out.append([prefix + k for k in own])
    return out


# ----------------------------------------------------------------------------- flat model state

def float_state(model):
    """The model's floating-point parameters and buffers, in state_dict order (views, not copies)."""
    return [v for v in model.state_dict().values() if v.is_floating_point()]


def flatten_state(model, out=None):
    """All floating-point parameters and buffers as one vector (written into ``out`` if given)."""
    return torch.cat([v.reshape(-1) for v in float_state(model)], out=out)


def load_flat_state(model, flat):
    """Inverse of ``flatten_state``: copy ``flat`` into the model in place. Integer buffers
    (BatchNorm's num_batches_tracked) are left as they are: they are not averaged."""
    offset = 0
    with torch.no_grad():
        for v in float_state(model):
            v.copy_(flat[offset: offset + v.numel()].view_as(v))
            offset += v.numel()


def weighted_average(stacked, weights):
    """FedAvg's aggregation: sum_k w_k theta_k / sum_k w_k over rows of ``stacked`` (K x D)."""
    weights = torch.as_tensor(weights, dtype=stacked.dtype, device=stacked.device)
    return (weights / weights.sum()) @ stacked


def state_bytes(model):
    return sum(v.numel() * v.element_size() for v in model.state_dict().values())


# ----------------------------------------------------------------------------- training and evaluation

def resolve_device(name):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device '{name}'; use auto, cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but no CUDA GPU is available; use --device cpu")
    return device


def seed_everything(seed):
    """Seed torch (model initialisation) and return the numpy generator that samples clients and
    draws the algorithms' own randomness; the data partition has its own stream (seed, 0)."""
    torch.manual_seed(seed)
    return np.random.default_rng([seed, 1])


def sample_clients(rng, num_clients, join_ratio):
    """round(join_ratio * N) clients (at least 1), without replacement, in increasing order."""
    k = max(1, int(round(join_ratio * num_clients)))
    return sorted(int(c) for c in rng.choice(num_clients, k, replace=False))


def client_seed(seed, round_, client, tag=0):
    """A seed for one client in one round, independent across (round, client, tag)."""
    return int(np.random.SeedSequence([seed, round_, client, tag]).generate_state(1)[0])


def batch_bounds(n, batch_size):
    """(start, end) of each minibatch of n samples; the last partial batch is kept, but a last
    batch of a single sample joins the batch before it (BatchNorm cannot train on one)."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def epoch_batches(idx, batch_size, epochs, seed):
    """Index batches: ``epochs`` passes over ``idx``, reshuffled each epoch (``batch_bounds``)."""
    g = torch.Generator().manual_seed(seed)
    bounds = batch_bounds(len(idx), batch_size)
    for _ in range(epochs):
        perm = idx[torch.randperm(len(idx), generator=g).to(idx.device, non_blocking=True)]
        for start, end in bounds:
            yield perm[start:end]


def make_optimizer(model, args):
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


def local_train(model, data, idx, args, seed, epochs=None):
    """Minibatch SGD with cross-entropy on the client's train indices. Returns the mean training
    loss as a 0-dim tensor (no host sync inside the loop)."""
    model.train()
    optimizer = make_optimizer(model, args)
    total = torch.zeros((), device=data.x.device)
    steps = 0
    for batch in epoch_batches(idx, args.batch_size, epochs or args.local_epochs, seed):
        loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach()
        steps += 1
    return total / max(steps, 1)


class ClientPool:
    """The reusable models that run a round's client updates, and ``map`` over the clients.

    ``--parallel-clients`` models (auto: one per torch thread on a CPU, where a small batch
    leaves most cores idle; one on a GPU). With one model the clients run one after another on
    all torch threads. With several, that many clients run at once on threads, one torch thread
    each, the largest clients first so the threads finish together. Client updates are
    independent, so results do not depend on the schedule, only on whether each client ran on
    one torch thread or on all of them. No model is built or copied per client."""

    def __init__(self, models, client_sizes):
        self.models, self.client_sizes = models, client_sizes

    @classmethod
    def build(cls, args, build_model, device, data):
        """A pool of ``--parallel-clients`` models made by ``build_model``, for ``data``'s clients."""
        n = args.parallel_clients
        if n == "auto":
            n = torch.get_num_threads() if device.type == "cpu" else 1
        clients_per_round = max(1, round(args.join_ratio * args.num_clients))
        return cls([build_model().to(device) for _ in range(max(1, min(n, clients_per_round)))],
                   [len(i) for i in data.train_idx])

    def __len__(self):
        return len(self.models)

    def map(self, client_update, clients):
        """``[client_update(model, client) for client in clients]``, each call given a free model."""
        if len(self.models) == 1:
            return [client_update(self.models[0], client) for client in clients]
        from concurrent.futures import ThreadPoolExecutor
        free = queue.SimpleQueue()
        for model in self.models:
            free.put(model)

        def run(client):
            model = free.get()
            try:
                return client_update(model, client)
            finally:
                free.put(model)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(len(self.models)) as executor:
                futures = {client: executor.submit(run, client)
                           for client in sorted(clients, key=lambda c: -self.client_sizes[c])}
                return [futures[client].result() for client in clients]
        finally:
            torch.set_num_threads(threads)


def check_finite(loss, round_, client):
    """One host sync per client: stop the run when training diverged (the data was checked to be
    finite when loaded, so the step size is to blame)."""
    value = float(loss)
    if not math.isfinite(value):
        raise DivergedError(f"training loss became {value} in round {round_} on client {client}; "
                            "lower --lr (metrics so far are in the run folder)")
    return value


@torch.no_grad()
def evaluate(model, data, idx_list, batch_size=2048):
    """Per-client (correct, count, summed loss) of ``model`` on each index tensor in ``idx_list``,
    as tensors on the data's device; all clients go through the model in large batches."""
    was_training = model.training
    model.eval()
    device = data.x.device
    sizes = torch.tensor([len(i) for i in idx_list], device=device)
    owner = torch.repeat_interleave(torch.arange(len(idx_list), device=device), sizes)
    all_idx = torch.cat(list(idx_list)) if len(idx_list) else torch.zeros(0, dtype=torch.long, device=device)
    correct = torch.zeros(len(all_idx), device=device)
    losses = torch.zeros(len(all_idx), device=device)
    for start in range(0, len(all_idx), batch_size):
        batch = all_idx[start: start + batch_size]
        logits = model(data.x[batch])
        correct[start: start + len(batch)] = (logits.argmax(1) == data.y[batch]).float()
        losses[start: start + len(batch)] = F.cross_entropy(logits, data.y[batch], reduction="none")
    model.train(was_training)
    zeros = torch.zeros(len(idx_list), device=device)
    return zeros.index_add(0, owner, correct), sizes.float(), zeros.index_add(0, owner, losses)


def accuracy_metrics(correct, count, loss_sum, prefix="test"):
    """Pooled accuracy (sum correct / sum samples, the PFLlib number), the unweighted mean and
    std of per-client accuracies (clients with test data), and the mean test loss; in percent."""
    correct, count, loss_sum = (t.detach().double().cpu().numpy() for t in (correct, count, loss_sum))
    has = count > 0
    per_client = correct[has] / count[has]
    return {f"{prefix}_acc": 100 * correct.sum() / max(count.sum(), 1),
            f"{prefix}_acc_mean": 100 * per_client.mean() if has.any() else float("nan"),
            f"{prefix}_acc_std": 100 * per_client.std() if has.any() else float("nan"),
            f"{prefix}_loss": loss_sum.sum() / max(count.sum(), 1)}


def evaluate_global(model, data):
    """One model (the global one) on every client's test data (test_acc pooled, test_acc_mean and
    std over clients) and, under --test-split global, on the uniform test set (global_acc,
    global_loss; a single test set has no client mean or spread)."""
    metrics = accuracy_metrics(*evaluate(model, data, data.test_idx))
    if data.global_test_idx is not None:
        uniform = accuracy_metrics(*evaluate(model, data, [data.global_test_idx]), prefix="global")
        metrics.update(global_acc=uniform["global_acc"], global_loss=uniform["global_loss"])
    return metrics


# ----------------------------------------------------------------------------- run folder

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path, content):
    """Write ``content`` (str, bytes, or a function that writes to a binary file) to ``path``
    through a temporary file and a rename: a reader never sees half a file. The file gets the
    user's umask (mkstemp alone would make it private)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _json(obj):
    return json.dumps(obj, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def current_host_mb():
    """Resident memory of this process now, in MB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return 0.0


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _lock(folder):
    """Create the run folder's lock file: one process per run folder. A lock whose process is gone
    (killed, crashed; a zombie counts as gone) is stale and taken over."""
    path = os.path.join(folder, ".lock")
    for _ in range(3):
        try:
            with open(path, "x") as f:
                f.write(f"{os.getpid()} {socket.gethostname()}\n")
            return path
        except FileExistsError:
            pid, host, alive = "?", "?", True
            try:
                with open(path) as f:
                    pid, host = f.read().split()
                os.kill(int(pid), 0)
                with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:  # Linux: not a zombie
                    alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (ProcessLookupError, FileNotFoundError):
                alive = False
            except (OSError, ValueError):  # another user's process, or a lock being written right now
                pass
            if alive or host != socket.gethostname():
                raise UserError(f"{folder} is in use by process {pid} on {host}; wait for it to end "
                                f"(or delete {path} if that process is gone)")
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        except OSError as e:
            raise UserError(f"cannot write in the run folder {folder} ({e.strerror})")
    raise UserError(f"cannot take the lock {path}; delete it if no run is using {folder}")


_OPEN_RUNS = []


def close_runs(failed, diverged=False):
    """Release every run folder of this process (``run_main`` calls it on the way out)."""
    for run in list(_OPEN_RUNS):
        run.close(failed, diverged)


class Run:
    """The run folder and the bookkeeping around the training loop (not the algorithm).

    Creates ``--out/<algo>-<dataset>-s<seed>-<time>/`` (or takes ``--resume RUN_DIR``), locks
    it, writes config.json and partition.json; then records evaluations (metrics.csv),
    checkpoints (checkpoint.pt: tensors and plain containers only) and the summary. Build it
    once set-up has succeeded: a run that fails before its first round leaves no folder.
    The first Ctrl-C asks the loop to stop at the end of the round (``stop_requested``)."""

    def __init__(self, algo, args, data, device, headline, headline_metric="test_acc", script=None):
        self.algo, self.args, self.data, self.device = algo, args, data, device
        self.headline, self.headline_metric, self.script = headline, headline_metric, script or algo
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = [], 0, 0, 0.0
        self.created, self.interrupted, self.finished = False, False, False
        self.dir = args.resume or self._new_dir()
        if args.resume:
            self.lock = _lock(self.dir)
        _OPEN_RUNS.append(self)
        if not args.resume:  # a resumed run keeps its record (resume() updates --rounds)
            atomic_write(os.path.join(self.dir, "config.json"), _json({
                "algorithm": algo, "script": self.script, "args": {**vars(args), "resume": None, "stop_after": None},
                "command": sys.argv, "device": str(device), "device_name": torch.cuda.get_device_name(device)
                if device.type == "cuda" else platform.processor() or platform.machine(),
                "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
                "num_classes": data.num_classes, "input_shape": list(data.x.shape[1:])}))
        self._write_partition()
        self._t_last, self._last_round = time.perf_counter(), 0
        try:
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread: Ctrl-C keeps its default
            self._previous_handler = None

    def _new_dir(self):
        name = os.path.basename(self.args.dataset).replace(".npz", "")
        base = os.path.join(self.args.out, f"{self.algo}-{name}-s{self.args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        path, n = base, 1
        while True:
            try:
                os.makedirs(path)  # never an existing folder: never overwrite an earlier run
                break
            except FileExistsError:
                if not os.path.isdir(os.path.dirname(path) or "."):
                    raise UserError(f"--out {self.args.out} is not a folder")
                path, n = f"{base}-{n}", n + 1
            except OSError as e:
                raise UserError(f"cannot create a run folder under --out {self.args.out} ({e.strerror})")
        self.created = True
        self.lock = _lock(path)
        return path

    def _on_sigint(self, signum, frame):
        if self.interrupted:  # the second Ctrl-C stops at once
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.interrupted = True
        print(f"\n[{self.algo}] Ctrl-C: stopping at the end of this round (Ctrl-C again stops at once)",
              file=sys.stderr, flush=True)

    def _write_partition(self):
        d = self.data
        if not self.args.resume:
            atomic_write(os.path.join(self.dir, "partition.json"), _json({
                "train_class_counts": d.train_counts, "test_class_counts": d.test_counts,
                "train_sizes": d.train_counts.sum(1), "test_sizes": d.test_counts.sum(1),
                "global_test_size": 0 if d.global_test_idx is None else len(d.global_test_idx)}))
        n = d.num_clients
        print(f"[{self.algo}] {self.args.dataset}: {n} clients, {d.num_classes} classes, "
              f"input {tuple(d.x.shape[1:])}, device {self.device}, run folder {self.dir}")
        for i in range(min(n, 20)):
            nz = {c: int(v) for c, v in enumerate(d.train_counts[i]) if v}
            classes = nz if len(nz) <= 12 else f"{len(nz)} classes (see partition.json)"
            print(f"  client {i:3d}: train {int(d.train_counts[i].sum()):6d} test {int(d.test_counts[i].sum()):6d}"
                  f"  {classes}")
        if n > 20:
            print(f"  ... {n - 20} more clients in partition.json")

    def add_bytes(self, down, up):
        self.bytes_down += int(down)
        self.bytes_up += int(up)

    def should_eval(self, round_):
        return round_ % self.args.eval_every == 0 or round_ == self.args.rounds

    def log(self, round_, metrics):
        """Record one evaluation: a row in metrics.csv (rewritten atomically) and a progress line."""
        now = time.perf_counter()
        self.elapsed += now - self._t_last
        per_round = (now - self._t_last) / max(round_ - self._last_round, 1)
        self._t_last, self._last_round = now, round_

        def plain(v):  # checkpoints hold plain numbers only
            if isinstance(v, (bool, int, np.integer)):
                return int(v)
            return round(float(v), 6) if isinstance(v, (float, np.floating, torch.Tensor)) else str(v)

        row = {"round": round_, **{k: plain(v) for k, v in metrics.items()},
               "seconds": round(self.elapsed, 3), "sec_per_round": round(per_round, 4),
               "mb_down": round(self.bytes_down / 2 ** 20, 3), "mb_up": round(self.bytes_up / 2 ** 20, 3),
               "host_mb": round(current_host_mb(), 1)}
        if self.device.type == "cuda":
            row["device_mb"] = round(torch.cuda.memory_allocated(self.device) / 2 ** 20, 1)
        self.rows.append(row)
        self._write_metrics()
        eta = per_round * (self.args.rounds - round_)
        extra = f" (client mean {metrics['test_acc_mean']:.2f} ± {metrics['test_acc_std']:.2f})" \
            if "test_acc_mean" in metrics else ""
        loss = f" | train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        if "global_acc" in metrics:  # --test-split global: the uniform test set
            extra += f" | global test acc {metrics['global_acc']:.2f}%"
        print(f"[{self.algo}] round {round_}/{self.args.rounds} | test acc {metrics.get('test_acc', float('nan')):.2f}%"
              f"{extra}{loss} | {per_round:.3f} s/round | ETA {_fmt_time(eta)}", flush=True)

    def _write_metrics(self):
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        with_header = [keys] + [[r.get(k, "") for k in keys] for r in self.rows]
        atomic_write(os.path.join(self.dir, "metrics.csv"), "".join(",".join(map(str, r)) + "\n" for r in with_header))

    # -- checkpoints, stopping and resuming

    def stop_requested(self, round_):
        """After a Ctrl-C, or at ``--stop-after`` (tests: a run killed after that round, so no
        extra checkpoint is written for it)."""
        return self.interrupted or (self.args.stop_after is not None and round_ >= self.args.stop_after)

    def checkpoint(self, round_, state, rng):
        """Every ``--checkpoint-every`` rounds, at the last round and before a requested stop:
        the algorithm ``state`` (modules and objects by their state_dict, tensors as they are),
        every RNG state and the metrics so far, as tensors and plain containers."""
        if not (round_ % self.args.checkpoint_every == 0 or round_ == self.args.rounds or self.interrupted):
            return
        blob = {"algorithm": self.algo, "round": round_, "rows": self.rows,
                "bytes": [self.bytes_down, self.bytes_up],
                "elapsed": self.elapsed + time.perf_counter() - self._t_last,
                "state": {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()},
                "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        atomic_write(os.path.join(self.dir, "checkpoint.pt"), lambda f: torch.save(blob, f))

    def stop(self, round_):
        """Report a requested stop after ``round_`` (checkpoint written) and return the exit status."""
        command = f"python {self.script}.py --resume {self.dir}"
        if self.interrupted:
            print(f"interrupted after round {round_}; continue with: {command}", file=sys.stderr, flush=True)
            return 130
        print(f"[{self.algo}] stopping after round {round_} (--stop-after); continue with: {command}")
        self.close()
        sys.exit(0)  # as if killed here

    def resume(self, state, rng):
        """With ``--resume``: load the checkpoint into ``state`` in place (modules and objects by
        load_state_dict, tensors by copy) and into ``rng``, and return the first round to run;
        else return 1. Only tensors and plain containers are read (weights_only): a crafted
        file cannot run code."""
        if not self.args.resume:
            return 1
        path = os.path.join(self.dir, "checkpoint.pt")
        if not os.path.exists(path):
            raise UserError(f"cannot resume: {self.dir} has no checkpoint.pt (the run stopped before its first "
                            "checkpoint; start it again)")
        try:
            blob = torch.load(path, map_location=self.device, weights_only=True)
            if set(blob["state"]) != set(state) or blob["algorithm"] != self.algo:
                raise ValueError("it holds another algorithm's state")
            for k, v in blob["state"].items():
                if hasattr(state[k], "load_state_dict"):
                    state[k].load_state_dict(v)
                elif isinstance(state[k], torch.Tensor) and isinstance(v, torch.Tensor) and v.shape == state[k].shape:
                    state[k].copy_(v)
                else:
                    raise ValueError(f"entry {k} does not fit this run")
            rows, (down, up), elapsed, round_ = list(blob["rows"]), blob["bytes"], float(blob["elapsed"]), blob["round"]
            if not (isinstance(round_, int) and round_ >= 1 and all(isinstance(r, dict) for r in rows)):
                raise ValueError("bad round or metrics")
            rng.bit_generator.state = blob["rng"]
            torch.set_rng_state(blob["torch_rng"].cpu())
            if blob["cuda_rng"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([s.cpu() for s in blob["cuda_rng"]])
        except Exception as e:  # noqa: BLE001  anything wrong with the file is the same answer
            message = str(e).splitlines()[0][:150] if str(e) else e.__class__.__name__
            raise UserError(f"cannot resume: {path} is not a valid checkpoint of this run ({message})")
        if round_ > self.args.rounds:
            raise UserError(f"cannot resume: the run already has {round_} rounds; --rounds {self.args.rounds} "
                            f"must be at least that")
        config_path = os.path.join(self.dir, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        if config["args"]["rounds"] != self.args.rounds:
            config["args"]["rounds"] = self.args.rounds
            atomic_write(config_path, _json(config))
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = rows, int(down), int(up), elapsed
        self._write_metrics()  # drop rows logged after the checkpoint: they will be recomputed
        self._last_round = round_
        print(f"[{self.algo}] resumed {self.dir} after round {round_}")
        return round_ + 1

    def summary(self, extra=None, status="finished"):
        """best, final and mean of the last 10 evaluations of every accuracy column, and which of
        them the paper reports (``headline_metric``)."""
        summary = {"algorithm": self.algo, "status": status, "rounds": self.args.rounds,
                   "rounds_done": self.rows[-1]["round"] if self.rows else 0,
                   "headline_metric": self.headline_metric, "paper_reports": self.headline,
                   "seconds": round(self.elapsed, 2), "mb_down": self.bytes_down / 2 ** 20,
                   "mb_up": self.bytes_up / 2 ** 20,
                   "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KB
                   "peak_device_mb": (torch.cuda.max_memory_allocated(self.device) / 2 ** 20
                                      if self.device.type == "cuda" else None), **(extra or {})}
        for key in [k for k in self.rows[0] if "acc" in k and not k.endswith("_std")] if self.rows else []:
            values = np.array([float(r[key]) for r in self.rows if r.get(key, "") != ""])
            summary[key] = {"best": float(values.max()), "final": float(values[-1]),
                            "last10_mean": float(values[-10:].mean())}
        atomic_write(os.path.join(self.dir, "summary.json"), _json(summary))
        return summary

    def finish(self, extra=None):
        """Write summary.json and print it."""
        summary = self.summary(extra)
        self.finished = True
        print(f"[{self.algo}] summary ({self.headline} is what the paper reports):")
        for key, v in summary.items():
            if isinstance(v, dict) and {"best", "final", "last10_mean"} <= set(v):
                print(f"  {key:>22s}: best {v['best']:.2f}  final {v['final']:.2f}  "
                      f"last-10 mean {v['last10_mean']:.2f}")
        print(f"  {self.elapsed:.1f} s, {summary['mb_down']:.1f} MB down, {summary['mb_up']:.1f} MB up; "
              f"files in {self.dir}")
        return summary

    def close(self, failed=False, diverged=False):
        """Release the folder: a new run that failed before writing any result leaves nothing behind;
        a run that stopped with results keeps them (a diverged one says so in summary.json)."""
        if self not in _OPEN_RUNS:
            return
        _OPEN_RUNS.remove(self)
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
        if failed and self.created and not self.rows and not os.path.exists(os.path.join(self.dir, "checkpoint.pt")):
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        if diverged and self.rows and not self.finished:
            self.summary(status="diverged")
        try:
            os.remove(self.lock)
        except OSError:
            pass


atexit.register(close_runs, failed=False)
