"""A virtual environment for PFLlib's own code (tools/pfllib_fmnist.sh, tools/pfllib_crosscheck.py run) that
sees this Python's torch, numpy and torchvision and adds only PFLlib's own imports.

    python tools/pfllib_venv.py VENV [PACKAGE ...]       # for example: scikit-learn h5py

Run it with the Python that has the project's torch (the one `pip install -r requirements.txt` installed
into: a virtual environment, the user's site folder or the system's). VENV is made without the system's
site-packages; a file `caller.pth` in its site-packages names the folders this Python imports its packages
from (its sys.path without the standard library), so VENV finds torch where this Python finds it, a
virtual environment included. The PACKAGEs are installed by pip into VENV itself (pin them, as
`scikit-learn==1.9.1`); what this Python has is seen, not copied: no second torch. Bad input or a failed
step is one line and exit status 2 (a folder that cannot be written: 1), and VENV is removed again. VENV holds
the file ``.pfllib-venv-incomplete`` until it is whole: a VENV that a killed run left with it is removed and made
anew by the next run; any other VENV that exists is refused.
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
    parser.add_argument("venv", metavar="VENV", help="the new virtual environment's folder (must not exist)")
    parser.add_argument("packages", metavar="PACKAGE", nargs="*", help="what pip installs into VENV, pinned")
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
    try:
        os.mkdir(venv)
        with open(os.path.join(venv, INCOMPLETE), "w") as f:
            f.write("removed when this virtual environment is whole\n")
    except OSError as e:
        shutil.rmtree(venv, ignore_errors=True)
        fail(f"cannot make {venv} ({e.strerror or e}); nothing was made", status=1)
    try:
        error = make_venv(venv, args.packages)
        if not error:
            os.remove(os.path.join(venv, INCOMPLETE))
    except KeyboardInterrupt:
        error = "interrupted"
    except OSError as e:
        error = f"{e.strerror}: {e.filename}"
    if error:
        shutil.rmtree(venv, ignore_errors=True)
        fail(error)
    print(f"made {venv}: sees {sys.executable}'s torch and numpy"
          + (f", has {' '.join(args.packages)}" if args.packages else ""))


if __name__ == "__main__":
    main()
