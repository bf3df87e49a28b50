"""The five algorithm scripts on Flower (Message API): one ServerApp and one ClientApp.

    python flower/app.py fedavg --dataset synthetic --rounds 20     # a Flower simulation
    python flower/app.py pfedla --dataset cifar10 --k 1             # any script's own flags
    python flower/app.py --resume runs/fedala-cifar10-s0-...        # continue a stopped run
    python flower/app.py fedala --federation NAME --dataset ...     # deployment: flwr run, with an exit status

ALGORITHM is fedavg, fedala, pfedla, fedpake or fedacd; the flags are that script's (its own
``parse_args``) and flower/app.py's own (``flower_options``). The run folder is the script's
(config.json, partition.json, metrics.csv, summary.json, checkpoint.pt): the server keeps all
of the algorithm's state, so its checkpoint is the script's and either continues it. With the
same flags and seed, metrics.csv equals the script's (docs/flower.md). Ctrl-C (SIGHUP; SIGTERM
until Ray has started, then Ray takes it) stops a simulation at once with one line (exit
status 130, 129, 143).

Who does what. The ServerApp samples the clients with the script's generator
(``common.sample_clients``), sends each its model, runs the script's server step (FedAvg's
average, ``fedpake.server_update``, pFedLA's hypernetworks, FedACD's score weights) and
evaluates as the script does. Each ClientApp runs the script's ``client_update``. Client i
is the node whose node config has ``partition-id`` i; every process loads the same data
(``common.load_federated_data`` with the same flags and seed) and keeps it. A client whose
node is lost, fails or does not answer in time is left out of the round (partial
participation); a node that comes back takes its client over; fewer than --min-clients
answers stop the run (exit status 1). Bad input found by a node stops it too (exit status 2).

Deployment (SuperLink, SuperNodes, ``flwr run``): ``server_app`` and ``client_app`` below;
the run config holds ``algorithm``, ``flags`` (a string) and ``resume``; see docs/flower.md.
"""
import contextlib
import importlib
import json
import logging
import math
import os
import re
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root (or the app bundle's)
sys.path.insert(0, ROOT)  # python flower/app.py: the scripts, common, run_folder and flower.* by name from the root
import common  # noqa: E402
import run_folder  # noqa: E402

ALGORITHMS = ("fedavg", "fedala", "pfedla", "fedpake", "fedacd")
USAGE = f"usage: python flower/app.py {{{','.join(ALGORITHMS)}}} [that script's flags]"
# a node's reply when its client fails, as a one-line Error: the server stops the run and says why
USER_ERROR = 100  # common.UserError (bad input, e.g. data the model does not fit): exit status 2
NODE_FAULT = 101  # any other exception: exit status 1


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

def fedavg_client(job, client, round_, received, evaluate):
    """FedAvg's client update, and FedPake's (Alg. 1: FedAvg's local training): the script's ``client_update``."""
    trained, loss = job.module.client_update(job.model(), received["global"], job.data, client, job.args, round_)
    return {"trained": trained}, {"loss": float(loss)}


def fedala_client(job, client, round_, received, evaluate):
    """FedALA's client update on the client's state that the server keeps and sends (its local
    model, absent in round 1 where ALA is off; its row of the ALA weights; its initial-stage
    record), so that a node can restart and a run can resume; the updated state goes back."""
    m, args = job.module, job.args
    global_model = job.model("global")
    common.load_flat_state(global_model, received["global"])
    if "ala" not in job.models:  # the script's ALA object; a node uses only the row of its client
        job.models["ala"] = m.ALA(global_model, args.num_clients, p=args.p, eta=args.eta, s=args.s,
                                  batch_size=args.batch_size, threshold=args.threshold,
                                  num_pre_loss=args.num_pre_loss, max_init_epochs=args.max_init_epochs)
    ala = job.models["ala"]
    ala.weights[client] = received["ala_weights"]
    ala.initial_stage[client] = bool(received["initial_stage"])
    ala.init_losses[client] = received["init_losses"].tolist()
    trained, loss, ala_epochs, result = m.client_update(job.model(), global_model, received.get("local"), ala,
                                                        job.data, client, args, round_, evaluate)
    state = {"ala_weights": ala.weights[client], "initial_stage": torch.tensor(ala.initial_stage[client]),
             "init_losses": torch.tensor(ala.init_losses[client], dtype=torch.float64)}
    return ({"trained": trained, **state, **(dict(zip(EVAL_KEYS, result)) if evaluate else {})},
            {"loss": float(loss), "ala_epochs": ala_epochs})


def fedala_evaluate(job, client, round_, received, evaluate):
    """A client that did not join the round: its current local model (sent) on its test data."""
    common.load_flat_state(job.model(), received["local"])
    return dict(zip(EVAL_KEYS, common.evaluate(job.model(), job.data, [job.data.test_idx[client]]))), {}


def pfedla_client(job, client, round_, received, evaluate):
    trained, loss = job.module.client_update(job.model(), received["theta_bar"], job.data, client, job.args, round_)
    return {"trained": trained}, {"loss": float(loss)}


def fedacd_client(job, client, round_, received, evaluate):
    trained, loss, score, kl = job.module.client_update(job.model(), received["global"], job.data, client,
                                                        job.module.held_classes(job.data), job.args, round_)
    return {"trained": trained}, {"loss": float(loss), "score": float(score), "kl": float(kl)}


CLIENTS = {"fedavg": fedavg_client, "fedala": fedala_client, "pfedla": pfedla_client,
           "fedpake": fedavg_client, "fedacd": fedacd_client}


client_app = ClientApp()  # in a simulation; a deployment uses flower/node.py's, which calls node_work in a worker
HANDLERS = {"train": CLIENTS, "evaluate": {"fedala": fedala_evaluate}}


def node_work(message_type, client, config, received):
    """Client ``client``'s answer to a message: its ``config`` (algorithm, flags, round,
    evaluate) and ``received`` (name -> numpy array) in, (name -> numpy array, metrics) out."""
    job = job_for(config["algorithm"], list(config["flags"]))
    if not 0 <= client < job.args.num_clients:
        raise common.UserError(f"this node's partition-id {client} is outside 0..{job.args.num_clients - 1}")
    # the torch threads the script's client trains on: 1 when clients train in parallel, else all --threads (None: a
    # run that recorded no count, at torch's default)
    parallel = common.parallel_clients(job.args, job.device) > 1
    common.set_threads(1 if parallel else getattr(job.args, "threads", None))
    sent, metrics = HANDLERS[message_type][job.algorithm](
        job, client, int(config["round"]), {k: torch.from_numpy(v).to(job.device) for k, v in received.items()},
        bool(config["evaluate"]))
    return {k: v.detach().cpu().numpy() for k, v in sent.items()}, metrics


def partition_id(node_config):
    """This node's client: the partition-id of its node config."""
    try:
        return int(node_config["partition-id"])
    except (KeyError, TypeError, ValueError):
        raise common.UserError("a node without an integer partition-id in its node config; start each SuperNode "
                               "with --node-config \"partition-id=i num-partitions=N\"") from None


def error_line(e):
    """(Error code, one line) for a client's failure: USER_ERROR for common.UserError (e.g. from
    loading the data or building the model: the server stops the run), else NODE_FAULT with the
    exception and where it was raised (the server leaves the client out of the round)."""
    if isinstance(e, common.UserError):
        return USER_ERROR, str(e)
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    first_line = (str(e).strip().splitlines() or [""])[0]
    return NODE_FAULT, (f"{e.__class__.__name__}: {first_line}" +
                        (f" ({os.path.basename(where.filename)}:{where.lineno})" if where else ""))


def reply(msg, work):
    """The reply to ``msg`` with what ``work()`` returns (a RecordDict), or an Error of one line
    (``error_line``), not a traceback in the node's log and again on the server."""
    try:
        return Message(work(), reply_to=msg)
    except Exception as e:  # noqa: BLE001  any failure of the client: reported by the server
        return Message(Error(*error_line(e)), reply_to=msg)


def _node_call(msg, context):
    config = dict(msg.content["job"])
    out, metrics = node_work(msg.metadata.message_type, partition_id(context.node_config), config,
                             {k: v.numpy() for k, v in msg.content["arrays"].items()})
    return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in out.items()}), "metrics": MetricRecord(metrics)})


