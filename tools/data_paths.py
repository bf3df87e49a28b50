"""Committed runs name their data as a reader reproduces them: DIR/NAME, not one machine's absolute path.

    python tools/data_paths.py results/pfllib-fmnist          # rewrite the runs under it (again: no change)
    python tools/data_paths.py --check results                # exit 1 naming each file still to rewrite

A run's config.json ("args" and "command", and what else it records of them) and its seed folder's
reproduce.json (each launch's "command") name the data as it lay where the run was made, e.g.
``--dataset /work/pfllib-data/FashionMNIST-dir --data-dir /work/pfllib-data``. This program puts ``DIR`` in
place of that folder (``--dataset DIR/FashionMNIST-dir --data-dir DIR``), as docs/results.md's commands name
it: the folder you give `tools/pfllib_fmnist.sh DEST` and `tools/reproduce.py --data-dir`. It changes an
absolute `--dataset` (a dataset folder or .npz file) and `--data-dir` only, each everywhere the file holds
that exact path; paths under /usr/share/datasets/ (Debian's packages, as the docs name them) and relative
paths stay. Nothing else of a run changes: its metrics, summary, data fingerprint (``data_sha256``) and
settings; reproduce.py matches a dataset folder by its name and takes --data-dir as no setting, and
`--resume` takes the folder's new place from `--dataset` (checked by the fingerprint). Idempotent: a
normalised file is left as it is. All or nothing: every file is read and checked before any is changed; a file
that cannot be read or is damaged (not UTF-8, not a JSON object, entries of the wrong type, absurd nesting or size)
is one line naming it and exit status 2, with nothing changed; the new files are all written beside the old ones
(temporary files, prefix ``.tmp-data-paths-``) before any replaces its file, so a write that fails (a read-only
folder, a full disk) is one line and exit status 1 with every file as it was and no temporary file left. What a
killed earlier run left (its temporary files) is removed and named.
"""
import argparse
import contextlib
import json
import os
import shlex
import stat
import sys
import tempfile

PLACEHOLDER = "DIR"
PUBLIC = ("/usr/share/datasets/",)  # documented install places: a reader's path as much as ours
DATA_FLAGS = ("--dataset", "--data-dir")
TEMPORARY = ".tmp-data-paths-"  # this program's temporary files: what a killed run left is found by it
OLD_TEMPORARY = ".tmp-data-paths"  # the ending of the temporary files of its earlier versions
MAX_BYTES = 64 * 2 ** 20  # a config.json or reproduce.json is a few KB; a launch record grows by one line a start


def fail(message, status=2):
    """One line on stderr (a newline or control character in a name written escaped) and the exit status."""
    print("error: " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)), file=sys.stderr)
    sys.exit(status)


def machine_path(value):
    return isinstance(value, str) and os.path.isabs(value) and not value.startswith(PUBLIC)


def is_named(dataset):
    """A dataset of datasets.py (mnist, synthetic(...), ...) rather than a path: no folder in it."""
    return os.sep not in dataset and not dataset.lower().endswith(".npz")


def flag_values(command):
    """{flag: [values]} of --dataset and --data-dir in a command (list of strings), both spellings."""
    found = {flag: [] for flag in DATA_FLAGS}
    for i, word in enumerate(command):
        for flag in DATA_FLAGS:
            if word == flag and i + 1 < len(command):
                found[flag].append(command[i + 1])
            elif word.startswith(flag + "="):
                found[flag].append(word[len(flag) + 1:])
    return found


def renames(record):
    """{machine path: placeholder path} for the data paths a config.json or reproduce.json records."""
    args = record.get("args") if isinstance(record.get("args"), dict) else {}
    launches = record.get("launches") if isinstance(record.get("launches"), list) else []
    commands = [record.get("command")] + [launch.get("command") for launch in launches if isinstance(launch, dict)]
    datasets, data_dirs = [args.get("dataset")], [args.get("data_dir")]
    for command in commands:
        if isinstance(command, list) and all(isinstance(w, str) for w in command):
            values = flag_values(command)
            datasets += values["--dataset"]
            data_dirs += values["--data-dir"]
    mapping = {}
    for dataset in datasets:
        if machine_path(dataset) and not is_named(dataset):
            mapping[dataset] = f"{PLACEHOLDER}/{os.path.basename(os.path.normpath(dataset))}"
    for data_dir in data_dirs:
        if machine_path(data_dir):
            mapping[data_dir] = PLACEHOLDER
    return mapping


