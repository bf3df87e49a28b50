"""tools/fedavg_variants.py --local-training: the "Local Training" row of pFedLA's Tables 1-2 (each client
alone, no aggregation), checked against an independent chain of local training per client; and
tools/fedavg_variants.py --eval-local-models, FedAvg's trained models before aggregation, evaluated by hand.
Both were fedavg.py's flags: its runs made with them continue here after tools/run_records.py --upgrade;
fedavg.py refuses the flags as any it does not have."""
import json
import os

import pytest
import torch

import common
import fedavg
import fedpake
import pfedla
import run_folder
from conftest import metrics_rows, run_dir
from tools import fedavg_variants, run_records

FLAGS = ["--dataset", "synthetic", "--num-clients", "3", "--local-epochs", "2", "--batch-size", "8",
         "--checkpoint-every", "1", "--device", "cpu"]


def test_each_client_trains_alone_from_the_common_initial_model(tmp_path, one_thread):
    run_folder.run_main(fedavg_variants.main, [*FLAGS, "--rounds", "2", "--local-training", "--out", str(tmp_path)])
    folder = run_dir(tmp_path)
    assert os.path.basename(folder).startswith("local-")
    blob = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)
    args = fedavg.parse_args([*FLAGS, "--rounds", "2"])
    data = common.load_federated_data(args, torch.device("cpu"))
    model = common.build_model(args.model, data)
    model.load_state_dict(blob["state"]["global_model"])  # never aggregated: still the initial model
    initial = common.flatten_state(model).clone()
    expected, accuracies = [], []
    for client in range(3):  # round 1 and round 2 of one client, nobody else involved
        common.load_flat_state(model, initial)
        for round_ in (1, 2):
            common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, round_, client))
        expected.append(common.flatten_state(model).clone())
        c, n, _ = common.evaluate(model, data, [data.test_idx[client]])
        accuracies.append(float(c[0] / n[0]))
    assert torch.equal(blob["state"]["local_models"], torch.stack(expected))
    assert not torch.equal(expected[0], expected[1])  # the clients did not end on one model
    last = metrics_rows(folder)[-1]
    assert float(last["test_acc_mean"]) == pytest.approx(100 * sum(accuracies) / 3, abs=1e-4)
    assert float(last["mb_down"]) == 0 and float(last["mb_up"]) == 0  # nothing is sent


@pytest.mark.slow  # an end-to-end run of seconds; in CI with the full suite
def test_local_training_differs_from_fedavg_and_resumes_to_the_uninterrupted_metrics(tmp_path, one_thread):
    flags = [*FLAGS, "--rounds", "3", "--local-training"]
    run_folder.run_main(fedavg_variants.main, [*flags, "--out", str(tmp_path / "full")])
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg_variants.main, [*flags, "--out", str(tmp_path / "part"), "--stop-after", "2"])
    assert stop.value.code == 0
    run_folder.run_main(fedavg_variants.main, ["--resume", run_dir(tmp_path / "part")])
    columns = ("round", "test_acc", "test_acc_mean", "test_acc_std", "test_loss", "train_loss")
    rows = lambda out: [[r[k] for k in columns] for r in metrics_rows(run_dir(out))]
    assert rows(tmp_path / "part") == rows(tmp_path / "full")
    run_folder.run_main(fedavg.main, [*FLAGS, "--rounds", "3", "--out", str(tmp_path / "fedavg")])
    assert rows(tmp_path / "fedavg") != rows(tmp_path / "full")


def test_eval_local_models_reports_the_trained_models_before_aggregation_and_changes_nothing(tmp_path, one_thread):
    flags = ["--dataset", "synthetic", "--num-clients", "6", "--local-epochs", "1", "--batch-size", "8",
             "--checkpoint-every", "1", "--device", "cpu", "--rounds", "2"]
    run_folder.run_main(fedavg_variants.main, [*flags, "--eval-local-models", "--out", str(tmp_path / "eval")])
    run_folder.run_main(fedavg.main, [*flags[:-1], "1", "--out", str(tmp_path / "one")])
    # by hand: round 2 starts every client from the global model after round 1, trains, and tests it alone
    args = fedavg.parse_args(flags)
    data = common.load_federated_data(args, torch.device("cpu"))
    model = common.build_model(args.model, data)
    blob = torch.load(os.path.join(run_dir(tmp_path / "one"), "checkpoint.pt"), weights_only=False)
    model.load_state_dict(blob["state"]["global_model"])
    global_after_1 = common.flatten_state(model).clone()
    correct, count, loss = [], [], []
    for client in range(6):
        common.load_flat_state(model, global_after_1)
        common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, 2, client))
        c, n, l = common.evaluate(model, data, [data.test_idx[client]])
        correct.append(float(c[0]))
        count.append(float(n[0]))
        loss.append(float(l[0]))
    rows = metrics_rows(run_dir(tmp_path / "eval"))
    assert float(rows[1]["local_model_acc_mean"]) == pytest.approx(
        100 * sum(c / n for c, n in zip(correct, count)) / 6, abs=1e-4)
    assert float(rows[1]["local_model_acc"]) == pytest.approx(100 * sum(correct) / sum(count), abs=1e-4)
    assert float(rows[1]["local_model_loss"]) == pytest.approx(sum(loss) / sum(count), rel=1e-5)
    assert rows[1]["local_model_loss"] != rows[1]["test_loss"]  # not the global model again
    # the global model's columns are those of a plain FedAvg run, bit for bit
    run_folder.run_main(fedavg.main, [*flags, "--out", str(tmp_path / "plain")])
    plain = metrics_rows(run_dir(tmp_path / "plain"))
    columns = ("round", "test_acc", "test_acc_mean", "test_acc_std", "test_loss", "train_loss")
    assert [[r[k] for k in columns] for r in rows] == [[r[k] for k in columns] for r in plain]
    assert "local_model_acc" not in plain[0]


