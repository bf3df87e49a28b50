"""flower/app.py in Flower's deployment runtime on localhost (tests/deploy.py: a SuperLink, four
SuperNodes, ``flwr run``), secure (TLS, SuperNode authentication; the plain deployment runs in
tests/test_flower_deploy_faults.py, as a user starts it), and flower/make_certs.py.

The deployment tests take about two minutes each here (2 shared cores): every process imports
Flower, and in Flower 1.41 every message to a node starts a ClientApp process."""
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import ROOT, metrics_rows, run_dir, run_script

pytest.importorskip("flwr", reason="Flower is not installed (pip install -r requirements-flower.txt)")
from cryptography import x509  # noqa: E402  (Flower's dependency, as flower/make_certs.py's)
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key  # noqa: E402

from flower import make_certs  # noqa: E402
from deploy import Deployment, listening, missing_tools, processes  # noqa: E402
from test_flower import NOT_COMPARED  # noqa: E402

SMALL = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "2"]
deployment = pytest.mark.skipif(bool(missing_tools()) or not os.path.isdir("/proc"),
                                reason="needs Flower's commands (flower-superlink, ...) and /proc")


def metrics_equal_the_scripts(folder, tmp_path):
    """metrics.csv of the Flower run ``folder`` equals fedavg.py's with the same flags (metric columns)."""
    result = run_script("fedavg.py", *SMALL, "--out", tmp_path / "script", timeout=300)
    assert result.returncode == 0, result.stderr
    expected, got = metrics_rows(run_dir(str(tmp_path / "script"))), metrics_rows(folder)
    assert [r["round"] for r in got] == [r["round"] for r in expected] == ["1", "2"]
    assert set(got[0]) >= set(expected[0])  # flower/app.py may add columns of its own
    for e, g in zip(expected, got):
        for key in set(e) - NOT_COMPARED:
            assert float(g[key]) == pytest.approx(float(e[key]), abs=1e-4), (e["round"], key)
    return got


@pytest.mark.slow
@deployment
def test_secure_deployment_runs_and_lets_in_only_registered_nodes(tmp_path):
    """TLS and SuperNode authentication: the four registered nodes run fedavg; a node with a key
    that was never registered is refused (Flower: HTTP 412, "Failed to activate SuperNode", exit
    status 1, no retry); a registered node that lacks the CA certificate fails its TLS handshake
    (exit status 1, no retry); the same registered key with the CA joins."""
    with Deployment(tmp_path / "deploy", num_nodes=4, secure=True, env={"OMP_NUM_THREADS": "1"}) as d:
        assert "Uvicorn running on https://" in d.superlink.log()
        keys = tmp_path / "keys"
        keys.mkdir()
        for name in ("stranger", "spare"):
            private, public = make_certs.node_key_pair(name)
            make_certs.write(keys / name, private, private=True)
            make_certs.write(keys / f"{name}.pub", public)
        (spare_id,) = d.register([keys / "spare.pub"])
        unlisted = d.add_node("unlisted", 0, private_key=keys / "stranger")
        without_ca = d.add_node("without-ca", 1, private_key=keys / "spare", root_certificates=None)
        code, output = d.run("fedavg", SMALL + ["--out", str(tmp_path / "runs")], timeout=900)
        assert code == 0, output
        assert "Flower: 4 clients on 4 nodes" in output, output
        for proc in (unlisted, without_ca):  # they were refused long ago (seconds after they started)
            proc.popen.wait(timeout=60)
            assert proc.popen.returncode == 1 and "SuperNode ID" not in proc.log(), proc.log()
        assert "[code: 2004] Failed to activate SuperNode" in unlisted.log(), unlisted.log()
        assert "No SuperNode found with the given public key" in d.superlink.log()
        assert "CERTIFICATE_VERIFY_FAILED" in without_ca.log(), without_ca.log()
        assert sorted(int(n["node-id"]) for n in d.supernodes() if n["status"] == "online") == sorted(d.node_ids)
        spare = d.add_node("spare", 1, private_key=keys / "spare")
        deadline = time.monotonic() + 90
        while f"SuperNode ID: {spare_id}" not in spare.log():
            assert spare.alive() and time.monotonic() < deadline, spare.log()
            time.sleep(0.2)
    metrics_equal_the_scripts(run_dir(str(tmp_path / "runs")), tmp_path)


