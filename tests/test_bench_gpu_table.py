"""tests/bench_gpu.py, the one command the first lent GPU runs (issue 90, item 1): on a CPU it prints its one table
at the tiny shape, every row and column there, the graph rows skipped with the reason and PFLlib's row one line
saying how to get it; its eager-1 and default rows train a round's clients as common.local_train does, bit for bit;
the eager paths of its graph classes (what a CUDA graph would replay) equal common.local_train and
tools/together.py's train_together. On a CUDA GPU (-m gpu) the replayed graphs are held against them too."""
import os
import sys

import pytest
import torch

import common
from conftest import run_script
from tools import together

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402

COLUMNS = ["algorithm", "variant", "K", "rounds timed", "s/round", "samples/s", "GPU busy %", "peak GPU MB",
           "max abs diff to eager-1", "note"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the table is a GPU's")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


@NO_GPU
def test_on_a_cpu_the_command_prints_one_table_with_every_row_graphs_skipped_and_pfllib_in_one_line():
    r = run_script("tests/bench_gpu.py", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("device: CPU") and f"torch {torch.__version__}" in lines[0] and "CUDA" in lines[0]
    table = [line for line in lines if line.startswith("|")]
    assert cells(table[0]) == COLUMNS and set(table[1]) <= set("|-")
    rows = {tuple(row[:3]): dict(zip(COLUMNS, row)) for row in map(cells, table[2:])}
    expected = {("fedavg", v, str(k)) for v in bench_gpu.VARIANTS for k in (1, 5, 20)} | {("fedavg", "pfllib", "20")}
    assert expected <= set(rows) and len(rows) == len(table) - 2  # one row each, no row twice
    extra = set(rows) - expected  # FedALA and pFedLA at K = 20 with the two fastest that ran
    assert {(a, k) for a, _, k in extra} == {("fedala", "20"), ("pfedla", "20")} and len(extra) == 4
    assert all(v not in bench_gpu.GRAPHED for _, v, _ in extra)
    for (algorithm, variant, k), row in rows.items():
        if variant in bench_gpu.GRAPHED:
            assert row["note"] == "skipped: CUDA graphs need a CUDA GPU (this run is on the CPU)", row
            assert row["s/round"] == "-" and row["rounds timed"] == "0"
        elif variant == "pfllib":
            assert row["note"].startswith("not run: give --pfllib CLONE") and row["s/round"] == "-"
        else:
            assert row["rounds timed"] == "1" and float(row["s/round"]) > 0 and float(row["samples/s"]) > 0, row
            assert row["GPU busy %"] == "n/a" and row["peak GPU MB"] == "n/a" and row["note"] == "", row
    # OMP_NUM_THREADS=1 (run_script): today's default is one client at a time too, so it equals eager-1 bit for bit
    assert all(rows[("fedavg", v, str(k))]["max abs diff to eager-1"] == "0" for v in ("eager-1", "default")
               for k in (1, 5, 20))
    assert sum("--pfllib" in line for line in lines) == 1  # the missing clone: one line, the row
    assert lines[-1].startswith("FedAvg K = 20: fastest ")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The command's tiny setting in this process: FedAvg's args (--threads 2, so that the default trains two clients
    at once on threads, one torch thread each) and the data; one torch thread otherwise (eager-1's)."""
    work = tmp_path_factory.mktemp("bench-gpu")
    path = str(work / "fmnist.npz")
    bench_gpu.make_fmnist_shaped(path, bench_gpu.IMAGES["tiny"])
    threads = torch.get_num_threads()
    args = bench_gpu.script_args("fedavg", path, torch.device("cpu"), str(work / "runs"), threads=2)
    data = common.load_federated_data(args, torch.device("cpu"))  # sets two torch threads
    torch.set_num_threads(1)
    yield args, data
    torch.set_num_threads(threads)


def local_train_rows(args, data, start, clients, round_, threads):
    """The clients' models and losses from ``start`` by common.local_train on ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, rows, losses = common.build_model(args.model, data), [], []
        for c in clients:
            common.load_flat_state(model, start)
            losses.append(float(common.local_train(model, data, data.train_idx[c], args,
                                                   common.client_seed(args.seed, round_, c))))
            rows.append(common.flatten_state(model))
        return torch.stack(rows), losses
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("variant", ["eager-1", "default"])
def test_the_eager_1_and_default_rows_train_as_common_local_train_bit_for_bit(variant, tiny):
    args, data = tiny
    device = torch.device("cpu")
    fedavg_rounds = bench_gpu.FedAvgRounds(args, data, device)
    row = bench_gpu.Variant(variant, args, data, fedavg_rounds.build, device, 20)
    assert len(row.pool) == (1 if variant == "eager-1" else common.parallel_clients(args, device)) == \
        (1 if variant == "eager-1" else 2)
    clients = bench_gpu.row_clients(args, 5, 1)[0]
    start = common.flatten_state(fedavg_rounds.global_model).clone()
    rows, losses = fedavg_rounds.round(row, clients, 1)
    # a client on threads trains on one torch thread (ClientPool), one at a time on all of them
    expected, expected_losses = local_train_rows(args, data, start, clients, 1,
                                                 1 if len(row.pool) > 1 else torch.get_num_threads())
    assert torch.equal(rows, expected) and losses == expected_losses
    assert not torch.equal(rows[0], start)  # it trained


def test_the_graph_classes_eager_paths_equal_local_train_and_train_together(tiny, one_thread):
    """What a CUDA graph would replay, run eagerly: GraphedLocalTrain's loop (static indices, momentum buffers zeroed
    per client, the last short batch) against common.local_train, StackedSGD's against train_together, with momentum,
    weight decay and a batch size that leaves short last batches, two clients after one another."""
    args, data = tiny
    args = type(args)(**{**vars(args), "momentum": 0.9, "weight_decay": 1e-3, "batch_size": 7})
    torch.manual_seed(0)
    model = common.build_model(args.model, data)
    start = common.flatten_state(model).clone()
    clients = [3, 11]
    graphed = bench_gpu.GraphedLocalTrain(model, data, args, capture=False)
    assert graphed.graph is None
    expected, expected_losses = local_train_rows(args, data, start, clients, 1, 1)
    for c, row, loss in zip(clients, expected, expected_losses):
        common.load_flat_state(model, start)
        assert float(graphed.local_train(data.train_idx[c], common.client_seed(args.seed, 1, c))) == loss
        assert torch.equal(common.flatten_state(model), row)
    batches = bench_gpu.round_batches(data, clients + [7], args, 2)
    starts = torch.stack([start, expected[0], expected[1]])
    stacked = bench_gpu.StackedSGD(model, data, args, 3, capture=False)
    assert not stacked.graphs
    for _ in range(2):  # the second round on the same static tensors
        trained, losses = stacked.train(starts, batches)
        reference, reference_losses = together.train_together(model, starts, batches, data.x, data.y, args.lr,
                                                               args.momentum, args.weight_decay)
        assert torch.equal(trained, reference) and torch.equal(losses, reference_losses)


def test_pfllib_s_row_says_in_one_line_why_it_did_not_run(tmp_path):
    row = bench_gpu.pfllib_row(None, None, None, torch.device("cpu"), 1, 60, str(tmp_path), None)
    assert row["sec"] is None and row["note"].startswith("not run: give --pfllib CLONE")
    (tmp_path / "not-a-clone").mkdir()
    row = bench_gpu.pfllib_row(str(tmp_path / "not-a-clone"), sys.executable, None, torch.device("cpu"), 1, 60,
                               str(tmp_path), None)
    assert row["note"].startswith("failed: cannot read PFLlib @ d832e76 from ") and "\n" not in row["note"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_replayed_graphs_equal_the_eager_loop_and_train_together(tmp_path):
    """On a GPU: GraphedLocalTrain's replays against common.local_train, bit for bit under --deterministic on (the
    same kernels); StackedSGD's replays against train_together within float32 rounding."""
    path = str(tmp_path / "fmnist.npz")
    bench_gpu.make_fmnist_shaped(path, bench_gpu.IMAGES["tiny"])
    device = torch.device("cuda")
    args = bench_gpu.script_args("fedavg", path, device, str(tmp_path / "runs"))
    args = type(args)(**{**vars(args), "momentum": 0.9, "weight_decay": 1e-3, "batch_size": 7})
    data = common.load_federated_data(args, device)
    torch.manual_seed(0)
    model = common.build_model(args.model, data).to(device)
    start = common.flatten_state(model).clone()
    clients = [3, 11]
    graphed = bench_gpu.GraphedLocalTrain(model, data, args, capture=True)
    reference = common.build_model(args.model, data).to(device)
    for c in clients:
        seed = common.client_seed(args.seed, 1, c)
        common.load_flat_state(model, start)
        loss = graphed.local_train(data.train_idx[c], seed)
        common.load_flat_state(reference, start)
        assert torch.equal(loss, common.local_train(reference, data, data.train_idx[c], args, seed))
        assert torch.equal(common.flatten_state(model), common.flatten_state(reference))
    batches = bench_gpu.round_batches(data, clients, args, 1)
    starts = start.expand(2, -1)
    trained, losses = bench_gpu.StackedSGD(model, data, args, 2, capture=True).train(starts, batches)
    expected, expected_losses = together.train_together(model, starts, batches, data.x, data.y, args.lr, args.momentum,
                                                        args.weight_decay)
    assert (trained - expected).abs().max() < 1e-5 and (losses - expected_losses).abs().max() < 1e-5