@client_app.query()
def query(msg, context):
    """The server asks each node which client (partition-id) it is."""
    return reply(msg, lambda: RecordDict(
        {"metrics": MetricRecord({"partition-id": partition_id(context.node_config)})}))


@client_app.train()
def train(msg, context):
    return reply(msg, lambda: _node_call(msg, context))


@client_app.evaluate()
def evaluate(msg, context):
    return reply(msg, lambda: _node_call(msg, context))


# ----------------------------------------------------------------------------- server side

def flower_parser():
    """flower/app.py's own flags (flower_options; --help lists them)."""
    parser = common._Parser(prog="flower/app.py", add_help=False, allow_abbrev=False)
    parser.add_argument("--federation", default=None, metavar="NAME",
                        help="run on the SuperLink of this federation (flwr run) instead of a simulation")
    parser.add_argument("--min-clients", type=int, default=1, metavar="M",
                        help="stop the run when fewer than M clients answer in a round (default 1)")
    parser.add_argument("--round-timeout", type=float, default=1800.0, metavar="S",
                        help="a client that has not answered after S seconds is left out of the round")
    parser.add_argument("--wait-for-nodes", type=float, default=600.0, metavar="S",
                        help="how long the server waits for every partition-id at the start (default 600)")
    parser.add_argument("--clients-per-gpu", type=int, default=4, metavar="K",
                        help="simulation on a GPU: K Ray actors share each GPU (each holds the data)")
    return parser


def flower_options(flags):
    """(flower/app.py's own options, the script's flags): both may come in one list."""
    options, rest = flower_parser().parse_known_args(list(flags))
    for ok, line in [(options.min_clients >= 1, f"--min-clients must be >= 1, got {options.min_clients}"),
                     (options.round_timeout > 0, f"--round-timeout must be > 0, got {options.round_timeout}"),
                     (options.wait_for_nodes >= 0, f"--wait-for-nodes must be >= 0, got {options.wait_for_nodes}"),
                     (options.clients_per_gpu >= 1, f"--clients-per-gpu must be >= 1, got {options.clients_per_gpu}")]:
        if not ok:
            raise common.UserError(line)
    return options, rest


QUERY_TIMEOUT = 120.0  # a new node's answer to "which partition-id are you?" (a node starting its process)
POLL = 0.05  # seconds between the server's checks for replies (Flower's send_and_receive waits 3 s)