@pytest.mark.slow
@pytest.mark.flower_faults  # the harness under the fault tests: with --flower-faults
@deployment
def test_the_harness_kills_a_node_and_starts_it_again_and_leaves_nothing(tmp_path):
    """kill_node / start_node keep the partition and, with authentication, the node id. A node
    stopped by SIGTERM deactivates itself and rejoins at once; after a SIGKILL the SuperLink
    refuses its key until it has missed the node's heartbeats (Flower 1.41: up to 60 s), then
    lets it in. After the deployment nothing of it runs or listens (Deployment.close checks)."""
    with Deployment(tmp_path / "deploy", num_nodes=2, secure=True) as d:
        ids, port = list(d.node_ids), d.port
        d.kill_node(1, signal.SIGTERM)
        assert d.start_node(1) == ids[1] and "partition-id=1" in d.nodes[1].log()
        killed = time.monotonic()
        d.kill_node(0)
        assert d.nodes[0].popen.returncode == -signal.SIGKILL
        assert d.start_node(0) == ids[0]
        print(f"\nnode 0 rejoined {time.monotonic() - killed:.1f} s after its SIGKILL")
        with open(d.nodes[0].log_path) as f:
            assert "[code: 2004] Failed to activate SuperNode" in f.read()  # refused while it counted as online
        pids = d.pids()
        assert len(pids) >= 6  # SuperLink, its SuperExec, two nodes and their SuperExecs
    table = processes()
    assert [pid for pid in pids if pid in table and table[pid][0] != "Z"] == [] and not listening(port)


# ----------------------------------------------------------------------------- flower/make_certs.py

def test_make_certs_makes_a_ca_a_server_certificate_for_the_hosts_and_node_keys(tmp_path):
    paths = make_certs.make(tmp_path / "certs", hosts=["server.lan", "10.1.2.3", "10.1.2.3"], nodes=2)
    assert sorted(os.path.basename(p) for p in paths.values()) == sorted(os.listdir(tmp_path / "certs")) == \
        ["ca.crt", "ca.key", "server.key", "server.pem", "supernode-0", "supernode-0.pub", "supernode-1",
         "supernode-1.pub"]
    ca = x509.load_pem_x509_certificate(open(paths["ca.crt"], "rb").read())
    server = x509.load_pem_x509_certificate(open(paths["server.pem"], "rb").read())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "server.lan"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1", "10.1.2.3"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for i in range(2):  # what flower-supernode and `flwr supernode register` load
        key = load_ssh_private_key(open(paths[f"supernode-{i}"], "rb").read(), None)
        public = load_ssh_public_key(open(paths[f"supernode-{i}.pub"], "rb").read())
        assert isinstance(key.curve, ec.SECP384R1) and key.public_key() == public
    for name in ("ca.key", "server.key", "supernode-0", "supernode-1"):
        assert stat.S_IMODE(os.stat(paths[name]).st_mode) == 0o600, name


@pytest.mark.parametrize("args,message", [
    ([], "certs/ca.crt exists; use --force to replace the files in certs"),
    (["--force", "--host", "not a host"], "--host 'not a host' is neither an IP address nor a host name"),
    (["--force", "--host", "300.1.2.3"], "--host '300.1.2.3' is neither an IP address nor a host name"),
    (["--force", "--nodes", "-1"], "--nodes must be >= 0 and --days >= 1"),
    (["--force", "--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    (["--force", "--days", "3000000"], "--days 3000000 would end after the year 9999, where certificate dates end"),
    (["--force", "--nodes", "100000000"], "--nodes 100000000 is more than 10000"),
])
def test_make_certs_refuses_bad_input_with_one_line_and_exit_2(tmp_path, args, message):
    make_certs.make(tmp_path / "certs")
    before = {p: open(tmp_path / "certs" / p, "rb").read() for p in os.listdir(tmp_path / "certs")}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "flower", "make_certs.py"), "--out", "certs", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1) and \
        result.stderr.startswith(f"error: {message}"), result.stderr
    assert {p: open(tmp_path / "certs" / p, "rb").read() for p in os.listdir(tmp_path / "certs")} == before


