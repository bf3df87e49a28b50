"""The bugs users of other FL libraries report most (PFLlib, FL-bench, 2025-26), each a test that fails on it,
for every script where it applies:

1. a tensor aliased where a copy was meant (FL-bench #165): no client's update shares storage with the global
   model or with another client's: mutate one, the others stay;
2. per-client state that does not survive a round: FedALA's W and local models, pFedLA's hypernetworks and
   stored models, across rounds and across a stop and --resume; FedACD keeps no class statistics between rounds
   (P^m is estimated afresh from the received model), so it has no such state and none is checkpointed;
3. an evaluation that averages other clients or another model than the docs say (FL-bench #204), checked on a
   case where the two readings differ (join ratio 0.5: the joining clients are not all clients);
4. a partition whose class counts do not add up (PFLlib #231), for every --partition.
Synthetic and tiny: seconds each."""
import os

import numpy as np
import pytest
import torch

import common
import data_partition
import datasets
import fedacd
import fedala
import fedavg
import fedpake
import pfedla
from conftest import metrics_rows, run_dir, run_in_process
from test_main_loops import HN_TENSORS, hypernetwork_alpha, layerwise, plain_ala

TINY = ["--dataset", "synthetic", "--num-clients", "4", "--local-epochs", "1", "--batch-size", "16", "--device", "cpu",
        "--checkpoint-every", "1", "--parallel-clients", "1"]
SCRIPTS = {"fedavg": fedavg, "fedala": fedala, "pfedla": pfedla, "fedpake": fedpake, "fedacd": fedacd}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def checkpoint(folder):
    return torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)


def sampled(seed, num_clients, join_ratio, rounds):
    """The clients each round samples: the scripts' numpy stream (common.seed_everything) is used for nothing else."""
    rng = common.seed_everything(seed)
    return [common.sample_clients(rng, num_clients, join_ratio) for _ in range(rounds)]


# ----------------------------------------------------------------------------- 1. no shared storage

