"""Other people's data formats, read without trusting them: torchvision's MNIST family and CIFAR from the publishers'
files (``load_vision``, checked against their known content), Tiny-ImageNet-200 and AG News (``LOADERS``), PFLlib's
dataset folders (``load_pfllib_folder``); CIFAR's and PFLlib's pickles are read by an unpickler that runs nothing.
Every declared size is checked against memory before it is allocated (``check_fits``). This imports exits only."""
import collections
import contextlib
import csv
import gzip
import hashlib
import io
import json
import math
import os
import pickle
import pickletools
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import zipfile

import numpy as np
import torch

from exits import UserError, check_regular, quoted, shortened


# ----------------------------------------------------------------------------- sizes, before anything is allocated

def memory_available(device="cpu"):
    """Bytes free for tensors on ``device`` now: a CUDA device's free memory, else the host's MemAvailable, or None."""
    device = torch.device(device)
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except (RuntimeError, AssertionError, OSError, ValueError, IndexError):
        return None


def human_bytes(n):
    for unit, size in (("TB", 2 ** 40), ("GB", 2 ** 30), ("MB", 2 ** 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2 ** 10:.1f} KB"


def check_fits(what, nbytes, device="cpu"):
    """Refuse in one line, before it is allocated, ``what`` of about ``nbytes`` beyond the free memory of ``device``."""
    free = memory_available(device)
    if free is not None and nbytes > free:
        where = "on " + str(device) if torch.device(device).type == "cuda" else "in this machine's memory"
        raise UserError(f"{what} would take about {human_bytes(nbytes)}, more than the {human_bytes(free)} "
                        f"free {where}")


def first_few(values, most=10):
    """``values`` as '3, 7, 9' (the first ``most`` of them, then how many more)."""
    more = f" and {len(values) - most} more" if len(values) > most else ""
    return ", ".join(str(v) for v in values[:most]) + more


def _dims(dims):
    return "x".join(map(str, dims))


# ----------------------------------------------------------------------------- torchvision: MNIST family, CIFAR

VISION = {  # --dataset: (torchvision.datasets class, its arguments, the folder its files go in)
    "mnist": ("MNIST", {}, "MNIST/raw"), "fmnist": ("FashionMNIST", {}, "FashionMNIST/raw"),
    "emnist": ("EMNIST", {"split": "digits"}, "EMNIST/raw"),
    "cifar10": ("CIFAR10", {}, "cifar-10-batches-py"), "cifar100": ("CIFAR100", {}, "cifar-100-python")}
MNIST_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_FILES = {"mnist": MNIST_IDX, "fmnist": MNIST_IDX,  # train images, train labels, test images, test labels (or .gz)
             "emnist": tuple("emnist-digits-" + stem.replace("t10k", "test") for stem in MNIST_IDX)}
EMNIST_ZIP = "gzip.zip"  # EMNIST's one download; its folder gzip/ holds the .gz files of every split
OFFLINE_SOURCES = {"fmnist": " (or take Debian's copy: apt-get install dataset-fashion-mnist, then "
                             "--data-dir /usr/share/datasets/fashion-mnist)"}

# What the publishers' files hold, checked after decoding (check_known_content; docs/datasets.md). sizes: (train,
# test) samples; counts: samples per class (train, test), from the publishers' documentation (CIFAR's and EMNIST
# digits' classes are balanced); sha256 (content_sha256) of x_train, y_train, x_test, y_test where we could compute it:
# Fashion-MNIST from Debian's dataset-fashion-mnist, whose archives were recompressed (other md5, same content).
KNOWN_CONTENT = {
    "mnist": {"title": "MNIST", "shape": (1, 28, 28), "classes": 10, "sizes": (60000, 10000),
              "counts": ((5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
                         (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009))},
    "fmnist": {"title": "Fashion-MNIST", "shape": (1, 28, 28), "classes": 10, "sizes": (60000, 10000),
               "counts": ((6000,) * 10, (1000,) * 10),
               "sha256": ("2e487a6c89124f78f2d7521542223cafe96f7123c3ca13d447772ac6ecbb3012",
                          "657fbd221bfc9f4198cc14b5619cc33ec57c58dd0e47af4d99d6650759e869a7",
                          "c867c93ff95360594e8ec3287995350b824dd110b11595c0e13d5423f621867a",
                          "3d0e6c6ea990b53b6f8f500a41cac93881d981b315f84578b7d915342ade01e9")},
    "emnist": {"title": "EMNIST digits", "shape": (1, 28, 28), "classes": 10, "sizes": (240000, 40000),
               "counts": ((24000,) * 10, (4000,) * 10)},
    "cifar10": {"title": "CIFAR-10", "shape": (3, 32, 32), "classes": 10, "sizes": (50000, 10000),
                "counts": ((5000,) * 10, (1000,) * 10)},
    "cifar100": {"title": "CIFAR-100", "shape": (3, 32, 32), "classes": 100, "sizes": (50000, 10000),
                 "counts": ((500,) * 100, (100,) * 100)}}
ARRAYS = ("training images", "training labels", "test images", "test labels")
READ_CHUNK = 1 << 24  # bytes inflated at a time
CIFAR_MAX_BYTES = 60000 * 4096  # the unpacked files of either CIFAR: 60,000 images of 3072 bytes, labels, names
CIFAR_MAX_PICKLE_OPS = 10 ** 6  # CIFAR-100's train file, the largest, takes about 200,000. Counted before any is run:
# an opcode of one byte may build an object of a hundred, and a crafted file would build one per byte of its size
NPZ_ROUTE = ("; data of your own goes in an .npz with x, y (optional x_test, y_test): --dataset path/to/file.npz "
             "(docs/datasets.md)")


class ContentError(UserError):
    """A publisher's file whose content is not the dataset's (check_known_content)."""


def content_sha256(array):
    """sha256 of a decoded array in C order as uint8: images (N, C, H, W), labels one byte each (checked < classes)."""
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.uint8).data).hexdigest()