def send_and_receive(grid, messages, timeout):
    """{index of the message: its reply} for the replies that came within ``timeout`` seconds."""
    ids = list(grid.push_messages(messages))
    waiting = {message_id: i for i, message_id in enumerate(ids)}
    replies, deadline = {}, time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for r in grid.pull_messages(list(waiting)):
            if r.metadata.reply_to_message_id in waiting:
                replies[waiting.pop(r.metadata.reply_to_message_id)] = r
        if waiting:
            time.sleep(POLL)
    return replies


def failure(reply):
    """Why a reply is not a result, in one line (a node's own Error from ``reply``, or Flower's:
    a node that stopped sending heartbeats, a ClientApp process that crashed)."""
    lines = [line.strip() for line in str(reply.error.reason or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"Flower error code {reply.error.code}"


class Clients:
    """Which node serves client i: the partition-id each node reports when asked (``query``).
    Nodes that the SuperLink no longer lists (no heartbeat) are dropped; a node that joins later
    (a restarted SuperNode: a new node id) is asked and takes its client over."""

    def __init__(self, grid, num_clients):
        self.grid, self.num_clients = grid, num_clients
        self.node_of, self.client_of_node = {}, {}  # client: node id; node id: its client (or None)

    def refresh(self):
        online = set(self.grid.get_node_ids())
        self.node_of = {c: n for c, n in self.node_of.items() if n in online}
        new = sorted(online - set(self.client_of_node))
        if not new:
            return
        replies = send_and_receive(self.grid, [Message(RecordDict(), n, "query") for n in new], QUERY_TIMEOUT)
        for i, node in enumerate(new):
            r = replies.get(i)
            if r is None:
                continue  # no answer yet: asked again at the next refresh
            if r.has_error():
                if r.error.code == USER_ERROR:
                    print(f"[flower] node {node} is not used: {r.error.reason}", flush=True)
                    self.client_of_node[node] = None
                continue
            client = int(r.content["metrics"]["partition-id"])
            if not 0 <= client < self.num_clients:
                print(f"[flower] node {node} is not used: its partition-id {client} is outside "
                      f"0..{self.num_clients - 1}", flush=True)
                self.client_of_node[node] = None
                continue
            if client in self.node_of and self.node_of[client] != node:
                print(f"[flower] client {client}: node {node} replaces node {self.node_of[client]}", flush=True)
            self.client_of_node[node], self.node_of[client] = client, node

    def missing(self):
        return [c for c in range(self.num_clients) if c not in self.node_of]

    def wait_for_all(self, timeout, every=10.0):
        """Until every client has a node, saying every ``every`` seconds which partition-ids are missing."""
        deadline, said = time.monotonic() + timeout, time.monotonic()
        while True:
            self.refresh()
            missing = self.missing()
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise common.UserError(f"{len(missing)} of {self.num_clients} clients have no node after "
                                       f"{timeout:.0f} s (--wait-for-nodes): partition-ids {ranges(missing)}; start "
                                       "one SuperNode per missing id with --node-config \"partition-id=i "
                                       f"num-partitions={self.num_clients}\"")
            if time.monotonic() - said >= every:
                print(f"[flower] waiting for the nodes of partition-ids {ranges(missing)} "
                      f"({self.num_clients - len(missing)} of {self.num_clients} connected)", flush=True)
                said = time.monotonic()
            time.sleep(0.5)


def ranges(ids):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, ids = [], sorted(ids)
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


class Exchange:
    """The server's messages to the clients of one run. A client whose node is gone, fails, or
    does not answer within --round-timeout is left out of the round (partial participation);
    common.UserError from a node (bad input: the same on every node) stops the run."""

    def __init__(self, grid, clients, job, node_flags, run_name, options):
        self.grid, self.clients, self.job, self.options = grid, clients, job, options
        self.node_flags, self.run_name = node_flags, run_name
        self.lost = 0  # clients left out since the last logged round

    def __call__(self, message_type, round_, per_client, evaluate=False):
        """Send client i ``per_client[i]`` (name -> tensor); {i: (tensors, metrics)} of those that answered."""
        self.clients.refresh()
        config = ConfigRecord({"algorithm": self.job.algorithm, "flags": self.node_flags, "run": self.run_name,
                               "round": round_, "evaluate": evaluate})
        reachable = [c for c in per_client if c in self.clients.node_of]
        messages = [Message(RecordDict({"job": config, "arrays": arrays(per_client[c])}), self.clients.node_of[c],
                            message_type, group_id=str(round_)) for c in reachable]
        replies = send_and_receive(self.grid, messages, self.options.round_timeout)
        answered, why = {}, {c: "no node" for c in per_client if c not in self.clients.node_of}
        for i, c in enumerate(reachable):
            r = replies.get(i)
            if r is None:
                why[c] = f"no answer in {self.options.round_timeout:g} s (--round-timeout)"
            elif r.has_error():
                if r.error.code == USER_ERROR:
                    raise common.UserError(r.error.reason)
                why[c] = failure(r)
                self.clients.client_of_node.pop(self.clients.node_of.pop(c, None), None)  # asked again if online
            else:
                answered[c] = (tensors(r.content["arrays"], self.job.device), dict(r.content["metrics"]))
        for c, reason in why.items():
            print(f"[flower] round {round_}: client {c} left out ({reason})", flush=True)
        self.lost += len(why)
        if message_type == "train" and len(answered) < min(self.options.min_clients, len(per_client)):
            raise TooFewClients(f"round {round_}: {len(answered)} of {len(per_client)} clients answered, fewer than "
                                f"--min-clients {self.options.min_clients}; last: " +
                                "; ".join(f"client {c}: {w}" for c, w in sorted(why.items())[:3]))
        return answered


class TooFewClients(Exception):
    """Fewer clients than --min-clients answered: the run stops (exit status 1)."""


def fedavg_setup(job, server):
    server["global_model"] = job.build()


def fedpake_setup(job, server):
    """FedAvg's, and the aggregation form, decided once before config.json records it (as fedpake.main does)."""
    fedavg_setup(job, server)
    server["aggregation"] = job.module.aggregation_form(job.args, server["global_model"], job.device)
    if not job.args.resume:  # resumed: the recorded form (a run begun before it was recorded says auto: decided now)
        job.args.aggregation = server["aggregation"]


def fedavg_round(job, server, clients, round_, evaluate, send):
    """FedAvg (and FedPake: its server step) and FedACD: the global model to every client; the
    server step over the clients that answered."""
    m, args, global_state = job.module, job.args, common.flatten_state(server["global_model"])
    replies = send("train", round_, {c: {"global": global_state} for c in clients}, evaluate)
    clients = sorted(replies)
    states = [replies[c][0]["trained"] for c in clients]
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in clients]
    metrics, up = {}, 0
    if job.algorithm == "fedacd":
        scores = [torch.tensor(replies[c][1]["score"], dtype=torch.float64, device=job.device) for c in clients]
        new_global = m.server_update(states, scores, args.uniform_agg)
        up = 8 * len(clients)  # + the score V_m
        if evaluate:  # Table 9
            metrics = {"local_kl": float(torch.tensor([replies[c][1]["kl"] for c in clients],
                                                      dtype=torch.float64).mean()),
                       "score_min": float(min(scores)), "score_max": float(max(scores))}
    elif job.algorithm == "fedpake":
        new_global, metrics = m.server_update(states, [len(job.data.train_idx[c]) for c in clients], args, round_,
                                              server["aggregation"])
    else:
        new_global = m.server_update(states, [len(job.data.train_idx[c]) for c in clients])
    common.load_flat_state(server["global_model"], new_global)
    model_bytes = common.state_bytes(server["global_model"])
    if evaluate:
        metrics = {**common.evaluate_global(server["global_model"], job.data),
                   "train_loss": sum(losses) / len(losses), **metrics}
    return metrics, model_bytes * len(clients), model_bytes * len(clients) + up, len(clients)


def fedala_setup(job, server):
    """The script's state (fedala.main): the global model, every client's local model (the initial
    model at first, Alg. 1 l. 1) and the ALA object with every client's weights W_i^p and
    initial-stage record. The server keeps it all and sends each client its part."""
    m, args = job.module, job.args
    server["global_model"] = job.build()
    try:  # the script's check of --p against the model, before any node trains
        server["ala"] = m.ALA(server["global_model"], args.num_clients, p=args.p, eta=args.eta, s=args.s,
                              batch_size=args.batch_size, threshold=args.threshold, num_pre_loss=args.num_pre_loss,
                              max_init_epochs=args.max_init_epochs)
    except ValueError as e:
        raise common.UserError(f"--p {args.p}: {e}")
    common.check_client_models(server["global_model"], args.num_clients)
    server["local_models"] = common.flatten_state(server["global_model"]).repeat(args.num_clients, 1)


def fedala_round(job, server, clients, round_, evaluate, send):
    global_model, ala, local_models, n = server["global_model"], server["ala"], server["local_models"], job.args.num_clients
    global_state = common.flatten_state(global_model)

    def client_state(c):  # what client c keeps between rounds in the script (round 1: ALA is off, Alg. 1 l. 7)
        local = {"local": local_models[c]} if round_ > 1 and not job.args.no_ala else {}
        return {**local, "ala_weights": ala.weights[c], "initial_stage": torch.tensor(ala.initial_stage[c]),
                "init_losses": torch.tensor(ala.init_losses[c], dtype=torch.float64)}

    replies = send("train", round_, {c: {"global": global_state, **client_state(c)} for c in clients}, evaluate)
    clients = sorted(replies)
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in clients]
    for c in clients:
        sent = replies[c][0]
        local_models[c] = sent["trained"]
        ala.weights[c] = sent["ala_weights"]
        ala.initial_stage[c], ala.init_losses[c] = bool(sent["initial_stage"]), sent["init_losses"].tolist()
    num_samples = [len(job.data.train_idx[c]) for c in clients]
    common.load_flat_state(global_model, common.weighted_average(local_models[clients], num_samples))  # l. 18
    model_bytes = common.state_bytes(global_model)
    traffic = (model_bytes * len(clients), model_bytes * len(clients), len(clients))
    if not evaluate:
        return {}, *traffic
    # joining clients: their ALA-initialised models; the others evaluate their current local models
    results = {c: replies[c][0] for c in clients}
    others = [c for c in range(n) if c not in replies]
    if others:
        results.update({c: r[0] for c, r in send("evaluate", round_, {c: {"local": local_models[c]}
                                                                       for c in others}).items()})
    totals = [torch.cat([results[c][k] for c in sorted(results)]) for k in EVAL_KEYS]
    return ({**common.accuracy_metrics(*totals), "train_loss": sum(losses) / len(losses),
             "ala_epochs": sum(replies[c][1]["ala_epochs"] for c in clients) / len(clients),
             "global_model_acc": job.module.global_model_accuracy(global_model, job.data)}, *traffic)


