"""Compare finished (or unfinished) runs: one table, optionally a plot.

    python tools/compare.py runs/                          # every run folder under runs/
    python tools/compare.py runs/a runs/b --metric test_loss --plot curves.png

Each PATH is a run folder (it holds metrics.csv or config.json) or a folder searched
recursively for run folders. Finished runs whose settings are equal except for the seed
are grouped into one row showing mean ± std (sample std, n-1) over seeds; unfinished,
diverged, older-format, unreadable and damaged runs get a row of their own and a status saying
so (damaged: a file that cannot be read or is not a regular file, or metrics.csv lines that are
cut off or malformed, from which no number is taken). By default each row uses its algorithm's
headline metric, as its summary.json names it.
"""
import argparse
import calendar
import contextlib
import csv
import errno
import json
import math
import os
import re
import stat
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root: run_folder by name
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

# Flags that cannot change results: runs differing only in these (and the seed) are grouped.
NO_EFFECT = {"seed", "out", "resume", "device", "data_dir", "parallel_clients", "stop_after",
             "eval_every", "checkpoint_every"}
# tools/run_records.REMOVED_FLAGS's flags with the value that runs today repeat: a run that recorded it is grouped with
# the runs made since, which record no such flag (tests/test_compare.py checks the two agree)
REMOVED_FLAGS = {"clients_together": False}
# metrics.csv columns that are bookkeeping, not metrics.
BOOKKEEPING = {"round", "seconds", "sec_per_round", "mb_down", "mb_up", "host_mb", "device_mb"}
SHOWN = {"algorithm", "dataset", "partition", "num_clients", "rounds"}  # already their own columns
# common.PARTITION_FLAGS: the flags of the label partition, which synthetic data (generated per client) does
# not use; as settings of a synthetic run they change nothing (tests/test_compare.py checks the two agree)
PARTITION_FLAGS = ("partition", "beta", "classes_per_client", "balance", "samples_per_client", "dominant_share")
OLD_NAME = re.compile(r"^([^-]+)-(.+)-s(\d+)(?:-.*)?$")  # <algo>-<dataset>-s<seed>-<time>


def one_line(text, markdown=False):
    """The one escaping of every value written into a line of a message or a row of a table: each newline or
    other control character written as Python writes it in a string (\\n, \\x00), so that no value can end a
    line or a row and begin another. ``markdown``, for a cell of a markdown table: a backslash doubled first
    (markdown's escape, which shows it as one) and '|' written '\\|', so that no value ends the cell or adds
    one, and what a reader sees is the value itself."""
    if markdown:
        text = str(text).replace("\\", "\\\\")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text.replace("|", "\\|") if markdown else text


def fail(message):
    """Report bad input as one line on stderr and exit with status 2 (a newline or control character
    in a name is written escaped: the line stays one)."""
    say(f"error: {one_line(message)}")
    sys.exit(2)


def say(line):
    """One line on stderr; a stderr that is closed or cannot be written loses it and nothing raises."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stderr is None (closed)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class OutputLost(Exception):
    """Standard output cannot be written: closed (``>&-``), a full disk (``> /dev/full``), a pipe whose reader
    is gone (``| head``: ``quiet``). Not an OSError, so that no handler of a file's OSError takes it for one."""

    def __init__(self, why, quiet=False):
        super().__init__(why)
        self.quiet = quiet


def show(text=""):
    """Print ``text`` and a newline on standard output, flushed: the one way tools/compare.py and
    tools/reproduce.py print their tables, reports and lines. A standard output that cannot take it raises
    OutputLost saying why (its file descriptor then goes to /dev/null, so that nothing printed later, nor
    Python's flush at exit, fails again); the program's ``__main__`` ends with one line (ends_without_output)."""
    try:
        if sys.stdout is None:  # closed when Python started
            raise OSError(errno.EBADF, "it is closed")
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError) as e:  # ValueError: a stream closed since, or an encoding without a character
        if isinstance(e, UnicodeEncodeError):
            why = f"its encoding, {e.encoding}, has no {e.object[e.start:e.end]!r}"
        else:
            why = e.strerror or str(e) if isinstance(e, OSError) and e.errno != errno.EBADF else "it is closed"
        lost = OutputLost(why, quiet=isinstance(e, BrokenPipeError))
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # no file descriptor of its own to take over
            sys.stdout = open(os.devnull, "w")
        finally:
            os.close(null)
        raise lost from None


def ends_without_output(lost):
    """The end of a program whose standard output was lost (OutputLost): one line on stderr naming it (none for
    a pipe whose reader is gone, as ``| head``), exit status 1."""
    if not lost.quiet:
        say(f"error: cannot write to standard output ({lost})")
    sys.exit(1)


