"""The five algorithm scripts on Flower (Message API): one ServerApp and one ClientApp.

    python flower_app.py fedavg --dataset synthetic --rounds 20     # a Flower simulation
    python flower_app.py pfedla --dataset cifar10 --k 1             # any script's own flags

ALGORITHM is fedavg, fedala, pfedla, fedpake or fedacd; the flags are that script's (its own
``parse_args``), and the run folder is the script's (config.json, partition.json,
metrics.csv, summary.json; no checkpoint: ``--resume`` is refused). With the same flags and
seed, metrics.csv equals the script's (docs/flower.md). Ctrl-C (SIGHUP; SIGTERM until Ray has
started, then Ray takes it) stops at once with one line (exit status 130, 129, 143); a node's
failure comes back to the server as one
line (``reply``), which stops the run: exit status 2 for bad input (common.UserError), 1
otherwise.

Who does what. The ServerApp samples the clients with the script's generator
(``common.sample_clients``), sends each its model, runs the script's server step (FedAvg's
average, ``fedpake.server_update``, pFedLA's hypernetworks, FedACD's score weights) and
evaluates as the script does. Each ClientApp runs the script's ``client_update``. Client i
is the node whose node config has ``partition-id`` i; every process loads the same data
(``common.load_federated_data`` with the same flags and seed) and keeps it. What a client
keeps between rounds (FedALA's local model and ALA weights) lives in its ``Context.state``.

Deployment (SuperLink, SuperNodes, ``flwr run``): ``server_app`` and ``client_app`` below;
the run config holds ``algorithm`` and ``flags`` (a string); see docs/flower.md.
"""
import contextlib
import importlib
import logging
import os
import shlex
import signal
import sys
import threading
import time
import traceback

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
except ImportError:
    if __name__ == "__main__":
        print("error: Flower is not installed; run: pip install -r requirements-flower.txt", file=sys.stderr)
        sys.exit(2)
    raise

import torch

import common
import fedavg
import run_folder

RESUME_REFUSED = "flower_app.py does not support --resume (a Flower run writes no checkpoint); start the run again"
ALGORITHMS = ("fedavg", "fedala", "pfedla", "fedpake", "fedacd")
USAGE = f"usage: python flower_app.py {{{','.join(ALGORITHMS)}}} [that script's flags]"
# a node's reply when its client fails, as a one-line Error: the server stops the run and says why
USER_ERROR = 100  # common.UserError (bad input, e.g. data the model does not fit): exit status 2
NODE_FAULT = 101  # any other exception: exit status 1


class NodeFailed(Exception):
    """A node's client failed with something else than bad input; main() says so in one line."""


class Interrupted(Exception):
    """Raised in the server thread after a Ctrl-C (SIGTERM, SIGHUP), so that it records no further round."""

# ----------------------------------------------------------------------------- what every process shares

class Job:
    """One run's parsed flags, device and data in this process (server or node), loaded once."""

    def __init__(self, algorithm, flags):
        if algorithm not in ALGORITHMS:
            raise common.UserError(f"unknown algorithm {algorithm!r}; {USAGE}")
        self.algorithm, self.flags = algorithm, list(flags)
        self.module = importlib.import_module(algorithm)
        self.args = self.module.parse_args(self.flags)
        if self.args.resume:
            raise common.UserError(RESUME_REFUSED)
        self.device = common.resolve_device(self.args.device)
        self.data = common.load_federated_data(self.args, self.device)
        self.models = {}

    def build(self):
        """A new model of the script's architecture (drawn from torch's global generator)."""
        auto = "resnet18" if self.algorithm == "fedacd" and self.args.dataset == "tinyimagenet" \
            else self.module.AUTO_IMAGE
        return common.build_model(self.args.model, self.data, auto_image=auto).to(self.device)

    def model(self, name="worker"):
        """A reusable model, built once per name in this process."""
        if name not in self.models:
            self.models[name] = self.build()
        return self.models[name]


_JOB = {}  # this process's current job: a node serves one run at a time


def job_for(algorithm, flags):
    key = (algorithm, tuple(flags))
    if key not in _JOB:
        _JOB.clear()  # one dataset in memory at a time
        _JOB[key] = Job(algorithm, flags)
    return _JOB[key]