def _files(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


MAKE_CERTS = os.path.join(ROOT, "flower", "make_certs.py")
KILLED_AT_THE_THIRD_FILE = ("import os, runpy, signal, sys\n"  # SIGKILL as the third file is opened for writing
                            "real, opened = os.fdopen, []\n"
                            "def fdopen(*a, **k):\n"
                            "    opened.append(1)\n"
                            "    if len(opened) == 3: os.kill(os.getpid(), signal.SIGKILL)\n"
                            "    return real(*a, **k)\n"
                            "os.fdopen = fdopen\n"
                            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def test_make_certs_on_a_full_disk_is_one_line_exit_1_and_keeps_the_files(tmp_path):
    from test_files_written import ON_A_FULL_DISK
    make_certs.make(tmp_path / "certs", nodes=1)
    before = _files(tmp_path / "certs")
    result = subprocess.run([sys.executable, "-c", ON_A_FULL_DISK, MAKE_CERTS, "--out", "certs", "--nodes", "1",
                             "--force"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (1, "", 1), result.stderr
    assert result.stderr == ("error: cannot write certs/ca.crt (No space left on device); the files in certs are "
                             "as they were\n")
    assert _files(tmp_path / "certs") == before  # nothing half-written, no temporary file left


@pytest.mark.parametrize("new", [False, True], ids=["into certificates there", "a new folder"])
def test_make_certs_killed_mid_write_leaves_the_files_whole_and_the_next_run_clears_up(new, tmp_path):
    """SIGKILL as the third file is written: the files are as they were (a new --out is not made), and the same
    command run again removes what the killed run left and writes every file."""
    if not new:
        make_certs.make(tmp_path / "certs")
    before = _files(tmp_path / "certs") if not new else None
    argv = [MAKE_CERTS, "--out", "certs", "--nodes", "1", *([] if new else ["--force"])]
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_THE_THIRD_FILE, *argv], cwd=tmp_path, capture_output=True,
                            timeout=60)
    assert killed.returncode == -signal.SIGKILL
    if new:
        assert not os.path.exists(tmp_path / "certs")
        assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp-make-certs-")] != []
    else:
        left = {n: b for n, b in _files(tmp_path / "certs").items() if n.startswith(".tmp-make-certs-")}
        assert len(left) == 3 and {n: b for n, b in _files(tmp_path / "certs").items() if n not in left} == before
    again = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(tmp_path)) == ["certs"]
    assert sorted(_files(tmp_path / "certs")) == ["ca.crt", "ca.key", "server.key", "server.pem", "supernode-0",
                                                  "supernode-0.pub"]
    server = x509.load_pem_x509_certificate(open(tmp_path / "certs" / "server.pem", "rb").read())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(open(tmp_path / "certs" / "ca.crt", "rb").read()))
    for name in ("ca.key", "server.key", "supernode-0"):
        assert stat.S_IMODE(os.stat(tmp_path / "certs" / name).st_mode) == 0o600, name


def test_make_certs_that_fails_leaves_nothing_of_its_own(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    result = subprocess.run([sys.executable, MAKE_CERTS, "--out", "file/x/certs"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stderr.count("\n")) == (1, 1) and "file/x/certs was not made" in result.stderr

    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "rename", full)
    with pytest.raises(OSError) as caught:
        make_certs.make(str(tmp_path / "a" / "b" / "certs"))
    assert caught.value.filename == str(tmp_path / "a" / "b" / "certs")
    assert sorted(os.listdir(tmp_path)) == ["file"]  # a/b/ made for it and its temporary folder removed again