def lower_is_better(metric):
    return "loss" in metric or "risk" in metric


def to_float(text):
    """A csv cell as a float ('nan' and 'inf' included), or None for an empty or bad cell."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def why(error):
    """An OSError in a few words: 'permission denied'."""
    return (error.strerror or str(error)).lower()


NOT_REGULAR = ((stat.S_ISDIR, "is a folder"), (stat.S_ISFIFO, "is a named pipe"), (stat.S_ISSOCK, "is a socket"),
               (stat.S_ISCHR, "is a device"), (stat.S_ISBLK, "is a device"))


# the most of one file of a run folder that is read: metrics.csv of 100,000 evaluations is about 20 MB
MAX_RUN_FILE_BYTES = 256 * 2 ** 20


def too_large(size):
    return f"is {size / 2 ** 20:.0f} MB, more than the {MAX_RUN_FILE_BYTES // 2 ** 20} MB a run's file may be"


def read_text(path):
    """(text, None) for a readable regular file; (None, None) if absent; (None, problem), e.g.
    'is a folder' or 'cannot be read (permission denied)'. Anything but a regular file is never
    read (a named pipe would block), and this never raises. Text that is not UTF-8 is 'unreadable'."""
    data, problem = read_bytes(path)
    if data is None:
        return None, problem
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "unreadable"


def read_bytes(path):
    """read_text's (content, problem), the content as bytes, not decoded."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None, ("is a broken link" if os.path.islink(path) else None)
    except OSError as e:
        return None, f"cannot be read ({why(e)})"
    for is_kind, problem in NOT_REGULAR:
        if is_kind(info.st_mode):
            return None, problem
    if not stat.S_ISREG(info.st_mode):
        return None, "is not a regular file"
    if info.st_size > MAX_RUN_FILE_BYTES:
        return None, too_large(info.st_size)
    try:  # O_NONBLOCK: should a named pipe take the file's place after the stat, opening it does not wait
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, "is not a regular file"
            data = f.read(MAX_RUN_FILE_BYTES + 1)  # no more than was checked, should it grow meanwhile
            if len(data) > MAX_RUN_FILE_BYTES:
                return None, too_large(len(data))
    except OSError as e:
        return None, f"cannot be read ({why(e)})"
    return data, None


def read_json(path):
    """(dict, None) for a readable JSON object; (None, None) if absent; (None, 'unreadable') if
    the file's text is not a JSON object; (None, problem) if it is not a regular file or cannot be
    read (read_text's problem, e.g. 'is a named pipe')."""
    text, problem = read_text(path)
    if text is None:
        return None, problem
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to be a run's
        return None, "unreadable"
    return (data, None) if isinstance(data, dict) else (None, "unreadable")


def read_metrics(path):
    """metrics.csv as (columns, {column: [(round, value), ...]}, problem): columns and series are
    None if the file is missing, unreadable or has no good row; problem is None, 'unreadable' or
    what is damaged (read_text's problem, or the first bad line, e.g. 'line 7 cut off'). A bad line
    is left out whole: one cut off (the last line, shorter than the header), with more or fewer
    cells than the header, a cell that is not a number, a round that is not a whole number, a
    round that repeats one before it or comes after a later one (rows duplicated or reversed),
    or bookkeeping (seconds, MB) that is nan or inf. Empty cells (a metric not evaluated that
    round) are no damage; a metric's nan and inf are numbers (a diverged run)."""
    data, problem = read_bytes(path)
    if data is None:
        return None, None, problem
    lines = [csv_cells(line) for line in data.split(b"\n")]  # a line that cannot be read spoils that line only
    header = lines[0] if lines and isinstance(lines[0], list) else []
    if "round" not in header:
        return None, None, "unreadable"
    series = {c: [] for c in header if c}
    last = max(n for n, cells in enumerate(lines, 1) if cells)
    bad = []  # (line number, what is wrong)
    for number, cells in enumerate(lines[1:], 2):
        if isinstance(cells, str):
            bad.append((number, cells))
            continue
        if not cells:
            continue  # a blank line holds nothing
        wrong = bad_line(header, cells, last=number == last)
        if wrong:
            bad.append((number, wrong))
            continue
        round_ = int(float(cells[header.index("round")]))
        if series["round"] and round_ <= series["round"][-1][0]:
            before = series["round"][-1][0]
            bad.append((number, f"repeats round {round_}" if any(r == round_ for r, _ in series["round"])
                        else f"has round {round_} after round {before}"))
            continue
        for c, cell in zip(header, cells):
            if c and cell.strip():
                series[c].append((round_, float(cell)))
    if bad:
        problem = f"line {bad[0][0]} {bad[0][1]}" + (f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else "")
    if not series["round"]:
        return None, None, problem or "unreadable"
    return [c for c in header if c], series, problem


