"""Safe resume and one clear line for every bad input: each case ends with exit status 2 and one
line on stderr, runs nothing from a crafted file, leaves no half-made run folder behind and
changes no result already written. Ctrl-C stops at a round boundary with a checkpoint."""
import codecs
import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys

import filelock
import numpy as np
import pytest
import torch

import fedacd
import fedala
import fedavg
import fedpake
import pfedla
import run_folder
from conftest import ROOT, metrics_rows, run_dir, run_in_process, run_script
from tools import fedavg_variants, run_records

SCRIPTS = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "fedpake": fedpake, "fedacd": fedacd}
SMALL = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "2"]
MEASURED = {"seconds", "sec_per_round", "host_mb", "device_mb"}  # time and memory: differ between identical runs


def tree_digest(folder):
    """Every file under ``folder`` (names, bytes and modes), to show that nothing changed."""
    digest = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, folder)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mode)
    return digest


@pytest.fixture(scope="module")
def fedala_run(tmp_path_factory):
    """A finished 2-round FedALA run folder (made once; cases copy it before touching it)."""
    out = tmp_path_factory.mktemp("fedala_run")
    run_folder.run_main(fedala.main, [*SMALL, "--out", str(out)])
    return run_dir(out)


def crafted_checkpoint(folder, marker):
    """A checkpoint.pt whose unpickling would run a shell command that creates ``marker``."""
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"round": 1, "state": Evil()}, os.path.join(folder, "checkpoint.pt"))


def config_without(folder, key):
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    del config["args"][key]
    json.dump(config, open(path, "w"))


def config_with(folder, top=False, **values):
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    (config if top else config["args"]).update(values)
    json.dump(config, open(path, "w"))


def edit_checkpoint(folder, edit):
    path = os.path.join(folder, "checkpoint.pt")
    blob = torch.load(path, weights_only=True)
    edit(blob)
    torch.save(blob, path)


HELD = []  # the locks held_lock takes, released after the case


def held_lock(folder):  # another run (an OS lock on .lock, as Run takes it) holds the folder
    lock = filelock.FileLock(os.path.join(folder, ".lock"), timeout=0)
    lock.acquire()
    HELD.append(lock)


