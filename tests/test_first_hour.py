"""A newcomer's first hour: a run's config.json holds its command as one line to paste into a shell beside the list
(older runs without it read as before), README's set-up environment is ignored by git."""
import json
import os
import shlex
import subprocess
import sys

import pytest

import fedavg
import run_folder
from conftest import ROOT
from tools import compare


def test_config_json_has_a_command_line_a_shell_splits_back_into_the_command(tmp_path, monkeypatch):
    out = tmp_path / "runs with 'quotes' and spaces"
    argv = ["fedavg.py", "--dataset", "synthetic", "--num-clients", "3", "--rounds", "1", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    run_folder.run_main(fedavg.main, argv[1:])
    (folder,) = os.listdir(out)
    config = run_folder.read_config(os.path.join(out, folder, "config.json"))
    assert shlex.split(config["command_line"]) == ["python", *config["command"]]
    assert config["command"][:len(argv)] == argv and config["command_line"].startswith("python fedavg.py ")
    assert config["headline_metric"] == fedavg.HEADLINE_METRIC


def test_a_config_json_without_a_command_line_reads_as_before(tmp_path):
    folder = tmp_path / "fedavg-synthetic-s0-20260101-000000"
    folder.mkdir()
    config = {"algorithm": "fedavg", "args": {"dataset": "synthetic", "rounds": 2, "seed": 0},
              "command": ["fedavg.py", "--dataset", "synthetic", "--rounds", "2"]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.csv").write_text("round,test_acc,seconds\n1,10.0,1.0\n2,20.0,2.0\n")
    assert run_folder.read_config(str(folder / "config.json")) == config
    run = compare.load_run(str(folder))
    assert run["config"] and not run["damage"] and run["flags"] == ["unfinished 2/2"]
    with pytest.raises(run_folder.UserError, match="command_line"):
        (folder / "config.json").write_text(json.dumps({**config, "command_line": ["python"]}))
        run_folder.read_config(str(folder / "config.json"))


def test_the_set_up_s_environment_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0
