"""Imported first by every algorithm script, before torch, which takes seconds to load: a Ctrl-C,
SIGTERM or SIGHUP that arrives while the script is still starting ends it with one line and exit
status 128 + the signal's number (130, 143, 129), not with a traceback from inside an import.
Nothing has been written at that point, so leaving at once loses nothing. From the start of
``main`` on, run_folder.run_main handles these signals (docs/running.md, "Stopping, resuming and
clusters").

Only the standard library here, so that this module loads in a millisecond."""
import os
import signal
import sys

SCRIPTS = ("fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py")


def stop_while_starting(signum, frame):
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    os.write(2, f"{what} while starting; nothing was written\n".encode())
    os._exit(128 + signum)  # at once: an exception here would unwind through half-done imports


# Only when a script is the program (python fedavg.py): the tests and other programs that import a
# script keep their own handling of signals. A SIGTERM or SIGHUP ignored already (nohup) stays
# ignored, as in run_folder.
if os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "") in SCRIPTS:
    for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if _signum == signal.SIGINT or signal.getsignal(_signum) is not signal.SIG_IGN:
            signal.signal(_signum, stop_while_starting)