def pfedla_setup(job, server):
    m, args = job.module, job.args
    model = job.build()  # the initial model of every client
    server["sizes"] = m.layer_sizes(model)
    if args.k > len(server["sizes"]):  # as the script, before any node trains
        raise common.UserError(f"--k {args.k} is more than the model's {len(server['sizes'])} layers")
    server["stored_models"] = common.flatten_state(model).detach().repeat(args.num_clients, 1)  # Alg. 1 l. 1
    server["hypernetworks"] = m.LayerHypernetworks(args.num_clients, len(server["sizes"]), args.embed_dim,
                                                   args.hidden_dim, generator=torch.default_generator).to(job.device)
    server["global_model"] = model


def pfedla_round(job, server, clients, round_, evaluate, send):
    """The hypernetworks and the stored client models stay on the server (Alg. 1); the step of
    Alg. 1 l. 11 (Alg. 2 l. 10) uses the clients that answered."""
    m, args, sizes = job.module, job.args, server["sizes"]
    hypernetworks, stored_models = server["hypernetworks"], server["stored_models"]
    ids = torch.as_tensor(clients, device=job.device)
    alpha = hypernetworks(ids)                                                 # Alg. 1 l. 5
    theta_bar = m.aggregate_layerwise(alpha, stored_models, sizes)             # Alg. 1 l. 5
    is_retained = m.retained_layers(alpha.detach(), ids, args.k)                      # Alg. 2 l. 6
    received = m.with_retained_layers(theta_bar.detach(), stored_models, ids, sizes, is_retained)  # Alg. 2 l. 7, 13
    replies = send("train", round_, {c: {"theta_bar": received[i]} for i, c in enumerate(clients)}, evaluate)
    rows = [i for i, c in enumerate(clients) if c in replies]
    answered = [clients[i] for i in rows]
    losses = [common.check_finite(replies[c][1]["loss"], round_, c) for c in answered]
    m.server_update(hypernetworks, stored_models, ids[rows], theta_bar[rows], received[rows],
                    torch.stack([replies[c][0]["trained"] for c in answered]), args.hn_lr)
    element, num_params = stored_models.element_size(), stored_models.shape[1]
    retained_params = int((is_retained.long() * torch.as_tensor(sizes, device=job.device)).sum())  # counted as not sent
    metrics = {}
    if evaluate:
        metrics = {**m.evaluate_personalised(hypernetworks, stored_models, job.model(), job.data, sizes, args.k),
                   "train_loss": sum(losses) / len(losses)}
    return metrics, (len(clients) * num_params - retained_params) * element, len(answered) * num_params * element, \
        len(answered)


