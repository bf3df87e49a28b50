"""--dataset PATH of a PFLlib dataset folder (config.json, train/<i>.npz, test/<i>.npz, each npz PFLlib's
np.savez_compressed(f, data={'x': ..., 'y': ...})): client i trains and is tested on exactly its two files,
flags that would re-split are refused, a crafted pickle runs nothing, an oversized or lying zip member is
refused before it is inflated, an inconsistent folder is one line naming the file, --resume on other files
is refused, the five scripts, flower/app.py and tools/reproduce.py take it. The folders are fabricated here
in PFLlib's exact format (no PFLlib code)."""
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

import common
import data_formats
import datasets
import fedacd
import fedavg
from conftest import metrics_rows, run_dir, run_in_process
from run_folder import UserError
from tools import reproduce

NUM_CLIENTS, NUM_CLASSES, SHAPE = 4, 10, (1, 16, 16)


def write_client(path, x, y):
    """One client file as PFLlib's save_file writes it."""
    with open(path, "wb") as f:
        np.savez_compressed(f, data={"x": x, "y": y})


def make_folder(root, name="FashionMNIST-tiny", num_clients=NUM_CLIENTS, seed=0):
    """A PFLlib dataset folder of ``num_clients`` clients (2 or 3 classes each, unequal sizes, float32 images
    in [-1, 1] as PFLlib's generators store them) and its config.json; returns (folder, clients) with
    clients[i] = (x_train, y_train, x_test, y_test)."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(str(root), name)
    os.makedirs(os.path.join(folder, "train"))
    os.makedirs(os.path.join(folder, "test"))
    clients, statistic = [], []
    for i in range(num_clients):
        labels = rng.choice(NUM_CLASSES, 2 + i % 2, replace=False)
        arrays = []
        for part, n in (("train", 12 + 3 * i), ("test", 4 + i)):
            x = rng.uniform(-1, 1, (n, *SHAPE)).astype(np.float32)
            y = rng.choice(labels, n).astype(np.int64)
            write_client(os.path.join(folder, part, f"{i}.npz"), x, y)
            arrays += [x, y]
        clients.append(tuple(arrays))
        both = np.concatenate([arrays[1], arrays[3]])
        statistic.append([[int(label), int((both == label).sum())] for label in np.unique(both)])
    write_config(folder, {"num_clients": num_clients, "num_classes": NUM_CLASSES, "non_iid": True, "balance": False,
                          "partition": "dir", "Size of samples for labels in clients": statistic, "alpha": 0.1,
                          "batch_size": 10})
    return folder, clients


def write_config(folder, config):
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


def read_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path)[0]


def load(folder, *flags, script=fedavg):
    return datasets.load_federated_data(script.parse_args(["--dataset", folder, "--device", "cpu", *flags]), "cpu")


# ----------------------------------------------------------------------------- exactly the folder's clients

def test_each_client_trains_and_is_tested_on_exactly_its_files(tmp_path):
    folder, clients = make_folder(tmp_path)
    data = load(folder)
    assert data.num_clients == NUM_CLIENTS and data.num_classes == NUM_CLASSES  # config.json's, not the labels' max
    assert data.global_test_idx is None
    for i, (xtr, ytr, xte, yte) in enumerate(clients):
        assert torch.equal(data.x[data.train_idx[i]], torch.from_numpy(xtr))
        assert torch.equal(data.y[data.train_idx[i]], torch.from_numpy(ytr))
        assert torch.equal(data.x[data.test_idx[i]], torch.from_numpy(xte))
        assert torch.equal(data.y[data.test_idx[i]], torch.from_numpy(yte))
    # the reader gives what PFLlib's own np.load(allow_pickle=True)['data'].tolist() gives
    for part in ("train", "test"):
        path = os.path.join(folder, part, "2.npz")
        theirs = np.load(path, allow_pickle=True)["data"].tolist()
        ours = data_formats.read_pfllib_npz(path)
        assert all(np.array_equal(a, theirs[k]) and a.dtype == theirs[k].dtype for a, k in zip(ours, "xy"))


def test_num_clients_is_the_folders_and_no_flag_re_splits(folder):
    assert fedavg.parse_args(["--dataset", folder]).num_clients == NUM_CLIENTS  # the default 20 is not used
    assert fedavg.parse_args(["--dataset", folder, "--num-clients", str(NUM_CLIENTS)]).num_clients == NUM_CLIENTS
    args = fedacd.parse_args(["--dataset", folder])  # fedacd.py's default is --test-split global
    assert args.test_split == "client" and load(folder, script=fedacd).global_test_idx is None
    with pytest.raises(UserError, match=f"--num-clients 5, but .* holds {NUM_CLIENTS} clients"):
        fedavg.parse_args(["--dataset", folder, "--num-clients", "5"])


@pytest.mark.parametrize("flags", [["--partition", "pat"], ["--beta", "0.5"], ["--classes-per-client", "2"],
                                   ["--balance"], ["--samples-per-client", "100"], ["--dominant-share", "0.5"],
                                   ["--train-ratio", "0.75"], ["--test-split", "client"], ["--test-split", "global"]])
def test_flags_that_partition_or_split_are_refused(folder, flags):
    with pytest.raises(UserError, match=f"^{flags[0]} does not apply to a PFLlib dataset folder"):
        fedavg.parse_args(["--dataset", folder, *flags])


def test_a_named_dataset_wins_over_a_folder_of_its_name(tmp_path, monkeypatch):
    make_folder(tmp_path, name="mnist")
    monkeypatch.chdir(tmp_path)
    assert not data_formats.is_pfllib_folder("mnist") and data_formats.is_pfllib_folder("./mnist")
    assert not data_formats.is_pfllib_folder("./nosuch") and not data_formats.is_pfllib_folder("synthetic")


# ----------------------------------------------------------------------------- no pickle runs code

class Reduce:
    """An object whose unpickling calls ``function(*args)``."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def npy_of_pickle(blob):
    """data.npy: numpy's header of a 0-d object array, then ``blob`` as its pickle."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": ()})
    return f.getvalue() + blob


def write_npz(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in members.items():
            z.writestr(name, content)


def payloads(marker):
    """(name, write(path)) of files whose unpickling would create ``marker``: the whole pickle a call, or the
    call inside PFLlib's own structure (np.savez_compressed of a dict holding it)."""
    import builtins
    y = np.zeros(3, dtype=np.int64)
    calls = {"os.system": Reduce(os.system, f"touch {marker}"),
             "builtins.eval": Reduce(builtins.eval, f"open({str(marker)!r}, 'w').close()"),
             "subprocess.call": Reduce(subprocess.call, ["touch", str(marker)]),
             "numpy.save": Reduce(np.save, str(marker), y)}  # numpy's own functions are no safer
    out = [(f"{name}, the whole pickle", lambda path, c=call: write_npz(path, {"data.npy": npy_of_pickle(
        pickle.dumps(c, protocol=4))})) for name, call in calls.items()]
    out += [(f"{name} as PFLlib's x", lambda path, c=call: write_client(path, c, y)) for name, call in calls.items()]
    return out


