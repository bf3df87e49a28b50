"""How a run ends and what it leaves: the errors every file raises (``UserError``, ``DivergedError``,
``FileFault``) and ``run_main``, which turns how a script ends into its exit status and one line; ``atomic_write``;
and the run folder of every script, ``--out/<algo>-<dataset>-s<seed>-<time>/`` with config.json, partition.json,
metrics.csv, summary.json and checkpoint.pt, its lock, Ctrl-C (SIGTERM, SIGHUP) at the end of a round, and
``--resume``. Bookkeeping around the training loop; nothing here is an algorithm. It imports no other module of ours
but data_partition (docs/layout.md).
"""
import argparse
import atexit
import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time

import numpy as np
import torch

import data_partition


# ----------------------------------------------------------------------------- how a run ends

class UserError(Exception):
    """Bad input: reported as one line and exit status 2."""


class DivergedError(Exception):
    """A loss became NaN/inf: reported with round and client, exit status 1."""


def _json(obj):
    return json.dumps(obj, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def current_host_mb():
    """Resident memory of this process now, in MB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return 0.0


PID_MAX = 2 ** 22  # the largest pid Linux gives (/proc/sys/kernel/pid_max is at most 2^22)
OPEN_RUNS = []  # open run folders (Run), released by run_main on the way out

# Ctrl-C, SIGTERM (what Slurm and Kubernetes send some time before they kill a job) and SIGHUP (the
# terminal closed) stop a run alike. The exit status is 128 + the signal's number, the shell's
# convention, so that a batch system sees which signal ended the run: 130, 143 and 129.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_STATUSES = tuple(128 + signum for signum in STOP_SIGNALS)


def _signal_name(signum):
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stopped_by(signum):
    """How a one-line message says what stopped the run."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {_signal_name(signum)}"


class Stopped(KeyboardInterrupt):
    """A signal that stops the run at once (a second one, or one before the run folder exists): a KeyboardInterrupt,
    so that what cleans up after Ctrl-C (the client threads, a write's temporary file) cleans up after SIGTERM too."""

    def __init__(self, signum):
        super().__init__(_signal_name(signum))
        self.signum = signum


def _stop_at_once(signum, frame):
    raise Stopped(signum)


def handle_stop_signals(handler):
    """Make ``handler`` handle Ctrl-C, SIGTERM and SIGHUP; returns the handlers it replaced. A SIGTERM or SIGHUP
    ignored already (nohup) stays ignored; outside the main thread (Flower's server) Python allows no handler."""
    previous = {}
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if signum != signal.SIGINT and current is signal.SIG_IGN:
            continue
        try:
            signal.signal(signum, handler)
        except ValueError:  # not the main thread
            break
        previous[signum] = current
    return previous


def restore_signals(previous, ignore=False):
    """Put back the handlers that ``handle_stop_signals`` replaced, or ignore the signals (leaving after one: a
    further one must not turn the exit into a traceback)."""
    for signum, handler in previous.items():
        if ignore or getattr(handler, "while_starting", False):  # startup.py's handler: the script is ending
            handler = signal.SIG_IGN
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)


class FileFault(OSError):
    """A file of the run folder could not be written (disk full, a read-only folder, a folder in the
    file's place): one line naming the file, the OS error and what is kept; exit status 1."""

    def __init__(self, path, error, kept="", verb="write"):
        super().__init__(error.errno, error.strerror, path)
        self.line = f"cannot {verb} {path} ({error.strerror or error}){kept}"

    def __str__(self):
        return self.line


