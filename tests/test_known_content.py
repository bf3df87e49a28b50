"""The publishers' datasets are checked for their known content (data_formats.KNOWN_CONTENT, docs/datasets.md):
well-formed files with the wrong content are refused in one line naming the file; an idx file is never
inflated beyond what its header declares; a load that fails leaves no folder it made. Files of the real
sizes are fabricated here with only the property under test changed; Fashion-MNIST's own files are used
where they are installed (Debian's dataset-fashion-mnist)."""
import gzip
import os
import shutil
import tracemalloc
import zlib

import numpy as np
import pytest

import common
import data_formats
import datasets
import fedavg
import run_folder
from conftest import metrics_rows, run_dir
from test_datasets import NO_NETWORK
from test_offline_data import idx_bytes

FMNIST_DIR = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
STEMS = data_formats.IDX_FILES["mnist"]  # MNIST's and Fashion-MNIST's file names
MNIST = data_formats.KNOWN_CONTENT["mnist"]


@pytest.fixture
def fmnist_dir():
    if not all(os.path.isfile(os.path.join(FMNIST_DIR, f"{s}.gz")) for s in STEMS):
        pytest.skip(f"Fashion-MNIST is not in {FMNIST_DIR} (apt-get install dataset-fashion-mnist)")
    return FMNIST_DIR


def labels_with_counts(counts, rng):
    return rng.permutation(np.repeat(np.arange(len(counts)), counts)).astype(np.uint8)


def write_idx_folder(folder, train_labels, test_labels, rng):
    """Plain idx files of random images with these labels, under MNIST's (and Fashion-MNIST's) names."""
    os.makedirs(folder, exist_ok=True)
    arrays = (rng.integers(0, 256, (len(train_labels), 28, 28), dtype=np.uint8), train_labels,
              rng.integers(0, 256, (len(test_labels), 28, 28), dtype=np.uint8), test_labels)
    for stem, array in zip(STEMS, arrays):
        with open(os.path.join(folder, stem), "wb") as f:
            f.write(idx_bytes(array))
    return arrays


def refused(name, data_dir):
    with pytest.raises(common.UserError) as e:
        datasets.load_arrays(name, str(data_dir))
    line = str(e.value)
    assert "\n" not in line
    return line


def tree(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, dirs, files in os.walk(folder)
                  for f in files + dirs)


# ----------------------------------------------------------------------------- the table itself

def test_every_publishers_dataset_has_a_consistent_entry():
    assert set(data_formats.KNOWN_CONTENT) == set(data_formats.VISION)
    for name, known in data_formats.KNOWN_CONTENT.items():
        assert len(known["shape"]) == 3 and len(known["sizes"]) == 2, name
        for split in (0, 1):  # the per-class counts add up to the sizes, one count per class
            assert len(known["counts"][split]) == known["classes"] and \
                sum(known["counts"][split]) == known["sizes"][split], name
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in known.get("sha256", ())), name
    assert data_formats.KNOWN_CONTENT["fmnist"]["sha256"], "Fashion-MNIST's fingerprint was computed from its files"


# ----------------------------------------------------------------------------- wrong content, real sizes

def test_a_label_outside_the_classes_is_refused_naming_the_file_and_sample(tmp_path):
    rng = np.random.default_rng(0)
    test_labels = labels_with_counts(MNIST["counts"][1], rng)
    test_labels[5] = 10
    write_idx_folder(tmp_path, labels_with_counts(MNIST["counts"][0], rng), test_labels, rng)
    line = refused("mnist", tmp_path)
    assert line.startswith(f"{tmp_path / 't10k-labels-idx1-ubyte'}: label 10 (sample 5) is outside MNIST's classes "
                           "0..9"), line