def two_updates(script):
    """(the state a client starts from, the global model, a function training client c on one worker model and
    returning its uploaded flat model) for ``script``'s client_update, in round 2."""
    module = SCRIPTS[script]
    args = module.parse_args([*TINY])
    data = common.load_federated_data(args, torch.device("cpu"))
    torch.manual_seed(0)
    global_model = common.build_model(args.model, data)
    start = common.flatten_state(global_model)
    worker = common.build_model(args.model, data)
    if script in ("fedavg", "fedpake"):
        return start, global_model, lambda c: module.client_update(worker, start, data, c, args, 2)[0]
    if script == "fedala":
        ala = fedala.ALA(global_model, args.num_clients, batch_size=args.batch_size)
        local_models = (start + 0.01 * torch.randn(args.num_clients, len(start))).contiguous()  # older local models
        return start, global_model, lambda c: fedala.client_update(worker, global_model, local_models[c], ala, data,
                                                                   c, args, 2)[0]
    if script == "pfedla":
        return start, global_model, lambda c: pfedla.client_update(worker, start, data, c, args, 2)[0]
    classes = fedacd.held_classes(data)
    return start, global_model, lambda c: fedacd.client_update(worker, start, data, c, classes, args, 2)[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_client_update_shares_storage_with_the_global_model_or_another_client_s(script):
    """One worker model trains client 0, then client 1 (as ClientPool reuses its models): client 0's upload stays
    what it was; mutating either upload changes neither the other, nor the global model, nor the worker."""
    start, global_model, update = two_updates(script)
    start_copy, global_copy = start.clone(), common.flatten_state(global_model).clone()
    first = update(0)
    first_copy = first.clone()
    second = update(1)
    second_copy = second.clone()
    assert torch.equal(first, first_copy) and not torch.equal(first, second)  # the worker went on training
    first.add_(1.0)  # a later step (FedDyn's correction, a logged difference) writes into one upload
    assert torch.equal(second, second_copy) and torch.equal(start, start_copy)
    assert torch.equal(common.flatten_state(global_model), global_copy)
    second.mul_(-1.0)
    assert torch.equal(first, first_copy + 1.0) and torch.equal(start, start_copy)
    assert torch.equal(common.flatten_state(global_model), global_copy)


@pytest.mark.parametrize("script", ["fedavg", "fedpake", "fedacd"])
def test_the_new_global_model_shares_no_storage_with_the_uploads(script):
    """The server's step returns a new model: writing into it leaves the uploads as they were."""
    uploads = torch.randn(3, 50) + 1
    if script == "fedacd":
        new = fedacd.server_update(list(uploads), [torch.tensor(0.6, dtype=torch.float64)] * 3)
    elif script == "fedpake":
        new = fedpake.server_update(uploads, [5, 6, 7], fedpake.parse_args(["--dataset", "synthetic"]), 1,
                                    "one-pass")[0]
    else:
        new = fedavg.server_update(uploads, [5, 6, 7])
    copy = uploads.clone()
    new.add_(1.0)
    assert torch.equal(uploads, copy)


# ----------------------------------------------------------------------------- 2. per-client state survives

def stopped_and_resumed(script, tmp_path, rounds, *flags):
    """The checkpoint state after each round of a run stopped after every round and resumed, and that of an
    uninterrupted run; the two runs' metrics are equal (measured columns aside)."""
    flags = [*TINY, "--rounds", str(rounds), *flags]
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path / "whole") == 0
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path / "parts", "--stop-after", "1") == 0
    folder, states = run_dir(tmp_path / "parts"), []
    for round_ in range(1, rounds + 1):
        states.append(checkpoint(folder)["state"])
        if round_ < rounds:
            assert run_in_process(f"{script}.py", "--resume", folder, "--stop-after", str(round_ + 1)) == 0
    measured = {"seconds", "sec_per_round", "host_mb", "device_mb", "agg_seconds"}
    keep = lambda rows: [{k: v for k, v in r.items() if k not in measured} for r in rows]  # noqa: E731
    assert keep(metrics_rows(folder)) == keep(metrics_rows(run_dir(tmp_path / "whole")))
    return states, checkpoint(run_dir(tmp_path / "whole"))["state"]


def test_fedala_keeps_each_client_s_w_and_local_model_across_rounds_and_resume(tmp_path):
    """A client that does not join keeps its local model and W exactly; one that joins (from round 2, ALA on)
    changes both; after stops and --resume the state is the uninterrupted run's, bit for bit."""
    states, whole = stopped_and_resumed("fedala", tmp_path, 4, "--join-ratio", "0.5")
    joined = sampled(0, 4, 0.5, 4)
    changed = 0
    for round_ in (2, 3, 4):
        before, after = states[round_ - 2], states[round_ - 1]
        for c in range(4):
            same_model = torch.equal(before["local_models"][c], after["local_models"][c])
            same_w = torch.equal(before["ala"]["weights"][c], after["ala"]["weights"][c])
            if c in joined[round_ - 1]:
                assert not same_model and not same_w
                changed += 1
            else:
                assert same_model and same_w
                assert before["ala"]["initial_stage"][c] == after["ala"]["initial_stage"][c]
    assert changed and all(set(j) != set(range(4)) for j in joined)
    assert not torch.equal(whole["ala"]["weights"], torch.ones_like(whole["ala"]["weights"]))
    assert torch.equal(states[-1]["local_models"], whole["local_models"])
    assert torch.equal(states[-1]["ala"]["weights"], whole["ala"]["weights"])
    assert states[-1]["ala"]["initial_stage"] == whole["ala"]["initial_stage"]


