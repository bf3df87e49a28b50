"""tools/data_paths.py: a run's config.json and reproduce.json name its data as DIR/NAME, not one machine's
absolute path; nothing else of the run changes, a second pass changes nothing, and the run still resumes on
its data's new place. The committed runs are so written."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, metrics_rows, run_dir, run_in_process
from test_pfllib_folder import make_folder
from tools import data_paths

TOOL = os.path.join(ROOT, "tools", "data_paths.py")


def tool(*args):
    return subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_a_run_of_today_s_code_is_rewritten_once_and_resumes_on_the_data_s_new_place(tmp_path, monkeypatch):
    data = tmp_path / "one-machine" / "pfllib-data"
    folder, _ = make_folder(data)
    out = tmp_path / "runs"
    flags = ["--dataset", folder, "--data-dir", data, "--model", "cnn", "--rounds", 3, "--stop-after", 2,
             "--checkpoint-every", 2, "--out", out]
    monkeypatch.setattr(sys, "argv", ["fedavg.py", *map(str, flags)])  # config.json's command, as a user ran it
    assert run_in_process("fedavg.py", *flags) == 0
    run = run_dir(out)
    with open(os.path.join(run, "config.json")) as f:
        before = json.load(f)
    seed_dir_launches = {"launches": [{"time": "2026-11-28 07:18:34", "command": [
        sys.executable, "fedavg.py", "--dataset", folder, f"--data-dir={data}", "--out", str(out)]}]}
    with open(out / "reproduce.json", "w") as f:
        json.dump(seed_dir_launches, f, indent=1)
    kept = {name: open(os.path.join(run, name), "rb").read() for name in os.listdir(run) if name != "config.json"}

    done = tool(out)
    assert done.returncode == 0 and done.stdout.count("rewritten: ") == 2, done
    with open(os.path.join(run, "config.json")) as f:
        after = json.load(f)
    assert after["args"]["dataset"] == "DIR/FashionMNIST-tiny" and after["args"]["data_dir"] == "DIR"
    words = after["command"]
    assert words[words.index("--dataset") + 1] == "DIR/FashionMNIST-tiny"
    assert words[words.index("--data-dir") + 1] == "DIR"
    assert str(data) not in open(os.path.join(run, "config.json")).read()
    launch = json.load(open(out / "reproduce.json"))["launches"][0]["command"]
    assert launch[3:5] == ["DIR/FashionMNIST-tiny", "--data-dir=DIR"] and launch[0] == sys.executable
    # nothing else changed: every other key of config.json (the fingerprint too) and every other file
    assert after["command_line"] == shlex.join(["python", *after["command"]])  # the pasteable line follows it
    assert {k: v for k, v in after.items() if k not in ("args", "command", "command_line")} == \
        {k: v for k, v in before.items() if k not in ("args", "command", "command_line")}
    assert {k: v for k, v in after["args"].items() if k not in ("dataset", "data_dir")} == \
        {k: v for k, v in before["args"].items() if k not in ("dataset", "data_dir")}
    assert kept == {name: open(os.path.join(run, name), "rb").read() for name in kept}

    text = open(os.path.join(run, "config.json")).read()
    again = tool(out)
    assert again.returncode == 0 and again.stdout.strip() == "nothing to change"
    assert open(os.path.join(run, "config.json")).read() == text
    assert tool("--check", out).returncode == 0

    moved = tmp_path / "elsewhere"
    shutil.move(str(data), str(moved))
    monkeypatch.setattr(sys, "argv", ["fedavg.py", "--resume", run])
    assert run_in_process("fedavg.py", "--resume", run, "--dataset", moved / "FashionMNIST-tiny") == 0
    assert [r["round"] for r in metrics_rows(run)] == ["1", "2", "3"]


def test_check_names_a_file_with_a_machine_path_and_public_or_relative_paths_stay(tmp_path):
    config = {"args": {"dataset": "fmnist", "data_dir": "/usr/share/datasets/fashion-mnist"},
              "command": ["fedacd.py", "--dataset", "fmnist", "--data-dir", "/usr/share/datasets/fashion-mnist",
                          "--out", "/tmp/t9/fedacd"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=1))
    assert data_paths.renames(config) == {}
    assert tool("--check", path).returncode == 0
    config["args"]["data_dir"] = "/tmp/fm"
    path.write_text(json.dumps(config, indent=1))
    assert data_paths.renames(config) == {"/tmp/fm": "DIR"}
    checked = tool("--check", path)
    assert checked.returncode == 1 and str(path) in checked.stdout and json.loads(path.read_text()) == config
    assert data_paths.renames({"args": {"dataset": "runs/my.npz", "data_dir": "./data"}}) == {}
    assert tool(tmp_path / "missing").returncode == 2


def test_the_committed_runs_name_their_data_as_a_reader_reproduces_them():
    done = tool("--check", os.path.join(ROOT, "results"))
    assert done.returncode == 0, f"apply `python tools/data_paths.py results`:\n{done.stdout}"


def test_reproduce_py_takes_the_committed_runs_as_its_cells_from_any_data_dir(tmp_path):
    """A normalised run is its cell's run (reproduce.py matches a dataset folder by name; --data-dir is no
    setting), wherever the clients lie now: the table continues them rather than refusing them."""
    from tools import paper_tables, reproduce
    args = reproduce.parse_args(["pfllib-fmnist", "--data-dir", str(tmp_path), "--out",
                                 os.path.join(ROOT, "results"), "--dry-run"], paper_tables.TABLES)
    jobs = reproduce.table_jobs("pfllib-fmnist", paper_tables.TABLES["pfllib-fmnist"], args)
    folders = [(job, folder) for job in jobs for folder in reproduce.run_folders(job["dir"])]
    assert len(folders) >= 10
    for job, folder in folders:
        assert reproduce.other_settings(job, folder) == [], folder
        assert json.load(open(os.path.join(folder, "config.json")))["args"]["data_dir"] == "DIR"


# ----------------------------------------------------------------------------- all or nothing

MACHINE = {"args": {"dataset": "/m/pfllib-data/FashionMNIST-dir", "data_dir": "/m/pfllib-data"},
           "command": ["fedavg.py", "--dataset", "/m/pfllib-data/FashionMNIST-dir"]}


def three_runs(tmp_path):
    """runs/a and runs/b name a machine path; runs/c is the one a case damages. Returns (runs, {path: bytes})."""
    runs = tmp_path / "runs"
    for name in "abc":
        os.makedirs(runs / name)
        (runs / name / "config.json").write_text(json.dumps(MACHINE, indent=1) + "\n")
    return runs, {p: open(p, "rb").read() for p in map(str, runs.glob("*/config.json"))}


def files_now(runs):
    """Every file under ``runs`` with its bytes (a named pipe: None, never opened)."""
    paths = [os.path.join(d, n) for d, _, ns in os.walk(runs) for n in ns]
    return {p: open(p, "rb").read() if os.path.isfile(p) else None for p in paths}


DAMAGED = [  # (name, what runs/c/config.json becomes, words of the one line)
    ("not UTF-8", lambda p: p.write_bytes(b'{"args": {"dataset": "/m/\xff"}}'), "is not UTF-8 text"),
    ("absurd nesting", lambda p: p.write_text('{"args": ' + "[" * 100000 + "]" * 100000 + "}"), "nested too deeply"),
    ("launches of a wrong type", lambda p: p.write_text('{"launches": 5}'), "has launches of type int, not a list"),
    ("args of a wrong type", lambda p: p.write_text('{"args": "x"}'), "has args of type str, not an object"),
    ("cut short", lambda p: p.write_text('{"args": {"dataset": "/m/'), "is not JSON"),
    ("a named pipe", lambda p: (os.remove(p), os.mkfifo(p)), "is not a regular file"),
]


@pytest.mark.parametrize("name, damage, words", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_a_damaged_file_is_one_line_and_nothing_is_changed(name, damage, words, tmp_path):
    runs, before = three_runs(tmp_path)
    damage(runs / "c" / "config.json")
    before = {p: b for p, b in files_now(runs).items() if not p.endswith("c/config.json")}
    done = tool(runs)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and str(runs / "c" / "config.json") in done.stderr and words in done.stderr
    assert "nothing was changed" in done.stderr and done.stdout == ""
    assert {p: b for p, b in files_now(runs).items() if not p.endswith("c/config.json")} == before


def test_a_full_disk_is_one_line_exit_1_and_every_file_as_it_was(tmp_path):
    from test_files_written import ON_A_FULL_DISK
    runs, before = three_runs(tmp_path)
    done = subprocess.run([sys.executable, "-c", ON_A_FULL_DISK.replace("'.tmp-'", "'.tmp-data-paths-'"), TOOL,
                           str(runs)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "(No space left on device); every file is as it was" in done.stderr
    assert files_now(runs) == before  # no file changed, no temporary file left


KILLED_ON_FIRST_RENAME = ("import os, runpy, signal, sys\n"
                          "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
                          "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def test_killed_mid_write_changes_no_file_and_the_next_run_removes_what_it_left(tmp_path):
    runs, before = three_runs(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILLED_ON_FIRST_RENAME, TOOL, str(runs)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    left = sorted(p for p in files_now(runs) if os.path.basename(p).startswith(".tmp-data-paths-"))
    assert len(left) == 3 and {p: b for p, b in files_now(runs).items() if p not in left} == before
    again = tool(runs)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(left by a killed earlier run of this program)") == 3
    assert again.stdout.count("rewritten: ") == 3 and sorted(files_now(runs)) == sorted(before)
    assert all(b"DIR/FashionMNIST-dir" in b for b in files_now(runs).values())


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a read-only bind mount needs root")
def test_a_read_only_folder_is_one_line_exit_1_and_every_file_as_it_was(tmp_path):
    runs, before = three_runs(tmp_path)
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{runs / "b"}" "{runs / "b"}" && '
                           f'exec "{sys.executable}" "{TOOL}" "{runs}"'], capture_output=True, text=True, timeout=120)
    if "mount" in done.stderr and "Traceback" not in done.stderr and done.returncode not in (1, 2):
        pytest.skip(f"no private mount here: {done.stderr.strip()}")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot write {runs / 'b' / 'config.json'} (Read-only file system); every file is as it was" in done.stderr
    assert files_now(runs) == before
