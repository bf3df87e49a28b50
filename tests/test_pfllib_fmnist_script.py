"""tools/pfllib_fmnist.sh end to end, called from a virtual environment whose torch the base interpreter does
not see, on a stand-in PFLlib clone (a git repository with PFLlib's generator layout whose generator imports
torch and writes a tiny folder); and its one-line endings (no clone and no network, a folder that is no
clone, a Python without torch) that leave nothing behind."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "tools", "pfllib_fmnist.sh")
RAW_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]

# the stand-in's generator: PFLlib's layout and command line (generate_FashionMNIST.py noniid - PARTITION,
# run in a folder holding utils/ and FashionMNIST/rawdata/FashionMNIST/raw/), writing one client
GENERATOR = '''import json, os, sys
import numpy as np
import torch
from utils.dataset_utils import save_file
raw = "FashionMNIST/rawdata/FashionMNIST/raw/"
assert sorted(os.listdir(raw)) == sorted(%r)
x = torch.arange(8, dtype=torch.float32).reshape(2, 1, 2, 2).numpy()
save_file(sys.argv[3], {"torch": torch.__file__, "numpy": np.__file__, "argv": sys.argv[1:],
                        "prefix": sys.prefix, "base_prefix": sys.base_prefix}, x)
''' % RAW_FILES
DATASET_UTILS = '''import json, os
import numpy as np
def save_file(partition, seen, x):
    for part in ("train", "test"):
        os.makedirs("FashionMNIST/" + part)
        with open("FashionMNIST/%s/0.npz" % part, "wb") as f:
            np.savez_compressed(f, data={"x": x, "y": np.array([0, 1])})
    with open("FashionMNIST/config.json", "w") as f:
        json.dump({"num_clients": 1, "num_classes": 2, "partition": partition, "seen": seen}, f)
'''


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """(a stand-in PFLlib clone and its commit, a folder of the four raw .gz files, a venv without the system's
    site-packages whose torch lies in a folder only its own .pth names)."""
    base = tmp_path_factory.mktemp("stand-in")
    repo = base / "PFLlib"
    (repo / "dataset" / "utils").mkdir(parents=True)
    (repo / "dataset" / "generate_FashionMNIST.py").write_text(GENERATOR)
    (repo / "dataset" / "utils" / "dataset_utils.py").write_text(DATASET_UTILS)
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "generator", cwd=repo)
    (repo / "dataset" / "generate_FashionMNIST.py").write_text("raise SystemExit('not the commit asked for')\n")
    git("commit", "-q", "-am", "a later commit the script must not read", cwd=repo)
    commit = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.strip()
    raw = base / "raw"
    raw.mkdir()
    for name in RAW_FILES:
        (raw / f"{name}.gz").write_bytes(gzip.compress(name.encode()))
    # the project's packages in a folder the base interpreter does not see: links to this Python's
    # site-packages entries, named only by the project venv's .pth ("torch lives only in the venv")
    packages = base / "project-packages"
    packages.mkdir()
    site = sysconfig.get_paths()["purelib"]
    for entry in os.listdir(site):
        if not entry.endswith(".pth"):
            os.symlink(os.path.join(site, entry), packages / entry)
    venv = base / "project-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    venv_site = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(venv_site, "project.pth"), "w") as f:
        f.write(f"{packages}\n")
    return repo, commit, raw, venv, packages


def run(args, venv, env=None, cwd=None):
    """The script as a user in the activated venv calls it (PATH and VIRTUAL_ENV as `activate` sets them)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "PFLLIB_COMMIT")}
    environ.update({"PATH": f"{venv}/bin:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
                    "PFLLIB_GENERATOR_PACKAGES": "", **(env or {})})
    return subprocess.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True, env=environ,
                          cwd=cwd or ROOT, timeout=300)


