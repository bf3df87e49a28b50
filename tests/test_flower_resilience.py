"""flower/app.py's server in a deployment's conditions, in this process and in seconds: a grid
of fake nodes (``FakeGrid``) that answers the server's messages with flower/app.py's own client
handlers, and can lose a node, bring it back under a new node id, or make a client fail.
What a real SuperLink and SuperNodes do is checked in test_flower_deploy.py (slow)."""
import itertools
import json
import os
import types

import pytest

from conftest import metrics_rows, run_dir, run_in_process

pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
import torch  # noqa: E402
from flwr.app import Error, Message  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

import common  # noqa: E402
from flower import app as flower_app  # noqa: E402

SMALL = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "5"]
NEW_COLUMNS = {"clients_answered", "clients_left_out"}  # Flower's only
MEASURED = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}
NODE_UNAVAILABLE = 5  # flwr.common.constant.ErrorCode.NODE_UNAVAILABLE


class FakeGrid:
    """A Grid (get_node_ids, push_messages, pull_messages) whose nodes run flower/app.py's ClientApp
    handlers in this process. ``events[(message type, round, "before" or "after")]`` runs before
    or after that round's messages of that type are answered (lose a node, bring one back)."""

    def __init__(self, num_nodes, events=None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # what a ServerApp process has
        self.node_ids = itertools.count(1000)
        self.partition_of = {next(self.node_ids): i for i in range(num_nodes)}  # online node id: partition-id
        self.events, self.replies, self.message_ids = dict(events or {}), {}, itertools.count()
        self.failing = {}  # (round, client): the exception the client raises

    def lose(self, partition):
        """The node of ``partition`` stops: no heartbeat, so the SuperLink no longer lists it."""
        self.partition_of = {n: p for n, p in self.partition_of.items() if p != partition}

    def restart(self, partition):
        """A SuperNode with ``partition`` joins again: a new node id."""
        self.lose(partition)
        self.partition_of[next(self.node_ids)] = partition

    def get_node_ids(self):
        return list(self.partition_of)

    def push_messages(self, messages):
        messages = list(messages)
        batch = (messages[0].metadata.message_type, int(messages[0].metadata.group_id or 0)) if messages else None
        self.events.pop((*batch, "before"), lambda grid: None)(self) if batch else None
        ids = []
        for msg in messages:
            message_id = f"m{next(self.message_ids)}"
            msg.metadata.__dict__["_message_id"] = message_id
            node, (kind, round_) = msg.metadata.dst_node_id, batch
            if node not in self.partition_of:
                self.replies[message_id] = Message(Error(NODE_UNAVAILABLE, "Error: Node Unavailable"), reply_to=msg)
            elif (round_, self.partition_of[node]) in self.failing:
                error = flower_app.error_line(self.failing[round_, self.partition_of[node]])
                self.replies[message_id] = Message(Error(*error), reply_to=msg)
            else:
                context = types.SimpleNamespace(node_config={"partition-id": self.partition_of[node]})
                handler = {"query": flower_app.query, "train": flower_app.train, "evaluate": flower_app.evaluate}
                self.replies[message_id] = handler[kind](msg, context)
            ids.append(message_id)
        self.events.pop((*batch, "after"), lambda grid: None)(self) if batch else None
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def serve(grid, argv):
    algorithm, options, flags = flower_app.plan(argv)
    return flower_app.serve(grid, algorithm, flags, options)


pytestmark = pytest.mark.usefixtures("one_thread")  # as run_in_process: the script and the nodes equal bit for bit


def same_metrics(a, b, skip=frozenset()):
    rows_a, rows_b = metrics_rows(a), metrics_rows(b)
    assert [r["round"] for r in rows_a] == [r["round"] for r in rows_b]
    for x, y in zip(rows_a, rows_b):
        for key in set(x) - MEASURED - NEW_COLUMNS - set(skip):
            assert x[key] == y[key], (key, x["round"], x[key], y[key])


@pytest.mark.parametrize("algorithm,extra", [("fedavg", []), ("fedala", ["--join-ratio", "0.5"]),
                                             ("pfedla", ["--k", "1", "--join-ratio", "0.5"]), ("fedpake", []),
                                             ("fedacd", [])])
def test_server_on_the_nodes_equals_the_script(tmp_path, algorithm, extra):
    """The whole server (nodes, exchange, the algorithm's server step) against the script, bit for bit."""
    flags = SMALL[:-1] + ["3", *extra]
    assert run_in_process(f"{algorithm}.py", *flags, "--out", tmp_path / "script") == 0
    serve(FakeGrid(4), [algorithm, *flags, "--out", str(tmp_path / "flower")])
    same_metrics(run_dir(tmp_path / "script"), run_dir(tmp_path / "flower"))
    rows = metrics_rows(run_dir(tmp_path / "flower"))
    assert [r["clients_left_out"] for r in rows] == ["0"] * 3


def test_fedala_state_survives_a_node_restart(tmp_path):
    """The server keeps each client's local model, ALA weights and initial-stage record: a node
    that restarts between rounds (a new process, a new node id) goes on as if it had not."""
    flags = ["fedala", *SMALL, "--join-ratio", "0.75"]
    serve(FakeGrid(4), [*flags, "--out", str(tmp_path / "plain")])
    events = {("train", 2, "after"): lambda g: [g.restart(p) for p in range(4)],
              ("train", 3, "after"): lambda g: g.restart(1)}
    serve(FakeGrid(4, events), [*flags, "--out", str(tmp_path / "restarted")])
    same_metrics(run_dir(tmp_path / "plain"), run_dir(tmp_path / "restarted"))


@pytest.mark.parametrize("algorithm", ["fedavg", "fedala", "pfedla", "fedacd"])
def test_a_lost_node_leaves_its_client_out_and_a_returning_one_takes_it_back(tmp_path, algorithm, capsys):
    events = {("train", 2, "before"): lambda g: g.lose(1), ("train", 3, "after"): lambda g: g.restart(1)}
    serve(FakeGrid(4, events), [algorithm, *SMALL, "--join-ratio", "1", "--out", str(tmp_path)])
    folder = run_dir(tmp_path)
    rows = metrics_rows(folder)
    assert [r["clients_answered"] for r in rows] == ["4", "3", "3", "4", "4"]
    left_out = [int(r["clients_left_out"]) for r in rows]
    assert left_out[0] == 0 and left_out[1] >= 1 and left_out[3:] == [0, 0]
    with open(os.path.join(folder, "summary.json")) as f:
        assert json.load(f)["status"] == "finished"
    out = capsys.readouterr().out
    assert "round 2: client 1 left out (Error: Node Unavailable)" in out
    assert "round 3: client 1 left out (no node)" in out
    assert "client 1: node" not in out  # the new node is not a replacement of a live one


def test_a_failing_client_is_left_out_with_one_line(tmp_path, capsys):
    grid = FakeGrid(4)
    grid.failing = {(2, 0): RuntimeError("CUDA out of memory"), (2, 2): RuntimeError("CUDA out of memory")}
    serve(grid, ["fedacd", *SMALL, "--join-ratio", "1", "--out", str(tmp_path)])
    rows = metrics_rows(run_dir(tmp_path))
    assert [r["clients_answered"] for r in rows] == ["4", "2", "4", "4", "4"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert lines == [f"[flower] round 2: client {c} left out (RuntimeError: CUDA out of memory)" for c in (0, 2)]


def test_bad_input_found_by_a_node_stops_the_run_with_its_line(tmp_path):
    grid = FakeGrid(4)
    grid.failing = {(2, 1): common.UserError("--model cnn does not take samples of shape (1, 32, 8)")}
    with pytest.raises(common.UserError, match=r"^--model cnn does not take samples of shape \(1, 32, 8\)$"):
        serve(grid, ["fedavg", *SMALL, "--join-ratio", "1", "--out", str(tmp_path)])
    assert json.load(open(os.path.join(run_dir(tmp_path), "summary.json")))["status"] == "failed"


def test_fewer_than_min_clients_stops_the_run_with_one_line_and_a_failed_summary(tmp_path):
    events = {("train", 3, "before"): lambda g: [g.lose(p) for p in (0, 1, 2)]}
    with pytest.raises(flower_app.TooFewClients, match=r"round 3: 1 of 4 clients answered, fewer than "
                                                       r"--min-clients 2") as caught:
        serve(FakeGrid(4, events), ["fedavg", *SMALL, "--min-clients", "2", "--out", str(tmp_path)])
    assert "\n" not in str(caught.value)
    folder = run_dir(tmp_path)
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert summary["status"] == "failed" and summary["rounds_done"] == 2 and "--min-clients" in summary["error"]


@pytest.mark.parametrize("algorithm", ["fedala", "pfedla", "fedpake"])
def test_a_stopped_server_resumes_to_the_uninterrupted_metrics(tmp_path, algorithm, capsys):
    flags = [algorithm, *SMALL, "--join-ratio", "0.75", "--checkpoint-every", "1"]
    serve(FakeGrid(4), [*flags, "--out", str(tmp_path / "whole")])
    serve(FakeGrid(4), [*flags, "--out", str(tmp_path / "parts"), "--stop-after", "2"])
    folder = run_dir(tmp_path / "parts")
    assert f"continue with: python flower/app.py --resume {folder}" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(folder, "summary.json"))
    serve(FakeGrid(4), ["--resume", folder])
    same_metrics(run_dir(tmp_path / "whole"), folder)
    assert json.load(open(os.path.join(folder, "summary.json")))["status"] == "finished"


def test_the_script_continues_a_flower_run_and_flower_app_refuses_another_algorithm(tmp_path):
    """The server keeps the script's state, so its checkpoint is the script's."""
    flags = ["fedala", *SMALL, "--checkpoint-every", "1"]
    serve(FakeGrid(4), [*flags, "--out", str(tmp_path / "whole")])
    serve(FakeGrid(4), [*flags, "--out", str(tmp_path / "parts"), "--stop-after", "3"])
    folder = run_dir(tmp_path / "parts")
    assert run_in_process("fedala.py", "--resume", folder) == 0
    same_metrics(run_dir(tmp_path / "whole"), folder, skip=NEW_COLUMNS)
    with pytest.raises(common.UserError, match="is a run of fedala, not pfedla"):
        flower_app.plan(["pfedla", "--resume", folder])


def test_waiting_for_nodes_names_the_missing_partition_ids(capsys):
    grid = FakeGrid(5)
    grid.lose(1), grid.lose(3), grid.lose(4)
    clients = flower_app.Clients(grid, 5)
    with pytest.raises(common.UserError, match=r"3 of 5 clients have no node after 1 s \(--wait-for-nodes\): "
                                               r"partition-ids 1, 3-4; start one SuperNode"):
        clients.wait_for_all(1.0, every=0.3)
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line == "[flower] waiting for the nodes of partition-ids 1, 3-4 (2 of 5 connected)"
                         for line in lines)