@pytest.mark.parametrize("case", range(8))
def test_a_crafted_pickle_runs_nothing_and_is_one_line_naming_the_file(case, tmp_path):
    folder = make_folder(tmp_path)[0]
    marker = tmp_path / "ran.npy"  # np.save adds .npy to a name without it
    name, write = payloads(marker)[case]
    path = os.path.join(folder, "train", "1.npz")
    write(path)
    with pytest.raises(UserError) as e:
        load(folder)
    assert path in str(e.value) and "\n" not in str(e.value), name
    assert not marker.exists(), name
    # the payload is live: numpy's own reader with allow_pickle=True runs it
    with pytest.raises(Exception):  # noqa: B017  whatever the call returns, it is no PFLlib dict
        x = np.load(path, allow_pickle=True)["data"].tolist()
        assert isinstance(x, dict) and set(x) == {"x", "y"} and isinstance(x["x"], np.ndarray)
    assert marker.exists(), name


def test_the_script_refuses_a_crafted_file_with_exit_2_and_runs_nothing(folder, tmp_path, capsys):
    marker = tmp_path / "ran"
    path = os.path.join(folder, "test", "3.npz")
    write_client(path, Reduce(os.system, f"touch {marker}"), np.zeros(3, dtype=np.int64))
    capsys.readouterr()
    assert run_in_process("fedala.py", "--dataset", folder, "--out", tmp_path / "runs", "--device", "cpu") == 2
    error = capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "runs").exists()
    assert error.count("\n") == 1 and path in error and "posix.system" in error


