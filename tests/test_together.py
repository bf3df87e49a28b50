"""tools/together.py, the stacked local SGD that no script runs: a FedAvg round's local training stacked equals the
loop the scripts run (fedavg.client_update, common.local_train) to 1e-12 in float64, clients from one global model
or each from its own start (pFedLA), step for step torch.optim.SGD's; within float32 rounding in float32 (and on
CUDA). It needs only torch. --clients-together, the flag that ran it, is gone from the scripts: given, it is
argparse's one-line refusal; a run recorded with it off resumes as any run, one with it on is refused by the script
(an older form) and by tools/run_records.py --upgrade (naming where the piece went), nothing changed."""
import ast
import json
import os
import shutil

import pytest
import torch

import common
import fedavg
import pfedla
from conftest import metrics_rows, run_dir, run_in_process
from tools import run_records, together

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNTHETIC = ["--dataset", "synthetic", "--num-clients", "5", "--checkpoint-every", "1"]
TIMING = {"seconds", "sec_per_round", "host_mb"}
FLOAT32_ATOL = 1e-5  # one float32 round: the stacked sums run in another order (vmap's batched matrix products)


@pytest.fixture
def float64(one_thread):
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def setup(parse_args, flags, dtype=torch.float32):
    """args, data and a model builder for ``flags`` of a script, the data and model in ``dtype``."""
    args = parse_args([*SYNTHETIC, "--rounds", "2", "--parallel-clients", "1", *flags])
    data = common.load_federated_data(args, torch.device("cpu"))
    data.x = data.x.to(dtype)
    return args, data, lambda: common.build_model(args.model, data).to(dtype)


def round_batches(data, clients, args, round_):
    """Each client's minibatches in a round, in the order the loop draws them (common.epoch_batches)."""
    return [list(common.epoch_batches(data.train_idx[c], args.batch_size, args.local_epochs,
                                      common.client_seed(args.seed, round_, c))) for c in clients]


def stacked_and_loop(args, data, build, starts, client_update, clients, round_=1):
    """(trained rows, losses) of ``clients`` stacked by together.train_together and by the pool's loop."""
    torch.manual_seed(1)
    pool = common.ClientPool.build(args, build, torch.device("cpu"), data)
    loop, losses = pool.train(client_update, clients)
    trained, stacked_losses = together.train_together(pool.models[0], starts, round_batches(data, clients, args, round_),
                                                      data.x, data.y, args.lr, args.momentum, args.weight_decay)
    return (trained, stacked_losses), (loop, torch.stack(losses))


@pytest.mark.parametrize("flags", [[], ["--momentum", "0.9", "--weight-decay", "1e-3", "--local-epochs", "2",
                                        "--batch-size", "7"]])
def test_a_fedavg_round_stacked_equals_the_loop_in_float64(flags, float64):
    """fedavg.py's round (fedpake.py's clients too): every client from the global model; clients of different
    sizes, partial last batches, a batch of 8 where a batch of one joined the one before."""
    args, data, build = setup(fedavg.parse_args, flags, torch.float64)
    torch.manual_seed(0)
    global_state = common.flatten_state(build())
    clients = [0, 2, 3, 4]
    (stacked, stacked_losses), (loop, losses) = stacked_and_loop(
        args, data, build, global_state.expand(len(clients), -1),
        lambda model, client: fedavg.client_update(model, global_state, data, client, args, 1), clients)
    assert (loop - global_state).abs().max() > 0.01  # they trained
    assert (loop - stacked).abs().max() < 1e-12 and (losses - stacked_losses).abs().max() < 1e-12


def test_clients_from_their_own_starts_stacked_equal_the_loop_in_float64(float64):
    """pfedla.py's round: each client from its own received theta_bar_i (3 local epochs)."""
    args, data, build = setup(pfedla.parse_args, ["--local-epochs", "3"], torch.float64)
    torch.manual_seed(0)
    start = common.flatten_state(build())
    received = start + 0.1 * torch.randn(5, start.numel(), generator=torch.Generator().manual_seed(3),
                                         dtype=torch.float64)
    (stacked, stacked_losses), (loop, losses) = stacked_and_loop(
        args, data, build, received,
        lambda model, client: pfedla.client_update(model, received[client], data, client, args, 1), list(range(5)))
    assert (loop - received).abs().max() > 0.01
    assert (loop - stacked).abs().max() < 1e-12 and (losses - stacked_losses).abs().max() < 1e-12


