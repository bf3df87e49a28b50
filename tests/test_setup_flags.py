"""--dominant-share (pFedLA's non-IID_2, whose share the paper does not give) reaches the partition, and run
folders made before a flag existed still resume with the value they ran with (run_folder.ADDED_FLAGS)."""
import json
import os

import numpy as np
import pytest
import torch

from tools import run_records

import common
import fedavg
from conftest import metrics_rows, run_dir, run_in_process


@pytest.mark.parametrize("share", [0.8, 0.5, 0.3])
def test_dominant_share_is_the_share_of_the_two_dominant_classes(share, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "ten.npz"
    np.savez(path, x=rng.normal(size=(4000, 6)).astype(np.float32), y=np.arange(4000) % 10)
    args = fedavg.parse_args(["--dataset", str(path), "--partition", "pfedla2", "--num-clients", "5",
                              "--samples-per-client", "200", "--dominant-share", str(share), "--train-ratio", "0.5"])
    data = common.load_federated_data(args, torch.device("cpu"))
    for train, test in zip(data.train_idx, data.test_idx):
        counts = np.bincount(data.y[torch.cat([train, test])].numpy(), minlength=10)
        assert counts.sum() == 200
        assert np.sort(counts)[-2:].sum() == pytest.approx(share * 200, abs=2)  # by hand: share x 200 samples


@pytest.mark.parametrize("share", ["0", "1", "nan", "-0.5"])
def test_a_bad_dominant_share_is_one_line(share, tmp_path, capsys):
    assert run_in_process("fedavg.py", "--dataset", "synthetic", "--dominant-share", share, "--out", tmp_path) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--dominant-share must be in (0, 1)" in line and not os.listdir(tmp_path)


@pytest.mark.slow  # an end-to-end run of seconds; in CI with the full suite
def test_a_run_made_before_the_new_flags_resumes_with_their_old_values(tmp_path, one_thread):
    flags = ["--dataset", "synthetic", "--num-clients", "3", "--rounds", "3", "--checkpoint-every", "1",
             "--device", "cpu"]
    assert run_in_process("fedavg.py", *flags, "--out", tmp_path / "full") == 0
    assert run_in_process("fedavg.py", *flags, "--out", tmp_path / "part", "--stop-after", "2") == 0
    folder = run_dir(tmp_path / "part")
    config_path, checkpoint_path = os.path.join(folder, "config.json"), os.path.join(folder, "checkpoint.pt")
    config = json.load(open(config_path))
    blob = torch.load(checkpoint_path, weights_only=False)
    for key in ("dominant_share",):  # as a run folder of the version before the flag
        del config["args"][key], blob["args"][key]
    json.dump(config, open(config_path, "w"))
    torch.save(blob, checkpoint_path)
    assert run_in_process("fedavg.py", "--resume", folder) == 2  # an older form: refused, naming the upgrade
    assert run_records.main(["--upgrade", folder]) == 0  # the value it ran with (run_records.ADDED_FLAGS)
    assert run_in_process("fedavg.py", "--resume", folder) == 0
    columns = ("round", "test_acc", "test_acc_mean", "train_loss")
    rows = lambda f: [[r[k] for k in columns] for r in metrics_rows(f)]
    assert rows(folder) == rows(run_dir(tmp_path / "full"))
