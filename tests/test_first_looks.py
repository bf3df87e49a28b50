"""Each algorithm's first look (the opening of docs/ALGO.md) and docs/layout.md's FedProx example state what they
print: the commands of the first fenced bash block, and beside them the lines they print (a `text` block), which
the slow test runs and compares digit for digit, the times aside. The fast tests hold the rest of what the
openings say: the comparison runs FedAvg on the same clients and budget, the machine and CPU seconds are stated,
and fedpake.py's line for a round whose clients are each their own Macro-Class."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

ALGORITHMS = ["fedavg", "fedala", "pfedla", "fedpake", "fedacd"]
PLACES = [(f"docs/{name}.md", None) for name in ALGORITHMS] + [("docs/layout.md", "## Adding your own algorithm")]
TIMES = re.compile(r"\d+\.\d+ s this round, mean \d+\.\d+ s/round \| ETA \S+|aggregation \d+\.\d+ s$")
# what decides the clients and the budget: equal in a first look and the FedAvg beside it
SAME = ["dataset", "partition", "beta", "classes_per_client", "samples_per_client", "dominant_share", "balance",
        "num_clients", "join_ratio", "rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay",
        "test_split", "train_ratio", "seed"]


def section(doc, heading):
    text = open(os.path.join(ROOT, doc)).read()
    return text.split("\n## ", 1)[0] if heading is None else text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def block(text, kind):
    """The lines of the first fenced block of ``kind`` (bash or text)."""
    return text.split(f"```{kind}\n", 1)[1].split("```", 1)[0].splitlines()


def commands(doc, heading):
    """argv (after python) of each command of the first bash block, comments dropped."""
    return [shlex.split(line.split("  #", 1)[0])[1:] for line in block(section(doc, heading), "bash")
            if line.startswith("python ")]


def parsed(argv):
    import importlib
    name = os.path.basename(argv[0])[:-3]
    module = importlib.import_module(f"tools.{name}" if argv[0].startswith("tools/") else name) \
        if not argv[0].startswith("docs/") else None
    if module is None:  # docs/examples/fedprox.py
        import importlib.util
        spec = importlib.util.spec_from_file_location("fedprox_example", os.path.join(ROOT, argv[0]))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return vars(module.parse_args(argv[1:])), module


@pytest.mark.parametrize("doc, heading", PLACES)
def test_each_first_look_runs_its_algorithm_beside_fedavg_on_the_same_clients_and_budget(doc, heading):
    (own, own_module), *others = [parsed(argv) for argv in commands(doc, heading)]
    if doc != "docs/fedavg.md":
        assert others, f"{doc}: no FedAvg beside the first look"
    for args, module in others:
        assert {k: args[k] for k in SAME} == {k: own[k] for k in SAME}, doc
        model = lambda a, m: getattr(m, "AUTO_IMAGE", "cnn") if a["model"] == "auto" else a["model"]  # noqa: E731
        assert model(args, module) == model(own, own_module), doc
        assert module.__name__ in ("fedavg", "tools.fedacd_diagnostics") and args.get("fedavg", True) is True
    if heading is None:
        opening = section(doc, heading)
        assert re.search(r"\d+ CPU seconds \(user \+ sys, `time`; \d+ s of wall time\) on a 2-core AMD EPYC "
                         r"\(cpu family \d+, model \d+\)", " ".join(opening.split())), doc
        assert own["rounds"] <= 5


def printed(argv, out):
    """What ``python argv --threads 2 --out out`` prints (the figures of the docs are at 2 torch threads)."""
    done = subprocess.run([sys.executable, *argv, "--threads", "2", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


@pytest.mark.slow  # the first looks themselves: 1 to 4 minutes each on 2 cores: by hand, with --first-looks
@pytest.mark.first_looks
@pytest.mark.parametrize("doc, heading", PLACES)
def test_the_lines_a_first_look_shows_are_what_its_commands_print(doc, heading, tmp_path):
    if heading is None and not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    shown = [line.strip() for line in block(section(doc, heading), "text")]
    lines = [TIMES.sub("TIMES", line.strip()) for k, argv in enumerate(commands(doc, heading))
             for line in printed(argv, tmp_path / str(k))]
    missing = [line for line in shown if TIMES.sub("TIMES", line) not in lines]
    assert not missing, f"{doc}: lines it shows that its commands do not print: {missing}"


def test_fedpake_says_when_a_round_s_aggregation_is_fedavg_s(tmp_path, one_thread, capsys):
    """Each client its own Macro-Class (4 clients, --n-macro 4 here): one line under the round, and the global model
    is FedAvg's to float rounding; clients that share Macro-Classes (--n-macro 2): no line, another model."""
    import torch
    import fedavg
    import fedpake
    import run_folder
    flags = ["--dataset", "synthetic", "--num-clients", "4", "--rounds", "2", "--threads", "1"]

    def final_model(script, extra, out):
        run_folder.run_main(script.main, [*flags, *extra, "--out", str(tmp_path / out)])
        (folder,) = os.listdir(tmp_path / out)
        state = torch.load(tmp_path / out / folder / "checkpoint.pt", weights_only=True)["state"]["global_model"]
        return torch.cat([v.flatten() for v in state.values()]), capsys.readouterr().out

    alone, out = final_model(fedpake, [], "alone")
    assert "[fedpake]   round 2: each client is its own Macro-Class: the aggregation is FedAvg's" in out, out
    assert "4 Macro-Classes" in out
    average, _ = final_model(fedavg, [], "fedavg")
    assert torch.allclose(alone, average, rtol=0, atol=1e-6)
    shared, out = final_model(fedpake, ["--n-macro", "2"], "shared")
    assert "its own Macro-Class" not in out and "2 Macro-Classes" in out
    assert not torch.allclose(shared, average, rtol=0, atol=1e-6)
