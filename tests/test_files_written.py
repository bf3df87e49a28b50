"""Files a tool writes that cannot be written (a full disk): run_folder.atomic_write, the one path
every file goes through, leaves the previous file as it was and no temporary file, and names the
real file; tools/compare.py --plot then says so in one line with exit status 1. The full disk is
/dev/full put in the place of the temporary file, so each write fails with ENOSPC as on a disk
that fills up (tools/reproduce.py's report, curves and --markdown-paper-tables target: tests/test_reproduce.py)."""
import errno
import os
import subprocess
import sys
import tempfile

import pytest

import run_folder
from conftest import ROOT
from test_compare import make_run
from tools import compare

# tools/compare.py as __main__ in a process whose every atomic_write is on a full disk (full_disk below)
ON_A_FULL_DISK = ("import os, runpy, sys, tempfile; real = tempfile.mkstemp\n"
                  "def mkstemp(*a, **k):\n"
                  "    fd, path = real(*a, **k)\n"
                  "    if os.path.basename(path).startswith('.tmp-'):\n"
                  "        full = os.open('/dev/full', os.O_WRONLY); os.dup2(full, fd); os.close(full)\n"
                  "    return fd, path\n"
                  "tempfile.mkstemp = mkstemp\n"
                  "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")


def full_disk(monkeypatch):
    """From here on each temporary file atomic_write makes is on a full disk: it is made, but every
    write to it fails with ENOSPC (its descriptor is /dev/full's)."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, path = real(*args, **kwargs)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def full_disk_under_atomic_write(monkeypatch):
    """From here on each temporary file atomic_write makes (``.tmp-`` and 8 hex digits, made with os.open) is on
    a full disk: it is made, but every write to it fails with ENOSPC (its descriptor is /dev/full's)."""
    real = os.open

    def open_(path, flags, mode=0o777, *args, **kwargs):
        fd = real(path, flags, mode, *args, **kwargs)
        if os.path.basename(str(path)).startswith(".tmp-") and flags & os.O_CREAT:
            full = real("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd

    monkeypatch.setattr(os, "open", open_)


def leftovers(folder):
    return [name for name in os.listdir(folder) if name.startswith(".tmp-")]


def half_then_full(f):
    """A writer (a savefig, a torch.save) that gets half way before the disk is full."""
    f.write(b"half of the new file")
    f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("content", ["new text " * 10000, b"new bytes" * 10000, half_then_full],
                         ids=["str", "bytes", "writer"])
def test_a_full_disk_keeps_the_previous_file_and_names_the_real_one(content, tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    path.write_text("the previous report\n")
    if not callable(content):
        full_disk_under_atomic_write(monkeypatch)
    with pytest.raises(OSError) as caught:
        run_folder.atomic_write(str(path), content)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_text() == "the previous report\n"
    assert leftovers(tmp_path) == []


def test_a_failure_names_the_file_not_the_temporary_one(tmp_path):
    missing = tmp_path / "no such folder" / "x.png"
    with pytest.raises(FileNotFoundError) as caught:
        run_folder.atomic_write(str(missing), b"x")
    assert caught.value.filename == str(missing)
    folder = tmp_path / "a folder in the file's place"
    folder.mkdir()
    with pytest.raises(OSError) as caught:
        run_folder.atomic_write(str(folder), "x")
    assert caught.value.filename == str(folder) and folder.is_dir() and leftovers(tmp_path) == []


def test_a_written_file_is_whole_and_gets_the_umask(tmp_path):
    path = tmp_path / "a.bin"
    umask = os.umask(0o027)  # not the usual 022: the mode comes from the umask, not a fixed one
    try:
        run_folder.atomic_write(str(path), lambda f: f.write(b"\x00\x01" * 5))
    finally:
        os.umask(umask)
    assert path.read_bytes() == b"\x00\x01" * 5
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert leftovers(tmp_path) == []


def test_compare_plot_on_a_full_disk_keeps_the_previous_plot(tmp_path, monkeypatch, capsys):
    for seed in range(2):
        make_run(tmp_path / "runs", f"fedavg-synthetic-s{seed}", seed=seed)
    png = tmp_path / "curves.png"
    assert compare.main([str(tmp_path / "runs"), "--plot", str(png)]) is None
    before = png.read_bytes()
    assert before[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    full_disk(monkeypatch)
    with pytest.raises(SystemExit) as caught:
        compare.main([str(tmp_path / "runs"), "--plot", str(png)])
    err = capsys.readouterr().err
    assert caught.value.code == 1
    assert err.count("\n") == 1 and err.startswith(f"error: cannot write {png} (No space left on device)"), err
    assert "the previous file is kept" in err
    assert png.read_bytes() == before and leftovers(tmp_path) == []
    new = tmp_path / "new.svg"
    with pytest.raises(SystemExit) as caught:
        compare.main([str(tmp_path / "runs"), "--plot", str(new)])
    assert caught.value.code == 1 and "nothing was written" in capsys.readouterr().err
    assert not new.exists() and leftovers(tmp_path) == []


@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_compare_plot_on_a_full_disk_as_a_user_runs_it(tmp_path):
    """python tools/compare.py RUNS --plot FILE: the table is printed, then one line and exit status 1."""
    make_run(tmp_path / "runs", "fedavg-synthetic-s0")
    png = tmp_path / "curves.png"
    png.write_bytes(b"the previous plot")
    proc = subprocess.run([sys.executable, "-c", ON_A_FULL_DISK, os.path.join(ROOT, "tools", "compare.py"),
                           str(tmp_path / "runs"), "--plot", str(png)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"cannot write {png} (No space left on device)" in proc.stderr
    assert "fedavg" in proc.stdout and "plot written" not in proc.stdout
    assert png.read_bytes() == b"the previous plot" and leftovers(tmp_path) == []


@pytest.mark.slow  # two starts of compare.py with torch (its plot writes through run_folder): 6-15 s
def test_compare_plot_killed_mid_write_keeps_the_previous_plot_and_the_next_run_clears_up(tmp_path):
    """SIGKILL as the new plot would take its name: the previous plot is whole; the next --plot removes the
    temporary file the killed one left, and writes the plot."""
    import signal
    make_run(tmp_path / "runs", "fedavg-synthetic-s0")
    png = tmp_path / "curves.png"
    png.write_bytes(b"the previous plot")
    killed = subprocess.run([sys.executable, "-c", "import os, runpy, signal, sys\n"
                             "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
                             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n",
                             os.path.join(ROOT, "tools", "compare.py"), str(tmp_path / "runs"), "--plot", str(png)],
                            cwd=ROOT, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL and png.read_bytes() == b"the previous plot"
    assert len(leftovers(tmp_path)) == 1
    again = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "compare.py"), str(tmp_path / "runs"),
                            "--plot", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "(left by a killed --plot)" in again.stderr, again.stderr
    assert leftovers(tmp_path) == [] and png.read_bytes()[:4] == b"\x89PNG"