def test_an_object_array_longer_than_its_list_is_refused_not_handed_to_numpy(folder):
    # numpy's own ndarray.__setstate__ on this state segfaults (numpy 2.4): the reader checks it first
    path = os.path.join(folder, "train", "0.npz")
    state = (1, (10 ** 9,), np.dtype(object), False, [1, 2])
    write_npz(path, {"data.npy": npy_of_pickle(pickle.dumps(_Build(state), protocol=4))})
    with pytest.raises(UserError, match="is refused: an object array of shape"):
        data_formats.read_pfllib_npz(path)


class _Build:
    """Pickles as numpy's ndarray does (``_reconstruct`` then ``__setstate__``), with any state."""

    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        return np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), self.state


@pytest.mark.parametrize("write, words", [
    (lambda p: np.savez_compressed(p, x=np.zeros((2, 3)), y=np.zeros(2, dtype=np.int64)),
     "holds x.npy, y.npy; PFLlib's files hold data.npy only"),
    (lambda p: write_npz(p, {"data.npy": npy_of_pickle(b""), "extra.npy": b""}), "PFLlib's files hold data.npy only"),
    (lambda p: np.savez_compressed(p, data=np.zeros((3, 2), dtype=np.float32)),
     "is a float32 array of shape (3, 2), not PFLlib's pickled dict"),
    (lambda p: np.savez_compressed(p, data={"x": np.zeros((2, 1, 16, 16), np.float32), "y": np.zeros(2, np.int64),
                                            "z": np.zeros(1)}), "holds a dict of 'x', 'y', 'z'"),
    (lambda p: np.savez_compressed(p, data={"x": [[1.0]], "y": np.zeros(1, np.int64)}),
     "its 'x' is not a numpy array of numbers"),
    (lambda p: np.savez_compressed(p, data={"x": np.zeros((2, 1, 16, 16), np.complex64), "y": np.zeros(2, np.int64)}),
     "the dtype 'c8'"),
    (lambda p: np.savez_compressed(p, data={"x": np.array([np.zeros(2)], dtype=object), "y": np.zeros(1, np.int64)}),
     "an object array of shape (1, 2)"),
    (lambda p: open(p, "wb").write(b"PK\x03\x04 cut short"), "is not a readable PFLlib client file"),
])
def test_a_file_not_in_pfllibs_format_is_one_line_naming_it(folder, write, words):
    path = os.path.join(folder, "test", "0.npz")
    write(path)
    with pytest.raises(UserError) as e:
        load(folder)
    assert path in str(e.value) and words in str(e.value)


def test_sizes_beyond_memory_are_refused_before_anything_is_inflated(folder, monkeypatch):
    # 8 MB of zeros compress to a few KB: the zip header's declared size is what counts
    write_client(os.path.join(folder, "train", "0.npz"), np.zeros((8192, *SHAPE), np.float32),
                 np.zeros(8192, np.int64))
    monkeypatch.setattr(data_formats, "memory_available", lambda device="cpu": 4 * 2 ** 20)
    monkeypatch.setattr(data_formats, "read_pfllib_npz", lambda path: pytest.fail(f"{path} was inflated"))
    with pytest.raises(UserError, match=f"the client files of {folder} would take about 16.[0-9] MB, more than"):
        load(folder)


