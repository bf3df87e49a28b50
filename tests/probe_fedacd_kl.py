"""Table 9's KL(P^m || Q), taken apart (run by hand; pytest does not collect it).

    python tests/probe_fedacd_kl.py RUN_FOLDER [RUN_FOLDER ...] --data-dir DIR [--clients 3]

For each run folder of fedacd.py (with its checkpoint.pt: the global model after its last round), the
same few clients train from that global model under five local updates, on the same minibatches and
mixup draws as the script's:

* ``fedacd``: the script's (L1 + lambda L2 with mixup, Eq. (7)-(9));
* ``fedacd-no-mixup``, ``fedacd-delta-1``: the same without mixup, and with --missing-delta 1.0;
* ``fedavg``: FedAvg's cross-entropy without mixup (``tools/fedacd_diagnostics.py --fedavg --no-mixup``, Table 9's
  baseline);
* ``fedavg-mixup``: FedAvg's cross-entropy with the same mixup.

and for each trained local model it prints the KL of Eq. (10) read several ways: P^m on the client's clean
train data in eval mode (what fedacd.py logs as ``local_kl``, the mean over the client's rows) and the sum
over rows; P^m of the logits L2 trains (f + log Delta, the margins from P^m); P^m on the mixed inputs
with their mixup weights (one pass over the first epoch's mixed minibatches, eval mode); Q's tau at the
paper's 1 - 1e-5 and at 0.999 and 0.99; and the mean diagonal P_ii (the share of each class's
probability on itself), which decides the KL: a row with P_ii = 1 - e and the rest spread over the
others costs about e log(e / (1 - tau)) (docs/fedacd.md, Table 9).
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
import fedacd  # noqa: E402
from tools import fedacd_diagnostics  # noqa: E402

VARIANTS = {"fedacd": {"fedavg": False, "mixup": True, "missing_delta": 0.01},  # every variant whole: a run of
            "fedacd-no-mixup": {"fedavg": False, "mixup": False, "missing_delta": 0.01},  # --fedavg gives the base
            "fedacd-delta-1": {"fedavg": False, "mixup": True, "missing_delta": 1.0},
            "fedavg": {"fedavg": True, "mixup": False}, "fedavg-mixup": {"fedavg": True, "mixup": True}}
TAUS = (1 - 1e-5, 0.999, 0.99)


def kl(P, classes, tau=TAUS[0], reduction="mean"):
    """KL(P^m || Q) of Eq. (10) as fedacd.py computes it (``aggregation_score``), over the client's rows."""
    return float(fedacd.aggregation_score(P, classes, tau, reduction=reduction)[1])


@torch.no_grad()
def readings(model, data, idx, classes, present, args, batch_seed, mixup_seed):
    model.eval()
    C = data.num_classes
    P = fedacd.probability_matrix(model, ((data.x[b], data.y[b]) for b in idx.split(1024)), C)
    margins = fedacd.margin_deltas(P, present, args.missing_delta).log().fill_diagonal_(0)
    sums = torch.zeros(C, C)
    for b in idx.split(1024):
        fedacd.accumulate_probabilities(sums, (model(data.x[b]) + margins[data.y[b]]).softmax(1), data.y[b],
                                        data.y[b], 1.0)
    P_adjusted = fedacd.rows_to_matrix(sums, torch.zeros_like(sums))
    mixed_args = argparse.Namespace(**{**vars(args), "mixup": True, "local_epochs": 1})
    sums.zero_()
    for x, y_a, y_b, mix in fedacd.mixup_epochs(data, idx, mixed_args, batch_seed, mixup_seed)[0]:
        fedacd.accumulate_probabilities(sums, model(x).softmax(1), y_a, y_b, mix)
    P_mixed = fedacd.rows_to_matrix(sums, torch.zeros_like(sums))
    out = {"diag": float(P.diagonal()[classes].mean()), "kl_mean": kl(P, classes),
           "kl_sum": kl(P, classes, reduction="sum"), "kl_adjusted": kl(P_adjusted, classes),
           "kl_mixed": kl(P_mixed, classes)}
    out.update({f"kl_tau{tau}": kl(P, classes, tau) for tau in TAUS[1:]})
    return out


def local_train(model, data, idx, present, args, batch_seed, mixup_seed):
    """The variant's local update, as fedacd.client_update (or --fedavg's) runs it: its mean loss."""
    optimizer, epochs = common.make_optimizer(model, args), fedacd.mixup_epochs(data, idx, args, batch_seed, mixup_seed)
    if args.fedavg:
        return fedacd_diagnostics.fedavg_local_training(model, optimizer, epochs)
    clean = lambda: ((data.x[b], data.y[b]) for b in idx.split(1024))  # noqa: E731
    return fedacd.fedacd_local_training(model, optimizer, epochs, clean, data.num_classes, present, args.lam,
                                        args.missing_delta)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--clients", type=int, default=3,
                   help="the first N clients of the run's next round's sample that hold more than one class")
    a = p.parse_args()
    torch.set_num_threads(1)
    for folder in a.runs:
        config = json.load(open(os.path.join(folder, "config.json")))
        checkpoint = torch.load(os.path.join(folder, "checkpoint.pt"), map_location="cpu", weights_only=False)
        base = fedacd_diagnostics.parse_args([*config["command"][1:], "--data-dir", a.data_dir, "--device", "cpu"])
        data = common.load_federated_data(base, torch.device("cpu"))
        model = common.build_model(base.model, data)
        global_model = checkpoint["state"]["global_model"]  # its state_dict
        round_ = checkpoint["round"] + 1
        rng = common.seed_everything(base.seed)
        rng.bit_generator.state = checkpoint["rng"]
        clients = [c for c in common.sample_clients(rng, base.num_clients, base.join_ratio)  # one class: KL 0 for all
                   if (data.train_counts[c] > 0).sum() > 1][:a.clients]
        print(f"{folder}: global model after round {checkpoint['round']}; clients {clients} of round {round_}")
        for client in clients:
            idx = data.train_idx[client]
            present = torch.as_tensor(data.train_counts[client] > 0)
            classes = present.nonzero().flatten()
            seeds = common.client_seed(base.seed, round_, client), common.client_seed(base.seed, round_, client, 1)
            model.load_state_dict(global_model)
            start = readings(model, data, idx, classes, present, base, *seeds)
            print(f"  client {client} ({len(idx)} samples, {len(classes)} classes): received model "
                  + " ".join(f"{k} {v:.3f}" for k, v in start.items()), flush=True)
            for name, change in VARIANTS.items():
                args = argparse.Namespace(**{**vars(base), **change})
                model.load_state_dict(global_model)
                loss = local_train(model, data, idx, present, args, *seeds)
                r = readings(model, data, idx, classes, present, args, *seeds)
                print(f"    {name:16s} loss {float(loss):.3f} " + " ".join(f"{k} {v:.3f}" for k, v in r.items()),
                      flush=True)


if __name__ == "__main__":
    main()
