"""Checks that need no data refuse before any data is loaded or model built: an --out that cannot hold a run
folder, and --resume with a --stop-after that the run's checkpoint has reached. One line (exit 2), nothing made."""
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


def test_resume_with_a_stop_after_the_checkpoint_reached_is_refused_before_the_data(tmp_path, capsys, monkeypatch):
    assert run_in_process("fedavg.py", "--dataset", "synthetic", "--num-clients", "2", "--rounds", "3",
                          "--out", tmp_path, "--stop-after", "2") == 0
    folder = run_dir(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr(common, "load_federated_data", lambda *a, **k: pytest.fail("data loaded before the refusal"))
    with pytest.raises(common.UserError, match=f"{folder} has its checkpoint at round 2 already"):
        fedavg.parse_args(["--resume", folder, "--stop-after", "2"])


def test_a_flag_given_now_is_named_as_the_command_line_s_not_as_config_json_s(tmp_path):
    """A check's message that names a flag given with --resume ('--flag: why') is the command line's fault, whatever
    punctuation follows the flag's name; one that names a saved value is config.json's."""
    import run_folder
    parser = common.base_parser("fedavg", script="fedavg", lr=None)
    argv = ["--resume", str(tmp_path), "--stop-after", "5"]
    assert run_folder.invalid_saved_value(parser, argv, "--stop-after: 5 is past the end") == \
        "--stop-after: 5 is past the end"
    assert run_folder.invalid_saved_value(parser, argv, "--lr must be > 0, got -1") == \
        f"cannot resume: {tmp_path / 'config.json'} has an invalid lr: must be > 0, got -1 (the file was edited or " \
        "damaged)"
