"""What tools/ read of run folders beyond what a run itself needs: the field-by-field checks of config.json,
checkpoint.pt and tools/reproduce.py's reproduce.json (one line naming the file and the field), the older forms of
runs (flags added, removed or moved to tools/ since; values and checkpoint keys in an older form) and how they read
today, whether a run folder is in use, and several files written all or nothing.

    python tools/run_records.py RUN_DIR              # what is wrong with a run folder, field by field
    python tools/run_records.py --upgrade RUN_DIR    # bring a run folder of an older form to today's

The scripts refuse a run folder of an older form in one line that names the second command.
"""
import argparse
import contextlib
import json
import os
import re
import shlex
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root: run_folder

import filelock  # noqa: E402
import torch  # noqa: E402

from common import MAX_THREADS  # noqa: E402  (--threads)
from run_folder import RESUME_MAY_CHANGE, UserError, check_regular, dumps, quoted, shortened  # noqa: E402

PID_MAX = 2 ** 22  # the largest pid Linux gives
RUN_JSON_MAX_BYTES = 64 * 2 ** 20  # a run's config.json or summary.json is a few KB; more is not read

# flags added after run folders were made, with the value that runs made before them ran with: their
# config.json and checkpoint lack the flag (--deterministic changes GPU results, so it may not change)
ADDED_FLAGS = {"deterministic": "off",  # before the flag, torch's own settings
               "dominant_share": 0.8, "local_training": False, "eval_local_models": False,
               "agnews_vocab": "train",  # AG News runs before the flag built the vocabulary from train texts
               "fedavg": False,  # fedacd.py before --fedavg: FedACD
               "log_risk": True, "log_kl": True,  # fedacd.py logged both at every evaluation before the flags
               "aggregation": "chunked",  # fedpake.py before the flag: chunks of 2^20 values (docs/fedpake.md)
               "threads": None}  # not recorded before the flag: --upgrade asks for the count it ran with
# flags removed from every script: flag -> (the value that runs today repeat, where what the flag did went). Runs
# made before record the flag in config.json: one made with that value resumes, is rechecked and compares as if the
# flag had never been (--upgrade drops it); one made with another value is refused in one line (by --upgrade too:
# today's code cannot continue it)
REMOVED_FLAGS = {"clients_together": (False, "its stacked local SGD is the piece tools/together.py, which no script "
                                             "runs (docs/speed.md, \"Clients together\")")}


# flags that left a script for a program of tools/ (one mode per script): program -> (the script, its flags). A
# run made with one of them set (config.json keeps the command as run) continues, and its command runs, there
# with the same flags (docs/running.md)
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


def todays_command(command):
    """A command as config.json keeps it (program, flags) as it runs today: a script given a flag that moved to tools/
    (MOVED) is that program (fedavg.py --local-training ... is tools/fedavg_variants.py --local-training ...)."""
    folder, name = os.path.split(command[0])
    for program, (moved_from, flags) in MOVED.items():
        if name == f"{moved_from}.py" and any(f"--{f.replace('_', '-')}" in command[1:] for f in flags):
            return [os.path.join(folder, f"{program}.py"), *command[1:]]
    return list(command)


def program_of(script, args):
    """The program (no .py) that runs today what ``script`` ran with the settings ``args`` (config.json's, with the
    moved flags a run predates at their ADDED_FLAGS value: moved_flags)."""
    return next((program for program, (moved_from, flags) in MOVED.items()
                 if moved_from == script and any(args.get(f) for f in flags)), script)


def moved_flags(script, args):
    """``args`` with the flags of ``script`` that moved to tools/ (MOVED) that a run predates at the value it ran with
    (ADDED_FLAGS): only where it records one of them, as every run made while they were the script's does (the
    scripts recorded them off). A run that records none of them is of today's form (the script has no such flag)."""
    filled = dict(args)
    for moved_from, flags in MOVED.values():
        if moved_from == script and any(f in args for f in flags):
            filled.update({f: ADDED_FLAGS.get(f, False) for f in flags if f not in args})
    return filled


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
            mask = os.umask(0o022)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
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