EVAL_KEYS = ("correct", "count", "loss_sum")  # common.evaluate's per-client result


def arrays(named):
    return ArrayRecord({k: Array(v.detach().cpu().numpy()) for k, v in named.items()})


def tensors(record, device):
    return {k: torch.from_numpy(v.numpy()).to(device) for k, v in record.items()}


# ----------------------------------------------------------------------------- client side (one per node)

def fedavg_client(job, client, round_, received, evaluate, state):
    """FedAvg's client update, which FedPake uses too (Alg. 1: FedAvg's local training)."""
    trained, loss = fedavg.client_update(job.model(), received["global"], job.data, client, job.args, round_)
    return {"trained": trained}, {"loss": float(loss)}


def fedala_client(job, client, round_, received, evaluate, state):
    """The node keeps its local model and its row of the ALA weights in its Context.state; a
    client's first message also carries the initial model, its local model until then."""
    m, args = job.module, job.args
    global_model = job.model("global")
    common.load_flat_state(global_model, received["global"])
    if "ala" not in job.models:  # the script's ALA object; a node uses only its own row
        job.models["ala"] = m.ALA(global_model, args.num_clients, p=args.p, eta=args.eta, s=args.s,
                                  batch_size=args.batch_size, threshold=args.threshold,
                                  num_pre_loss=args.num_pre_loss, max_init_epochs=args.max_init_epochs)
    ala, saved, config = job.models["ala"], state.arrays(), state.config()
    ala.weights[client] = saved.get("ala_weights", 1.0)  # ones before the first ALA (Alg. 1 l. 2)
    ala.start_phase[client] = bool(config.get("start_phase", True))
    ala.init_losses[client] = list(config.get("init_losses", []))
    local = saved.get("local", received.get("initial"))
    trained, loss, ala_epochs, result = m.client_update(job.model(), global_model, local, ala, job.data, client,
                                                        args, round_, evaluate)
    state.save({"local": trained, "ala_weights": ala.weights[client]},
               {"start_phase": ala.start_phase[client], "init_losses": [float(v) for v in ala.init_losses[client]]})
    return ({"trained": trained, **(dict(zip(EVAL_KEYS, result)) if evaluate else {})},
            {"loss": float(loss), "ala_epochs": ala_epochs, "initial_stage_epochs": len(ala.init_losses[client])})


def fedala_evaluate(job, client, round_, received, evaluate, state):
    """A client that did not join the round: its current local model on its test data."""
    common.load_flat_state(job.model(), state.arrays().get("local", received.get("initial")))
    return dict(zip(EVAL_KEYS, common.evaluate(job.model(), job.data, [job.data.test_idx[client]]))), {}


def pfedla_client(job, client, round_, received, evaluate, state):
    trained, loss = job.module.client_update(job.model(), received["theta_bar"], job.data, client, job.args, round_)
    return {"trained": trained}, {"loss": float(loss)}


def fedacd_client(job, client, round_, received, evaluate, state):
    data = job.data
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64, device=job.device)
    risk = None
    if evaluate:  # the script's average-risk set-up: client label priors and the per-class test sets
        risk_test = data.global_test_idx if data.global_test_idx is not None else torch.cat(data.test_idx)
        risk = ([risk_test[data.y[risk_test] == c] for c in range(data.num_classes)],
                counts / counts.sum(1, keepdim=True))
    trained, loss, score, kl, local_risk = job.module.client_update(
        job.model(), received["global"], data, client, counts > 0, job.args, round_, risk)
    metrics = {"loss": float(loss), "score": float(score), "kl": float(kl)}
    if local_risk is not None:
        metrics["local_risk"] = float(local_risk)
    return {"trained": trained}, metrics


CLIENTS = {"fedavg": fedavg_client, "fedala": fedala_client, "pfedla": pfedla_client,
           "fedpake": fedavg_client, "fedacd": fedacd_client}


class NodeState:
    """One run's entries in a node's Context.state (keys ``<run folder>/<name>``), so that a
    node can serve several runs (the tests run all five algorithms in one simulation)."""

    def __init__(self, context_state, run, device):
        self.state, self.run, self.device = context_state, run, device

    def arrays(self):
        key = f"{self.run}/arrays"
        return tensors(self.state[key], self.device) if key in self.state else {}

    def config(self):
        key = f"{self.run}/config"
        return dict(self.state[key]) if key in self.state else {}

    def save(self, tensor_dict, config):
        self.state[f"{self.run}/arrays"], self.state[f"{self.run}/config"] = arrays(tensor_dict), ConfigRecord(config)


