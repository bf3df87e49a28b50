"""The data path, top to bottom: a --dataset name, .npz file or PFLlib folder becomes the clients' tensors: FedProx's
Synthetic(alpha, beta), a user's .npz file, the checks every dataset passes, ``load_arrays`` over the named datasets and
.npz files, the tensors, the partition over clients (data_partition.py) and ``load_federated_data``, which does it all
for a script's ``args`` (through common.py, docs/layout.md). Other people's formats are read in data_formats.py."""
import math
import os
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np
import torch

import data_partition as dp
from data_formats import (LOADERS, MAX_FEATURE, VISION, check_fits, first_few, is_pfllib_folder, load_agnews,
                          load_pfllib_folder, load_vision, pfllib_partition, read_pfllib_config, stack_clients)
from data_formats import PFLLIB_RESPLIT_FLAGS, memory_available  # noqa: F401  common.py and fedpake.py read them here
from exits import UserError, check_regular, quoted


# ----------------------------------------------------------------------------- FedProx's Synthetic(alpha, beta)

SYNTHETIC_ALPHA, SYNTHETIC_BETA, SYNTHETIC_DIM, SYNTHETIC_CLASSES = 1.0, 1.0, 60, 10
SYNTHETIC_HELP = "synthetic (= synthetic(1,1)), synthetic(ALPHA,BETA) with numbers >= 0, or synthetic(iid)"


def synthetic_setting(name):
    """The FedProx family behind a dataset name: (alpha, beta, iid) for ``synthetic``, ``synthetic(ALPHA,BETA)`` or
    ``synthetic(iid)``; None for any other name. A malformed ``synthetic(...)`` raises UserError."""
    if name == "synthetic":
        return SYNTHETIC_ALPHA, SYNTHETIC_BETA, False
    if not name.startswith("synthetic("):
        return None
    inside = name[len("synthetic("):].removesuffix(")").replace(" ", "")
    if name.endswith(")") and inside == "iid":
        return 0.0, 0.0, True
    with suppress(ValueError):  # not two numbers
        alpha, beta = (float(v) for v in inside.split(","))
        if name.endswith(")") and all(math.isfinite(v) and 0 <= v <= 1e6 for v in (alpha, beta)):
            return alpha, beta, False
    raise UserError(f"unknown synthetic dataset '{name}'; use {SYNTHETIC_HELP}")


