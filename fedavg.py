"""FedAvg (McMahan et al., AISTATS 2017), the common baseline of the other four scripts.

Each round (SPEC section 2):
  1. the server samples round(join_ratio * N) clients and sends them the global model;
  2. each client runs --local-epochs epochs of minibatch SGD on its own train data;
  3. the server sets the global model to the average of the returned models weighted
     by the clients' numbers of train samples (parameters and float buffers).
The global model is evaluated on every client's test data (pooled accuracy, and the
mean and std over clients), and on the uniform test set under --test-split global.

Defaults follow FedALA's setup (20 clients, join ratio 1, batch 10, lr 0.005, or 0.1 on
MNIST and for fastText and ResNet-18, 1 local epoch, 2000 rounds, 4-layer CNN, Dir(0.1)).

    python fedavg.py --dataset synthetic --rounds 20        # offline quick start
    python fedavg.py --dataset cifar10 --beta 0.1           # the paper-scale run
"""
import torch

import common


def parse_args(argv=None):
    def resolve(args):  # FedALA's setup: 0.005 for the 4-layer CNN, 0.1 on MNIST and for fastText and ResNet-18
        if args.lr is None:
            fast = args.dataset in ("mnist", "agnews") or args.model in ("fasttext", "resnet18")
            args.lr = 0.1 if fast else 0.005

    parser = common.base_parser(__doc__.splitlines()[0], lr=None)
    return common.parse_args(parser, argv, resolve)


def fedavg_round(global_model, worker, data, clients, args, round_, client_stack,
                 aggregate=common.weighted_average):
    """One FedAvg round: local SGD from the global model on each client, then the
    sample-weighted average of the returned models (``aggregate(stacked, sizes)``; FedPake
    passes its own). ``worker`` is one reusable model (or a list of them for
    ``--parallel-clients``) and ``client_stack`` a preallocated (clients x parameters)
    buffer: no per-client copies of the model are created. Returns the mean training loss."""
    global_flat = common.flatten_state(global_model)

    def train_one(model, slot, client):
        common.load_flat_state(model, global_flat)  # the server sends the global model
        loss = common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, round_, client))
        common.flatten_state(model, out=client_stack[slot])
        return loss

    sizes = [len(data.train_idx[c]) for c in clients]
    losses = [common.check_finite(loss, round_, client)
              for client, loss in zip(clients, common.for_each_client(train_one, clients, worker, sizes))]
    common.load_flat_state(global_model, aggregate(client_stack[:len(clients)], sizes))
    return sum(losses) / len(losses)


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("fedavg", args, headline="best test_acc (FedALA Table 2 reports FedAvg's best)")
    data = run.data
    global_model = common.build_model(args.model, data, auto_image="cnn").to(run.device)
    state = {"global_model": global_model}
    start = run.resume(state)
    num_params = sum(v.numel() for v in common.float_state(global_model))
    clients_per_round = max(1, round(args.join_ratio * args.num_clients))
    workers = common.client_workers(args, lambda: common.build_model(args.model, data, auto_image="cnn"),
                                    run.device, clients_per_round)
    client_stack = torch.empty(clients_per_round, num_params, device=run.device)
    model_bytes = common.state_bytes(global_model)
    print(f"[fedavg] model {global_model.__class__.__name__}: {num_params} parameters, {model_bytes / 2**20:.2f} MB; "
          f"{len(workers)} client(s) at a time")

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(run.rng, args.num_clients, args.join_ratio)
        train_loss = fedavg_round(global_model, workers, data, clients, args, round_, client_stack)
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": train_loss})
        run.checkpoint(round_, state)
    run.finish()


if __name__ == "__main__":
    common.run_main(main)