client_app = ClientApp()


def _node_call(msg, context, handlers):
    """Run this node's client (partition-id) for the message's run with ``handlers[algorithm]``."""
    config = msg.content["job"]
    job = job_for(config["algorithm"], config["flags"])
    client = partition_id(context)
    if not 0 <= client < job.args.num_clients:
        raise common.UserError(f"this node's partition-id {client} is outside 0..{job.args.num_clients - 1}")
    out_arrays, metrics = handlers[job.algorithm](job, client, int(config["round"]),
                                                  tensors(msg.content["arrays"], job.device), bool(config["evaluate"]),
                                                  NodeState(context.state, config["run"], job.device))
    return RecordDict({"arrays": arrays(out_arrays), "metrics": MetricRecord(metrics)})


def partition_id(context):
    """This node's client: the partition-id of its node config."""
    try:
        return int(context.node_config["partition-id"])
    except (KeyError, TypeError, ValueError):
        raise common.UserError("a node without an integer partition-id in its node config; start each SuperNode "
                               "with --node-config \"partition-id=i num-partitions=N\"") from None


def reply(msg, work):
    """The reply to ``msg`` with what ``work()`` returns (a RecordDict). If it fails, the reply is
    an Error of one line instead (not a traceback in the node's log and again on the server):
    USER_ERROR for common.UserError, e.g. from loading the data or building the model, else
    NODE_FAULT with the exception and where it was raised; the server stops the run with it."""
    try:
        return Message(work(), reply_to=msg)
    except common.UserError as e:
        return Message(Error(USER_ERROR, str(e)), reply_to=msg)
    except Exception as e:  # noqa: BLE001  any failure of the client: reported by the server
        where = traceback.extract_tb(e.__traceback__)[-1]
        first_line = (str(e).strip().splitlines() or [""])[0]
        return Message(Error(NODE_FAULT, f"{e.__class__.__name__}: {first_line} "
                                         f"({os.path.basename(where.filename)}:{where.lineno})"), reply_to=msg)


@client_app.query()
def query(msg, context):
    """The server asks each node which client (partition-id) it is."""
    return reply(msg, lambda: RecordDict({"metrics": MetricRecord({"partition-id": partition_id(context)})}))


@client_app.train()
def train(msg, context):
    return reply(msg, lambda: _node_call(msg, context, CLIENTS))


@client_app.evaluate()
def evaluate(msg, context):
    return reply(msg, lambda: _node_call(msg, context, {"fedala": fedala_evaluate}))


# ----------------------------------------------------------------------------- server side

