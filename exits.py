"""How a program ends: the errors, ``run_main``, which turns how a script's ``main`` ends into one line and an exit
status, the stop signals, and ``atomic_write``, so that what a program leaves is whole. Every file of ours raises
these errors; importing it changes nothing in the process (docs/layout.md).
"""
import contextlib
import json
import os
import re
import signal
import stat
import sys

import data_partition


class UserError(Exception):
    """Bad input: one line, exit status 2."""


class DivergedError(Exception):
    """A loss became NaN/inf: one line naming round and client, exit status 1."""


class FileFault(OSError):
    """A file of the run folder that cannot be written: one line naming it and what is kept, exit status 1."""

    def __init__(self, path, error, kept="", verb="write"):
        super().__init__(error.errno, error.strerror, path)
        self.line = f"cannot {verb} {path} ({error.strerror or error}){kept}"

    def __str__(self):
        return self.line


OPEN_RUNS = []  # the runs this process has open: run_main releases them however main ends
# Ctrl-C, SIGTERM (sent by Slurm and Kubernetes before a kill) and SIGHUP (the terminal closed) stop a run alike;
# the exit status is the shell's 128 + the signal's number: 130, 143, 129
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_STATUSES = tuple(128 + signum for signum in STOP_SIGNALS)


def signal_name(signum):
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stopped_by(signum):
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal_name(signum)}"


class Stopped(KeyboardInterrupt):
    """A signal that stops at once: a KeyboardInterrupt, so that what cleans up after Ctrl-C cleans up after it."""

    def __init__(self, signum):
        super().__init__(signal_name(signum))
        self.signum = signum


def stop_at_once(signum, frame):
    raise Stopped(signum)


def handle_stop_signals(handler):
    """Make ``handler`` handle the stop signals; returns those it replaced. One ignored already (nohup) stays so;
    outside the main thread (Flower's server) Python allows none."""
    try:
        return {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS
                if signum == signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN}
    except ValueError:  # not the main thread
        return {}


def restore_signals(previous, ignore=False):
    """Put back what ``handle_stop_signals`` replaced, or ignore the signals (on the way out after one)."""
    for signum, handler in previous.items():
        ignore_it = ignore or getattr(handler, "while_starting", False)  # startup.py's: the script is ending
        signal.signal(signum, signal.SIG_IGN if ignore_it else signal.SIG_DFL if handler is None else handler)


def say(line):
    """One line on stderr, control characters escaped; a stream that is gone or closed does not raise."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stderr is None
        print("".join(c if c.isprintable() else repr(c)[1:-1] for c in line.strip("\n")), file=sys.stderr, flush=True)


def run_main(main, argv=None):
    """Run a script's ``main``: bad input one line and exit status 2; divergence or a file that cannot be written 1;
    Ctrl-C, SIGTERM, SIGHUP 130, 143, 129 (``main`` returns it at the end of a round; a signal before the run
    folder exists, or a second one, stops at once)."""
    code, returned, diverged = 0, False, False
    previous = handle_stop_signals(stop_at_once)  # until a Run takes them over: nothing is written yet
    try:
        code, returned = main(argv) or 0, True
    except (UserError, data_partition.PartitionError) as e:
        say(f"error: {e}")
        code = 2
    except DivergedError as e:
        say(f"stopped: {e}")
        code, diverged = 1, True
    except KeyboardInterrupt as e:
        restore_signals(previous, ignore=True)
        signum = getattr(e, "signum", signal.SIGINT)
        say(f"{stopped_by(signum)}; {OPEN_RUNS[-1].kept()}" if OPEN_RUNS else
            f"{stopped_by(signum)} before the run folder was made; nothing was written")
        code = 128 + signum
    except OSError as e:  # disk full, permissions: the run's own files (FileFault), standard output, or any other
        where = None if isinstance(e, FileFault) else e.filename or (None if writable_stdout() else "standard output")
        say(f"error: cannot write to {where} ({e.strerror})" if where else f"error: {e}")
        code = 1
    finally:
        for run in list(OPEN_RUNS):
            run.close(failed=code != 0, diverged=diverged)
    restore_signals(previous, ignore=code in STOP_STATUSES)
    if code in STOP_STATUSES and not returned:  # at once: client threads still running hold nothing saved
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def writable_stdout():
    """Whether a line printed now reaches stdout (an empty one is the probe); if not, what is printed goes to
    /dev/null from here on (the flush at exit must not fail a second time)."""
    try:
        with contextlib.suppress(AttributeError):  # a stdout replaced by something that is no file
            print(flush=True)
        return True
    except (OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def quoted(name):
    """A file name for a one-line message: as it is when plain, else as Python quotes it."""
    name = str(name)
    return name if re.fullmatch(r"[\w@%+=:,./~-]+", name) and name.isprintable() else repr(name)


def shortened(text, width=120):
    """``text`` in about ``width`` characters, its middle cut (its end often says what is wrong)."""
    text, keep = str(text), max(width - 5, 2)
    return text if len(text) <= width else f"{text[:keep // 2]} ... {text[len(text) - (keep - keep // 2):]}"


def check_regular(path, doing="cannot resume"):
    """Refuse ``path`` unless a regular file or absent (a named pipe blocks a read forever); returns whether it is."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UserError(f"{doing}: {quoted(path)} is not a regular file; move it away")
        return True
    return False


def atomic_write(path, content):
    """Write ``content`` (str, bytes, or a function writing to a binary file) to ``path`` through a temporary file
    beside it and a rename: no reader sees half a file, a failed write (disk full) leaves the old file and no
    temporary one, and the file gets the user's umask. A failure is an OSError naming ``path``."""
    tmp, made = os.path.join(os.path.dirname(os.path.abspath(path)), f".tmp-{os.urandom(4).hex()}"), False
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:  # O_EXCL: ours only
            made = True
            content(f) if callable(content) else f.write(content.encode() if isinstance(content, str) else content)
        os.replace(tmp, path)
        made = False
    except OSError as e:
        raise e if e.filename == path else OSError(e.errno, e.strerror or str(e), path) from None
    finally:
        if made:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def read_json(path, doing="cannot resume"):
    check_regular(path, doing)
    try:
        with open(path) as f:  # not finite numbers only: fedpake.py's --kappa inf is written as Infinity
            return json.loads(f.read(2 ** 26))
    except FileNotFoundError:
        raise UserError(f"{doing}: {quoted(path)} is missing") from None
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{doing}: {quoted(path)} cannot be read ({getattr(e, 'strerror', None) or 'not JSON'})")


def dumps(obj):
    return json.dumps(obj, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def is_terminal(stream):
    with contextlib.suppress(AttributeError, ValueError):  # None (no stdout), replaced, or closed
        return stream.isatty()
    return False


def show(line, in_place_width=0):
    """A line on stdout; a progress line (``in_place_width``: the widest so far) rewritten in place."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a stdout that is gone loses the line only
        print(f"\r{line:<{in_place_width}}" if in_place_width else line, end="" if in_place_width else "\n", flush=True)


def detach_from_terminal():
    """After SIGHUP the terminal is gone and a write to it fails (EIO): what is still printed goes to /dev/null."""
    with open(os.devnull, "wb") as null:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode) and os.fstat(fd).st_rdev != os.fstat(null.fileno()).st_rdev:
                    os.dup2(null.fileno(), fd)
