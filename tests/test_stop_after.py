"""--stop-after N means stop: a run stopped there keeps a checkpoint at round N whatever --checkpoint-every, so the
--resume command it prints works; --resume with --stop-after at or before the checkpoint's round is one line and
exit status 2, with the run folder as it was; a run whose last round is done writes summary.json, whichever way it
was asked to stop. fedavg.py on 4 synthetic clients, a few rounds each (about a second a run)."""
import json
import os

import torch

from conftest import metrics_rows, run_dir, run_in_process

TINY = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "4", "--batch-size", "8"]


def checkpoint_round(folder):
    return torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)["round"]


def files_of(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_stop_after_between_checkpoints_writes_one_at_n_and_the_printed_command_continues(tmp_path, capsys):
    assert run_in_process("fedavg.py", *TINY, "--checkpoint-every", "3", "--out", tmp_path, "--stop-after", "1") == 0
    folder = run_dir(tmp_path)
    said = capsys.readouterr().out
    assert f"stopping after round 1 (--stop-after); continue with: python fedavg.py --resume {folder}" in said
    assert checkpoint_round(folder) == 1 and not os.path.exists(os.path.join(folder, "summary.json"))
    assert run_in_process("fedavg.py", "--resume", folder) == 0  # the printed command
    assert [int(r["round"]) for r in metrics_rows(folder)] == [1, 2, 3, 4]
    with open(os.path.join(folder, "summary.json")) as f:
        assert json.load(f)["status"] == "finished"


def test_resume_with_stop_after_at_or_before_the_checkpoint_is_refused_and_trains_nothing(tmp_path, capsys):
    assert run_in_process("fedavg.py", *TINY, "--out", tmp_path, "--stop-after", "2") == 0
    folder = run_dir(tmp_path)
    before = files_of(folder)
    capsys.readouterr()
    for n in ("2", "1"):
        assert run_in_process("fedavg.py", "--resume", folder, "--stop-after", n) == 2
        captured = capsys.readouterr()
        assert captured.err.strip() == (f"error: cannot resume with --stop-after {n}: {folder} has its checkpoint at "
                                        "round 2 already; give a later round, or leave --stop-after out to go on "
                                        "to the end")
        assert "round 3" not in captured.out
        assert files_of(folder) == before  # no round past N, no lock left, metrics as they were
    assert run_in_process("fedavg.py", "--resume", folder, "--stop-after", "3") == 0
    assert [int(r["round"]) for r in metrics_rows(folder)] == [1, 2, 3] and checkpoint_round(folder) == 3


def test_stop_after_at_the_last_round_finishes_the_run_with_its_summary(tmp_path, capsys):
    assert run_in_process("fedavg.py", *TINY, "--out", tmp_path / "a", "--stop-after", "4") == 0
    folder = run_dir(tmp_path / "a")
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "finished" and summary["rounds_done"] == 4
    assert "(--stop-after)" not in capsys.readouterr().out


def test_resume_past_a_summary_json_nested_too_deeply_goes_on(tmp_path):
    assert run_in_process("fedavg.py", *TINY, "--out", tmp_path, "--stop-after", "1") == 0
    folder = run_dir(tmp_path)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        f.write('{"status": ' + "[" * 100000 + "]" * 100000 + "}")
    assert run_in_process("fedavg.py", "--resume", folder) == 0
    with open(os.path.join(folder, "summary.json")) as f:
        assert json.load(f)["rounds_done"] == 4


def test_resume_removes_the_temporary_file_a_killed_write_left_in_the_run_folder(tmp_path):
    assert run_in_process("fedavg.py", *TINY, "--out", tmp_path, "--stop-after", "1") == 0
    folder = run_dir(tmp_path)
    for name in (".tmp-0badc0de", ".tmp-data-paths-abcdefgh"):  # atomic_write's (8 hex); another program's is left
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"half a checkpoint")
    assert run_in_process("fedavg.py", "--resume", folder) == 0
    assert sorted(n for n in os.listdir(folder) if n.startswith(".tmp")) == [".tmp-data-paths-abcdefgh"]
