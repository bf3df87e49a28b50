"""docs/examples/own_model.py (docs/layout.md, "Your own model"): each of the five scripts trains the example's own
nn.Module, unchanged, into its run folder; a model that cannot take the data is refused in one line, exit status 2,
before anything is written; a stopped run continues through the example, as the line it prints says."""
import importlib.util
import os

import pytest
import torch

import common
import run_folder
from conftest import ROOT, run_dir, run_script

SCRIPT = os.path.join("docs", "examples", "own_model.py")
spec = importlib.util.spec_from_file_location("own_model_example", os.path.join(ROOT, SCRIPT))
own_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(own_model)


@pytest.fixture
def restored(monkeypatch):
    """own_model.main puts its build and Run in place for the process: put them back after the test."""
    monkeypatch.setattr(common, "build_model", common.build_model)
    monkeypatch.setattr(run_folder, "Run", run_folder.Run)


def own_model_in(folder):
    """Whether the run folder's checkpoint holds the example's model: a state entry with OwnModel's keys, or (pFedLA's
    stored models) rows of its 9,098 values."""
    state = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)["state"]
    return any(isinstance(v, dict) and {"hidden.weight", "out.weight"} <= set(v) or
               isinstance(v, torch.Tensor) and v.shape[-1:] == (9098,) for v in state.values())


@pytest.mark.parametrize("script", own_model.SCRIPTS)
def test_each_script_trains_the_own_model_unchanged(script, tmp_path, restored, one_thread, capsys):
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "2", "--out", str(tmp_path), "--threads", "1"]
    run_folder.run_main(own_model.main, [script, *flags])  # returns on success (exit status 0)
    folder = run_dir(tmp_path)
    assert own_model_in(folder)
    config = run_folder.read_json(os.path.join(folder, "config.json"))
    assert config["script"] == script and config["args"]["model"] == "auto"
    assert "model OwnModel: 9098 parameters" in capsys.readouterr().out  # 60 x 128 + 128 + 128 x 10 + 10


def refused(argv, capsys):
    """run_main's exit status and the lines on stderr for ``own_model.main(argv)``."""
    with pytest.raises(SystemExit) as stopped:
        run_folder.run_main(own_model.main, argv)
    return stopped.value.code, capsys.readouterr().err.strip().splitlines()


class ImageModel(torch.nn.Module):
    """A model of one's own for images only: a convolution first."""

    def __init__(self, sample_shape, num_classes):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.out = torch.nn.Linear(4, num_classes)

    def forward(self, x):
        return self.out(self.conv(x).mean((2, 3)))


def test_a_model_that_cannot_take_the_data_is_refused_in_one_line_and_nothing_is_written(tmp_path, restored,
                                                                                         monkeypatch, capsys):
    monkeypatch.setattr(own_model, "OwnModel", ImageModel)  # as a reader puts theirs in its place
    code, err = refused(["fedala", "--dataset", "synthetic", "--out", str(tmp_path / "runs")], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ImageModel does not take samples of shape (60,), float32 ("), err
    assert not os.path.exists(tmp_path / "runs")
    code, err = refused(["fedavg", "--dataset", "synthetic", "--model", "cnn", "--out", str(tmp_path / "runs")], capsys)
    assert code == 2 and err == ["error: --model cnn: this program trains ImageModel; leave --model out"]
    code, err = refused(["nothing"], capsys)
    assert code == 2 and len(err) == 1 and "SCRIPT one of fedavg, fedala, pfedla, fedpake, fedacd" in err[0]


@pytest.mark.slow  # interpreter starts with torch
def test_from_the_command_line_a_stopped_run_continues_through_the_example(tmp_path):
    done = run_script(SCRIPT, "fedala", "--dataset", "synthetic", "--num-clients", "4", "--rounds", "3",
                      "--stop-after", "1", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    folder = run_dir(tmp_path)
    assert f"continue with: python docs/examples/own_model.py --resume {folder}" in done.stdout, done.stdout
    done = run_script(SCRIPT, "--resume", folder)
    assert done.returncode == 0, done.stderr
    assert "[fedala] round 3/3 |" in done.stdout and own_model_in(folder)
