"""Every offline instruction works when followed: for each torchvision dataset, a run without network
says in one line what to put where; the publisher's file, fabricated in its exact format (only its
checksum differs) and put exactly there, then loads and trains. Debian's Fashion-MNIST layout (the four
.gz files in one folder, read where they lie) loads too."""
import gzip
import io
import os
import pickle
import re
import tarfile
import zipfile

import numpy as np
import pytest

import common
import data_formats
import datasets
import fedavg
import run_folder
from conftest import metrics_rows, run_dir
from test_datasets import NO_NETWORK

pytestmark = pytest.mark.usefixtures("fabricated_publishers_files")  # miniature files: not the real content

RNG = np.random.default_rng(0)
TRAIN_LABELS, TEST_LABELS = np.arange(40) % 4, np.arange(20) % 4
IMAGES = {"train": RNG.integers(0, 256, (40, 28, 28), dtype=np.uint8),
          "test": RNG.integers(0, 256, (20, 28, 28), dtype=np.uint8)}
CIFAR = {"train": RNG.integers(0, 256, (50, 3072), dtype=np.uint8), "test": RNG.integers(0, 256, (20, 3072),
                                                                                       dtype=np.uint8)}


def idx_bytes(array):
    """LeCun's idx format: 0, 0, 0x08 (unsigned bytes), the number of dimensions, big-endian int32 sizes, data."""
    return bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape) + array.tobytes()


def idx_files(prefix_train, prefix_test):
    return {f"{prefix_train}-images-idx3-ubyte": IMAGES["train"],
            f"{prefix_train}-labels-idx1-ubyte": TRAIN_LABELS.astype(np.uint8),
            f"{prefix_test}-images-idx3-ubyte": IMAGES["test"],
            f"{prefix_test}-labels-idx1-ubyte": TEST_LABELS.astype(np.uint8)}


def write_gz_files(folder, names, prefixes=("train", "t10k")):
    files = idx_files(*prefixes)
    for name in names:
        assert name.endswith(".gz") and name[:-3] in files, name
        with gzip.open(os.path.join(folder, name), "wb") as f:
            f.write(idx_bytes(files[name[:-3]]))


def write_emnist_zip(folder, names):
    assert names == ["gzip.zip"]
    with zipfile.ZipFile(os.path.join(folder, "gzip.zip"), "w") as z:  # EMNIST's zip: gzip/emnist-<split>-*.gz
        for stem, array in idx_files("emnist-digits-train", "emnist-digits-test").items():
            z.writestr(f"gzip/{stem}.gz", gzip.compress(idx_bytes(array)))
        z.writestr("gzip/emnist-letters-train-labels-idx1-ubyte.gz", gzip.compress(idx_bytes(np.zeros(3, np.uint8))))


