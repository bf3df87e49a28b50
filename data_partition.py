"""Client partitions of a labelled dataset (docs/datasets.md): each takes the label array, the number of clients and a
``numpy.random.Generator`` and returns one sorted ``int64`` index array per client. They are pure: the same generator
state gives the same partition."""
import numpy as np


class PartitionError(ValueError):
    """A partition that cannot be built with the given settings."""


def _check(labels, num_clients):
    if num_clients < 1:
        raise PartitionError(f"--num-clients must be at least 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(f"{num_clients} clients but only {len(labels)} samples; use fewer --num-clients")


def iid(labels, num_clients, rng):
    """Shuffle and deal out evenly (client sizes differ by at most one)."""
    _check(labels, num_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def pathological(labels, num_clients, rng, classes_per_client, balance=False):
    """McMahan et al. (2017) shards: each client holds exactly ``classes_per_client`` classes, dealt round-robin over a
    random class order, so every class goes to (nearly) the same number of clients. Each class's samples are split
    among its holders in equal shares (``balance``) or random non-empty shares."""
    _check(labels, num_clients)
    classes = np.unique(labels)
    if not 1 <= classes_per_client <= len(classes):
        raise PartitionError(f"--classes-per-client {classes_per_client} must be between 1 and the "
                             f"{len(classes)} classes of the dataset")
    client_classes = np.resize(rng.permutation(classes), (num_clients, classes_per_client))  # repeated row by row
    parts = [[] for _ in range(num_clients)]
    for c in np.unique(client_classes):  # the classes some client holds
        holders = [i for i in range(num_clients) if c in client_classes[i]]
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < len(holders):
            raise PartitionError(f"class {c} has {len(idx)} samples for {len(holders)} clients; "
                                 "use fewer --num-clients or --classes-per-client")
        if balance:
            cuts = np.linspace(0, len(idx), len(holders) + 1).astype(int)[1:-1]
        else:  # distinct cuts in 1..len(idx)-1: random non-empty shares
            cuts = np.sort(rng.choice(np.arange(1, len(idx)), size=len(holders) - 1, replace=False))
        for i, chunk in zip(holders, np.split(idx, cuts)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def dirichlet(labels, num_clients, rng, beta, min_size=10, max_draws=100):
    """Label-skew Dir(beta) split (Hsu et al. 2019; the FedALA / PFLlib variant): for every class, proportions
    ~ Dir(beta * 1_N); a client that already holds more than N_total / num_clients samples gets no more of later
    classes. The whole draw is repeated until every client has ``min_size`` samples, at most ``max_draws`` times, after
    which a PartitionError names the knobs to turn."""
    _check(labels, num_clients)
    if not beta > 0:
        raise PartitionError(f"--beta must be > 0, got {beta}")
    if len(labels) < num_clients * min_size:
        raise PartitionError(f"{len(labels)} samples cannot give {num_clients} clients {min_size} each; "
                             "use fewer --num-clients or a smaller --batch-size")
    classes = np.unique(labels)
    cap = len(labels) / num_clients
    for _ in range(max_draws):
        chunks, sizes = [], np.zeros(num_clients)  # chunks[k][i]: client i's share of the k-th class
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, beta))
            masked = p * (sizes < cap)
            p = masked / masked.sum() if masked.sum() > 0 else p
            chunks.append(np.split(idx, (np.cumsum(p) * len(idx)).astype(int)[:-1]))
            sizes += [len(chunk) for chunk in chunks[-1]]
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in zip(*chunks)]
    raise PartitionError(f"Dir({beta}) over {num_clients} clients left a client with fewer than {min_size} "
                         f"samples in {max_draws} draws; use a larger --beta or fewer --num-clients")


def _balanced_class_sets(num_classes, num_clients, per_client, rng):
    """Random class sets of size ``per_client``, each class used by about the same number of clients."""
    deck, sets = [], []
    for _ in range(num_clients):
        chosen = []
        while len(chosen) < per_client:
            if not deck:
                deck = list(rng.permutation(num_classes))
            c = deck.pop()
            if c not in chosen:
                chosen.append(c)
            else:  # at the end of a deck; put it back for the next client
                deck.insert(0, c)
                if all(d in chosen for d in deck):
                    deck = []
        sets.append(sorted(int(c) for c in chosen))
    return sets


def _deal(labels, counts, rng):
    """Client i gets ``counts[i, c]`` samples of each class c: every class some client takes is shuffled, in class
    order, and dealt out in client order."""
    chunks = [np.split(rng.permutation(np.flatnonzero(labels == c)), np.cumsum(counts[:, c]))[:-1]
              for c in np.flatnonzero(counts.sum(0))]  # chunks[k][i]: client i's share of the k-th class taken
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in zip(*chunks)]