def connect(grid, num_clients, timeout=600.0):
    """Wait for the nodes and ask each its partition-id: {client i: node id}."""
    deadline = time.monotonic() + timeout
    while len(node_ids := list(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise common.UserError(f"only {len(node_ids)} of {num_clients} nodes connected in {timeout:.0f} s")
        time.sleep(0.05)
    replies = grid.send_and_receive([Message(RecordDict(), node, "query") for node in node_ids])
    nodes = {int(r.content["metrics"]["partition-id"]): r.metadata.src_node_id for r in check(replies)}
    if sorted(nodes) != list(range(num_clients)):
        raise common.UserError(f"the nodes' partition-ids are {sorted(nodes)}, expected 0..{num_clients - 1} "
                               "(one node per client: --node-config \"partition-id=i num-partitions=N\")")
    return nodes


def check(replies, client_of=None, during=""):
    """The replies, unless a node failed: then its one-line Error (see ``reply``) as a
    common.UserError (exit status 2) or NodeFailed (exit status 1). An Error that Flower made
    (say, a node that crashed) shows its last line."""
    replies = list(replies)
    for r in replies:
        if r.has_error():
            if r.error.code == USER_ERROR:
                raise common.UserError(r.error.reason)
            node = r.metadata.src_node_id
            who = f"client {client_of[node]} (node {node})" if node in (client_of or {}) else f"node {node}"
            lines = [line.strip() for line in str(r.error.reason or "").splitlines() if line.strip()]
            raise NodeFailed(f"{who} failed{during}: {lines[-1] if lines else f'Flower error code {r.error.code}'}")
    return replies


def exchange(grid, nodes, job, run_name, message_type, round_, per_client, evaluate=False):
    """Send client i ``per_client[i]`` (name -> tensor) and return {i: (tensors, metrics)}."""
    config = ConfigRecord({"algorithm": job.algorithm, "flags": job.flags, "run": run_name, "round": round_,
                           "evaluate": evaluate})
    messages = [Message(RecordDict({"job": config, "arrays": arrays(sent)}), nodes[client], message_type,
                        group_id=str(round_)) for client, sent in per_client.items()]
    client_of = {node: client for client, node in nodes.items()}
    return {client_of[r.metadata.src_node_id]: (tensors(r.content["arrays"], job.device), dict(r.content["metrics"]))
            for r in check(grid.send_and_receive(messages), client_of, f" in round {round_}")}


def fedavg_setup(job, server):
    server["global_model"] = job.build()


def fedavg_round(job, server, clients, round_, evaluate, send):
    """FedAvg (and FedPake: its server step) and FedACD: the global model to every client."""
    m, args, global_state = job.module, job.args, common.flatten_state(server["global_model"])
    replies = send("train", {c: {"global": global_state} for c in clients}, evaluate)
    states = [replies[c][0]["trained"] for c in clients]
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in clients]
    metrics, up = {}, 0
    if job.algorithm == "fedacd":
        scores = [torch.tensor(replies[c][1]["score"], dtype=torch.float64, device=job.device) for c in clients]
        new_global, up = m.server_update(states, scores, args.uniform_agg), 8 * len(clients)  # + the score V_m
        if evaluate:
            kls, risks = ([replies[c][1][k] for c in clients] for k in ("kl", "local_risk"))
            mean = lambda values: float(torch.tensor(values, dtype=torch.float64).mean())
            metrics = {"local_kl": mean(kls), "score_min": float(min(scores)), "score_max": float(max(scores)),
                       "local_risk": mean(risks)}
    elif job.algorithm == "fedpake":
        new_global, metrics = m.server_update(states, [len(job.data.train_idx[c]) for c in clients], args, round_)
    else:
        new_global = m.server_update(states, [len(job.data.train_idx[c]) for c in clients])
    common.load_flat_state(server["global_model"], new_global)
    model_bytes = common.state_bytes(server["global_model"])
    if evaluate:
        metrics = {**common.evaluate_global(server["global_model"], job.data),
                   "train_loss": sum(losses) / len(losses), **metrics}
    return metrics, model_bytes * len(clients), model_bytes * len(clients) + up


def fedala_setup(job, server):
    server["global_model"] = job.build()
    try:  # the script's check of --p against the model, before any node trains
        job.module.ALA(server["global_model"], 1, p=job.args.p)
    except ValueError as e:
        raise common.UserError(f"--p {job.args.p}: {e}")
    server["initial"] = common.flatten_state(server["global_model"]).clone()  # every local model at first (l. 1)
    server["seen"], server["initial_stage_epochs"] = set(), [0] * job.args.num_clients


def fedala_round(job, server, clients, round_, evaluate, send):
    global_model, n = server["global_model"], job.args.num_clients
    global_state = common.flatten_state(global_model)

    def first_contact(c):  # the node has no local model yet: send the initial one
        return {} if c in server["seen"] else {"initial": server["initial"]}

    replies = send("train", {c: {"global": global_state, **first_contact(c)} for c in clients}, evaluate)
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in clients]
    for c in clients:
        server["initial_stage_epochs"][c] = int(replies[c][1]["initial_stage_epochs"])
    server["seen"].update(clients)
    num_samples = [len(job.data.train_idx[c]) for c in clients]
    trained = torch.stack([replies[c][0]["trained"] for c in clients])
    common.load_flat_state(global_model, common.weighted_average(trained, num_samples))  # Alg. 1 l. 18
    model_bytes = common.state_bytes(global_model)
    if not evaluate:
        return {}, model_bytes * len(clients), model_bytes * len(clients)
    # joining clients: their ALA-initialised models; the others evaluate their current local models
    results = {c: replies[c][0] for c in clients}
    others = [c for c in range(n) if c not in results]
    if others:
        results.update({c: r[0] for c, r in send("evaluate", {c: first_contact(c) for c in others}).items()})
    totals = [torch.cat([results[c][k] for c in range(n)]) for k in EVAL_KEYS]
    return ({**common.accuracy_metrics(*totals), "train_loss": sum(losses) / len(losses),
             "ala_epochs": sum(replies[c][1]["ala_epochs"] for c in clients) / len(clients)},
            model_bytes * len(clients), model_bytes * len(clients))


