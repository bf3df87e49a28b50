"""Partition properties."""
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