def pfedla1(labels, num_clients, rng, classes_per_client=4, samples_per_client=None):
    """pFedLA non-IID_1: each client gets ``classes_per_client`` random classes, the same number of samples from each,
    so every client holds the same amount of data. The class sets are drawn from shuffled decks of all classes, so every
    class is held by about the same number of clients (our choice: it lets 100 clients share a balanced dataset without
    running out of any class). The per-class count is ``samples_per_client // classes_per_client``, or (None) the
    largest that every class can supply to all of its holders."""
    _check(labels, num_clients)
    num_classes = int(labels.max()) + 1
    if not 1 <= classes_per_client <= num_classes:
        raise PartitionError(f"--classes-per-client {classes_per_client} must be between 1 and {num_classes}")
    sets = _balanced_class_sets(num_classes, num_clients, classes_per_client, rng)
    held = np.array([np.isin(np.arange(num_classes), s) for s in sets])  # held[i, c]: client i holds class c
    holders = held.sum(0)
    available = np.bincount(labels, minlength=num_classes)
    largest = int(min(available[c] // holders[c] for c in range(num_classes) if holders[c]))
    per_class = largest if samples_per_client is None else samples_per_client // classes_per_client
    if samples_per_client is not None and not 1 <= per_class <= largest:
        raise PartitionError(f"--samples-per-client {samples_per_client} with {classes_per_client} classes per client "
                             f"needs from {classes_per_client} to {largest * classes_per_client} samples per client "
                             f"for {num_clients} clients of this dataset")
    if per_class < 1:
        raise PartitionError("too few samples per class for pfedla1; use fewer --num-clients")
    return _deal(labels, held * per_class, rng)


def pfedla2(labels, num_clients, rng, dominant_classes=2, dominant_share=0.8, samples_per_client=None):
    """pFedLA non-IID_2: every client has all classes; ``dominant_classes`` random classes together hold
    ``dominant_share`` of its samples in equal parts, the other classes share the rest equally. Every client holds the
    same amount of data (our documented choice: the paper gives no ratio): ``samples_per_client`` exactly (the rounding
    remainder goes to the classes with the largest fractional shares), or (None) the most the dataset allows."""
    _check(labels, num_clients)
    num_classes = int(labels.max()) + 1
    if not 1 <= dominant_classes < num_classes:
        raise PartitionError(f"pfedla2 needs between 1 and {num_classes - 1} dominant classes")
    dominant = _balanced_class_sets(num_classes, num_clients, dominant_classes, rng)
    share = np.full((num_clients, num_classes), (1 - dominant_share) / (num_classes - dominant_classes))
    np.put_along_axis(share, np.array(dominant), dominant_share / dominant_classes, axis=1)
    available = np.bincount(labels, minlength=num_classes)
    largest = int(np.min(available / share.sum(0)))
    size = largest if samples_per_client is None else samples_per_client
    counts = np.floor(share * size).astype(int)
    if samples_per_client is not None:
        fraction = share * size - counts
        for i in range(num_clients):
            counts[i, np.argsort(-fraction[i], kind="stable")[:size - counts[i].sum()]] += 1
        if (counts.sum(0) > available).any():
            raise PartitionError(f"--samples-per-client {samples_per_client} is more than this dataset can give "
                                 f"{num_clients} pfedla2 clients (at most about {largest})")
    if (counts < 1).any():
        raise PartitionError("too few samples for pfedla2 (a client would miss a class); use fewer --num-clients")
    return _deal(labels, counts, rng)


def train_test_split(client_idx, rng, train_ratio):
    """Each client's indices split at random into (train, test), both non-empty when the client has two or more."""
    train, test = [], []
    for idx in client_idx:
        idx = rng.permutation(idx)
        n_train = int(round(train_ratio * len(idx)))
        if len(idx) >= 2:
            n_train = min(max(n_train, 1), len(idx) - 1)
        train.append(np.sort(idx[:n_train]))
        test.append(np.sort(idx[n_train:]))
    return train, test


def proportional_test_sets(train_labels_per_client, test_labels, rng, num_classes):
    """For FedACD's Table 2: per client, a test set drawn from the uniform test set with that client's label
    proportions. Its size is the largest the test set can supply for those proportions, capped at the client's train
    size. Clients draw independently, so two clients' test sets may share samples."""
    by_class = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
    available = np.array([len(b) for b in by_class])
    out = []
    for y in train_labels_per_client:
        prior = np.bincount(y, minlength=num_classes) / max(len(y), 1)
        size = min(int(np.min(available[prior > 0] / prior[prior > 0])), len(y))
        counts = np.minimum(np.round(prior * size).astype(int), available)
        chosen = [rng.choice(by_class[c], counts[c], replace=False) for c in range(num_classes) if counts[c]]
        out.append(np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.zeros(0, np.int64))
    return out


def class_counts(labels, client_idx, num_classes):
    """(num_clients, num_classes) table of per-client class counts."""
    return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in client_idx])


def describe(train_counts, test_counts, most=20):
    """The partition in a few lines: each client's train and test sizes and its classes (the first ``most``)."""
    lines = []
    for i in range(min(len(train_counts), most)):
        nz = {c: int(v) for c, v in enumerate(train_counts[i]) if v}
        lines.append(f"  client {i:3d}: train {int(train_counts[i].sum()):6d} test {int(test_counts[i].sum()):6d}  "
                     f"{nz if len(nz) <= 12 else f'{len(nz)} classes (see partition.json)'}")
    if len(train_counts) > most:
        lines.append(f"  ... {len(train_counts) - most} more clients in partition.json")
    return "\n".join(lines)