def test_digits_under_fashion_mnists_names_are_not_fashion_mnist(tmp_path):
    """Images with MNIST's class counts saved under Fashion-MNIST's file names: refused as not Fashion-MNIST,
    with the dataset they look like."""
    rng = np.random.default_rng(1)
    write_idx_folder(tmp_path, *(labels_with_counts(c, rng) for c in MNIST["counts"]), rng)
    line = refused("fmnist", tmp_path)
    assert line.startswith(f"{tmp_path / 'train-labels-idx1-ubyte'} is not Fashion-MNIST's training labels: its "
                           "classes hold 5923, 6742, 5958,"), line
    assert "Fashion-MNIST's 6000 in each" in line and "MNIST's: --dataset mnist" in line
    assert datasets.load_arrays("mnist", str(tmp_path))[0].shape == (60000, 1, 28, 28)  # what they are loads


def test_a_header_of_other_sizes_is_refused_before_its_data_is_read(tmp_path):
    """A header declaring 1 GiB of images where MNIST has 47 MB: refused from the header alone (the file holds
    nothing more to read)."""
    os.makedirs(tmp_path / "MNIST" / "raw")
    for stem in STEMS:
        with gzip.open(tmp_path / "MNIST" / "raw" / f"{stem}.gz", "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (1369600, 28, 28)))
    line = refused("mnist", tmp_path)
    assert "train-images-idx3-ubyte.gz is not MNIST's training images: its header declares 1369600x28x28 values " \
           "where 60000x28x28 are expected" in line, line


def test_a_cifar_label_outside_the_classes_names_its_batch(tmp_path, monkeypatch):
    """CIFAR's five training batches: the line names the one that holds the label (a table of this
    miniature's sizes stands in for CIFAR-10's 50,000 images)."""
    from test_foundation import write_cifar
    written = write_cifar(str(tmp_path), 10)
    monkeypatch.setitem(data_formats.KNOWN_CONTENT, "cifar10",
                        {**data_formats.KNOWN_CONTENT["cifar10"], "sizes": (60, 12)})
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    entry = {"data": written["data_batch_3"][0], "labels": [int(v) for v in written["data_batch_3"][1]]}
    entry["labels"][4] = 12
    import pickle
    batch.write_bytes(pickle.dumps(entry))
    assert refused("cifar10", tmp_path).startswith(f"{batch}: label 12 (sample 4) is outside CIFAR-10's classes 0..9")


def test_another_fingerprint_is_refused_and_the_match_is_named(tmp_path, monkeypatch):
    """Sizes and counts right, content not: the sha256 of the decoded arrays decides (a table of this
    miniature's content stands in for Fashion-MNIST's)."""
    rng = np.random.default_rng(2)
    arrays = write_idx_folder(tmp_path / "ours", np.arange(40, dtype=np.uint8) % 4, np.arange(20, dtype=np.uint8) % 4,
                              rng)
    x, y, x_test, y_test = (a[:, None] if a.ndim == 3 else a for a in arrays)
    entry = {"shape": (1, 28, 28), "classes": 4, "sizes": (40, 20), "counts": ((10,) * 4, (5,) * 4),
             "sha256": tuple(data_formats.content_sha256(a) for a in (x, y, x_test, y_test))}
    monkeypatch.setattr(data_formats, "KNOWN_CONTENT", {"fmnist": {**entry, "title": "Fashion-MNIST"},
                                                    "mnist": {**entry, "title": "MNIST", "sha256": ("0" * 64,) * 4}})
    assert datasets.load_arrays("fmnist", str(tmp_path / "ours"))[0].shape == (40, 1, 28, 28)
    shutil.copytree(tmp_path / "ours", tmp_path / "changed")
    x[7, 0, 3, 3] ^= 1  # one pixel
    with open(tmp_path / "changed" / STEMS[0], "wb") as f:
        f.write(idx_bytes(x[:, 0]))
    line = refused("fmnist", tmp_path / "changed")
    assert line.startswith(f"{tmp_path / 'changed' / STEMS[0]} is not Fashion-MNIST's training images: the sha256 "
                           f"of its decoded content is {data_formats.content_sha256(x)[:16]}"), line
    assert "these are" not in refused("fmnist", tmp_path / "changed")
    line = refused("mnist", tmp_path / "ours")  # Fashion-MNIST's content read as MNIST: named as what it is
    assert "is not MNIST's training images" in line and "(these are Fashion-MNIST's: --dataset fmnist)" in line


# ----------------------------------------------------------------------------- Fashion-MNIST's own files

def test_fashion_mnist_loads_and_is_refused_as_mnist(fmnist_dir):
    x, y, x_test, y_test = datasets.load_arrays("fmnist", fmnist_dir)
    assert x.shape == (60000, 1, 28, 28) and np.bincount(y_test).tolist() == [1000] * 10
    before = tree(fmnist_dir)
    line = refused("mnist", fmnist_dir)
    assert "train-labels-idx1-ubyte.gz is not MNIST's training labels" in line and \
        "(these are Fashion-MNIST's: --dataset fmnist)" in line, line
    assert tree(fmnist_dir) == before  # nothing made in Debian's folder


def test_one_label_byte_of_fashion_mnist_changed_is_one_line_exit_2(fmnist_dir, tmp_path, capsys, monkeypatch):
    """The sweep's case: label 200 in Debian's training labels, under pfedla1 (whose partition would blame
    --samples-per-client); and one pixel changed, caught by the fingerprint."""
    data = tmp_path / "data"
    data.mkdir()
    for stem in STEMS[:1] + STEMS[2:]:
        os.symlink(os.path.join(fmnist_dir, f"{stem}.gz"), data / f"{stem}.gz")
    with gzip.open(os.path.join(fmnist_dir, f"{STEMS[1]}.gz")) as f:
        labels = bytearray(f.read())
    original, labels[8 + 1234] = labels[8 + 1234], 200
    (data / STEMS[1]).write_bytes(labels)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", "fmnist", "--data-dir", str(data), "--partition", "pfedla1",
                                          "--num-clients", "10", "--rounds", "1", "--out", str(tmp_path / "runs")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and line == (f"error: {data / STEMS[1]}: label 200 (sample 1234) is outside "
                                             "Fashion-MNIST's classes 0..9: this is not Fashion-MNIST's file")
    assert not (tmp_path / "runs").exists()
    labels[8 + 1234] = original
    (data / STEMS[1]).write_bytes(labels)
    with gzip.open(os.path.join(fmnist_dir, f"{STEMS[2]}.gz")) as f:
        images = bytearray(f.read())
    images[16 + 500] ^= 1
    os.remove(data / f"{STEMS[2]}.gz")
    (data / STEMS[2]).write_bytes(images)
    assert refused("fmnist", data).startswith(f"{data / STEMS[2]} is not Fashion-MNIST's test images: the sha256")


# ----------------------------------------------------------------------------- decompression bounded by the header

def gzip_of(header, zeros, path):
    """A .gz of ``header`` followed by ``zeros`` zero bytes, written without holding them."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    chunk = bytes(1 << 20)
    with open(path, "wb") as f:
        f.write(compressor.compress(header))
        for _ in range(zeros >> 20):
            f.write(compressor.compress(chunk))
        f.write(compressor.flush())


def test_a_gzip_bomb_is_refused_after_the_declared_size(tmp_path, fabricated_publishers_files):
    """A member that inflates to 50 MB behind a header declaring 40 images: refused once one byte more than
    the header declares is read, so no more than about the declared size is ever held."""
    os.makedirs(tmp_path / "MNIST" / "raw")
    rng = np.random.default_rng(3)
    arrays = (rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), np.arange(40, dtype=np.uint8) % 4,
              rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), np.arange(20, dtype=np.uint8) % 4)
    for stem, array in zip(STEMS, arrays):
        (tmp_path / "MNIST" / "raw" / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(array)))
    header = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (40, 28, 28))
    gzip_of(header, 50 << 20, tmp_path / "MNIST" / "raw" / f"{STEMS[0]}.gz")
    assert os.path.getsize(tmp_path / "MNIST" / "raw" / f"{STEMS[0]}.gz") < 200_000
    import torchvision  # noqa: F401  imported before measuring: its import alone allocates tens of MB
    tracemalloc.start()
    try:
        line = refused("mnist", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "corrupt or truncated" in line and "train-images-idx3-ubyte holds more than the 31360 bytes of data its " \
                                              "header says" in line, line
    assert peak < 5 << 20, f"{peak / 2 ** 20:.1f} MB held while refusing a 50 MB member"


def test_read_idx_reads_exactly_the_declared_bytes(tmp_path):
    import io
    content = idx_bytes(np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert data_formats.read_idx(io.BytesIO(content), "f").tolist() == [[0, 1, 2], [3, 4, 5]]
    stream = io.BytesIO(content + bytes(10))
    with pytest.raises(ValueError, match="holds more than the 6 bytes"):
        data_formats.read_idx(stream, "f")
    assert stream.tell() == len(content) + 1  # read one byte beyond, no more
    with pytest.raises(ValueError, match="holds 5 bytes of data; its header says 6"):
        data_formats.read_idx(io.BytesIO(content[:-1]), "f")


# ----------------------------------------------------------------------------- a failed load leaves nothing it made

@pytest.fixture
def offline(monkeypatch):
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("name", ["mnist", "fmnist", "emnist", "cifar10", "agnews", "tinyimagenet"])
def test_an_offline_load_into_a_mistyped_data_dir_makes_no_folder(name, tmp_path, offline):
    line = refused(name, tmp_path / "typo" / "deeper" / "data")
    assert "could not be downloaded" in line
    assert os.listdir(tmp_path) == []


def test_a_missing_file_in_a_folder_of_the_files_makes_nothing_there(tmp_path, offline, fabricated_publishers_files):
    """Debian's layout with one file gone: the download attempt's FashionMNIST/raw is not left in it."""
    rng = np.random.default_rng(4)
    write_idx_folder(tmp_path, np.arange(40, dtype=np.uint8) % 4, np.arange(20, dtype=np.uint8) % 4, rng)
    os.remove(tmp_path / STEMS[3])
    before = tree(tmp_path)
    assert "could not be downloaded" in refused("fmnist", tmp_path)
    assert tree(tmp_path) == before


def test_data_dir_empty_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", "fmnist", "--data-dir", "", "--out", str(tmp_path / "runs")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "--data-dir must name the folder" in line
    assert os.listdir(tmp_path) == []


def test_resume_does_not_recreate_a_deleted_data_folder(tmp_path, offline, fabricated_publishers_files, capsys,
                                                        one_thread):
    rng = np.random.default_rng(5)
    data = tmp_path / "data"
    write_idx_folder(data / "FashionMNIST" / "raw", np.arange(40, dtype=np.uint8) % 4,
                     np.arange(20, dtype=np.uint8) % 4, rng)
    run_folder.run_main(fedavg.main, ["--dataset", "fmnist", "--data-dir", str(data), "--num-clients", "2",
                                      "--partition", "iid", "--rounds", "1", "--model", "mlp", "--device", "cpu",
                                      "--out", str(tmp_path / "runs")])
    run = run_dir(tmp_path / "runs")
    shutil.rmtree(data)
    before = tree(run)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--resume", run, "--rounds", "2", "--data-dir", str(data)])
    assert stop.value.code == 2 and "could not be downloaded" in capsys.readouterr().err
    assert not data.exists() and tree(run) == before and len(metrics_rows(run)) == 1


def test_a_cifar_archive_declaring_more_than_a_cifar_is_refused_at_that_header(tmp_path):
    """A tar member declaring 300 MB (the data need not even follow): refused from its header, and the folder
    made to unpack it is removed again."""
    import io
    import tarfile
    member = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    member.size = 300_000_000
    header = io.BytesIO()
    with tarfile.open(fileobj=header, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("cifar-10-batches-py/readme.html"), io.BytesIO())
    content = header.getvalue()[:512] + member.tobuf(tarfile.GNU_FORMAT) + bytes(512 * 4)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(gzip.compress(content))
    line = refused("cifar10", tmp_path)
    assert line.startswith(f"{tmp_path / 'cifar-10-python.tar.gz'}: its files declare more than cifar10's") and \
        "data_batch_1: 286.1 MB" in line, line
    assert os.listdir(tmp_path) == ["cifar-10-python.tar.gz"]
