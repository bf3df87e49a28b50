"""docs/examples/fedprox.py, the example of docs/layout.md ("Adding your own algorithm"): its proximal term on a
hand-checkable case, mu = 0 is FedAvg's client update bit for bit, a larger mu keeps the client nearer the
global model, and the script runs from the command line into its run folder and refuses a bad flag in one line."""
import importlib.util
import json
import os

import pytest
import torch
import torch.nn as nn

import common
import fedavg
from conftest import ROOT, metrics_rows, run_dir, run_script

SCRIPT = os.path.join("docs", "examples", "fedprox.py")
spec = importlib.util.spec_from_file_location("fedprox_example", os.path.join(ROOT, SCRIPT))
fedprox = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fedprox)


def test_the_proximal_term_is_mu_half_the_squared_distance_over_the_parameters():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.fill_(3.0)
    global_params = [torch.tensor([[0.0, 0.0]]), torch.tensor([1.0])]
    # ||w - w^t||^2 = 1 + 4 + 4 = 9; mu = 0.5: 0.25 * 9
    assert float(fedprox.proximal_term(model, global_params, 0.5).detach()) == 2.25
    assert float(fedprox.proximal_term(model, [p.detach() for p in model.parameters()], 10.0).detach()) == 0.0


def updates(mu, one_thread):
    args = fedprox.parse_args(["--dataset", "synthetic", "--num-clients", "4", "--mu", str(mu), "--device", "cpu",
                               "--local-epochs", "3", "--lr", "0.05"])
    data = common.load_federated_data(args, torch.device("cpu"))
    torch.manual_seed(0)
    model = common.build_model(args.model, data)
    global_state = common.flatten_state(model)
    theirs = fedprox.client_update(model, global_state, data, 1, args, 1)
    fedavg_args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "4", "--device", "cpu",
                                     "--local-epochs", "3", "--lr", "0.05"])
    return global_state, theirs, fedavg.client_update(model, global_state, data, 1, fedavg_args, 1)


def test_mu_0_is_fedavg_s_client_update_and_a_larger_mu_stays_nearer_the_global_model(one_thread):
    global_state, (prox0, loss0), (avg, avg_loss) = updates(0.0, one_thread)
    assert torch.equal(prox0, avg) and torch.equal(loss0, avg_loss)
    distances = [float((updates(mu, one_thread)[1][0] - global_state).norm()) for mu in (0.0, 1.0, 10.0)]
    assert distances[0] > distances[1] > distances[2] > 0, distances


@pytest.mark.slow  # two interpreter starts with torch: 8 s idle, a minute under load
def test_the_script_runs_from_the_command_line_into_its_run_folder_and_refuses_a_bad_mu(tmp_path):
    done = run_script(SCRIPT, "--dataset", "synthetic", "--rounds", "2", "--mu", "0.01", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    run = run_dir(tmp_path)
    assert os.path.basename(run).startswith("fedprox-synthetic-s0-")
    config = json.load(open(os.path.join(run, "config.json")))
    assert config["script"] == "docs/examples/fedprox" and config["args"]["mu"] == 0.01
    assert config["command"][0].endswith(SCRIPT)
    assert [r["round"] for r in metrics_rows(run)] == ["1", "2"]
    assert json.load(open(os.path.join(run, "summary.json")))["status"] == "finished"
    bad = run_script(SCRIPT, "--dataset", "synthetic", "--mu", "-1", "--out", tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: --mu must be >= 0, got -1.0"]