def test_a_member_that_inflates_beyond_its_declared_size_is_refused_within_that_size(folder):
    # a zip bomb: 64 MB of zeros (64 KB compressed) whose zip header says 2 MB; zipfile's read() would inflate
    # it all at once before cutting it to 2 MB
    path = os.path.join(folder, "train", "2.npz")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("data.npy", "w") as f:
        f.write(npy_of_pickle(b""))
        for _ in range(64):
            f.write(bytes(2 ** 20))
    raw = bytearray(open(path, "rb").read())
    struct.pack_into("<I", raw, raw.find(b"PK\x03\x04") + 22, 2 ** 21)  # local header's uncompressed size
    struct.pack_into("<I", raw, raw.rfind(b"PK\x01\x02") + 24, 2 ** 21)  # central directory's
    open(path, "wb").write(raw)
    assert zipfile.ZipFile(path).getinfo("data.npy").file_size == 2 ** 21
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="is not a readable PFLlib client file"):
            data_formats.read_pfllib_npz(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2 ** 20, peak


def pickle_with_harmless_work(x, y, opcodes):
    """PFLlib's pickle of {'x': x, 'y': y} after ``opcodes`` pairs of EMPTY_LIST, POP (each builds a list and drops
    it: nothing is called, and the dict that follows is PFLlib's)."""
    holder = np.empty((), dtype=object)
    holder[()] = {"x": x, "y": y}
    blob = pickle.dumps(holder, protocol=4)
    start = 2 if blob[2] != pickle.FRAME[0] else 11  # PROTO 4, then FRAME n: the work goes after them
    return blob[:start] + (pickle.EMPTY_LIST + pickle.POP) * opcodes + blob[start:]


def test_the_unpicklers_work_is_bounded_by_the_files_declared_size(folder):
    x, y = data_formats.read_pfllib_npz(os.path.join(folder, "train", "0.npz"))
    path = os.path.join(folder, "train", "0.npz")
    write_npz(path, {"data.npy": npy_of_pickle(pickle_with_harmless_work(x, y, 10))})
    assert np.array_equal(data_formats.read_pfllib_npz(path)[0], x)  # a little harmless work: the same arrays
    write_npz(path, {"data.npy": npy_of_pickle(pickle_with_harmless_work(x, y, 300000))})
    declared = data_formats.pfllib_declared_bytes(path)  # 600 KB declared, about 2 KB on disk
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=f"{path}: its pickle holds more than 4096 opcodes"):
            data_formats.read_pfllib_npz(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * declared, (peak, declared)  # without the bound: 300,000 lists of 56 bytes and more


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity", "1" * 30, "12345678901234567890123"])
def test_a_config_number_that_is_no_finite_integer_in_range_is_one_line(folder, number):
    path = os.path.join(folder, "config.json")
    text = open(path).read()
    first = read_config(folder)["Size of samples for labels in clients"][0][0]
    edited = text.replace(f"[[{first[0]}, {first[1]}]", f"[[{first[0]}, {number}]", 1)
    assert edited != text
    open(path, "w").write(edited)
    with pytest.raises(UserError) as e:
        load(folder)
    assert path in str(e.value) and "holds the number" in str(e.value) and "\n" not in str(e.value)


def edit_statistic(change):
    """A mutation of config.json's label statistic of client 0: ``change(pairs)`` -> pairs."""
    def mutate(folder):
        config = read_config(folder)
        statistic = config["Size of samples for labels in clients"]
        statistic[0] = change(statistic[0])
        write_config(folder, config)
    return mutate


@pytest.mark.parametrize("change, words", [
    (lambda pairs: [[pairs[0][0], pairs[0][1] + 0.9], *pairs[1:]], "is not a list of [label, count] pairs of integers"),
    (lambda pairs: [[float(pairs[0][0]), pairs[0][1]], *pairs[1:]], "pairs of integers"),
    (lambda pairs: [[pairs[0][0], True], *pairs[1:]], "pairs of integers"),
    (lambda pairs: [*pairs, [pairs[0][0], pairs[0][1]]], "more than once"),
    (lambda pairs: [[pairs[0][0], 1], *pairs, ], "more than once"),
    (lambda pairs: [[label, 1] for label in range(11)], "lists 11 labels of client 0; its num_classes is 10"),
])
def test_the_label_statistic_is_checked_exactly(folder, change, words):
    edit_statistic(change)(folder)
    with pytest.raises(UserError) as e:
        load(folder)
    assert os.path.join(folder, "config.json") in str(e.value) and words in str(e.value)


def test_an_encrypted_client_file_is_refused_with_the_word_encrypted(folder):
    path = os.path.join(folder, "test", "2.npz")
    raw = bytearray(open(path, "rb").read())
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # the general purpose flags: bit 0
        at = raw.find(signature)
        struct.pack_into("<H", raw, at + offset, struct.unpack_from("<H", raw, at + offset)[0] | 1)
    struct.pack_into("<I", raw, raw.find(b"PK\x01\x02") + 38, 0o100644 << 16)  # a file mode, as zip tools write
    open(path, "wb").write(raw)  # zipfile's own message then passes 120 characters before it says 'encrypted'

    with pytest.raises(UserError) as e:
        load(folder)
    assert path in str(e.value) and "encrypted" in str(e.value).replace(path, "")  # the test's folder says it too


def test_a_long_message_keeps_its_end():
    from run_folder import shortened
    message = "File <ZipInfo filename='data.npy' " + "x" * 300 + "> is encrypted, password required for extraction"
    cut = shortened(message, 120)
    assert len(cut) <= 120 and cut.startswith("File <ZipInfo") and cut.endswith("password required for extraction")
    assert shortened("short", 120) == "short"


def test_a_channels_last_folder_is_refused_for_its_layout(tmp_path):
    folder, clients = make_folder(tmp_path)
    for part, column in (("train", 0), ("test", 2)):
        for i, arrays in enumerate(clients):
            write_client(os.path.join(folder, part, f"{i}.npz"), arrays[column].transpose(0, 2, 3, 1),
                         arrays[column + 1])
    with pytest.raises(UserError) as e:
        load(folder)
    assert os.path.join(folder, "train", "0.npz") in str(e.value) and "channels-last" in str(e.value)


# ----------------------------------------------------------------------------- an inconsistent folder

def replace_client(part, i, change):
    """A mutation: client i's file in ``part`` rewritten with ``change(x, y)`` -> (x, y)."""
    def mutate(folder):
        path = os.path.join(folder, part, f"{i}.npz")
        write_client(path, *change(*data_formats.read_pfllib_npz(path)))
    return mutate


def edit_config(**changes):
    return lambda folder: write_config(folder, {**read_config(folder), **changes})


def remove(relative):
    def mutate(folder):
        path = os.path.join(folder, relative)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return mutate


def add(relative):
    return lambda folder: shutil.copyfile(os.path.join(folder, "train", "0.npz"), os.path.join(folder, relative))


def swap_train_files(folder):
    a, b = (os.path.join(folder, "train", f"{i}.npz") for i in (1, 2))
    os.rename(a, a + ".tmp")
    os.rename(b, a)
    os.rename(a + ".tmp", b)


def other_statistic(folder):
    config = read_config(folder)
    config["Size of samples for labels in clients"][3][0][1] += 1
    write_config(folder, config)


def fifo(folder):
    path = os.path.join(folder, "test", "1.npz")
    os.remove(path)
    os.mkfifo(path)


def not_json(folder):
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write("{")


INCONSISTENT = {  # case: (mutation, the path the line names, relative to the folder, words of the line)
    "config.json counts more clients than files": (edit_config(num_clients=5), "train/4.npz",
                                                   "is missing (1 file(s) missing); its config.json says 5"),
    "config.json counts fewer": (edit_config(num_clients=3), "train/3.npz", "is not a client's file"),
    "a missing test file": (remove("test/2.npz"), "test/2.npz", "is missing"),
    "an extra file": (add("train/notes.txt"), "train/notes.txt", "is not a client's file"),
    "x and y of different lengths": (replace_client("train", 1, lambda x, y: (x, y[:-1])), "train/1.npz",
                                     "x and y must be"),
    "another image shape": (replace_client("test", 3, lambda x, y: (np.zeros((len(y), 1, 16, 17), np.float32), y)),
                            "test/3.npz", "holds samples of shape (1, 16, 17)"),
    "another dtype": (replace_client("test", 3, lambda x, y: (x.astype(np.float64), y)), "test/3.npz",
                      "and dtype float64"),
    "labels beyond num_classes": (edit_config(num_classes=3), "train/0.npz", "config.json says num_classes 3"),
    "NaN": (replace_client("train", 2, lambda x, y: (np.where(x > 0.9, np.nan, x).astype(np.float32), y)),
            "train/2.npz", "non-finite"),
    "float labels": (replace_client("train", 0, lambda x, y: (x, y.astype(np.float32))), "train/0.npz",
                     "the labels y are float32"),
    "no samples": (replace_client("test", 0, lambda x, y: (x[:0], y[:0])), "test/0.npz", "holds no samples"),
    "files of two clients swapped": (swap_train_files, "config.json", "counts client 1's labels as"),
    "a label count that differs": (other_statistic, "config.json", "counts client 3's labels as"),
    "no config.json": (remove("config.json"), "", "is a folder without config.json"),
    "no test folder": (remove("test"), "", "is a folder without test"),
    "config.json not JSON": (not_json, "config.json", "is not JSON"),
    "num_clients a string": (edit_config(num_clients="4"), "config.json", "num_clients must be an integer"),
    "a named pipe": (fifo, "test/1.npz", "is not a regular file"),
}


@pytest.mark.parametrize("case", list(INCONSISTENT))
def test_an_inconsistent_folder_is_one_line_naming_the_file(case, folder):
    mutate, named, words = INCONSISTENT[case]
    mutate(folder)
    with pytest.raises(UserError) as e:
        load(folder)
    assert (os.path.join(folder, named) if named else folder) in str(e.value), (case, str(e.value))
    assert words in str(e.value), (case, str(e.value))
    assert "\n" not in str(e.value), case


# ----------------------------------------------------------------------------- runs: scripts, resume, Flower

@pytest.mark.parametrize("script", ["fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py"])
def test_every_script_trains_on_the_folders_clients(script, folder, tmp_path, one_thread):
    out = tmp_path / "runs"
    assert run_in_process(script, "--dataset", folder, "--rounds", "1", "--model", "cnn", "--out", out,
                          "--device", "cpu") in (0, None)
    run = run_dir(out)
    with open(os.path.join(run, "partition.json")) as f:
        sizes = json.load(f)
    assert sizes["train_sizes"] == [12 + 3 * i for i in range(NUM_CLIENTS)]
    assert sizes["test_sizes"] == [4 + i for i in range(NUM_CLIENTS)]
    assert float(metrics_rows(run)[0]["test_acc"]) >= 0


def test_config_records_the_folder_and_resume_on_other_files_is_refused(folder, tmp_path, one_thread, capsys):
    out = tmp_path / "runs"
    flags = ["--dataset", folder, "--rounds", "2", "--model", "mlp", "--out", out, "--device", "cpu",
             "--checkpoint-every", "1"]
    assert run_in_process("fedavg.py", *flags, "--stop-after", "1") in (0, None)
    run = run_dir(out)
    config = read_config(run)
    assert config["args"]["dataset"] == folder and config["args"]["num_clients"] == NUM_CLIENTS
    assert len(config["data_sha256"]) == 64
    assert config["dataset_folder"] == {"partition": "dir", "alpha": 0.1, "balance": False, "non_iid": True,
                                        "num_clients": NUM_CLIENTS, "num_classes": NUM_CLASSES}  # compare.py shows it
    assert os.path.basename(run).startswith("fedavg-FashionMNIST-tiny-s0-")
    same = str(tmp_path / "same")
    shutil.copytree(run, same)
    assert run_in_process("fedavg.py", "--resume", same) in (0, None)  # the same files: it goes on
    assert [r["round"] for r in metrics_rows(same)] == ["1", "2"]
    replace_client("test", 1, lambda x, y: (x[::-1].copy(), y[::-1].copy()))(folder)  # same samples, other order
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", run) == 2
    error = capsys.readouterr().err
    assert f"the data of {run} changed since the run started ({folder}: fingerprint" in error


def test_a_run_whose_folder_moved_resumes_from_its_new_place_checked_by_its_fingerprint(tmp_path, one_thread,
                                                                                      capsys):
    folder = make_folder(tmp_path / "data")[0]
    flags = ["--rounds", "2", "--model", "mlp", "--device", "cpu", "--checkpoint-every", "1"]
    assert run_in_process("fedavg.py", "--dataset", folder, *flags, "--out", tmp_path / "whole") in (0, None)
    assert run_in_process("fedavg.py", "--dataset", folder, *flags, "--out", tmp_path / "cut",
                          "--stop-after", "1") in (0, None)
    run = run_dir(tmp_path / "cut")
    moved = str(tmp_path / "elsewhere" / "FashionMNIST-tiny")
    shutil.move(os.path.dirname(folder), os.path.dirname(moved))
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", run) == 2  # the old place: it says the folder is gone
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "unknown dataset" not in error
    assert f"the dataset {folder} the run was made on is not there (moved or deleted)" in error
    assert f"--resume {run} --dataset NEW_PLACE" in error
    other = make_folder(tmp_path / "other", seed=1)[0]  # another folder's data: refused by the fingerprint
    assert run_in_process("fedavg.py", "--resume", run, "--dataset", other) == 2
    assert f"the data of {run} changed since the run started ({other}: fingerprint" in capsys.readouterr().err
    assert run_in_process("fedavg.py", "--resume", run, "--dataset", moved) in (0, None)
    accuracy = lambda folder: [(r["round"], r["test_acc"], r["train_loss"]) for r in metrics_rows(folder)]
    assert accuracy(run) == accuracy(run_dir(tmp_path / "whole"))  # as if never stopped
    assert read_config(run)["args"]["dataset"] == moved  # a later resume reads it there
    config = read_config(run)
    del config["data_sha256"]  # a run made before the fingerprint: its data's new place cannot be checked
    write_config(run, config)
    again = str(tmp_path / "again")
    shutil.move(os.path.dirname(moved), again)
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", run, "--rounds", "3", "--dataset",
                          os.path.join(again, "FashionMNIST-tiny")) == 2  # an older form: upgraded first
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"python tools/run_records.py --upgrade {run}" in error
    assert read_config(run) == config  # nothing changed


