"""Progress on long work: while a round runs longer than a few seconds, common.ClientPool tells the callback the
script passes (run_folder.Run.progress(round_)) when each client starts and returns, and the run shows the clients done out of the round's with an ETA: one line rewritten in
place on a terminal, at most one line every 30 s in a log, nothing in metrics.csv. The ETA of a long round (FedALA's
initial stage) counts that round. The per-round line names its times (this round, mean), the summary names the rounds
a short run's mean covers. A fake clock and a fake client update that advances it: no training, no sleeping."""
import csv
import os
import re

import pytest
import torch

import common
import fedavg
import run_folder


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(run_folder, "clock", fake)
    return fake


def make_run(tmp_path, rounds):
    args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "8", "--rounds", str(rounds),
                              "--out", str(tmp_path), "--threads", "1"])
    data = common.load_federated_data(args, torch.device("cpu"))
    run = run_folder.Run("fedavg", args, data, torch.device("cpu"), headline="best test_acc")
    pool = common.ClientPool([torch.nn.Linear(2, 1)], [len(i) for i in data.train_idx])
    return run, pool


def a_round(pool, clock, seconds_per_client, clients=range(8), run=None, round_=1):
    """The pool's round ``round_`` of fake client updates, each taking ``seconds_per_client`` on the clock."""
    def client_update(model, client):
        clock.now += seconds_per_client
        return common.flatten_state(model), 0.5

    return pool.train(client_update, list(clients), progress=run.progress(round_) if run else None)


def progress_lines(text):
    return re.findall(r"round \d+/\d+: \d+/\d+ clients done[^\r\n]*", text)


def eta_seconds(line):
    m = re.search(r"ETA (\d+)([hm])(\d+)[ms]", line)
    big, unit, small = int(m[1]), m[2], int(m[3])
    return big * 3600 + small * 60 if unit == "h" else big * 60 + small