def csv_cells(line):
    """The cells of one line (bytes) of a csv file, or the words (a str) for why it cannot be read: not
    UTF-8, a cell longer than csv's field limit, a quote that never closes; that line is damaged, not the
    file."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    try:
        return next(csv.reader([text.rstrip("\r")]), [])
    except csv.Error as e:
        return f"cannot be read as csv ({e})"


def bad_line(header, cells, last):
    """What is wrong with one metrics.csv line (a list of cells), or None; the last line of the
    file that is short or has a cell that is not a number was cut off. Bookkeeping (seconds, MB)
    must be finite."""
    round_ = to_float(cells[header.index("round")]) if len(cells) > header.index("round") else None
    if len(cells) != len(header):
        wrong = f"has {len(cells)} cells, the header {len(header)}"
    elif round_ is None or not math.isfinite(round_) or round_ != int(round_):
        wrong = f"has round {cells[header.index('round')]!r}, not a whole number"
    else:
        wrong = next((f"has {c} {cell!r}, not a number" for c, cell in zip(header, cells)
                      if cell.strip() and to_float(cell) is None), None)
    if wrong:
        return "cut off" if last and len(cells) <= len(header) else wrong
    return next((f"has {c} {cell!r}, not a finite number" for c, cell in zip(header, cells)
                 if c in BOOKKEEPING and cell.strip() and not math.isfinite(to_float(cell))), None)


def find_runs(paths):
    """Every run folder at or under the given paths, sorted and each once (a folder given twice,
    or a folder and one of its runs, counts each run once): folders with an entry named
    metrics.csv or config.json (whatever it is), and folders that cannot be read (load_run
    reports them as damaged rather than leave them out). A path with no run folder is bad input."""
    found = set()
    here = set()  # the run folders found under the path being walked

    def unreadable(error):  # os.walk could not list this folder
        here.add(os.path.realpath(error.filename))

    for path in paths:
        if not os.path.exists(path):
            fail(f"no such path: {path}")
        if not os.path.isdir(path):
            fail(f"not a folder: {path}")
        here.clear()
        seen = set()  # symlinked folders are followed, each real folder once (a link loop ends)
        for folder, subdirs, files in os.walk(path, onerror=unreadable, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:
                subdirs[:] = []
                continue
            seen.add(real)
            if {"metrics.csv", "config.json"} & set(files + subdirs):
                here.add(real)
                subdirs[:] = []  # a run folder holds no further runs
            subdirs.sort()
        if not here:
            fail(f"no run folder (with metrics.csv or config.json) in {path}")
        found |= here
    return sorted(found)


def load_run(folder):
    """Everything the table needs from one run folder, as a dict; never raises. ``damage`` lists
    what is damaged ('metrics.csv line 7 cut off', 'config.json is a named pipe'); the flags
    (the status) say it as one 'damaged: ...' entry."""
    run = {"folder": folder, "flags": [], "metrics": None, "columns": [], "config": False, "damage": []}
    try:
        os.listdir(folder)
        readable = True
    except OSError as e:
        run["damage"].append(f"the folder cannot be read ({why(e)})")
        readable = False
    config, config_err = read_json(os.path.join(folder, "config.json")) if readable else (None, None)
    summary, summary_err = read_json(os.path.join(folder, "summary.json")) if readable else (None, None)
    run["summary"] = summary or {}
    if config and isinstance(config.get("algorithm"), str) and isinstance(config.get("args"), dict):
        run["algorithm"], run["args"], run["config"] = config["algorithm"], config["args"], True
        run["config_headline"] = config.get("headline_metric")
        run["damage"] += config_problems(config)
    else:  # older format: what the folder name says
        m = OLD_NAME.match(os.path.basename(folder))
        run["algorithm"], dataset, seed = m.groups() if m else (os.path.basename(folder), "?", "?")
        run["args"] = {"dataset": dataset, "seed": int(seed) if seed.isdigit() else "?"}
        if config_err == "unreadable":
            run["flags"].append("unreadable config.json")
        elif config_err:
            run["damage"].append(f"config.json {config_err}")
        elif readable:
            run["flags"].append("older format")
    if summary_err == "unreadable":  # garbage where the run's summary should be: no number is taken on trust
        run["damage"].append("summary.json is not a JSON object (cut short or garbage)")
    elif summary_err:
        run["damage"].append(f"summary.json {summary_err}")
    elif summary is not None:
        run["damage"] += summary_problems(summary)
        if run["damage"]:
            run["summary"] = {}
    columns, series, metrics_err = read_metrics(os.path.join(folder, "metrics.csv")) if readable else (None, None, None)
    if metrics_err not in (None, "unreadable"):
        run["damage"].append(f"metrics.csv {metrics_err}")
    elif series is None and readable:
        run["flags"].append("unreadable metrics.csv")
    if series is not None:
        run["columns"], run["metrics"] = columns, series
    if run["config"] and on_folder(run["args"], config):  # its data does not depend on the seed: the fingerprint
        run["args"] = {**run["args"], "dataset": os.path.basename(os.path.normpath(str(run["args"]["dataset"]))),
                       "data": str(config.get("data_sha256", "unrecorded"))[:12]}  # tells the seeds' data apart
        run["folder_partition"] = config.get("dataset_folder") if isinstance(config.get("dataset_folder"), dict) \
            else {}
    planned = run["args"].get("rounds", run["summary"].get("rounds"))
    run["planned"] = planned if isinstance(planned, int) and not isinstance(planned, bool) else None
    run["started"] = start_order(folder, config)
    run["done"] = max((r for r, _ in run["metrics"]["round"]), default=0) if run["metrics"] else 0
    if series is not None and metrics_err is None:  # a metrics.csv with bad lines is damaged already
        run["damage"] += disagreements(run, config if run["config"] else None)
    if run["damage"]:
        run["flags"].insert(0, "damaged: " + "; ".join(run["damage"]))
    values = [v for c, pts in (run["metrics"] or {}).items() if c not in BOOKKEEPING for _, v in pts]
    if run["summary"].get("status") == "diverged" or any(not math.isfinite(v) for v in values):
        run["flags"].append("diverged")
    elif run["metrics"] and (not summary or (run["planned"] and run["done"] < run["planned"])):
        run["flags"].append(f"unfinished {run['done']}/{run['planned'] or '?'}")
    return run


FOLDER_TIME = re.compile(r"-(\d{8}-\d{6})(?:-\d+)?$")  # run_folder.Run.new_folder's name: ...-YYYYMMDD-HHMMSS[-N]


def start_order(folder, config=None):
    """The key that orders runs by when they started, the earliest first: the UTC time config.json recorded
    (``started_utc``, "YYYY-MM-DDTHH:MM:SSZ"), or for a run that recorded none (made before it was recorded,
    or the field damaged) the local time its folder's name ends in, read in this machine's time zone; runs
    that say neither come first. Ties go by folder name. Folder names keep local time for people, which
    goes back an hour when summer time ends: a name never orders runs by itself."""
    utc, seconds = config.get("started_utc") if isinstance(config, dict) else None, None
    with contextlib.suppress(ValueError, OverflowError, TypeError):
        seconds = calendar.timegm(time.strptime(utc, "%Y-%m-%dT%H:%M:%SZ"))
    named = FOLDER_TIME.search(os.path.basename(folder))
    if seconds is None and named:
        with contextlib.suppress(ValueError, OverflowError):
            seconds = time.mktime(time.strptime(named.group(1), "%Y%m%d-%H%M%S"))
    return (seconds is not None, seconds or 0, os.path.basename(folder), folder)


CONFIG_ARGS = {  # the flags of config.json's args that the table reads, and what each must be (run_folder's)
    "rounds": (lambda v: v >= 1, "an integer >= 1"), "seed": (lambda v: v >= 0, "an integer >= 0"),
    "num_clients": (lambda v: v >= 1, "an integer >= 1")}


def config_problems(config):
    """What in a run's config.json the scripts never write, as damage: a dataset that is no name, a number of
    rounds, seed or clients that is no whole number in range. [] when none."""
    problems, args = [], config["args"]
    if "dataset" in args and not (isinstance(args["dataset"], str) and args["dataset"]):
        problems.append(f"config.json has args.dataset {str(args['dataset'])[:40]!r}, not a name")
    for key, (in_range, what) in CONFIG_ARGS.items():
        value = args.get(key)
        if key in args and not (isinstance(value, int) and not isinstance(value, bool) and in_range(value)):
            problems.append(f"config.json has args.{key} {str(value)[:40]!r}, not {what}")
    return problems


SUMMARY_STATUSES = ("finished", "diverged")  # what run_folder.Run.summary writes


def summary_problems(summary):
    """What makes a summary.json that is a JSON object no run's summary: a status it never writes, rounds
    that are no whole numbers, a metric's numbers that are not numbers. [] when it is one."""
    problems = []
    if "status" in summary and summary["status"] not in SUMMARY_STATUSES:
        problems.append(f"summary.json has status {str(summary['status'])[:40]!r}")
    for key in ("rounds", "rounds_done"):
        value = summary.get(key)
        if key in summary and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            problems.append(f"summary.json has {key} {str(value)[:40]!r}, not a whole number")
    for column, numbers in summary.items():
        if isinstance(numbers, dict) and {"best", "final", "last10_mean"} <= set(numbers) and not all(
                isinstance(numbers[k], (int, float)) and not isinstance(numbers[k], bool)
                for k in ("best", "final", "last10_mean")):
            problems.append(f"summary.json has {str(column)[:40]} values that are not numbers")
    return problems


