"""Foundation: models, FedAvg aggregation, real loaders on fabricated files, CLI behaviour."""
import copy
import gzip
import json
import os
import pickle
import struct
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import common
import datasets
import fedavg
import run_folder
from rounds import fedavg_round
from conftest import metrics_rows, run_dir, run_in_process, run_script, layer_state_keys


def fake_data(shape, classes=10):
    return SimpleNamespace(x=torch.zeros(2, *shape), num_classes=classes, vocab_size=0, info={})


# ----------------------------------------------------------------------------- models (item 7)

@pytest.mark.parametrize("shape,flat", [((1, 28, 28), 1024), ((3, 32, 32), 1600), ((3, 64, 64), 10816)])
def test_cnn_flatten_size(shape, flat):
    model = common.build_model("cnn", fake_data(shape))
    assert model.fc1.in_features == flat
    assert model(torch.randn(2, *shape)).shape == (2, 10)
    assert [n for n, _ in common.layers(model)] == ["conv1", "conv2", "fc1", "fc"]


def test_lenet_and_simplecnn_match_spec():
    colour = common.build_model("lenet", fake_data((3, 32, 32)))
    grey = common.build_model("lenet", fake_data((1, 28, 28)))
    shapes = lambda m: [tuple(p.shape) for p in m.parameters()]
    assert shapes(colour) == [(6, 3, 5, 5), (6,), (6,), (6,), (16, 6, 5, 5), (16,), (16,), (16,),
                              (120, 400), (120,), (84, 120), (84,), (10, 84), (10,)]
    assert shapes(grey) == [(6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 256), (120,), (84, 120), (84,),
                            (10, 84), (10,)]  # no BatchNorm for grey-scale data
    simple = common.build_model("simplecnn", fake_data((3, 32, 32), 100))
    assert shapes(simple) == [(64, 3, 5, 5), (64,), (64, 64, 5, 5), (64,), (384, 1600), (384,), (192, 384), (192,),
                              (100, 192), (100,)]


def test_resnets_take_num_classes_and_channels():
    r18 = common.build_model("resnet18", fake_data((3, 32, 32), 100))
    assert r18.fc.out_features == 100 and r18(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    r34 = common.build_model("resnet34", fake_data((1, 28, 28), 10))
    assert r34(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in r18.parameters()) == 11_227_812


def test_auto_model_for_vectors_is_mlp():
    data = SimpleNamespace(x=torch.zeros(2, 60), num_classes=10, vocab_size=0, info={})
    model = common.build_model("auto", data)
    assert isinstance(model, common.MLP) and model.fc1.in_features == 60


def test_layer_keys_keep_weight_bias_and_bn_buffers_together():
    keys = layer_state_keys(common.build_model("lenet", fake_data((3, 32, 32))))
    assert keys[1] == ["bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"]
    assert keys[-1] == ["fc3.weight", "fc3.bias"]


# ----------------------------------------------------------------------------- aggregation (item 8)

def perturbed_bn_models(k=3):
    torch.manual_seed(0)
    base = common.build_model("lenet", fake_data((3, 32, 32)))
    models = []
    for i in range(k):
        m = copy.deepcopy(base)
        with torch.no_grad():
            for v in m.state_dict().values():
                if v.is_floating_point():
                    v.add_(torch.randn_like(v) * (i + 1))
        m.bn1.num_batches_tracked.fill_(7 * (i + 1))
        models.append(m)
    return base, models


def test_weighted_average_matches_independent_computation_with_bn():
    base, models = perturbed_bn_models()
    sizes = [10, 30, 60]
    stacked = torch.stack([common.flatten_state(m) for m in models])
    target = copy.deepcopy(base)
    common.load_flat_state(target, common.weighted_average(stacked, sizes))
    states = [m.state_dict() for m in models]
    for key, value in target.state_dict().items():
        if value.is_floating_point():
            expected = sum(s[key] * n for s, n in zip(states, sizes)) / sum(sizes)
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
        else:  # integer buffers are not averaged
            assert torch.equal(value, base.state_dict()[key])
    assert "bn1.running_mean" in target.state_dict()


def test_weighted_average_of_a_list_is_the_hand_computed_average_as_of_the_rows():
    """FedAvg's w = sum_k n_k w^k / n on two flat models of two numbers: (1*[1, 2] + 3*[3, 4]) / 4 = [2.5, 3.5],
    whether the models come as a list (a pasted loop's) or as the rows of a K x D tensor (ClientPool.train's)."""
    models, sizes = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])], [1, 3]
    assert torch.equal(common.weighted_average(models, sizes), torch.tensor([2.5, 3.5]))
    assert torch.equal(common.weighted_average(torch.stack(models), sizes), torch.tensor([2.5, 3.5]))
    assert torch.equal(fedavg.server_update(models, sizes), torch.tensor([2.5, 3.5]))