def test_flower_app_takes_the_folder(folder):
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
    from flower import app as flower_app
    job = flower_app.Job("fedavg", ["--dataset", folder, "--device", "cpu"])
    assert job.args.num_clients == NUM_CLIENTS  # one node per client of the folder
    assert [len(i) for i in job.data.train_idx] == [12 + 3 * i for i in range(NUM_CLIENTS)]


@pytest.mark.slow  # a Flower simulation: Ray's start-up
def test_a_flower_simulation_on_the_folder_gives_the_scripts_metrics(folder, tmp_path, one_thread):
    pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
    from flower import app as flower_app
    flags = ["--dataset", folder, "--rounds", "2", "--model", "mlp", "--device", "cpu"]
    fedavg.main([*flags, "--out", str(tmp_path / "script")])
    flower_app.simulate([["fedavg", *flags, "--out", str(tmp_path / "flower")]])
    expected, got = (metrics_rows(run_dir(str(tmp_path / d))) for d in ("script", "flower"))
    assert [r["round"] for r in got] == ["1", "2"] and all(r["clients_answered"] == str(NUM_CLIENTS) for r in got)
    for e, g in zip(expected, got):
        assert float(g["test_acc"]) == pytest.approx(float(e["test_acc"]), abs=1e-4)


# ----------------------------------------------------------------------------- tools/reproduce.py