def test_eval_local_models_with_local_training_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg_variants.main, [*FLAGS, "--local-training", "--eval-local-models", "--out",
                                                   str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--eval-local-models" in err[0]
    assert os.listdir(tmp_path) == []


def test_without_either_flag_a_new_run_is_refused_and_a_fedavg_py_run_continues_only_with_fedavg_py(
        tmp_path, capsys, one_thread):
    """Plain FedAvg is fedavg.py: the program refuses a new run without --local-training or --eval-local-models
    (exit 2, one line, nothing written) instead of running it; a fedavg.py run resumes only with fedavg.py, the
    program that made it (config.json's script): the program says so in one line."""
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg_variants.main, [*FLAGS, "--out", str(tmp_path / "refused")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "--local-training or --eval-local-models" in err[0]
    assert not os.path.exists(tmp_path / "refused")
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, [*FLAGS, "--rounds", "2", "--out", str(tmp_path / "plain"),
                                          "--stop-after", "1"])
    assert stop.value.code == 0
    folder = run_dir(tmp_path / "plain")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg_variants.main, ["--resume", folder])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and f"use python fedavg.py --resume {folder}" in err[0]
    assert len(metrics_rows(folder)) == 1  # nothing written
    run_folder.run_main(fedavg.main, ["--resume", folder])
    assert len(metrics_rows(folder)) == 2


def test_fedavg_py_refuses_the_moved_flags_and_their_old_runs_resume_here_after_the_upgrade(tmp_path, capsys,
                                                                                           one_thread):
    """fedavg.py refuses the moved flags as any flag it does not have (argparse's one line). A run made as
    ``fedavg.py --local-training`` (config.json as that version wrote it) is refused by fedavg.py as of an older
    form; tools/run_records.py --upgrade makes it tools/fedavg_variants.py's (script and command), which then
    continues it to the uninterrupted run's metrics (fedavg.py names the program)."""
    for flag in ("--local-training", "--eval-local-models"):
        with pytest.raises(SystemExit) as stop:
            run_folder.run_main(fedavg.main, [*FLAGS, flag, "--out", str(tmp_path / "refused")])
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip() == f"error: unrecognized arguments: {flag}"
    assert not os.path.exists(tmp_path / "refused")
    flags = [*FLAGS, "--rounds", "2", "--local-training"]
    assert run_records.todays_command(["fedavg.py", *flags]) == ["tools/fedavg_variants.py", *flags]  # tests/test_results
    run_folder.run_main(fedavg_variants.main, [*flags, "--out", str(tmp_path / "full")])
    with pytest.raises(SystemExit):
        run_folder.run_main(fedavg_variants.main, [*flags, "--out", str(tmp_path / "old"), "--stop-after", "1"])
    folder = run_dir(tmp_path / "old")
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["script"], config["command"] = "fedavg", ["fedavg.py", *flags]  # as fedavg.py wrote it
    with open(path, "w") as f:
        json.dump(config, f)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--resume", folder])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and f"python tools/run_records.py --upgrade {folder}" in err[0]
    assert run_records.main(["--upgrade", folder]) == 0
    with open(path) as f:
        upgraded = json.load(f)
    assert upgraded["script"] == "tools/fedavg_variants" and upgraded["command"][0] == "tools/fedavg_variants.py"
    assert upgraded["command_line"].startswith("python tools/fedavg_variants.py ")
    with pytest.raises(SystemExit) as stop:
        run_folder.run_main(fedavg.main, ["--resume", folder])
    assert stop.value.code == 2 and "use python tools/fedavg_variants.py --resume" in capsys.readouterr().err
    run_folder.run_main(fedavg_variants.main, ["--resume", folder])
    assert metrics_rows(folder)[-1]["test_acc_mean"] == metrics_rows(run_dir(tmp_path / "full"))[-1]["test_acc_mean"]


@pytest.mark.parametrize("threads", [1, 2])
def test_fedavg_client_update_is_common_local_train_bit_for_bit(threads):
    """fedavg.py writes out Alg. 1's ClientUpdate; the other scripts' clients train with common.local_train (FedPake's
    and pFedLA's client_update over it): the same trained model and loss, bit for bit, with momentum, weight decay,
    several epochs and an uneven last batch, on one torch thread and on two. What holds them together."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        args = fedavg.parse_args(["--dataset", "synthetic", "--num-clients", "4", "--local-epochs", "3",
                                  "--batch-size", "7", "--momentum", "0.9", "--weight-decay", "1e-3", "--lr", "0.05"])
        data = common.load_federated_data(args, torch.device("cpu"))
        assert any(len(data.train_idx[c]) % 7 not in (0, 1) for c in range(4))  # an uneven last batch
        torch.manual_seed(3)
        model = common.build_model(args.model, data)
        start = common.flatten_state(model).detach().clone() + 0.01
        for client in range(4):
            ours, our_loss = fedavg.client_update(model, start, data, client, args, 2)
            assert (ours - start).abs().max() > 1e-3  # it trained
            common.load_flat_state(model, start)
            by_hand = common.local_train(model, data, data.train_idx[client], args,
                                         common.client_seed(args.seed, 2, client))
            assert torch.equal(common.flatten_state(model), ours) and torch.equal(by_hand, our_loss)
            for script in (fedpake, pfedla):
                theirs, their_loss = script.client_update(model, start, data, client, args, 2)
                assert torch.equal(theirs, ours) and torch.equal(their_loss, our_loss), script.__name__
    finally:
        torch.set_num_threads(previous)
