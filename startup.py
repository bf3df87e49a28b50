"""A Ctrl-C, SIGTERM or SIGHUP while a program is still starting ends it with one line.

Each program (the algorithm scripts, tools/reproduce.py and the programs of tools/ that run a script's rounds)
imports this module first, under ``if __name__ == "__main__"`` (importing a script, as tests, tools and flower/ do,
installs nothing), before numpy and torch, whose import takes seconds: a signal then ends it with one line and exit
status 128 + the signal's number (130, 143, 129), not with a traceback from inside an import. It must run before
those imports begin, so it cannot wait for ``main``: hence a module of its own that only installs the handlers.
Nothing is written yet, so leaving at once loses nothing. From the start of ``main`` on, run_folder.run_main handles
these signals (docs/running.md, "Stopping, resuming and clusters").
"""
import os
import signal


def stop_while_starting(signum, frame):
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    os.write(2, f"{what} while starting; nothing was written\n".encode())
    os._exit(128 + signum)  # at once: an exception here would unwind through half-done imports


stop_while_starting.while_starting = True  # run_folder.restore_signals ignores it once main has ended

# A SIGTERM or SIGHUP ignored already (nohup) stays ignored, as in exits.handle_stop_signals.
for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if _signum == signal.SIGINT or signal.getsignal(_signum) is not signal.SIG_IGN:
        signal.signal(_signum, stop_while_starting)