def folder_table(rounds=1):
    return {"tiny-pfllib": {
        "title": "Tiny: FedAvg on a PFLlib folder", "source": "synthetic",
        "metric": {"summary": "best", "column": "test_acc", "protocol": "pooled over clients"},
        "rounds": rounds, "common": ["--num-clients", str(NUM_CLIENTS), "--model", "mlp", "--batch-size", "10"],
        "cells": [{"name": "dir", "flags": ["--dataset", "{data_dir}/FashionMNIST-tiny"], "methods": [
            {"method": "FedAvg", "script": "fedavg.py", "flags": [], "paper": None}]}]}}


def test_reproduce_finds_a_cells_folder_under_data_dir(folder, tmp_path, capsys):
    assert reproduce.in_data_dir("{data_dir}/FashionMNIST-dir", "/data/pfllib") == "/data/pfllib/FashionMNIST-dir"
    assert reproduce.in_data_dir("{data_dir}/FashionMNIST-dir", None) == "./data/FashionMNIST-dir"
    assert reproduce.in_data_dir("fmnist", "/data") == "fmnist"
    capsys.readouterr()
    argv = ["tiny-pfllib", "--seeds", "0", "--out", tmp_path / "out", "--data-dir", os.path.dirname(folder),
            "--dry-run"]
    assert reproduce.main(list(map(str, argv)), folder_table()) == 0
    (command,) = [line for line in capsys.readouterr().out.splitlines() if "[new]" in line]
    assert f"--dataset {folder} " in command


