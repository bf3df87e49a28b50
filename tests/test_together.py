"""--clients-together (issue 61): a round's clients trained as one stacked computation (together.py, behind
common.ClientPool) equal the loop: to 1e-12 in float64, round by round, for every script whose clients train
through common.local_train (FedAvg, FedPake, FedALA after its ALA step, pFedLA); within float32 rounding in
whole runs; refused in one line where it cannot stack (BatchNorm, FedACD); failures end as they do without it;
--resume continues with or without it. Also ClientPool.train's rows may be kept across rounds (issue 64)."""
import os
import shutil

import numpy as np
import pytest
import torch

import common
import fedala
import fedavg
import pfedla
import run_folder
import together
from conftest import metrics_rows, run_dir, run_in_process

SYNTHETIC = ["--dataset", "synthetic", "--num-clients", "5", "--checkpoint-every", "1"]
TIMING = {"seconds", "sec_per_round", "host_mb"}
# float32: the stacked sums run in another order (vmap's batched matrix products), so the two paths differ
# by float32 rounding, amplified through the rounds: trained weights within FLOAT32_ATOL after 3 rounds
FLOAT32_ATOL = 1e-4


@pytest.fixture
def float64(one_thread):
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def float64_setup(parse_args, flags):
    """args, data (float64) and a float64 model builder for ``flags`` of a script (under the float64 fixture)."""
    args = parse_args([*SYNTHETIC, "--rounds", "2", "--parallel-clients", "1", *flags])
    data = common.load_federated_data(args, torch.device("cpu"))
    data.x = data.x.double()

    def build():
        return common.build_model(args.model, data).double()
    return args, data, build


def both_ways(args, data, build, round_update, clients):
    """pool.train of ``round_update`` (a function of the pool's model and a client) in the loop and together."""
    out = []
    for stacked in (False, True):
        args.clients_together = stacked
        torch.manual_seed(1)
        pool = common.ClientPool.build(args, build, torch.device("cpu"), data)
        out.append(pool.train(round_update, clients))
    return out


@pytest.mark.parametrize("flags", [[], ["--momentum", "0.9", "--weight-decay", "1e-3", "--local-epochs", "2",
                                        "--batch-size", "7"]])
def test_a_fedavg_and_fedpake_round_together_equals_the_loop_in_float64(flags, float64):
    """fedavg.py's and fedpake.py's round: common.client_update from the global model (clients of different
    sizes, partial last batches, a batch of 8 where a batch of one joined the one before)."""
    args, data, build = float64_setup(fedavg.parse_args, flags)
    torch.manual_seed(0)
    global_state = common.flatten_state(build())
    clients = [0, 2, 3, 4]
    (loop, loop_losses), (stacked, stacked_losses) = both_ways(
        args, data, build, lambda model, client: common.client_update(model, global_state, data, client, args, 1),
        clients)
    assert (loop - global_state).abs().max() > 0.01  # they trained
    assert (loop - stacked).abs().max() < 1e-12
    assert max(abs(float(a) - float(b)) for a, b in zip(loop_losses, stacked_losses)) < 1e-12


def test_a_fedala_round_together_equals_the_loop_in_float64(float64):
    """fedala.py's round 2: each client's ALA step (its initial stage) on its own old local model, its
    evaluation, then its local SGD stacked with the others'."""
    args, data, build = float64_setup(fedala.parse_args, [])
    torch.manual_seed(0)
    global_model = build()
    generator = torch.Generator().manual_seed(5)
    local_models = common.flatten_state(global_model) + 0.05 * torch.randn(args.num_clients,
                                                                           common.flatten_state(global_model).numel(),
                                                                           generator=generator, dtype=torch.float64)
    results = []
    for stacked in (False, True):
        ala = fedala.ALA(global_model, args.num_clients, batch_size=args.batch_size, max_init_epochs=4)
        ala.weights = ala.weights.double()
        args.clients_together = stacked
        pool = common.ClientPool.build(args, build, torch.device("cpu"), data)
        results.append((pool.train(lambda model, client: fedala.client_update(
            model, global_model, local_models[client], ala, data, client, args, 2, True), range(5)), ala))
    ((loop, losses, epochs, evaluated), ala_loop), ((stacked, stacked_losses, epochs2, evaluated2), ala2) = results
    assert (loop - stacked).abs().max() < 1e-12
    assert max(abs(float(a) - float(b)) for a, b in zip(losses, stacked_losses)) < 1e-12
    assert epochs == epochs2 == [4] * 5  # the initial stage ran, per client, as in the loop
    assert torch.equal(ala_loop.weights, ala2.weights)
    assert all(torch.equal(a, b) for x, y in zip(evaluated, evaluated2) for a, b in zip(x, y))