def test_pfedla_keeps_each_client_s_hypernetwork_and_stored_model_across_rounds_and_resume(tmp_path):
    """A client that does not join keeps its stored model theta_j and its hypernetwork (v_j, psi_j: its row of
    each tensor) exactly; one that joins changes both, its row of EACH tensor the paper trains (v_i, the MLP's and
    the heads' weights and biases: one tensor left frozen, a v_i registered as a buffer, cannot hide behind the
    others moving); stops and --resume give the uninterrupted run's state."""
    states, whole = stopped_and_resumed("pfedla", tmp_path, 3, "--join-ratio", "0.5")
    joined = sampled(0, 4, 0.5, 3)
    for round_ in (2, 3):
        before, after = states[round_ - 2], states[round_ - 1]
        assert sorted(after["hypernetworks"]) == sorted(HN_TENSORS)
        for c in range(4):
            assert torch.equal(before["stored_models"][c], after["stored_models"][c]) == (c not in joined[round_ - 1])
            for name in HN_TENSORS:
                same = torch.equal(before["hypernetworks"][name][c], after["hypernetworks"][name][c])
                assert same == (c not in joined[round_ - 1]), (round_, c, name)
    assert torch.equal(states[-1]["stored_models"], whole["stored_models"])
    assert all(torch.equal(v, whole["hypernetworks"][k]) for k, v in states[-1]["hypernetworks"].items())


def test_fedacd_keeps_no_per_client_state_between_rounds():
    """FedACD's class statistics P^m are estimated afresh from the received model in every round (Appendix A.1):
    the same client, round and global model give the same update whatever the client ran before, and the
    checkpoint holds the global model only (tests/test_fedacd.py resumes it)."""
    start, _, update = two_updates("fedacd")
    first = update(2).clone()
    update(0), update(1)
    assert torch.equal(update(2), first)
    assert 'state = {"global_model": global_model}' in open(fedacd.__file__).read()


# ----------------------------------------------------------------------------- 3. what the evaluation averages

def pooled(results):
    return common.accuracy_metrics(*(torch.cat(r) for r in zip(*results)))


def by_hand(script, tmp_path):
    """A 2-round run at join ratio 0.5: (its round-2 metrics row, the data, a built model, the checkpoints
    after rounds 1 and 2, the clients of round 2)."""
    flags = [*TINY, "--rounds", "2", "--join-ratio", "0.5"]
    assert run_in_process(f"{script}.py", *flags, "--out", tmp_path, "--stop-after", "1") == 0
    folder = run_dir(tmp_path)
    after_1 = checkpoint(folder)
    assert run_in_process(f"{script}.py", "--resume", folder) == 0
    args = SCRIPTS[script].parse_args(flags)
    data = common.load_federated_data(args, torch.device("cpu"))
    model = common.build_model(args.model, data, auto_image=SCRIPTS[script].AUTO_IMAGE)
    joined = sampled(0, 4, 0.5, 2)[1]
    assert 0 < len(joined) < 4
    return metrics_rows(folder)[1], args, data, model, after_1, checkpoint(folder), joined


@pytest.mark.parametrize("script", ["fedavg", "fedpake", "fedacd"])
def test_the_global_model_is_evaluated_on_every_client_not_only_the_joining_ones(script, tmp_path):
    """docs: the global model after the round, on every client's test data (pooled test_acc and the mean over
    clients); FedACD also on the uniform test set (global_acc). The joining clients alone give another number."""
    row, args, data, model, _, after_2, joined = by_hand(script, tmp_path)
    model.load_state_dict(after_2["state"]["global_model"])
    every = pooled([common.evaluate(model, data, [data.test_idx[c]]) for c in range(4)])
    joining = pooled([common.evaluate(model, data, [data.test_idx[c]]) for c in joined])
    assert float(row["test_acc"]) == pytest.approx(every["test_acc"], abs=1e-4)
    assert float(row["test_acc_mean"]) == pytest.approx(every["test_acc_mean"], abs=1e-4)
    assert abs(joining["test_acc_mean"] - every["test_acc_mean"]) > 1e-3  # the readings differ here
    if script == "fedacd":
        uniform = common.accuracy_metrics(*common.evaluate(model, data, [data.global_test_idx]), prefix="global")
        assert float(row["global_acc"]) == pytest.approx(uniform["global_acc"], abs=1e-4)