def write_cifar_archive(folder, names, base, label_key, train_files):
    from test_foundation import python2_pickle  # the publisher's format: Python 2's cPickle
    (name,) = names
    with tarfile.open(os.path.join(folder, name), "w:gz") as tar:
        def add(member, entry):
            content = python2_pickle(entry)
            info = tarfile.TarInfo(f"{base}/{member}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        chunks = np.array_split(np.arange(50), len(train_files))
        for member, rows in zip(train_files, chunks):
            add(member, {"data": CIFAR["train"][rows], label_key: (np.arange(50)[rows] % 4).tolist()})
        add("test_batch" if base.startswith("cifar-10-") else "test",
            {"data": CIFAR["test"], label_key: (np.arange(20) % 4).tolist()})
        add("batches.meta" if base.startswith("cifar-10-") else "meta", {"label_names": ["a", "b", "c", "d"]})


WRITERS = {
    "mnist": write_gz_files, "fmnist": write_gz_files,
    "emnist": write_emnist_zip,
    "cifar10": lambda folder, names: write_cifar_archive(folder, names, "cifar-10-batches-py", "labels",
                                                         [f"data_batch_{i}" for i in range(1, 6)]),
    "cifar100": lambda folder, names: write_cifar_archive(folder, names, "cifar-100-python", "fine_labels", ["train"]),
}
PUT = re.compile(r"put (?P<what>.+?) from (?P<address>https?://\S+?)(?: \(or [^)]*\))? in (?P<where>\S+)")


def offline_line(dataset, data_dir, monkeypatch, capsys):
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", dataset, "--data-dir", str(data_dir),
                                          "--out", str(data_dir / "runs")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, line
    return line


@pytest.mark.slow  # an end-to-end run of seconds; in CI with the full suite
@pytest.mark.parametrize("dataset", list(WRITERS))
def test_the_offline_line_says_what_to_put_where_and_following_it_works(dataset, tmp_path, monkeypatch, capsys,
                                                                         one_thread):
    data_dir = tmp_path / "data"
    line = offline_line(dataset, data_dir, monkeypatch, capsys)
    put = PUT.search(line)
    assert put, line
    where = put["where"]
    assert where.startswith(str(data_dir))
    os.makedirs(where, exist_ok=True)
    WRITERS[dataset](where, put["what"].split(", "))
    run_folder.run_main(fedavg.main, ["--dataset", dataset, "--data-dir", str(data_dir), "--num-clients", "2",
                                      "--partition", "iid", "--rounds", "2", "--model", "mlp", "--device", "cpu",
                                      "--out", str(tmp_path / "runs")])
    assert len(metrics_rows(run_dir(tmp_path / "runs"))) == 2
    x, y, x_test, y_test = datasets.load_arrays(dataset, str(data_dir))
    if dataset.startswith("cifar"):
        assert np.array_equal(x.reshape(50, 3072), CIFAR["train"]) and np.array_equal(y, np.arange(50) % 4)
        assert np.array_equal(x_test.reshape(20, 3072), CIFAR["test"])
    else:
        images = IMAGES["train"].transpose(0, 2, 1) if dataset == "emnist" else IMAGES["train"]  # EMNIST: transposed
        assert np.array_equal(x[:, 0], images) and np.array_equal(y, TRAIN_LABELS)
        assert np.array_equal(y_test, TEST_LABELS) and x_test.shape == (20, 1, 28, 28)


def test_fmnist_offline_line_names_debians_package(tmp_path, monkeypatch, capsys):
    line = offline_line("fmnist", tmp_path / "data", monkeypatch, capsys)
    assert "apt-get install dataset-fashion-mnist" in line and "--data-dir /usr/share/datasets/fashion-mnist" in line


def test_the_files_are_read_where_they_lie_without_writing(tmp_path):
    """Debian's layout: the four .gz files in one folder (--data-dir at it), read-only; also plain idx files."""
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    names = [f"{stem}.gz" for stem in idx_files("train", "t10k")]
    write_gz_files(folder, names)
    os.chmod(folder, 0o555)
    try:
        x, y, x_test, y_test = datasets.load_arrays("fmnist", str(folder))
    finally:
        os.chmod(folder, 0o755)
    assert sorted(os.listdir(folder)) == sorted(names)
    assert np.array_equal(x[:, 0], IMAGES["train"]) and np.array_equal(y_test, TEST_LABELS)


def test_a_cifar_archive_put_where_an_older_message_said_is_unpacked_in_place(tmp_path, one_thread):
    """Older lines said to put the archive inside cifar-10-batches-py; it is unpacked there, not a folder deeper."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    WRITERS["cifar10"](str(folder), ["cifar-10-python.tar.gz"])
    x, y, _, _ = datasets.load_arrays("cifar10", str(tmp_path))
    assert np.array_equal(x.reshape(50, 3072), CIFAR["train"])
    assert not (folder / "cifar-10-batches-py").exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".")]


@pytest.mark.parametrize("cut", ["header", "data"])
def test_a_cut_idx_file_is_one_line(cut, tmp_path):
    write_gz_files(tmp_path, [f"{stem}.gz" for stem in idx_files("train", "t10k")])
    content = idx_bytes(IMAGES["train"])
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(content[:10] if cut == "header" else content[:-5])
    with pytest.raises(common.UserError, match="corrupt or truncated"):
        datasets.load_arrays("mnist", str(tmp_path))


def test_a_cut_file_in_a_folder_of_its_own_is_named_there(tmp_path):
    """Files read from --data-dir itself (Debian's layout): the line names that folder, not MNIST/raw below it."""
    write_gz_files(tmp_path, [f"{stem}.gz" for stem in idx_files("train", "t10k")])
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(TEST_LABELS.astype(np.uint8))[:-1])
    with pytest.raises(common.UserError, match=f"the fmnist files in {tmp_path} are corrupt or truncated") as e:
        datasets.load_arrays("fmnist", str(tmp_path))
    assert "FashionMNIST" not in str(e.value) and "holds 19 bytes of data; its header says 20" in str(e.value)


def refused_line(dataset, data_dir, capsys, *flags):
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", dataset, "--data-dir", str(data_dir), "--num-clients", "2",
                                          "--out", str(data_dir / "runs"), *flags])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, line
    return line