# (case, script, argv with RUN for a copy of the FedALA run and OUT for a fresh --out, prepare(run_copy), expected)
CASES = [
    ("crafted checkpoint", "fedala", ["--resume", "RUN", "--rounds", "3"], "CRAFT", "not a valid checkpoint"),
    ("another script's run", "fedavg", ["--resume", "RUN"], None, "is a run of fedala.py, not fedavg.py"),
    ("another script's run (fedpake)", "fedpake", ["--resume", "RUN"], None, "use python fedala.py --resume"),
    ("changed flags on resume", "fedala", ["--resume", "RUN", "--lr", "0.5", "--dataset", "cifar10", "--rounds", "6"],
     None, "--dataset synthetic (now cifar10); --lr 0.005 (now 0.5)"),
    ("a second process on the folder", "fedala", ["--resume", "RUN", "--rounds", "3"], held_lock,
     "is in use by another run; wait for it to end"),
    ("config.json missing keys", "fedala", ["--resume", "RUN"], lambda d: config_without(d, "lr"),
     "was made by an older version of fedala.py; bring it to today's form with: python tools/run_records.py "
     "--upgrade "),
    ("config.json not json", "fedala", ["--resume", "RUN"],
     lambda d: open(os.path.join(d, "config.json"), "w").write("{"), "cannot resume"),
    ("no checkpoint", "fedala", ["--resume", "RUN"], lambda d: os.remove(os.path.join(d, "checkpoint.pt")),
     "has no checkpoint.pt"),
    ("truncated checkpoint", "fedala", ["--resume", "RUN", "--rounds", "3"],
     lambda d: open(os.path.join(d, "checkpoint.pt"), "r+b").truncate(100), "not a valid checkpoint"),
    ("fewer rounds than done", "fedala", ["--resume", "RUN", "--rounds", "1"], None,
     "cannot resume with --rounds 1: RUN already has 2 rounds"),
    ("no such run", "fedala", ["--resume", "/no/such/run"], None, "cannot resume"),
    ("a finished run resumed as it is", "fedala", ["--resume", "RUN"], None, "has finished its 2 rounds; give --rounds"),
    ("another run's checkpoint", "fedala", ["--resume", "RUN", "--rounds", "3"],
     lambda d: edit_checkpoint(d, lambda blob: blob["args"].update(num_clients=7)), "other settings: num_clients"),
    ("non-finite weights in the checkpoint", "fedala", ["--resume", "RUN", "--rounds", "3"],
     lambda d: edit_checkpoint(d, lambda blob: blob["state"]["global_model"]["fc.weight"].fill_(float("nan"))),
     "non-finite weights"),
    ("a config value of the wrong type", "fedala", ["--resume", "RUN", "--rounds", "3"],
     lambda d: config_with(d, batch_size=2.5),
     "RUN/config.json has batch_size = 2.5, which that flag does not take (the file was edited or damaged)"),
    ("a config naming no script", "fedala", ["--resume", "RUN"],
     lambda d: config_with(d, script=None, algorithm=None, top=True),
     "cannot resume: RUN/config.json is not a run's config.json (no 'script')"),
    ("an empty --resume", "fedala", ["--resume", ""], None, "--resume needs the run folder"),
    ("an empty --out", "fedavg", [*SMALL, "--out", ""], None, "--out must name a folder"),
    ("--device mps", "fedavg", [*SMALL, "--device", "mps", "--out", "OUT"], None, "--device mps is not supported"),
    ("--seed -1", "fedavg", [*SMALL, "--seed", "-1", "--out", "OUT"], None, "--seed"),
    ("--momentum -1", "fedavg", [*SMALL, "--momentum", "-1", "--out", "OUT"], None, "--momentum"),
    ("--weight-decay -1", "fedavg", [*SMALL, "--weight-decay", "-1", "--out", "OUT"], None, "--weight-decay"),
    ("--lr nan", "fedavg", [*SMALL, "--lr", "nan", "--out", "OUT"], None, "--lr must be a finite number"),
    ("--beta inf", "fedavg", [*SMALL, "--beta", "inf", "--out", "OUT"], None, "--partition iid"),
    ("--join-ratio nan", "fedacd", [*SMALL, "--join-ratio", "nan", "--out", "OUT"], None, "--join-ratio"),
    ("--eta inf", "fedala", [*SMALL, "--eta", "inf", "--out", "OUT"], None, "--eta"),
    ("--hn-lr nan", "pfedla", [*SMALL, "--hn-lr", "nan", "--out", "OUT"], None, "--hn-lr"),
    ("--kappa nan", "fedpake", [*SMALL, "--kappa", "nan", "--out", "OUT"], None, "--kappa"),
    ("--lam -1", "fedacd", [*SMALL, "--lam", "-1", "--out", "OUT"], None, "--lam"),
    ("--rounds 0", "fedavg", [*SMALL, "--rounds", "0", "--out", "OUT"], None, "--rounds"),
    ("too many synthetic clients", "fedavg", [*SMALL, "--num-clients", "1000000000", "--out", "OUT"], None,
     "too many"),
    ("--out is a file", "fedavg", [*SMALL, "--out", "FILE"], None, "--out"),
    ("--out below a file", "fedavg", [*SMALL, "--out", "FILE/sub"], None, "--out"),
    ("--p above the layers (after set-up)", "fedala", [*SMALL, "--p", "9", "--out", "OUT"], None, "--p 9"),
    ("--k above the layers (after set-up)", "pfedla", [*SMALL, "--k", "9", "--out", "OUT"], None, "--k 9"),
    # sizes (issue 28): refused before anything is allocated, with the estimate
    ("--hidden-dim 100000: hypernetworks beyond the memory", "pfedla",
     [*SMALL, "--hidden-dim", "100000", "--out", "OUT"],
     None, "--hidden-dim 100000: 8004440"),
    # files (issue 28): quoted odd names, flags that do not apply
    ("a newline in the --dataset file name", "fedavg", [*SMALL, "--dataset", "FILE\n.npz", "--out", "OUT"], None,
     "file\\n.npz'"),
    ("--partition with synthetic data", "fedavg", [*SMALL, "--partition", "pat", "--out", "OUT"], None,
     "--partition does not apply to synthetic data"),
]