@pytest.mark.slow  # a table run: a subprocess
def test_reproduce_runs_a_cells_folder_and_the_command_names_it(folder, tmp_path, capsys):
    data_dir = os.path.dirname(folder)
    out = tmp_path / "out"
    argv = ["tiny-pfllib", "--seeds", "0", "--out", out, "--data-dir", data_dir]
    assert reproduce.main(list(map(str, argv)), folder_table()) == 0
    (run,) = reproduce.run_folders(str(out / "tiny-pfllib" / "dir" / "fedavg" / "seed0"))
    config = read_config(run)
    assert config["command"][config["command"].index("--dataset") + 1] == folder  # runnable as it stands
    assert config["args"]["num_clients"] == NUM_CLIENTS
    capsys.readouterr()
    assert reproduce.main(list(map(str, [*argv, "--dry-run"])), folder_table()) == 0
    assert "[done]" in capsys.readouterr().out  # the same table and --data-dir: the same run, not another
    moved = tmp_path / "moved"  # the same folder found under another --data-dir: the same setting, the run done
    shutil.copytree(data_dir, moved)
    capsys.readouterr()
    assert reproduce.main(list(map(str, [*argv[:-2], "--data-dir", moved, "--dry-run"])), folder_table()) == 0
    assert "[done]" in capsys.readouterr().out
    args = reproduce.parse_args(list(map(str, [*argv[:-2], "--data-dir", moved])), folder_table())
    (job,) = reproduce.table_jobs("tiny-pfllib", folder_table()["tiny-pfllib"], args)
    assert reproduce.other_settings(job, run) == []
    job["flags"] = [f.replace(os.path.basename(folder), "FashionMNIST-other") for f in job["flags"]]
    assert reproduce.other_settings(job, run) == \
        [f"--dataset {os.path.basename(folder)} (now FashionMNIST-other)"]  # another folder's name: another setting