def test_a_node_outside_the_partition_ids_is_not_used(capsys):
    grid = FakeGrid(3)
    grid.partition_of[next(grid.node_ids)] = 7
    clients = flower_app.Clients(grid, 3)
    clients.wait_for_all(5.0)
    assert sorted(clients.node_of) == [0, 1, 2]
    assert "is not used: its partition-id 7 is outside 0..2" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["fedavg", "--min-clients", "0"], "--min-clients must be >= 1, got 0"),
    (["fedavg", "--round-timeout", "-1"], "--round-timeout must be > 0"),
    (["fedavg", "--clients-per-gpu", "x"], "--clients-per-gpu: invalid int value"),
    (["--rounds", "3"], "usage: python flower/app.py"),
])
def test_bad_flower_options_are_one_line(argv, message):
    with pytest.raises(common.UserError, match=message.replace("(", r"\(")):
        flower_app.plan(argv)


def test_simulation_actors_get_no_gpu_or_a_share_of_one(monkeypatch, tmp_path):
    """On a CPU run the actors ask for no GPU and see none (CUDA_VISIBLE_DEVICES empty: no CUDA
    context, no copy of the data on a GPU); on CUDA, K actors share each GPU and Ray gives each its own."""
    assert flower_app.client_resources(torch.device("cpu"), 4) == {"num_cpus": 1, "num_gpus": 0.0}
    assert flower_app.client_resources(torch.device("cuda"), 4) == {"num_cpus": 1, "num_gpus": 0.25}
    seen = {}
    import flwr.simulation
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(flwr.simulation, "run_simulation",
                        lambda **kw: seen.update(kw, visible=os.environ["CUDA_VISIBLE_DEVICES"]))
    flower_app.simulate([["fedavg", "--dataset", "synthetic", "--num-clients", "4", "--clients-per-gpu", "2",
                          "--out", str(tmp_path)]])
    assert seen["backend_config"]["client_resources"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert seen["visible"] == "" and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # Ray's processes see no GPU; then back
    with flower_app.gpus_hidden_from_actors(torch.device("cuda")):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # on CUDA Ray shares them out


def test_a_process_loads_the_data_once_for_every_message(monkeypatch):
    loads = []
    real = common.load_federated_data
    monkeypatch.setattr(common, "load_federated_data", lambda *a, **k: loads.append(1) or real(*a, **k))
    flower_app._JOB.clear()
    config = {"algorithm": "fedavg", "flags": SMALL, "round": 1, "evaluate": False}
    model = flower_app.job_for("fedavg", SMALL).build()
    state = common.flatten_state(model).numpy()
    for client in range(4):
        sent, metrics = flower_app.node_work("train", client, config, {"global": state})
        assert sent["trained"].shape == state.shape and metrics["loss"] > 0
    assert len(loads) == 1