@pytest.mark.parametrize("case,script,argv,prepare,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case, script, argv, prepare, expected, fedala_run,
                                                          tmp_path, capsys):
    run = str(tmp_path / "run")
    shutil.copytree(fedala_run, run)
    marker = tmp_path / "executed"
    if prepare == "CRAFT":
        crafted_checkpoint(run, marker)
    elif prepare:
        prepare(run)
    (tmp_path / "file").write_text("not a folder")
    before = tree_digest(run)
    argv = [run if a == "RUN" else str(tmp_path / "out") if a == "OUT" else
            a.replace("FILE", str(tmp_path / "file")) for a in argv]
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as stop:  # in-process: the same path as the command line, minus start-up
            run_folder.run_main(SCRIPTS[script].main, argv)
    finally:
        while HELD:
            HELD.pop().release()
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and expected.replace("RUN", run) in lines[0], lines
    assert not marker.exists()  # nothing in the crafted file ran
    if os.path.isdir(run):
        assert tree_digest(run) == before or prepare is held_lock and \
            {k: v for k, v in tree_digest(run).items() if k != ".lock"} == \
            {k: v for k, v in before.items() if k != ".lock"}
    assert not os.path.exists(tmp_path / "out") or os.listdir(tmp_path / "out") == []  # no half-made run folder


def test_crafted_checkpoint_runs_nothing_from_the_shell(fedala_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(fedala_run, run)
    crafted_checkpoint(run, tmp_path / "executed")
    r = run_script("fedala.py", "--resume", run)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "executed").exists()


def test_a_stale_lock_is_taken_over_and_every_lock_is_released(fedala_run, tmp_path, capsys):
    run = str(tmp_path / "run")
    shutil.copytree(fedala_run, run)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(os.path.join(run, ".lock"), "w") as f:
        f.write(f"{dead.pid} {socket.gethostname()}\n")
    run_folder.run_main(fedala.main, ["--resume", run, "--rounds", "3"])  # extends the run by one round
    assert [r["round"] for r in metrics_rows(run)] == ["1", "2", "3"]
    assert not os.path.exists(os.path.join(run, ".lock"))
    assert json.load(open(os.path.join(run, "config.json")))["args"]["rounds"] == 3


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_result_files_follow_the_umask(tmp_path):
    r = run_script("fedavg.py", *SMALL, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    folder = run_dir(tmp_path)
    for name in ("metrics.csv", "config.json", "summary.json", "partition.json", "checkpoint.pt"):
        assert os.stat(os.path.join(folder, name)).st_mode & 0o777 == 0o644, name  # the default umask 022


def test_config_records_the_algorithm_and_every_argument(tmp_path):
    run_folder.run_main(pfedla.main, [*SMALL, "--k", "1", "--out", str(tmp_path)])
    config = json.load(open(os.path.join(run_dir(tmp_path), "config.json")))
    assert config["algorithm"] == "heurpfedla" and config["script"] == "pfedla"
    assert set(vars(pfedla.parse_args([]))) <= set(config["args"]) and config["args"]["k"] == 1


@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_ctrl_c_stops_at_the_round_boundary_and_resume_ends_with_the_uninterrupted_result(tmp_path):
    flags = ["--dataset", "synthetic", "--num-clients", "5", "--rounds", "20", "--checkpoint-every", "100"]
    assert run_in_process("fedavg.py", *flags, "--out", tmp_path / "full") == 0
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "fedavg.py"), *flags, "--out", str(tmp_path / "cut")],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stdout:  # interrupt once the second round has been logged
        if "round 2/20" in line:
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    (stop_line,) = [line for line in err.splitlines() if line.startswith("interrupted after round")]
    cut = run_dir(tmp_path / "cut")
    done = int(stop_line.split()[3].rstrip(";"))
    assert stop_line == f"interrupted after round {done}; the checkpoint of round {done} is kept; continue with: " \
                        f"python fedavg.py --resume {cut}"
    assert 2 <= done < 20 and len(metrics_rows(cut)) == done and not os.path.exists(os.path.join(cut, ".lock"))
    r = run_script("fedavg.py", "--resume", cut)
    assert r.returncode == 0 and f"after round {done}" in r.stdout, r.stderr
    columns = ("round", "test_acc", "test_acc_mean", "test_loss", "train_loss", "mb_down")
    assert [[row[c] for c in columns] for row in metrics_rows(cut)] == \
        [[row[c] for c in columns] for row in metrics_rows(run_dir(tmp_path / "full"))]