def summary_extra(job, server, run):
    """The script's extra summary entries."""
    if job.algorithm == "fedala":
        return {"ala_weights_per_client": server["ala"].weights.shape[1],
                "initial_stage_epochs": [len(losses) for losses in server["ala"].init_losses]}
    if job.algorithm == "pfedla":
        with torch.no_grad():
            ids = torch.arange(job.args.num_clients, device=job.device)
            self_weight = server["hypernetworks"](ids)[ids, :, ids].mean(0).tolist()
        return {"self_weight_per_layer": [[name, round(w, 4)] for (name, _), w
                                          in zip(common.layers(server["global_model"]), self_weight)]}
    return {}


SERVERS = {"fedavg": (fedavg_setup, fedavg_round), "fedala": (fedala_setup, fedala_round),
           "pfedla": (pfedla_setup, pfedla_round), "fedpake": (fedpake_setup, fedavg_round),
           "fedacd": (fedavg_setup, fedavg_round)}
CHECKPOINTED = {"fedavg": ("global_model",), "fedpake": ("global_model",), "fedacd": ("global_model",),
                "fedala": ("global_model", "local_models", "ala"), "pfedla": ("hypernetworks", "stored_models")}


def saved_flower_run(folder):
    """(algorithm, the run's flags) of a Flower run folder, for ``--resume``."""
    path = os.path.join(folder, "config.json")
    for name in run_folder.RUN_FILES:  # as the scripts: a named pipe or a device is refused, never opened
        run_folder.check_regular(os.path.join(folder, name))
    try:
        with open(path) as f:
            config = json.load(f)
        flower = config["flower"]
        algorithm, flags = flower["algorithm"], [str(f) for f in flower["flags"]]
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise common.UserError(f"cannot resume: {run_folder.quoted(path)} is missing or not the config of a "
                               f"flower/app.py run ({e.__class__.__name__}: {str(e)[:100]!r})") from None
    return algorithm, flags