def test_fedavg_round_equals_hand_computation():
    args = common.base_parser("t").parse_args(["--dataset", "synthetic", "--num-clients", "4", "--batch-size", "8"])
    args.lr = 0.05
    data = common.load_federated_data(args, torch.device("cpu"))
    torch.manual_seed(0)
    global_model = common.build_model("mlp", data)
    start = copy.deepcopy(global_model)
    worker = copy.deepcopy(global_model)
    clients = [0, 2, 3]
    stack = torch.empty(3, sum(v.numel() for v in common.float_state(global_model)))
    fedavg_round(global_model, worker, data, clients, args, 5, stack)
    trained = []
    for c in clients:  # the straightforward way: a fresh copy per client
        m = copy.deepcopy(start)
        common.local_train(m, data, data.train_idx[c], args, common.client_seed(args.seed, 5, c))
        trained.append(m.state_dict())
    sizes = [len(data.train_idx[c]) for c in clients]
    for key, value in global_model.state_dict().items():
        expected = sum(s[key] * n for s, n in zip(trained, sizes)) / sum(sizes)
        torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(global_model.fc.weight, start.fc.weight)


def test_parallel_clients_give_the_same_round_on_any_schedule():
    args = common.base_parser("t").parse_args(["--dataset", "synthetic", "--num-clients", "5", "--batch-size", "8"])
    data = common.load_federated_data(args, torch.device("cpu"))
    torch.manual_seed(0)
    start = common.build_model("mlp", data)
    results = []
    for workers in (1, 2, 3, 2):
        model = copy.deepcopy(start)
        stack = torch.empty(5, sum(v.numel() for v in common.float_state(model)))
        fedavg_round(model, [copy.deepcopy(start) for _ in range(workers)], data, [0, 1, 2, 3, 4], args, 1, stack)
        results.append(common.flatten_state(model))
    assert torch.equal(results[1], results[2]) and torch.equal(results[1], results[3])  # 1 torch thread per client
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)  # all threads on one client at a time
    assert not torch.equal(results[1], common.flatten_state(start))


def test_idle_models_take_the_largest_client_left_and_results_keep_client_order():
    import threading
    started, lock = [], threading.Lock()

    def client_update(model, client):
        with lock:
            started.append(client)
            pause = {1: 0.2, 2: 0.6}.get(len(started), 0)  # one model takes all the rest while the other is busy
        time.sleep(pause)
        return model, client * 10

    pool = common.ClientPool(["w1", "w2"], {"a": 1, "b": 9, "c": 3, "d": 7, "e": 5})
    results = pool.map(client_update, ["a", "b", "c", "d", "e"])
    assert [r for _, r in results] == ["a" * 10, "b" * 10, "c" * 10, "d" * 10, "e" * 10]
    assert {m for m, _ in results} == {"w1", "w2"}
    assert set(started[:2]) == {"b", "d"} and started[2:] == ["e", "c", "a"]  # largest first: 9, 7, then 5, 3, 1


def test_a_failing_client_stops_the_round_and_restores_torch_threads():
    threads = torch.get_num_threads()

    def client_update(model, client):
        if client == 2:
            raise RuntimeError("client 2 failed")
        return client

    with pytest.raises(RuntimeError, match="client 2 failed"):
        common.ClientPool(["w1", "w2"], [1, 1, 1, 1]).map(client_update, [0, 1, 2, 3])
    assert torch.get_num_threads() == threads


