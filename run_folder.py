"""The run folder around the training loop, no algorithm: ``Run`` makes ``--out/<algo>-<dataset>-s<seed>-<time>/``
with config.json, partition.json, metrics.csv, checkpoint.pt (an exact ``resume``) and summary.json, and prints each
round's line and a long round's progress. How a run ends is exits.py's. Importing it changes nothing in the process.
"""
import contextlib
import errno
import hashlib
import io
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import sys
import threading
import time

import filelock
import numpy as np
import torch

import data_partition
from exits import (OPEN_RUNS, DivergedError, FileFault, Stopped, UserError, atomic_write, check_regular,  # noqa: F401
                   detach_from_terminal, dumps, handle_stop_signals, is_terminal, quoted, read_json, restore_signals,
                   run_main, say, shortened, show, signal_name, stop_at_once, stopped_by)  # the scripts' too


# flags that may differ on --resume: they do not change what is computed (--rounds extends the run)
RESUME_MAY_CHANGE = {"rounds", "device", "parallel_clients", "data_dir", "out", "resume", "stop_after",
                     "checkpoint_every"}
RUN_FILES = ("config.json", "partition.json", "metrics.csv", "summary.json", "checkpoint.pt")


def cpu_model():
    """The CPU's name with its family and model numbers (a virtual machine may show only "AMD EPYC" for
    generations whose kernels sum in another order): with the CPU capability, the kind a run repeats on."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        fields = dict(re.findall(r"^(model name|cpu family|model)\s*:\s*(.*)$", f.read().split("\n\n")[0], re.M))
        numbers = ", ".join(f"{key} {fields[key]}" for key in ("cpu family", "model") if key in fields)
        if "model name" in fields:
            return f"{fields['model name']} ({numbers})" if numbers else fields["model name"]
    return platform.processor() or platform.machine()


def where_it_runs(device):
    """What decides a run's arithmetic besides its flags: device, CPU kind, library versions."""
    return {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": cpu_model(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}}


def continued_elsewhere(config, round_, device):
    """``config`` with a ``continued_on`` entry from round ``round_ + 1`` if where_it_runs differs from where the
    run ran last; None when nothing changed."""
    here, last = where_it_runs(device), (config.get("continued_on") or [config])[-1]
    return None if all(last.get(k, v) == v for k, v in here.items()) else \
        {**config, "continued_on": [*config.get("continued_on", []), {"from_round": round_ + 1, **here}]}


def data_fingerprint(data):
    """sha256 of the data as it enters the run: samples (images in their channels-last memory order), labels,
    every client's train and test indices."""
    digest = hashlib.sha256()

    def add(t):
        digest.update(f"{t.dtype} {tuple(t.shape)};".encode())
        digest.update((t.permute(0, 2, 3, 1) if t.dim() == 4 else t).contiguous().cpu().numpy())

    add(data.x)
    add(data.y)
    for indices in (data.train_idx, data.test_idx, [] if data.global_test_idx is None else [data.global_test_idx]):
        digest.update(f"{[len(i) for i in indices]};".encode())
        if len(indices):
            add(torch.cat(list(indices)))
    return digest.hexdigest()


def with_threads(command, threads):
    """A script's argv that takes the thread count the run took (argparse takes the last --threads)."""
    command = [str(t) for t in command]
    given = [v for t, n in zip(command, [*command[1:], None]) for v in
             ([n] if t == "--threads" else [t.partition("=")[2]] if t.startswith("--threads=") else [])]
    return command if given and given[-1] == str(threads) else [*command, "--threads", str(threads)]


clock = time.perf_counter  # the run's seconds (tests set a clock of their own)
PROGRESS_AFTER, PROGRESS_LOG_EVERY = 5.0, 30.0  # a round's progress shows after 5 s; in a log every 30 s at most


def duration(seconds):
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def summarise(values):
    """summary.json's numbers of one metric: the best (maximum), the final value and the mean of the last 10."""
    values = np.asarray(values, dtype=float)
    return {"best": float(values.max()), "final": float(values[-1]), "last10_mean": float(values[-10:].mean())}


class Run:
    """The run folder: building it (set-up done) takes over the stop signals, makes and locks a new folder under --out
    or locks --resume's (its data must have config.json's fingerprint). Failing before any result, it leaves nothing."""

    def __init__(self, algo, args, data, device, headline, headline_metric="test_acc", script=None, extra_config=None,
                 program=None):
        self.algo, self.args, self.data, self.device, self.headline = algo, args, data, device, headline
        self.headline_metric, self.script = headline_metric, script or algo
        self.program = program or f"{self.script}.py"
        self.rows, self.bytes_down, self.bytes_up, self.elapsed, self.made = [], 0, 0, 0.0, []
        self.dir = self.lock = self.latest = None
        self.finished = self.stopping = False
        self.checkpoint_round = self.interrupted = 0  # interrupted: the signal that asked to stop
        self.data_sha256 = data_fingerprint(data)
        OPEN_RUNS.append(self)  # from here on run_main's close() releases what this makes
        self.previous_handlers = handle_stop_signals(self.on_signal)
        if args.resume:
            self.dir = args.resume
            self.take_lock()
            for name in os.listdir(self.dir):  # what a run killed in atomic_write left (not another program's)
                if re.fullmatch(r"\.tmp-[0-9a-f]{8}", name):
                    os.remove(os.path.join(self.dir, name))
            saved = read_json(os.path.join(self.dir, "config.json")).get("data_sha256")
            if saved != self.data_sha256:
                raise UserError(f"cannot resume: the data of {quoted(self.dir)} changed since the run started "
                                f"({args.dataset}: fingerprint {str(saved)[:16]} now {self.data_sha256[:16]})")
        else:
            self.new_folder()
            command = with_threads(sys.argv, args.threads)  # the command as run, at the thread count it took
            self.write("config.json", dumps({
                "algorithm": algo, "script": self.script, "args": {**vars(args), "resume": None, "stop_after": None},
                "command": command, "command_line": shlex.join(["python", *command]),
                "headline_metric": headline_metric, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **where_it_runs(device), "num_classes": data.num_classes, "input_shape": list(data.x.shape[1:]),
                "data_sha256": self.data_sha256,
                **({"dataset_folder": data.info["folder"]} if isinstance(data.info.get("folder"), dict) else {}),
                **(extra_config or {})}))
            spc = {"samples_per_client": data.info["samples_per_client"]} if "samples_per_client" in data.info else {}
            self.write("partition.json", dumps({
                "train_class_counts": data.train_counts, "test_class_counts": data.test_counts,
                "train_sizes": data.train_counts.sum(1), "test_sizes": data.test_counts.sum(1),
                "global_test_size": 0 if data.global_test_idx is None else len(data.global_test_idx), **spc}))
        spc = data.info.get("samples_per_client")
        print(f"[{algo}] {args.dataset}: {data.num_clients} clients, {data.num_classes} classes, input "
              f"{tuple(data.x.shape[1:])}, device {device}, run folder {self.dir}" +
              (f"; {spc['samples']} samples per client (--samples-per-client {spc['flag']})" if spc else ""))
        print(data_partition.describe(data.train_counts, data.test_counts))
        self.t_last, self.last_round, self.progress_width, self.progress_lock = clock(), 0, 0, threading.Lock()

    def new_folder(self):
        """A new folder under --out, never an existing one; the --out folders it makes go with it on a failure."""
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", os.path.basename(os.path.abspath(self.args.dataset))
                      .replace(".npz", "")).strip("-").strip(".") or "data"
        base = os.path.join(self.args.out, f"{self.algo}-{name}-s{self.args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        parent = os.path.dirname(base)
        while parent and not os.path.lexists(parent):  # deepest first
            self.made.append(parent)
            parent = os.path.dirname(parent)
        path, n = base, 1
        while True:
            try:
                os.makedirs(path)
                break
            except FileExistsError:
                path, n = f"{base}-{n}", n + 1
            except OSError as e:  # a path too long for the system, or a file in a folder's place: bad input
                self.remove_made()
                fault = FileFault(path, e, "; nothing was made", verb="create")
                raise (UserError(str(fault)) if e.errno in (errno.ENAMETOOLONG, errno.ENOTDIR) else fault) from None
        self.dir, self.made = path, [path, *self.made]
        self.take_lock()

    def take_lock(self):
        """One process per run folder: an OS lock on .lock, released when the process ends, however it ends."""
        lock = filelock.FileLock(os.path.join(self.dir, ".lock"), timeout=0)
        try:
            lock.acquire()
            with open(lock.lock_file, "w") as f:  # who holds it, for tools/reproduce.py
                f.write(f"{os.getpid()} {platform.node()}\n")
        except filelock.Timeout:
            raise UserError(f"{quoted(self.dir)} is in use by another run; wait for it to end") from None
        except OSError as e:
            raise FileFault(os.path.join(self.dir, ".lock"), e, verb="create") from None
        self.lock = lock

    def remove_made(self):
        for folder in self.made:  # os.rmdir removes only what is empty: never another run's folder
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def on_signal(self, signum, frame):
        """The first stop signal: stop at the end of the round, after a checkpoint; a second: at once."""
        if self.stopping:
            return
        if self.interrupted:
            self.stopping = True
            raise Stopped(signum)
        self.interrupted = signum
        if signum == signal.SIGHUP:  # the terminal is gone
            detach_from_terminal()
        show(f"\n[{self.algo}] {signal_name(signum)}: stopping at the end of this round, after a checkpoint "
             f"(a second {signal_name(signum)} stops at once)")

    def write(self, name, content):
        try:
            atomic_write(os.path.join(self.dir, name), content)
        except OSError as e:
            raise FileFault(os.path.join(self.dir, name), e, f"; {self.kept()}") from None

    def kept(self):
        """What the run folder keeps, and how to go on: the end of a one-line message."""
        command = shlex.join(["python", self.program, "--resume", self.dir])
        if self.checkpoint_round and not os.path.isfile(os.path.join(self.dir, "checkpoint.pt")):
            return f"the checkpoint of round {self.checkpoint_round} is gone from {quoted(self.dir)}; nothing to resume"
        if self.checkpoint_round or self.args.resume:
            return (f"the checkpoint of round {self.checkpoint_round} is kept" if self.checkpoint_round else
                    f"{quoted(self.dir)} is as it was") + f"; continue with: {command}"
        return (f"no checkpoint yet (--checkpoint-every {self.args.checkpoint_every}); {quoted(self.dir)}/metrics.csv "
                f"keeps rounds up to {self.rows[-1]['round']}; nothing to resume") if self.rows else "nothing was kept"

    def add_bytes(self, down, up):
        self.bytes_down, self.bytes_up = self.bytes_down + int(down), self.bytes_up + int(up)

    def should_eval(self, round_):
        """Every --eval-every rounds and each of the last 10 (last10_mean: FedPake Sec. 4.1)."""
        return round_ % self.args.eval_every == 0 or round_ > self.args.rounds - 10

    def progress(self, round_):
        """Round ``round_``'s callback for common.ClientPool.train, told as each client starts and ends."""
        t0, running, times, shown = clock(), {}, [], [clock(), 1]  # shown: when, and the most clients at once

        def report(client, of, done):
            now = clock()
            with self.progress_lock:
                if not done:
                    running[client] = now
                    shown[1] = max(shown[1], len(running))
                    return
                times.append(now - running.pop(client))
                if now - t0 >= PROGRESS_AFTER:
                    self.show_progress(round_, of, t0, now, times, running.values(), shown)
        return report

    def show_progress(self, round_, of, t0, now, times, starts, shown):
        """The clients done and an ETA: on a terminal at each client's end, in place and cut to its width (not
        wrapped); in a log at most every PROGRESS_LOG_EVERY s. The ETA: those left at the mean client's time, less
        what running ones did, over the most run at once, then the rounds after at the run's mean."""
        terminal = is_terminal(sys.stdout)
        if terminal or now - shown[0] >= PROGRESS_LOG_EVERY:
            shown[0] = now
            mean = sum(times) / len(times)
            rest = max((of - len(times)) * mean - sum(min(now - start, mean) for start in starts), 0) / shown[1]
            eta = rest + (self.elapsed + now - self.t_last + rest) / round_ * (self.args.rounds - round_)
            line = (f"[{self.algo}] round {round_}/{self.args.rounds}: {len(times)}/{of} clients done | "
                    f"{now - t0:.0f} s into this round | ETA {duration(eta)}")
            if terminal:
                line = line[:max(shutil.get_terminal_size().columns - 1, 20)]
                self.progress_width = max(self.progress_width, len(line))
            show(line, self.progress_width if terminal else 0)

    def log(self, round_, metrics):
        """Record one evaluation: a row of metrics.csv (rewritten atomically) and the round's line."""
        now, rounds, first = clock(), max(round_ - self.last_round, 1), self.last_round + 1
        self.elapsed, per_round, self.t_last, self.last_round = \
            self.elapsed + now - self.t_last, (now - self.t_last) / rounds, now, round_
        plain = {k: int(v) if isinstance(v, (bool, int, np.integer)) else str(v) if isinstance(v, str) else
                 round(float(v), 6) for k, v in metrics.items()}
        host_mb = 0.0  # resident memory now: Linux only
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
            host_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
        self.rows.append({"round": round_, **plain, "seconds": round(self.elapsed, 3),
                          "sec_per_round": round(per_round, 4), "mb_down": round(self.bytes_down / 2 ** 20, 3),
                          "mb_up": round(self.bytes_up / 2 ** 20, 3), "host_mb": round(host_mb, 1),
                          **({"device_mb": round(torch.cuda.memory_allocated(self.device) / 2 ** 20, 1)}
                             if self.device.type == "cuda" else {})})
        self.write_metrics()
        mean, m = self.elapsed / round_, metrics  # the mean: every round, a long first or initial-stage one included
        took = f"{per_round:.3f} " + ("s this round" if rounds == 1 else f"s/round over rounds {first}-{round_}")
        extra = (f" (client mean {m['test_acc_mean']:.2f} ± {m['test_acc_std']:.2f})" if "test_acc_mean" in m
                 else "") + (f" | train loss {m['train_loss']:.4f}" if "train_loss" in m else "") \
            + (f" | global_acc {m['global_acc']:.2f}%" if "global_acc" in m else "")  # --test-split global
        self.end_progress()
        show(f"[{self.algo}] round {round_}/{self.args.rounds} | test acc {m.get('test_acc', float('nan')):.2f}%"
             f"{extra} | {took}, mean {mean:.3f} s/round | ETA {duration(mean * (self.args.rounds - round_))}")

    def end_progress(self):
        with self.progress_lock:  # clear a progress line left on the terminal
            if self.progress_width:
                show(f"{'':{self.progress_width}}\r", self.progress_width)
                self.progress_width = 0

    def write_metrics(self):
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        self.write("metrics.csv", "".join(",".join(map(str, r)) + "\n" for r in
                                          [keys, *([r.get(k, "") for k in keys] for r in self.rows)]))

    def stop_requested(self, round_):
        """After a stop signal or at --stop-after; never after the last round (the run ends as finished)."""
        return round_ < self.args.rounds and (bool(self.interrupted) or self.args.stop_after is not None
                                              and round_ >= self.args.stop_after)

    def checkpoint(self, round_, state, rng):
        """Every --checkpoint-every rounds, the last, before a stop: ``state`` (modules by state_dict), RNGs, rows."""
        self.latest = (round_, state, rng)  # for stop(), should a signal come after this call
        if round_ % self.args.checkpoint_every == 0 or round_ == self.args.rounds or self.stop_requested(round_):
            self.save_checkpoint(round_, state, rng)

    def save_checkpoint(self, round_, state, rng):
        # serialised in memory: a full disk is then atomic_write's OSError; no CUDA RNG state (nothing draws from one)
        blob = io.BytesIO()
        torch.save({"algorithm": self.algo, "round": round_, "rows": self.rows, "args": self.fixed_args(),
                    "bytes": [self.bytes_down, self.bytes_up], "elapsed": self.elapsed + clock() - self.t_last,
                    "state": {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()},
                    "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()}, blob)
        self.write("checkpoint.pt", blob.getbuffer())
        self.checkpoint_round = round_

    def fixed_args(self):
        return {k: v for k, v in sorted(vars(self.args).items()) if k not in RESUME_MAY_CHANGE | {"dataset"}}

    def stop(self, round_):
        """Report a requested stop after ``round_`` (its checkpoint written); returns the exit status."""
        if not self.interrupted:
            self.end_progress()
            show(f"[{self.algo}] stopping after round {round_} (--stop-after); continue with: "
                 f"{shlex.join(['python', self.program, '--resume', self.dir])}")
            self.close()
            sys.exit(0)  # as if killed here
        if self.checkpoint_round != round_ and self.latest and self.latest[0] == round_:
            self.save_checkpoint(*self.latest)  # the signal came after this round's checkpoint() call
        self.stopping = True  # a further signal has nothing left to stop
        say(f"{stopped_by(self.interrupted)} after round {round_}; {self.kept()}")
        return 128 + self.interrupted

    def resume(self, state, rng):
        """With --resume: load the checkpoint into ``state`` in place and into ``rng``, and return the first round to
        run; else 1. weights_only: a crafted file cannot run code. Anything wrong with it: one line, nothing changed."""
        if not self.args.resume:
            return 1
        path = os.path.join(self.dir, "checkpoint.pt")
        try:
            check_regular(path)
            blob = torch.load(path, map_location=self.device, weights_only=True)
            rows, (down, up), round_ = list(blob["rows"]), blob["bytes"], int(blob["round"])
            if blob["algorithm"] != self.algo or set(blob["state"]) != set(state):
                raise ValueError("it holds another algorithm's state")
            saved = {k: v for k, v in blob["args"].items()  # a switch of a program's mode that is off: as none
                     if k != "dataset" and (k in vars(self.args) or v not in (False, None))}
            if saved != self.fixed_args():
                raise ValueError(f"other settings: {', '.join(k for k in saved if saved[k] != vars(self.args).get(k))}")
            seen, every = [int(r["round"]) for r in rows], self.args.eval_every  # increasing, each --eval-every there
            if round_ < 1 or seen != sorted(set(seen)) or seen and not 1 <= seen[0] <= seen[-1] <= round_ \
                    or set(range(every, round_ + 1, every)) - set(seen):
                raise ValueError(f"round {round_} with rows of rounds {seen[-3:]}")
            for k, v in blob["state"].items():
                if any(isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
                       for t in (v.values() if isinstance(v, dict) else [v])):  # a module's state_dict too
                    raise ValueError("it holds non-finite weights")
                if hasattr(state[k], "load_state_dict"):
                    state[k].load_state_dict(v)
                elif isinstance(state[k], torch.Tensor) and v.shape == state[k].shape:
                    state[k].copy_(v)
                else:
                    raise ValueError(f"entry {k} does not fit this run")
            rng.bit_generator.state = blob["rng"]
            torch.set_rng_state(blob["torch_rng"].cpu())
            self.elapsed = float(blob["elapsed"])
        except Exception as e:  # noqa: BLE001  anything wrong with the file is the same answer
            raise UserError(f"cannot resume: {quoted(path)} is not a valid checkpoint of this run "
                            f"({shortened((str(e).splitlines() or [type(e).__name__])[0], 150)})") from None
        if round_ > self.args.rounds:
            raise UserError(f"cannot resume with --rounds {self.args.rounds}: {quoted(self.dir)} already has "
                            f"{round_} rounds")
        if self.args.stop_after is not None and round_ >= self.args.stop_after:
            raise UserError(f"cannot resume with --stop-after {self.args.stop_after}: {quoted(self.dir)} has its "
                            f"checkpoint at round {round_} already; give a later round, or leave --stop-after out "
                            "to go on to the end")
        self.rows, self.bytes_down, self.bytes_up, self.last_round = rows, int(down), int(up), round_
        self.checkpoint_round = round_
        config, note = read_json(os.path.join(self.dir, "config.json")), ""
        try:
            moved = continued_elsewhere(config, round_, self.device)
        except (AttributeError, TypeError) as e:
            raise UserError(f"cannot resume: {quoted(self.dir)}/config.json has a damaged continued_on ({e})") from None
        if moved:
            config, place = moved, moved["continued_on"][-1]
            note = f"; from round {round_ + 1} on {place['cpu_model' if place['device'] == 'cpu' else 'device_name']}"
        if config["args"]["dataset"] != self.args.dataset:  # data that moved: later resumes read them there
            config["args"]["dataset"], note = self.args.dataset, f"{note}; its dataset is now {self.args.dataset}"
        if config["args"]["rounds"] != self.args.rounds or note:
            config["args"]["rounds"] = self.args.rounds
            self.write("config.json", dumps(config))
        self.write_metrics()  # drop rows logged after the checkpoint: they will be recomputed
        print(f"[{self.algo}] resumed {self.dir} after round {round_}{note and note + ' (recorded in config.json)'}")
        return round_ + 1

    def summary(self, extra=None, status="finished"):
        """best, final and last-10 mean of every accuracy column, and which the paper reports (headline_metric)."""
        summary = {"algorithm": self.algo, "status": status, "rounds": self.args.rounds,
                   "rounds_done": self.rows[-1]["round"] if self.rows else 0, "headline_metric": self.headline_metric,
                   "paper_reports": self.headline, "seconds": round(self.elapsed, 2),
                   "mb_down": self.bytes_down / 2 ** 20, "mb_up": self.bytes_up / 2 ** 20,
                   "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KB
                   "peak_device_mb": torch.cuda.max_memory_allocated(self.device) / 2 ** 20
                   if self.device.type == "cuda" else None, **(extra or {})}
        if self.rows:  # the rounds last10_mean covers: fewer than 10 in a shorter run
            summary["last10_mean_rounds"] = [self.rows[-10:][0]["round"], self.rows[-1]["round"]]
        for key in [k for k in self.rows[0] if "acc" in k and not k.endswith("_std")] if self.rows else []:
            summary[key] = summarise([float(r[key]) for r in self.rows if r.get(key, "") != ""])
        self.write("summary.json", dumps(summary))
        return summary

    def finish(self, extra=None):
        """Write summary.json and print it."""
        summary, self.finished = self.summary(extra), True
        first, last = summary.get("last10_mean_rounds", (0, 0))
        mean_of = "last-10 mean" if len(self.rows) >= 10 else f"mean of rounds {first}-{last}"
        self.end_progress()
        show(f"[{self.algo}] summary; the paper reports {self.headline}:")
        for key, v in summary.items():
            if isinstance(v, dict) and {"best", "final", "last10_mean"} <= set(v):
                show(f"  {key:>22s}: best {v['best']:.2f}  final {v['final']:.2f}  {mean_of} {v['last10_mean']:.2f}")
        show(f"  {self.elapsed:.1f} s, {summary['mb_down']:.1f} MB down, {summary['mb_up']:.1f} MB up; "
             f"files in {self.dir}")
        return summary

    def close(self, failed=False, diverged=False):
        """Release the folder: a run that failed before any result leaves nothing; a diverged one says so."""
        if self not in OPEN_RUNS:
            return
        OPEN_RUNS.remove(self)
        if not self.interrupted:  # after a signal run_main ignores further ones until the process ends
            restore_signals(self.previous_handlers)
        if self.dir and failed and not diverged and self.made and not any(
                os.path.lexists(os.path.join(self.dir, name)) for name in ("metrics.csv", "checkpoint.pt")):
            shutil.rmtree(self.dir, ignore_errors=True)
            self.remove_made()
        elif self.dir and diverged and not self.finished:
            with contextlib.suppress(OSError):  # a full disk: the metrics so far are what is left
                self.summary(status="diverged")
        if self.lock is not None:
            self.lock.release()
            with contextlib.suppress(OSError):
                os.remove(self.lock.lock_file)