def test_fedala_evaluates_joining_clients_ala_initialised_and_the_others_on_their_local_models(tmp_path):
    """docs/fedala.md: a joining client's ALA-initialised model (before local training), a client that does not
    join its current local model; every client, pooled. The global model and the trained local models give
    other numbers here."""
    row, args, data, model, after_1, after_2, joined = by_hand("fedala", tmp_path)
    state = after_1["state"]
    global_1 = torch.cat([v.reshape(-1) for v in state["global_model"].values()])  # the MLP: no buffers
    results, trained = [], []
    for c in range(4):
        start = state["local_models"][c]
        if c in joined:  # ALA written out in test_main_loops (plain_ala), never fedala.ALA
            start, _, _, _ = plain_ala(model, data, c, 2, args, global_1, start, state["ala"]["weights"][c],
                                       state["ala"]["initial_stage"][c], list(state["ala"]["init_losses"][c]))
        common.load_flat_state(model, start)
        results.append(common.evaluate(model, data, [data.test_idx[c]]))
        common.load_flat_state(model, after_2["state"]["local_models"][c])
        trained.append(common.evaluate(model, data, [data.test_idx[c]]))
    expected = pooled(results)
    assert float(row["test_acc"]) == pytest.approx(expected["test_acc"], abs=1e-4)
    assert float(row["test_acc_mean"]) == pytest.approx(expected["test_acc_mean"], abs=1e-4)
    assert abs(pooled(trained)["test_loss"] - expected["test_loss"]) > 1e-4  # the trained models: another reading
    model.load_state_dict(after_2["state"]["global_model"])
    global_model = pooled([common.evaluate(model, data, [data.test_idx[c]]) for c in range(4)])
    assert float(row["global_model_acc"]) == pytest.approx(global_model["test_acc"], abs=1e-4)  # its own column
    assert abs(global_model["test_loss"] - expected["test_loss"]) > 1e-4  # the global model: another reading


def test_pfedla_evaluates_every_client_s_personalised_model_not_its_stored_one(tmp_path):
    """docs/pfedla.md: theta_bar_i from the hypernetworks and stored models after the round (what client i
    receives next), for every client; test_acc_mean their unweighted mean. The joining clients alone, or the
    stored (trained) models, give other numbers here."""
    row, args, data, model, _, after_2, joined = by_hand("pfedla", tmp_path)
    blocks = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()
              if any(True for _ in m.parameters(recurse=False))]  # the MLP's layers
    hypernetworks = after_2["state"]["hypernetworks"]  # Eq. (3)-(6) written out in test_main_loops, not the class
    stored = after_2["state"]["stored_models"]
    personalised, own = [], []
    for c in range(4):
        with torch.no_grad():
            common.load_flat_state(model, layerwise(hypernetwork_alpha(hypernetworks, c), stored, blocks, c))
        personalised.append(common.evaluate(model, data, [data.test_idx[c]]))
        common.load_flat_state(model, stored[c])
        own.append(common.evaluate(model, data, [data.test_idx[c]]))
    expected = pooled(personalised)
    assert float(row["test_acc_mean"]) == pytest.approx(expected["test_acc_mean"], abs=1e-4)
    assert float(row["test_loss"]) == pytest.approx(expected["test_loss"], abs=1e-5)
    assert abs(pooled(own)["test_loss"] - expected["test_loss"]) > 1e-4
    assert abs(pooled([personalised[c] for c in joined])["test_loss"] - expected["test_loss"]) > 1e-4


# ----------------------------------------------------------------------------- 4. partitions add up