def serve(grid, algorithm, flags, options, clients=None):
    """One run of ``algorithm`` with the script's ``flags`` (``--resume DIR`` continues DIR),
    its clients on the grid's nodes. Returns the Clients (the node of each client)."""
    job = job_for(algorithm, flags)
    args = job.args
    # nodes need no run folder; they take the thread count the server resolved (a Flower run from before
    # --threads: the count of each node's environment)
    node_flags = saved_flower_run(args.resume)[1] if args.resume else run_folder.with_threads(flags, args.threads)
    if clients is None:
        clients = Clients(grid, args.num_clients)
        clients.wait_for_all(options.wait_for_nodes)
    rng = common.seed_everything(args.seed)  # as the script: then the models, in the script's order
    setup, one_round = SERVERS[algorithm]
    server = {}
    setup(job, server)
    name = "heurpfedla" if algorithm == "pfedla" and args.k > 0 else algorithm
    run = run_folder.Run(name, args, job.data, job.device, headline=job.module.HEADLINE,
                         headline_metric=job.module.HEADLINE_METRIC, script="flower_app", program="flower/app.py",
                         extra_config={"flower": {"algorithm": algorithm, "flags": node_flags}})
    state = {k: server[k] for k in CHECKPOINTED[algorithm]}  # the script's checkpoint: either can resume it
    start = run.resume(state, rng)
    send = Exchange(grid, clients, job, node_flags, os.path.basename(run.dir), options)
    print(f"[{name}] Flower: {args.num_clients} clients on {len(clients.node_of)} nodes", flush=True)
    try:
        for round_ in range(start, args.rounds + 1):
            sampled = common.sample_clients(rng, args.num_clients, args.join_ratio)
            metrics, down, up, answered = one_round(job, server, sampled, round_, run.should_eval(round_), send)
            with recording():
                run.add_bytes(down=down, up=up)
                if metrics:
                    run.log(round_, {**metrics, "clients_answered": answered, "clients_left_out": send.lost})
                    send.lost = 0
                run.checkpoint(round_, state, rng)
            if run.stop_requested(round_):
                print(f"[{name}] stopping after round {round_} (--stop-after); continue with: "
                      f"python flower/app.py --resume {run.dir}", flush=True)
                run.close()
                return clients
        with recording():
            run.finish(summary_extra(job, server, run))
            run.close()
    except BaseException as e:  # as the scripts: a failed or diverged run says so in summary.json
        with _RECORDING:
            if run.rows and not isinstance(e, Interrupted):
                with contextlib.suppress(Exception):
                    run.summary({"error": str(e).splitlines()[0] if str(e) else e.__class__.__name__},
                                status="diverged" if isinstance(e, run_folder.DivergedError) else "failed")
            run.close(failed=True, diverged=isinstance(e, run_folder.DivergedError))
        raise
    return clients


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
        line = f"{what}; {run.kept()}" if run else f"{what} before the run folder was made; nothing was written"
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


def check_options(options, args):
    """flower/app.py's options against the script's parsed flags ``args``."""
    if options.min_clients > args.num_clients:
        raise common.UserError(f"--min-clients {options.min_clients} is more than the run's {args.num_clients} "
                               "clients (--num-clients): no round could go on")


def plan(argv):
    """(algorithm, flower/app.py's options, the script's flags) from ``ALGORITHM [flags]`` or
    ``[ALGORITHM] --resume DIR [flags]`` (the algorithm of DIR's run)."""
    options, rest = flower_options(argv)
    algorithm = rest.pop(0) if rest and rest[0] in ALGORITHMS else None
    folder = resume_folder(rest)
    if folder:
        saved = saved_flower_run(folder)[0]
        if algorithm not in (None, saved):
            raise common.UserError(f"cannot resume: {folder} is a run of {saved}, not {algorithm}")
        algorithm = saved
    if algorithm is None:
        raise common.UserError(f"{'unknown algorithm ' + repr(rest[0]) + '; ' if rest else ''}{USAGE}")
    return algorithm, options, rest


def resume_folder(flags):
    """The value of ``--resume`` (or an abbreviation argparse takes, e.g. ``--res``) in ``flags``."""
    for i, flag in enumerate(flags):
        key, eq, value = flag.partition("=")
        if len(key) >= 5 and "--resume".startswith(key):
            return value if eq else (flags[i + 1] if i + 1 < len(flags) else None)
    return None


def node_worker_args(values):
    """``--node-worker``'s values as flower/node.py passes them (SOCKET KEY_FILE WATCH_PID IDLE_SECONDS);
    anything else, as typed by hand, is one line."""
    what = ("--node-worker is flower/node.py's (it starts a deployed node's worker), not a command to type; "
            "it takes SOCKET KEY_FILE WATCH_PID IDLE_SECONDS")
    if len(values) != 4:
        raise common.UserError(f"{what}, got {len(values)} value(s)")
    socket, key_path, watch_pid, idle_seconds = values
    if not socket.strip() or not os.path.isdir(os.path.dirname(os.path.abspath(socket))):
        raise common.UserError(f"{what}; SOCKET {socket!r} is not a path in an existing folder")
    if not os.path.isfile(key_path):
        raise common.UserError(f"{what}; KEY_FILE {key_path!r} is not a file")
    if not watch_pid.isdigit():
        raise common.UserError(f"{what}; WATCH_PID must be a process id >= 0, got {watch_pid!r}")
    try:
        idle = float(idle_seconds)
    except ValueError:
        idle = float("nan")
    if not (math.isfinite(idle) and idle > 0):
        raise common.UserError(f"{what}; IDLE_SECONDS must be a number > 0, got {idle_seconds!r}")
    return socket, key_path, watch_pid, idle_seconds