def checkpoint_round(folder):
    """The round of ``folder``'s checkpoint.pt, read without loading its tensors (mmap); None if it cannot say
    (Run.resume then reads and checks the file in full)."""
    try:
        blob = torch.load(os.path.join(folder, "checkpoint.pt"), map_location="cpu", weights_only=True, mmap=True)
        return blob["round"] if isinstance(blob, dict) and isinstance(blob.get("round"), int) else None
    except Exception:  # noqa: BLE001  a damaged file: Run.resume says so
        return None


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
    """The pid of the process that holds ``folder``'s run lock (run_folder.Run.take_lock), else None."""
    path = os.path.join(folder, ".lock")
    if not os.path.isfile(path):
        return None
    try:
        filelock.FileLock(path, timeout=0).acquire().lock.release()
        return None
    except filelock.Timeout:
        with contextlib.suppress(OSError), open(path) as f:
            return lock_owner(f.read(256))[0] or -1
        return -1
    except OSError:
        return None


# the script of a run whose config.json names none (made before the field), by its algorithm's name
SCRIPT_OF_ALGORITHM = {"heurpfedla": "pfedla", "local": "fedavg", "fedacd-fedavg": "fedacd"}


def script_of(config):
    """The program (no .py) whose flags a run's config.json holds: its "script", flower/app.py's algorithm for a
    Flower run, else its algorithm's script."""
    script = config.get("script")
    if script == "flower_app":
        flower = config.get("flower")
        script = flower.get("algorithm") if isinstance(flower, dict) else None
        script = script or config["algorithm"]
    return SCRIPT_OF_ALGORITHM.get(script or config["algorithm"], script or config["algorithm"])


def todays_defaults(program, args):
    """The flags of ``program`` today with their defaults (its parse_args on synthetic data): which flags exist,
    and the values a run's data read needs where its config.json lacks them."""
    import importlib
    try:
        module = importlib.import_module(program.replace("/", "."))
    except ImportError:
        raise UserError(f"cannot upgrade: {program}.py is no program of this repository") from None
    probe = [f"--{f.replace('_', '-')}" for f in MOVED.get(program, (None, ()))[1] if args.get(f)][:1]
    with tempfile.TemporaryDirectory() as out:  # a program of MOVED runs with one of its flags
        return vars(module.parse_args(["--dataset", "synthetic", "--out", out, *probe]))