def npz_dataset(tmp_path, with_test):
    """An .npz of 600 + 300 samples of 10 unequal classes (features only: any partition applies)."""
    rng = np.random.default_rng(4)
    y = np.repeat(np.arange(10), [90, 80, 70, 65, 60, 60, 55, 50, 40, 30])
    arrays = {"x": rng.normal(size=(600, 8)).astype(np.float32), "y": rng.permutation(y)}
    if with_test:
        arrays.update(x_test=rng.normal(size=(300, 8)).astype(np.float32), y_test=np.tile(np.arange(10), 30))
    path = tmp_path / f"data{int(with_test)}.npz"
    np.savez(path, **arrays)
    return str(path), arrays


PARTITIONS = [("iid", []), ("pat", []), ("pat", ["--balance"]), ("pat", ["--classes-per-client", "1"]),
              ("dir", []), ("dir", ["--beta", "0.05"]), ("pfedla1", []), ("pfedla2", [])]


@pytest.mark.parametrize("split", ["client", "global"])
@pytest.mark.parametrize("partition, flags", PARTITIONS, ids=[" ".join([p, *f]) for p, f in PARTITIONS])
def test_every_partition_s_class_counts_add_up_and_no_sample_is_in_two_places(partition, flags, split, tmp_path):
    """Per class, the clients' samples never exceed the dataset's, and equal them where the partition uses every
    sample (iid, dir; pat where every class has a holder); no sample is in two clients, nor in a client's train
    and test data; partition.json's counts are the data's. Under --test-split global the clients split the train
    set and test on the uniform test set's samples (which clients may share), never on a train sample."""
    path, arrays = npz_dataset(tmp_path, with_test=split == "global")
    num_clients = 6
    amount = ["--samples-per-client", "40"] if partition.startswith("pfedla") else []
    args = fedavg.parse_args(["--dataset", path, "--partition", partition, *flags, *amount, "--test-split", split,
                              "--num-clients", str(num_clients), "--batch-size", "4"])
    data = datasets.load_federated_data(args, "cpu")
    y = data.y.numpy()
    train = [t.numpy() for t in data.train_idx]
    test = [t.numpy() for t in data.test_idx]
    pool = len(arrays["y"])  # what the partition splits: all samples (client), the train set (global)
    dataset_counts = np.bincount(arrays["y"], minlength=10)
    held = np.concatenate(train if split == "global" else train + test)
    assert len(np.unique(held)) == len(held)  # no sample in two clients, or in a client's train and test both
    assert held.min() >= 0 and held.max() < pool
    counts = np.bincount(y[held], minlength=10)
    assert (counts <= dataset_counts).all()
    classes_per_client = 1 if "--classes-per-client" in flags else 2
    if partition in ("iid", "dir") or (partition == "pat" and num_clients * classes_per_client >= 10):
        assert (counts == dataset_counts).all()
    elif partition == "pat":  # 6 clients of one class each: 4 classes have no holder
        assert (counts > 0).sum() == 6 and all((counts[c] in (0, dataset_counts[c])) for c in range(10))
    elif partition.startswith("pfedla"):  # --samples-per-client from each client's classes, not every sample
        assert all(len(t) + (0 if split == "global" else len(s)) == 40 for t, s in zip(train, test))
    for c, (t, s) in enumerate(zip(train, test)):
        assert len(np.intersect1d(t, s)) == 0 and len(t) and len(s)
        assert (np.bincount(y[t], minlength=10) == data.train_counts[c]).all()
        assert (np.bincount(y[s], minlength=10) == data.test_counts[c]).all()
        if split == "global":
            assert s.min() >= pool and s.max() < pool + 300  # the uniform test set's samples
            assert set(y[s]) <= set(y[t])  # each client tested on its own classes (FedACD's Table 2)
    if split == "global":
        assert (data.global_test_idx.numpy() == np.arange(pool, pool + 300)).all()
    partition_counts = data_partition.class_counts(y, train, 10)
    assert (partition_counts == data.train_counts).all()
