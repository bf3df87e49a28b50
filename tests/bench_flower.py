"""Seconds per round of one run three ways: the plain script, flower/app.py's simulation, and a
deployment on this machine (a SuperLink and N SuperNodes on 127.0.0.1, tests/deploy.py); run
by hand, pytest does not collect it.

    python tests/bench_flower.py                       # fedavg, synthetic data, 4 clients, 8 rounds, twice
    python tests/bench_flower.py --algorithm fedala --rounds 10 --repeats 1
    python tests/bench_flower.py --kill-node           # and a deployment that loses node N-1 after round 2

The three run interleaved (script, simulation, deployment, script, ...), since this machine's
speed drifts. Seconds per round come from each run's metrics.csv (``sec_per_round``), over
rounds 2 on (round 1 holds the start-up: Ray, the nodes' workers loading the data). With
``--kill-node``, node N-1 is killed (SIGKILL to its process group) once round 2 is logged; the
table then shows the round that waited for the SuperLink to declare it lost, and the median
of the rounds after it.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, metrics_rows  # noqa: E402
from deploy import Deployment  # noqa: E402


def seconds_per_round(folder):
    return [float(r["sec_per_round"]) for r in metrics_rows(folder)]


def only_run(out):
    (name,) = os.listdir(out)
    return os.path.join(out, name)


def script(args, out):
    subprocess.run([sys.executable, os.path.join(ROOT, f"{args.algorithm}.py"), *flags(args), "--out", out],
                   check=True, capture_output=True, timeout=3600)
    return seconds_per_round(only_run(out))


def simulation(args, out):
    subprocess.run([sys.executable, os.path.join(ROOT, "flower", "app.py"), args.algorithm, *flags(args), "--out", out],
                   check=True, capture_output=True, timeout=3600)
    return seconds_per_round(only_run(out))


def deployment(args, out, kill=False):
    with Deployment(out + "-deployment", num_nodes=args.num_clients) as d:
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "flower", "app.py"), args.algorithm, *flags(args),
                                 "--out", out, "--federation", "local"], cwd=d.folder, env=d.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if kill:
            deadline = time.monotonic() + 1800
            while not (os.path.isdir(out) and os.listdir(out) and
                       os.path.exists(os.path.join(only_run(out), "metrics.csv")) and
                       len(metrics_rows(only_run(out))) >= 2):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the deployment did not reach round 2")
                time.sleep(0.2)
            d.kill_node(args.num_clients - 1)
        output, _ = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"the deployment failed:\n{output[-2000:]}")
    return seconds_per_round(only_run(out))


def flags(args):
    return ["--dataset", args.dataset, "--num-clients", str(args.num_clients), "--rounds", str(args.rounds)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="fedavg", choices=["fedavg", "fedala", "pfedla", "fedpake", "fedacd"])
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--num-clients", type=int, default=4, help="clients = SuperNodes in the deployment")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kill-node", action="store_true", help="also a deployment that loses a node after round 2")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.algorithm} on {args.dataset}, "
          f"{args.num_clients} clients, {args.rounds} rounds", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            ways = [("script", script), ("simulation", simulation), ("deployment", deployment)]
            if args.kill_node:
                ways.append(("deployment, node lost", lambda a, o: deployment(a, o, kill=True)))
            for name, way in ways:
                per_round = way(args, os.path.join(tmp, f"{name.replace(' ', '').replace(',', '-')}-{repeat}"))
                results.setdefault(name, []).append(per_round)
                print(f"  {name:>22}: round 1 {per_round[0]:.2f} s, rounds 2-{args.rounds} median "
                      f"{statistics.median(per_round[1:]):.2f} s", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}\n")
    print("| run | round 1 (s) | rounds 2 on, median s/round |\n|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {', '.join(f'{r[0]:.2f}' for r in runs)} | "
              f"{', '.join(f'{statistics.median(r[1:]):.2f}' for r in runs)} |")
    if args.kill_node:
        print("\nnode lost after round 2: per round s " +
              "; ".join(", ".join(f"{v:.1f}" for v in r) for r in results["deployment, node lost"]))


if __name__ == "__main__":
    main()