# the named datasets of datasets.py (VISION and LOADERS; tests/test_compare.py checks the two agree): any other
# --dataset but synthetic data and .npz files is a PFLlib dataset folder, whose clients do not depend on the seed
NAMED_DATASETS = ("mnist", "fmnist", "emnist", "cifar10", "cifar100", "tinyimagenet", "agnews")


def on_folder(args, config):
    """Whether a run read a PFLlib dataset folder: its config.json says so (dataset_folder), or (runs made
    before it did) its --dataset is no dataset's name, no synthetic data and no .npz file."""
    if isinstance(config.get("dataset_folder"), dict):
        return True
    dataset = args.get("dataset")
    return (isinstance(dataset, str) and dataset not in NAMED_DATASETS and not synthetic(args)
            and not dataset.lower().endswith(".npz"))


def summary_numbers(values, column):
    """best, final and mean of the last 10 of a metric's evaluations, as summary.json has them:
    run_folder.summarise's maximum (tests/test_compare.py checks that the two agree), the minimum
    for a loss or risk (fedacd.py's local_risk)."""
    values = np.asarray(values, dtype=float)
    return {"best": float(values.min() if lower_is_better(column) else values.max()), "final": float(values[-1]),
            "last10_mean": float(values[-10:].mean())}


def same_number(a, b):
    """Equal up to the rounding of a number written to a file (nan equals nan)."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return False
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def disagreements(run, config):
    """What in a run's files contradicts the rest, as damage: metrics.csv going past the rounds
    config.json plans, and summary.json against metrics.csv (the last round it names, each
    metric's best, final and last-10 mean recomputed from the rows up to that round, its
    algorithm and rounds). A summary.json of a shorter run that --resume --rounds extends names
    fewer rounds than config.json and is checked over the rows it saw."""
    problems, summary = [], run["summary"]
    rounds = [r for r, _ in run["metrics"]["round"]]
    planned = run["planned"]
    if config and planned and rounds[-1] > planned:
        problems.append(f"metrics.csv has round {rounds[-1]}, config.json plans {planned} rounds")
    if not summary:
        return problems
    if config and isinstance(summary.get("algorithm"), str) and summary["algorithm"] != run["algorithm"]:
        problems.append(f"summary.json is of {summary['algorithm']}, config.json of {run['algorithm']}")
    its_rounds = summary.get("rounds")
    if config and isinstance(its_rounds, int) and planned and its_rounds > planned:
        problems.append(f"summary.json has {its_rounds} rounds, config.json plans {planned}")
    done = summary.get("rounds_done")
    if isinstance(done, int) and not isinstance(done, bool):
        extended = isinstance(its_rounds, int) and planned and its_rounds < planned
        if done > rounds[-1]:
            problems.append(f"metrics.csv ends at round {rounds[-1]}, summary.json says {done} were done")
            return problems
        if done not in rounds:
            problems.append(f"metrics.csv has no round {done}, the last of summary.json")
            return problems
        if done < rounds[-1] and not extended:
            problems.append(f"metrics.csv goes on to round {rounds[-1]} after summary.json's last round {done}")
    else:
        done = rounds[-1]
    for column, numbers in summary.items():
        if not (isinstance(numbers, dict) and {"best", "final", "last10_mean"} <= set(numbers)):
            continue
        values = [v for r, v in run["metrics"].get(column, []) if r <= done]
        if not values:
            problems.append(f"summary.json has {column}, metrics.csv has no such column")
            continue
        ours = summary_numbers(values, column)
        key = next((k for k in ("best", "final", "last10_mean") if not same_number(numbers[k], ours[k])), None)
        if key:
            problems.append(f"summary.json has {column} {key} {numbers[key]!r}, metrics.csv {ours[key]:.6g}")
    return problems


# each algorithm's headline metric (the scripts' HEADLINE_METRIC, tests/test_compare.py checks): that of an unfinished
# run made before config.json recorded it
HEADLINE_METRICS = {"fedavg": "test_acc", "fedala": "test_acc", "pfedla": "test_acc_mean",
                    "heurpfedla": "test_acc_mean", "fedpake": "test_acc", "fedacd": "global_acc",
                    "fedacd-fedavg": "global_acc", "local": "test_acc_mean"}


def headline(run, by_algorithm):
    """The metric a run is judged by: summary's headline_metric, else the first metrics.csv column
    named in paper_reports; a run without summary.json (unfinished): config.json's headline_metric, else
    its algorithm's (HEADLINE_METRICS); else that of a finished run of the same algorithm, else test_acc."""
    s, columns = run["summary"], run["columns"]
    if s.get("headline_metric") in columns:
        return s["headline_metric"]
    for word in re.findall(r"\w+", str(s.get("paper_reports", ""))):
        if word in columns and word not in BOOKKEEPING:  # "... the best or final round": not the column round
            return word
    for metric in (run.get("config_headline"), HEADLINE_METRICS.get(run["algorithm"])):
        if metric in columns:
            return metric
    return by_algorithm.get(run["algorithm"], "test_acc")


