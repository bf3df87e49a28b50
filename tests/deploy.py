"""A Flower deployment on localhost for tests: one SuperLink, N SuperNodes, ``flwr run``.

    with Deployment(tmp_path, num_nodes=4, secure=True) as d:     # every process started, nodes joined
        code, output = d.run("fedavg", "--dataset synthetic --num-clients 4 --rounds 2 --out runs")
        d.kill_node(3)                                            # SIGKILL to node 3's process group
        d.start_node(3)                                           # node 3 again (partition-id 3)
    # here every process it started is gone, checked; nothing of it listens any more

Everything lives in ``folder`` (the test's tmp_path): FLWR_HOME (``flwr-home/``, with the
federation ``local`` in its config.toml), one log per process (``superlink.log``,
``node-I.log``; a restarted node appends to its log), the run configs, the certificates
(``certificates/``, from flower/make_certs.py, with ``secure=True``). Every process listens on
127.0.0.1 only, on ports free when it starts, and the SuperLink's working directory is
``folder``, so a run's relative ``--out`` lands in it.

Flower 1.41, as this harness uses it (docs/flower.md, Deployment): the SuperLink serves its
Fleet API (SuperNodes), Control API (``flwr run``, ``flwr supernode ...``) and Runtime API
(its own ServerApp process) on one port (``--host``, ``--port``); each SuperNode serves its
Runtime API (its ClientApp processes) on its own ``--port``. ``secure=True``: TLS on the
SuperLink's port with a CA made by flower/make_certs.py, and SuperNode authentication
(``--enable-supernode-auth``): only nodes whose public key was registered with ``flwr
supernode register`` join. The SuperLink never installs app dependencies here
(``--disable-runtime-dependency-installation``: the environment is this one), and no process
asks the network for telemetry or updates.

The API: ``run(algorithm, flags, extra_run_config, timeout)`` -> (exit status, output);
``flwr(*args)`` any flwr command; ``kill_node(i, sig)``, ``start_node(i)``,
``kill_superlink(sig)``, ``start_superlink()``; ``add_node(name, ...)`` one more node
(another key, no CA, ...); ``register(keys)``; ``supernodes()`` the SuperLink's node list;
``pids()`` the deployment's live processes; ``nodes[i]``, ``superlink`` (Proc: ``log()``,
``alive()``, ``popen``), ``node_ids[i]``, ``address``, ``certs``, ``last_run_id``.

Processes: each one started here gets a session (and process group) of its own; its
children stay in it, except the SuperLink's SuperExec, which Flower starts in a session of
its own (with the ServerApp processes in it). The harness finds them all by parent links,
by the groups and sessions it has seen, and by a variable in their environment (MARK).
``close`` (also on an exception) kills them all, waits for them, and raises if any still
runs or any of the deployment's ports still listens (not after a failure in the with-block,
which it leaves to show). All waits are bounded.
"""
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)  # flower-superlink and co. of this Python (also without an activated venv)
FEDERATION = "local"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NODE_ID = re.compile(r"SuperNode ID: (\d+)")
MARK = "FEDREF_TEST_DEPLOYMENT"  # in every process's environment: its deployment's folder
TOOLS = ("flower-superlink", "flower-supernode", "flwr", "flower-superexec", "flwr-serverapp", "flwr-clientapp")


def missing_tools():
    """The Flower commands this harness needs that are not installed next to this Python or on PATH."""
    path = BIN + os.pathsep + os.environ.get("PATH", "")
    return [name for name in TOOLS if shutil.which(name, path=path) is None]