@pytest.mark.slow  # a real run end to end (signals, resume or the quick start): runs in CI
def test_kill_9_then_resume_is_byte_identical(tmp_path):
    flags = ["--dataset", "synthetic", "--num-clients", "5", "--rounds", "12", "--checkpoint-every", "3",
             "--join-ratio", "0.6"]
    assert run_in_process("fedala.py", *flags, "--out", tmp_path / "full") == 0
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "fedala.py"), *flags, "--out", str(tmp_path / "cut")],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stdout:
        if "round 5/12" in line:
            process.kill()
            break
    process.wait()
    cut = run_dir(tmp_path / "cut")
    assert os.path.exists(os.path.join(cut, ".lock"))  # left behind by the killed process: stale
    r = run_script("fedala.py", "--resume", cut)
    assert r.returncode == 0, r.stderr
    strip = lambda rows: [{k: v for k, v in row.items() if k not in MEASURED} for row in rows]  # noqa: E731
    assert strip(metrics_rows(cut)) == strip(metrics_rows(run_dir(tmp_path / "full")))


def test_an_old_checkpoint_with_the_rng_of_two_gpus_resumes_on_a_cpu_without_calling_cuda(tmp_path, monkeypatch,
                                                                                          capsys):
    # As on a machine with one GPU, run with --device cpu: CUDA is there, and a CPU run must not touch
    # it (get_rng_state_all would initialise it; two saved states do not fit one GPU)
    def refused(name):  # one function per name: torch._dynamo, imported by the first optimizer, maps each to a rule
        def call(*args, **kwargs):
            raise AssertionError(f"a CPU run called torch.cuda.{name}")
        return call
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("init", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "synchronize",
                 "memory_allocated", "max_memory_allocated", "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, refused(name))
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--join-ratio", "0.5", "--rounds", "4",
             "--checkpoint-every", "2", "--device", "cpu"]
    assert run_in_process("fedala.py", *flags, "--out", tmp_path / "full") == 0
    assert run_in_process("fedala.py", *flags, "--out", tmp_path / "cut", "--stop-after", "3") == 0
    cut = run_dir(tmp_path / "cut")
    assert "cuda_rng" not in torch.load(os.path.join(cut, "checkpoint.pt"), weights_only=True)

    def as_written_before_the_deterministic_flag(blob):  # which also saved every GPU's RNG state
        del blob["args"]["deterministic"]
        blob["cuda_rng"] = [torch.get_rng_state(), torch.get_rng_state()]
    edit_checkpoint(cut, as_written_before_the_deterministic_flag)
    config_without(cut, "deterministic")
    before = tree_digest(cut)  # an older form: the script refuses it in one line naming the tool that upgrades it
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedala.main, ["--resume", cut])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and lines == [
        f"error: cannot resume: {cut} was made by an older version of fedala.py; bring it to today's form with: "
        f"python tools/run_records.py --upgrade {cut}"], lines
    assert tree_digest(cut) == before
    assert run_records.main(["--upgrade", cut]) == 0
    assert run_in_process("fedala.py", "--resume", cut) == 0
    strip = lambda rows: [{k: v for k, v in row.items() if k not in MEASURED} for row in rows]  # noqa: E731
    assert strip(metrics_rows(cut)) == strip(metrics_rows(run_dir(tmp_path / "full")))


