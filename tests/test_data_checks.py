"""How an .npz's arrays are taken (docs/datasets.md, "Your own data"): integer images of any range
are normalised, integer vectors are numbers unless fastText is asked for, a model is tried once on
one sample without changing anything; the bad cases are rows of test_safety.py's DATA_CASES."""
import os

import numpy as np
import pytest
import torch

import common
import datasets
import fedavg
import models
from conftest import run_script

CPU = torch.device("cpu")
Y40 = np.arange(40) % 4


def load(path, *flags):
    args = fedavg.parse_args(["--dataset", str(path), "--num-clients", "2", "--partition", "iid", *flags])
    data = common.load_federated_data(args, CPU)
    return data, common.build_model(args.model, data)


def test_integer_images_of_any_range_are_normalised_like_uint8(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (40, 1, 28, 28))
    xs = {}
    for dtype in (np.uint8, np.uint16, np.int32):
        np.savez(tmp_path / "d.npz", x=pixels.astype(dtype), y=Y40)
        data, model = load(tmp_path / "d.npz")
        assert isinstance(model, common.CNN) and data.x.dtype == torch.float32
        xs[dtype] = data.x
    assert torch.allclose(xs[np.uint16], xs[np.uint8], atol=1e-5) and torch.equal(xs[np.int32], xs[np.uint16])
    assert abs(float(xs[np.uint8].mean())) < 1e-4 and abs(float(xs[np.uint8].std()) - 1) < 1e-2


def test_integer_vectors_are_numbers_unless_fasttext_is_asked_for(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (40, 784)).astype(np.uint8)  # flat MNIST-like pixels
    np.savez(tmp_path / "d.npz", x=x, y=Y40)
    data, model = load(tmp_path / "d.npz")
    assert isinstance(model, common.MLP) and torch.equal(data.x, torch.from_numpy(x).float())
    data, model = load(tmp_path / "d.npz", "--model", "fasttext")
    assert isinstance(model, common.FastText) and data.x.dtype == torch.int64 and data.vocab_size == int(x.max()) + 1


def test_the_name_may_be_in_capitals_and_other_arrays_are_not_read(tmp_path):
    path = tmp_path / "D.NPZ"
    with open(path, "wb") as f:  # np.savez would append .npz
        np.savez(f, x=np.zeros((40, 8), np.float32), y=Y40, notes=np.array([{"a": 1}], dtype=object))
    x, y, x_test, y_test = datasets.load_arrays(str(path), str(tmp_path))
    assert x.shape == (40, 8) and y.tolist() == Y40.tolist() and len(x_test) == len(y_test) == 0


def test_an_unreadable_file_says_why(tmp_path, monkeypatch):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((40, 8), np.float32), y=Y40)

    def refuse(file, *args, **kwargs):  # what chmod 000 gives a user other than root
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(np, "load", refuse)
    with pytest.raises(common.UserError, match=r"^cannot read .*d\.npz: Permission denied$"):
        datasets.load_arrays(str(path), str(tmp_path))


@pytest.mark.parametrize("name,shape", [("lenet", (3, 32, 32)), ("resnet18", (3, 32, 32)), ("cnn", (1, 28, 28))])
def test_trying_the_model_once_changes_no_weight_statistic_mode_or_random_state(name, shape):
    data = type("Data", (), {"x": torch.randn(2, *shape), "num_classes": 10, "vocab_size": 0, "info": {}})
    torch.manual_seed(5)
    plain = models._model(name, data)  # the same model, never run
    after_plain = torch.get_rng_state()
    torch.manual_seed(5)
    tried = common.build_model(name, data)
    assert torch.equal(torch.get_rng_state(), after_plain) and tried.training
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), tried.state_dict().values()))


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_from_the_shell_data_no_model_takes_is_one_line_exit_2_and_no_run_folder(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((40, 1, 16, 64), np.float32), y=Y40)
    r = run_script("pfedla.py", "--dataset", tmp_path / "d.npz", "--num-clients", "2", "--partition", "iid",
                   "--rounds", "1", "--out", tmp_path / "runs")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()  # torch's reason in the middle: "mat1 and mat2 shapes cannot be ..."
    assert line.startswith("error: --model pfedlacnn does not take samples of shape (1, 16, 64), float32 (")
    assert line.endswith("); models that do: resnet18, resnet34, mlp")
    assert not os.path.exists(tmp_path / "runs")