def pfedla_setup(job, server):
    m, args = job.module, job.args
    server["global_model"] = model = job.build()  # the initial model of every client
    server["sizes"] = m.layer_sizes(model)
    if args.k > len(server["sizes"]):  # as the script, before any node trains
        raise common.UserError(f"--k {args.k} is more than the model's {len(server['sizes'])} layers")
    server["client_models"] = common.flatten_state(model).detach().repeat(args.num_clients, 1)  # Alg. 1 l. 1
    server["hypernetworks"] = m.LayerHypernetworks(args.num_clients, len(server["sizes"]), args.embed_dim,
                                                   args.hidden_dim).to(job.device)


def pfedla_round(job, server, clients, round_, evaluate, send):
    """The hypernetworks and the stored client models stay on the server (Alg. 1)."""
    m, args, sizes = job.module, job.args, server["sizes"]
    hypernetworks, client_models = server["hypernetworks"], server["client_models"]
    ids = torch.as_tensor(clients, device=job.device)
    alpha = hypernetworks(ids)                                                 # Alg. 1 l. 5
    theta_bar = m.aggregate_layerwise(alpha, client_models, sizes)             # Alg. 1 l. 5
    keep = m.retained_layers(alpha.detach(), ids, args.k)                      # Alg. 2 l. 6
    received = m.with_retained_layers(theta_bar.detach(), client_models, ids, sizes, keep)  # Alg. 2 l. 7, 13
    replies = send("train", {c: {"theta_bar": received[i]} for i, c in enumerate(clients)}, evaluate)
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in clients]
    m.server_update(hypernetworks, client_models, ids, theta_bar, received,
                    torch.stack([replies[c][0]["trained"] for c in clients]), args.hn_lr)
    element, num_params = client_models.element_size(), client_models.shape[1]
    retained = int((keep.long() * torch.as_tensor(sizes, device=job.device)).sum())  # counted as not sent
    metrics = {}
    if evaluate:
        metrics = {**m.evaluate_personalised(hypernetworks, client_models, job.model(), job.data, sizes, args.k),
                   "train_loss": sum(losses) / len(losses)}
    return metrics, (len(clients) * num_params - retained) * element, len(clients) * num_params * element


def summary_extra(job, server, run):
    """The script's extra summary entries."""
    if job.algorithm == "fedala":
        ala = job.module.ALA(server["global_model"], 1, p=job.args.p)
        return {"ala_weights_per_client": ala.num_weights(), "initial_stage_epochs": server["initial_stage_epochs"]}
    if job.algorithm == "pfedla":
        with torch.no_grad():
            ids = torch.arange(job.args.num_clients, device=job.device)
            self_weight = server["hypernetworks"](ids)[ids, :, ids].mean(0).tolist()
        return {"self_weight_per_layer": [[name, round(w, 4)] for (name, _), w
                                          in zip(common.layers(server["global_model"]), self_weight)]}
    if job.algorithm == "fedacd":
        risks = [float(r["local_risk"]) for r in run.rows]
        return {"local_risk": {"best": min(risks), "final": risks[-1],
                               "last10_mean": sum(risks[-10:]) / len(risks[-10:])}}
    return {}


SERVERS = {"fedavg": (fedavg_setup, fedavg_round), "fedala": (fedala_setup, fedala_round),
           "pfedla": (pfedla_setup, pfedla_round), "fedpake": (fedavg_setup, fedavg_round),
           "fedacd": (fedavg_setup, fedavg_round)}