def _say(line):
    """One line on stderr (a newline or control character in a name is written escaped: the line stays
    one); a terminal that is gone (SIGHUP) must not turn it into a traceback."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line.strip("\n"))
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def run_main(main, argv=None):
    """Run a script's ``main``. Bad input: one line, exit status 2; divergence or a file that cannot be written
    (disk full, permissions): one line, 1; Ctrl-C, SIGTERM, SIGHUP: 130, 143, 129 (``main`` returns it when it stops
    at the end of a round; a signal before the run folder exists, or a second one, stops at once)."""
    code, returned, diverged = 0, False, False
    previous = handle_stop_signals(_stop_at_once)  # until a Run takes them over: nothing is written yet
    try:
        code = main(argv) or 0
        returned = True
    except (UserError, data_partition.PartitionError) as e:
        _say(f"error: {e}")
        code = 2
    except DivergedError as e:
        _say(f"stopped: {e}")
        code, diverged = 1, True
    except KeyboardInterrupt as e:  # a signal that stops at once: a second one, in the middle of a round
        restore_signals(previous, ignore=True)
        signum = getattr(e, "signum", signal.SIGINT)
        _say(OPEN_RUNS[-1].interrupted_line(signum) if OPEN_RUNS else
             f"{stopped_by(signum)} before the run folder was made; nothing was written")
        code = 128 + signum
    except OSError as e:  # disk full, permissions: the run's own files (FileFault) or any other
        _say(f"error: {e}" if isinstance(e, FileFault) or not e.filename else f"error: {e.filename}: {e.strerror}")
        code = 1
    finally:
        for run in list(OPEN_RUNS):
            run.close(failed=code != 0, diverged=diverged)
    restore_signals(previous, ignore=code in STOP_STATUSES)
    if code in STOP_STATUSES and not returned:  # at once: client threads still running hold nothing that is saved
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


# flags that may differ on --resume: they do not change what is computed (--rounds extends the run)
RESUME_MAY_CHANGE = {"rounds", "device", "parallel_clients", "data_dir", "out", "resume", "stop_after",
                     "checkpoint_every"}
# how a refusal on --resume names them (--resume itself aside), and what else may change
MAY_CHANGE_LINE = ("only --rounds (to extend the run), --device, --parallel-clients, --data-dir, --checkpoint-every, "
                   "--stop-after and --out may change, and --dataset to the new place of a dataset folder or .npz "
                   "file that moved (where config.json holds the data's fingerprint)")


def moved_dataset(saved, given):
    """Whether --dataset ``given`` on --resume may name the new place of the run's dataset ``saved``: a PFLlib
    folder (with config.json) or, for a run on an .npz file, an .npz file. Run._check_data compares the data's
    fingerprint before anything is written (a named dataset's run given a folder is refused there)."""
    if not isinstance(given, str) or given == saved or str(saved).startswith("synthetic"):
        return False
    if str(saved).lower().endswith(".npz"):
        return given.lower().endswith(".npz") and os.path.isfile(given)
    return os.path.isdir(given) and os.path.isfile(os.path.join(given, "config.json"))


# flags added after run folders were made, with the value that runs made before them ran with: their
# config.json and checkpoint lack the flag (--deterministic changes GPU results, so it may not change)
ADDED_FLAGS = {"deterministic": "off",  # before the flag, torch's own settings
               "dominant_share": 0.8, "local_training": False, "eval_local_models": False,
               "agnews_vocab": "train",  # AG News runs before the flag built the vocabulary from train texts
               "fedavg": False,  # fedacd.py before --fedavg: FedACD
               "log_risk": True, "log_kl": True,  # fedacd.py logged both at every evaluation before the flags
                "aggregation": "chunked",  # fedpake.py before the flag: chunks of 2^20 values (docs/fedpake.md)
               "threads": None}  # UNRECORDED: see below
# flags removed from every script: flag -> (the value that runs today repeat, where what the flag did went). Runs
# made before record the flag in config.json: one made with that value resumes, is rechecked and compares as if the
# flag had never been; one made with another value is refused on --resume in one line
REMOVED_FLAGS = {"clients_together": (False, "its stacked local SGD is the piece tools/together.py, which no script "
                                             "runs (docs/speed.md, \"Clients together\")")}


def removed_flag_line(flag):
    """'--flag was removed: where it went' for a flag of REMOVED_FLAGS given as ``flag`` (--x or --no-x), else None."""
    dest = flag.removeprefix("--").removeprefix("no-").replace("-", "_")
    return f"{flag} was removed: {REMOVED_FLAGS[dest][1]}" if flag.startswith("--") and dest in REMOVED_FLAGS else None


# flags that left a script for a program of tools/ (one mode per script): program -> (the script, its flags). A
# run made with one of them set (config.json keeps the command as run) continues, and its command runs, there
# with the same flags; the program also continues the script's own runs (docs/running.md)
MOVED = {"tools/fedavg_variants": ("fedavg", ("local_training", "eval_local_models")),
         "tools/fedacd_diagnostics": ("fedacd", ("fedavg", "log_risk", "log_kl"))}
# flag values that older runs saved in another form (config.json and the checkpoint's args): flag -> today's form
OLDER_FORM = {"ablate": lambda value: [value] if isinstance(value, str) else value}  # fedpake.py: one string before
# checkpoint state saved under older keys: the key path (an entry, or an entry's key) -> today's key
RENAMED_STATE = {("ala", "start_phase"): "initial_stage",  # fedala.py's ALA, the official ALA.py's name before
                 ("client_models",): "stored_models"}  # pfedla.py's stored models theta_j (Alg. 1)


def todays_form(args):
    """A run's saved arguments (config.json's or its checkpoint's) with older forms of values as today's (OLDER_FORM)."""
    return {k: OLDER_FORM[k](v) if k in OLDER_FORM else v for k, v in args.items()}


def todays_state(state):
    """A checkpoint's algorithm state with older keys (of its entries and their state_dicts) as today's
    (RENAMED_STATE); a state_dict without one is kept as it is (with its _metadata)."""
    today = {}
    for entry, value in state.items():
        if isinstance(value, dict) and any((entry, k) in RENAMED_STATE for k in value):
            value = {RENAMED_STATE.get((entry, k), k): v for k, v in value.items()}
        today[RENAMED_STATE.get((entry,), entry)] = value
    return today


def recorded_args(args, script):
    """``args`` as config.json and the checkpoint record them: with the flags that left ``script`` for tools/
    (MOVED) off, as its runs recorded them before, so that its runs and those programs' compare on --resume."""
    return {**{f: False for moved_from, flags in MOVED.values() if moved_from == script for f in flags}, **vars(args)}


def todays_command(command):
    """A command as config.json keeps it (program, flags) as it runs today: a script given a flag that moved to tools/
    (MOVED) is that program (fedavg.py --local-training ... is tools/fedavg_variants.py --local-training ...)."""
    folder, name = os.path.split(command[0])
    for program, (moved_from, flags) in MOVED.items():
        if name == f"{moved_from}.py" and any(f"--{f.replace('_', '-')}" in command[1:] for f in flags):
            return [os.path.join(folder, f"{program}.py"), *command[1:]]
    return list(command)


def program_of(script, args):
    """The program (no .py) that runs today what ``script`` ran with the settings ``args`` (config.json's,
    with ADDED_FLAGS for flags the run predates)."""
    args = {**ADDED_FLAGS, **args}
    return next((program for program, (moved_from, flags) in MOVED.items()
                 if moved_from == script and any(args.get(f) for f in flags)), script)


# --threads (the CPU torch threads that decide a run's arithmetic) was not recorded before the flag: such a run
# resumes as it ran, at torch's default from the environment (OMP_NUM_THREADS), and its record stays without a
# count; tools/record_threads.py adds the count where the run's launches (reproduce.json) show it
UNRECORDED = None
MAX_THREADS = 1024  # --threads: more is a typing error, not a machine


def with_threads(command, threads):
    """``command`` (a script's argv) with its thread count as the last ``--threads`` (argparse takes the last), so
    that it takes the thread count the run took: a ``--threads auto`` dropped and ``--threads N`` appended unless
    the command ends its --threads with N already."""
    command, out, i = [str(t) for t in command], [], 0
    given = None
    while i < len(command):
        token = command[i]
        if token == "--threads" and i + 1 < len(command):
            given, i = command[i + 1], i + 2
            if given != "auto":
                out += [token, given]
            continue
        if token.startswith("--threads="):
            given = token.partition("=")[2]
            if given != "auto":
                out.append(token)
        else:
            out.append(token)
        i += 1
    return out if given == str(threads) else [*out, "--threads", str(threads)]


def command_line(command):
    """config.json's ``command_line``: its ``command`` (the script and its arguments) as one line to paste into a
    shell."""
    return shlex.join(["python", *command])


def _given_flags(parser, argv):
    """The flags given on the command line, with their parsed values."""
    defaults, parser_defaults = [(action, action.default) for action in parser._actions], parser._defaults
    for action, _ in defaults:
        action.default = argparse.SUPPRESS
    parser._defaults = {}
    try:
        return vars(parser.parse_args(argv))
    finally:
        parser._defaults = parser_defaults
        for action, default in defaults:
            action.default = default


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path, content):
    """Write ``content`` (str, bytes, or a function writing to a binary file, such as ``savefig``) to ``path`` via a
    temporary file in its folder and a rename: no reader sees half a file, and a failed write (full disk, read-only
    folder) leaves the previous file and no temporary one. Every tool and run writes through here. A failure is an
    OSError naming ``path``; the file gets the user's umask (mkstemp's alone is private)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        if e.filename == path:
            raise
        raise OSError(e.errno, e.strerror or str(e), path) from None  # the errno's own subclass, e.g. PermissionError
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def atomic_write_all(contents, prefix=".tmp-"):
    """atomic_write of several files, all or nothing: each ``{path: content}`` is written to a temporary file (named
    ``prefix``...) in its folder before any takes its name, so a failed write leaves every file as it was and no
    temporary file (an OSError naming the file it was for)."""
    staged, path = {}, None
    try:
        for path, content in contents.items():
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=prefix)
            staged[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
            os.chmod(tmp, 0o666 & ~_UMASK)
        for path, tmp in staged.items():
            os.replace(tmp, path)
        staged = {}
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), path) from None
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.remove(tmp)


def remove_leftovers(folder, prefix):
    """Remove the temporary files named ``prefix``... in ``folder`` that a killed earlier run left (a prefix of
    one program's own, so no other program's file in progress); returns their paths."""
    found = [os.path.join(folder, n) for n in (os.listdir(folder) if os.path.isdir(folder) else [])
             if n.startswith(prefix)]
    for path in found:
        os.remove(path)
    return found


RUN_FILES = ("config.json", "partition.json", "metrics.csv", "summary.json", "checkpoint.pt")  # by atomic_write


ATOMIC_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]{8}")  # atomic_write's temporary files (mkstemp's names)


def _remove_killed_writes(folder):
    """Remove what a run killed in the middle of atomic_write left in its folder (the folder is locked by this
    process: no write of another run is in progress there)."""
    for name in os.listdir(folder):
        if ATOMIC_TEMPORARY.fullmatch(name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))


def check_regular(path, doing="cannot resume"):
    """Refuse ``path`` unless it is a regular file or absent: a named pipe in its place would block a read
    forever, a device would be read without end. Returns whether the file exists."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError:  # unreadable: the read that follows says why
        return True
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "a device")
        raise UserError(f"{doing}: {quoted(path)} is {kind}, not a regular file; move it away")
    return True


RUN_JSON_MAX_BYTES = 64 * 2 ** 20  # a run's config.json or summary.json is a few KB; more is not read


# ----------------------------------------------------------------------------- what --resume and --report read
# One written schema per file that --resume (run_folder.py, flower/app.py) and tools/reproduce.py read back:
# each field's name, whether it must be there, and the values it may hold. check_* raise a UserError of one
# line naming the file and the field; nothing is changed.

def _is_int(lo=None, hi=None):
    return lambda v: (isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)
                      and (hi is None or v <= hi))


def _is_number(lo=None):
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
                      and (lo is None or v >= lo))


def _is_str(v):
    return isinstance(v, str) and v != ""


def _auto_or(test):
    return lambda v: v == "auto" or test(v)


def _list_of(test):
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


def _optional(test):
    return lambda v: v is None or test(v)


