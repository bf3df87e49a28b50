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
normalised file is left as it is. Bad input is one line and exit status 2.
"""
import argparse
import json
import os
import sys

PLACEHOLDER = "DIR"
PUBLIC = ("/usr/share/datasets/",)  # documented install places: a reader's path as much as ours
DATA_FLAGS = ("--dataset", "--data-dir")


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


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
    commands = [record.get("command")] + [launch.get("command") for launch in record.get("launches", [])
                                          if isinstance(launch, dict)]
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


def normalise_file(path, write=True):
    """Rewrite one config.json or reproduce.json in place (atomically, its layout kept); returns whether it
    changed (with ``write=False``: whether it would)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        record = json.loads(text)
    except ValueError as e:
        fail(f"{path} is not JSON ({e}): nothing of it was changed")
    if not isinstance(record, dict):
        fail(f"{path} holds no JSON object: nothing of it was changed")
    new = renamed(record, renames(record))
    if new == record:
        return False
    if write:
        out = json.dumps(new, indent=1) + ("\n" if text.endswith("\n") else "")
        temporary = f"{path}.tmp-data-paths"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(out)
        os.replace(temporary, path)
    return True


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
    changed = [p for top in args.paths for p in files_under(top) if normalise_file(p, write=not args.check)]
    for path in changed:
        print(f"{'names a machine path' if args.check else 'rewritten'}: {path}")
    if args.check and changed:
        sys.exit(1)
    if not changed:
        print("nothing to change")


if __name__ == "__main__":
    main()
