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
config.json is replaced whole (atomic_write); nothing else of the run is touched, so a run may be running
(it writes config.json only when it starts or resumes).

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


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


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
        with open(path) as f:
            launches = run_folder.check_launches(json.load(f), path)["launches"]
    except (OSError, ValueError, run_folder.UserError) as e:
        return None, f"{run_folder.quoted(path)} cannot be read ({run_folder.shortened(str(e), 120)})"
    counts = [launch.get("threads") for launch in launches]
    if not counts or None in counts:
        return None, f"{run_folder.quoted(path)} has a launch without a thread count"
    if len(set(counts)) > 1:
        return None, f"{run_folder.quoted(path)} has launches at {' and '.join(map(str, sorted(set(counts))))} threads"
    n = len(counts)
    return counts[0], f"reproduce.json: {n} launch{'es' if n > 1 else ''} at {counts[0]} thread{'s' * (counts[0] > 1)}"


def record(folder, threads, dry_run=False):
    """Record ``threads`` in ``folder``'s config.json (args and command); returns what was done, in words."""
    path = os.path.join(folder, "config.json")
    config = run_folder.read_config(path, doing="cannot record the thread count")
    config["args"]["threads"] = threads
    if isinstance(config.get("command"), list):
        config["command"] = run_folder.with_threads(config["command"], threads)
        if "command_line" in config:  # runs from before it have none
            config["command_line"] = run_folder.command_line(config["command"])
    flower = config.get("flower")
    if isinstance(flower, dict) and isinstance(flower.get("flags"), list):  # flower/app.py's nodes resume with these
        flower["flags"] = run_folder.with_threads(flower["flags"], threads)
    if not dry_run:
        try:
            run_folder.atomic_write(path, run_folder._json(config))
        except OSError as e:
            print(f"error: cannot write {run_folder.quoted(path)} ({e.strerror or e}); it is as it was",
                  file=sys.stderr)
            sys.exit(1)


def settle(folder, given=None, dry_run=False):
    """('recorded' | 'recorded already' | 'unchanged', one line) for one run folder."""
    config = run_folder.read_config(os.path.join(folder, "config.json"), doing="cannot record the thread count")
    evidence, words = launch_evidence(folder)
    saved = config["args"].get("threads")
    if saved is not None:
        if evidence is not None and evidence != saved:
            return "unchanged", f"records --threads {saved}, but {words}; left unchanged: {folder}"
        return "recorded already", f"records --threads {saved} already: {folder}"
    if given is not None and words is not None and evidence != given:
        return "unchanged", f"--threads {given} given, but {words}; left unchanged: {folder}"
    threads = given if given is not None else evidence
    if threads is None:
        why = words or "no reproduce.json beside it"
        return "unchanged", f"no evidence of its thread count ({why}); left unchanged (give --threads N if you " \
                            f"know it): {folder}"
    record(folder, threads, dry_run)
    source = words if evidence is not None else "given with --threads"
    return "recorded", f"{'would record' if dry_run else 'recorded'} --threads {threads} ({source}): {folder}"


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
    counts = {"recorded": 0, "recorded already": 0, "unchanged": 0}
    for folder in run_folders(args.paths):
        try:
            what, line = settle(folder, given, args.dry_run)
        except run_folder.UserError as e:
            what, line = "unchanged", f"{e}; left unchanged"
        counts[what] += 1
        print(line, file=sys.stderr if what == "unchanged" else sys.stdout)
    print(f"{counts['recorded']} {'to record' if args.dry_run else 'recorded'}, {counts['recorded already']} "
          f"recorded already, {counts['unchanged']} left unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