# field: (required, test, what it must be)
CONFIG_SCHEMA = {
    "algorithm": (True, _is_str, "a name"),
    "script": (False, _is_str, "a script's name"),
    "args": (True, lambda v: isinstance(v, dict), "a mapping of the flags"),
    "command": (False, _list_of(lambda x: isinstance(x, str)), "a list of strings"),
    "command_line": (False, _is_str, "a command line"),
    "data_sha256": (False, lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None,
                    "64 hexadecimal digits"),
    "num_classes": (False, _is_int(1), "an integer >= 1"),
    "input_shape": (False, _list_of(_is_int(1)), "a list of integers >= 1"),
    "continued_on": (False, _list_of(lambda e: isinstance(e, dict) and _is_int(2)(e.get("from_round"))
                                     and _is_str(e.get("device"))),
                     "a list of {from_round >= 2, device, ...} (where_it_runs)"),
}
CONFIG_ARGS_SCHEMA = {  # the flags read before the scripts' own checks (common.parse_args) see them
    "rounds": (True, _is_int(1), "an integer >= 1"),
    "seed": (True, _is_int(0, 2 ** 63 - 1), "an integer in [0, 2^63)"),
    "dataset": (True, _is_str, "a dataset's name or file"),
    "num_clients": (False, _is_int(1), "an integer >= 1"),
    "parallel_clients": (False, _auto_or(_is_int(1)), "'auto' or an integer >= 1"),
    "samples_per_client": (False, _auto_or(_is_int(1)), "'auto' or an integer >= 1"),
    "eval_every": (False, _is_int(1), "an integer >= 1"),
    "checkpoint_every": (False, _is_int(1), "an integer >= 1"),
    "local_epochs": (False, _is_int(1), "an integer >= 1"),
    "batch_size": (False, _is_int(1), "an integer >= 1"),
    "data_dir": (False, _optional(lambda v: isinstance(v, str)), "a folder"),
    "device": (False, _optional(_is_str), "a device"),
    "threads": (False, _optional(_is_int(1, MAX_THREADS)), f"an integer in [1, {MAX_THREADS}]"),
}
LAUNCH_SCHEMA = {  # one entry of tools/reproduce.py's reproduce.json "launches"
    "time": (True, lambda v: isinstance(v, str), "a time"),
    "host": (False, lambda v: isinstance(v, str), "a host name"),
    "cpu": (False, _optional(lambda v: isinstance(v, str)), "a CPU's name"),
    "threads": (False, _optional(_is_int(1)), "an integer >= 1"),
    "device": (False, _optional(lambda v: isinstance(v, str)), "a device"),
    "command": (True, _list_of(lambda x: isinstance(x, str)), "a list of strings"),
    "pid": (False, _optional(_is_int(1, PID_MAX)), f"a process id in [1, {PID_MAX}]"),
}
CHECKPOINT_SCHEMA = {
    "algorithm": (True, _is_str, "a name"),
    "round": (True, _is_int(1), "an integer >= 1"),
    "rows": (True, lambda v: isinstance(v, list), "a list of the metric rows"),
    "bytes": (True, lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(0)(x) for x in v),
              "two integers >= 0"),
    "elapsed": (True, _is_number(lo=0), "a number of seconds >= 0"),
    "state": (True, lambda v: isinstance(v, dict), "a mapping"),
    "rng": (True, lambda v: isinstance(v, dict), "a numpy generator state"),
    "torch_rng": (True, lambda v: isinstance(v, torch.Tensor) and v.dtype == torch.uint8, "a uint8 tensor"),
    "args": (False, lambda v: isinstance(v, dict), "a mapping of the flags"),
}


def _shown(value, width=40):
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def check_fields(data, schema, path, prefix="", doing="cannot read"):
    """Check the mapping ``data`` against ``schema``; a UserError of one line naming the file and the first
    field that is missing or holds what it may not."""
    where = quoted(path)
    if not isinstance(data, dict):
        raise UserError(f"{doing}: {where} holds {type(data).__name__}, not a mapping (the file is damaged)")
    for key, (required, test, what) in schema.items():
        if key not in data:
            if required:
                raise UserError(f"{doing}: {where} lacks the field {prefix}{key} (the file is damaged or edited)")
            continue
        if not test(data[key]):
            raise UserError(f"{doing}: {where} has {prefix}{key} = {_shown(data[key])}, which must be {what} "
                            "(the file is damaged or edited)")


def check_config(config, path, doing="cannot read"):
    """config.json of a run folder against CONFIG_SCHEMA and CONFIG_ARGS_SCHEMA."""
    check_fields(config, CONFIG_SCHEMA, path, doing=doing)
    check_fields(config["args"], CONFIG_ARGS_SCHEMA, path, prefix="args.", doing=doing)
    return config


def check_launches(record, path, doing="cannot read"):
    """tools/reproduce.py's reproduce.json: {"launches": [LAUNCH_SCHEMA, ...]}."""
    check_fields(record, {"launches": (True, lambda v: isinstance(v, list), "a list")}, path, doing=doing)
    for i, launch in enumerate(record["launches"]):
        if not isinstance(launch, dict):
            raise UserError(f"{doing}: {quoted(path)} has launches[{i}] = {_shown(launch)}, which must be a mapping "
                            "(the file is damaged or edited)")
        check_fields(launch, LAUNCH_SCHEMA, path, prefix=f"launches[{i}].", doing=doing)
    return record


def check_checkpoint(blob, path, eval_every=1, doing="cannot resume"):
    """checkpoint.pt against CHECKPOINT_SCHEMA, its metric rows consistent with its round: plain values, rounds
    strictly increasing in [1, round], and every round --eval-every evaluates up to it present."""
    check_fields(blob, CHECKPOINT_SCHEMA, path, doing=doing)
    round_, seen = blob["round"], []
    for i, row in enumerate(blob["rows"]):
        plain = isinstance(row, dict) and all(isinstance(k, str) and (isinstance(v, str) or _is_number()(v))
                                              for k, v in row.items())
        if not plain or not _is_int(1)(row.get("round")):
            raise UserError(f"{doing}: {quoted(path)} has rows[{i}] = {_shown(row)}, which is not a metric row "
                            "(the file is damaged or edited)")
        if seen and row["round"] <= seen[-1] or row["round"] > round_:
            raise UserError(f"{doing}: {quoted(path)} has rows[{i}] of round {row['round']} after round "
                            f"{seen[-1] if seen else 0}, in a checkpoint of round {round_} (duplicated or out "
                            "of order; the file is damaged or edited)")
        seen.append(row["round"])
    missing = sorted(set(range(eval_every, round_ + 1, eval_every)) - set(seen))
    if missing:
        raise UserError(f"{doing}: {quoted(path)} is a checkpoint of round {round_} without the metric rows of "
                        f"round {', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''} "
                        "(the file is damaged or edited)")
    return blob


def read_config(path, doing="cannot resume"):
    """A run folder's config.json, read and checked (check_config); a UserError of one line otherwise."""
    check_regular(path, doing=doing)
    try:
        if os.path.getsize(path) > RUN_JSON_MAX_BYTES:  # a run's config.json is a few KB: not read whole
            raise UserError(f"{doing}: {quoted(path)} is larger than {RUN_JSON_MAX_BYTES // 2 ** 20} MB; a run's "
                            "config.json is a few KB (the file is damaged or not a run's)")
        with open(path) as f:  # not finite numbers only: fedpake.py's --kappa inf is written as Infinity
            config = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{doing}: {quoted(path)} is missing") from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deeply to be a run's
        reason = e.strerror if isinstance(e, OSError) else "not JSON: cut short or damaged"
        raise UserError(f"{doing}: {quoted(path)} cannot be read ({reason})") from None
    return check_config(config, path, doing=doing)