def best_final(run, metric):
    """(best, round of best, final, [(round, value)...]) of a metric; best skips non-finite values."""
    points = (run["metrics"] or {}).get(metric, [])
    finite = [(r, v) for r, v in points if math.isfinite(v)]
    if not finite:
        return None, None, (points[-1][1] if points else None), points
    pick = min if lower_is_better(metric) else max
    best_round, best = pick(finite, key=lambda p: p[1])
    return best, best_round, points[-1][1], points


def last(run, column):
    points = (run["metrics"] or {}).get(column, [])
    return points[-1][1] if points else None


def synthetic(args):
    """Whether a run's data is generated per client (synthetic, synthetic(A,B), synthetic(iid)),
    so that no label partition applies."""
    dataset = str(args.get("dataset", ""))
    return dataset == "synthetic" or dataset.startswith("synthetic(")


def unused_flags(run):
    """The flags a run's data did not use: the partition flags for synthetic data (generated per client)
    and for a PFLlib folder (whose clients are taken as they are, with its own test split)."""
    if synthetic(run["args"]):
        return set(PARTITION_FLAGS)
    if "folder_partition" in run:
        return set(PARTITION_FLAGS) | set(FOLDER_RESPLIT_FLAGS)
    return set()


FOLDER_RESPLIT_FLAGS = ("train_ratio", "test_split")  # datasets.PFLLIB_RESPLIT_FLAGS (tests/test_compare.py)