def test_a_log_gets_at_most_one_progress_line_every_30_seconds_and_metrics_csv_nothing(tmp_path, clock, capsys):
    run, pool = make_run(tmp_path, rounds=2)
    try:
        capsys.readouterr()
        a_round(pool, clock, 10.0, run=run, round_=1)  # 80 s: lines at 30 and 60 s at most
        out = capsys.readouterr().out
        lines = progress_lines(out)
        assert [line.split(":")[1].split()[0] for line in lines] == ["3/8", "6/8"], out
        assert "\r" not in out
        run.log(1, {"test_acc": 50.0})
        a_round(pool, clock, 1.0, run=run, round_=2)  # 8 s: longer than 5 s, under 30 s: no line in a log
        assert progress_lines(capsys.readouterr().out) == []
        run.log(2, {"test_acc": 51.0})
        with open(os.path.join(run.dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        assert [r["round"] for r in rows] == ["1", "2"]
        assert set(rows[0]) == {"round", "test_acc", "seconds", "sec_per_round", "mb_down", "mb_up", "host_mb"}
        assert [float(r["sec_per_round"]) for r in rows] == [80.0, 8.0]
    finally:
        run.close()


def test_on_a_terminal_one_line_is_rewritten_in_place_after_a_few_seconds_and_cleared(tmp_path, clock, capsys,
                                                                                      monkeypatch):
    monkeypatch.setattr(run_folder, "is_terminal", lambda stream: True)
    run, pool = make_run(tmp_path, rounds=3)
    try:
        capsys.readouterr()
        a_round(pool, clock, 0.5, run=run, round_=1)  # 4 s: a short round shows nothing
        assert capsys.readouterr().out == ""
        run.log(1, {"test_acc": 50.0})
        capsys.readouterr()
        a_round(pool, clock, 2.0, run=run, round_=2)  # 16 s: shown from 6 s on, each client, in place
        out = capsys.readouterr().out
        assert "\n" not in out and out.count("\r") == 6
        assert [line.split(":")[1].split()[0] for line in progress_lines(out)] == [f"{k}/8" for k in range(3, 9)]
        run.log(2, {"test_acc": 51.0})
        out = capsys.readouterr().out
        cleared, logged = out.rsplit("\r", 1)
        assert cleared.strip() == "" and logged.startswith("[fedavg] round 2/3 | test acc 51.00%")
    finally:
        run.close()


def test_the_eta_counts_a_long_initial_stage_round_as_it_runs(tmp_path, clock, capsys):
    run, pool = make_run(tmp_path, rounds=10)
    try:
        a_round(pool, clock, 0.5, run=run, round_=1)  # round 1: 4 s (FedALA's first round: no ALA yet)
        run.log(1, {"test_acc": 50.0})
        assert "ETA 0m36s" in capsys.readouterr().out  # 9 rounds of 4 s: all round 1 can tell
        a_round(pool, clock, 15.0, clients=range(8), run=run, round_=2)  # round 2: the initial stage, 120 s
        lines = progress_lines(capsys.readouterr().out)
        first = lines[0]  # at 30 s, 2 of 8 clients done: 90 s of this round left, and 8 rounds after it
        assert first.split(":")[1].split()[0] == "2/8" and "30 s into this round" in first
        eta = eta_seconds(first)
        assert eta >= 90 + 8 * 4  # this round's rest at least, the rounds after at round 1's pace at least
        assert eta >= 90 + 8 * (4 + 120) / 2 - 1  # the rounds after at the mean of both, the long one counted
        assert eta <= 90 + 8 * 120  # not every round at the initial stage's pace
        run.log(2, {"test_acc": 51.0})
        line = capsys.readouterr().out.splitlines()[-1]
        assert "| 120.000 s this round, mean 62.000 s/round | ETA 8m16s" in line
    finally:
        run.close()


def test_rounds_between_evaluations_are_named_and_a_short_run_names_the_rounds_of_its_mean(tmp_path, clock, capsys):
    run, pool = make_run(tmp_path, rounds=2)
    try:
        for k in range(2):
            a_round(pool, clock, 0.25, run=run, round_=k + 1)
        run.log(2, {"test_acc": 50.0})
        assert "| 2.000 s/round over rounds 1-2, mean 2.000 s/round |" in capsys.readouterr().out
        summary = run.finish()
        out = capsys.readouterr().out
        assert "mean of rounds 2-2 50.00" in out and "last-10" not in out
        assert summary["last10_mean_rounds"] == [2, 2]
    finally:
        run.close()


def test_a_pool_given_no_progress_reports_to_nobody(monkeypatch):
    monkeypatch.setattr(run_folder, "Run", None)  # nothing of a run is reached: the pool has no side channel
    pool = common.ClientPool([torch.nn.Linear(2, 1)], [1, 1])
    rows, losses = pool.train(lambda model, client: (common.flatten_state(model), 0.1), [0, 1])
    assert rows.shape == (2, 3) and losses == [0.1, 0.1]


def test_the_eta_is_right_with_two_clients_at_once(tmp_path, clock, capsys):
    """Two clients train at once, each 10 s on the fake clock: 8 clients take 40 s a round. Whenever a client
    returns, the round's rest is projected from the clients' own times and the clients running at once."""
    run, _ = make_run(tmp_path, rounds=3)
    try:
        report, start = run.progress(1), clock.now
        for wave in range(4):  # clients 2w and 2w+1 run together
            for c in (2 * wave, 2 * wave + 1):
                report(c, 8, False)
            clock.now += 10.0
            for c in (2 * wave, 2 * wave + 1):
                report(c, 8, True)
        lines = progress_lines(capsys.readouterr().out)
        assert lines, "a 40 s round shows its progress"
        for line in lines:  # at 10, 20, 30 s: ETA = the round's rest + 2 more rounds of 40 s
            done = int(line.split(":")[1].split()[0].split("/")[0])
            at = float(re.search(r"(\d+) s into", line)[1])
            assert abs(eta_seconds(line) - (40 - at + 2 * 40)) <= 6, (done, line)
        assert clock.now - start == 40.0
    finally:
        run.close()


def test_the_round_shown_is_the_one_the_script_passes_also_with_two_passes_a_round(tmp_path, clock, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(run_folder, "is_terminal", lambda stream: True)
    run, pool = make_run(tmp_path, rounds=3)
    try:
        for _ in range(2):  # a Ditto-like loop: two pool.train calls in round 1
            a_round(pool, clock, 2.0, run=run, round_=1)
        shown = re.findall(r"round (\d+)/3:", capsys.readouterr().out)
        assert shown and set(shown) == {"1"}, shown
    finally:
        run.close()