def serve(grid, algorithm, flags, nodes=None):
    """One run of ``algorithm`` with the script's ``flags``, its clients on the grid's nodes."""
    job = job_for(algorithm, flags)
    args = job.args
    nodes = nodes or connect(grid, args.num_clients)
    rng = common.seed_everything(args.seed)  # as the script: then the models, in the script's order
    setup, one_round = SERVERS[algorithm]
    server = {}
    setup(job, server)
    name = "heurpfedla" if algorithm == "pfedla" and args.k > 0 else algorithm
    run = run_folder.Run(name, args, job.data, job.device, headline=job.module.HEADLINE,
                         headline_metric=job.module.HEADLINE_METRIC, script="flower_app")
    run_name = os.path.basename(run.dir)
    print(f"[{name}] Flower: {args.num_clients} clients on {len(nodes)} nodes")

    def send(message_type, per_client, evaluate=False):
        return exchange(grid, nodes, job, run_name, message_type, round_, per_client, evaluate)

    try:
        for round_ in range(1, args.rounds + 1):
            clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
            metrics, down, up = one_round(job, server, clients, round_, run.should_eval(round_), send)
            with recording():
                run.add_bytes(down=down, up=up)
                if metrics:
                    run.log(round_, metrics)
            if run.stop_requested(round_):
                break
        with recording():
            run.finish(summary_extra(job, server, run))
            run.close()
    except BaseException as e:  # as the scripts: a diverged run says so in summary.json
        with _RECORDING:
            run.close(failed=True, diverged=isinstance(e, common.DivergedError))
        raise
    return nodes


# Ctrl-C (or SIGTERM, SIGHUP) in main()'s simulation: it stops at once, as there is no checkpoint
# to write. The server thread runs on (Flower's), so main() reports what the run folder holds and
# leaves; the server thread writes nothing after that. Exit status 128 + the signal's number.
# (Once Ray has started, its core worker has its own SIGTERM handler in this process: a stack dump
# and abort. Taking SIGTERM back would mean starting Ray here rather than in Flower's RayBackend.)
_STOPPED = threading.Event()
_RECORDING = threading.Lock()  # held while the server thread writes to the run folder, and by main() on a stop
_STOPPED_BY = []  # the signal that stopped the simulation
_REAL_STDERR = []  # after it: a duplicate of the real stderr, while file descriptor 2 goes to /dev/null
_CHILDREN = {}  # after it: this process's descendants then (Ray's), {pid: start time}


@contextlib.contextmanager
def recording():
    """The server thread writes to the run folder in here; after a stop it raises Interrupted."""
    with _RECORDING:
        if _STOPPED.is_set():
            raise Interrupted
        yield


def on_stop_signal(signum, frame):
    """main()'s handler of Ctrl-C, SIGTERM and SIGHUP: from now on stderr goes to /dev/null (what
    Flower, Ray and the nodes print while they stop) and a further signal changes nothing; the
    KeyboardInterrupt ends the simulation (Flower then stops Ray), and leave_after_stop says one line."""
    run_folder.handle_stop_signals(signal.SIG_IGN)
    _STOPPED_BY.append(signum)
    _CHILDREN.update(descendants())  # now: once Ray stops its raylet, the nodes' workers are no children of ours
    sys.stderr.flush()
    _REAL_STDERR.append(os.dup(2))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    raise KeyboardInterrupt


def leave_after_stop():
    """Stop Ray if Flower has not, release the run folder (run_folder.Run.close: one without an
    evaluated round is removed), say in one line on the real stderr what is kept, and exit with
    status 128 + the signal's number at once (Flower's server thread may wait for replies that
    will never come)."""
    signum = _STOPPED_BY[0] if _STOPPED_BY else signal.SIGINT
    what = run_folder.stopped_by(signum)
    with _RECORDING:
        _STOPPED.set()
        run = run_folder.OPEN_RUNS[-1] if run_folder.OPEN_RUNS else None
        if run is None:
            line = f"{what} before the run folder was made; nothing was written"
        elif not run.rows:
            line = f"{what} before the first evaluated round; nothing was kept (a Flower run writes no checkpoint)"
        else:
            line = (f"{what}; a Flower run writes no checkpoint, so there is nothing to resume; "
                    f"{run.dir}/metrics.csv keeps the rounds up to {run.rows[-1]['round']}")
        for open_run in list(run_folder.OPEN_RUNS):
            open_run.close(failed=True)
    try:
        stop_ray()
    except Exception:  # noqa: BLE001  leaving anyway; stderr is silenced
        pass
    for pid, start in _CHILDREN.items():  # Ray's workers take seconds to notice that Ray has stopped
        if parent_and_start(pid)[1] == start:  # the same process, not a new one with its id
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):  # after SIGHUP the terminal may be gone
        sys.stdout.flush()
        os.write(_REAL_STDERR[0] if _REAL_STDERR else 2, f"{line}\n".encode())
    os._exit(128 + signum)