@pytest.mark.slow  # two cold starts of torch in the generator: 8-35 s
def test_from_a_venv_the_generator_sees_the_venv_s_torch_and_writes_both_folders(stand_in, tmp_path):
    repo, commit, raw, venv, packages = stand_in
    dest = tmp_path / "data"
    env = {"PFLLIB_COMMIT": commit, "PFLLIB_FMNIST_RAW": str(raw), "TMPDIR": str(tmp_path)}
    done = run([dest, repo], venv, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"wrote {dest}/FashionMNIST-{p}" for p in ("dir", "pat")]
    for p in ("dir", "pat"):
        folder = dest / f"FashionMNIST-{p}"
        assert sorted(os.listdir(folder)) == ["config.json", "test", "train"]
        config = json.loads((folder / "config.json").read_text())
        assert config["partition"] == p and config["seen"]["argv"] == ["noniid", "-", p]
        # torch and numpy came through the project venv's folder, in a venv of its own (no system site-packages)
        assert config["seen"]["torch"] == str(packages / "torch" / "__init__.py")
        assert config["seen"]["numpy"].startswith(str(packages) + os.sep)
        assert config["seen"]["prefix"] != config["seen"]["base_prefix"]
        assert not config["seen"]["prefix"].startswith(str(venv))
        with np.load(folder / "train" / "0.npz", allow_pickle=True) as f:  # our own file, written just now
            assert f["data"].item()["x"].shape == (2, 1, 2, 2)
    assert sorted(os.listdir(tmp_path)) == ["data"]  # its temporary folder (TMPDIR) is gone
    assert sorted(os.listdir(repo)) == [".git", "dataset"] and "not the commit" in (
        repo / "dataset" / "generate_FashionMNIST.py").read_text()  # the clone as it was
    again = run([dest, repo], venv, env=env)
    assert again.returncode == 0 and again.stdout.count("is there already (skipped)") == 2, again


def ends_in_one_line(done, *words):
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_without_a_clone_and_without_the_network_one_line_exit_2_and_nothing_left(stand_in, tmp_path):
    _, _, raw, venv, _ = stand_in
    dest = tmp_path / "new" / "data"
    no_network = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.file://{tmp_path}/nowhere/.insteadOf",
                  "GIT_CONFIG_VALUE_0": "https://github.com/", "PFLLIB_FMNIST_RAW": str(raw), "TMPDIR": str(tmp_path)}
    done = run([dest], venv, env=no_network)
    ends_in_one_line(done, "cloning https://github.com/TsingZ0/PFLlib failed", "give a clone")
    assert os.listdir(tmp_path) == []  # no DEST (nor its parent), no temporary folder


def test_a_folder_that_is_no_clone_at_the_commit_and_a_python_without_torch_end_in_one_line(stand_in, tmp_path):
    repo, commit, raw, venv, _ = stand_in
    dest = tmp_path / "data"
    env = {"PFLLIB_FMNIST_RAW": str(raw), "TMPDIR": str(tmp_path)}
    ends_in_one_line(run([dest, tmp_path], venv, env=env), "no clone of TsingZ0/PFLlib")
    ends_in_one_line(run([dest, repo], venv, env={**env, "PFLLIB_COMMIT": "0" * 40}), "0" * 40)
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    ends_in_one_line(run([dest, repo], bare, env={**env, "PFLLIB_COMMIT": commit}), "cannot import numpy and torch")
    shutil.rmtree(bare)
    ends_in_one_line(run([dest], venv, env={"PFLLIB_FMNIST_RAW": str(tmp_path / "none")}), "dataset-fashion-mnist")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- tools/pfllib_venv.py