def call_reproduce(argv, tables):
    """reproduce.main in this process; the exit status (bad input exits with SystemExit)."""
    try:
        return reproduce.main(list(map(str, argv)), tables)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("damage, words", [
    (lambda folder: shutil.rmtree(folder), "FashionMNIST-tiny, the dataset of dir / FedAvg / seed 0, is not there; "
                                           "nothing was started: give --data-dir the folder that holds"),
    (lambda folder: os.remove(os.path.join(folder, "config.json")), "is a folder without config.json"),
])
def test_a_tables_folders_are_checked_before_any_run_starts(folder, tmp_path, capsys, damage, words):
    damage(folder)
    out = tmp_path / "out"
    capsys.readouterr()
    argv = ["tiny-pfllib", "--seeds", "0", "1", "--out", out, "--data-dir", os.path.dirname(folder)]
    assert call_reproduce(argv, folder_table()) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and words in error and "nothing was started" in error, error
    assert not out.exists()  # no tree left behind


def test_a_stopped_run_resumes_on_the_folder_where_the_table_now_finds_it(folder, tmp_path):
    moved = str(tmp_path / "moved")
    os.mkdir(moved)
    args = reproduce.parse_args(["tiny-pfllib", "--seeds", "0", "--out", str(tmp_path / "out"), "--data-dir", moved],
                                folder_table())
    (job,) = reproduce.table_jobs("tiny-pfllib", folder_table()["tiny-pfllib"], args)
    command = reproduce.resume_command(job, "RUN", "cpu")
    assert command[command.index("--dataset") + 1] == os.path.join(moved, "FashionMNIST-tiny")
    assert command[command.index("--data-dir") + 1] == moved
    named = reproduce.resume_command({**job, "flags": ["--dataset", "fmnist"]}, "RUN", "cpu")
    assert "--dataset" not in named  # a named dataset is read under --data-dir: nothing to point at


@pytest.mark.slow  # two table runs: subprocesses, about 15 s
def test_a_table_continued_with_another_data_dir_resumes_its_stopped_run_there(tmp_path):
    folder = make_folder(tmp_path / "data")[0]
    out = tmp_path / "out"
    first = ["tiny-pfllib", "--seeds", "0", "--out", out, "--data-dir", os.path.dirname(folder)]
    assert call_reproduce([*first, "--stop-after", "1"], folder_table(rounds=2)) == 0
    moved = tmp_path / "moved"
    shutil.move(os.path.dirname(folder), moved)
    assert call_reproduce([*first[:-2], "--data-dir", moved], folder_table(rounds=2)) == 0
    (run,) = reproduce.run_folders(str(out / "tiny-pfllib" / "dir" / "fedavg" / "seed0"))
    assert [r["round"] for r in metrics_rows(run)] == ["1", "2"]
    assert read_config(run)["args"]["dataset"] == os.path.join(moved, "FashionMNIST-tiny")
