"""flower/app.py's ClientApp in a deployment: no start-up cost per round.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message a SuperNode gets, and
that process imports the app. Importing torch and loading and partitioning the data in each
one cost seconds per message. This ClientApp imports neither: it hands the message to a worker
process of its node (``python flower/app.py --node-worker``), started by the first message and
kept, which holds the data and the models and runs ``flower.app.node_work``. The worker
listens on a Unix socket in a folder only this user can open, behind a random key; it leaves
when its SuperNode process ends or after ``IDLE_SECONDS`` without a message. A message whose
worker dies is answered with an Error (the server leaves the client out of that round), and the
next message starts a new worker.
"""
import contextlib
import fcntl
import os
import secrets
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Client

from flwr.app import Array, ArrayRecord, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

NODE_FAULT = 101  # flower.app.NODE_FAULT: the server leaves the client out of the round
IDLE_SECONDS = 3600
START_SECONDS = 300  # for a worker to import torch and load the data before it listens

client_app = ClientApp()


def worker_folder():
    """This user's folder for the workers' sockets and keys (mode 0700, checked)."""
    folder = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), f"fedref-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.stat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to this user with mode 0700")
    return folder


def supernode_pid():
    """The flower-supernode process above this one (SuperNode, SuperExec, flwr-clientapp), or 0."""
    pid = os.getppid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"supernode" in f.read():
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0
    return 0


def connect(node_id):
    """A connection to this node's worker, started first if there is none."""
    folder = worker_folder()
    socket, key_path = os.path.join(folder, f"node-{node_id}.sock"), os.path.join(folder, f"node-{node_id}.key")
    with open(os.path.join(folder, f"node-{node_id}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one message at a time starts the worker
        with contextlib.suppress(OSError, EOFError):
            with open(key_path, "rb") as f:
                return Client(socket, "AF_UNIX", authkey=f.read())
        with contextlib.suppress(FileNotFoundError):
            os.remove(socket)  # a worker that died left it
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        log = open(os.path.join(folder, f"node-{node_id}.log"), "ab")
        worker = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "app.py"),
                                   "--node-worker", socket, key_path, str(supernode_pid()), str(IDLE_SECONDS)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True)
        deadline = time.monotonic() + START_SECONDS
        while not os.path.exists(socket):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the node's worker did not start (exit status {worker.poll()}); see {log.name}")
            time.sleep(0.05)
        with open(key_path, "rb") as f:
            key = f.read()
        for _ in range(100):  # the socket file exists from bind(); connections work from listen()
            try:
                return Client(socket, "AF_UNIX", authkey=key)
            except ConnectionRefusedError:
                time.sleep(0.05)
        return Client(socket, "AF_UNIX", authkey=key)


def forward(msg, context):
    """The reply to ``msg``: the worker's answer, or a one-line Error."""
    try:
        partition_id = context.node_config.get("partition-id")
        if msg.metadata.message_type == "query":
            request = ("query", partition_id, {}, {})
        else:
            request = (msg.metadata.message_type, partition_id, dict(msg.content["job"]),
                       {k: v.numpy() for k, v in msg.content["arrays"].items()})
        with connect(context.node_id) as worker:
            worker.send(request)
            answer = worker.recv()
    except Exception as e:  # noqa: BLE001  the worker died or could not start: the server leaves the client out
        return Message(Error(NODE_FAULT, f"{e.__class__.__name__}: {e} (the node's worker)"), reply_to=msg)
    if answer[0] == "error":
        return Message(Error(answer[1], answer[2]), reply_to=msg)
    _, sent, metrics = answer
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in sent.items()}),
                               "metrics": MetricRecord(metrics)}), reply_to=msg)


client_app.query()(forward)
client_app.train()(forward)
client_app.evaluate()(forward)