VENV_TOOL = os.path.join(ROOT, "tools", "pfllib_venv.py")
KILLED_AT_ITS_SECOND_STEP = ("import os, runpy, signal, subprocess, sys\n"  # SIGKILL once python -m venv is done
                             "real, steps = subprocess.run, []\n"
                             "def run(*a, **k):\n"
                             "    steps.append(1)\n"
                             "    if len(steps) == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
                             "    return real(*a, **k)\n"
                             "subprocess.run = run\n"
                             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def test_a_venv_a_killed_run_left_is_made_anew_by_the_next_and_any_other_is_refused(tmp_path):
    venv = tmp_path / "venv"
    killed = subprocess.run([sys.executable, "-c", KILLED_AT_ITS_SECOND_STEP, VENV_TOOL, str(venv)],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and (venv / ".pfllib-venv-incomplete").exists()
    again = subprocess.run([sys.executable, VENV_TOOL, str(venv)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == f"removing {venv}: a run of this program that was killed left it incomplete"
    assert not (venv / ".pfllib-venv-incomplete").exists()
    seen = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(bool("
                           "u.find_spec('torch')))"], capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == "True"
    whole = sorted(os.listdir(venv))
    refused = subprocess.run([sys.executable, VENV_TOOL, str(venv)], capture_output=True, text=True, timeout=120)
    assert (refused.returncode, refused.stderr) == (2, f"error: {venv} exists: give a new folder\n")
    assert sorted(os.listdir(venv)) == whole and "pyvenv.cfg" in whole  # a whole venv is never removed


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a read-only bind mount needs root")
def test_a_venv_in_a_read_only_folder_names_that_cause_not_a_package(tmp_path):
    (tmp_path / "ro").mkdir()
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{tmp_path / "ro"}" "{tmp_path / "ro"}" '
                           f'&& exec "{sys.executable}" "{VENV_TOOL}" "{tmp_path / "ro" / "venv"}" pkg==1'],
                          capture_output=True, text=True, timeout=120)
    if done.returncode not in (1, 2):
        pytest.skip(f"no private mount here: {done.stderr.strip()}")
    assert done.returncode == 1 and done.stderr == \
        f"error: cannot make {tmp_path / 'ro' / 'venv'} (Read-only file system); nothing was made\n"
    assert os.listdir(tmp_path / "ro") == []


KILLING_MV = '''#!/bin/sh
# mv, then SIGKILL to the script that called it (and its subshells) once a folder is copied in as
# DEST/.FashionMNIST-P.partial
"$REAL_MV" "$@" || exit
case "$(eval echo \\${$#})" in *.partial)
  p=$PPID; callers=""
  while grep -q "tools/pfllib_fmnist.sh" "/proc/$p/cmdline" 2> /dev/null; do callers="$callers $p"; p=$(ps -o ppid= -p "$p" | tr -d " "); done
  kill -9 $callers; exit 0;;
esac
'''


@pytest.mark.slow  # the stand-in generator's cold start of torch, twice: 10-30 s
def test_killed_between_its_renames_the_next_run_makes_the_folder_whole_not_into_what_was_left(stand_in, tmp_path):
    repo, commit, raw, venv, _ = stand_in
    dest, work, bin_ = tmp_path / "data", tmp_path / "work", tmp_path / "bin"
    for folder in (work, bin_):
        folder.mkdir()
    (dest / "FashionMNIST-pat").mkdir(parents=True)  # there already: only FashionMNIST-dir is made
    (dest / "FashionMNIST-pat" / "config.json").write_text("{}")
    (bin_ / "mv").write_text(KILLING_MV)
    os.chmod(bin_ / "mv", 0o755)
    env = {"PFLLIB_COMMIT": commit, "PFLLIB_FMNIST_RAW": str(raw), "TMPDIR": str(work)}
    killed = run([dest, repo], venv, env={**env, "REAL_MV": shutil.which("mv"),
                                          "PATH": f"{bin_}:{venv}/bin:{os.environ['PATH']}"})
    assert killed.returncode == -9 or killed.returncode == 137, (killed.returncode, killed.stderr)
    assert sorted(os.listdir(dest)) == [".FashionMNIST-dir.partial", "FashionMNIST-pat"]  # what a kill leaves
    again = run([dest, repo], venv, env=env)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(dest)) == ["FashionMNIST-dir", "FashionMNIST-pat"]
    assert sorted(os.listdir(dest / "FashionMNIST-dir")) == ["config.json", "test", "train"]  # nothing moved into
    assert again.stdout.splitlines() == [f"{dest}/FashionMNIST-pat is there already (skipped)",
                                         f"removed {dest}/.FashionMNIST-dir.partial (left by a killed run)",
                                         f"wrote {dest}/FashionMNIST-dir"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a small tmpfs needs root")
def test_a_full_disk_while_unpacking_names_that_cause_not_the_dataset_package(stand_in, tmp_path):
    """The raw files are whole, but the temporary folder's disk fills while they are unpacked: the line says so,
    and does not send the user to reinstall dataset-fashion-mnist."""
    repo, commit, _, venv, _ = stand_in
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in RAW_FILES:
        (raw / f"{name}.gz").write_bytes(gzip.compress(bytes(4 * 2 ** 20)))
    small = tmp_path / "small"
    small.mkdir()
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH")}
    environ.update({"PATH": f"{venv}/bin:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv), "PFLLIB_GENERATOR_PACKAGES":
                    "", "PFLLIB_COMMIT": commit, "PFLLIB_FMNIST_RAW": str(raw), "TMPDIR": str(small)})
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs "{small}" && '
                           f'exec bash "{SCRIPT}" "{tmp_path / "data"}" "{repo}"'], capture_output=True, text=True,
                          env=environ, timeout=300)
    if "mount" in done.stderr and "error:" not in done.stderr:
        pytest.skip(f"no private mount here: {done.stderr.strip()}")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "error: cannot unpack" in done.stderr and "No space left on device" in done.stderr
    assert "apt-get" not in done.stderr and not (tmp_path / "data").exists()