def settings_of(run):
    """The args that can change a run's results: all but the seed, NO_EFFECT, a removed flag at the value runs
    repeat today (REMOVED_FLAGS) and the flags its data did not use (unused_flags); for a run on a folder, its
    folder's name and data fingerprint (load_run)."""
    ignored = NO_EFFECT | unused_flags(run)
    return {k: v for k, v in run["args"].items()
            if k not in ignored and not (k in REMOVED_FLAGS and v == REMOVED_FLAGS[k])}


def group_runs(runs, metric_of):
    """Rows of runs: finished runs of equal settings (settings_of, and the metric) share a row,
    each seed counted once: of two or more runs of one seed the group takes the one that started last
    (start_order: the time config.json recorded, not the folder's name) and each other one gets a row of its
    own flagged 'repeat of seed S, not averaged'. Every other run has a row of its own."""
    groups = {}
    for i, run in enumerate(runs):
        if run["flags"]:
            key = ("single", i)
        else:
            key = (run["algorithm"], metric_of[i], json.dumps(settings_of(run), sort_keys=True, default=str))
        groups.setdefault(key, []).append(i)
    seed = lambda i: runs[i]["args"].get("seed") if isinstance(runs[i]["args"].get("seed"), int) else -1
    for key, members in list(groups.items()):
        if key[0] == "single":
            continue
        last = {seed(i): i for i in sorted(members, key=lambda i: runs[i]["started"])}
        for i in members:
            if last[seed(i)] != i:
                runs[i]["flags"].append(f"repeat of seed {seed(i)}, not averaged")
                groups[("single", i)] = [i]
        groups[key] = sorted(last.values())
    rows = [sorted(members, key=lambda i: (seed(i), runs[i]["folder"])) for members in groups.values()]
    return sorted(rows, key=lambda m: (runs[m[0]]["algorithm"], str(runs[m[0]]["args"].get("dataset")),
                                       runs[m[0]]["folder"]))


def varying_settings(runs, rows):
    """Per row, 'k=v' for the args that differ between rows of the same algorithm (rows whose
    settings are known from config.json; for a run on a PFLlib folder, the rows on folders, whose
    data fingerprint is one of them: data=...)."""
    out = []
    for members in rows:
        run = runs[members[0]]
        on_folder_too = lambda other: ("folder_partition" in other) == ("folder_partition" in run)
        peers = [runs[m[0]]["args"] for m in rows  # runs on folders are told apart by their folder's data
                 if runs[m[0]]["algorithm"] == run["algorithm"] and runs[m[0]]["config"] and on_folder_too(runs[m[0]])]
        if not run["config"]:
            peers = []
        keys = sorted({k for a in peers for k in a} - NO_EFFECT - SHOWN - unused_flags(run))
        out.append(" ".join(f"{k}={run['args'].get(k)}" for k in keys
                            if len({json.dumps(a.get(k), default=str) for a in peers}) > 1))
    return out