def test_a_pfedla_round_together_equals_the_loop_in_float64(float64):
    """pfedla.py's round: each client from its own received theta_bar_i (10 local epochs, batch 32)."""
    args, data, build = float64_setup(pfedla.parse_args, ["--local-epochs", "3"])
    torch.manual_seed(0)
    start = common.flatten_state(build())
    received = start + 0.1 * torch.randn(5, start.numel(), generator=torch.Generator().manual_seed(3),
                                         dtype=torch.float64)
    (loop, loop_losses), (stacked, stacked_losses) = both_ways(
        args, data, build, lambda model, client: pfedla.client_update(model, received[client], data, client, args, 1),
        [0, 1, 2, 3, 4])
    assert (loop - received).abs().max() > 0.01
    assert (loop - stacked).abs().max() < 1e-12
    assert max(abs(float(a) - float(b)) for a, b in zip(loop_losses, stacked_losses)) < 1e-12


def test_stacked_sgd_is_torch_optim_sgd_step_for_step():
    """together.train_together against torch.optim.SGD (momentum, weight decay) on a hand-sized case: two
    clients of 3 and 1 steps (the second stops after its first step), a padded batch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    x, y = torch.randn(9, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1])
    batches = [[torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4])], [torch.tensor([5, 6, 7])]]
    start = common.flatten_state(model).detach()
    starts = torch.stack([start, start + 1])
    trained, losses = together.train_together(model, starts, batches, x, y, lr=0.1, momentum=0.5, weight_decay=0.01)
    for k, client_batches in enumerate(batches):
        common.load_flat_state(model, starts[k])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, weight_decay=0.01)
        total = 0.0
        for b in client_batches:
            loss = torch.nn.functional.cross_entropy(model(x[b]), y[b])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss)
        assert (common.flatten_state(model) - trained[k]).abs().max() < 1e-15
        assert abs(total / len(client_batches) - float(losses[k])) < 1e-15


FASTER = {"fedala": ["--max-init-epochs", "5"], "pfedla": ["--local-epochs", "3"]}  # CI's time, the same paths


@pytest.mark.parametrize("script", ["fedavg", "fedpake", "fedala", "pfedla"])
def test_a_run_together_stays_within_float32_rounding_of_the_loop(script, tmp_path):
    """Three float32 rounds of each covered script, with and without the flag, from the same seed."""
    flags = [*SYNTHETIC, "--rounds", "3", "--parallel-clients", "1", *FASTER.get(script, [])]
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path / "loop") == 0
    assert run_in_process(f"{script}.py", *flags, "--clients-together", "--out", tmp_path / "together") == 0
    loop, stacked = run_dir(tmp_path / "loop"), run_dir(tmp_path / "together")
    a, b = (torch.load(os.path.join(f, "checkpoint.pt"), weights_only=True)["state"] for f in (loop, stacked))
    for key, value in a.items():
        if torch.is_tensor(value):
            assert (value - b[key]).abs().max() < FLOAT32_ATOL, key
        elif isinstance(value, dict):
            assert all((v - b[key][k]).abs().max() < FLOAT32_ATOL for k, v in value.items()
                       if torch.is_tensor(v) and v.is_floating_point()), key
    for x, y in zip(metrics_rows(loop), metrics_rows(stacked)):
        assert abs(float(x["test_acc"]) - float(y["test_acc"])) <= 0.5


@pytest.mark.parametrize("script", ["fedavg", *(pytest.param(s, marks=pytest.mark.slow)
                                               for s in ("fedpake", "fedala", "pfedla"))])  # FedAvg's: quick suite
def test_twenty_rounds_together_stay_within_half_a_point_of_the_loop(script, tmp_path):
    flags = [*SYNTHETIC, "--num-clients", "10", "--rounds", "20", "--parallel-clients", "1", "--checkpoint-every",
             "50"]
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path / "loop") == 0
    assert run_in_process(f"{script}.py", *flags, "--clients-together", "--out", tmp_path / "together") == 0
    loop, stacked = metrics_rows(run_dir(tmp_path / "loop")), metrics_rows(run_dir(tmp_path / "together"))
    assert len(loop) == len(stacked) == 20
    for x, y in zip(loop, stacked):
        for key in ("test_acc", "test_acc_mean"):
            assert abs(float(x[key]) - float(y[key])) <= 0.5, (x["round"], key, x[key], y[key])


def test_fedacd_is_refused_in_one_line(capsys):
    assert run_in_process("fedacd.py", *SYNTHETIC, "--rounds", "1", "--clients-together") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--clients-together" in err[0] and "fedacd.py" in err[0]


def test_a_model_with_batchnorm_is_refused_in_one_line_naming_the_flag_and_the_model(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "colour.npz"
    np.savez(path, x=rng.integers(0, 256, (200, 3, 16, 16), dtype=np.uint8), y=rng.integers(0, 4, 200))
    out = tmp_path / "runs"
    assert run_in_process("pfedla.py", "--dataset", path, "--num-clients", "2", "--rounds", "1", "--clients-together",
                          "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--clients-together" in err[0] and "--model auto (PFedLACNN)" in err[0]
    assert not os.path.exists(out)  # refused before anything was written


def inject(monkeypatch, when, error, client=2, round_=2):
    """common.client_update that raises ``error`` on ``client`` in ``round_``, before or after its local_train."""
    original = common.client_update

    def client_update(model, global_state, data, c, args, r):
        if (c, r, when) == (client, round_, "before"):
            raise error
        out = original(model, global_state, data, c, args, r)
        if (c, r, when) == (client, round_, "after"):
            raise error
        return out
    monkeypatch.setattr(common, "client_update", client_update)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("error, status", [(OSError(28, "No space left on device"), 1),
                                           (common.UserError("a client's bad input"), 2)])
def test_a_failing_client_ends_the_run_as_in_the_loop_and_keeps_the_last_checkpoint(when, error, status, tmp_path,
                                                                                     capsys, monkeypatch):
    inject(monkeypatch, when, error)
    lines = []
    for mode in ([], ["--clients-together"]):
        out = tmp_path / ("together" if mode else "loop")
        assert run_in_process("fedavg.py", *SYNTHETIC, "--rounds", "3", "--parallel-clients", "1", *mode,
                              "--out", out) == status
        lines.append(capsys.readouterr().err.strip().splitlines())
        checkpoint = torch.load(os.path.join(run_dir(out), "checkpoint.pt"), weights_only=True)
        assert checkpoint["round"] == 1 and len(metrics_rows(run_dir(out))) == 1
    assert lines[0] == lines[1] and len(lines[0]) == 1


def test_a_loss_that_becomes_nan_stops_the_run_naming_the_round_and_client(tmp_path, capsys, monkeypatch):
    original = together.train_together
    calls = []

    def nan_in_round_two(*a, **k):
        trained, losses = original(*a, **k)
        calls.append(1)
        if len(calls) == 2:
            losses[1] = float("nan")
        return trained, losses
    monkeypatch.setattr(together, "train_together", nan_in_round_two)
    out = tmp_path / "runs"
    assert run_in_process("fedavg.py", *SYNTHETIC, "--rounds", "3", "--clients-together", "--out", out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training loss became nan in round 2 on client 1" in err[0]
    assert torch.load(os.path.join(run_dir(out), "checkpoint.pt"), weights_only=True)["round"] == 1


def rows(folder):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics_rows(folder)]


def test_resume_continues_with_the_flag_bit_for_bit_and_with_or_without_it_says_the_arithmetic_differs(
        tmp_path, capsys):
    flags = [*SYNTHETIC, "--rounds", "3"]
    assert run_in_process("fedavg.py", *flags, "--clients-together", "--out", tmp_path / "full") == 0
    assert run_in_process("fedavg.py", *flags, "--clients-together", "--stop-after", "2", "--out",
                          tmp_path / "stopped") == 0
    stopped = run_dir(tmp_path / "stopped")
    copy = tmp_path / "copy"
    shutil.copytree(stopped, copy)
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", stopped) == 0
    assert "--clients-together" not in capsys.readouterr().out  # the run's own setting: no line
    assert rows(stopped) == rows(run_dir(tmp_path / "full"))
    assert run_in_process("fedavg.py", "--resume", copy, "--no-clients-together") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "--clients-together" in line]
    assert len(said) == 1 and "without it" in said[0] and "bit for bit" in said[0]
    assert len(rows(copy)) == 3 and rows(copy)[:2] == rows(stopped)[:2]
    assert run_in_process("fedavg.py", *flags, "--stop-after", "1", "--out", tmp_path / "loop") == 0
    loop = run_dir(tmp_path / "loop")
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", loop, "--clients-together") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "--clients-together" in line]
    assert len(said) == 1 and "continues with it" in said[0]
    assert len(rows(loop)) == 3


@pytest.mark.parametrize("flags", [["--parallel-clients", "1"], ["--parallel-clients", "2"], ["--clients-together"]])
def test_the_rows_a_round_returns_may_be_kept_across_rounds(flags, one_thread):
    """Issue 64: a kept result of round r does not change in round r+1 (FedDyn or SCAFFOLD keep them)."""
    args = fedavg.parse_args([*SYNTHETIC, "--rounds", "2", *flags])
    data = common.load_federated_data(args, torch.device("cpu"))
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data), torch.device("cpu"), data)
    start = common.flatten_state(pool.models[0]).detach().clone()
    kept, _ = pool.train(lambda model, client: common.client_update(model, start, data, client, args, 1), [0, 1, 2])
    copy = kept.clone()
    again, _ = pool.train(lambda model, client: common.client_update(model, start + 1, data, client, args, 2),
                          [0, 1, 2])
    assert torch.equal(kept, copy) and not torch.equal(kept, again)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("script", ["fedavg", "fedala", "pfedla"])
def test_together_on_cuda_stays_within_float32_rounding_of_the_loop(script, tmp_path):
    flags = [*SYNTHETIC, "--rounds", "3", "--device", "cuda"]
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path / "loop") == 0
    assert run_in_process(f"{script}.py", *flags, "--clients-together", "--out", tmp_path / "together") == 0
    a, b = (torch.load(os.path.join(run_dir(tmp_path / f), "checkpoint.pt"), weights_only=True)["state"]
            for f in ("loop", "together"))
    for key, value in a.items():
        if torch.is_tensor(value):
            assert (value - b[key]).abs().max() < FLOAT32_ATOL, key
    for x, y in zip(metrics_rows(run_dir(tmp_path / "loop")), metrics_rows(run_dir(tmp_path / "together"))):
        assert abs(float(x["test_acc"]) - float(y["test_acc"])) <= 0.5


def test_rows_nothing_holds_serve_the_next_call_and_rows_a_name_or_a_view_holds_do_not():
    """Issue 64 without issue 54's memory back: a script that drops its rows (del) gets their memory reused."""
    pool = common.ClientPool([torch.nn.Linear(2, 1)], [1, 1, 1])

    def update(model, client):
        return (torch.full((3,), float(client)),)

    rows, = pool.train(update, [0, 1])
    address = rows.data_ptr()
    del rows
    rows, = pool.train(update, [1, 2])
    assert rows.data_ptr() == address  # nothing held them: reused
    kept = rows
    again, = pool.train(update, [0, 0])
    assert again.data_ptr() != address and kept.tolist() == [[1.0] * 3, [2.0] * 3]
    row, address = again[1], again.data_ptr()
    del again, kept, rows
    last, = pool.train(update, [2, 2])
    assert last.data_ptr() != address and row.tolist() == [0.0] * 3  # a view held them