def resumed_args(parser, argv):
    """The saved arguments of ``--resume RUN_DIR``, with the flags given now that may change."""
    given = _given_flags(parser, argv)
    if given.get("threads") == "auto":  # auto: the count the run took, which it keeps
        del given["threads"]
    folder = given["resume"]
    path = os.path.join(folder, "config.json")
    for name in RUN_FILES:  # before any of them is opened
        check_regular(os.path.join(folder, name))
    config = read_config(path)
    saved, script = todays_form({**ADDED_FLAGS, **config["args"]}), config.get("script")
    # older run folders name no script, and flower/app.py's checkpoint is the script's: the algorithm names it
    if script in (None, "flower_app"):  # (check_config: the algorithm is a name, the script one if given)
        script = {"heurpfedla": "pfedla"}.get(config["algorithm"], config["algorithm"])
    script = program_of(script, saved)
    if f"{script}.py" != parser.prog and MOVED.get(parser.prog.removesuffix(".py"), (None,))[0] != script:
        raise UserError(f"cannot resume: {folder} is a run of {script}.py, not {parser.prog}; "
                        f"use python {script}.py --resume {folder}")
    for dest, (value, where) in REMOVED_FLAGS.items():
        if saved.get(dest, value) != value:
            raise UserError(f"cannot resume: {folder} was trained with --{dest.replace('_', '-')} {saved[dest]}, a "
                            f"flag since removed: {where}")
    defaults = vars(parser.parse_args([]))
    missing = sorted(set(defaults) - set(saved) - RESUME_MAY_CHANGE)
    if missing:
        raise UserError(f"cannot resume: {path} lacks the settings {', '.join(missing)}")
    movable = "data_sha256" in config  # a dataset's new place is taken only where the fingerprint can check it
    changed = [f"--{k.replace('_', '-')} {saved[k]} (now {v})" for k, v in sorted(given.items())
               if k not in RESUME_MAY_CHANGE and k in saved and v != saved[k]
               and not (k == "dataset" and movable and moved_dataset(saved[k], v))]
    if not os.path.exists(os.path.join(folder, "checkpoint.pt")):
        raise UserError(f"cannot resume: {folder} has no checkpoint.pt (the run stopped before its first "
                               "checkpoint; start it again)")
    if "threads" in saved and saved["threads"] is UNRECORDED and "threads" in given:
        raise UserError(f"cannot resume with --threads {given['threads']}: {path} records no thread count (the run "
                        "was made before --threads); it resumes as it ran, at torch's default from the environment "
                        "(OMP_NUM_THREADS); if you know the count it was made with, record it first: python "
                        f"tools/record_threads.py {quoted(folder)} --threads N")
    if changed:
        raise UserError(f"cannot resume with other settings: {'; '.join(changed)}; {MAY_CHANGE_LINE}")
    for action in parser._actions:
        if action.dest == "threads" and saved.get("threads") is UNRECORDED:
            continue
        if action.dest in saved and action.dest not in given and not _fits(action, saved[action.dest]):
            raise UserError(f"cannot resume: {path} has {action.option_strings[-1]} "
                                   f"{saved[action.dest]!r}, which that flag does not take")
    args = argparse.Namespace(**{**defaults, **{k: v for k, v in saved.items() if k in defaults}})
    for k in RESUME_MAY_CHANGE & set(given):
        setattr(args, k, given[k])
    if "dataset" in given and movable and moved_dataset(saved["dataset"], given["dataset"]):
        args.dataset = given["dataset"]  # the data's new place; Run checks the fingerprint
    args.resume, args.stop_after = folder, given.get("stop_after")
    round_ = checkpoint_round(folder) if args.stop_after is not None else None
    if round_ is not None and round_ >= args.stop_after:  # before any data is loaded or an engine starts
        raise UserError(stop_after_refusal(folder, args.stop_after, round_))
    # a summary.json that cannot say
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, RecursionError):
        with open(os.path.join(folder, "summary.json")) as f:  # (checked a regular file above, with RUN_FILES)
            text = f.read(RUN_JSON_MAX_BYTES + 1)
        summary = json.loads(text) if len(text) <= RUN_JSON_MAX_BYTES else {}
        if summary.get("status") == "finished" and summary.get("rounds_done") == args.rounds:
            raise UserError(f"cannot resume: {folder} has finished its {args.rounds} rounds; "
                                   f"give --rounds N (more than {args.rounds}) to extend it")
    return args


def invalid_saved_value(parser, argv, message):
    """The line for a flag check (common.parse_args) that failed after ``--resume``: a value given on the command line
    keeps the check's message; one read from the run's config.json is named as that file's (edited or damaged)."""
    given = _given_flags(parser, argv)
    flag, _, rest = message.partition(" ")
    flag = flag.rstrip(":,;")  # '--flag: why', '--flag, ...' name the flag too
    action = next((a for a in parser._actions if flag in a.option_strings), None)
    if action is not None and action.dest in given and action.dest in RESUME_MAY_CHANGE:
        return message
    path = os.path.join(given["resume"], "config.json")
    if action is None:
        return f"cannot resume: {path} holds an invalid setting ({message})"
    return f"cannot resume: {path} has an invalid {action.dest}: {rest} (the file was edited or damaged)"


def _fits(action, value):
    """Whether a value read from config.json is one that the flag's parser could have produced."""
    if value is None:
        return action.default is None
    if action.nargs in ("+", "*"):  # a list of values (fedpake.py's --ablate micro macro)
        return isinstance(value, list) and bool(value or action.nargs == "*") and all(
            v is not None and _fits_one(action, v) for v in value)
    return _fits_one(action, value)


def _fits_one(action, value):
    """Whether ``value`` (not None) is one value that the flag's parser could have produced."""
    if action.choices is not None and value not in action.choices:
        return False
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        return isinstance(value, bool)
    if action.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if action.type is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) if action.type in (None, str) else True


def lock_owner(text):
    """(pid, host) of a lock file's text "PID HOST"; (None, what it holds instead, quoted) when the pid is no
    process's: 0, negative, beyond PID_MAX or not a number (os.kill would signal a process group, or overflow)."""
    parts = text.split()
    first = parts[0] if parts else ""
    if len(parts) == 2 and re.fullmatch(r"[0-9]{1,8}", first) and 1 <= int(first) <= PID_MAX:
        return int(first), parts[1]
    return None, quoted(first[:40] if len(parts) == 2 else text.strip()[:40])