def read_idx(stream, what, expected=None):
    """The array in an idx stream (LeCun's: 0, 0, 0x08 for uint8, the number of dimensions, each a big-endian int32,
    the data): exactly the size its header declares is read, a header other than ``expected`` refused before it."""
    head = stream.read(4)  # buffered streams (files, gzip, zip members) return fewer bytes only at their end
    if len(head) < 4 or head[:3] != b"\0\0\x08" or not 1 <= head[3] <= 4:
        raise ValueError(f"{what} is not an idx file of unsigned bytes")
    sizes = stream.read(4 * head[3])
    if len(sizes) < 4 * head[3]:
        raise ValueError(f"{what} ends inside its header")
    dims = tuple(int(d) for d in np.frombuffer(sizes, ">u4"))
    if expected is not None and dims != tuple(expected):
        raise ContentError(f"its header declares {_dims(dims)} values where {_dims(expected)} are expected")
    declared = math.prod(dims)
    check_fits(f"{what} (its header declares {_dims(dims)} bytes)", declared)
    data = np.empty(declared, np.uint8)
    view, got = memoryview(data), 0
    while got < declared:
        n = stream.readinto(view[got: got + READ_CHUNK])
        if not n:
            raise ValueError(f"{what} holds {got} bytes of data; its header says {declared}")
        got += n
    if stream.read(1):
        raise ValueError(f"{what} holds more than the {declared} bytes of data its header says")
    return data.reshape(dims)