# ----------------------------------------------------------------------------- bad data: checked when loaded

def npz(**arrays):
    def write(path):
        np.savez(path, **arrays)
    return write


def rng_x(*shape):
    return np.random.default_rng(0).normal(size=shape).astype(np.float32)


def with_nan(x, count=1, value=np.nan):
    x = x.copy()
    x.flat[:count] = value
    return x


def truncated_npz(path):
    np.savez(path, x=rng_x(40, 8), y=np.arange(40) % 4)
    with open(path, "r+b") as f:
        f.truncate(200)


def truncated_cifar(data_dir):
    folder = os.path.join(data_dir, "cifar-10-batches-py")
    os.makedirs(folder)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(pickle.dumps({"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1, 2, 3]})[:50])


def cifar_with_batch(data_dir, blob):
    """A whole CIFAR-10 folder (test_foundation.write_cifar) whose data_batch_1 holds ``blob``; its path."""
    from test_foundation import write_cifar
    write_cifar(str(data_dir), 10)
    path = os.path.join(data_dir, "cifar-10-batches-py", "data_batch_1")
    with open(path, "wb") as f:
        f.write(blob)
    return path


class PersistentArrays(pickle.Pickler):
    """Pickles each array as a persistent id, which a loader resolves as it likes (torch's checkpoints do)."""

    def persistent_id(self, obj):
        return "array" if isinstance(obj, np.ndarray) else None


def persistent_pickle(entry):
    f = io.BytesIO()
    PersistentArrays(f, protocol=2).dump(entry)
    return f.getvalue()


def cifar_batch(blob):
    """A --data-dir maker: a CIFAR-10 folder whose data_batch_1 holds ``blob(images, labels)``."""
    return lambda data_dir: cifar_with_batch(data_dir, blob(np.zeros((12, 3072), np.uint8), list(range(10)) + [0, 1]))


CIFAR_REFUSED = "cifar-10-batches-py/data_batch_1 is refused: "


def truncated_mnist(data_dir):
    raw = os.path.join(data_dir, "MNIST", "raw")
    os.makedirs(raw)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        with open(os.path.join(raw, stem), "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + (60000).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\0" * 100)


def npz_declaring(shape):
    """An .npz whose x.npy header declares ``shape`` (float32) but holds no data; y is real."""
    def write(path):
        import io
        import zipfile
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
        y = io.BytesIO()
        np.save(y, np.arange(40) % 4)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x.npy", header.getvalue())
            z.writestr("y.npy", y.getvalue())
    return write



class Rot13:
    """Pickled as ``_codecs.encode("abc", "rot13")``: the global Python 3's protocol 2 uses for bytes, other text."""

    def __init__(self, text):
        self.text = text

    def __reduce__(self):
        return codecs.encode, (self.text, "rot13")


Y40 = np.arange(40) % 4
DATA_CASES = [  # (case, file maker for --dataset FILE (.npz) or --data-dir DIR, dataset name, flags, expected)
    ("one NaN in x", npz(x=with_nan(rng_x(40, 8)), y=Y40), "FILE", [], "x has 1 non-finite value"),
    ("inf in x_test", npz(x=rng_x(40, 8), y=Y40, x_test=with_nan(rng_x(8, 8), 3, np.inf), y_test=Y40[:8]), "FILE", [],
     "x_test has 3 non-finite value"),
    ("empty x", npz(x=rng_x(0, 8), y=Y40[:0]), "FILE", [], "no training samples"),
    ("empty npz", npz(), "FILE", [], "no array 'x'"),
    ("empty file", lambda p: open(p, "wb").close(), "FILE", [], "cannot read"),
    ("truncated npz", truncated_npz, "FILE", [], "cannot read"),
    ("label 10^9", npz(x=rng_x(40, 8), y=np.where(Y40 == 3, 10 ** 9, Y40)), "FILE", [], "labels must be 0..C-1"),
    ("negative label", npz(x=rng_x(40, 8), y=Y40 - 1), "FILE", [], "labels must be 0..C-1"),
    ("float labels", npz(x=rng_x(40, 8), y=Y40 + 0.5), "FILE", [], "must be integers"),
    ("1-D x with --model mlp", npz(x=rng_x(40), y=Y40), "FILE", ["--model", "mlp"], "(N, features)"),
    ("5-D x", npz(x=rng_x(40, 1, 2, 4, 4), y=Y40), "FILE", [], "(N, features)"),
    ("x and y lengths differ", npz(x=rng_x(40, 8), y=Y40[:30]), "FILE", [], "(N, features)"),
    ("x_test without y_test", npz(x=rng_x(40, 8), y=Y40, x_test=rng_x(8, 8)), "FILE", [], "both x_test and y_test"),
    ("vectors with --model cnn", npz(x=rng_x(40, 8), y=Y40), "FILE", ["--model", "cnn"], "use --model mlp"),
    ("truncated MNIST idx", truncated_mnist, "mnist", [], "corrupt or truncated"),
    ("truncated CIFAR pickle", truncated_cifar, "cifar10", [], "corrupt or truncated"),
    ("a CIFAR batch with a persistent id", cifar_batch(lambda x, y: persistent_pickle({"data": x, "labels": y})),
     "cifar10", [], CIFAR_REFUSED + "it holds a persistent id, which a CIFAR file never holds"),
    ("a CIFAR batch with an object array", cifar_batch(lambda x, y: pickle.dumps({"data": x.astype(object),
                                                                                   "labels": y})),
     "cifar10", [], CIFAR_REFUSED + "the dtype 'O8'; only bool, integer, float are read"),
    ("a CIFAR batch in a 0-d object array (PFLlib's form)", cifar_batch(lambda x, y: pickle.dumps(np.array(
        {"data": x, "labels": y}))), "cifar10", [], CIFAR_REFUSED + "the dtype 'O8'; only bool, integer, float"),
    ("a CIFAR batch whose text is encoded otherwise", cifar_batch(lambda x, y: pickle.dumps(
        {"data": x, "labels": y, "batch_label": Rot13("abc")}, protocol=2)),
     "cifar10", [], CIFAR_REFUSED + "an encoding of text other than Python 3's pickle of bytes"),
    ("a CIFAR batch of a million opcodes", cifar_batch(lambda x, y: pickle.dumps(
        {"data": x, "labels": y, "filenames": [b"x"] * 10 ** 6}, protocol=2)), "cifar10", [], CIFAR_REFUSED
     + "its pickle holds more than 1000000 opcodes; CIFAR's largest file takes about 200,000 (nothing of it was run)"),
    ("no dataset files offline", lambda d: None, "cifar100", [], "cifar-100-python.tar.gz from https://"),
    ("labels as a scalar", npz(x=rng_x(40, 8), y=np.int64(3)), "FILE", [], "(N, features)"),
    ("samples of no features", npz(x=rng_x(40, 0), y=Y40), "FILE", [], "(N, features)"),
    ("a single class", npz(x=rng_x(40, 8), y=np.zeros(40, int)), "FILE", [], "at least 2 classes"),
    ("features of 1e30", npz(x=rng_x(40, 8) * 1e30, y=Y40), "FILE", [], "scale the features"),
    ("a folder named .npz", lambda p: os.makedirs(p), "FILE", [], "is a folder, not an .npz file"),
    # data that loads but that the model does not take: it runs once on one sample while it is built
    ("images 32x8 (not square)", npz(x=rng_x(40, 1, 32, 8), y=Y40), "FILE", ["--partition", "iid"],
     "--model cnn does not take samples of shape (1, 32, 8), float32 (it needs images of at least 16x16); "
     "models that do: resnet18, resnet34, mlp"),
    ("images 16x64 (not square)", npz(x=rng_x(40, 1, 16, 64), y=Y40), "FILE", ["--partition", "iid"],
     "--model cnn does not take samples of shape (1, 16, 64), float32"),
    ("negative token ids with --model fasttext", npz(x=np.arange(-40, 360).reshape(40, 10), y=Y40), "FILE",
     ["--partition", "iid", "--model", "fasttext"], "token ids for --model fasttext must be >= 0 (0 pads), but x has "
     "ids down to -40"),
    ("uint8 x with float x_test", npz(x=np.zeros((40, 1, 28, 28), np.uint8), y=Y40, x_test=rng_x(8, 1, 28, 28),
                                      y_test=Y40[:8]), "FILE", [], "x is uint8 but x_test is float32"),
    ("a test label no training sample has", npz(x=rng_x(40, 8), y=Y40, x_test=rng_x(9, 8), y_test=np.arange(9)),
     "FILE", [], "y_test has label(s) 4, 5, 6, 7, 8 that no training sample has"),
    ("clients with no test sample", npz(x=rng_x(40, 8), y=Y40), "FILE", ["--partition", "iid", "--num-clients", "40"],
     "client(s) 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 30 more got no test samples"),
    ("a training label missing from y_test under --test-split global",
     npz(x=rng_x(40, 8), y=Y40, x_test=rng_x(8, 8), y_test=Y40[:8] % 3), "FILE", ["--test-split", "global"],
     "--test-split global needs test samples of every label; y_test has none of label(s) 3"),
    ("complex x", npz(x=rng_x(40, 8).astype(np.complex128), y=Y40), "FILE", [],
     "x is complex128; samples must be real numbers"),
    ("an array of Python objects", npz(x=np.array([[1.0] * 8] * 40, dtype=object), y=Y40), "FILE", [],
     "'x' is an array of Python objects"),
    ("--data-dir names a file", lambda d: (os.rmdir(d), open(d, "w").close()), "cifar10", [],
     "is a file; it must name the folder"),
    ("--dataset a named pipe", lambda p: os.mkfifo(p), "FILE", [], "--dataset: " + "{tmp}/d.npz is not a regular "
     "file; move it away"),
    ("an .npz declaring 8 TB", npz_declaring((2 ** 41, 1)), "FILE", [], "d.npz: its arrays would take about 8.0 TB, "
     "more than the"),
]


@pytest.mark.parametrize("case,make,dataset,flags,expected", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_one_line_exit_2_before_any_run_folder(case, make, dataset, flags, expected, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    data_dir = tmp_path / "data"
    os.makedirs(data_dir)
    path = str(tmp_path / "d.npz")
    make(path if dataset == "FILE" else str(data_dir))
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--dataset", path if dataset == "FILE" else dataset, "--data-dir", str(data_dir),
                                      "--num-clients", "2", "--rounds", "1", *flags, "--out", str(tmp_path / "runs")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and expected.format(tmp=tmp_path) in lines[0], lines
    assert not os.path.exists(tmp_path / "runs")


def cifar_payloads(marker):
    """{name: (batch, the global it asks for)} of CIFAR batches whose unpickling creates ``marker``: the whole pickle a
    call, a call as the batch's data, and Python 2's (the publisher's format) __builtin__.eval."""
    import builtins

    from test_pfllib_folder import Reduce
    code = f"open({str(marker)!r}, 'w').close()".encode()
    return {"os.system": (pickle.dumps(Reduce(os.system, f"touch {marker}")), "posix.system"),
            "builtins.eval as the data": (pickle.dumps({"data": Reduce(builtins.eval, code.decode()), "labels": [0]}),
                                          "builtins.eval"),
            "Python 2's __builtin__.eval": (b"\x80\x02c__builtin__\neval\nq\x01T" + len(code).to_bytes(4, "little")
                                            + code + b"\x85R.", "__builtin__.eval")}


@pytest.mark.parametrize("case", ["os.system", "builtins.eval as the data", "Python 2's __builtin__.eval"])
def test_a_crafted_cifar_batch_runs_nothing_and_is_one_line_naming_it(case, tmp_path, capsys):
    marker = tmp_path / "ran"
    blob, asked = cifar_payloads(marker)[case]
    path = cifar_with_batch(tmp_path / "data", blob)
    capsys.readouterr()
    assert run_in_process("fedavg.py", "--dataset", "cifar10", "--data-dir", tmp_path / "data", "--out",
                          tmp_path / "runs", "--device", "cpu") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {path} is refused: it asks for {asked}, which a CIFAR file never holds (it holds a numpy " \
        "array, lists and strings in a dict); nothing of it was run", line
    assert not marker.exists() and not (tmp_path / "runs").exists()
    pickle.loads(blob, encoding="latin1")  # the payload is live: torchvision's pickle.load runs it
    assert marker.exists()


def test_the_script_ends_on_a_crafted_cifar_batch_with_exit_2_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = cifar_with_batch(tmp_path / "data", cifar_payloads(marker)["os.system"][0])
    result = run_script("fedavg.py", "--dataset", "cifar10", "--data-dir", tmp_path / "data", "--out",
                        tmp_path / "runs", "--device", "cpu")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{path} is refused: it asks for posix.system" in result.stderr
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_a_pickle_changes_no_stand_in_that_another_file_is_read_by():
    """A BUILD on a global the unpicklers know sets attributes of what they returned for it: a new function for each
    name a pickle asks for, so that no file changes how a later one (another batch, another client) is read."""
    import data_formats
    state = {"__defaults__": (True, False), "__kwdefaults__": {"cifar": True}}
    change = b"cnumpy\ndtype\n" + pickle.dumps((None, state), protocol=3)[2:-1] + b"b0"  # BUILD with it, POP
    batch = pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, protocol=3)
    blob = b"\x80\x03" + change + batch[2:]
    for unpickler in (data_formats._PfllibUnpickler, data_formats._CifarUnpickler):
        assert unpickler(io.BytesIO(blob), encoding="latin1").load()["data"].value.shape == (2, 3072)
        assert data_formats._dtype.__defaults__ == (False, True) and data_formats._dtype.__kwdefaults__ == {
            "cifar": False}


@pytest.mark.parametrize("script, flags, words", [
    ("fedala", [], "4 client models of "),
    ("fedavg_variants", ["--local-training"], "4 client models of "),
    ("pfedla", [], "the hypernetworks (4 x --embed-dim 100, --hidden-dim 100: "),
])
def test_client_models_beyond_the_memory_are_refused_before_allocating(script, flags, words, tmp_path, capsys,
                                                                       monkeypatch):
    """Every client's own model kept by the server (and pFedLA's hypernetworks), estimated before the
    copies are made: here against a machine with 1 KB free."""
    import data_formats
    monkeypatch.setattr(data_formats, "memory_available", lambda device="cpu": 1024)
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main({**SCRIPTS, "fedavg_variants": fedavg_variants}[script].main,
                            [*SMALL, *flags, "--out", str(tmp_path / "runs")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and words in lines[0] and \
        "more than the 1.0 KB free in this machine's memory" in lines[0], lines
    assert not os.path.exists(tmp_path / "runs")
