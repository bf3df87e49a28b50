"""PFLlib's own FedAvg and FedALA (the FedALA authors' code) beside ours, round by round, on the
leaderboard's Fashion-MNIST dir clients (docs/results.md, "Cross-check").

    python tools/pfllib_crosscheck.py run fedavg --pfllib CHECKOUT --data-dir DIR --evaluations 31 \
        --out results/crosscheck-pfllib/fedavg-dir-s0.csv       # PFLlib's code, on the CPU, one thread
    python tools/pfllib_crosscheck.py report --results results   # the table docs/results.md pastes

`run` drives PFLlib's `system/` at commit d832e76, read from CHECKOUT (a clone of TsingZ0/PFLlib; it is
not changed) into a temporary folder, on DIR/FashionMNIST-dir (tools/pfllib_fmnist.sh): main.py's own
argument parser with its defaults (the leaderboard's setting), its FedAvgCNN, its FedAvg or FedALA server
and clients, unchanged; `torch.manual_seed(0)` as main.py, numpy and random seeded 0 too. Each of
PFLlib's evaluations (pooled accuracy over all clients' test files, at the start of a round) is written
to OUT as it comes, so a stopped run keeps its rows. PFLlib's code imports scikit-learn and h5py: run
`run` with a Python that has them and sees our torch, made by `python tools/pfllib_venv.py VENV scikit-learn h5py`
from the project's environment (a virtual environment too), never ours.

`report` sets PFLlib's rows beside our runs of results/pfllib-fmnist/dir (each seed's newest run).
PFLlib's evaluation k follows k rounds of training; our FedAvg's round k is its evaluation k, our
FedALA's round k+1 (both evaluate the ALA-initialised models before local training).
"""
import argparse
import ast
import csv
import glob
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

from tools import compare  # noqa: E402
from tools.compare import fail  # noqa: E402  one line on stderr, exit status 2

PFLLIB_COMMIT = "d832e76"
ALGORITHMS = {"fedavg": "FedAvg", "fedala": "FedALA"}
SEEDS = (0, 1, 2)


def test_acc_by_round(path):
    """{round: test_acc} of a csv file (ours or the rows `run` writes), read by compare.read_metrics:
    its bad lines left out; {} if it is missing or has no test_acc."""
    _, series, _ = compare.read_metrics(path)
    return dict((series or {}).get("test_acc", []))


def our_runs(results, method):
    """{seed: {round: test_acc}} of our newest run of each seed in results/pfllib-fmnist/dir/METHOD."""
    runs = {}
    for seed in SEEDS:
        seed_dir = os.path.join(results, "pfllib-fmnist", "dir", method, f"seed{seed}")
        found = sorted(glob.glob(os.path.join(glob.escape(seed_dir), "*", "metrics.csv")))  # names end in the time
        if found:
            runs[seed] = test_acc_by_round(found[-1])
    return runs


def mean_std(values):
    """'a / b / c (mean ± std)' with the sample std (n - 1), or the single value."""
    shown = " / ".join(f"{v:.2f}" for v in values)
    if len(values) < 2:
        return shown
    return f"{shown} ({np.mean(values):.2f} ± {np.std(values, ddof=1):.2f})"


def comparison(results):
    """The table's rows and, per algorithm, PFLlib's differences to our seeds' mean and band."""
    pfllib, ours, shift = {}, {}, {"fedavg": 0, "fedala": 1}
    for method in ALGORITHMS:
        path = os.path.join(results, "crosscheck-pfllib", f"{method}-dir-s0.csv")
        pfllib[method] = test_acc_by_round(path)
        ours[method] = our_runs(results, method)
    last = max((k for rows in pfllib.values() for k in rows), default=-1)
    rows, gaps = [], {m: [] for m in ALGORITHMS}
    for k in range(last + 1):
        cells = [str(k)]
        for method in ALGORITHMS:
            theirs = pfllib[method].get(k)
            seeds = [runs[k + shift[method]] for runs in ours[method].values() if k + shift[method] in runs]
            cells.append("-" if theirs is None else f"{theirs:.2f}")
            cells.append(mean_std(seeds) if seeds else "-")
            if theirs is not None and seeds and k >= 1:  # k = 0: the initial model, which the seed sets
                gaps[method].append((k, theirs - np.mean(seeds), theirs > max(seeds), theirs < min(seeds)))
        if k <= 10 or k % 5 == 0 or k == last:
            rows.append(cells)
    seeds_of = {m: "/".join(str(s) for s in ours[m]) for m in ALGORITHMS}
    return rows, gaps, seeds_of


