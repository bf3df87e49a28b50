"""Tiny-ImageNet and AG News loaders (SPEC 1.1) on fabricated miniature copies of the real files."""
import csv
import hashlib
import os
import shutil
import time
import types
import zipfile
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

import common
import data_formats
import datasets
import fedavg
import run_folder
from conftest import ROOT, metrics_rows, run_dir, run_script

# No download may leave this machine during tests, with or without a network: urllib sends
# everything to a closed local port and fails at once.
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
              "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}

# ----------------------------------------------------------------------------- Tiny-ImageNet

WNIDS = ["n09999999", "n01443537", "n05555555", "n02000000"]  # wnids.txt order, deliberately not sorted
VAL_LABELS = [2, 0, 3, 1, 1, 3, 0, 2]  # label of val_<i>.JPEG: not grouped, not in file order
TRAIN_PER_CLASS = 10


def red(label):
    """The red level that marks an image of class ``label`` (survives JPEG within a few levels)."""
    return 20 + 60 * label


def class_of(image):
    return int(round((float(image[0].astype(np.float64).mean()) - 20) / 60))


def write_jpeg(path, label, gray=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if gray:
        Image.fromarray(np.full((64, 64), red(label), np.uint8), mode="L").save(path, "JPEG", quality=95)
    else:
        pixels = np.empty((64, 64, 3), np.uint8)
        pixels[..., 0], pixels[..., 1], pixels[..., 2] = red(label), 90, 160
        Image.fromarray(pixels).save(path, "JPEG", quality=95)


def make_tiny(data_dir):
    """A tiny-imagenet-200/ tree laid out like the real one (4 classes, one grayscale JPEG)."""
    root = os.path.join(data_dir, "tiny-imagenet-200")
    os.makedirs(root)
    with open(os.path.join(root, "wnids.txt"), "w") as f:
        f.write("\n".join(WNIDS) + "\n")
    with open(os.path.join(root, "words.txt"), "w") as f:
        f.write("".join(f"{w}\tthing {i}\n" for i, w in enumerate(WNIDS)))
    for label, wnid in enumerate(WNIDS):
        for j in range(TRAIN_PER_CLASS):
            write_jpeg(os.path.join(root, "train", wnid, "images", f"{wnid}_{j}.JPEG"), label,
                       gray=(label == 1 and j == 3))
        with open(os.path.join(root, "train", wnid, f"{wnid}_boxes.txt"), "w") as f:
            f.write(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
    lines = []
    for i, label in enumerate(VAL_LABELS):
        write_jpeg(os.path.join(root, "val", "images", f"val_{i}.JPEG"), label)
        lines.append(f"val_{i}.JPEG\t{WNIDS[label]}\t{i}\t3\t50\t61\n")
    with open(os.path.join(root, "val", "val_annotations.txt"), "w") as f:
        f.write("".join(lines[i] for i in [5, 2, 7, 0, 3, 6, 1, 4]))  # annotation lines shuffled too
    write_jpeg(os.path.join(root, "test", "images", "test_0.JPEG"), 0)  # unlabelled: ignored
    return root


def check_tiny_arrays(xtr, ytr, xte, yte):
    assert xtr.dtype == xte.dtype == np.uint8 and ytr.dtype == yte.dtype == np.int64
    assert xtr.shape == (4 * TRAIN_PER_CLASS, 3, 64, 64) and xte.shape == (len(VAL_LABELS), 3, 64, 64)
    # label = line of the wnid in wnids.txt, read back from the pixels
    assert [class_of(im) for im in xtr] == ytr.tolist()
    assert np.bincount(ytr).tolist() == [TRAIN_PER_CLASS] * 4
    # val labels come from val_annotations.txt: every image carries the label of its own file
    assert [class_of(im) for im in xte] == yte.tolist()
    assert sorted(yte.tolist()) == sorted(VAL_LABELS)


def test_tinyimagenet_labels_grayscale_and_cache(tmp_path):
    data_dir = str(tmp_path)
    make_tiny(data_dir)
    xtr, ytr, xte, yte = datasets.load_arrays("tinyimagenet", data_dir)
    check_tiny_arrays(xtr, ytr, xte, yte)
    gray = xtr[(ytr == 1).nonzero()[0][3]]  # the grayscale JPEG became three equal channels
    assert np.array_equal(gray[0], gray[1]) and np.array_equal(gray[1], gray[2])
    assert abs(int(gray[0].mean()) - red(1)) <= 3

    cache = tmp_path / data_formats.TINY_CACHE
    assert cache.exists() and not [p for p in os.listdir(data_dir) if p.startswith(".")]  # no temp files left
    stamp = cache.stat().st_mtime_ns
    shutil.rmtree(tmp_path / "tiny-imagenet-200")  # the second load needs only the cache
    again = datasets.load_arrays("tinyimagenet", data_dir)
    assert cache.stat().st_mtime_ns == stamp
    for a, b in zip((xtr, ytr, xte, yte), again):
        assert np.array_equal(a, b)

    cache.write_bytes(b"not a zip")
    with pytest.raises(common.UserError, match="delete it to rebuild"):
        datasets.load_arrays("tinyimagenet", data_dir)


def test_tinyimagenet_from_zip_and_corrupt_zip(tmp_path):
    source = tmp_path / "source"
    root = make_tiny(str(source))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with zipfile.ZipFile(data_dir / "tiny-imagenet-200.zip", "w") as z:
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                z.write(path, os.path.relpath(path, source))
    check_tiny_arrays(*datasets.load_arrays("tinyimagenet", str(data_dir)))
    assert (data_dir / "tiny-imagenet-200" / "val" / "val_annotations.txt").exists()

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tiny-imagenet-200.zip").write_bytes((data_dir / "tiny-imagenet-200.zip").read_bytes()[:5000])
    with pytest.raises(common.UserError, match="tiny-imagenet-200.zip is corrupt"):
        datasets.load_arrays("tinyimagenet", str(broken))
    assert not (broken / "tiny-imagenet-200").exists()  # no half-extracted folder


def test_tinyimagenet_bad_annotations(tmp_path):
    root = make_tiny(str(tmp_path))
    with open(os.path.join(root, "val", "val_annotations.txt"), "a") as f:
        f.write("val_99.JPEG\tn00000000\t0\t0\t1\t1\n")  # a wnid not in wnids.txt
    with pytest.raises(common.UserError, match="val_annotations.txt line 9"):
        datasets.load_arrays("tinyimagenet", str(tmp_path))
    shutil.rmtree(os.path.join(root, "val"))
    with pytest.raises(common.UserError, match="val_annotations.txt is missing: .* is incomplete"):
        datasets.load_arrays("tinyimagenet", str(tmp_path))
    assert not os.path.exists(tmp_path / data_formats.TINY_CACHE)  # nothing cached from a broken folder


def test_tinyimagenet_global_split_uses_val_as_test_set(tmp_path):
    make_tiny(str(tmp_path))
    args = fedavg.parse_args(["--dataset", "tinyimagenet", "--data-dir", str(tmp_path), "--test-split", "global",
                              "--partition", "iid", "--num-clients", "2"])
    data = common.load_federated_data(args, torch.device("cpu"))
    assert data.num_classes == 4 and tuple(data.x.shape[1:]) == (3, 64, 64) and data.x.is_floating_point()
    assert len(data.global_test_idx) == len(VAL_LABELS)
    assert sorted(data.y[data.global_test_idx].tolist()) == sorted(VAL_LABELS)
    assert sum(len(t) for t in data.train_idx) == 4 * TRAIN_PER_CLASS


def test_download_checks_md5_and_leaves_no_partial_file(tmp_path):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(3000))
    url = payload.as_uri()  # urllib reads file:// URLs: a download without a network
    target = tmp_path / "out" / "file.zip"
    with pytest.raises(data_formats.ChecksumError):
        data_formats._download(url, str(target), md5="0" * 32)
    assert os.listdir(tmp_path / "out") == []
    data_formats._download(url, str(target), md5=hashlib.md5(payload.read_bytes()).hexdigest())
    assert target.read_bytes() == payload.read_bytes() and os.listdir(tmp_path / "out") == ["file.zip"]


# ----------------------------------------------------------------------------- AG News

def test_basic_english_matches_torchtext():
    # outputs of torchtext.data.utils.get_tokenizer("basic_english")
    assert data_formats.basic_english_tokens("You can now install TorchText using pip!") == \
        ["you", "can", "now", "install", "torchtext", "using", "pip", "!"]
    assert data_formats.basic_english_tokens('Wall St. Bears (Reuters): "short-sellers", don\'t;') == \
        ["wall", "st", ".", "bears", "(", "reuters", ")", "short-sellers", ",", "don", "'", "t"]


def test_vocab_and_encoding_by_hand():
    vocab = data_formats.build_vocab([["b", "a", "b"], ["c", "a", "b"]])
    assert vocab == {"b": 2, "a": 3, "c": 4}  # by count, ties alphabetical; 0 pads, 1 is unknown
    x = data_formats.encode_tokens([["a", "zzz", "c"], ["b"] * 7], vocab, max_len=5)
    assert x.dtype == np.int64
    assert x.tolist() == [[3, 1, 4, 0, 0], [2, 2, 2, 2, 2]]


def write_agnews(folder):
    """Fabricated AG News CSVs in the real format; classes 1-4 have their own words."""
    words = {1: "election minister treaty", 2: "match goal coach", 3: "stocks profit market", 4: "software chip internet"}
    rng = np.random.default_rng(0)
    os.makedirs(folder)

    def rows(n, extra):
        out = []
        for i in range(n):
            c = i % 4 + 1
            text = " ".join(rng.choice(words[c].split(), 6))
            out.append([str(c), f"Title {text.title()}.", f'{text}, "quoted" ({extra})'])
        return out

    train = rows(40, "reuters")
    train.append(["2", "Long", " ".join(["goal"] * 250)])  # longer than 200 tokens
    test = rows(12, "zebra")  # 'zebra' never occurs in training text
    for name, content in (("train.csv", train), ("test.csv", test)):
        with open(os.path.join(folder, name), "w", newline="") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows(content)
    return train, test


def test_agnews_vocab_from_train_only(tmp_path):
    """--agnews-vocab train, our choice: the training words only, test-only words unknown (id 1)."""
    train, test = write_agnews(str(tmp_path / "ag_news_csv"))
    xtr, ytr, xte, yte = datasets.load_arrays("agnews", str(tmp_path), "train")
    assert xtr.dtype == xte.dtype == np.int64 and xtr.shape == (41, 200) and xte.shape == (12, 200)
    assert ytr.tolist() == [int(r[0]) - 1 for r in train] and set(yte.tolist()) == {0, 1, 2, 3}

    train_words = {t for r in train for t in data_formats.basic_english_tokens(" ".join(r[1:]))}
    used = set(np.unique(xtr).tolist())
    assert used == {0} | set(range(2, len(train_words) + 2))  # every training word has an id, 0 pads

    def ids(row, text):
        tokens = data_formats.basic_english_tokens(text)
        return dict(zip(tokens, row[:len(tokens)].tolist()))

    first_train, first_test = ids(xtr[0], " ".join(train[0][1:])), ids(xte[0], " ".join(test[0][1:]))
    assert first_test["zebra"] == data_formats.UNK_ID and "zebra" not in train_words
    assert first_test["quoted"] == first_train["quoted"] != data_formats.UNK_ID  # shared words keep their training id
    length = len(data_formats.basic_english_tokens(" ".join(train[0][1:])))
    assert (xtr[0, :length] > 0).all() and (xtr[0, length:] == 0).all()  # padded with 0
    long_row = ids(xtr[40], " ".join(train[40][1:]))
    assert (xtr[40, 1:] == long_row["goal"]).all() and xtr[40, 0] == long_row["long"]  # 251 tokens cut to 200

    args = fedavg.parse_args(["--dataset", "agnews", "--data-dir", str(tmp_path), "--partition", "iid",
                              "--num-clients", "2", "--agnews-vocab", "train"])
    data = common.load_federated_data(args, torch.device("cpu"))
    assert data.x.dtype == torch.int64 and data.vocab_size == len(train_words) + 2
    model = common.build_model("auto", data)
    assert isinstance(model, common.FastText) and model.embedding.num_embeddings == data.vocab_size


def test_agnews_vocab_as_the_authors_built_it(tmp_path):
    """The default: one vocabulary over the train and test texts (TsingZ0/PFLlib dataset/generate_agnews.py
    @ 45e310d): by count, ties alphabetical, words from id 1, id 0 padding; its size + 1 is the embedding
    size (98,635 on the real files, FedALA's fastText). Recomputed here with a Counter."""
    train, test = write_agnews(str(tmp_path / "ag_news_csv"))
    xtr, _, xte, _ = datasets.load_arrays("agnews", str(tmp_path))
    texts = [data_formats.basic_english_tokens(" ".join(r[1:])) for r in train + test]
    counts = Counter(t for tokens in texts for t in tokens)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    expected = np.zeros((len(texts), 200), dtype=np.int64)
    for row, tokens in enumerate(texts):
        ids = [words.index(t) + 1 for t in tokens[:200]]
        expected[row, :len(ids)] = ids
    assert np.array_equal(np.concatenate([xtr, xte]), expected)
    zebra = words.index("zebra") + 1  # a test-only word has its own id: nothing is unknown
    assert (xte == zebra).any() and not (xtr == zebra).any() and max(xtr.max(), xte.max()) == len(words)
    args = fedavg.parse_args(["--dataset", "agnews", "--data-dir", str(tmp_path), "--partition", "iid",
                              "--num-clients", "2"])
    data = common.load_federated_data(args, torch.device("cpu"))
    assert data.vocab_size == len(words) + 1 == common.build_model("auto", data).embedding.num_embeddings


def test_fasttext_averages_over_all_positions_padding_included():
    """The authors' fastText (TsingZ0/FedALA models.py @ 7939ca7): embedding(text).mean(1) over all L
    positions; a padded batch checked by hand against the embedding table, and against a mean over the
    non-padding tokens, which it is not."""
    torch.manual_seed(0)
    model = common.FastText(10, 4, embed_dim=3, hidden=5)
    tokens = torch.tensor([[4, 7, 0, 0, 0], [2, 0, 0, 0, 0], [1, 2, 3, 4, 5]])
    table = model.embedding.weight.detach()
    assert torch.equal(table[0], torch.zeros(3))  # padding embeds to zeros
    head = lambda mean: model.fc(model.fc1(mean))
    with torch.no_grad():
        authors = head(torch.stack([(table[4] + table[7]) / 5, table[2] / 5, table[1:6].sum(0) / 5]))
        by_token = head(torch.stack([(table[4] + table[7]) / 2, table[2], table[1:6].sum(0) / 5]))
        torch.testing.assert_close(model(tokens), authors)
        assert not torch.allclose(model(tokens)[:2], by_token[:2])


# ----------------------------------------------------------------------------- models on 64x64

def test_models_on_64x64():
    cnn = common.CNN(3, 200, 64)
    assert cnn.fc1.in_features == 10816
    assert cnn(torch.zeros(2, 3, 64, 64)).shape == (2, 200)
    data = types.SimpleNamespace(x=torch.zeros(2, 3, 64, 64), num_classes=200, info={})
    resnet = common.build_model("resnet18", data).eval()
    assert resnet(data.x).shape == (2, 200)


# ----------------------------------------------------------------------------- command line

def out_rows(out):
    return metrics_rows(run_dir(out))


@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_fedavg_trains_on_tinyimagenet(tmp_path):
    make_tiny(str(tmp_path / "data"))
    result = run_script("fedavg.py", "--dataset", "tinyimagenet", "--data-dir", tmp_path / "data", "--rounds", 3,
                        "--num-clients", 2, "--partition", "iid", "--model", "cnn", "--out", tmp_path / "runs",
                        env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    assert "input (3, 64, 64)" in result.stdout and "4 classes" in result.stdout
    rows = out_rows(tmp_path / "runs")
    # it trains: the loss falls every round, and the classes (one colour each) are told apart above chance (25%):
    # 58.3 after round 1, 83.3 after round 3
    losses = [float(r["train_loss"]) for r in rows]
    assert [r["round"] for r in rows] == ["1", "2", "3"] and losses == sorted(losses, reverse=True)
    assert len(set(losses)) == 3 and float(rows[-1]["test_acc"]) >= 50


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
@pytest.mark.parametrize("script", ["fedavg.py", "fedala.py"])
def test_fasttext_trains_on_agnews(tmp_path, script):
    if not os.path.exists(os.path.join(ROOT, script)):
        pytest.skip(f"{script} is not in the repository yet")
    write_agnews(str(tmp_path / "data" / "ag_news_csv"))
    result = run_script(script, "--dataset", "agnews", "--data-dir", tmp_path / "data", "--rounds", 3,
                        "--num-clients", 2, "--partition", "iid", "--out", tmp_path / "runs", env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    assert "input (200,)" in result.stdout and "FastText" in result.stdout
    # it trains: the loss falls every round from chance's ln 4 = 1.386 (1.387, 1.383, 1.382 at the default lr)
    losses = [float(r["train_loss"]) for r in out_rows(tmp_path / "runs")]
    assert len(losses) == 3 and losses == sorted(losses, reverse=True) and len(set(losses)) == 3


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_missing_tinyimagenet_one_line_exit_2(tmp_path):
    started = time.perf_counter()
    result = run_script("fedavg.py", "--dataset", "tinyimagenet", "--data-dir", tmp_path, "--out", tmp_path / "runs",
                        timeout=60, env=NO_NETWORK)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "tiny-imagenet-200.zip" in line and line.endswith(f" in {tmp_path}")
    assert time.perf_counter() - started < 30
    assert os.listdir(tmp_path) == []  # no partial download, no run folder


def test_missing_agnews_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """The same path as ``python fedavg.py --dataset agnews`` (run_main), in-process to save a start-up."""
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", "agnews", "--data-dir", str(tmp_path), "--out", str(tmp_path / "runs")])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "train.csv" in line and line.endswith(f" in {tmp_path / 'ag_news_csv'}")
    assert os.listdir(tmp_path) == []  # no partial download, no folder made for it, no run folder


# ----------------------------------------------------------------------------- FedProx's Synthetic(alpha, beta) family

def test_synthetic_family_names_and_heterogeneity():
    """Li et al. 2020, Sec. 5.1: beta spreads the clients' input means v_k ~ N(B_k, 1) with
    B_k ~ N(0, beta), alpha their models W_k, b_k ~ N(u_k, 1), u_k ~ N(0, alpha); IID shares one
    W, b and x ~ N(0, Sigma). So the spread of the clients' mean inputs grows iid < (0,0) <
    (0.5,0.5) < (1,1), and only the IID clients share one labelling function."""
    assert datasets.synthetic_setting("synthetic") == datasets.synthetic_setting("synthetic(1,1)") == (1.0, 1.0, False)
    assert datasets.synthetic_setting("synthetic( 0.5 , 0.5 )") == (0.5, 0.5, False)
    assert datasets.synthetic_setting("synthetic(iid)") == (0.0, 0.0, True)
    assert datasets.synthetic_setting("cifar10") is None

    def input_shift(name):  # mean over clients of |mean of the client's inputs|, ~ |B_k| (v_k's mean)
        shifts = [np.abs(x.mean()) for seed in range(4)
                  for x, _ in datasets.synthetic_clients(40, np.random.default_rng([seed, 0]), *datasets.synthetic_setting(name))]
        return float(np.mean(shifts))

    shifts = [input_shift(n) for n in ("synthetic(iid)", "synthetic(0,0)", "synthetic(0.5,0.5)", "synthetic(1,1)")]
    assert shifts == sorted(shifts) and shifts[0] < 0.02 and shifts[3] > 4 * shifts[1], shifts
    x, y = zip(*datasets.synthetic_clients(5, np.random.default_rng(0), iid=True))
    w = np.linalg.lstsq(np.concatenate(x), np.eye(10)[np.concatenate(y)], rcond=None)[0]
    assert all(np.mean(np.argmax(xk @ w, 1) == yk) > 0.6 for xk, yk in zip(x, y))  # one labelling for all

    args = fedavg.parse_args(["--dataset", "synthetic(1,1)", "--num-clients", "6"])
    same = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "6"])
    a, b = common.load_federated_data(args, "cpu"), common.load_federated_data(same, "cpu")
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)  # synthetic is synthetic(1,1)


@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_synthetic_family_run_folder_and_bad_names(tmp_path):
    r = run_script("fedavg.py", "--dataset", "synthetic(0.5,0.5)", "--rounds", 1, "--num-clients", 4,
                   "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.path.basename(run_dir(tmp_path)).startswith("fedavg-synthetic-0.5-0.5-s0-")
    r = run_script("fedavg.py", "--dataset", "synthetic(a,b)", "--rounds", 1, "--out", tmp_path / "bad")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "synthetic(ALPHA,BETA)" in r.stderr
    assert not os.path.exists(tmp_path / "bad")
    for bad in ("synthetic(1)", "synthetic(-1,1)", "synthetic(1,1", "synthetic(inf,0)", "synthetic()"):
        with pytest.raises(common.UserError, match=r"synthetic\(ALPHA,BETA\)"):
            fedavg.parse_args(["--dataset", bad])