def test_a_readable_cifar_folder_of_another_layout_is_not_called_corrupt_and_names_the_npz_route(tmp_path, capsys):
    from test_foundation import write_cifar
    write_cifar(str(tmp_path), 10)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(pickle.dumps({"images": CIFAR["train"][:12], "labels": list(range(12))}))
    line = refused_line("cifar10", tmp_path, capsys)
    assert "readable but not the canonical cifar10 set" in line and "data_batch_2 is no dict with 'data'" in line
    assert "corrupt" not in line and "--dataset path/to/file.npz" in line
    batch.write_bytes(pickle.dumps({"data": CIFAR["train"][:12, :1024], "labels": list(range(12))}))
    line = refused_line("cifar10", tmp_path, capsys)
    assert "readable but not the canonical cifar10 set" in line and "holds no uint8 (N, 3072) images" in line
    batch.write_bytes(pickle.dumps({"data": CIFAR["train"][:12], "labels": list(range(12))})[:-40])  # cut short
    line = refused_line("cifar10", tmp_path, capsys)
    assert "are corrupt or truncated" in line and "--dataset path/to/file.npz" in line


def test_cifar_files_of_other_sizes_name_the_npz_route(tmp_path, capsys, monkeypatch):
    from test_foundation import write_cifar
    write_cifar(str(tmp_path), 10)  # 60 + 12 images, a table that expects CIFAR-10's 50,000 + 10,000
    monkeypatch.setitem(data_formats.KNOWN_CONTENT, "cifar10", {"title": "CIFAR-10", "shape": (3, 32, 32),
                                                            "classes": 10, "sizes": (50000, 10000)})
    line = refused_line("cifar10", tmp_path, capsys)
    assert "is not CIFAR-10's training images: 60 images" in line and line.endswith("(docs/datasets.md)")
    assert "--dataset path/to/file.npz" in line


DOC_OFFLINE = {"cifar10": ["docs/running.md", "docs/datasets.md"], "fmnist": ["docs/datasets.md"],
               "emnist": ["docs/datasets.md"]}


@pytest.mark.parametrize("dataset", DOC_OFFLINE)
def test_the_offline_lines_the_docs_show_are_what_a_run_prints(dataset, tmp_path, monkeypatch, capsys):
    """docs/running.md and docs/datasets.md quote the line of a run at the default --data-dir ./data."""
    from conftest import ROOT
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run_folder.run_main(fedavg.main, ["--dataset", dataset, "--out", str(tmp_path / "runs")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {dataset} is not in ./data")
    for doc in DOC_OFFLINE[dataset]:
        with open(os.path.join(ROOT, doc)) as f:
            shown = [ln.strip() for ln in f if ln.strip().startswith(f"error: {dataset} is not in ")]
        assert shown == [line], (doc, shown)
