"""tools/pfllib_venv.py: each exit status its docstring names, one test each, with the folders above VENV that do
not exist yet made (as `python -m venv` makes them) and, when a later step fails, removed again with VENV. A step
is made to fail by a stand-in for subprocess.run at that step (1: python -m venv, 2: its site folder, 3: whether
it sees torch), so no package registry is needed. (A VENV a killed run left, and a read-only folder:
tests/test_pfllib_fmnist_script.py.)"""
import os
import subprocess
import sys

from conftest import ROOT

TOOL = os.path.join(ROOT, "tools", "pfllib_venv.py")
# run the tool as __main__ with its subprocess.run replaced at step AT_STEP by DO (a statement, in run(*a, **k))
AT_A_STEP = ("import os, runpy, subprocess, sys\n"
             "real, steps = subprocess.run, []\n"
             "def run(*a, **k):\n"
             "    steps.append(1)\n"
             "    if len(steps) == int(os.environ['AT_STEP']):\n"
             "        exec(os.environ['DO'])\n"
             "        return subprocess.CompletedProcess(a[0], int(os.environ.get('CODE', '1')), os.environ.get("
             "'OUT', ''), 'the step failed')\n"
             "    return real(*a, **k)\n"
             "subprocess.run = run\n"
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def venv_tool(*argv, at_step=None, do="pass", **env):
    command = [sys.executable, TOOL, *map(str, argv)]
    if at_step is not None:
        command[1:1] = ["-c", AT_A_STEP]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AT_STEP": str(at_step), "DO": do, **env})


def test_0_a_venv_under_folders_that_do_not_exist_yet_is_made_with_them(tmp_path):
    venv = tmp_path / "new folder" / "it's here" / "venv"
    done = venv_tool(venv)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"made {venv}: sees {sys.executable}'s torch and numpy\n"
    assert (venv / "pyvenv.cfg").is_file() and not (venv / ".pfllib-venv-incomplete").exists()
    seen = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(bool("
                           "u.find_spec('torch') and u.find_spec('numpy')))"], capture_output=True, text=True,
                          timeout=60)
    assert seen.stdout == "True\n", seen.stderr


def test_1_a_folder_that_cannot_be_made_is_one_line_and_nothing_is_left(tmp_path):
    (tmp_path / "a file").write_text("in the way\n")
    done = venv_tool(tmp_path / "a file" / "deeper" / "venv")
    assert done.returncode == 1 and done.stderr == (f"error: cannot make {tmp_path / 'a file' / 'deeper' / 'venv'}: "
                                                    f"{tmp_path / 'a file' / 'deeper'} (Not a directory); nothing was "
                                                    "made\n"), done.stderr
    assert os.listdir(tmp_path) == ["a file"]


def test_1_a_file_of_its_own_that_cannot_be_written_removes_what_it_made(tmp_path):
    """caller.pth cannot be written (its site folder is not there, as on a disk gone read-only): status 1 and
    VENV with the folders made above it are removed."""
    venv = tmp_path / "new" / "venv"
    done = venv_tool(venv, at_step=2, CODE="0", OUT=f"{tmp_path / 'gone'}\n")
    assert done.returncode == 1 and done.stderr == (f"error: cannot make {venv}: {tmp_path / 'gone' / 'caller.pth'} "
                                                    "(No such file or directory); nothing was made\n"), done.stderr
    assert os.listdir(tmp_path) == []


def test_2_bad_input_is_one_line(tmp_path):
    done = venv_tool()
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "error: the following arguments are required: "
                                                                  "VENV\n")
    (tmp_path / "venv").mkdir()
    done = venv_tool(tmp_path / "venv")
    assert (done.returncode, done.stderr) == (2, f"error: {tmp_path / 'venv'} exists: give a new folder\n")


def test_2_a_failed_step_removes_the_venv_and_the_folders_it_made(tmp_path):
    venv = tmp_path / "new" / "deeper" / "venv"
    done = venv_tool(venv, at_step=1)
    assert done.returncode == 2 and done.stderr == (f"error: python -m venv {venv} failed (the step failed); nothing "
                                                    "was made\n"), done.stderr
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()  # a folder there before: kept, with what another program put in it
    (tmp_path / "kept" / "theirs").write_text("x")
    done = venv_tool(tmp_path / "kept" / "new" / "venv", at_step=3)
    assert done.returncode == 2 and done.stderr == (f"error: {tmp_path / 'kept' / 'new' / 'venv'} does not see this "
                                                    "Python's torch and numpy; nothing was made\n"), done.stderr
    assert sorted(os.walk(tmp_path))[0][1:] == (["kept"], []) and os.listdir(tmp_path / "kept") == ["theirs"]


def test_130_interrupted_removes_what_it_made(tmp_path):
    venv = tmp_path / "new" / "venv"
    done = venv_tool(venv, at_step=2, do="raise KeyboardInterrupt")
    assert (done.returncode, done.stderr) == (130, "error: interrupted; nothing was made\n"), done.stderr
    assert os.listdir(tmp_path) == []


def test_the_docstring_names_each_status_these_tests_check():
    import ast
    with open(TOOL) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    statuses = doc[doc.index("Exit status:"):]
    for status in ("0, VENV is made", "1, this program cannot make VENV", "2, bad input", "130, interrupted"):
        assert status in " ".join(statuses.split()), status
    tested = {name.split("_")[1] for name in globals() if name.startswith("test_") and name.split("_")[1].isdigit()}
    assert tested == {"0", "1", "2", "130"}
