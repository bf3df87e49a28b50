"""The run folder of every script: ``--out/<algo>-<dataset>-s<seed>-<time>/`` with config.json,
partition.json, metrics.csv, summary.json and checkpoint.pt, its lock, Ctrl-C at the end of a
round, and ``--resume``; ``run_main`` turns how a script ends into its exit status and one line.
Bookkeeping around the training loop; nothing here is an algorithm.
"""
import argparse
import atexit
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import sys
import time

import numpy as np
import torch

import common
import data_partition


def _json(obj):
    return json.dumps(obj, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def current_host_mb():
    """Resident memory of this process now, in MB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return 0.0


# open run folders (Run), released by run_main on the way out
OPEN_RUNS = []


def run_main(main, argv=None):
    """Run a script's ``main``. Bad input: one line and exit status 2; divergence: one line and
    status 1; Ctrl-C: status 130 (``main`` returns a status when it stops early)."""
    code, returned = 0, False
    try:
        code = main(argv) or 0
        returned = True
    except (common.UserError, data_partition.PartitionError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except common.DivergedError as e:
        print(f"stopped: {e}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:  # the second Ctrl-C, in the middle of a round
        print(OPEN_RUNS[-1].interrupted_line() if OPEN_RUNS else "interrupted before the run folder was made; "
              "nothing was written", file=sys.stderr)
        code = 130
    finally:
        for run in list(OPEN_RUNS):
            run.close(failed=code != 0, diverged=code == 1)
    if code == 130:  # leaving after Ctrl-C: a further one must not turn the exit into a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not returned:  # at once: client threads still running hold nothing that is saved
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    if code:
        sys.exit(code)


# flags that may differ on --resume: they do not change what is computed (--rounds extends the run)
RESUME_MAY_CHANGE = {"rounds", "device", "parallel_clients", "data_dir", "out", "resume", "stop_after",
                     "checkpoint_every"}


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


def resumed_args(parser, argv):
    """The saved arguments of ``--resume RUN_DIR``, with the flags given now that may change."""
    given = _given_flags(parser, argv)
    folder = given["resume"]
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        saved, script = config["args"], config.get("script")
        if not isinstance(saved, dict):
            raise ValueError("args is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise common.UserError(f"cannot resume: {path} is missing or not a run's config ({e.__class__.__name__}: {e})")
    if script is None:  # older run folders: the algorithm names the script
        script = {"heurpfedla": "pfedla"}.get(config.get("algorithm"), config.get("algorithm"))
    if not isinstance(script, str):
        raise common.UserError(f"cannot resume: {path} names no script or algorithm")
    if f"{script}.py" != parser.prog:
        raise common.UserError(f"cannot resume: {folder} is a run of {script}.py, not {parser.prog}; "
                        f"use python {script}.py --resume {folder}")
    defaults = vars(parser.parse_args([]))
    missing = sorted(set(defaults) - set(saved) - RESUME_MAY_CHANGE)
    if missing:
        raise common.UserError(f"cannot resume: {path} lacks the settings {', '.join(missing)}")
    changed = [f"--{k.replace('_', '-')} {saved[k]} (now {v})" for k, v in sorted(given.items())
               if k not in RESUME_MAY_CHANGE and k in saved and v != saved[k]]
    if not os.path.exists(os.path.join(folder, "checkpoint.pt")):
        raise common.UserError(f"cannot resume: {folder} has no checkpoint.pt (the run stopped before its first "
                               "checkpoint; start it again)")
    if changed:
        raise common.UserError(f"cannot resume with other settings: {'; '.join(changed)}; only --rounds may change")
    for action in parser._actions:
        if action.dest in saved and action.dest not in given and not _fits(action, saved[action.dest]):
            raise common.UserError(f"cannot resume: {path} has {action.option_strings[-1]} "
                                   f"{saved[action.dest]!r}, which that flag does not take")
    args = argparse.Namespace(**{**defaults, **{k: v for k, v in saved.items() if k in defaults}})
    for k in RESUME_MAY_CHANGE & set(given):
        setattr(args, k, given[k])
    args.resume, args.stop_after = folder, given.get("stop_after")
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        summary = json.load(open(os.path.join(folder, "summary.json")))
        if summary.get("status") == "finished" and summary.get("rounds_done") == args.rounds:
            raise common.UserError(f"cannot resume: {folder} has finished its {args.rounds} rounds; "
                                   f"give --rounds N (more than {args.rounds}) to extend it")
    return args


def _fits(action, value):
    """Whether a value read from config.json is one that the flag's parser could have produced."""
    if value is None:
        return action.default is None
    if action.choices is not None and value not in action.choices:
        return False
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return isinstance(value, bool)
    if action.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if action.type is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) if action.type in (None, str) else True


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _lock(folder):
    """Create the run folder's lock file: one process per run folder. A lock whose process is gone
    (killed, crashed; a zombie counts as gone) is stale and taken over."""
    path = os.path.join(folder, ".lock")
    for _ in range(3):
        try:
            with open(path, "x") as f:
                f.write(f"{os.getpid()} {socket.gethostname()}\n")
            return path
        except FileExistsError:
            pid, host, alive = "?", "?", True
            try:
                with open(path) as f:
                    pid, host = f.read().split()
                os.kill(int(pid), 0)
                with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:  # Linux: not a zombie
                    alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (ProcessLookupError, FileNotFoundError):
                alive = False
            except (OSError, ValueError):  # another user's process, or a lock being written right now
                pass
            if pid == "?":  # empty or unreadable: perhaps being written this instant
                raise common.UserError(f"{folder} holds a lock file that names no process; delete {path} "
                                       "if no run is using the folder")
            if alive or host != socket.gethostname():
                raise common.UserError(f"{folder} is in use by process {pid} on {host}; wait for it to end "
                                f"(or delete {path} if that process is gone)")
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        except OSError as e:
            raise common.UserError(f"cannot write in the run folder {folder} ({e.strerror})")
    raise common.UserError(f"cannot take the lock {path}; delete it if no run is using {folder}")