def node_worker(socket, key_path, watch_pid, idle_seconds):
    """The worker of a deployed node (flower/node.py starts it): answers the node's messages
    with ``node_work``, keeping the data and the models loaded between them. Leaves when the
    SuperNode process ``watch_pid`` ends (0: none to watch) or after ``idle_seconds`` without one."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Listener
    with open(key_path, "rb") as f:
        listener = Listener(socket, "AF_UNIX", authkey=f.read())
    watch_pid, idle_seconds, last = int(watch_pid), float(idle_seconds), [time.monotonic()]
    watch_start = parent_and_start(watch_pid)[1] if watch_pid else None

    def leave_when_done():
        while True:
            time.sleep(1.0)
            gone = watch_pid and parent_and_start(watch_pid)[1] != watch_start  # ended (or its id reused)
            if gone or time.monotonic() - last[0] > idle_seconds:
                with contextlib.suppress(OSError):
                    os.remove(socket)
                os._exit(0)

    threading.Thread(target=leave_when_done, daemon=True).start()
    while True:
        try:
            connection = listener.accept()
        except (OSError, AuthenticationError):  # a caller without the key
            continue
        with connection:
            try:
                message_type, client, config, received = connection.recv()
            except (EOFError, OSError, ValueError):
                continue
            last[0] = time.monotonic()
            try:
                if message_type == "query":
                    answer = ("ok", {}, {"partition-id": partition_id({"partition-id": client})})
                else:
                    answer = ("ok", *node_work(message_type, partition_id({"partition-id": client}), config, received))
            except Exception as e:  # noqa: BLE001  the server hears of it in one line
                answer = ("error", *error_line(e))
            with contextlib.suppress(OSError):
                connection.send(answer)
            last[0] = time.monotonic()


def build_server_app(jobs=None):
    """A ServerApp running ``jobs`` [argv of flower/app.py] one after another on the same nodes; with
    none, the run config's (deployment: ``flwr run``): ``algorithm``, ``flags`` (flower/app.py's
    options and the script's flags, one string) and ``resume`` (a run folder, on the SuperLink's machine)."""
    app = ServerApp()

    @app.main()
    def main(grid, context):
        config = context.run_config
        resume = str(config.get("resume", "") or "")
        algorithm = "" if resume else str(config.get("algorithm", ""))  # with resume: the run's own
        todo = jobs or [([algorithm] if algorithm else []) + shlex.split(str(config.get("flags", ""))) +
                        (["--resume", resume] if resume else [])]
        clients = None
        for argv in todo:
            algorithm, options, flags = plan(argv)
            try:
                clients = serve(grid, algorithm, flags, options, clients)
            except (common.UserError, TooFewClients, run_folder.DivergedError) as e:
                if jobs:  # a simulation: main() says it in one line
                    raise
                print(f"error: {e}", file=sys.stderr, flush=True)  # deployment: one line in the run's log,
                logging.getLogger("flwr").addFilter(_no_traceback_of_run_failed)  # not Flower's traceback too
                raise RunFailed(str(e)) from None  # the run's status: finished:failed, with the line

    return app


class RunFailed(Exception):
    """A deployed run that failed (its line is already in the log): Flower marks it failed."""


def _no_traceback_of_run_failed(record):
    return not (record.exc_info and isinstance(record.exc_info[1], RunFailed))


server_app = build_server_app()


def _no_run_simulation_notice(record):
    """run_simulation is deprecated in favour of `flwr run` (which needs a federation config and a
    SuperLink): keep its 5-line notice off stderr, where errors are one line."""
    return "run_simulation" not in str(record.args)


def client_resources(device, clients_per_gpu):
    """Each Ray actor's share: one CPU, and 1/K of a GPU when the run is on CUDA (at most K actors,
    each with a CUDA context and a copy of the data, per GPU), else none."""
    return {"num_cpus": 1, "num_gpus": 1.0 / clients_per_gpu if device.type == "cuda" else 0.0}


@contextlib.contextmanager
def gpus_hidden_from_actors(device):
    """On a CPU run, Ray's processes (started in here, with this environment) see no GPU, so that no
    actor builds a CUDA context or puts the data on one. On CUDA Ray gives each actor its share.
    (Ray 2.55 hides the GPUs from actors that ask for none, but warns that it will stop.)"""
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device.type != "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


def simulate(jobs, num_cpus=None):
    """Run ``jobs`` [argv of flower/app.py: ALGORITHM and flags] in one Flower simulation (one Ray
    start-up); all jobs need the same --num-clients (one node per client). Returns nothing; the
    run folders are under each job's --out."""
    from flwr.simulation import run_simulation
    plans = [plan(list(argv)) for argv in jobs]
    parsed = [importlib.import_module(a).parse_args(list(f)) for a, _, f in plans]
    sizes = {args.num_clients for args in parsed}
    if len(sizes) != 1:
        raise common.UserError("the jobs of one simulation need the same --num-clients")
    device = common.resolve_device(parsed[0].device)
    num_cpus = num_cpus or common.host_cores()
    logging.getLogger("flwr").addFilter(_no_run_simulation_notice)  # added once, however many calls
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report over the network
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # Ray's coming behaviour, and no warning
    try:  # log_to_driver False: what the nodes' Ray workers print stays in Ray's logs (a client's failure
        # comes back to the server in its reply, see ``reply``), not Flower's warnings as Ray stops them
        with gpus_hidden_from_actors(device):
            run_simulation(server_app=build_server_app([list(argv) for argv in jobs]), client_app=client_app,
                           num_supernodes=sizes.pop(),
                           backend_config={"client_resources": client_resources(device, plans[0][1].clients_per_gpu),
                                           "init_args": {"num_cpus": num_cpus, "include_dashboard": False,
                                                         "log_to_driver": False}})
    finally:
        stop_ray()