def report(results):
    rows, gaps, seeds_of = comparison(results)
    print(f"| after k rounds | PFLlib FedAvg | ours FedAvg, seeds {seeds_of['fedavg']} (mean ± std) | "
          f"PFLlib FedALA | ours FedALA, seeds {seeds_of['fedala']} (mean ± std) |")
    print("|---|---|---|---|---|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print()
    for method, name in ALGORITHMS.items():
        if not gaps[method]:
            continue
        d = np.array([g[1] for g in gaps[method]])
        print(f"- {name}: {len(d)} evaluations (k = {gaps[method][0][0]}-{gaps[method][-1][0]}); PFLlib minus our "
              f"seeds' mean: {d.mean():+.2f} on average, from {d.min():+.2f} to {d.max():+.2f}; above our best seed in "
              f"{sum(g[2] for g in gaps[method])}, below our worst in {sum(g[3] for g in gaps[method])}")


def main_parser_defaults(system):
    """PFLlib's main.py parser, built from its source (the statements of its ``__main__`` block up to
    ``parse_args``), so that its defaults are read, not copied."""
    tree = ast.parse(open(os.path.join(system, "main.py")).read())
    block = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)][0]
    body = []
    for stmt in block.body:
        if "parse_args" in ast.unparse(stmt):
            break
        body.append(stmt)
    scope = {"argparse": argparse, "time": time}
    exec(compile(ast.Module(body=body, type_ignores=[]), "main.py", "exec"), scope)
    return scope["parser"]


def drive(method, evaluations, out, system, device="cpu"):
    """Run PFLlib's server ``method`` from ``system`` (cwd) until ``evaluations`` are written to ``out``, on
    ``device`` (cpu: one thread; cuda: main.py's -dev cuda, the first GPU)."""
    import torch
    if device == "cpu":
        torch.set_num_threads(1)
    sys.path.insert(0, system)
    args = main_parser_defaults(system).parse_args(["-data", "FashionMNIST-dir", "-m", "CNN", "-algo",
                                                    ALGORITHMS[method], "-dev", device])
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    from flcore.trainmodel.models import FedAvgCNN
    from flcore.servers.serverbase import Server
    args.model = FedAvgCNN(in_features=1, num_classes=args.num_classes, dim=1024).to(args.device)
    if method == "fedavg":
        from flcore.servers.serveravg import FedAvg as PFLlibServer
    else:
        from flcore.servers.serverala import FedALA as PFLlibServer

    class Done(Exception):
        pass

    evaluate = Server.evaluate
    with open(out, "x", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "test_acc", "train_loss", "seconds"])

        def evaluate_and_write(self, acc=None, loss=None):
            evaluate(self, acc, loss)
            k = len(self.rs_test_acc) - 1
            writer.writerow([k, f"{100 * self.rs_test_acc[-1]:.6f}", f"{self.rs_train_loss[-1]:.6f}",
                             f"{time.time() - start:.1f}"])
            f.flush()
            if k + 1 >= evaluations:
                raise Done

        Server.evaluate = evaluate_and_write
        server = PFLlibServer(args, 0)
        start = time.time()
        try:
            server.train()
        except Done:
            pass


def run(method, evaluations, out, checkout, data_dir, device="cpu"):
    out = os.path.abspath(out)
    folder = os.path.join(os.path.abspath(data_dir), "FashionMNIST-dir")
    if os.path.lexists(out):
        fail(f"{out} exists: give a new --out (its rows are kept)")
    if not os.path.isdir(os.path.join(folder, "train")):
        fail(f"{folder}/train is missing: write PFLlib's clients with bash tools/pfllib_fmnist.sh {data_dir}")
    for module in ("sklearn", "h5py"):
        try:
            __import__(module)
        except ImportError:
            fail(f"PFLlib's code imports {module}: run this with the Python of a venv made by "
                 "python tools/pfllib_venv.py VENV scikit-learn h5py (docs/results.md)")
    work = tempfile.mkdtemp()
    try:
        archive = subprocess.run(["git", "-C", checkout, "archive", PFLLIB_COMMIT, "system"], capture_output=True)
        if archive.returncode:
            fail(f"cannot read PFLlib @ {PFLLIB_COMMIT} from {checkout}: "
                 f"{archive.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
        subprocess.run(["tar", "-x", "-C", work], input=archive.stdout, check=True)
        os.makedirs(os.path.join(work, "dataset"))
        os.symlink(folder, os.path.join(work, "dataset", "FashionMNIST-dir"))  # its reader opens ../dataset/NAME/
        os.chdir(os.path.join(work, "system"))
        drive(method, evaluations, out, os.getcwd(), device)
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report", help="the table, from --results")
    p.add_argument("--results", default=os.path.join(ROOT, "results"),
                   help="the folder holding crosscheck-pfllib/ and pfllib-fmnist/dir/ (default: this project's results/)")
    p = sub.add_parser("run", help="PFLlib's own FedAvg or FedALA, one thread, on the CPU (or --device)")
    p.add_argument("method", choices=sorted(ALGORITHMS))
    p.add_argument("--pfllib", required=True, help="a clone of TsingZ0/PFLlib holding commit " + PFLLIB_COMMIT)
    p.add_argument("--data-dir", required=True, help="the folder holding FashionMNIST-dir")
    p.add_argument("--evaluations", type=int, default=31, help="PFLlib's evaluations 0..N-1 (default 31)")
    p.add_argument("--out", required=True, help="a new csv file")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu (one thread, the cross-check's) or cuda (PFLlib's round timed on a GPU)")
    args = parser.parse_args(argv)
    if args.command == "report":
        report(args.results)
    else:
        if args.evaluations < 1:
            fail("--evaluations must be at least 1")
        run(args.method, args.evaluations, args.out, args.pfllib, args.data_dir, args.device)


if __name__ == "__main__":
    main()
