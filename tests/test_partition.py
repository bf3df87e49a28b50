"""Partition properties."""
import os
import time

import numpy as np
import pytest

import data_partition as dp


def labels(per_class=100, classes=10, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def assert_disjoint(parts, covering_n=None):
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)), "a sample is given to two clients"
    if covering_n is not None:
        assert np.array_equal(np.sort(allidx), np.arange(covering_n)), "some samples were dropped"


def test_iid_even_disjoint_covering():
    y = labels()
    parts = dp.iid(y, 7, np.random.default_rng(0))
    assert_disjoint(parts, len(y))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("balance", [False, True])
def test_pathological_exact_classes(balance):
    y = labels()
    parts = dp.pathological(y, 20, np.random.default_rng(1), classes_per_client=2, balance=balance)
    assert_disjoint(parts, len(y))  # 20 clients x 2 classes covers all 10 classes
    for p in parts:
        assert len(np.unique(y[p])) == 2
    if balance:  # each class is held by 4 clients in equal shares
        counts = dp.class_counts(y, parts, 10)
        assert set(counts[counts > 0].tolist()) == {25}


def test_pathological_rejects_too_many_classes():
    with pytest.raises(dp.PartitionError, match="classes-per-client"):
        dp.pathological(labels(), 5, np.random.default_rng(0), classes_per_client=11)


def test_dirichlet_min_size_and_determinism():
    y = labels(200)
    a = dp.dirichlet(y, 20, np.random.default_rng(5), beta=0.1, min_size=14)
    b = dp.dirichlet(y, 20, np.random.default_rng(5), beta=0.1, min_size=14)
    c = dp.dirichlet(y, 20, np.random.default_rng(6), beta=0.1, min_size=14)
    assert_disjoint(a, len(y))
    assert min(len(p) for p in a) >= 14
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def mean_label_entropy(y, parts):
    counts = dp.class_counts(y, parts, 10).astype(float)
    p = counts / counts.sum(1, keepdims=True)
    return float(np.mean(-(p * np.log(np.where(p > 0, p, 1))).sum(1)))


def test_dirichlet_more_skewed_as_beta_falls():
    y = labels(300)
    entropies = [mean_label_entropy(y, dp.dirichlet(y, 10, np.random.default_rng(0), beta=b)) for b in (100, 1, 0.1)]
    assert entropies[0] > entropies[1] > entropies[2]
    assert entropies[0] > 2.2 and entropies[2] < 1.2  # log(10) = 2.30 is perfectly uniform


def test_dirichlet_impossible_setting_fails_fast_with_advice():
    y = labels(600)  # 6000 samples
    start = time.perf_counter()
    with pytest.raises(dp.PartitionError, match=r"larger --beta or fewer --num-clients"):
        dp.dirichlet(y, 500, np.random.default_rng(0), beta=0.01, min_size=10)
    assert time.perf_counter() - start < 10
    with pytest.raises(dp.PartitionError, match="fewer --num-clients"):
        dp.dirichlet(y, 1000, np.random.default_rng(0), beta=1.0, min_size=10)  # 6000 < 1000 x 10


def test_pfedla1_equal_classes_and_sizes():
    y = labels(100)
    parts = dp.pfedla1(y, 10, np.random.default_rng(2), classes_per_client=4)
    assert_disjoint(parts)
    counts = dp.class_counts(y, parts, 10)
    assert all((row > 0).sum() == 4 for row in counts)
    assert len(set(counts[counts > 0].tolist())) == 1  # the same count for every (client, class)
    assert len({len(p) for p in parts}) == 1


def test_pfedla2_all_classes_two_dominant():
    y = labels(500)
    parts = dp.pfedla2(y, 10, np.random.default_rng(3), dominant_classes=2, dominant_share=0.8)
    assert_disjoint(parts)
    counts = dp.class_counts(y, parts, 10)
    assert len({len(p) for p in parts}) == 1
    for row in counts:
        assert (row > 0).all()
        top = np.sort(row)[::-1]
        assert top[0] == top[1] > 3 * top[2]  # two equal dominant classes
        assert abs(top[:2].sum() / row.sum() - 0.8) < 0.02
        assert len(set(top[2:].tolist())) == 1  # the rest shared equally


def test_train_test_split_disjoint_with_ratio():
    parts = dp.iid(labels(), 5, np.random.default_rng(0))
    train, test = dp.train_test_split(parts, np.random.default_rng(0), 0.75)
    for p, tr, te in zip(parts, train, test):
        assert np.array_equal(np.sort(np.concatenate([tr, te])), p)
        assert len(tr) == round(0.75 * len(p))


# ----------------------------------------------------------------------------- pFedLA Sec. 4.2: same data per client

def _npz(tmp_path, per_class=600, classes=10, seed=0):
    """A CIFAR-10-like set in miniature (6,000 samples), as an .npz of vectors."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(classes), per_class))
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.normal(size=(len(y), 8)).astype(np.float32) + y[:, None], y=y)
    return str(path)


@pytest.mark.parametrize("partition", ["pfedla1", "pfedla2"])
def test_pfedla_partitions_give_10_and_100_clients_the_same_data_per_client(tmp_path, partition):
    """Sec. 4.2: "all clients have the same amount of training data for both 10 and 100 clients
    cases". By default (auto) the amount is what a 100-client split gives: 6,000 / 100 = 60
    samples per client, 42 for training at the 70/30 split, for 10 clients as for 100."""
    import common
    import pfedla
    path = _npz(tmp_path)
    sizes = {}
    for n in (10, 100):
        args = pfedla.parse_args(["--dataset", path, "--partition", partition, "--num-clients", str(n)])
        assert args.samples_per_client == "auto"
        data = common.load_federated_data(args, "cpu")
        train = {len(t) for t in data.train_idx}
        total = {len(a) + len(b) for a, b in zip(data.train_idx, data.test_idx)}
        assert len(train) == 1 and len(total) == 1, (n, train, total)
        assert data.info["samples_per_client"] == {"flag": "auto", "samples": total.pop()}
        sizes[n] = train.pop()
    assert sizes[10] == sizes[100], sizes
    if partition == "pfedla1":  # 4 classes, 15 samples each
        assert sizes[10] == 42 and set(np.unique(data.train_counts + data.test_counts)) == {0, 15}
    else:  # every class, 2 of them dominant; shares rounded down, so a little under 60
        counts = data.train_counts + data.test_counts
        assert (counts > 0).all() and 36 <= sizes[10] <= 42
    args = pfedla.parse_args(["--dataset", path, "--partition", partition, "--samples-per-client", "200"])
    data = common.load_federated_data(args, "cpu")
    assert {len(a) + len(b) for a, b in zip(data.train_idx, data.test_idx)} == {200}


@pytest.mark.parametrize("flags, message", [
    (["--samples-per-client", "0"], "--samples-per-client"),
    (["--samples-per-client", "many"], "--samples-per-client"),
    (["--samples-per-client", "5000"], "--samples-per-client 5000"),
    (["--samples-per-client", "5000", "--partition", "pfedla2"], "--samples-per-client 5000")])
@pytest.mark.slow  # about 10 s: the not-slow suite stays under 3 minutes
def test_impossible_samples_per_client_is_one_line_exit_2(tmp_path, flags, message):
    from conftest import run_script
    r = run_script("pfedla.py", "--dataset", _npz(tmp_path), "--rounds", 1, "--out", tmp_path / "runs", *flags)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")
