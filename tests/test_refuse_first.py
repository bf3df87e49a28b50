"""Checks that need no data refuse before any data is loaded or model built: an --out that cannot hold a run
folder. --resume with a --stop-after that the run's checkpoint has reached is refused by Run.resume (after the data
is loaded): one line (exit 2), the run folder as it was. A saved value a check refuses is config.json's fault, a
flag given now the command line's."""
import json
import os

import pytest

import common
import fedavg
from conftest import run_dir, run_in_process


@pytest.fixture
def no_data(monkeypatch):
    monkeypatch.setattr(common, "load_federated_data", lambda *a, **k: pytest.fail("data loaded before the refusal"))


def test_an_out_that_cannot_hold_a_run_folder_is_refused_before_the_data(tmp_path, capsys, no_data):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "runs"
    assert run_in_process("fedavg.py", "--dataset", "synthetic", "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create a run folder under --out ") and err.count("\n") == 1, err
    assert err.endswith(f" ({tmp_path / 'afile'} is not a folder)\n"), err
    assert os.listdir(tmp_path) == ["afile"]


def tree(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


@pytest.fixture
def stopped_at_2(tmp_path, capsys):
    """A 3-round run stopped after round 2 (its checkpoint)."""
    assert run_in_process("fedavg.py", "--dataset", "synthetic", "--num-clients", "2", "--rounds", "3",
                          "--out", tmp_path, "--stop-after", "2") == 0
    capsys.readouterr()
    return run_dir(tmp_path)


def test_resume_with_a_stop_after_the_checkpoint_reached_is_one_line_and_changes_nothing(stopped_at_2, capsys):
    """Run.resume refuses it once it has read the checkpoint's round (after the data: issue 86 dropped the early
    read of the checkpoint); the run folder is as it was."""
    before = tree(stopped_at_2)
    assert run_in_process("fedavg.py", "--resume", stopped_at_2, "--stop-after", "2") == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot resume with --stop-after 2: {stopped_at_2} has its checkpoint at round 2 already; " \
                  "give a later round, or leave --stop-after out to go on to the end\n", err
    assert tree(stopped_at_2) == before


def test_a_flag_given_now_is_named_as_the_command_line_s_not_as_config_json_s(stopped_at_2):
    """A check's message that names a flag given with --resume is the command line's fault; one that names a
    saved value is config.json's."""
    with pytest.raises(common.UserError) as caught:
        fedavg.parse_args(["--resume", stopped_at_2, "--stop-after", "0"])
    assert str(caught.value) == "--stop-after must be >= 1"
    path = os.path.join(stopped_at_2, "config.json")
    config = json.load(open(path))
    config["args"]["lr"] = -1.0
    json.dump(config, open(path, "w"))
    with pytest.raises(common.UserError) as caught:
        fedavg.parse_args(["--resume", stopped_at_2, "--stop-after", "3"])
    assert str(caught.value) == f"cannot resume: {path} holds an invalid setting: --lr must be a finite number > 0, " \
                                "got -1.0 (the file was edited or damaged)"