def process_alive(pid):
    """Whether process ``pid`` (a valid pid, see lock_owner) runs on this host; a zombie counts as gone,
    another user's process as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as f:  # Linux: not a zombie
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def lock_holder(folder):
    """The pid of the live process on this host that holds ``folder``'s .lock, else None (no lock, a
    stale one, one of another host, or one that names no process)."""
    path = os.path.join(folder, ".lock")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path) as f:
            pid, host = lock_owner(f.read(256))
    except OSError:
        return None
    return pid if pid is not None and host == socket.gethostname() and process_alive(pid) else None


_PLAIN = re.compile(r"[\w@%+=:,./~-]+")


def shortened(text, width=120):
    """``text`` in at most about ``width`` characters: a longer one loses its middle, not its end, where a
    message often says what is wrong ('File <ZipInfo ...> is encrypted')."""
    text = str(text)
    if len(text) <= width:
        return text
    keep = max(width - 5, 2)
    return f"{text[:keep // 2]} ... {text[len(text) - (keep - keep // 2):]}"


def quoted(name):
    """A file name for a one-line message: as it is when plain, else quoted as Python writes it (a
    newline or a control character in it must not break the line)."""
    name = str(name)
    return name if _PLAIN.fullmatch(name) and name.isprintable() else repr(name)


def _lock(folder):
    """Create the run folder's lock file: one process per run folder. A stale lock (its process gone: killed, crashed,
    a zombie) is taken over; one that cannot be written (disk full) is removed and raises FileFault."""
    path = os.path.join(folder, ".lock")
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # as open(path, "x"): the umask applies
        except FileExistsError:
            check_regular(path, doing=f"cannot use {folder}")  # a named pipe would block the read below
            try:
                with open(path) as f:
                    text = f.read(256)
            except FileNotFoundError:  # removed this instant: try again
                continue
            except OSError:  # another user's file: the process may be alive
                text = ""
            if not text.strip():  # empty or unreadable: perhaps being written this instant
                raise UserError(f"{folder} holds a lock file that names no process; delete {path} "
                                       "if no run is using the folder")
            pid, host = lock_owner(text)
            if pid is None:
                raise UserError(f"{path} does not name a process (pid {host}); delete it if no run is using {folder}")
            if host != socket.gethostname() or process_alive(pid):
                raise UserError(f"{folder} is in use by process {pid} on {host}; wait for it to end "
                                f"(or delete {path} if that process is gone)")
            try:
                os.remove(path)
            except OSError as e:
                if not isinstance(e, FileNotFoundError):  # removed this instant: try again
                    raise FileFault(path, e, verb="remove the stale lock") from None
            continue
        except OSError as e:
            raise FileFault(path, e, verb="create") from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()} {socket.gethostname()}\n")
            return path
        except OSError as e:  # an empty lock would keep every later run out
            with contextlib.suppress(OSError):
                os.remove(path)
            raise FileFault(path, e) from None
    raise UserError(f"cannot take the lock {path}; delete it if no run is using {folder}")


def _short(path, width=80):
    """A path for a one-line message, a very long one (beyond the system's limit) abbreviated."""
    return path if len(path) <= width else f"{path[:40]}...{path[-30:]}"


def _remove_empty_folders(folders):
    """Remove folders a run made and left empty, deepest first; os.rmdir never removes a folder that
    holds anything (another run started meanwhile under the same --out)."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except (FileNotFoundError, NotADirectoryError):  # not made: os.makedirs stopped above it
            continue
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:  # a folder that holds something: so do its parents
                break


def check_out_folder(out):
    """Refuse an --out that cannot hold a new run folder, before any data is loaded or an engine (Ray) starts: a
    file in its place or in a parent's place (exit 2), or a folder that cannot be written to (a FileFault, exit 1).
    Creates nothing."""
    path = os.path.abspath(out)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise UserError(f"cannot create a run folder under --out {_short(out)} ({quoted(path)} is not a folder)")
    if not os.access(path, os.W_OK | os.X_OK):
        with contextlib.suppress(OSError):
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                raise FileFault(path, OSError(errno.EROFS, os.strerror(errno.EROFS)), "; nothing was made",
                                verb="create a run folder under")
        raise FileFault(path, OSError(errno.EACCES, os.strerror(errno.EACCES)), "; nothing was made",
                        verb="create a run folder under")


def checkpoint_round(folder):
    """The round of ``folder``'s checkpoint.pt, read without loading its tensors (mmap); None if it cannot say
    (Run.resume then reads and checks the file in full)."""
    try:
        blob = torch.load(os.path.join(folder, "checkpoint.pt"), map_location="cpu", weights_only=True, mmap=True)
        return blob["round"] if isinstance(blob, dict) and isinstance(blob.get("round"), int) else None
    except Exception:  # noqa: BLE001  a damaged file: Run.resume says so
        return None


def stop_after_refusal(folder, stop_after, round_):
    return (f"cannot resume with --stop-after {stop_after}: {quoted(folder)} has its checkpoint at round {round_} "
            "already; give a later round, or leave --stop-after out to go on to the end")


def _check_path_fits(out, folder):
    """Refuse a run folder whose files' paths would exceed the system's limits, before anything is
    created: os.makedirs would make the part of the path that fits (20 nested empty folders)."""
    existing = out
    while existing and not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        path_max, name_max = os.pathconf(existing or ".", "PC_PATH_MAX"), os.pathconf(existing or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        path_max, name_max = 4096, 255  # Linux's
    folder += "-99"  # what a run started in the same second as others gets
    longest = len(os.fsencode(os.path.join(os.path.abspath(folder), "partition.json")))  # its longest file name
    name = len(os.fsencode(os.path.basename(folder)))
    if 0 < name_max < name:
        raise UserError(f"the run folder's name would be {name} bytes, more than the {name_max} this system "
                               f"allows; use a shorter --dataset file name")
    longest_in_out = max(len(os.fsencode(n)) for n in out.split(os.sep))
    if 0 < name_max < longest_in_out:
        raise UserError(f"--out {_short(out)} has a folder name of {longest_in_out} bytes; this system allows "
                               f"at most {name_max}")
    if 0 < path_max <= longest:
        raise UserError(f"--out {_short(out)} is too long for this system: the run folder's files would have "
                               f"paths of {longest} bytes, and at most {path_max - 1} are allowed")


def cpu_model():
    """The CPU's model name with its family and model numbers (/proc/cpuinfo on Linux, else platform's): with
    torch's CPU capability, the CPU kind a run repeats bit for bit on. The numbers are kept because a virtual
    machine may show only a generic name ("AMD EPYC") for generations whose kernels sum in another order (other
    cache sizes, other blocking): runs from an earlier "AMD EPYC" differ in the last digits on family 25, model 1."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    numbers = [f"{key} {fields[key]}" for key in ("cpu family", "model") if fields.get(key)]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def where_it_runs(device):
    """What decides a run's arithmetic besides its flags: the device, the CPU kind (the kernels torch picked and
    the processor: cpu_model) and the library versions. config.json records it at the start, and again under
    ``continued_on`` for each resume where it changed."""
    return {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": cpu_model(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}}


def continued_elsewhere(config, round_, device):
    """``config`` with a ``continued_on`` entry for a resume after ``round_`` where where_it_runs differs from where
    the run ran last (the newest entry, else config's own record); None when nothing changed."""
    here = where_it_runs(device)
    last = config["continued_on"][-1] if config.get("continued_on") else config
    if all(last.get(k, v) == v for k, v in here.items()):  # a field the record lacks is unknown, not a change
        return None
    return {**config, "continued_on": [*config.get("continued_on", []), {"from_round": round_ + 1, **here}]}


def data_fingerprint(data, chunk_bytes=64 * 2 ** 20):
    """sha256 of the data as it enters the run (samples, labels, every client's train and test indices), read a
    chunk at a time whatever its device and layout; about a second for CIFAR-10. --resume compares it."""
    digest = hashlib.sha256()

    def add(t):
        digest.update(f"{t.dtype} {tuple(t.shape)};".encode())
        if t.dim() == 4:  # images: in the order the channels-last layout of datasets.load_federated_data keeps
            t = t.permute(0, 2, 3, 1)  # them in memory, so that no chunk is copied on the host
        step = max(1, chunk_bytes // max(1, t[0].numel() * t.element_size())) if len(t) else 1
        for start in range(0, len(t), step):
            digest.update(t[start: start + step].contiguous().cpu().numpy())

    add(data.x)
    add(data.y)
    for indices in (data.train_idx, data.test_idx, [] if data.global_test_idx is None else [data.global_test_idx]):
        digest.update(f"{[len(i) for i in indices]};".encode())
        if len(indices):
            add(torch.cat(list(indices)))
    return digest.hexdigest()


class _KeepError:
    """A file whose failed write is remembered: torch.save turns an OSError (disk full) into a
    RuntimeError that names no cause ("unexpected pos 704 vs 598")."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, b):
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self):
        return self.f.flush()


def _torch_save(blob):
    """torch.save as content for atomic_write, raising the OS error of a failed write."""
    def write(f):
        out = _KeepError(f)
        try:
            torch.save(blob, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise
    return write


def _detach_from_terminal():
    """After SIGHUP the terminal is gone and a write to it fails (EIO): what is still printed goes to
    /dev/null instead, so that the round can end with its checkpoint."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            out = os.fstat(fd)
            if stat.S_ISCHR(out.st_mode) and out.st_rdev != os.fstat(null).st_rdev:  # a terminal, not /dev/null
                os.dup2(null, fd)
    os.close(null)


clock = time.perf_counter  # the run's seconds (tests set a clock of their own)
PROGRESS_AFTER = 5.0  # seconds into a round before its progress shows (a shorter round shows none)
PROGRESS_LOG_EVERY = 30.0  # seconds between progress lines written to a log (stdout not a terminal)


def clients_done(done, of):
    """common.ClientPool's progress report: ``done`` of the round's ``of`` clients have returned (0: the round's
    clients start); passed on to the open run (Run.clients_done), if any."""
    if OPEN_RUNS:
        OPEN_RUNS[-1].clients_done(done, of)


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def duration(seconds):
    """An ETA in a progress line: 1h05m, 4m02s."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def summarise(values):
    """summary.json's numbers of one metric over a run's evaluations: the best (the maximum), the
    final value and the mean of the last 10."""
    values = np.asarray(values, dtype=float)
    return {"best": float(values.max()), "final": float(values[-1]), "last10_mean": float(values[-10:].mean())}


def run_folder_dataset_name(dataset):
    """The dataset's part of a run folder's name: a folder's or file's own name, also when given as ., .. or
    with a trailing / (the name of the folder meant, not '.'), in letters, digits, '.', '_' and '-'."""
    name = dataset
    if os.path.isdir(dataset) or os.sep in dataset:
        name = os.path.basename(os.path.abspath(dataset))
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace(".npz", "")).strip("-")
    return name if name.strip(".") else "data"  # '/' or a name of dots: a word that names no other folder


class Run:
    """The run folder and the bookkeeping around the training loop (not the algorithm): creates
    ``--out/<algo>-<dataset>-s<seed>-<time>/`` (or takes ``--resume RUN_DIR``), locks it, writes config.json and
    partition.json; then records evaluations (metrics.csv), checkpoints (checkpoint.pt: tensors and plain containers
    only) and the summary. Build it once set-up has succeeded: a run that fails before its first round leaves no
    folder. The first Ctrl-C, SIGTERM or SIGHUP asks the loop to stop at the end of the round (``stop_requested``);
    a second one stops at once."""

    def __init__(self, algo, args, data, device, headline, headline_metric="test_acc", script=None, extra_config=None,
                 program=None):
        self.algo, self.args, self.data, self.device = algo, args, data, device
        self.headline, self.headline_metric, self.script = headline, headline_metric, script or algo
        self.program = program or f"{self.script}.py"  # what a user runs, from the repository root
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = [], 0, 0, 0.0
        self.dir, self.lock, self.created, self.finished, self._made = None, None, False, False, []
        self.interrupted = 0  # the signal that asked the run to stop at the end of the round; 0: none
        self.checkpoint_round, self.stopping, self._latest = 0, False, None
        self.data_sha256 = data_fingerprint(data)
        OPEN_RUNS.append(self)  # from here on close() releases what this makes, however the run ends
        self._previous_handlers = handle_stop_signals(self._on_signal)
        if args.resume:  # a resumed run keeps its record (resume() updates --rounds)
            self.dir, self.lock = args.resume, _lock(args.resume)
            _remove_killed_writes(self.dir)
            self._check_data()
        else:
            self._new_dir()
            threads = getattr(args, "threads", UNRECORDED)  # the command as run, with the thread count it took, so
            command = sys.argv if threads is UNRECORDED else with_threads(sys.argv, threads)  # that it repeats the run
            self._write("config.json", _json({
                "algorithm": algo, "script": self.script,
                "args": {**recorded_args(args, self._records_as()), "resume": None, "stop_after": None},
                "command": command, "command_line": command_line(command), "headline_metric": headline_metric,
                **where_it_runs(device),
                "num_classes": data.num_classes, "input_shape": list(data.x.shape[1:]),
                "data_sha256": self.data_sha256,
                **({"dataset_folder": data.info["folder"]} if isinstance(data.info.get("folder"), dict) else {}),
                **(extra_config or {})}))
        self._write_partition()
        self._t_last, self._last_round = clock(), 0
        self._round_now, self._round_started, self._progress_shown, self._progress_width = 0, self._t_last, 0.0, 0
        self._progress_lock = threading.Lock()

    def _new_dir(self):
        """Create and lock a new run folder under --out; what it makes (with --out and its missing parents) is
        removed by close() if the run fails before any result."""
        name = run_folder_dataset_name(self.args.dataset)
        base = os.path.join(self.args.out, f"{self.algo}-{name}-s{self.args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        _check_path_fits(self.args.out, base)
        self._made, parent = [], os.path.dirname(base)
        while parent and not os.path.lexists(parent):  # the folders os.makedirs will create, deepest first
            self._made.append(parent)
            parent = os.path.dirname(parent)
        path, n = base, 1
        while True:
            try:
                os.makedirs(path)  # never an existing folder: never overwrite an earlier run
                break
            except FileExistsError:
                if not os.path.isdir(os.path.dirname(path) or "."):
                    raise UserError(f"--out {self.args.out} is not a folder")
                path, n = f"{base}-{n}", n + 1
            except OSError as e:
                _remove_empty_folders(self._made)
                if e.errno in (errno.ENOTDIR, errno.ENAMETOOLONG):  # the --out given cannot hold a folder
                    raise UserError(f"cannot create a run folder under --out {_short(self.args.out)} ({e.strerror})")
                raise FileFault(path, e, verb="create") from None
        self.dir, self.created = path, True
        self.lock = _lock(path)

    def _on_signal(self, signum, frame):
        """The first Ctrl-C, SIGTERM or SIGHUP asks the loop to stop at the end of the round, after a
        checkpoint; a second one stops at once (Stopped), keeping the last checkpoint written."""
        if self.stopping:  # the checkpoint is written, or the run is stopping at once: nothing left to stop
            return
        if self.interrupted:
            self.stopping = True
            raise Stopped(signum)
        self.interrupted = signum
        if signum == signal.SIGHUP:
            _detach_from_terminal()
        with contextlib.suppress(OSError, ValueError):  # on stdout: stderr gets the one line that ends the run
            print(f"\n[{self.algo}] {_signal_name(signum)}: stopping at the end of this round, after a checkpoint "
                  f"(a second {_signal_name(signum)} stops at once)", flush=True)

    def _write(self, name, content):
        """atomic_write of a file of the run folder; a failure is a FileFault (what is kept: _kept)."""
        path = os.path.join(self.dir, name)
        try:
            atomic_write(path, content)
        except OSError as e:
            raise FileFault(path, e, self._kept()) from None

    def _checkpoint_there(self):
        """Whether this run's checkpoint is still there (its folder may have been moved or deleted under the job)."""
        return bool(self.checkpoint_round) and os.path.isfile(os.path.join(self.dir, "checkpoint.pt"))

    def _checkpoint_gone(self):
        """The words for a checkpoint this run wrote that is no longer there."""
        return (f"the checkpoint of round {self.checkpoint_round} is gone from {self.dir} (the folder was moved or "
                "deleted), so the run cannot be resumed from there")

    def _kept(self):
        """The end of a failed write's one line: what the run folder keeps, and how to go on."""
        if self.checkpoint_round and not self._checkpoint_there():
            return f"; {self._checkpoint_gone()}"
        if self.checkpoint_round:
            return (f"; the checkpoint of round {self.checkpoint_round} is kept: once the file can be written, "
                    f"continue with: python {self.program} --resume {self.dir}")
        if self.rows:
            return ("; no checkpoint was written yet, so the run cannot be resumed: once the file can be written, "
                    f"start it again (the metrics so far stay in {self.dir})")
        return "; nothing was kept"

    def _check_data(self):
        """With --resume: refuse data other than the run started with (an .npz overwritten since, another --data-dir).
        A config.json from before the fingerprint (2026-11) has none: resume() records it."""
        saved = read_config(os.path.join(self.dir, "config.json")).get("data_sha256")
        if saved is not None and saved != self.data_sha256:
            d = self.args.dataset
            name = (f"{d}, generated from --seed {self.args.seed}" if self.data.info.get("generated") else
                    d if d.endswith(".npz") or self.data.info.get("folder") else
                    f"{d} in --data-dir {self.args.data_dir}")
            raise UserError(f"cannot resume: the data of {self.dir} changed since the run started ({name}: "
                                   f"fingerprint {saved[:16]} now {self.data_sha256[:16]})")

    def _write_partition(self):
        d = self.data
        if not self.args.resume:
            self._write("partition.json", _json({
                "train_class_counts": d.train_counts, "test_class_counts": d.test_counts,
                "train_sizes": d.train_counts.sum(1), "test_sizes": d.test_counts.sum(1),
                "global_test_size": 0 if d.global_test_idx is None else len(d.global_test_idx),
                **({"samples_per_client": d.info["samples_per_client"]} if "samples_per_client" in d.info else {})}))
        n = d.num_clients
        print(f"[{self.algo}] {self.args.dataset}: {n} clients, {d.num_classes} classes, "
              f"input {tuple(d.x.shape[1:])}, device {self.device}, run folder {self.dir}"
              + (f"; {d.info['samples_per_client']['samples']} samples per client (--samples-per-client "
                 f"{d.info['samples_per_client']['flag']})" if "samples_per_client" in d.info else ""))
        for i in range(min(n, 20)):
            nz = {c: int(v) for c, v in enumerate(d.train_counts[i]) if v}
            classes = nz if len(nz) <= 12 else f"{len(nz)} classes (see partition.json)"
            print(f"  client {i:3d}: train {int(d.train_counts[i].sum()):6d} test {int(d.test_counts[i].sum()):6d}"
                  f"  {classes}")
        if n > 20:
            print(f"  ... {n - 20} more clients in partition.json")

    def add_bytes(self, down, up):
        self.bytes_down += int(down)
        self.bytes_up += int(up)

    def should_eval(self, round_):
        """Every --eval-every rounds and each of the last 10: last10_mean is the mean over the last 10 rounds
        (FedPake Sec. 4.1) whatever --eval-every is."""
        return round_ % self.args.eval_every == 0 or round_ > self.args.rounds - 10

    def clients_done(self, done, of):
        """While a round runs longer than PROGRESS_AFTER seconds: the clients done out of the round's and an ETA, on
        stdout (one line rewritten in place on a terminal; in a log at most one line every PROGRESS_LOG_EVERY
        seconds), never in metrics.csv. The ETA projects this round from its clients so far and the rounds left
        from the mean round including it, so a long round (FedALA's initial stage) counts as it runs."""
        now = clock()
        with self._progress_lock:
            if done == 0:
                self._round_now, self._round_started, self._progress_shown = self._round_now + 1, now, now
                return
            so_far = now - self._round_started
            terminal = _is_terminal(sys.stdout)
            if so_far < PROGRESS_AFTER or not terminal and now - self._progress_shown < PROGRESS_LOG_EVERY:
                return
            this_round = so_far * of / done
            before = self.elapsed + self._round_started - self._t_last  # the rounds before this one
            mean = (before + this_round) / self._round_now
            eta = this_round - so_far + mean * (self.args.rounds - self._round_now)
            line = (f"[{self.algo}] round {self._round_now}/{self.args.rounds}: {done}/{of} clients done | "
                    f"{so_far:.0f} s into this round | ETA {duration(eta)}")
            self._progress_shown = now
            with contextlib.suppress(OSError, ValueError):
                if terminal:
                    print(f"\r{line:<{self._progress_width}}", end="", flush=True)
                    self._progress_width = len(line)
                else:
                    print(line, flush=True)

    def _end_progress(self):
        """Clear a progress line left on the terminal, for the line that follows."""
        with self._progress_lock:
            if self._progress_width:
                with contextlib.suppress(OSError, ValueError):
                    print(f"\r{'':{self._progress_width}}\r", end="", flush=True)
                self._progress_width = 0

    def log(self, round_, metrics):
        """Record one evaluation: a row in metrics.csv (rewritten atomically) and a progress line."""
        now = clock()
        self.elapsed += now - self._t_last
        rounds = max(round_ - self._last_round, 1)
        per_round, first = (now - self._t_last) / rounds, self._last_round + 1
        self._t_last, self._last_round, self._round_now = now, round_, round_

        def plain(v):  # checkpoints hold plain numbers only
            if isinstance(v, (bool, int, np.integer)):
                return int(v)
            return round(float(v), 6) if isinstance(v, (float, np.floating, torch.Tensor)) else str(v)

        row = {"round": round_, **{k: plain(v) for k, v in metrics.items()},
               "seconds": round(self.elapsed, 3), "sec_per_round": round(per_round, 4),
               "mb_down": round(self.bytes_down / 2 ** 20, 3), "mb_up": round(self.bytes_up / 2 ** 20, 3),
               "host_mb": round(current_host_mb(), 1)}
        if self.device.type == "cuda":
            row["device_mb"] = round(torch.cuda.memory_allocated(self.device) / 2 ** 20, 1)
        self.rows.append(row)
        self._write_metrics()
        mean = self.elapsed / round_  # over every round of the run, a long first or initial-stage round included
        eta = duration(mean * (self.args.rounds - round_))
        took = f"{per_round:.3f} s this round" if rounds == 1 else \
            f"{per_round:.3f} s/round over rounds {first}-{round_}"
        extra = f" (client mean {metrics['test_acc_mean']:.2f} ± {metrics['test_acc_std']:.2f})" \
            if "test_acc_mean" in metrics else ""
        loss = f" | train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        if "global_acc" in metrics:  # --test-split global: the uniform test set
            extra += f" | global test acc {metrics['global_acc']:.2f}%"
        self._end_progress()
        print(f"[{self.algo}] round {round_}/{self.args.rounds} | test acc {metrics.get('test_acc', float('nan')):.2f}%"
              f"{extra}{loss} | {took}, mean {mean:.3f} s/round | ETA {eta}", flush=True)

    def _write_metrics(self):
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        with_header = [keys] + [[r.get(k, "") for k in keys] for r in self.rows]
        text = "".join(",".join(map(str, r)) + "\n" for r in with_header)
        self._write("metrics.csv", text)

    # -- checkpoints, stopping and resuming

    def stop_requested(self, round_):
        """After a Ctrl-C, or at ``--stop-after``; never after the last round: a run whose rounds are all done
        ends as finished (summary.json), however it was asked to stop."""
        if round_ >= self.args.rounds:
            return False
        return bool(self.interrupted) or (self.args.stop_after is not None and round_ >= self.args.stop_after)

    def checkpoint(self, round_, state, rng):
        """Every ``--checkpoint-every`` rounds, at the last round and before a requested stop (a signal,
        ``--stop-after``, so that the --resume command stop() prints works): the algorithm ``state`` (modules and
        objects by state_dict, tensors as they are), every RNG state and the metrics so far."""
        self._latest = (round_, state, rng)  # for stop(), should a signal come after this call
        if round_ % self.args.checkpoint_every == 0 or round_ == self.args.rounds or self.stop_requested(round_):
            self._save_checkpoint(round_, state, rng)

    def _save_checkpoint(self, round_, state, rng):
        blob = {"algorithm": self.algo, "round": round_, "rows": self.rows, "args": self._fixed_args(),
                "bytes": [self.bytes_down, self.bytes_up],
                "elapsed": self.elapsed + clock() - self._t_last,
                "state": {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()},
                "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()}
        # no CUDA RNG state: nothing draws from a CUDA generator (models are initialised on the CPU,
        # every other draw has its own CPU generator), and a checkpoint must resume where fewer GPUs
        # or none are seen, without calling into CUDA on a CPU run
        self._write("checkpoint.pt", _torch_save(blob))
        self.checkpoint_round = round_

    def stop(self, round_):
        """Report a requested stop after ``round_`` (once its checkpoint is written) and return the exit status."""
        command = f"python {self.program} --resume {self.dir}"
        if self.interrupted:
            if self.checkpoint_round != round_ and self._latest and self._latest[0] == round_:
                self._save_checkpoint(*self._latest)  # the signal came after this round's checkpoint() call
            self.stopping = True  # a further signal has nothing left to stop
            if not self._checkpoint_there():
                _say(f"{stopped_by(self.interrupted)} after round {round_}; {self._checkpoint_gone()}")
            elif self.interrupted == signal.SIGINT:
                _say(f"interrupted after round {round_}; continue with: {command}")
            else:
                _say(f"stopped by {_signal_name(self.interrupted)} after round {round_}, whose checkpoint is in "
                     f"{os.path.join(self.dir, 'checkpoint.pt')}; continue with: {command}")
            return 128 + self.interrupted
        self._end_progress()
        print(f"[{self.algo}] stopping after round {round_} (--stop-after); continue with: {command}")
        self.close()
        sys.exit(0)  # as if killed here

    def _records_as(self):
        """The script whose flags this run records (flower/app.py runs the algorithm's script)."""
        return self.algo if self.script == "flower_app" else self.script

    def _fixed_args(self):
        """The settings a checkpoint belongs to: every flag that changes results, --rounds aside."""
        recorded = recorded_args(self.args, self._records_as())
        return {k: v for k, v in sorted(recorded.items()) if k not in RESUME_MAY_CHANGE}

    def resume(self, state, rng):
        """With ``--resume``: load the checkpoint into ``state`` in place (modules and objects by load_state_dict,
        tensors by copy) and into ``rng``, and return the first round to run; else return 1. Only tensors and plain
        containers are read (weights_only): a crafted file cannot run code."""
        if not self.args.resume:
            return 1
        path = os.path.join(self.dir, "checkpoint.pt")
        if not check_regular(path):
            raise UserError(f"cannot resume: {self.dir} has no checkpoint.pt (the run stopped before its first "
                            "checkpoint; start it again)")
        try:
            blob = torch.load(path, map_location=self.device, weights_only=True)
        except Exception as e:  # noqa: BLE001  anything wrong with the file is the same answer
            message = shortened(str(e).splitlines()[0], 150) if str(e) else e.__class__.__name__
            raise UserError(f"cannot resume: {quoted(path)} is not a valid checkpoint of this run ({message})")
        check_checkpoint(blob, path, self.args.eval_every)
        try:
            blob["state"] = todays_state(blob["state"])
            if set(blob["state"]) != set(state) or blob["algorithm"] != self.algo:
                raise ValueError("it holds another algorithm's state")
            fixed = self._fixed_args()
            added = {k: v for k, v in ADDED_FLAGS.items() if k in fixed}  # this script's flags only
            saved = todays_form({**added, **blob["args"]}) if "args" in blob else fixed  # before 2026-11: none
            if "args" in blob and "threads" not in blob["args"]:  # written before --threads: config.json holds
                saved["threads"] = fixed.get("threads")            # the count (tools/record_threads.py) or none
            if moved_dataset(saved.get("dataset"), fixed.get("dataset")):
                saved["dataset"] = fixed["dataset"]  # the data moved; _check_data compared its fingerprint
            if saved != fixed:
                differ = [k for k in fixed if saved.get(k) != fixed[k]]
                raise ValueError(f"it was written by a run with other settings: {', '.join(differ) or 'other flags'}")
            tensors = [v for x in blob["state"].values() for v in (x.values() if isinstance(x, dict) else [x])
                       if isinstance(v, torch.Tensor) and v.is_floating_point()]
            if not all(bool(torch.isfinite(t).all()) for t in tensors):
                raise ValueError("it holds non-finite weights")
            for k, v in blob["state"].items():
                if hasattr(state[k], "load_state_dict"):
                    state[k].load_state_dict(v)
                elif isinstance(state[k], torch.Tensor) and isinstance(v, torch.Tensor) and v.shape == state[k].shape:
                    state[k].copy_(v)
                else:
                    raise ValueError(f"entry {k} does not fit this run")
            rows, (down, up), elapsed, round_ = list(blob["rows"]), blob["bytes"], float(blob["elapsed"]), blob["round"]
            rng.bit_generator.state = blob["rng"]
            torch.set_rng_state(blob["torch_rng"].cpu())  # older checkpoints' "cuda_rng" is not read (_save_checkpoint)
        except Exception as e:  # noqa: BLE001  anything wrong with the file is the same answer
            message = shortened(str(e).splitlines()[0], 150) if str(e) else e.__class__.__name__
            raise UserError(f"cannot resume: {path} is not a valid checkpoint of this run ({message})")
        if round_ > self.args.rounds:
            raise UserError(f"cannot resume: the run already has {round_} rounds; --rounds {self.args.rounds} "
                            f"must be at least that")
        if self.args.stop_after is not None and round_ >= self.args.stop_after:  # nothing to train up to round N
            raise UserError(stop_after_refusal(self.dir, self.args.stop_after, round_))
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = rows, int(down), int(up), elapsed
        self._last_round = self.checkpoint_round = self._round_now = round_
        config = read_config(os.path.join(self.dir, "config.json"))
        note = ""
        if "data_sha256" not in config:  # a run from before the fingerprint: checked from this resume on
            config["data_sha256"], note = self.data_sha256, " (its config.json had no data fingerprint: now recorded)"
        moved = continued_elsewhere(config, round_, self.device)
        if moved:
            config, place = moved, moved["continued_on"][-1]
            name = place["device_name"] if place["device"].startswith("cuda") else place["cpu_model"]
            note += f"; from round {round_ + 1} on {name} ({place['device']}), recorded in config.json"
        if config["args"]["dataset"] != self.args.dataset:  # data that moved: later resumes read them there
            config["args"]["dataset"] = self.args.dataset
            note += f"; its dataset is now read from {self.args.dataset}, recorded in config.json"
        if config["args"]["rounds"] != self.args.rounds or note:
            config["args"]["rounds"] = self.args.rounds
            self._write("config.json", _json(config))
        self._write_metrics()  # drop rows logged after the checkpoint: they will be recomputed
        print(f"[{self.algo}] resumed {self.dir} after round {round_}{note}")
        return round_ + 1

    def summary(self, extra=None, status="finished"):
        """best, final and last-10 mean of every accuracy column, and which the paper reports (headline_metric)."""
        summary = {"algorithm": self.algo, "status": status, "rounds": self.args.rounds,
                   "rounds_done": self.rows[-1]["round"] if self.rows else 0,
                   "headline_metric": self.headline_metric, "paper_reports": self.headline,
                   "seconds": round(self.elapsed, 2), "mb_down": self.bytes_down / 2 ** 20,
                   "mb_up": self.bytes_up / 2 ** 20,
                   "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KB
                   "peak_device_mb": (torch.cuda.max_memory_allocated(self.device) / 2 ** 20
                                      if self.device.type == "cuda" else None), **(extra or {})}
        if self.rows:  # the rounds last10_mean covers: fewer than 10 in a shorter run
            summary["last10_mean_rounds"] = [self.rows[-10:][0]["round"], self.rows[-1]["round"]]
        for key in [k for k in self.rows[0] if "acc" in k and not k.endswith("_std")] if self.rows else []:
            summary[key] = summarise([float(r[key]) for r in self.rows if r.get(key, "") != ""])
        self._write("summary.json", _json(summary))
        return summary

    def finish(self, extra=None):
        """Write summary.json and print it."""
        summary = self.summary(extra)
        self.finished = True
        self._end_progress()
        print(f"[{self.algo}] summary ({self.headline} is what the paper reports):")
        first, last = summary.get("last10_mean_rounds", (0, 0))
        mean_of = "last-10 mean" if len(self.rows) >= 10 else f"mean of rounds {first}-{last}"
        for key, v in summary.items():
            if isinstance(v, dict) and {"best", "final", "last10_mean"} <= set(v):
                print(f"  {key:>22s}: best {v['best']:.2f}  final {v['final']:.2f}  "
                      f"{mean_of} {v['last10_mean']:.2f}")
        print(f"  {self.elapsed:.1f} s, {summary['mb_down']:.1f} MB down, {summary['mb_up']:.1f} MB up; "
              f"files in {self.dir}")
        return summary

    def interrupted_line(self, signum=signal.SIGINT):
        """What a signal that stops at once (a second one, in the middle of a round) leaves behind, in one line."""
        what = stopped_by(signum)
        command = f"python {self.program} --resume {self.dir}"
        if self.checkpoint_round and not self._checkpoint_there():
            return f"{what}; {self._checkpoint_gone()}"
        if self.checkpoint_round:
            return f"{what}; the checkpoint of round {self.checkpoint_round} is kept; continue with: {command}"
        if self.args.resume and self.dir:
            return f"{what} before the run continued; {self.dir} is as it was; continue with: {command}"
        if self.rows:
            return (f"{what} before the first checkpoint (--checkpoint-every {self.args.checkpoint_every}); "
                    f"{self.dir}/metrics.csv keeps rounds up to {self.rows[-1]['round']}; nothing to resume")
        return f"{what} before the first round; nothing was kept"

    def close(self, failed=False, diverged=False):
        """Release the folder: a new run that failed before any result leaves nothing behind (nor the --out folders it
        made); one with results keeps them (a diverged one says so in summary.json). Never raises: it runs on every
        way out."""
        if self not in OPEN_RUNS:
            return
        OPEN_RUNS.remove(self)
        if not self.interrupted:  # after a signal run_main ignores further ones until the process ends
            restore_signals(self._previous_handlers)
        if self.dir is None:
            return
        if failed and not diverged and self.created and \
                not any(os.path.lexists(os.path.join(self.dir, name)) for name in ("metrics.csv", "checkpoint.pt")):
            shutil.rmtree(self.dir, ignore_errors=True)
            _remove_empty_folders(self._made)
            return
        if diverged and not self.finished:
            with contextlib.suppress(OSError):  # a full disk: the metrics so far are what is left
                self.summary(status="diverged")
        if self.lock:
            with contextlib.suppress(OSError):  # a folder made read-only: the lock names a process that has
                os.remove(self.lock)            # ended, and the next run on the folder takes it over


@atexit.register
def _release_on_exit():
    for run in list(OPEN_RUNS):
        run.close()