def renamed(value, mapping):
    """value with every string that is a mapped path (or --flag=path) replaced, in lists and dicts too."""
    if isinstance(value, str):
        for flag in DATA_FLAGS:
            if value.startswith(flag + "=") and value[len(flag) + 1:] in mapping:
                return f"{flag}={mapping[value[len(flag) + 1:]]}"
        return mapping.get(value, value)
    if isinstance(value, list):
        return [renamed(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: renamed(v, mapping) for k, v in value.items()}
    return value


def read_record(path):
    """(text, JSON object) of one config.json or reproduce.json; damage is one line (fail) naming the file."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a named pipe would block the read for ever
            fail(f"{path} is not a regular file: nothing was changed")
        if info.st_size > MAX_BYTES:
            fail(f"{path} is {info.st_size} bytes, more than a run's record may be: nothing was changed")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        fail(f"cannot read {path} ({e.strerror or e}): nothing was changed")
    try:
        text = data.decode("utf-8")
        record = json.loads(text)
    except UnicodeDecodeError:
        fail(f"{path} is not UTF-8 text (damaged): nothing was changed")
    except RecursionError:
        fail(f"{path} is nested too deeply to be a run's record (damaged): nothing was changed")
    except ValueError as e:
        fail(f"{path} is not JSON ({e}): nothing was changed")
    if not isinstance(record, dict):
        fail(f"{path} holds no JSON object: nothing was changed")
    for key, kind, words in (("args", dict, "an object"), ("command", list, "a list"), ("launches", list, "a list")):
        if key in record and not isinstance(record[key], kind):
            fail(f"{path} has {key} of type {type(record[key]).__name__}, not {words} (damaged): nothing was changed")
    return text, record


def normalised(path):
    """The new text of one config.json or reproduce.json (its layout kept), or None if it is normalised already."""
    text, record = read_record(path)
    new = renamed(record, renames(record))
    if isinstance(new.get("command_line"), str) and isinstance(new.get("command"), list):
        # run_folder.command_line of the new command, written here: importing run_folder would load torch
        new["command_line"] = shlex.join(["python", *new["command"]])
    if new == record:
        return None
    return json.dumps(new, indent=1) + ("\n" if text.endswith("\n") else "")


def remove_leftovers(tops):
    """Remove the temporary files an earlier run of this program left when it was killed; returns their paths."""
    found = []
    for top in tops:
        for folder, _, names in ([] if os.path.isfile(top) else os.walk(top)):
            found += [os.path.join(folder, n) for n in names if n.startswith(TEMPORARY) or n.endswith(OLD_TEMPORARY)]
    for path in found:
        try:
            os.remove(path)
        except OSError as e:
            fail(f"cannot remove {path}, left by an earlier run of this program ({e.strerror}): nothing was changed",
                 status=1)
    return found


def write_all(texts):
    """Write every {path: text}: each into a temporary file beside it first, then each replaces its file (a rename:
    whole or not at all). A write that fails leaves every file as it was and no temporary file (one line, exit 1)."""
    staged, path = {}, None
    try:
        for path, text in texts.items():
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=TEMPORARY)
            staged[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
    except OSError as e:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.remove(tmp)
        fail(f"cannot write {path} ({e.strerror or e}); every file is as it was", status=1)
    for path, tmp in staged.items():
        os.replace(tmp, path)


def files_under(top):
    """The config.json and reproduce.json files under a folder (or the one file given), sorted."""
    if os.path.isfile(top):
        return [top]
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(top)
                  for name in names if name in ("config.json", "reproduce.json"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="run folders, seed folders or trees of them (results/), or single json files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file names a machine path")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not os.path.exists(path):
            fail(f"{path} does not exist")
    left = [] if args.check else remove_leftovers(args.paths)
    for path in left:
        print(f"removed {path} (left by a killed earlier run of this program)")
    files = list(dict.fromkeys(p for top in args.paths for p in files_under(top)))
    texts = {path: text for path in files for text in [normalised(path)] if text is not None}  # all read first
    if not args.check:
        write_all(texts)
    for path in texts:
        print(f"{'names a machine path' if args.check else 'rewritten'}: {path}")
    if args.check and texts:
        sys.exit(1)
    if not texts:
        print("nothing to change")


if __name__ == "__main__":
    main()