def synthetic_clients(num_clients, rng, alpha=SYNTHETIC_ALPHA, beta=SYNTHETIC_BETA, iid=False):
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, Sec. 5.1), one (x, y) per client: u_k ~ N(0, alpha),
    B_k ~ N(0, beta); W_k, b_k ~ N(u_k, 1); v_k ~ N(B_k, 1); x ~ N(v_k, Sigma), Sigma_jj = j^-1.2;
    y = argmax softmax(W_k x + b_k): alpha sets how much the local models differ, beta the local inputs.
    Synthetic IID (``iid``): one W, b ~ N(0, 1) for all clients and x ~ N(0, Sigma) everywhere. Sample counts:
    lognormal(4, 2) + 50 as in the FedProx generator, capped at 1000 so that the quick start stays fast."""
    d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES
    sizes = np.minimum(rng.lognormal(4, 2, num_clients).astype(int) + 50, 1000)
    sigma = np.arange(1, d + 1) ** -1.2
    if iid:
        w, b, v = rng.normal(0, 1, (c, d)), rng.normal(0, 1, c), np.zeros(d)
    out = []
    for k in range(num_clients):
        if not iid:
            u, big_b = rng.normal(0, math.sqrt(alpha)), rng.normal(0, math.sqrt(beta))
            w, b, v = rng.normal(u, 1, (c, d)), rng.normal(u, 1, c), rng.normal(big_b, 1, d)
        x = rng.normal(v, np.sqrt(sigma), (sizes[k], d)).astype(np.float32)
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        out.append((x, y))
    return out


# ----------------------------------------------------------------------------- .npz files; checks of every dataset

def load_npz(path):
    """(x, y, x_test, y_test) of a user's .npz (docs/datasets.md): images (N, H, W) become (N, 1, H, W) and NHWC
    becomes NCHW; without x_test and y_test the test set is empty. Other arrays in the file are not read."""
    arrays = {}
    try:
        with np.load(path, allow_pickle=False) as d:  # no pickles: nothing in the file can run code
            keys, declared = [k for k in ("x", "y", "x_test", "y_test") if k in d.files], 0
            for key in keys:  # the bytes the headers declare, read before any array (they may declare terabytes)
                with d.zip.open(f"{key}.npy") as f:
                    read = np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(f) == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(f, max_header_size=100000)
                declared += math.prod(shape) * dtype.itemsize
            check_fits(f"{quoted(path)}: its arrays", declared)
            for key in keys:
                try:
                    arrays[key] = d[key]
                except ValueError as e:
                    if "Object arrays" not in str(e):
                        raise
                    raise UserError(f"{path}: '{key}' is an array of Python objects (dtype object); store numbers")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  truncated, empty, not a zip, no permission
        if isinstance(e, OSError) and e.strerror:  # the file may well be a good .npz: say why it cannot be read
            raise UserError(f"cannot read {path}: {e.strerror}")
        raise UserError(f"cannot read {path} ({e.__class__.__name__}); it must be an .npz with arrays x, y")
    for key in ("x", "y"):
        if key not in arrays:
            raise UserError(f"{path} has no array '{key}'; it needs x and y (optionally x_test and y_test)")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise UserError(f"{path} must hold both x_test and y_test, or neither")

    def images_first(x):  # (N, H, W) -> (N, 1, H, W); NHWC -> NCHW
        if x.ndim == 3:
            return x[:, None]
        return x.transpose(0, 3, 1, 2) if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3) else x

    x, y = images_first(arrays["x"]), arrays["y"]
    if "x_test" in arrays:
        return x, y, images_first(arrays["x_test"]), arrays["y_test"]
    return x, y, x[:0], np.zeros(0, dtype=y.dtype)


def check_arrays(name, xtr, ytr, xte, yte, npz=False):
    """Refuse data no run can use, before anything is written: one line that says what is wrong. In a user's
    ``npz`` every test label must also be a training label (a named dataset's classes are its publisher's)."""
    max_classes = max(ytr.size + yte.size, 1000)  # a label of 10^9 would ask for 10^9-wide class-count tables
    for x, y, what, xname in ((xtr, ytr, "x, y", "x"), (xte, yte, "x_test, y_test", "x_test")):
        if y.ndim != 1 or x.ndim not in (2, 4) or len(x) != len(y) or 0 in x.shape[1:]:
            raise UserError(f"{name}: {what} must be (N, features), (N, H, W) or (N, C, H, W) samples with N "
                            f"labels; got shapes {x.shape} and {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            raise UserError(f"{name}: the labels in {what} must be integers 0..C-1, got {y.dtype}")
        if x.dtype.kind not in "uif":  # complex, bool, strings, records
            raise UserError(f"{name}: {xname} is {x.dtype}; samples must be real numbers (integers or floats)")
        bad = int(np.count_nonzero(~np.isfinite(x))) if x.dtype.kind == "f" else 0
        if bad:
            raise UserError(f"{name}: {xname} has {bad} non-finite value(s) (NaN or inf); clean the data")
        largest = max(abs(float(x.max())), abs(float(x.min()))) if x.size else 0.0
        if largest > MAX_FEATURE:  # float32 training overflows long before 3e38; no real features are this large
            raise UserError(f"{name}: {xname} has values as large as {largest:.3g}; scale the features "
                            f"(for example to [0, 1]) so that none exceeds {MAX_FEATURE:.0e}")
        if len(y) and (y.min() < 0 or y.max() >= max_classes):
            raise UserError(f"{name}: labels must be 0..C-1 with C at most {max_classes} (the larger of 1000 and "
                            f"the number of samples); {what} has labels from {y.min()} to {y.max()}")
    if not len(ytr):
        raise UserError(f"{name} has no training samples")
    if ytr.min() == ytr.max():
        raise UserError(f"{name}: every training label is {ytr[0]}; classification needs at least 2 classes")
    if len(yte) and xte.shape[1:] != xtr.shape[1:]:
        raise UserError(f"{name}: x_test samples are {xte.shape[1:]} but x samples {xtr.shape[1:]}")
    if len(yte) and (xtr.dtype.kind == "f") != (xte.dtype.kind == "f"):  # integer images are standardised, floats not
        raise UserError(f"{name}: x is {xtr.dtype} but x_test is {xte.dtype}; store both as integers or both as "
                        "floats, on the same scale")
    unseen = np.setdiff1d(yte, ytr) if npz else []
    if len(unseen):
        raise UserError(f"{name}: y_test has label(s) {first_few(unseen)} that no training sample has; "
                        "a model cannot learn them, so drop those test samples or add training samples")


# ----------------------------------------------------------------------------- every dataset, as tensors on clients

def load_arrays(name, data_dir, agnews_vocab="authors"):
    """(x_train, y_train, x_test, y_test), checked (``check_arrays``), labels int64, of a named dataset or an .npz
    file. ``agnews_vocab``: see ``load_agnews``."""
    if (name in VISION or name in LOADERS) and not data_dir.strip():  # '' would be the current folder
        raise UserError("--data-dir must name the folder the datasets are read from (. for the current one)")
    if (name in VISION or name in LOADERS) and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise UserError(f"--data-dir {data_dir} is a file; it must name the folder the datasets are read from")
    if name in VISION:
        arrays = load_vision(name, data_dir)
    elif name in LOADERS:
        arrays = load_agnews(data_dir, agnews_vocab) if name == "agnews" else LOADERS[name](data_dir)
    elif name.lower().endswith(".npz"):  # d.NPZ too
        if not os.path.isfile(name):
            if os.path.isdir(name):
                raise UserError(f"{quoted(name)} is a folder, not an .npz file")
            if os.path.lexists(name):  # a named pipe would block the read, a device never end
                check_regular(name, doing="--dataset")
            raise UserError(f"no such file: {quoted(name)}")
        arrays = load_npz(name)
    else:
        raise UserError(f"unknown dataset '{name}'; choose {', '.join([*VISION, *LOADERS])}, "
                        f"{SYNTHETIC_HELP}, a .npz file or a PFLlib dataset folder")
    check_arrays(name, *arrays, npz=name.lower().endswith(".npz"))
    xtr, ytr, xte, yte = arrays
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


def to_tensor(x, reference=None, tokens=False):
    """Integer images (uint8, uint16, int32, ...) -> float32 normalised per channel with the mean and std of
    ``reference``, so their range does not matter; float data as it is; integer vectors as int64 token ids if
    ``tokens``, else as float32 numbers. Statistics are accumulated in chunks and the conversion is in place: the
    peak memory is one channels-last float32 copy of ``x`` (Tiny-ImageNet: 5.4 GB rather than four times that)."""
    if x.dtype.kind in "ui" and x.ndim == 4:
        ref = torch.from_numpy(reference if reference is not None else x)
        total = torch.zeros(2, ref.shape[1], dtype=torch.float64)
        for start in range(0, len(ref), 4096):
            chunk = ref[start: start + 4096].double() / 255
            total += torch.stack([chunk.sum((0, 2, 3)), chunk.square().sum((0, 2, 3))])
        mean, mean_square = total / (ref.numel() / ref.shape[1])
        std = (mean_square - mean ** 2).clamp_min(0).sqrt() + 1e-8
        x = torch.from_numpy(x).to(torch.float32, memory_format=torch.channels_last)
        return x.div_(255).sub_(mean.float().view(1, -1, 1, 1)).div_(std.float().view(1, -1, 1, 1))
    if tokens and x.min() < 0:
        raise UserError(f"token ids for --model fasttext must be >= 0 (0 pads), but x has ids down to {x.min()}")
    return torch.from_numpy(x.astype(np.int64 if tokens else np.float32))


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


def partition(labels, args, rng, num_classes, min_size):
    defaults = {"pat": {100: 10, 200: 20}.get(num_classes, 2), "pfedla1": 12 if num_classes >= 100 else 4}
    cpc = args.classes_per_client or defaults.get(args.partition, 6 if num_classes >= 100 else 2)  # pfedla2: dominant
    if args.partition in ("pat", "pfedla1") and cpc > num_classes:
        raise UserError(f"--classes-per-client {cpc} is more than the {num_classes} classes of {args.dataset}")
    split = {"iid": lambda n, r, amount: dp.iid(labels, n, r),  # amount: pFedLA's samples per client
             "pat": lambda n, r, amount: dp.pathological(labels, n, r, cpc, balance=args.balance),
             "dir": lambda n, r, amount: dp.dirichlet(labels, n, r, args.beta, min_size=min_size),
             "pfedla1": lambda n, r, amount: dp.pfedla1(labels, n, r, cpc, amount),
             "pfedla2": lambda n, r, amount: dp.pfedla2(labels, n, r, min(cpc, num_classes - 1), args.dominant_share,
                                                        amount)}[args.partition]
    if args.partition not in ("pfedla1", "pfedla2") or args.samples_per_client != "auto":
        return split(args.num_clients, rng, args.samples_per_client)
    # auto, pFedLA Sec. 4.2: the same amount per client for 10 and 100 clients, what 100 clients get (a fixed draw, so
    # it depends on the labels only); beyond 100 clients or where a dataset is too small for that, as much as N can have
    try:
        amount = len(split(100, np.random.default_rng(0), None)[0]) if args.num_clients <= 100 else None
        return split(args.num_clients, rng.spawn(1)[0], amount)
    except dp.PartitionError:
        return split(args.num_clients, rng, None)


def check_dataset_exists(name, resume=None):
    """Refuse a missing --dataset file or folder in a line that says so (not that it is an unknown dataset): one given
    as a path, or under --resume ``resume`` any the run was made on (the line says how to give its new place)."""
    if name in VISION or name in LOADERS or os.path.lexists(name):
        return
    if resume:
        raise UserError(f"cannot resume: the dataset {quoted(name)} the run was made on is not there (moved or "
                        f"deleted); if it moved, give its new place: --resume {quoted(resume)} --dataset NEW_PLACE "
                        "(the run checks that it holds the same data by its fingerprint)")
    if os.sep in name or (os.altsep and os.altsep in name):
        raise UserError(f"--dataset {quoted(name)}: no such folder or file")


def load_federated_data(args, device):
    """Load the dataset, partition it over clients (docs/datasets.md: partitions, the two evaluation protocols) and
    move it to ``device`` once (common.load_federated_data: after set_determinism, before any GPU work)."""
    rng = np.random.default_rng([args.seed, 0])  # data and partition: independent of training randomness
    if synthetic := synthetic_setting(args.dataset):
        info = {"generated": True}  # no file: the run folder's --resume check names the seed it is generated from
        x, y, client_idx = stack_clients(synthetic_clients(args.num_clients, rng, *synthetic))
        train, test = dp.train_test_split(client_idx, rng, args.train_ratio)
        x, num_classes = to_tensor(x), SYNTHETIC_CLASSES
        # no official test set: under 'global' the union of the clients' test data stands in for it
        global_test = np.concatenate(test) if args.test_split == "global" else None
    elif is_pfllib_folder(args.dataset):  # PFLlib's clients as they are: client i's data are its train and test files
        x, y, train, test, num_classes = load_pfllib_folder(args.dataset, args.num_clients)
        # the --resume check names the folder, not --data-dir; config.json and compare.py show how its clients were made
        info = {"folder": pfllib_partition(read_pfllib_config(args.dataset))}
        global_test, n_train = None, sum(len(t) for t in train)
        check_arrays(args.dataset, x[:n_train], y[:n_train], x[n_train:], y[n_train:])
        tokens = x.dtype.kind in "ui" and x.ndim == 2 and args.model == "fasttext"
        x = to_tensor(x, reference=x[:n_train], tokens=tokens)
    else:
        check_dataset_exists(args.dataset, args.resume)
        xtr, ytr, xte, yte = load_arrays(args.dataset, args.data_dir, getattr(args, "agnews_vocab", "authors"))
        x = np.concatenate([xtr, xte]) if len(xte) else xtr
        y = np.concatenate([ytr, yte])
        num_classes = int(y.max()) + 1
        if args.test_split == "client":
            if args.num_clients > len(y):
                raise UserError(f"{args.num_clients} clients but only {len(y)} samples; use fewer --num-clients")
            parts = partition(y, args, rng, num_classes, min_size=math.ceil(args.batch_size / args.train_ratio) + 1)
            train, test = dp.train_test_split(parts, rng, args.train_ratio)
            global_test = None
        else:
            if not len(yte):
                raise UserError(f"--test-split global needs a test set; {args.dataset} has none (add x_test, y_test)")
            missing = np.setdiff1d(ytr, yte)  # a client holding such a label would be tested on nothing
            if len(missing):
                raise UserError(f"--test-split global needs test samples of every label; y_test has none of label(s) "
                                f"{first_few(missing)} (or use --test-split client)")
            train = parts = partition(ytr, args, rng, num_classes, args.batch_size)
            test = [t + len(ytr) for t in dp.proportional_test_sets([ytr[i] for i in train], yte, rng, num_classes)]
            global_test = np.arange(len(ytr), len(y))
        pfedla = args.partition in ("pfedla1", "pfedla2")
        info = {"samples_per_client": {"flag": args.samples_per_client, "samples": len(parts[0])}} if pfedla else {}
        # integer vectors are token ids only when asked for (--model fasttext) or for AG News; else numbers
        tokens = xtr.dtype.kind in "ui" and xtr.ndim == 2 and (args.model == "fasttext" or args.dataset == "agnews")
        x = to_tensor(x, reference=xtr, tokens=tokens)
    if min(len(t) for t in train) == 0:
        raise UserError("a client received no training data; use fewer --num-clients or another partition")
    untested = [k for k, t in enumerate(test) if not len(t)]
    if untested:  # their accuracy would be a number computed from no sample
        raise UserError(f"client(s) {first_few(untested)} got no test samples; use fewer --num-clients "
                        "or another partition")
    on = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64)).to(device)
    if x.dim() == 4:  # channels-last images: faster convolutions and pooling (index batches keep the layout);
        x = x.contiguous(memory_format=torch.channels_last)  # on the host: on the device it would take twice the data
    if torch.device(device).type == "cuda":  # the host holds it already; the device may not
        check_fits(f"the data of {quoted(args.dataset)} ({tuple(x.shape)}, {x.dtype})", x.numel() * x.element_size(),
                   device)
    x = x.to(device)
    return FedData(
        x=x, y=torch.from_numpy(y).to(device), num_classes=num_classes,
        train_idx=[on(t) for t in train], test_idx=[on(t) for t in test],
        global_test_idx=None if global_test is None else on(global_test),
        train_counts=dp.class_counts(y, train, num_classes), test_counts=dp.class_counts(y, test, num_classes),
        vocab_size=int(x.max()) + 1 if not x.is_floating_point() else 0, info=info)