def free_ports(count):
    """``count`` different TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def listening(port):
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def processes():
    """{pid: (state, parent pid, process group, session, start time in clock ticks)} from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
                table[int(entry)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return table


def command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def environment(pid):
    """Process ``pid``'s environment as it started, as a list of b"NAME=value" (empty if unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def clock_ticks_now():
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


class Proc:
    """One process started by the harness, in a session of its own: its output goes to
    ``log_path`` (appended to, after a header line), or with ``err_path`` stdout and stderr go
    to those two files (emptied first, no header: a command whose stdout is read)."""

    def __init__(self, name, argv, log_path, env, cwd, err_path=None):
        self.name, self.argv, self.log_path = name, [str(a) for a in argv], log_path
        with open(log_path, "wb" if err_path else "ab") as log, open(err_path or os.devnull, "wb") as err:
            self.offset = log.tell()  # this start's part of the log begins here
            if not err_path:
                log.write(f"### {time.strftime('%H:%M:%S')} {shlex.join(self.argv)}\n".encode())
                log.flush()
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=err if err_path else subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        self.pid = self.popen.pid
        self.start = processes().get(self.pid, (None,) * 5)[4]

    def log(self):
        """What this start of the process has written (stdout), without colour codes."""
        with open(self.log_path, "rb") as f:
            f.seek(self.offset)
            return ANSI.sub("", f.read().decode(errors="replace"))

    def alive(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """``sig`` to the whole process group (while the leader is not reaped, the id is ours)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def tail(self, lines=25):
        return "\n".join(self.log().rstrip().splitlines()[-lines:])


class DeploymentError(RuntimeError):
    """A process of the deployment failed to start, or did not finish in time; ``output`` holds
    what it wrote."""

    def __init__(self, message, output=""):
        tail = "\n".join(output.rstrip().splitlines()[-40:])
        super().__init__(f"{message}\n--- its output, last lines:\n{tail}" if tail else message)
        self.output = output


class Deployment:
    """SuperLink + ``num_nodes`` SuperNodes on 127.0.0.1 (see the module's docstring).

    ``env``: extra environment for every process; ``superlink_args``, ``node_args``: extra
    flags; ``start_timeout``: seconds for the SuperLink to listen and for each node to join."""

    def __init__(self, folder, num_nodes=4, secure=False, *, env=None, superlink_args=(), node_args=(),
                 start_timeout=90.0):
        self.folder = os.path.abspath(str(folder))
        self.num_nodes, self.secure, self.start_timeout = num_nodes, secure, start_timeout
        self.superlink_args, self.node_args = list(superlink_args), list(node_args)
        self.home = os.path.join(self.folder, "flwr-home")
        self.env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "FLWR_HOME": self.home,
                    MARK: self.folder, "PYTHONUNBUFFERED": "1",
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",  # nothing over the network
                    **(env or {})}
        self.port = None
        self.address = None  # 127.0.0.1:PORT, what SuperNodes and flwr are given
        self.certs = {}  # secure: make_certs.make's {file name: path}
        self.superlink = None
        self.nodes = [None] * num_nodes  # Proc of node i's latest start
        self.node_ids = [None] * num_nodes  # node i's id, from its log (latest start)
        self.extra = []  # nodes started with add_node
        self.last_run_id = None
        self._procs, self._groups, self._ports, self._runs = [], set(), [], 0
        self._t0 = None

    # ------------------------------------------------------------------ start and stop

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close(check=False)
            raise
        return self

    def __exit__(self, kind, value, traceback):
        self.close(check=kind is None)  # after a failure, do not hide it behind a cleanup complaint
        return False

    def start(self):
        """Start the SuperLink, register the nodes' keys (secure), start the nodes, wait until all joined."""
        if missing_tools():
            raise DeploymentError(f"Flower commands not found: {', '.join(missing_tools())}")
        os.makedirs(self.home, exist_ok=True)
        self._t0 = clock_ticks_now() - 1
        self.port = self._free_port()
        self.address = f"127.0.0.1:{self.port}"
        if self.secure:
            if ROOT not in sys.path:
                sys.path.insert(0, ROOT)
            from flower import make_certs
            self.certs = make_certs.make(os.path.join(self.folder, "certificates"), nodes=self.num_nodes)
        self._write_config()
        self.start_superlink()
        if self.secure:
            self.register([self.certs[f"supernode-{i}.pub"] for i in range(self.num_nodes)])
        for i in range(self.num_nodes):
            self.start_node(i, wait=False)
        for i in range(self.num_nodes):
            self.wait_joined(i)
        self._remember()

    def close(self, check=True):
        """Kill every process group of the deployment, wait for them; with ``check``, raise if a
        process of it still runs or a port of it still listens."""
        deadline = time.monotonic() + 20
        left = []
        while time.monotonic() < deadline:
            for proc in self._procs:
                proc.kill()
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
            if not left and all(p.popen.poll() is not None for p in self._procs):
                break
        left = {pid: command_line(pid) for pid in self.pids()}
        ports = [port for port in self._ports if listening(port)]
        if check and (left or ports):
            raise DeploymentError(f"processes left running: {left}; ports still listening: {ports}")

    def start_superlink(self):
        """(Re)start the SuperLink on its port and wait until it listens. Its state is in memory
        unless ``superlink_args`` has ``--database FILE``: a new one knows no node nor run."""
        if self.superlink is not None and self.superlink.alive():
            raise DeploymentError("the SuperLink is still running")
        tls = ["--insecure"]
        if self.secure:
            tls = ["--ssl-ca-certfile", self.certs["ca.crt"], "--ssl-certfile", self.certs["server.pem"],
                   "--ssl-keyfile", self.certs["server.key"], "--enable-supernode-auth"]
        self.superlink = self._spawn("superlink", ["flower-superlink", *tls, "--host", "127.0.0.1", "--port", self.port,
                                                   "--disable-runtime-dependency-installation", *self.superlink_args])
        self._wait(lambda: listening(self.port), self.superlink, "the SuperLink to listen")
        self._remember()

    def kill_superlink(self, sig=signal.SIGKILL, timeout=10.0):
        """``sig`` to the SuperLink's process group and to its SuperExec's (with the ServerApp);
        waits until the SuperLink has exited (bounded)."""
        self._remember()
        table = processes()
        for pid in self.pids(table):  # the SuperExec's own group: the SuperLink's descendants
            if table[pid][2] != self.superlink.pid and self._descends(pid, self.superlink.pid, table):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(table[pid][2], sig)
        self._stop(self.superlink, sig, timeout)

    def _stop(self, proc, sig, timeout):
        proc.kill(sig)
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DeploymentError(f"{proc.name} still runs {timeout:.0f} s after signal {sig}", proc.log()) from None

    @staticmethod
    def _descends(pid, ancestor, table):
        for _ in range(64):
            if pid == ancestor:
                return True
            pid = table.get(pid, (None, None))[1]
            if pid is None:
                return False
        return False

    def _free_port(self):
        """A free port on 127.0.0.1 that this deployment has not handed out yet."""
        for _ in range(100):
            (port,) = free_ports(1)
            if port not in self._ports:
                self._ports.append(port)
                return port
        raise DeploymentError("no free port found")

    def _remember(self):
        """Note the process groups of our processes' descendants (the SuperLink's SuperExec has
        its own), so that close finds them also after their parents died."""
        table = processes()
        for pid in self.pids(table):
            self._groups.add(table[pid][2])

    def pids(self, table=None):
        """The live (not zombie) processes of this deployment: descendants of the processes it
        started, and, started after it, members of the process groups and sessions it has seen
        and processes with its MARK in their environment (found also if they left our groups)."""
        table = processes() if table is None else table
        roots = {p.pid for p in self._procs if table.get(p.pid, (None,) * 5)[4] == p.start}
        groups = self._groups | {p.pid for p in self._procs}
        children = {}
        for pid, (_, parent, _, _, _) in table.items():
            children.setdefault(parent, []).append(pid)
        found, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, []))
        mark = f"{MARK}={self.folder}".encode()
        found |= {pid for pid, (_, _, group, session, start) in table.items()
                  if start >= (self._t0 or 0) and (group in groups or session in groups or mark in environment(pid))}
        return sorted(pid for pid in found if pid in table and table[pid][0] != "Z")

    # ------------------------------------------------------------------ nodes

    def start_node(self, i, wait=True, timeout=None):
        """Start SuperNode i (partition-id i; secure: its registered key); returns its node id
        once it joined (``wait``; bounded by ``timeout``, default start_timeout + 60 s).

        With authentication, Flower 1.41 refuses a key whose node still counts as online ("[code:
        2004] Failed to activate SuperNode", exit status 1): after a SIGKILL, until the SuperLink
        has missed its heartbeats (up to 60 s; a SIGTERM deactivates it at once). As a service
        with Restart=always would, the node is then started again every 2 s until it joins."""
        if self.nodes[i] is not None and self.nodes[i].alive():
            raise DeploymentError(f"node {i} is still running")
        key = self.certs.get(f"supernode-{i}") if self.secure else None
        self.nodes[i], self.node_ids[i] = self._node(f"node-{i}", i, private_key=key), None
        if not wait:
            return None
        deadline = time.monotonic() + (timeout or self.start_timeout + 60)
        while True:
            try:
                return self.wait_joined(i, timeout=max(deadline - time.monotonic(), 0.1))
            except DeploymentError:
                refused = not self.nodes[i].alive() and "[code: 2004]" in self.nodes[i].log()
                if not (self.secure and refused and time.monotonic() < deadline - 2):
                    raise
            time.sleep(2)
            self.nodes[i] = self._node(f"node-{i}", i, private_key=key)

    def add_node(self, name, partition_id=0, private_key=None, root_certificates="ca", insecure=None):
        """Start one more SuperNode ``name`` (log ``name.log``), not waiting for it: a key to
        authenticate with (a path, or None), the CA to trust ("ca": the deployment's; a path;
        None), ``insecure`` (default: not ``secure``). Returns its Proc."""
        proc = self._node(name, partition_id, private_key, root_certificates, insecure)
        self.extra.append(proc)
        return proc

    def _node(self, name, partition_id, private_key=None, root_certificates="ca", insecure=None):
        port = self._free_port()
        insecure = not self.secure if insecure is None else insecure
        tls = ["--insecure"] if insecure else []
        if root_certificates == "ca":
            root_certificates = self.certs.get("ca.crt")
        tls += ["--root-certificates", root_certificates] if root_certificates else []
        tls += ["--auth-supernode-private-key", private_key] if private_key else []
        return self._spawn(name, ["flower-supernode", *tls, "--superlink", self.address, "--host", "127.0.0.1",
                                  "--port", port, "--node-config",
                                  f"partition-id={partition_id} num-partitions={self.num_nodes}", *self.node_args])

    def wait_joined(self, i, timeout=None):
        """Node i's id, once its log says it joined (bounded: ``timeout`` or start_timeout)."""
        proc = self.nodes[i]

        def joined():
            ids = NODE_ID.findall(proc.log())
            return int(ids[-1]) if ids else None

        self._wait(lambda: joined() is not None, proc, f"node {i} to join", timeout)
        self.node_ids[i] = joined()
        return self.node_ids[i]

    def kill_node(self, i, sig=signal.SIGKILL, timeout=10.0):
        """Send ``sig`` to node i's process group (the node, its SuperExec, its ClientApps) and
        wait until its leader has exited (bounded)."""
        self._remember()
        self._stop(self.nodes[i], sig, timeout)

    def register(self, public_keys):
        """``flwr supernode register`` every key (in parallel); returns their node ids."""
        procs = [self._cli_start(["supernode", "register", key, FEDERATION, "--format", "json"], f"register-{n}")
                 for n, key in enumerate(public_keys)]
        ids = []
        for proc in procs:
            code, out = self._cli_finish(proc, 120)
            try:
                ids.append(int(json.loads(out)["node-id"]))
            except (ValueError, KeyError, TypeError):
                raise DeploymentError(f"flwr supernode register failed (exit status {code})", out) from None
        return ids

    def supernodes(self, timeout=60.0):
        """The SuperLink's node list (``flwr supernode ls --format json``): a list of dicts."""
        code, out = self._cli_finish(self._cli_start(["supernode", "ls", FEDERATION, "--format", "json"], "ls"),
                                     timeout)
        try:
            return json.loads(out)["nodes"]
        except (ValueError, KeyError, TypeError):
            raise DeploymentError(f"flwr supernode ls failed (exit status {code})", out) from None

    # ------------------------------------------------------------------ runs

    def run(self, algorithm, flags, extra_run_config=None, timeout=900.0, app=None):
        """``flwr run APP local --stream`` with the run config ``algorithm``, ``flags`` (a string
        or a list) and ``extra_run_config`` {key: str/int/float/bool}; returns (exit status,
        output) once the run has ended. DeploymentError after ``timeout`` seconds. APP: by default
        the app folder that ``python flower/app.py --app-folder DIR`` writes."""
        if app is None:
            if ROOT not in sys.path:
                sys.path.insert(0, ROOT)
            from flower import app as flower_app
            app = flower_app.app_folder(os.path.join(self.folder, "app"))
        flags = flags if isinstance(flags, str) else shlex.join(map(str, flags))
        config = {"algorithm": algorithm, "flags": flags, **(extra_run_config or {})}
        self._runs += 1
        path = os.path.join(self.folder, f"run-config-{self._runs}.toml")  # a file: any string survives
        with open(path, "w") as f:
            f.writelines(f"{key} = {toml_value(value)}\n" for key, value in config.items())
        return self.flwr("run", app, FEDERATION, "--stream", "--run-config", path, timeout=timeout,
                         name=f"run-{self._runs}")

    def flwr(self, *args, timeout=120.0, name="flwr"):
        """Any ``flwr`` command with this deployment's FLWR_HOME; (exit status, stdout and stderr)."""
        code, out = self._cli_finish(self._cli_start(list(args), name, merged=True), timeout)
        if args and args[0] == "run":
            ids = re.findall(r"Successfully started run (\d+)", out)
            self.last_run_id = int(ids[-1]) if ids else None
        return code, out

    def _cli_start(self, args, name, merged=False):
        out = os.path.join(self.folder, f"{name}.out")
        return self._spawn(name, ["flwr", *args], out, None if merged else out[:-4] + ".err")

    def _cli_finish(self, proc, timeout):
        try:
            code = proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.popen.wait(timeout=10)
            raise DeploymentError(f"flwr {' '.join(proc.argv[1:3])} did not finish in {timeout:.0f} s; "
                                  f"SuperLink log:\n{self.superlink.tail()}", proc.log()) from None
        return code, proc.log()

    # ------------------------------------------------------------------ helpers

    def _spawn(self, name, argv, log_path=None, err_path=None):
        argv = [shutil.which(argv[0], path=self.env["PATH"]), *argv[1:]]
        proc = Proc(name, argv, log_path or os.path.join(self.folder, f"{name}.log"), self.env, self.folder, err_path)
        self._procs.append(proc)
        return proc

    def _wait(self, ready, proc, what, timeout=None):
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while not ready():
            if not proc.alive():
                raise DeploymentError(f"{proc.name} exited (status {proc.popen.returncode}) while waiting for {what}",
                                      proc.log())
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out waiting for {what}", proc.log())
            time.sleep(0.2)

    def _write_config(self):
        """$FLWR_HOME/config.toml naming this SuperLink ``local`` (the default)."""
        tls = f'root-certificates = {toml_value(self.certs["ca.crt"])}' if self.secure else "insecure = true"
        with open(os.path.join(self.home, "config.toml"), "w") as f:
            f.write(f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
                    f'address = {toml_value(self.address)}\n{tls}\n')


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string