def fmt(values, digits):
    """One value, or mean ± std (n-1) of several; '-' when there is none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def table_rows(runs, rows, metric_of):
    """The printed table as a list of lists of strings (header first)."""
    header = ["algorithm", "dataset", "partition", "clients", "seeds", "rounds", "metric", "best",
              "@round", "final", "s/round", "MB", "settings", "status"]
    lines = [header]
    for members, settings in zip(rows, varying_settings(runs, rows)):
        group = [runs[i] for i in members]
        first, metric = group[0], metric_of[members[0]]
        args, digits = first["args"], (4 if lower_is_better(metric) else 2)
        stats = [best_final(r, metric) for r in group]
        best_rounds = sorted({s[1] for s in stats if s[1] is not None})
        secs = [last(r, "seconds") / r["done"] if last(r, "seconds") is not None and r["done"] else None
                for r in group]
        mbs = [last(r, "mb_down") + last(r, "mb_up") if None not in (last(r, "mb_down"), last(r, "mb_up"))
               else None for r in group]
        partition = str(args.get("partition", "?"))
        if synthetic(args):  # the clients' data are generated, not partitioned
            partition = "generated"
        elif "folder_partition" in first:  # PFLlib's generator partitioned it, as the folder's config.json says
            partition = folder_partition(first["folder_partition"])
        elif partition == "dir" and "beta" in args:
            partition += f"({args['beta']})"
        lines.append([
            first["algorithm"], os.path.basename(str(args.get("dataset", "?"))), partition,
            str(args.get("num_clients", "?")), ",".join(str(r["args"].get("seed", "?")) for r in group),
            f"{max(r['done'] for r in group) if first['metrics'] else '?'}/{first['planned'] or '?'}", metric,
            fmt([s[0] for s in stats], digits),
            "-" if not best_rounds else "-".join(str(r) for r in sorted({best_rounds[0], best_rounds[-1]})),
            fmt([s[2] for s in stats], digits), fmt(secs, 3), fmt(mbs, 1), settings or "-",
            ", ".join(first["flags"]) or "ok"])
    return lines


def folder_partition(said):
    """The partition column of a run on a PFLlib folder: 'folder pat', 'folder dir(0.1)' as the folder's
    config.json said when the run started, 'folder' for a run made before config.json recorded it."""
    partition = said.get("partition")
    if not isinstance(partition, str):
        return "folder"
    alpha = said.get("alpha")
    return f"folder {partition}" + (f"({alpha})" if partition == "dir" and alpha is not None else "")


def print_table(lines):
    lines = [[one_line(cell) for cell in line] for line in lines]  # no value may end a row and begin another
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    for n, line in enumerate(lines):
        show("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        if n == 0:
            show("  ".join("-" * w for w in widths))


PLOT_TEMPORARY = ".tmp-compare-plot-"  # --plot's temporary file: what a killed run left is found by it


def plot(runs, rows, metric_of, table, path):
    """Write plot_bytes to ``path``, whole or not at all: a full disk leaves the previous file as it was (an
    OSError naming path); the temporary file a killed earlier run left beside it is removed."""
    from tools import run_records  # here, not at the top: it loads torch, which the table does not need
    drawn = plot_bytes(runs, rows, metric_of, table, os.path.splitext(path)[1].lower()[1:])
    for left in run_records.remove_leftovers(os.path.dirname(path) or ".", PLOT_TEMPORARY):
        say(f"removed {one_line(left)} (left by a killed --plot)")
    run_records.atomic_write_all({path: drawn}, prefix=PLOT_TEMPORARY)


def plot_bytes(runs, rows, metric_of, table, kind):
    """The figure, as a file of format ``kind`` (png, pdf, ...): metric against round and against MB communicated,
    one line per row, with a min..max band over the seeds of a group."""
    import io
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (by_round, by_mb) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100)
    for members, line in zip(rows, table[1:]):
        metric = metric_of[members[0]]
        curves = [dict(best_final(runs[i], metric)[3]) for i in members]
        mb = [{r: d + u for (r, d), (_, u) in zip(runs[i]["metrics"]["mb_down"], runs[i]["metrics"]["mb_up"])}
              if runs[i]["metrics"] and "mb_down" in runs[i]["metrics"] else {} for i in members]
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        if not rounds:
            continue
        y = np.array([[c[r] for r in rounds] for c in curves], dtype=float)
        y[~np.isfinite(y)] = np.nan
        where = line[1] if line[1].startswith("synthetic") else f"{line[1]} {line[2]}"  # synthetic: no partition
        label = f"{line[0]} {where}" + (f" {line[12]}" if line[12] != "-" else "") + \
            (f" ({len(members)} seeds)" if len(members) > 1 else "") + f" [{metric}]" + \
            (f" {line[13]}" if line[13] != "ok" else "")
        style = "-" if line[13] == "ok" else "--"
        drawn = by_round.plot(rounds, y.mean(0), style, lw=1.4, label=label)[0]
        if len(members) > 1:
            by_round.fill_between(rounds, y.min(0), y.max(0), color=drawn.get_color(), alpha=0.2, lw=0)
        mb_rounds = [r for r in rounds if all(r in m for m in mb)]
        if mb_rounds:
            x = np.array([np.mean([m[r] for m in mb]) for r in mb_rounds])
            ym = y[:, [rounds.index(r) for r in mb_rounds]]
            by_mb.plot(x, ym.mean(0), style, lw=1.4, color=drawn.get_color())
            if len(members) > 1:
                by_mb.fill_between(x, ym.min(0), ym.max(0), color=drawn.get_color(), alpha=0.2, lw=0)
    metrics = sorted({metric_of[m[0]] for m in rows})
    ylabel = metrics[0] if len(metrics) == 1 else "metric (see legend)"
    for ax, xlabel in ((by_round, "round"), (by_mb, "MB communicated (down + up)")):
        ax.set_title(f"by {xlabel.split(' (')[0]}: mean over seeds, band min..max", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    by_round.legend(fontsize=6.5, loc="best")
    fig.tight_layout()
    drawn = io.BytesIO()
    try:
        fig.savefig(drawn, format=kind)
    except ValueError as e:
        fail(f"cannot draw the plot as .{kind}: {e}")
    finally:
        plt.close(fig)
    return drawn.getvalue()


def cannot_write(path, error, existed):
    """A file that cannot be written (a full disk, a read-only folder): one line naming it and what
    is kept, exit status 1."""
    message = f"cannot write {path} ({error.strerror or error}); " + \
        ("the previous file is kept as it was" if existed else "nothing was written")
    say("error: " + one_line(message))
    sys.exit(1)


PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.error = fail  # one line, not a usage block
    parser.add_argument("paths", nargs="+", metavar="PATH", help="run folders, or folders holding run folders")
    parser.add_argument("--metric", help="metrics.csv column to compare (default: each algorithm's headline)")
    parser.add_argument("--plot", metavar="FILE.png", help="also plot the metric against round and MB")
    args = parser.parse_args(argv)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            fail("--plot needs matplotlib: pip install matplotlib")
        kind = os.path.splitext(args.plot)[1].lower().lstrip(".")
        if kind not in PLOT_FORMATS or os.path.isdir(args.plot):
            fail(f"--plot needs a file name ending in .{', .'.join(PLOT_FORMATS)}; got {args.plot!r}")
        if not os.path.isdir(os.path.dirname(args.plot) or "."):
            fail(f"--plot {args.plot}: the folder {os.path.dirname(args.plot)} does not exist")
    runs = [load_run(folder) for folder in find_runs(args.paths)]
    available = sorted({c for r in runs for c in r["columns"]} - BOOKKEEPING)
    if not available:
        damaged = [r for r in runs if r["damage"]]
        fail("no readable metrics.csv in the run folders found" + (
            f"; {len(damaged)} damaged, e.g. {damaged[0]['folder']}: {damaged[0]['damage'][0]}" if damaged else ""))
    if args.metric is not None and args.metric not in available:
        fail(f"unknown metric {args.metric!r}; available: {', '.join(available)}")
    by_algorithm = {}
    for run in runs:
        if not run["flags"] and run["summary"]:
            by_algorithm.setdefault(run["algorithm"], headline(run, {}))
    metric_of = [args.metric if args.metric is not None else headline(run, by_algorithm) for run in runs]
    if args.metric is None:  # an unfinished run is judged by its own headline (the metric column), and says so
        for run in runs:
            run["flags"] = [f"{flag} (by its headline)" if flag.startswith("unfinished") else flag
                            for flag in run["flags"]]
    rows = group_runs(runs, metric_of)
    table = table_rows(runs, rows, metric_of)
    print_table(table)
    if args.plot:
        existed = os.path.lexists(args.plot)
        try:
            plot(runs, rows, metric_of, table, args.plot)
        except OSError as e:
            cannot_write(args.plot, e, existed)
        show(f"plot written to {one_line(args.plot)}")


if __name__ == "__main__":
    try:
        main()
    except OutputLost as lost:  # a closed or full stdout: one line; piped into head or the like: quietly
        ends_without_output(lost)
