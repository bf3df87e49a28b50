"""A virtual environment for PFLlib's own code (tools/pfllib_fmnist.sh, tools/pfllib_crosscheck.py run) that
sees this Python's torch, numpy and torchvision and adds only PFLlib's own imports.

    python tools/pfllib_venv.py VENV [PACKAGE ...]       # for example: scikit-learn h5py

Run it with the Python that has the project's torch (the one `pip install -r requirements.txt` installed
into: a virtual environment, the user's site folder or the system's). VENV is made without the system's
site-packages; a file `caller.pth` in its site-packages names the folders this Python imports its packages
from (its sys.path without the standard library), so VENV finds torch where this Python finds it, a
virtual environment included. The PACKAGEs are installed by pip into VENV itself (pin them, as
`scikit-learn==1.9.1`); what this Python has is seen, not copied: no second torch. VENV's folders that do not
exist yet are made, as `python -m venv` makes them. VENV holds the file ``.pfllib-venv-incomplete`` until it is
whole: a VENV that a killed run left with it is removed and made anew by the next run; any other VENV that
exists is refused.

Exit status: 0, VENV is made; 1, this program cannot make VENV or a folder above it, or write its own file in
VENV (a read-only or full disk, a file in the way), or cannot remove the VENV a killed run left; 2, bad input
(the arguments, a VENV that exists, a Python without torch or numpy) or a failed step (python -m venv or pip
install fails, whatever the cause its line names; VENV does not see this Python's torch); 130, interrupted
(Ctrl-C). Each but 0 is one line on stderr, and what this run made (VENV and the folders above it that it
made) is removed again.
"""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig


INCOMPLETE = ".pfllib-venv-incomplete"  # in VENV until it is whole: what a killed run left is known by it


def fail(message, status=2):
    print("error: " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)), file=sys.stderr)
    sys.exit(status)


def missing_folders(path):
    """``path`` and each folder above it that does not exist, the deepest first: what making it makes."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def remove_made(made):
    """Remove what this run made (missing_folders' list): VENV with what is in it, then each folder above it
    that is empty (none made is ever left, and nothing anyone else put there is taken)."""
    if made:
        shutil.rmtree(made[0], ignore_errors=True)
    for folder in made[1:]:
        try:
            os.rmdir(folder)
        except OSError:
            break


def package_folders():
    """The folders this Python imports packages from, in its order: sys.path without its first entry
    (this script's folder), the standard library and entries that are no folder."""
    stdlib = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    folders = []
    for entry in sys.path[1:]:
        real = os.path.realpath(entry) if entry else ""
        if not entry or not os.path.isdir(real) or real in folders:
            continue
        parts = real.split(os.sep)
        in_stdlib = any(real == s or real.startswith(s + os.sep) for s in stdlib)
        if in_stdlib and "site-packages" not in parts and "dist-packages" not in parts:
            continue  # lib-dynload and the like: the venv has its own
        folders.append(real)
    return folders


def last_line(completed):
    lines = (completed.stderr or completed.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit status {completed.returncode}"


# what pip says when it cannot reach the package registry (no network, a proxy, DNS)
NO_REGISTRY = ("no matching distribution", "could not find a version", "connection", "network is unreachable",
               "temporary failure in name resolution", "max retries exceeded", "proxy")


def make_venv(venv, packages):
    python = os.path.join(venv, "bin", "python")
    made = subprocess.run([sys.executable, "-m", "venv", *([] if packages else ["--without-pip"]), venv],
                          capture_output=True, text=True)
    if made.returncode:  # the Debian package is named only where it is the cause: this Python lacks ensurepip
        without = packages and importlib.util.find_spec("ensurepip") is None
        return f"python -m venv {venv} failed ({last_line(made)}" + \
            ("; Debian: apt-get install python3-venv)" if without else ")")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True)
    if site.returncode:
        return f"{python} does not start: {last_line(site)}"
    with open(os.path.join(site.stdout.strip(), "caller.pth"), "w") as f:
        f.write("".join(folder + "\n" for folder in package_folders()))
    if packages:
        pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages],
                             capture_output=True, text=True)
        if pip.returncode:
            offline = any(w in (pip.stdout + pip.stderr).lower() for w in NO_REGISTRY)
            return f"pip install {' '.join(packages)} failed" + (" (it needs the package registry)" if offline
                                                                   else "") + f": {last_line(pip)}"
    seen = subprocess.run([python, "-c", "import importlib.util as u; assert u.find_spec('numpy') and u.find_spec('torch')"],
                          capture_output=True, text=True)  # found, not imported: torch takes seconds to load
    if seen.returncode:
        return f"{venv} does not see this Python's torch and numpy"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.error = fail  # bad arguments: one line, exit status 2, not a usage block
    parser.add_argument("venv", metavar="VENV", help="the new virtual environment's folder (must not exist)")
    parser.add_argument("packages", metavar="PACKAGE", nargs="*", default=[],
                        help="what pip installs into VENV, pinned")
    args = parser.parse_args(argv)
    venv = os.path.abspath(args.venv)
    if os.path.isdir(venv) and not os.path.islink(venv) and os.path.isfile(os.path.join(venv, INCOMPLETE)):
        print(f"removing {venv}: a run of this program that was killed left it incomplete")
        shutil.rmtree(venv, ignore_errors=True)
        if os.path.lexists(venv):
            fail(f"cannot remove {venv}, left incomplete by a killed run: remove it yourself", status=1)
    if os.path.lexists(venv):
        fail(f"{venv} exists: give a new folder")
    missing = [m for m in ("numpy", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"{sys.executable} cannot import {' and '.join(missing)}: run this with the project's Python "
             "(the one requirements.txt was installed into)")
    made = missing_folders(venv)  # what a failure below removes again
    try:
        os.makedirs(venv)
        with open(os.path.join(venv, INCOMPLETE), "w") as f:
            f.write("removed when this virtual environment is whole\n")
        error, status = make_venv(venv, args.packages), 2  # a failed step
        if not error:
            os.remove(os.path.join(venv, INCOMPLETE))
    except KeyboardInterrupt:
        error, status = "interrupted", 130
    except OSError as e:  # a folder or file of this program's
        where = f": {e.filename}" if e.filename and os.path.abspath(e.filename) != venv else ""
        error, status = f"cannot make {venv}{where} ({e.strerror or e})", 1
    if error:
        remove_made(made)
        fail(f"{error}; nothing was made", status)
    print(f"made {venv}: sees {sys.executable}'s torch and numpy"
          + (f", has {' '.join(args.packages)}" if args.packages else ""))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # before anything was made (main removes what it made)
        fail("interrupted; nothing was made", status=130)