def stop_ray():
    """Shut Ray down if it is still up: Flower does, unless stopped while Ray was starting."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def parent_and_start(pid):
    """(parent pid, start time) of process ``pid`` from /proc/PID/stat (Linux), or (None, None)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None, None


def descendants():
    """{pid: start time} of this process's children, their children, ... (Ray's raylet, GCS and
    workers); empty where there is no /proc."""
    children = {}  # parent pid: [(pid, start time)]
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            parent, start = parent_and_start(entry)
            children.setdefault(parent, []).append((int(entry), start))
    found, parents = {}, [os.getpid()]
    while parents:
        for pid, start in children.get(parents.pop(), []):
            found[pid] = start
            parents.append(pid)
    return found


def build_server_app(jobs=None):
    """A ServerApp running ``jobs`` [(algorithm, flags)] one after another on the same nodes; with
    none, the run config's ``algorithm`` and ``flags`` (deployment: ``flwr run``)."""
    app = ServerApp()

    @app.main()
    def main(grid, context):
        todo = jobs or [(context.run_config["algorithm"], shlex.split(str(context.run_config.get("flags", ""))))]
        nodes = None
        for algorithm, flags in todo:
            nodes = serve(grid, algorithm, flags, nodes)

    return app


server_app = build_server_app()


def _no_run_simulation_notice(record):
    """run_simulation is deprecated in favour of `flwr run` (which needs a federation config and a
    SuperLink): keep its 5-line notice off stderr, where errors are one line."""
    return "run_simulation" not in str(record.args)


def simulate(jobs, num_cpus=None):
    """Run ``jobs`` [(algorithm, flags)] in one Flower simulation (one Ray start-up); all jobs
    need the same --num-clients (one node per client). Returns nothing; the run folders are
    under each job's --out."""
    from flwr.simulation import run_simulation
    sizes = {importlib.import_module(a).parse_args(list(f)).num_clients for a, f in jobs}
    if len(sizes) != 1:
        raise common.UserError("the jobs of one simulation need the same --num-clients")
    num_cpus = num_cpus or len(os.sched_getaffinity(0))
    logging.getLogger("flwr").addFilter(_no_run_simulation_notice)  # added once, however many calls
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report over the network
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # and no warning about GPUs on CPU nodes
    try:  # log_to_driver False: what the nodes' Ray workers print stays in Ray's logs (a client's failure
        # comes back to the server in its reply, see ``reply``), not Flower's warnings as Ray stops them
        run_simulation(server_app=build_server_app(jobs), client_app=client_app, num_supernodes=sizes.pop(),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": num_cpus, "include_dashboard": False,
                                                     "log_to_driver": False}})
    finally:
        stop_ray()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n(python flower_app.py ALGORITHM --help lists that script's flags; see docs/flower.md)")
        return 0
    if not argv or argv[0] not in ALGORITHMS:
        raise common.UserError(f"{'unknown algorithm ' + repr(argv[0]) + '; ' if argv else ''}{USAGE}")
    if any(len(a.split("=")[0]) >= 4 and "--resume".startswith(a.split("=")[0]) for a in argv[1:]):
        raise common.UserError(RESUME_REFUSED)
    importlib.import_module(argv[0]).parse_args(argv[1:])  # bad flags: one line and exit 2, before Ray starts
    import flower_app  # the apps by module name, so that Ray's workers import them rather than copy __main__
    previous = run_folder.handle_stop_signals(flower_app.on_stop_signal)
    try:
        flower_app.simulate([(argv[0], argv[1:])])
    except KeyboardInterrupt:
        flower_app.leave_after_stop()  # one line, exit status 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP)
    except flower_app.NodeFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        run_folder.restore_signals(previous)


if __name__ == "__main__":
    run_folder.run_main(main)
