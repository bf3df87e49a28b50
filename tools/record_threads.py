"""Record in a run's config.json the torch thread count it was made with, for runs made before --threads.

    python tools/record_threads.py results/                    # every run under a folder, from its evidence
    python tools/record_threads.py runs/reproduce/pfedla-t1 --dry-run
    python tools/record_threads.py runs/fedavg-synthetic-s0-... --threads 1   # a count you know yourself

A CPU run's arithmetic depends on its torch thread count, which runs made before the scripts' --threads
flag did not record. Their evidence is tools/reproduce.py's reproduce.json beside the run folder (its seed
folder), which records the OMP_NUM_THREADS each launch gave the run (torch's count before the flag). Where
every launch of the seed folder records the same count N, each of its runs gets ``"threads": N`` in
config.json's args and ``--threads N`` at the end of its command, which then repeats the run as it stands
whatever the environment's thread count; --resume keeps it. A count given with --threads (what you know of
a run made by hand) is recorded where reproduce.json is absent, and refused where it says otherwise. A run
without evidence is left unchanged and named. A run that records a count already is left as it is.
config.json is replaced whole (a rename); nothing else of the run is touched, so a run may be running
(it writes config.json only when it starts or resumes).

All or nothing: every config.json and reproduce.json is read and checked before any file changes; a damaged
one (not JSON or UTF-8, wrong types, absurd nesting or size, not a regular file) is one line naming it, exit
status 2, nothing changed. The new config.json files are all written beside theirs first (temporary files,
prefix ``.tmp-record-threads-``) and only then renamed, so a write that fails (a read-only folder, a full disk)
is one line, exit status 1, with every file as it was and no temporary file left; what a killed earlier run
left is removed.

Exit status 0 (every run found records a count, or is named as left unchanged), 2 for bad input (one
line), 1 for a config.json that cannot be written.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import run_folder  # noqa: E402


TEMPORARY = ".tmp-record-threads-"  # this program's temporary files: what a killed run left is found by it


def fail(message, status=2):
    print("error: " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)), file=sys.stderr)
    sys.exit(status)


def run_folders(paths):
    """Every run folder (holding a config.json) at or under ``paths``, sorted."""
    found = set()
    for path in paths:
        if not os.path.isdir(path):
            fail(f"{run_folder.quoted(path)} is not a folder")
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            if "config.json" in files:
                found.add(folder)
    if not found:
        fail(f"no run folder (with a config.json) in {' '.join(map(run_folder.quoted, paths))}")
    return sorted(found)


def launch_evidence(folder):
    """(count, words) that reproduce.json of the run's seed folder gives: the one thread count every launch
    records, else (None, why not); (None, None) without a reproduce.json."""
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), "reproduce.json")
    if not os.path.lexists(path):
        return None, None
    try:
        run_folder.check_regular(path, doing="cannot record the thread count")
        if os.path.getsize(path) > run_folder.RUN_JSON_MAX_BYTES:
            raise ValueError("larger than a launch record may be")
        with open(path, encoding="utf-8") as f:
            launches = run_folder.check_launches(json.load(f), path)["launches"]
    except (OSError, ValueError, RecursionError, run_folder.UserError) as e:  # damaged: nothing may change
        why = "nested too deeply" if isinstance(e, RecursionError) else run_folder.shortened(str(e), 120)
        raise run_folder.UserError(f"cannot record the thread count: {run_folder.quoted(path)} cannot be read "
                                   f"({why})") from None
    counts = [launch.get("threads") for launch in launches]
    if not counts or None in counts:
        return None, f"{run_folder.quoted(path)} has a launch without a thread count"
    if len(set(counts)) > 1:
        return None, f"{run_folder.quoted(path)} has launches at {' and '.join(map(str, sorted(set(counts))))} threads"
    n = len(counts)
    return counts[0], f"reproduce.json: {n} launch{'es' if n > 1 else ''} at {counts[0]} thread{'s' * (counts[0] > 1)}"


def recorded(config, threads):
    """``config`` (a run's config.json) with ``threads`` recorded in its args and command."""
    config["args"]["threads"] = threads
    if isinstance(config.get("command"), list):
        config["command"] = run_folder.with_threads(config["command"], threads)
        if "command_line" in config:  # runs from before it have none
            config["command_line"] = run_folder.command_line(config["command"])
    flower = config.get("flower")
    if isinstance(flower, dict) and isinstance(flower.get("flags"), list):  # flower/app.py's nodes resume with these
        flower["flags"] = run_folder.with_threads(flower["flags"], threads)
    return config


def write_all(texts):
    """Write every {path: text} all or nothing (run_folder.atomic_write_all): a write that fails leaves every file as
    it was and no temporary file: one line, exit status 1."""
    try:
        run_folder.atomic_write_all(texts, prefix=TEMPORARY)
    except OSError as e:
        fail(f"cannot write {run_folder.quoted(e.filename or '?')} ({e.strerror or e}); every config.json is as it was",
             status=1)


def remove_leftovers(folders):
    """Remove the temporary files a killed earlier run of this program left in the run folders."""
    for folder in folders:
        for name in os.listdir(folder):
            if name.startswith(TEMPORARY):
                path = os.path.join(folder, name)
                try:
                    os.remove(path)
                except OSError as e:
                    fail(f"cannot remove {run_folder.quoted(path)}, left by a killed run of this program "
                         f"({e.strerror}); nothing was changed", status=1)
                print(f"removed {run_folder.quoted(path)} (left by a killed run of this program)")


def settle(folder, given=None, dry_run=False):
    """('recorded' | 'recorded already' | 'unchanged', one line, the new config or None) for one run folder; a
    damaged config.json or reproduce.json is a UserError."""
    config = run_folder.read_config(os.path.join(folder, "config.json"), doing="cannot record the thread count")
    evidence, words = launch_evidence(folder)
    saved = config["args"].get("threads")
    if saved is not None:
        if evidence is not None and evidence != saved:
            return "unchanged", f"records --threads {saved}, but {words}; left unchanged: {folder}", None
        return "recorded already", f"records --threads {saved} already: {folder}", None
    if given is not None and words is not None and evidence != given:
        return "unchanged", f"--threads {given} given, but {words}; left unchanged: {folder}", None
    threads = given if given is not None else evidence
    if threads is None:
        why = words or "no reproduce.json beside it"
        return "unchanged", f"no evidence of its thread count ({why}); left unchanged (give --threads N if you " \
                            f"know it): {folder}", None
    source = words if evidence is not None else "given with --threads"
    return "recorded", f"{'would record' if dry_run else 'recorded'} --threads {threads} ({source}): {folder}", \
        recorded(config, threads)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="record_threads.py", description=__doc__.splitlines()[0])
    parser.error = fail
    parser.add_argument("paths", nargs="+", metavar="FOLDER", help="run folders, or folders holding them")
    parser.add_argument("--threads", metavar="N", help="the count, where no reproduce.json records it")
    parser.add_argument("--dry-run", action="store_true", help="say what would be recorded; change nothing")
    args = parser.parse_args(argv)
    given = None
    if args.threads is not None:
        if not (args.threads.isascii() and args.threads.isdigit()
                and 1 <= int(args.threads) <= run_folder.MAX_THREADS):
            fail(f"--threads must be an integer in [1, {run_folder.MAX_THREADS}], got {args.threads!r}")
        given = int(args.threads)
    counts, settled, texts = {"recorded": 0, "recorded already": 0, "unchanged": 0}, [], {}
    folders = run_folders(args.paths)
    for folder in folders:  # every file read and checked before any changes
        try:
            what, line, config = settle(folder, given, args.dry_run)
        except run_folder.UserError as e:
            fail(f"{e}; nothing was changed")
        settled.append((what, line))
        if config is not None:
            texts[os.path.join(folder, "config.json")] = run_folder._json(config)
    if not args.dry_run:
        remove_leftovers(folders)
        write_all(texts)
    for what, line in settled:
        counts[what] += 1
        print(line, file=sys.stderr if what == "unchanged" else sys.stdout)
    print(f"{counts['recorded']} {'to record' if args.dry_run else 'recorded'}, {counts['recorded already']} "
          f"recorded already, {counts['unchanged']} left unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