def test_a_fedavg_round_stacked_stays_within_float32_rounding_of_the_loop(one_thread):
    args, data, build = setup(fedavg.parse_args, ["--momentum", "0.5"])
    torch.manual_seed(0)
    global_state = common.flatten_state(build()).detach()
    (stacked, stacked_losses), (loop, losses) = stacked_and_loop(
        args, data, build, global_state.expand(5, -1),
        lambda model, client: fedavg.client_update(model, global_state, data, client, args, 1), list(range(5)))
    assert (loop - global_state).abs().max() > 0.01
    assert (loop - stacked).abs().max() < FLOAT32_ATOL and (losses - stacked_losses).abs().max() < FLOAT32_ATOL


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


def test_the_piece_needs_only_torch_and_no_script_runs_it():
    tree = ast.parse(open(os.path.join(ROOT, "tools", "together.py")).read())
    imported = {a.name if isinstance(node, ast.Import) else node.module for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    assert {name.split(".")[0] for name in imported} == {"torch"}
    assert "_foreach" not in open(os.path.join(ROOT, "tools", "together.py")).read()
    for name in [n for n in os.listdir(ROOT) if n.endswith(".py")] + ["flower/app.py"]:
        modules = {a.name if isinstance(node, ast.Import) else f"{node.module}.{a.name}"
                   for node in ast.walk(ast.parse(open(os.path.join(ROOT, name)).read()))
                   if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
        assert not any("together" in m for m in modules), name


@pytest.mark.parametrize("flag", ["--clients-together", "--no-clients-together"])
def test_the_removed_flag_is_refused_in_one_line(flag, tmp_path, capsys):
    assert run_in_process("fedavg.py", *SYNTHETIC, "--rounds", "1", flag, "--out", tmp_path / "runs") == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: unrecognized arguments: {flag}"]
    assert not os.path.exists(tmp_path / "runs")


def rows(folder):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics_rows(folder)]


def test_a_run_recorded_with_the_flag_off_resumes_and_one_recorded_with_it_on_is_refused(tmp_path, capsys):
    """Runs made while the flag existed record clients_together in config.json (the committed runs: false)."""
    flags = [*SYNTHETIC, "--rounds", "3", "--parallel-clients", "1"]
    assert run_in_process("fedavg.py", *flags, "--out", tmp_path / "full") == 0
    assert run_in_process("fedavg.py", *flags, "--stop-after", "2", "--out", tmp_path / "stopped") == 0
    stopped = run_dir(tmp_path / "stopped")
    on = tmp_path / "on"
    shutil.copytree(stopped, on)
    for folder, value in ((stopped, False), (on, True)):
        path = os.path.join(folder, "config.json")
        config = json.load(open(path))
        config["args"]["clients_together"] = value
        json.dump(config, open(path, "w"))
    before = {name: open(os.path.join(on, name), "rb").read() for name in ("config.json", "checkpoint.pt")}
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--resume", on) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made by an older version of fedavg.py" in err[0] \
        and f"python tools/run_records.py --upgrade {on}" in err[0]
    assert run_records.main(["--upgrade", str(on)]) == 2  # today's code cannot continue it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--clients-together True" in err[0] and "removed" in err[0] \
        and "tools/together.py" in err[0]
    assert {name: open(os.path.join(on, name), "rb").read() for name in before} == before  # nothing written
    assert len(metrics_rows(on)) == 2
    dropped = tmp_path / "dropped"
    shutil.copytree(stopped, dropped)
    assert run_records.main(["--upgrade", str(dropped)]) == 0  # off: the upgrade drops it
    assert "clients_together" not in json.load(open(os.path.join(dropped, "config.json")))["args"]
    for folder in (stopped, dropped):
        assert run_in_process("fedavg.py", "--resume", folder) == 0  # off: as if the flag had never been
        assert rows(folder) == rows(run_dir(tmp_path / "full"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_fedavg_round_stacked_on_cuda_stays_within_float32_rounding_of_the_loop():
    args = fedavg.parse_args([*SYNTHETIC, "--rounds", "1", "--device", "cuda", "--parallel-clients", "1"])
    device = torch.device("cuda")
    data = common.load_federated_data(args, device)
    build = lambda: common.build_model(args.model, data).to(device)  # noqa: E731
    torch.manual_seed(0)
    global_state = common.flatten_state(build()).detach()
    (stacked, stacked_losses), (loop, losses) = stacked_and_loop(
        args, data, build, global_state.expand(5, -1),
        lambda model, client: fedavg.client_update(model, global_state, data, client, args, 1), list(range(5)))
    assert (loop - stacked).abs().max() < FLOAT32_ATOL and (losses - stacked_losses).abs().max() < FLOAT32_ATOL
