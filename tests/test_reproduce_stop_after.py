"""tools/reproduce.py --stop-after N (a long table run to round N, continued later by the same command without
it) and the report's slope of an unfinished run (how far from flat it still is)."""
import os

import pytest

from tools import reproduce
from test_reproduce import call, jobs_of, table_rows, tiny_tables


@pytest.mark.slow  # end to end: 6 runs of the tiny table, under a minute
def test_stop_after_stops_every_run_at_round_n_with_a_checkpoint_and_the_same_command_continues(tmp_path, capsys):
    out = tmp_path / "out"
    tables = tiny_tables(rounds=3)
    argv = ["tiny", "--seeds", "0", "--out", out]
    assert call([*argv, "--stop-after", "2"], tables) == 0  # stopped where asked: no failure
    said = capsys.readouterr().out
    assert said.count("stopped after round 2 (--stop-after)") == 2
    for job in jobs_of(tables, out, seeds=[0]):
        (folder,) = reproduce.run_folders(job["dir"])
        assert reproduce.rounds_done(folder) == 2
        assert os.path.exists(os.path.join(folder, "checkpoint.pt"))  # --checkpoint-every 1 from the table
        assert not os.path.exists(os.path.join(folder, "summary.json"))
        with open(os.path.join(job["dir"], "run.log")) as f:
            assert "--rounds 3" in f.read()  # the table's rounds: the command is the table's
    with open(out / "tiny.md") as f:
        assert table_rows(f.read())["FedAvg"][7] == "2/3"
    assert call([*argv, "--stop-after", "2"], tables) == 0  # nothing left to do: started again, nothing is
    assert "2 of 2 runs stopped at round 2 or later already (skipped)" in capsys.readouterr().out
    assert call(argv, tables) == 0  # without it: resumed to the table's rounds
    for job in jobs_of(tables, out, seeds=[0]):
        (folder,) = reproduce.run_folders(job["dir"])
        assert reproduce.folder_state(folder, 3) == "finished"


def test_stop_after_is_passed_on_alone_the_runs_checkpoint_at_n_themselves():
    assert reproduce.stop_after_flag({"stop_after": 120}) == ["--stop-after", "120"]
    assert reproduce.stop_after_flag({"stop_after": None}) == []


@pytest.mark.parametrize("text", ["0", "-1", "x"])
def test_stop_after_must_be_a_positive_integer(text, tmp_path, capsys):
    assert call(["tiny", "--out", tmp_path, "--stop-after", text], tiny_tables()) == 2
    assert "--stop-after must be an integer >= 1" in capsys.readouterr().err


def test_late_slope_is_the_least_squares_slope_of_the_last_20_evaluations():
    metric = {"column": "test_acc"}
    rising = {"metrics": {"test_acc": [(r, 50.0 + 0.5 * (r - 81)) for r in range(81, 101)]}}
    assert reproduce.late_slope(rising, metric)[0] == pytest.approx(0.5)
    assert reproduce.late_slope(rising, metric)[1:] == (81, 100)
    # by hand: rounds 1..20 alternating 0, 2 around a flat line: slope 2 * 10 / 665 (sum of (r - 10.5)^2)
    zigzag = {"metrics": {"test_acc": [(r, 0.0 if r % 2 else 2.0) for r in range(1, 21)]}}
    assert reproduce.late_slope(zigzag, metric)[0] == pytest.approx(10 / 665)
    with_more = {"metrics": {"test_acc": [(r, 0.0) for r in range(1, 81)] + rising["metrics"]["test_acc"]}}
    assert reproduce.late_slope(with_more, metric) == reproduce.late_slope(rising, metric)
    short = {"metrics": {"test_acc": rising["metrics"]["test_acc"][1:]}}
    assert reproduce.late_slope(short, metric) is None


@pytest.mark.slow  # end to end: 2 runs of 21 and 22 rounds
def test_an_unfinished_row_names_its_slope_and_a_finished_one_does_not(tmp_path):
    out = tmp_path / "out"
    tables = tiny_tables(rounds=22)
    tables["tiny"]["cells"][0]["methods"] = tables["tiny"]["cells"][0]["methods"][:1]
    assert call(["tiny", "--seeds", "0", "--out", out, "--stop-after", "21"], tables) == 0
    with open(out / "tiny.md") as f:
        row = table_rows(f.read())["FedAvg"]
    assert "slope over rounds 2-21: " in row[10] and row[10].endswith(" a round")
    assert call(["tiny", "--seeds", "0", "--out", out], tables) == 0
    with open(out / "tiny.md") as f:
        assert "slope" not in table_rows(f.read())["FedAvg"][10]


@pytest.mark.slow  # the tiny table's two runs, twice: about 20 s
def test_a_run_stopped_between_evaluations_is_taken_as_stopped_not_resumed_past(tmp_path, capsys):
    """With --eval-every, metrics.csv ends before the round --stop-after stopped at; its checkpoint says how far
    the run is, so the same command skips it (before: resumed, and refused by the script, exit 1)."""
    tables = tiny_tables(rounds=12, fedavg_flags=["--eval-every", "5"], fedala_flags=["--eval-every", "5"])
    argv = ["tiny", "--seeds", "0", "--out", tmp_path / "out", "--stop-after", "1"]
    assert call(argv, tables) == 0
    for job in jobs_of(tables, tmp_path / "out", seeds=[0]):
        (folder,) = reproduce.run_folders(job["dir"])
        assert reproduce.rounds_done(folder) == 0  # round 1 was not evaluated
    capsys.readouterr()
    assert call(argv, tables) == 0
    assert "2 of 2 runs stopped at round 1 or later already (skipped)" in capsys.readouterr().out