def find_idx(name, data_dir):
    """(folder, [(path, opener of a stream inflated as read)]) of ``name``'s four idx files, or (None, None): in
    data_dir/<torchvision's folder> or data_dir, each plain or .gz, EMNIST's also inside its gzip.zip."""
    for folder in (os.path.join(data_dir, VISION[name][2]), data_dir):
        stems = [os.path.join(folder, stem) for stem in IDX_FILES[name]]
        paths = [next((p for p in (stem, stem + ".gz") if os.path.isfile(p)), None) for stem in stems]
        if all(paths):
            return folder, [(p, lambda p=p: gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")) for p in paths]
        archive = os.path.join(folder, EMNIST_ZIP)
        if name == "emnist" and os.path.isfile(archive):  # read from the zip as it is
            @contextlib.contextmanager
            def member(stem):
                with zipfile.ZipFile(archive) as z, z.open(f"gzip/{stem}.gz") as f, gzip.GzipFile(fileobj=f) as g:
                    yield g
            return folder, [(f"{archive} (gzip/{stem}.gz)", lambda s=stem: member(s)) for stem in IDX_FILES[name]]
    return None, None


def _torchvision_class(name):
    import torchvision  # slow to import: only for the datasets it has
    return getattr(torchvision.datasets, VISION[name][0])


def _cifar_complete(cls, folder):
    """Whether ``folder`` holds every batch file that torchvision's CIFAR class (or instance) ``cls`` reads."""
    return all(os.path.isfile(os.path.join(folder, f)) for f, _ in cls.train_list + cls.test_list)


def read_cifar(name, folder):
    """CIFAR's pickled batches in ``folder`` as torchvision reads them, by _CifarUnpickler (which runs nothing):
    [x_train, y_train, x_test, y_test] as (N, 3, 32, 32) uint8 and int64, and each array's [(file, samples)]."""
    def not_canonical(why):  # read whole: not damaged, another layout
        return UserError(f"the {name} files in {folder} are readable but not the canonical {name} set "
                         f"that torchvision reads ({why}){NPZ_ROUTE}")
    cls, arrays, sources = _torchvision_class(name), [], []
    for files in (cls.train_list, cls.test_list):
        images, labels, parts = [], [], []
        for file, _ in files:
            path = os.path.join(folder, file)
            try:
                with open(path, "rb") as f:
                    blob = f.read()
                if _more_opcodes_than(blob, CIFAR_MAX_PICKLE_OPS):
                    raise _PickleRefused(f"its pickle holds more than {CIFAR_MAX_PICKLE_OPS} opcodes; CIFAR's largest "
                                         "file takes about 200,000 (nothing of it was run)")
                entry = _CifarUnpickler(io.BytesIO(blob), encoding="latin1").load()
            except _PickleRefused as e:
                raise UserError(f"{quoted(path)} is refused: {e}")
            label_key = next((k for k in ("labels", "fine_labels") if isinstance(entry, dict) and k in entry), None)
            if label_key is None or "data" not in entry:
                raise not_canonical(f"{file} is no dict with 'data' and 'labels' ('fine_labels')")
            x, y = (np.asarray(v.value if type(v) is _PickledArray else v) for v in (entry["data"], entry[label_key]))
            if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or y.ndim != 1 or len(y) != len(x):
                raise not_canonical(f"{file} holds no uint8 (N, 3072) images with N labels")
            if not np.issubdtype(y.dtype, np.integer):
                raise not_canonical(f"{file} has labels of {y.dtype}, not integers")
            images.append(x)
            labels.append(y.astype(np.int64))
            parts.append((path, len(y)))
        arrays += [np.concatenate(images).reshape(-1, 3, 32, 32), np.concatenate(labels)]
        sources += [parts, parts]
    return arrays, sources


def unpack_cifar(name, data_dir):
    """CIFAR's tar.gz in data_dir (or its folder, as an older message said) unpacked into its folder when that lacks
    its files: only the files read, if their headers declare a CIFAR's sizes, renamed into place whole."""
    cls = _torchvision_class(name)
    folder = os.path.join(data_dir, cls.base_folder)
    found = [a for a in (os.path.join(data_dir, cls.filename), os.path.join(folder, cls.filename)) if os.path.isfile(a)]
    if _cifar_complete(cls, folder) or not found:
        return
    wanted = {f"{cls.base_folder}/{f}" for f, _ in cls.train_list + cls.test_list + [(cls.meta["filename"], None)]}
    with removed_on_failure(folder):
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=data_dir, prefix=".unpack-") as tmp, tarfile.open(found[0], "r:gz") as tar:
            members, declared = [], 0
            for member in tar:  # refused at the header that declares too much, before its data
                if member.name in wanted:
                    members.append(member)
                    declared += member.size
                if declared > CIFAR_MAX_BYTES:
                    raise UserError(f"{found[0]}: its files declare more than {name}'s {human_bytes(CIFAR_MAX_BYTES)} "
                                    f"at most ({member.name}: {human_bytes(member.size)}); it is not {name}'s archive")
            tar.extractall(tmp, members=members, filter="data")  # only the files that are read
            for f in os.listdir(os.path.join(tmp, cls.base_folder)):
                os.replace(os.path.join(tmp, cls.base_folder, f), os.path.join(folder, f))


@contextlib.contextmanager
def removed_on_failure(folder):
    """``folder`` and its parents not there yet, removed again if the block fails: a failed load leaves no folder."""
    top, path = None, os.path.abspath(folder)
    while not os.path.lexists(path):
        top, path = path, os.path.dirname(path)
    try:
        yield
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise


def _fetch(folder, download, missing, put):
    """Run ``download`` into ``folder`` (reads time out after 20 s); on failure, one line says what to put where."""
    timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(20)
    try:
        with removed_on_failure(folder):
            download()
    except Exception as e:  # noqa: BLE001  every failure gets the same advice
        raise UserError(f"{missing} and could not be downloaded ({e.__class__.__name__}); put {put}")
    finally:
        socket.setdefaulttimeout(timeout)


def _torchvision_download(name, data_dir):
    """torchvision's download of ``name`` into data_dir (_fetch); CIFAR's archive is md5-checked, its names unread."""
    cls = _torchvision_class(name)
    folder = os.path.join(data_dir, VISION[name][2])
    if name.startswith("cifar"):  # torchvision unpacks the archive from data_dir
        where, what = data_dir, f"{cls.filename} from {cls.url} in {data_dir} (it is unpacked into {folder})"

        class Cifar(cls):
            def _check_integrity(self):
                return _cifar_complete(self, os.path.join(self.root, self.base_folder))

            def _load_meta(self):
                self.classes = []
        cls = Cifar
    elif name == "emnist":
        where, what = folder, (f"{EMNIST_ZIP} from {cls.url} (or the files {', '.join(IDX_FILES[name])}, "
                               f"gzipped or not, from inside it) in {folder}")
    else:
        where, what = folder, f"{', '.join(f + '.gz' for f in IDX_FILES[name])} from {cls.mirrors[0]} in {folder}"

    def download():
        for train in (True, False):
            cls(data_dir, train=train, download=True, **VISION[name][1])
    _fetch(folder, download, f"{name} is not in {where}", what + OFFLINE_SOURCES.get(name, ""))


def _same_as_other(name, arrays):
    """' (these are X's: --dataset x)' when the arrays are the content of another known dataset."""
    for other, known in KNOWN_CONTENT.items():
        if other == name or tuple(a.shape[1:] for a in arrays[::2]) != (known["shape"],) * 2 or \
                (len(arrays[0]), len(arrays[2])) != known["sizes"] or \
                any(len(y) and (y.min() < 0 or y.max() >= known["classes"]) for y in arrays[1::2]):
            continue
        if known.get("sha256"):
            if all(content_sha256(a) == h for a, h in zip(arrays, known["sha256"])):
                return f" (these are {known['title']}'s: --dataset {other})"
        elif all(tuple(np.bincount(y, minlength=known["classes"])) == c for y, c in zip(arrays[1::2], known["counts"])):
            return f" (their class counts are {known['title']}'s: --dataset {other}?)"
    return ""


def check_known_content(name, arrays, sources, route=""):
    """Refuse in one line naming the file (``sources``: each array's [(file, samples)]), ending in ``route``, a known
    dataset's arrays unless the publisher's: a label outside its classes, other sizes, class counts, sha256, in turn."""
    known = KNOWN_CONTENT.get(name)
    if known is None:
        return
    title, classes = known["title"], known["classes"]

    def refuse(i, why):  # naming the file(s) the array came from
        files = [path for path, _ in sources[i]]
        where = files[0] if len(files) == 1 else \
            f"{os.path.dirname(files[0])} ({', '.join(map(os.path.basename, files))})"
        raise ContentError(f"{where} is not {title}'s {ARRAYS[i]}: {why}{_same_as_other(name, arrays)}{route}")

    for i in (1, 3):
        outside = np.flatnonzero((arrays[i] < 0) | (arrays[i] >= classes))
        if len(outside):
            sample = int(outside[0])
            for path, n in sources[i]:  # the file that holds it, and its place there
                if sample < n:
                    break
                sample -= n
            raise ContentError(f"{path}: label {arrays[i][outside[0]]} (sample {sample}) is outside {title}'s "
                               f"classes 0..{classes - 1}: this is not {title}'s file{route}")
    for i in (0, 2):
        shape, expected = tuple(arrays[i].shape[1:]), known["sizes"][i // 2]
        if (len(arrays[i]), shape) != (expected, known["shape"]):
            refuse(i, f"{len(arrays[i])} images of {_dims(shape)}, {title}'s are {expected} of {_dims(known['shape'])}")
    for i in (1, 3):
        counts, expected = tuple(int(c) for c in np.bincount(arrays[i], minlength=classes)), known["counts"][i // 2]
        if counts != tuple(expected):
            same = f"{expected[0]} in each" if len(set(expected)) == 1 else first_few(list(expected))
            refuse(i, f"its classes hold {first_few(counts)} samples, {title}'s {same}")
    for i, expected in enumerate(known.get("sha256") or ()):
        found = content_sha256(arrays[i])
        if found != expected:
            refuse(i, f"the sha256 of its decoded content is {found[:16]}..., {title}'s {expected[:16]}...")


def load_vision(name, data_dir):
    """(x_train, y_train, x_test, y_test), uint8 (N, C, H, W) and int64, of a torchvision dataset: the publishers' files
    where they lie, else downloaded; checked for their known content, so a copy from elsewhere (Debian's) loads."""
    cls, folder, known = _torchvision_class(name), os.path.join(data_dir, VISION[name][2]), KNOWN_CONTENT.get(name)
    address = cls.url if hasattr(cls, "url") else cls.mirrors[0]
    route = NPZ_ROUTE if name.startswith("cifar") else ""  # CIFAR has no fingerprint: another set's data reads whole
    try:
        if name in IDX_FILES:
            found, files = find_idx(name, data_dir)
            if files is None:
                _torchvision_download(name, data_dir)
                found, files = find_idx(name, data_dir)
            folder, arrays, sources = found or folder, [], []
            for i, (path, opener) in enumerate(files):  # a known dataset's images are (N, H, W), labels (N,)
                expected = (known["sizes"][i // 2], *known["shape"][1:])[:3 if i % 2 == 0 else 1] if known else None
                try:
                    with opener() as stream:
                        arrays.append(read_idx(stream, IDX_FILES[name][i], expected))
                except ContentError as e:
                    raise ContentError(f"{path} is not {known['title']}'s {ARRAYS[i]}: {e}") from None
                sources.append([(path, len(arrays[-1]))])
        else:
            unpack_cifar(name, data_dir)
            if not _cifar_complete(cls, folder):
                _torchvision_download(name, data_dir)
            arrays, sources = read_cifar(name, folder)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  what the parsers raise on a damaged file
        raise UserError(f"the {name} files in {folder} are corrupt or truncated ({e.__class__.__name__}: {e}); "
                        f"delete them and run again to download them from {address}{route}")
    xtr, ytr, xte, yte = arrays
    if name in IDX_FILES:
        if xtr.ndim != 3 or xte.ndim != 3 or ytr.ndim != 1 or yte.ndim != 1:
            raise UserError(f"the {name} files in {folder} hold arrays of shapes {xtr.shape}, {ytr.shape}, "
                            f"{xte.shape} and {yte.shape}; expected images (N, H, W) and labels (N,)")
        # (N, 1, H, W); EMNIST stores its images transposed
        xtr, xte = ((x.transpose(0, 2, 1) if name == "emnist" else x)[:, None].copy() for x in (xtr, xte))
    arrays = xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)
    check_known_content(name, arrays, sources, route)
    return arrays


# ----------------------------------------------------------------------------- Tiny-ImageNet, AG News

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"  # 248,100,043 bytes
TINY_CACHE = "tiny-imagenet-200-uint8.npz"  # decoded once, then reused (delete it to rebuild)
TINY_ARRAYS = ("x_train", "y_train", "x_test", "y_test")  # what TINY_CACHE holds besides wnids, the class names
AGNEWS_URL = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
AGNEWS_MAX_LEN = 200  # tokens per text: cut, or padded with PAD_ID (PFLlib's max_len for FedALA)
AGNEWS_MIN_COUNT = 1  # a training word is in the vocabulary if seen this often; no size cap (torchtext default)
PAD_ID, UNK_ID = 0, 1  # id 0 pads (a zero embedding); UNK_ID: unknown words under --agnews-vocab train
_BASIC_ENGLISH = [(r"\'", " '  "), (r"\"", ""), (r"\.", " . "), (r"<br \/>", " "), (r",", " , "), (r"\(", " ( "),
                  (r"\)", " ) "), (r"\!", " ! "), (r"\?", " ? "), (r"\;", " "), (r"\:", " "), (r"\s+", " ")]


class ChecksumError(Exception):
    """A downloaded file does not have the published md5."""


def _write_whole(path, write, prefix):
    """``write(f)`` to a temporary file beside ``path``, renamed to ``path`` once it succeeded: never half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private to this user
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _download(url, path, md5=None):
    """Download ``url`` to ``path`` (_write_whole), checking ``md5`` when given. Network reads time out after 20 s."""
    import urllib.request
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(f):
        digest = hashlib.md5()
        with urllib.request.urlopen(url, timeout=20) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                f.write(chunk)
                digest.update(chunk)
        if md5 and digest.hexdigest() != md5:
            raise ChecksumError(f"md5 of {url} is {digest.hexdigest()}, expected {md5}")
    _write_whole(path, write, ".download-")


def _decode_tiny(root):
    """tiny-imagenet-200/ as TINY_CACHE's arrays, val/ the test set, labels the lines of wnids.txt: val/images/<file>
    labelled by val/val_annotations.txt (file, wnid, box), never by file order; test/ is unlabelled: not used."""
    def listed(path, images=False):  # a folder's images or a file's lines, or one line: it is missing
        try:
            if images:
                return sorted(n for n in os.listdir(path) if n.lower().endswith((".jpeg", ".jpg")))
            with open(path) as f:
                return [line.rstrip("\r\n") for line in f if line.strip()]
        except OSError:
            raise UserError(f"{path} is missing: {root} is incomplete; delete it (keep the zip) to re-extract")

    wnids = [w.strip() for w in listed(os.path.join(root, "wnids.txt"))]
    label_of = {w: i for i, w in enumerate(wnids)}
    if len(label_of) != len(wnids):
        raise UserError(f"{os.path.join(root, 'wnids.txt')} lists a class twice")
    train_files, train_labels = [], []
    for wnid in wnids:
        folder = os.path.join(root, "train", wnid, "images")
        names = listed(folder, images=True)
        train_files += [os.path.join(folder, n) for n in names]
        train_labels += [label_of[wnid]] * len(names)
    annotations = os.path.join(root, "val", "val_annotations.txt")
    val_files, val_labels = [], []
    for number, line in enumerate(listed(annotations), 1):
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label_of:
            raise UserError(f"{annotations} line {number} is not 'file<TAB>wnid<TAB>box' with a wnid of wnids.txt")
        val_files.append(os.path.join(root, "val", "images", fields[0]))
        val_labels.append(label_of[fields[1]])
    if set(listed(os.path.join(root, "val", "images"), images=True)) != {os.path.basename(f) for f in val_files}:
        raise UserError(f"{annotations} does not label exactly the images in {os.path.join(root, 'val', 'images')}")
    print(f"tinyimagenet: decoding {len(train_files)} train and {len(val_files)} val images once "
          f"(about 0.3 ms each) into {TINY_CACHE}", flush=True)

    def decode(files):  # grayscale and CMYK JPEGs converted to RGB
        from PIL import Image
        x = np.empty((len(files), 3, 64, 64), dtype=np.uint8)
        for i, path in enumerate(files):
            try:
                with Image.open(path) as image:
                    pixels = np.asarray(image.convert("RGB"))
            except (OSError, ValueError) as e:
                raise UserError(f"{path} is not a readable image ({e.__class__.__name__}); replace it or "
                                "re-extract the zip")
            if pixels.shape != (64, 64, 3):
                raise UserError(f"{path} is {pixels.shape[1]}x{pixels.shape[0]}, but Tiny-ImageNet images are 64x64")
            x[i] = pixels.transpose(2, 0, 1)
        return x

    return dict(x_train=decode(train_files), y_train=np.array(train_labels, dtype=np.int64), x_test=decode(val_files),
                y_test=np.array(val_labels, dtype=np.int64), wnids=np.array(wnids))


def load_tinyimagenet(data_dir):
    """Tiny-ImageNet-200: 100k train, 10k val (test) images, 3x64x64 uint8, 200 classes, from the first there of:
    TINY_CACHE, tiny-imagenet-200/, tiny-imagenet-200.zip (extracted whole), a download of that zip (md5 checked)."""
    cache = os.path.join(data_dir, TINY_CACHE)
    if os.path.exists(cache):
        try:
            with np.load(cache, allow_pickle=False) as d:
                arrays = tuple(d[k] for k in TINY_ARRAYS)
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise UserError(f"{cache} is corrupt or truncated ({e.__class__.__name__}); delete it to rebuild it")
        if arrays[0].shape[1:] != (3, 64, 64) or arrays[2].shape[1:] != (3, 64, 64):
            raise UserError(f"{cache} does not hold 3x64x64 images; delete it to rebuild it")
        return arrays
    root, archive = os.path.join(data_dir, "tiny-imagenet-200"), os.path.join(data_dir, "tiny-imagenet-200.zip")
    if not os.path.isdir(root):
        if not os.path.exists(archive):
            _fetch(data_dir, lambda: _download(TINY_URL, archive, TINY_MD5), "tinyimagenet not found",
                   f"tiny-imagenet-200.zip from {TINY_URL} (or its extracted folder tiny-imagenet-200/) in {data_dir}")
        with tempfile.TemporaryDirectory(dir=data_dir, prefix=".extract-", ignore_cleanup_errors=True) as tmp:
            try:
                with zipfile.ZipFile(archive) as z:
                    if not {"tiny-imagenet-200/wnids.txt", "tiny-imagenet-200/val/val_annotations.txt"} <= \
                            set(z.namelist()):
                        raise ValueError("it has no tiny-imagenet-200/wnids.txt and val/val_annotations.txt")
                    z.extractall(tmp)  # checks every member's CRC
                if not os.path.isdir(root):  # else another run extracted it
                    os.replace(os.path.join(tmp, "tiny-imagenet-200"), root)
            except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
                raise UserError(f"{archive} is corrupt, truncated or not the Tiny-ImageNet archive ({e}); "
                                "delete it and run again to re-download")
    arrays = _decode_tiny(root)
    try:
        _write_whole(cache, lambda f: np.savez(f, **arrays), ".tmp-")  # uncompressed: loads in about a second
    except OSError as e:  # a read-only or full data dir: train anyway, decode again next time
        print(f"tinyimagenet: could not write the cache {cache} ({e.__class__.__name__}: {e})", file=sys.stderr)
    return tuple(arrays[k] for k in TINY_ARRAYS)


def basic_english_tokens(text):
    """torchtext's ``basic_english`` tokeniser (PFLlib/FedALA's for AG News), split on whitespace."""
    text = text.lower()
    for pattern, replacement in _BASIC_ENGLISH:
        text = re.sub(pattern, replacement, text)
    return text.split()


def build_vocab(token_lists, min_count=AGNEWS_MIN_COUNT, first_id=UNK_ID + 1):
    """word -> id (from ``first_id``) of words seen ``min_count`` times, most frequent first, ties alphabetical."""
    counts = collections.Counter(t for tokens in token_lists for t in tokens)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate(words, start=first_id)}


def encode_tokens(token_lists, vocab, max_len=AGNEWS_MAX_LEN, unknown=UNK_ID):
    """(N, max_len) int64 ids: the first ``max_len`` tokens, unknown words -> ``unknown``, padded with PAD_ID."""
    x = np.full((len(token_lists), max_len), PAD_ID, dtype=np.int64)
    for row, tokens in enumerate(token_lists):
        ids = [vocab.get(t, unknown) for t in tokens[:max_len]]
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


def load_agnews(data_dir, vocabulary="authors"):
    """AG News from <data_dir>/ag_news_csv/ as (N, 200) int64 token ids. ``"authors"``: the vocabulary of train and
    test texts, id 0 the "<unk>" that also pads (PFLlib's generate_agnews.py); ``"train"``: of train texts, UNK_ID."""
    folder = os.path.join(data_dir, "ag_news_csv")
    paths = [os.path.join(folder, name) for name in ("train.csv", "test.csv")]
    for path in paths:
        if not os.path.exists(path):
            _fetch(folder, lambda: _download(AGNEWS_URL + os.path.basename(path), path), "agnews not found",
                   f"train.csv and test.csv (the AG News CSVs at {AGNEWS_URL}) in {folder}")
    (train_texts, y_train), (test_texts, y_test) = (_read_agnews_csv(p) for p in paths)
    train_tokens, test_tokens = ([basic_english_tokens(t) for t in texts] for texts in (train_texts, test_texts))
    if vocabulary == "authors":
        vocab, unknown = build_vocab(train_tokens + test_tokens, first_id=PAD_ID + 1), PAD_ID
    else:
        vocab, unknown = build_vocab(train_tokens), UNK_ID
    return (encode_tokens(train_tokens, vocab, unknown=unknown), y_train,
            encode_tokens(test_tokens, vocab, unknown=unknown), y_test)


LOADERS = {"tinyimagenet": load_tinyimagenet, "agnews": load_agnews}


# ----------------------------------------------------------------------------- PFLlib dataset folders

# A folder that PFLlib's generators write (TsingZ0/PFLlib dataset/utils/dataset_utils.py, save_file): config.json,
# train/<i>.npz and test/<i>.npz for client i, each holding data.npy alone: a 0-d object array whose pickle holds the
# dict {'x': samples, 'y': labels}. Pickles are programs: _PfllibUnpickler reads that pickle and builds nothing else.
MAX_FEATURE = 1e10  # the largest magnitude of a feature taken, here and in datasets.check_arrays
PFLLIB_MAX_CLIENTS = PFLLIB_MAX_CLASSES = 100000
PFLLIB_CONFIG_MAX_BYTES = 64 * 2 ** 20
PFLLIB_MAX_CONFIG_INT = 2 ** 63 - 1  # no count, label or size of a folder comes near; 1e999 is no number at all
PFLLIB_RESPLIT_FLAGS = ("train_ratio", "test_split")  # with common.PARTITION_FLAGS: refused for a folder
PFLLIB_PARTITION_KEYS = ("partition", "alpha", "balance", "non_iid", "num_clients", "num_classes")
# PFLlib's pickle of {'x': array, 'y': array} takes about 160 opcodes; more are work no PFLlib file asks for. They
# are counted before any is run (pickletools only decodes them), so that the unpickler's work and memory stay within
# a small multiple of the payload, whose size was checked: millions of harmless opcodes would each build an object.
PFLLIB_MAX_PICKLE_OPS = 4096
# bool, integers, floats; O: the 0-d object array around the dict
_PICKLE_DTYPES = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "O4", "O8"}
_NDARRAY = object()  # what the pickle's numpy.ndarray stands for: a token, never the class (it would allocate)


def is_pfllib_folder(name):
    """Whether --dataset ``name`` is a PFLlib folder: a folder not named as a dataset (``./mnist`` is) nor *.npz."""
    return (name not in VISION and name not in LOADERS and name != "synthetic" and not name.startswith("synthetic(")
            and not name.lower().endswith(".npz") and os.path.isdir(name))


def read_pfllib_config(folder):
    """``folder``'s config.json (a dict) with num_clients, num_classes, train/ and test/ checked, in one line."""
    path = os.path.join(folder, "config.json")
    layout = "a PFLlib dataset folder holds config.json, train/0.npz ... and test/0.npz ... (docs/datasets.md)"
    for part in ("config.json", "train", "test"):
        if not os.path.lexists(os.path.join(folder, part)):
            raise UserError(f"--dataset {quoted(folder)} is a folder without {part}; {layout}")
    check_regular(path, doing="--dataset")

    def number(text, kind=float):  # each parsed before any use: no later int() can overflow or take long
        value = kind(text) if kind is float or len(text) <= 20 else math.inf  # also NaN, Infinity: not JSON's
        if math.isfinite(value) and (kind is float or abs(value) <= PFLLIB_MAX_CONFIG_INT):
            return value
        raise UserError(f"{quoted(path)} holds the number {shortened(text, 24)}; PFLlib's config.json holds finite "
                        f"numbers and integers of at most {len(str(PFLLIB_MAX_CONFIG_INT))} digits")
    try:
        if os.path.getsize(path) > PFLLIB_CONFIG_MAX_BYTES:
            raise UserError(f"{quoted(path)} is {human_bytes(os.path.getsize(path))}; a PFLlib config.json is a "
                            f"few KB (at most {human_bytes(PFLLIB_CONFIG_MAX_BYTES)} is read)")
        with open(path, encoding="utf-8") as f:
            config = json.load(f, parse_int=lambda text: number(text, int), parse_float=number, parse_constant=number)
    except OSError as e:
        raise UserError(f"cannot read {quoted(path)}: {e.strerror or e.__class__.__name__}")
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested beyond Python's stack
        why = shortened((str(e).splitlines() or [""])[0], 100)
        raise UserError(f"{quoted(path)} is not JSON ({e.__class__.__name__}: {why})")
    if not isinstance(config, dict):
        raise UserError(f"{quoted(path)} holds {type(config).__name__}, not PFLlib's object with num_clients, "
                        "num_classes, ...")
    for key, least, most in (("num_clients", 1, PFLLIB_MAX_CLIENTS), ("num_classes", 2, PFLLIB_MAX_CLASSES)):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
            raise UserError(f"{quoted(path)}: {key} must be an integer from {least} to {most}, got "
                            f"{value!r}" if key in config else f"{quoted(path)} has no {key}; {layout}")
    for part in ("train", "test"):
        if not os.path.isdir(os.path.join(folder, part)):
            raise UserError(f"{quoted(os.path.join(folder, part))} is not a folder; {layout}")
    return config


def pfllib_partition(config):
    """How config.json says PFLlib made the clients (partition, alpha, ...): plain values, strings cut to 40."""
    settings = {key: config.get(key) for key in PFLLIB_PARTITION_KEYS}
    return {key: value[:40] if isinstance(value, str) else value for key, value in settings.items()
            if value is None or isinstance(value, (bool, int, float, str))}


class _PickleRefused(pickle.UnpicklingError):
    """A step of a pickle that PFLlib's and CIFAR's files never take, refused before it is run."""


def _more_opcodes_than(payload, most):  # counted by pickletools, which decodes them and runs none
    return any(n == most for n, _ in enumerate(pickletools.genops(payload)))


class _PickledArray:
    """What the pickle of an ndarray builds here: its state's bytes are checked to be exactly the shape's, so no
    declared shape is ever allocated (numpy's segfaults on an object array whose list is shorter than its shape)."""
    value = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _PickleRefused("an array's state is not numpy's (version, shape, dtype, order, data)")
        version, shape, dtype, fortran, raw = state
        if version != 1 or not isinstance(dtype, _PickledDtype) or not isinstance(fortran, bool) or \
                not (isinstance(shape, tuple) and len(shape) <= 8 and all(type(n) is int and n >= 0 for n in shape)):
            raise _PickleRefused("an array's state is not numpy's (version 1, a shape, a dtype, the order)")
        if dtype.dtype.kind == "O":  # the 0-d array around PFLlib's dict
            if shape != () or not (isinstance(raw, list) and len(raw) == 1):
                raise _PickleRefused(f"an object array of shape {shape}; only arrays of numbers are read "
                                     "(PFLlib's text datasets keep (tokens, length) objects: not these)")
            self.value = raw[0]
            return
        raw = raw.encode("latin1") if dtype.cifar and isinstance(raw, str) else raw  # Python 2's str, as latin1
        if not isinstance(raw, bytes) or len(raw) != math.prod(shape) * dtype.dtype.itemsize:
            raise _PickleRefused(f"an array of shape {shape} and dtype {dtype.dtype} whose data is not "
                                 "exactly its size")
        self.value = np.frombuffer(raw, dtype.dtype).reshape(shape, order="F" if fortran else "C")


class _PickledDtype:
    """What the pickle of a numeric (or object) numpy dtype builds here; ``__setstate__`` takes its byte order."""

    def __init__(self, spec, cifar=False):
        self.dtype, self.cifar = np.dtype(spec), cifar

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 8 and state[1] in ("<", ">", "|", "=")
                and state[2] is None and state[3] is None and state[4] is None):
            raise _PickleRefused("a dtype with fields or sub-arrays; only plain numbers are read")
        if state[1] in "<>" and self.dtype.itemsize > 1:
            self.dtype = self.dtype.newbyteorder(state[1])


def _reconstruct(subtype, shape, typecode, *, cifar=False):
    """numpy's ``_reconstruct(ndarray, (0,), b'b')``, the first step of every pickled array, as a _PickledArray."""
    if subtype is not _NDARRAY or shape != (0,) or typecode != b"b" and not (cifar and typecode == "b"):
        raise _PickleRefused("numpy's array reconstruction with other arguments than numpy writes")
    return _PickledArray()


def _dtype(spec, align=False, copy=True, *, cifar=False):
    """numpy's ``dtype(spec, align, copy)`` of a pickle, for plain numbers and objects only."""
    flags = (align, copy) == (0, 1) if cifar else align is False and copy is True  # Python 2 wrote 0, 1
    if not (isinstance(spec, str) and spec in _PICKLE_DTYPES and flags) or cifar and spec[0] == "O":
        raise _PickleRefused(f"the dtype {spec!r}; only bool, integer, float " + ("are read" if cifar else
                             "(and the object array around the dict) are read"))
    return _PickledDtype(spec, cifar)


def _scalar(dtype, raw, *, cifar=True):
    """numpy's ``scalar(dtype, data)``, a pickled numpy number (a label in a list), as that number."""
    raw = raw.encode("latin1") if isinstance(raw, str) else raw  # Python 2's str
    if not isinstance(dtype, _PickledDtype) or not isinstance(raw, bytes) or len(raw) != dtype.dtype.itemsize:
        raise _PickleRefused("a numpy number that is not one number of its dtype")
    return np.frombuffer(raw, dtype.dtype)[0]


def _frombuffer(buffer, dtype, shape, order, *, cifar=True):
    """numpy's ``_frombuffer(buffer, dtype, shape, order)`` of pickle protocol 5, checked as _PickledArray's state."""
    if order not in ("C", "F") or not isinstance(buffer, (bytes, bytearray)):
        raise _PickleRefused("numpy's protocol-5 array with other arguments than numpy writes")
    array = _PickledArray()
    array.__setstate__((1, shape, dtype, order == "F", bytes(buffer)))
    return array


def _latin1(text, encoding, *, cifar=True):
    """``_codecs.encode(text, "latin1")``: bytes as Python 3 pickles them at protocols 0-2."""
    if not (isinstance(text, str) and encoding == "latin1"):
        raise _PickleRefused("an encoding of text other than Python 3's pickle of bytes")
    return text.encode("latin1")


class _PfllibUnpickler(pickle.Unpickler):
    """Knows numpy's ``_reconstruct``, ``ndarray`` and ``dtype`` as the stand-ins above; any other global is refused."""
    GLOBALS = {("numpy._core.multiarray", "_reconstruct"): _reconstruct, ("numpy", "ndarray"): _NDARRAY,
               ("numpy.core.multiarray", "_reconstruct"): _reconstruct, ("numpy", "dtype"): _dtype}
    KIND, HOLDS, KEYWORDS = "PFLlib", "numpy arrays in a dict", {}  # what refusals say; what the stand-ins take

    def find_class(self, module, name):  # a new function each time: a pickle's BUILD on it changes no other load's
        if (found := self.GLOBALS.get((module, name))) is not None:
            return found if found is _NDARRAY else lambda *args: found(*args, **self.KEYWORDS)
        raise _PickleRefused(f"it asks for {str(module)[:60]}.{str(name)[:60]}, which a {self.KIND} file never "
                             f"holds (it holds {self.HOLDS}); nothing of it was run")

    def persistent_load(self, pid):
        raise _PickleRefused(f"it holds a persistent id, which a {self.KIND} file never holds")


class _CifarUnpickler(_PfllibUnpickler):
    """The same for CIFAR's batches: also Python 2's (latin1: str for bytes, 0 and 1 for bools), numpy numbers and
    what Python 3 writes at protocols 2 (``_codecs.encode``) and 5 (``_frombuffer``); no object arrays."""
    GLOBALS = {**_PfllibUnpickler.GLOBALS, ("_codecs", "encode"): _latin1,
               **{(f"numpy.{core}.{module}", name): builder for core in ("core", "_core") for module, name, builder in
                  (("multiarray", "scalar", _scalar), ("numeric", "_frombuffer", _frombuffer))}}
    KIND, HOLDS, KEYWORDS = "CIFAR", "a numpy array, lists and strings in a dict", {"cifar": True}


class _Refused(Exception):
    """Why one client file is not what PFLlib's save_file writes."""


@contextlib.contextmanager
def _pfllib_zip(path):
    """(the zip, its data.npy's ZipInfo) of a PFLlib client file; what fails in the block: one line naming ``path``."""
    check_regular(path, doing="--dataset")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if names != ["data.npy"]:
                raise _Refused(f"it holds {first_few([quoted(n) for n in names], 3) or 'nothing'}; PFLlib's files "
                               "hold data.npy only")
            info = z.getinfo("data.npy")
            if info.flag_bits & 0x1:  # zipfile would ask for a password
                raise _Refused("its data.npy is encrypted; PFLlib's files are not")
            yield z, info
    except _Refused as e:
        raise UserError(f"{quoted(path)}: {e}")
    except pickle.UnpicklingError as e:
        raise UserError(f"{quoted(path)} is refused: {e}")
    except Exception as e:  # noqa: BLE001  not a zip, a bad CRC, a cut file, a malformed pickle or header
        if isinstance(e, OSError) and e.strerror:
            raise UserError(f"cannot read {quoted(path)}: {e.strerror}")
        why = shortened((str(e).strip().splitlines() or [""])[0], 120)
        raise UserError(f"{quoted(path)} is not a readable PFLlib client file ({e.__class__.__name__}"
                        f"{': ' + why if why else ''})")


def pfllib_declared_bytes(path):
    """The uncompressed size that the zip header of ``path`` declares for its data.npy (read, not inflated)."""
    with _pfllib_zip(path) as (_, info):
        return info.file_size


def read_pfllib_npz(path):
    """(x, y) of a PFLlib client file, running nothing: data.npy alone, a 0-d object array, inflated up to its declared
    size (checked against memory), CRC checked, its pickle read by _PfllibUnpickler: {'x': array, 'y': array}."""
    with _pfllib_zip(path) as (z, info):
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise _Refused(f"its data.npy is .npy version {version[0]}.{version[1]}; numpy writes 1.0 or 2.0")
            shape, _, dtype = getattr(np.lib.format, f"read_array_header_{version[0]}_0")(f, max_header_size=10000)
            if shape != () or dtype != np.dtype(object):
                raise _Refused(f"its data.npy is a {dtype} array of shape {shape}, not PFLlib's pickled dict "
                               "{'x': ..., 'y': ...}")
            payload = bytearray()
            for chunk in iter(lambda: f.read(1 << 20), b""):  # read(): one inflate of up to 2 GB, whatever the
                payload += chunk  # header declares; read(n) inflates n at a time, up to the declared size and CRC
        if _more_opcodes_than(payload, PFLLIB_MAX_PICKLE_OPS):
            raise _Refused(f"its pickle holds more than {PFLLIB_MAX_PICKLE_OPS} opcodes; PFLlib's dict of two "
                           "arrays takes about 160, so it is not PFLlib's file (nothing of it was run)")
        holder = _PfllibUnpickler(io.BytesIO(payload)).load()
    data = holder.value if isinstance(holder, _PickledArray) else None
    if not isinstance(data, dict) or set(data) != {"x", "y"}:
        what = f"a dict of {first_few(sorted(map(repr, data)), 4)}" if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{quoted(path)} holds {what}, not PFLlib's dict of 'x' and 'y'")
    arrays = []
    for key in ("x", "y"):
        value = data[key].value if isinstance(data[key], _PickledArray) else None
        if not isinstance(value, np.ndarray):
            raise UserError(f"{quoted(path)}: its '{key}' is not a numpy array of numbers")
        arrays.append(value.astype(value.dtype.newbyteorder("="), copy=False))
    return tuple(arrays)


def _check_pfllib_client(path, x, y, num_classes, like):
    """Refuse ``path`` unless (x, y) are finite samples like ``like`` (the first x) and integer labels < num_classes."""
    p = quoted(path)
    if x.ndim == 3:  # (N, H, W): one channel, as .npz files
        x = x[:, None]
    if y.ndim != 1 or x.ndim not in (2, 4) or len(x) != len(y) or 0 in x.shape[1:]:
        raise UserError(f"{p}: x and y must be (N, features), (N, H, W) or (N, C, H, W) samples with N "
                        f"labels; got shapes {x.shape} and {y.shape}")
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):  # before any size or model check
        raise UserError(f"{p} holds channels-last images {x.shape} (N, H, W, C); PFLlib's generators "
                        "write (N, C, H, W): transpose x to (0, 3, 1, 2) when making the folder")
    if not len(y):
        raise UserError(f"{p} holds no samples; every client needs training and test samples")
    if y.dtype.kind not in "iu":
        raise UserError(f"{p}: the labels y are {y.dtype}; they must be integers 0..C-1")
    if x.dtype.kind not in "uif":
        raise UserError(f"{p}: x is {x.dtype}; samples must be real numbers (integers or floats)")
    if like is not None and (x.shape[1:], x.dtype) != (like.shape[1:], like.dtype):
        raise UserError(f"{p} holds samples of shape {x.shape[1:]} and dtype {x.dtype}; the first "
                        f"client's are {like.shape[1:]}, {like.dtype}: every client's must be the same")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise UserError(f"{p}: x has {int(np.count_nonzero(~np.isfinite(x)))} non-finite value(s) (NaN or inf)")
    if max(abs(float(x.max())), abs(float(x.min()))) > MAX_FEATURE:
        raise UserError(f"{p}: x has values beyond {MAX_FEATURE:.0e}; scale the features")
    if y.min() < 0 or y.max() >= num_classes:
        raise UserError(f"{p} has labels from {y.min()} to {y.max()}; its folder's config.json says "
                        f"num_classes {num_classes}, so labels are 0..{num_classes - 1}")
    return x, y.astype(np.int64)


def _check_pfllib_statistic(folder, config, labels):
    """config.json's [label, count] pairs per client, if there, must be the files' counts exactly, each label once."""
    statistic = config.get("Size of samples for labels in clients")
    if statistic is None:
        return
    path = quoted(os.path.join(folder, "config.json"))
    if not isinstance(statistic, list) or len(statistic) != len(labels):
        raise UserError(f"{path}: 'Size of samples for labels in clients' must list {len(labels)} clients")
    for client, (pairs, y) in enumerate(zip(statistic, labels)):
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p)
                                                  for p in pairs):  # type(): no float, no bool
            raise UserError(f"{path}: 'Size of samples for labels in clients' of client {client} is not a "
                            "list of [label, count] pairs of integers")
        said = [tuple(p) for p in pairs]
        if len(said) > config["num_classes"]:
            raise UserError(f"{path} lists {len(said)} labels of client {client}; its num_classes is "
                            f"{config['num_classes']}")
        times = collections.Counter(label for label, _ in said)  # linear: a client may list 10^6 pairs
        twice = sorted(label for label, n in times.items() if n > 1)
        if twice:
            raise UserError(f"{path} lists label {twice[0]} of client {client} more than once; PFLlib "
                            "lists each label of a client once")
        found = dict(zip(*(v.tolist() for v in np.unique(y, return_counts=True))))
        if dict(said) != found:
            raise UserError(f"{path} counts client {client}'s labels as {first_few(sorted(said), 4)}, "
                            f"but train/{client}.npz and test/{client}.npz hold {first_few(sorted(found.items()), 4)}")