def upgrade(folder, threads=None):
    """Bring a run folder of an older form to today's: config.json's args with the flags added since (the value
    the run ran with, ADDED_FLAGS), values in today's form (OLDER_FORM), removed flags at the value runs repeat
    today dropped (another value is refused: today's code cannot continue that run), a moved flag's program as its
    script and its command (todays_command), the data's fingerprint where it lacks one; checkpoint.pt's state keys
    (RENAMED_STATE) and settings likewise. Refused while a run holds the folder. Both files are written all or
    nothing (atomic_write_all). Returns what changed; nothing when the folder is of today's form already."""
    import io

    import common
    import run_folder
    if not os.path.isdir(folder):
        raise UserError(f"cannot upgrade: {quoted(folder)} is not a folder")
    if lock_holder(folder) is not None:
        raise UserError(f"cannot upgrade: {quoted(folder)} is in use by a run; wait for it to end")
    path = os.path.join(folder, "config.json")
    config = read_config(path, doing="cannot upgrade")
    args, changed = todays_form(config["args"]), []
    for dest, (value, where) in REMOVED_FLAGS.items():
        if dest in args and args.pop(dest) != value:
            raise UserError(f"cannot upgrade {quoted(folder)}: it was made with --{dest.replace('_', '-')} "
                            f"{config['args'][dest]}, since removed ({where}); today's code cannot continue it")
    args = moved_flags(script_of(config), args)
    program = program_of(script_of(config), args)
    today = todays_defaults(program, args)
    args.update({k: v for k, v in ADDED_FLAGS.items() if k in today and k not in args})
    if args.get("threads") is None:
        if threads is None:
            raise UserError(f"cannot upgrade {quoted(folder)}: its config.json records no thread count; give "
                            "--threads N, the count it was made with (OMP_NUM_THREADS, or the cores)")
        args["threads"] = threads
    if args != config["args"]:
        changed.append("config.json args")
    upgraded = {**config, "args": args}
    if config.get("script") != "flower_app" and config.get("script") != program:  # Flower's runs stay Flower's
        upgraded["script"] = program
        changed.append(f"script {program}")
    if isinstance(config.get("command"), list) and config["command"]:
        command = todays_command(config["command"])
        if command != config["command"]:
            upgraded["command"], upgraded["command_line"] = command, shlex.join(["python", *command])
            changed.append(f"command {command[0]}")
    if "data_sha256" not in config:
        data = common.load_federated_data(argparse.Namespace(**{**today, **args}), torch.device("cpu"))
        upgraded["data_sha256"] = run_folder.data_fingerprint(data)
        changed.append("data_sha256")
    contents = {}
    checkpoint = os.path.join(folder, "checkpoint.pt")
    if check_regular(checkpoint, "cannot upgrade"):
        try:
            blob = torch.load(checkpoint, map_location="cpu", weights_only=True)
            state, recorded = todays_state(blob["state"]), dict(blob.get("args") or {})
        except Exception as e:  # noqa: BLE001  a damaged file: one line, nothing changed
            raise UserError(f"cannot upgrade: {quoted(checkpoint)} cannot be read as a checkpoint "
                            f"({shortened((str(e).splitlines() or [type(e).__name__])[0], 100)})") from None
        for dest, (value, where) in REMOVED_FLAGS.items():
            if dest in recorded and recorded.pop(dest) != value:
                raise UserError(f"cannot upgrade {quoted(folder)}: its checkpoint was made with "
                                f"--{dest.replace('_', '-')}, since removed ({where}); today's code cannot continue it")
        saved = todays_form({**{k: v for k, v in ADDED_FLAGS.items() if k in today}, **recorded})
        fixed = {k: v for k, v in args.items() if k not in RESUME_MAY_CHANGE}
        saved = {**{k: fixed[k] for k in fixed if k not in saved}, **saved, "threads": args["threads"]}
        if state != blob["state"] or saved != blob.get("args"):
            out = io.BytesIO()
            torch.save({**blob, "state": state, "args": saved}, out)
            contents[checkpoint] = out.getvalue()
            changed.append("checkpoint.pt")
    if changed:
        contents[path] = dumps(upgraded)
        atomic_write_all(contents)  # both or neither: the checkpoint with the config.json it belongs to
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run folder (config.json, checkpoint.pt, ...)")
    parser.add_argument("--upgrade", action="store_true", help="bring it to today's form")
    parser.add_argument("--threads", type=int, help="with --upgrade: the thread count a run that recorded none "
                        "was made with")
    args = parser.parse_args(argv)
    try:
        if args.upgrade:
            changed = upgrade(args.run_dir, args.threads)
            print(f"{args.run_dir}: {'upgraded: ' + ', '.join(changed) if changed else 'already in today' + chr(39) + 's form'}")
            return 0
        config = read_config(os.path.join(args.run_dir, "config.json"), doing="damaged")
        checkpoint = os.path.join(args.run_dir, "checkpoint.pt")
        if check_regular(checkpoint, "damaged"):
            check_checkpoint(torch.load(checkpoint, map_location="cpu", weights_only=True), checkpoint,
                             config["args"].get("eval_every", 1), doing="damaged")
        print(f"{args.run_dir}: config.json{' and checkpoint.pt' if os.path.exists(checkpoint) else ''} hold "
              "every field in the form this version reads")
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a folder not writable: one line naming the file, every file as it was
        print(f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