def test_parallel_clients_auto_is_one_model_per_cpu_thread_and_up_to_four_on_a_gpu(monkeypatch):
    class Model:
        def to(self, device):
            return self

    def models(value, device="cpu", clients=20):
        args = SimpleNamespace(parallel_clients=value, join_ratio=1.0, num_clients=clients)
        data = SimpleNamespace(train_idx=[[0]] * clients)
        return len(common.ClientPool.build(args, Model, torch.device(device), data))

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert models("auto") == 2 and models("auto", clients=1) == 1
        monkeypatch.setattr(common, "host_cores", lambda: 16)
        assert models("auto", device="cuda") == 4 and models("auto", device="cuda", clients=3) == 3
        monkeypatch.setattr(common, "host_cores", lambda: 2)
        assert models("auto", device="cuda") == 2
        monkeypatch.setattr(common, "host_cores", lambda: 1)
        assert models("auto", device="cuda") == 1
        assert models(3) == 3 and models(3, clients=2) == 2 and models(1) == 1
    finally:
        torch.set_num_threads(threads)


def test_local_train_keeps_last_partial_batch():
    batches = list(common.epoch_batches(torch.arange(23), 10, 2, seed=1))
    assert [len(b) for b in batches] == [10, 10, 3, 10, 10, 3]
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(23))
    assert not torch.equal(torch.cat(batches[:3]), torch.cat(batches[3:]))  # reshuffled every epoch
    assert [len(b) for b in common.epoch_batches(torch.arange(21), 10, 1, seed=1)] == [10, 11]  # no batch of one


def test_resnet_trains_when_a_client_has_one_sample_left_over():
    data = SimpleNamespace(x=torch.randn(21, 3, 32, 32), y=torch.randint(0, 10, (21,)), num_classes=10,
                           vocab_size=0, info={})
    model = common.build_model("resnet18", data)
    args = common.base_parser("t").parse_args(["--batch-size", "10"])
    loss = common.local_train(model, data, torch.arange(21), args, seed=0)
    assert torch.isfinite(loss)


# ----------------------------------------------------------------------------- real loaders on fabricated files (item 6)