def app_folder(target):
    """Write the Flower App that ``flwr run`` bundles into the folder ``target`` and return it:
    flower/pyproject.toml at its top, the repository's top-level modules (the scripts, common.py,
    datasets.py, data_partition.py, run_folder.py) beside it and flower/*.py in flower/, the
    repository's own layout. (``flwr run`` bundles one folder, with its pyproject.toml at the top;
    the app spans the root and flower/.)"""
    import shutil
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(target, "flower"), exist_ok=True)
    shutil.copyfile(os.path.join(here, "pyproject.toml"), os.path.join(target, "pyproject.toml"))
    for folder, into in ((ROOT, target), (here, os.path.join(target, "flower"))):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                shutil.copyfile(os.path.join(folder, name), os.path.join(into, name))
    return target


def submit(argv):
    """``flwr run`` of this folder on the SuperLink of ``--federation``, its log streamed, then
    the run's status from the SuperLink (``flwr ls``). ``flwr run`` itself exits 0 however the run
    ends; this returns 0 for a finished run, 1 for one that failed or was stopped."""
    import shutil
    import subprocess
    import tempfile
    options, rest = flower_options(argv)
    algorithm = rest.pop(0) if rest and rest[0] in ALGORITHMS else ""
    flags = [f"--min-clients={options.min_clients}", f"--round-timeout={options.round_timeout:g}",
             f"--wait-for-nodes={options.wait_for_nodes:g}", *rest]
    app_dir = app_folder(tempfile.mkdtemp(prefix="fedref-app-"))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:  # TOML strings: any flag text
        f.write(f"algorithm = {json.dumps(algorithm)}\nflags = {json.dumps(shlex.join(flags))}\n")
    flwr = [os.path.join(os.path.dirname(sys.executable), "flwr")]
    try:
        proc = subprocess.Popen([*flwr, "run", app_dir, options.federation, "--stream", "--run-config", f.name],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        run_id = None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            found = run_id is None and re.search(r"\brun (\d+)\b", line, re.IGNORECASE)
            run_id = int(found.group(1)) if found else run_id
        proc.wait()
    finally:
        os.remove(f.name)
        shutil.rmtree(app_dir, ignore_errors=True)
    if run_id is None:
        raise common.UserError(f"flwr run did not start a run on federation {options.federation!r} "
                               f"(exit status {proc.returncode}); see its output above")
    listed = subprocess.run([*flwr, "ls", options.federation, "--run-id", str(run_id), "--format", "json"],
                            capture_output=True, text=True, timeout=120)
    try:
        (run,) = json.loads(listed.stdout)["runs"]
        status, details = run["status"], run.get("status-details", "")
    except (ValueError, KeyError, TypeError):
        status, details = "unknown", f"flwr ls said: {listed.stdout.strip()[:200]}"
    print(f"[flower] run {run_id} on {options.federation}: {status}{f' ({details})' if details else ''}", flush=True)
    return 0 if status == "finished:completed" else 1


HELP = f"""{USAGE}

Every way to run it (docs/flower.md):
  python flower/app.py ALGORITHM [flags]                   a simulation on this machine, with the run folder
                                                           and metrics of the script (ALGORITHM --help: its flags)
  python flower/app.py --resume RUN_DIR [--rounds N]       continue a stopped simulation from its checkpoint
  python flower/app.py ALGORITHM --federation NAME [flags] write the Flower app and submit it to the SuperLink of
                                                           federation NAME (pyproject.toml), then follow the run
  python flower/app.py --federation NAME --resume RUN_DIR  continue a stopped run of that federation
  python flower/app.py --app-folder DIR                    only write the Flower app into DIR, for a plain
                                                           flwr run
  (--node-worker is flower/node.py's own, not a command to type)"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--node-worker"]:  # flower/node.py's worker of a deployed node
        return node_worker(*node_worker_args(argv[1:]))
    if argv[:1] == ["--app-folder"] and len(argv) == 2:  # for a plain flwr run (docs/flower.md)
        print(app_folder(argv[1]))
        return 0
    if argv and argv[0] in ("-h", "--help"):
        own = flower_parser().format_help().split(":", 2)[2].strip("\n")  # its options, without the usage line
        print(f"{HELP}\n\nflower/app.py's own flags, beside the script's:\n{own}")
        return 0
    options, rest = flower_options(argv)
    if options.federation:  # a --resume folder is on the SuperLink's machine, not necessarily here
        if rest and rest[0] in ALGORITHMS and not resume_folder(rest):  # bad flags: one line, before submitting
            check_options(options, importlib.import_module(rest[0]).parse_args(rest[1:]))
        return submit(argv)
    algorithm, options, flags = plan(argv)
    # every check that needs no data, one line and exit 2 before Ray starts (and leaves its session folder): the
    # script's flags and --out, a --resume folder and its --stop-after, flower/app.py's options against them
    check_options(options, importlib.import_module(algorithm).parse_args(flags))
    from flower import app as flower_app  # the apps by module name: Ray's workers import them, not copy __main__
    previous = run_folder.handle_stop_signals(flower_app.on_stop_signal)
    try:
        flower_app.simulate([argv])
    except KeyboardInterrupt:
        flower_app.leave_after_stop()  # one line, exit status 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP)
    except flower_app.TooFewClients as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        run_folder.restore_signals(previous)


if __name__ == "__main__":
    run_folder.run_main(main)