class Run:
    """The run folder and the bookkeeping around the training loop (not the algorithm).

    Creates ``--out/<algo>-<dataset>-s<seed>-<time>/`` (or takes ``--resume RUN_DIR``), locks
    it, writes config.json and partition.json; then records evaluations (metrics.csv),
    checkpoints (checkpoint.pt: tensors and plain containers only) and the summary. Build it
    once set-up has succeeded: a run that fails before its first round leaves no folder.
    The first Ctrl-C asks the loop to stop at the end of the round (``stop_requested``)."""

    def __init__(self, algo, args, data, device, headline, headline_metric="test_acc", script=None):
        self.algo, self.args, self.data, self.device = algo, args, data, device
        self.headline, self.headline_metric, self.script = headline, headline_metric, script or algo
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = [], 0, 0, 0.0
        self.created, self.interrupted, self.finished = False, False, False
        self.checkpoint_round, self.stopping = 0, False
        self.dir = args.resume or self._new_dir()
        if args.resume:
            self.lock = _lock(self.dir)
        OPEN_RUNS.append(self)
        if not args.resume:  # a resumed run keeps its record (resume() updates --rounds)
            common.atomic_write(os.path.join(self.dir, "config.json"), _json({
                "algorithm": algo, "script": self.script, "args": {**vars(args), "resume": None, "stop_after": None},
                "command": sys.argv, "device": str(device), "device_name": torch.cuda.get_device_name(device)
                if device.type == "cuda" else platform.processor() or platform.machine(),
                "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
                "num_classes": data.num_classes, "input_shape": list(data.x.shape[1:])}))
        self._write_partition()
        self._t_last, self._last_round = time.perf_counter(), 0
        try:
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread: Ctrl-C keeps its default
            self._previous_handler = None

    def _new_dir(self):
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", os.path.basename(self.args.dataset).replace(".npz", "")).strip("-")
        base = os.path.join(self.args.out, f"{self.algo}-{name}-s{self.args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        path, n = base, 1
        while True:
            try:
                os.makedirs(path)  # never an existing folder: never overwrite an earlier run
                break
            except FileExistsError:
                if not os.path.isdir(os.path.dirname(path) or "."):
                    raise common.UserError(f"--out {self.args.out} is not a folder")
                path, n = f"{base}-{n}", n + 1
            except OSError as e:
                raise common.UserError(f"cannot create a run folder under --out {self.args.out} ({e.strerror})")
        self.created = True
        self.lock = _lock(path)
        return path

    def _on_sigint(self, signum, frame):
        if self.stopping:
            return
        if self.interrupted:  # the second Ctrl-C stops at once
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.interrupted = True
        print(f"\n[{self.algo}] Ctrl-C: stopping at the end of this round (Ctrl-C again stops at once)",
              file=sys.stderr, flush=True)

    def _write_partition(self):
        d = self.data
        if not self.args.resume:
            common.atomic_write(os.path.join(self.dir, "partition.json"), _json({
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
        """Every --eval-every rounds and each of the last 10, so that last10_mean is the mean over
        the last 10 rounds (FedPake Sec. 4.1) whatever --eval-every is."""
        return round_ % self.args.eval_every == 0 or round_ > self.args.rounds - 10

    def log(self, round_, metrics):
        """Record one evaluation: a row in metrics.csv (rewritten atomically) and a progress line."""
        now = time.perf_counter()
        self.elapsed += now - self._t_last
        per_round = (now - self._t_last) / max(round_ - self._last_round, 1)
        self._t_last, self._last_round = now, round_

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
        eta = per_round * (self.args.rounds - round_)
        extra = f" (client mean {metrics['test_acc_mean']:.2f} ± {metrics['test_acc_std']:.2f})" \
            if "test_acc_mean" in metrics else ""
        loss = f" | train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        if "global_acc" in metrics:  # --test-split global: the uniform test set
            extra += f" | global test acc {metrics['global_acc']:.2f}%"
        print(f"[{self.algo}] round {round_}/{self.args.rounds} | test acc {metrics.get('test_acc', float('nan')):.2f}%"
              f"{extra}{loss} | {per_round:.3f} s/round | ETA {_fmt_time(eta)}", flush=True)

    def _write_metrics(self):
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        with_header = [keys] + [[r.get(k, "") for k in keys] for r in self.rows]
        text = "".join(",".join(map(str, r)) + "\n" for r in with_header)
        common.atomic_write(os.path.join(self.dir, "metrics.csv"), text)

    # -- checkpoints, stopping and resuming

    def stop_requested(self, round_):
        """After a Ctrl-C, or at ``--stop-after`` (tests: a run killed after that round, so no
        extra checkpoint is written for it)."""
        return self.interrupted or (self.args.stop_after is not None and round_ >= self.args.stop_after)

    def checkpoint(self, round_, state, rng):
        """Every ``--checkpoint-every`` rounds, at the last round and before a requested stop:
        the algorithm ``state`` (modules and objects by their state_dict, tensors as they are),
        every RNG state and the metrics so far, as tensors and plain containers."""
        if not (round_ % self.args.checkpoint_every == 0 or round_ == self.args.rounds or self.interrupted):
            return
        blob = {"algorithm": self.algo, "round": round_, "rows": self.rows, "args": self._fixed_args(),
                "bytes": [self.bytes_down, self.bytes_up],
                "elapsed": self.elapsed + time.perf_counter() - self._t_last,
                "state": {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()},
                "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        common.atomic_write(os.path.join(self.dir, "checkpoint.pt"), lambda f: torch.save(blob, f))
        self.checkpoint_round = round_

    def stop(self, round_):
        """Report a requested stop after ``round_`` (checkpoint written) and return the exit status."""
        command = f"python {self.script}.py --resume {self.dir}"
        if self.interrupted:
            self.stopping = True  # the checkpoint is written: a further Ctrl-C has nothing left to stop
            print(f"interrupted after round {round_}; continue with: {command}", file=sys.stderr, flush=True)
            return 130
        print(f"[{self.algo}] stopping after round {round_} (--stop-after); continue with: {command}")
        self.close()
        sys.exit(0)  # as if killed here

    def _fixed_args(self):
        """The settings a checkpoint belongs to: every flag that changes results, --rounds aside."""
        return {k: v for k, v in sorted(vars(self.args).items()) if k not in RESUME_MAY_CHANGE}

    def resume(self, state, rng):
        """With ``--resume``: load the checkpoint into ``state`` in place (modules and objects by
        load_state_dict, tensors by copy) and into ``rng``, and return the first round to run;
        else return 1. Only tensors and plain containers are read (weights_only): a crafted
        file cannot run code."""
        if not self.args.resume:
            return 1
        path = os.path.join(self.dir, "checkpoint.pt")
        if not os.path.exists(path):
            raise common.UserError(f"cannot resume: {self.dir} has no checkpoint.pt (the run stopped before its first "
                            "checkpoint; start it again)")
        try:
            blob = torch.load(path, map_location=self.device, weights_only=True)
            if set(blob["state"]) != set(state) or blob["algorithm"] != self.algo:
                raise ValueError("it holds another algorithm's state")
            fixed = self._fixed_args()
            if blob.get("args", fixed) != fixed:  # (checkpoints before 2026-11 had none)
                differ = [k for k in fixed if blob["args"].get(k) != fixed[k]]
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
            if not (isinstance(round_, int) and round_ >= 1 and all(isinstance(r, dict) for r in rows)):
                raise ValueError("bad round or metrics")
            rng.bit_generator.state = blob["rng"]
            torch.set_rng_state(blob["torch_rng"].cpu())
            if blob["cuda_rng"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([s.cpu() for s in blob["cuda_rng"]])
        except Exception as e:  # noqa: BLE001  anything wrong with the file is the same answer
            message = str(e).splitlines()[0][:150] if str(e) else e.__class__.__name__
            raise common.UserError(f"cannot resume: {path} is not a valid checkpoint of this run ({message})")
        if round_ > self.args.rounds:
            raise common.UserError(f"cannot resume: the run already has {round_} rounds; --rounds {self.args.rounds} "
                            f"must be at least that")
        config_path = os.path.join(self.dir, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        if config["args"]["rounds"] != self.args.rounds:
            config["args"]["rounds"] = self.args.rounds
            common.atomic_write(config_path, _json(config))
        self.rows, self.bytes_down, self.bytes_up, self.elapsed = rows, int(down), int(up), elapsed
        self._write_metrics()  # drop rows logged after the checkpoint: they will be recomputed
        self._last_round = self.checkpoint_round = round_
        print(f"[{self.algo}] resumed {self.dir} after round {round_}")
        return round_ + 1

    def summary(self, extra=None, status="finished"):
        """best, final and mean of the last 10 evaluations of every accuracy column, and which of
        them the paper reports (``headline_metric``)."""
        summary = {"algorithm": self.algo, "status": status, "rounds": self.args.rounds,
                   "rounds_done": self.rows[-1]["round"] if self.rows else 0,
                   "headline_metric": self.headline_metric, "paper_reports": self.headline,
                   "seconds": round(self.elapsed, 2), "mb_down": self.bytes_down / 2 ** 20,
                   "mb_up": self.bytes_up / 2 ** 20,
                   "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KB
                   "peak_device_mb": (torch.cuda.max_memory_allocated(self.device) / 2 ** 20
                                      if self.device.type == "cuda" else None), **(extra or {})}
        for key in [k for k in self.rows[0] if "acc" in k and not k.endswith("_std")] if self.rows else []:
            values = np.array([float(r[key]) for r in self.rows if r.get(key, "") != ""])
            summary[key] = {"best": float(values.max()), "final": float(values[-1]),
                            "last10_mean": float(values[-10:].mean())}
        common.atomic_write(os.path.join(self.dir, "summary.json"), _json(summary))
        return summary

    def finish(self, extra=None):
        """Write summary.json and print it."""
        summary = self.summary(extra)
        self.finished = True
        print(f"[{self.algo}] summary ({self.headline} is what the paper reports):")
        for key, v in summary.items():
            if isinstance(v, dict) and {"best", "final", "last10_mean"} <= set(v):
                print(f"  {key:>22s}: best {v['best']:.2f}  final {v['final']:.2f}  "
                      f"last-10 mean {v['last10_mean']:.2f}")
        print(f"  {self.elapsed:.1f} s, {summary['mb_down']:.1f} MB down, {summary['mb_up']:.1f} MB up; "
              f"files in {self.dir}")
        return summary

    def interrupted_line(self):
        """What a second Ctrl-C (a stop in the middle of a round) leaves behind, in one line."""
        if self.checkpoint_round:
            return (f"interrupted; the checkpoint of round {self.checkpoint_round} is kept; "
                    f"continue with: python {self.script}.py --resume {self.dir}")
        if self.rows:
            return (f"interrupted before the first checkpoint (--checkpoint-every {self.args.checkpoint_every}); "
                    f"{self.dir}/metrics.csv keeps rounds up to {self.rows[-1]['round']}; nothing to resume")
        return "interrupted before the first round; nothing was kept"

    def close(self, failed=False, diverged=False):
        """Release the folder: a new run that failed before writing any result leaves nothing behind;
        a run that stopped with results keeps them (a diverged one says so in summary.json)."""
        if self not in OPEN_RUNS:
            return
        OPEN_RUNS.remove(self)
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
        if failed and not diverged and self.created and not self.rows and \
                not os.path.exists(os.path.join(self.dir, "checkpoint.pt")):
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        if diverged and not self.finished:
            self.summary(status="diverged")
        try:
            os.remove(self.lock)
        except OSError:
            pass




@atexit.register
def _release_on_exit():
    for run in list(OPEN_RUNS):
        run.close()