def write_cifar(root, classes, n_per_file=12):
    rng = np.random.default_rng(0)
    if classes == 10:
        folder, names, key = os.path.join(root, "cifar-10-batches-py"), [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"], "labels"
    else:
        folder, names, key = os.path.join(root, "cifar-100-python"), ["train", "test"], "fine_labels"
    os.makedirs(folder)
    written = {}
    for name in names:
        data = rng.integers(0, 256, (n_per_file, 3072), dtype=np.uint8)
        labels = rng.integers(0, classes, n_per_file).tolist()  # Python ints, as the publisher's files hold
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({"batch_label": name, key: labels, "data": data, "filenames": [f"{i}.png" for i in range(n_per_file)]}, f)
        written[name] = (data, labels)
    return written


def python2_pickle(entry):
    """``entry`` (str keys; uint8 arrays, lists of ints or str, str) as the publisher's CIFAR batches are pickled:
    Python 2's cPickle, protocol 2, written here opcode by opcode (Python 3's pickle cannot write Python 2's str):
    str as SHORT_BINSTRING / BINSTRING, an array as numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), 'b')
    and the state (1, shape, numpy.dtype('u1', 0, 1) with (3, '|', None, None, None, -1, -1, 0), False, its bytes
    as a str), lists in APPENDS of 1,000, the dict in one SETITEMS; containers, keys and globals memoized."""
    memo = iter(range(1, 2 ** 31))

    def put():  # BINPUT, LONG_BINPUT
        i = next(memo)
        return b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)

    def string(s):  # SHORT_BINSTRING, BINSTRING: Python 2's str, bytes that latin1 decodes one to one
        raw = s if isinstance(s, bytes) else s.encode("latin1")
        return (b"U" + bytes([len(raw)]) if len(raw) < 256 else b"T" + struct.pack("<i", len(raw))) + raw

    def number(n):  # BININT1, BININT2, BININT
        return b"K" + bytes([n]) if 0 <= n < 256 else b"M" + struct.pack("<H", n) if 0 <= n < 65536 else \
            b"J" + struct.pack("<i", n)

    def value(v):
        if isinstance(v, np.ndarray):
            assert v.dtype == np.uint8 and v.ndim == 2, v.dtype
            return (b"cnumpy.core.multiarray\n_reconstruct\n" + put() + b"cnumpy\nndarray\n" + put()
                    + b"K\x00\x85" + string("b") + b"\x87R" + put()  # _reconstruct(ndarray, (0,), 'b')
                    + b"(K\x01" + number(v.shape[0]) + number(v.shape[1]) + b"\x86"  # BUILD (1, shape,
                    + b"cnumpy\ndtype\n" + put() + string("u1") + b"K\x00K\x01\x87R" + put()  # dtype('u1', 0, 1)
                    + b"(K\x03" + string("|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"  # its state
                    + b"\x89" + string(v.tobytes()) + b"tb")  # False, the data)
        if isinstance(v, list):
            return b"]" + put() + b"".join(b"(" + b"".join(map(value, v[k:k + 1000])) + b"e"
                                           for k in range(0, len(v), 1000))
        return string(v) if isinstance(v, (str, bytes)) else number(v)

    head = b"\x80\x02}" + put() + b"("  # PROTO 2, the dict, MARK
    return head + b"".join(string(k) + put() + value(v) for k, v in entry.items()) + b"u."


def write_idx(path, array, gz=False):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_mnist(root, folder="MNIST", prefix="", gz=False, n=40):
    raw = os.path.join(root, folder, "raw")
    os.makedirs(raw)
    rng = np.random.default_rng(1)
    arrays = {}
    test = "test" if prefix.startswith("emnist") else "t10k"  # the publishers' file names
    for split, count in (("train", n), (test, n // 2)):
        x = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, count).astype(np.uint8)
        ext = ".gz" if gz else ""
        write_idx(os.path.join(raw, f"{prefix}{split}-images-idx3-ubyte{ext}"), x, gz)
        write_idx(os.path.join(raw, f"{prefix}{split}-labels-idx1-ubyte{ext}"), y, gz)
        arrays["t10k" if split == "test" else split] = (x, y)
    return arrays


def test_cifar10_pickles_load_through_user_path(tmp_path, fabricated_publishers_files):
    written = write_cifar(str(tmp_path), 10)
    xtr, ytr, xte, yte = datasets.load_arrays("cifar10", str(tmp_path))
    assert xtr.shape == (60, 3, 32, 32) and xte.shape == (12, 3, 32, 32)
    assert np.array_equal(xtr[:12].reshape(12, -1), written["data_batch_1"][0])
    assert ytr[12:24].tolist() == written["data_batch_2"][1] and yte.tolist() == written["test_batch"][1]


def test_cifar100_pickles_use_fine_labels(tmp_path, fabricated_publishers_files):
    written = write_cifar(str(tmp_path), 100, n_per_file=30)
    xtr, ytr, xte, yte = datasets.load_arrays("cifar100", str(tmp_path))
    assert xtr.shape == (30, 3, 32, 32) and ytr.tolist() == written["train"][1]


@pytest.mark.parametrize("classes", [10, 100])
def test_the_publishers_python2_batches_load_as_numpys_own_reconstruction_reads_them(classes, tmp_path,
                                                                                    fabricated_publishers_files):
    """CIFAR's batches as the publisher pickled them (Python 2's cPickle: str for bytes, align and copy as 0 and 1),
    every byte value in the images: the restricted reader gives exactly what plain pickle.load(encoding="latin1"),
    numpy's own reconstruction (which runs whatever a pickle names), gives for the same bytes."""
    rng = np.random.default_rng(classes)
    folder = tmp_path / ("cifar-10-batches-py" if classes == 10 else "cifar-100-python")
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"] if classes == 10 else ["train", "test"]
    os.makedirs(folder)
    for i, name in enumerate(names):
        n = 1100 + i  # labels in two APPENDS batches, the data a BINSTRING of 3.4 MB
        labels = {"labels": rng.integers(0, 10, n).tolist()} if classes == 10 else \
            {"fine_labels": rng.integers(0, 100, n).tolist(), "coarse_labels": rng.integers(0, 20, n).tolist()}
        blob = python2_pickle({"batch_label": f"batch {i} of {len(names)}", **labels,
                               "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                               "filenames": [f"image_{j}.png" for j in range(n)]})
        assert blob.startswith(b"\x80\x02}q\x01(") and b"cnumpy.core.multiarray\n_reconstruct\n" in blob
        (folder / name).write_bytes(blob)
    reference = [pickle.loads((folder / name).read_bytes(), encoding="latin1") for name in names]
    assert all(r["data"].dtype == np.uint8 and isinstance(r["data"], np.ndarray) for r in reference)
    key = "labels" if classes == 10 else "fine_labels"
    train, test = reference[:-1], reference[-1:]
    expected = [np.concatenate([r["data"] for r in part]).reshape(-1, 3, 32, 32) for part in (train, test)]
    expected_labels = [np.array([label for r in part for label in r[key]]) for part in (train, test)]
    xtr, ytr, xte, yte = datasets.load_arrays(f"cifar{classes}", str(tmp_path))
    assert np.array_equal(xtr, expected[0]) and np.array_equal(xte, expected[1])
    assert np.array_equal(ytr, expected_labels[0]) and np.array_equal(yte, expected_labels[1])
    assert xtr.dtype == np.uint8 and ytr.dtype == np.int64 and len(xtr) == sum(len(r[key]) for r in train)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("labels", ["python ints", "numpy int64", "an int64 array", "a big-endian int32 array"])
def test_python3s_own_pickles_of_cifar_load_as_plain_pickle_reads_them(protocol, labels, tmp_path,
                                                                       fabricated_publishers_files):
    """A CIFAR batch pickled again by Python 3 at any protocol (2: bytes as _codecs.encode; 5: numpy's _frombuffer),
    its labels Python ints, numpy scalars or an array: the same arrays as plain pickle.loads(encoding="latin1")."""
    rng, folder = np.random.default_rng(protocol), tmp_path / "cifar-10-batches-py"
    os.makedirs(folder)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        y = rng.integers(0, 10, 7)
        y = {"python ints": y.tolist(), "numpy int64": list(y), "an int64 array": y,
             "a big-endian int32 array": y.astype(">i4")}[labels]
        entry = {"batch_label": name, "labels": y, "data": rng.integers(0, 256, (7, 3072), dtype=np.uint8),
                 "filenames": [b"%d.png" % i for i in range(7)]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=protocol))
    reference = [pickle.loads((folder / name).read_bytes(), encoding="latin1") for name in names]
    xtr, ytr, xte, yte = datasets.load_arrays("cifar10", str(tmp_path))
    assert np.array_equal(xtr, np.concatenate([r["data"] for r in reference[:5]]).reshape(-1, 3, 32, 32))
    assert np.array_equal(xte, reference[5]["data"].reshape(-1, 3, 32, 32))
    assert ytr.tolist() == [int(v) for r in reference[:5] for v in r["labels"]] and ytr.dtype == np.int64
    assert yte.tolist() == [int(v) for v in reference[5]["labels"]]

def test_mnist_idx_files_plain_and_gz(tmp_path, fabricated_publishers_files):
    plain = write_mnist(str(tmp_path))
    xtr, ytr, xte, yte = datasets.load_arrays("mnist", str(tmp_path))
    assert xtr.shape == (40, 1, 28, 28) and np.array_equal(xtr[:, 0], plain["train"][0])
    assert np.array_equal(yte, plain["t10k"][1])
    gz = write_mnist(str(tmp_path), folder="FashionMNIST", gz=True)
    xtr, ytr, _, _ = datasets.load_arrays("fmnist", str(tmp_path))
    assert np.array_equal(ytr, gz["train"][1])
    em = write_mnist(str(tmp_path), folder="EMNIST", prefix="emnist-digits-")
    xtr, _, _, _ = datasets.load_arrays("emnist", str(tmp_path))
    assert np.array_equal(xtr[:, 0], em["train"][0].transpose(0, 2, 1))  # EMNIST is stored transposed


def test_truncated_idx_file_is_one_clear_error(tmp_path, fabricated_publishers_files):
    write_mnist(str(tmp_path))
    path = os.path.join(tmp_path, "MNIST", "raw", "train-images-idx3-ubyte")
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(common.UserError, match="corrupt or truncated"):
        datasets.load_arrays("mnist", str(tmp_path))


def test_cifar10_end_to_end_run(tmp_path, fabricated_publishers_files):
    write_cifar(str(tmp_path / "data"), 10)
    out = tmp_path / "runs"
    assert run_in_process("fedavg.py", "--dataset", "cifar10", "--data-dir", tmp_path / "data", "--rounds", "2",
                          "--num-clients", "2", "--partition", "iid", "--out", out) == 0
    config = json.load(open(os.path.join(run_dir(out), "config.json")))
    assert config["input_shape"] == [3, 32, 32] and config["num_classes"] == 10


@pytest.mark.parametrize("dataset,expected", [("cifar10", "cifar-10-python.tar.gz"), ("mnist", "train-images-idx3-ubyte"),
                                              ("cifar100", "cifar-100-python.tar.gz")])
@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_missing_files_without_network_is_one_line(tmp_path, dataset, expected):
    start = time.perf_counter()
    r = run_script("fedavg.py", "--dataset", dataset, "--data-dir", tmp_path / "nothing", "--out", tmp_path / "runs")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(tmp_path / "nothing") in lines[0]
    assert "Traceback" not in r.stdout + r.stderr
    assert time.perf_counter() - start < 60


# ----------------------------------------------------------------------------- the command line (items 2, 3, 4, 9, 10)

def read_metrics(folder, columns=("round", "test_acc", "test_acc_mean", "test_acc_std", "test_loss", "train_loss")):
    return [[row[c] for c in columns] for row in metrics_rows(folder)]


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_quick_start_under_a_minute(tmp_path):
    start = time.perf_counter()
    r = run_script("fedavg.py", "--dataset", "synthetic", "--rounds", "20", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert time.perf_counter() - start < 60
    progress = [l for l in r.stdout.splitlines() if "round " in l and "s/round" in l]
    assert len(progress) == 20 and "round 20/20" in progress[-1] and "ETA" in progress[-1]
    assert "summary" in r.stdout and "last-10 mean" in r.stdout
    folder = run_dir(tmp_path)
    assert {"config.json", "partition.json", "metrics.csv", "summary.json"} <= set(os.listdir(folder))
    assert len(read_metrics(folder)) == 20
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert set(summary["test_acc"]) == {"best", "final", "last10_mean"}
    partition = json.load(open(os.path.join(folder, "partition.json")))
    assert len(partition["train_class_counts"]) == 20 and len(partition["train_class_counts"][0]) == 10


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_same_seed_same_metrics_other_seed_other_partition(tmp_path):
    args = ["--dataset", "synthetic", "--rounds", "3", "--num-clients", "6"]
    outs = [tmp_path / n for n in "abc"]
    assert run_script("fedavg.py", *args, "--seed", 1, "--out", outs[0]).returncode == 0
    for out, seed in zip(outs[1:], (1, 2)):  # the same seed in another process gives the same run
        assert run_in_process("fedavg.py", *args, "--seed", seed, "--out", out) == 0
    a, b, c = (run_dir(o) for o in outs)
    assert read_metrics(a) == read_metrics(b)
    part = lambda d: json.load(open(os.path.join(d, "partition.json")))
    assert part(a) == part(b) and part(a) != part(c)


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_resume_ends_with_uninterrupted_metrics(tmp_path):
    args = ["--dataset", "synthetic", "--rounds", "6", "--num-clients", "5", "--join-ratio", "0.6",
            "--checkpoint-every", "2"]
    assert run_in_process("fedavg.py", *args, "--out", tmp_path / "full") == 0
    r = run_script("fedavg.py", *args, "--out", tmp_path / "cut", "--stop-after", "3")
    assert r.returncode == 0 and "stopping after round 3" in r.stdout
    cut = run_dir(tmp_path / "cut")
    assert len(read_metrics(cut)) == 3  # and round 3 has its checkpoint: --stop-after writes one
    r = run_script("fedavg.py", "--resume", cut)
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout
    assert read_metrics(cut) == read_metrics(run_dir(tmp_path / "full"))


def write_npz(path, n=60, classes=10, **extra):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(n, 8)).astype(np.float32), "y": np.arange(n) % classes, **extra}
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("flags,needle", [
    (["--dataset", "nosuch"], "unknown dataset"),
    (["--dataset", "synthetic", "--model", "transformer"], "unknown model"),
    (["--dataset", "synthetic", "--beta", "0"], "--beta"),
    (["--dataset", "synthetic", "--join-ratio", "0"], "--join-ratio"),
    (["--dataset", "synthetic", "--join-ratio", "1.5"], "--join-ratio"),
    (["--dataset", "synthetic", "--lr", "abc"], "--lr"),
    (["--dataset", "synthetic", "--resume", "/no/such/run"], "cannot resume"),
    (["--dataset", "NPZ", "--partition", "pat", "--classes-per-client", "11"], "--classes-per-client"),
    (["--dataset", "NPZ", "--num-clients", "100"], "100 clients"),
    (["--dataset", "NPZ_NO_Y"], "no array 'y'"),
    (["--dataset", "synthetic", "--parallel-clients", "0"], "--parallel-clients"),
    (["--dataset", "synthetic", "--parallel-clients", "many"], "--parallel-clients"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, flags, needle, capsys):
    npz, no_y = write_npz(tmp_path / "d.npz"), str(tmp_path / "bad.npz")
    np.savez(no_y, x=np.zeros((10, 4), np.float32))
    flags = [npz if f == "NPZ" else no_y if f == "NPZ_NO_Y" else f for f in flags]
    with pytest.raises(SystemExit) as stop:  # in-process: the same path as the command line, minus the start-up
        run_folder.run_main(fedavg.main, [*flags, "--rounds", "1", "--out", str(tmp_path / "runs")])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    r = run_script("fedavg.py", "--dataset", "synthetic", "--join-ratio", "2", "--out", tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "error: --join-ratio must be in (0, 1], got 2.0"


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_user_npz_runs(tmp_path):
    rng = np.random.default_rng(0)
    npz = str(tmp_path / "img.npz")
    np.savez(npz, x=rng.integers(0, 255, (80, 28, 28, 1), dtype=np.uint8), y=np.arange(80) % 4,
             x_test=rng.integers(0, 255, (20, 28, 28, 1), dtype=np.uint8), y_test=np.arange(20) % 4)
    r = run_script("fedavg.py", "--dataset", npz, "--rounds", "1", "--num-clients", "2", "--partition", "iid",
                   "--out", tmp_path / "runs")
    assert r.returncode == 0, r.stderr
    config = json.load(open(os.path.join(run_dir(tmp_path / "runs"), "config.json")))
    assert config["input_shape"] == [1, 28, 28] and config["num_classes"] == 4


def test_nan_loss_stops_naming_round_and_client_keeping_metrics(tmp_path, monkeypatch, capsys):
    real = fedavg.client_update

    def diverging(model, global_state, data, client, args, round_):
        state, loss = real(model, global_state, data, client, args, round_)
        return state, loss * float("nan") if round_ == 3 else loss

    monkeypatch.setattr(fedavg, "client_update", diverging)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", "synthetic", "--rounds", "5", "--num-clients", "3",
                                      "--out", str(tmp_path)])
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "round 3" in err[0] and "client 0" in err[0]
    assert [row[0] for row in read_metrics(run_dir(tmp_path))] == ["1", "2"]


@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_huge_lr_stops_cleanly(tmp_path):
    r = run_script("fedavg.py", "--dataset", "synthetic", "--rounds", "3", "--lr", "1e6", "--out", tmp_path)
    assert r.returncode == 1
    assert "loss became" in r.stderr and "on client" in r.stderr and "Traceback" not in r.stderr


def test_pool_train_stacks_the_returned_models_in_the_clients_order_and_transposes_the_rest():
    """ClientPool.train: the trained models (first return value) as rows in the order of ``clients``
    whatever order the threads finish in, and each further return value as a list over the clients;
    the rows are new each call, so that a caller may keep them."""
    models = [torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)]  # rows of 3: the weight's 2 and the bias
    pool = common.ClientPool(models, [1, 5, 3, 2])  # sizes: client 1 starts first

    def update(model, client):
        return torch.full((3,), float(client)), client * 10, f"c{client}"

    rows, tens, names = pool.train(update, [0, 2, 3, 1])
    assert torch.equal(rows, torch.tensor([[0.] * 3, [2.] * 3, [3.] * 3, [1.] * 3]))
    assert tens == [0, 20, 30, 10] and names == ["c0", "c2", "c3", "c1"]
    again, *_ = pool.train(update, [1])
    assert again.shape == (1, 3) and torch.equal(again[0], torch.ones(3))
    assert torch.equal(rows, torch.tensor([[0.] * 3, [2.] * 3, [3.] * 3, [1.] * 3]))  # the kept rows as they were


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_rows_a_round_returned_are_kept_as_they_were_through_the_next_round(parallel, one_thread):
    """A caller that keeps round r's rows (FedDyn, SCAFFOLD, a logged difference) reads round r's models after round
    r+1 of the same clients: each call's rows are new."""
    args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "5", "--parallel-clients", parallel])
    data = common.load_federated_data(args, torch.device("cpu"))
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data), torch.device("cpu"), data)
    start = common.flatten_state(pool.models[0]).detach().clone()
    kept, _ = pool.train(lambda model, client: fedavg.client_update(model, start, data, client, args, 1), [0, 1, 2])
    copy = kept.clone()
    again, _ = pool.train(lambda model, client: fedavg.client_update(model, start + 1, data, client, args, 2),
                          [0, 1, 2])
    assert torch.equal(kept, copy) and not torch.equal(kept, again)