def load_pfllib_folder(folder, num_clients=None):
    """A PFLlib folder as (x, y, train, test, num_classes): client i's samples exactly those of train/<i>.npz and
    test/<i>.npz, ``train[i]``, ``test[i]`` their indices; ``num_clients``: what a --resume expects."""
    config = read_pfllib_config(folder)
    n = config["num_clients"]
    if num_clients is not None and num_clients != n:  # a run resumed on a folder changed since
        raise UserError(f"{quoted(os.path.join(folder, 'config.json'))} says {n} clients, but the run has "
                        f"{num_clients} (--num-clients)")
    files, expected = [], [f"{i}.npz" for i in range(n)]
    for part in ("train", "test"):  # exactly 0.npz ... <n-1>.npz in each, nothing missing and nothing else
        where = os.path.join(folder, part)
        try:
            present = set(os.listdir(where))
        except OSError as e:
            raise UserError(f"cannot read {quoted(where)}: {e.strerror or e.__class__.__name__}")
        missing, extra = [f for f in expected if f not in present], sorted(present - set(expected))
        said = f"its config.json says {n} client(s): {part}/0.npz ... {part}/{n - 1}.npz"
        if missing:
            raise UserError(f"{quoted(os.path.join(where, missing[0]))} is missing ({len(missing)} file(s) missing); "
                            f"{said}")
        if extra:
            raise UserError(f"{quoted(os.path.join(where, extra[0]))} is not a client's file of {quoted(folder)} "
                            f"({len(extra)} such); {said} and nothing else; move it away")
        files.append([os.path.join(where, f) for f in expected])
    files = list(zip(*files))  # [(train/<i>.npz, test/<i>.npz)]
    declared = sum(pfllib_declared_bytes(path) for pair in files for path in pair)
    check_fits(f"the client files of {quoted(folder)}", 2 * declared)  # the files' arrays, then one copy of all
    parts, like = ([], []), None
    for pair in files:
        for part, path in zip(parts, pair):
            x, y = _check_pfllib_client(path, *read_pfllib_npz(path), config["num_classes"], like)
            like = x if like is None else like
            part.append((x, y))
    x, y, ranges = stack_clients(parts[0] + parts[1])
    _check_pfllib_statistic(folder, config, [np.concatenate([y[ranges[k]], y[ranges[n + k]]]) for k in range(n)])
    return x, y, ranges[:n], ranges[n:], config["num_classes"]


def stack_clients(clients):
    """The [(x, y)] of each client as one x and one y, and each client's indices into them."""
    starts = np.cumsum([0] + [len(y) for _, y in clients])
    return (np.concatenate([x for x, _ in clients]), np.concatenate([y for _, y in clients]),
            [np.arange(starts[k], starts[k + 1]) for k in range(len(clients))])
