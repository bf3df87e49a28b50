"""FedAvg (McMahan et al., AISTATS 2017), the common baseline of the other four scripts.

Each round (FedAvg's Algorithm 1, "FederatedAveraging"):
  1. the server samples round(join_ratio * N) clients and sends them the global model;
  2. ClientUpdate (common.client_update): each client runs --local-epochs epochs of minibatch SGD on its own data;
  3. the server sets the global model to the average of the returned models weighted by
     the clients' numbers of training samples, w <- sum_k n_k / n w^k (float buffers too).
The global model is evaluated on every client's test data (pooled accuracy, and the
mean and std over clients), and on the uniform test set under --test-split global.

--local-training is the "Local Training" baseline of pFedLA's Tables 1 and 2: step 3 is
skipped and nothing is sent; each client trains its own model, from the common initial model
on, on its own data, and is evaluated on its own test data.

--eval-local-models also evaluates each joining client's model after this round's local training,
before aggregation, on its own test data (columns local_model_acc, local_model_acc_mean, ...): the
"FedAvg fine-tuned locally" reading of FedAvg's rows in pFedLA's Tables 1-2. Training is unchanged.

Defaults follow FedALA's setup (20 clients, join ratio 1, batch 10, lr 0.005, or 0.1 on
MNIST and for fastText and ResNet-18, 1 local epoch, 2000 rounds, 4-layer CNN, Dir(0.1)).
Details and our choices: docs/fedavg.md.

    python fedavg.py --dataset synthetic --rounds 20        # offline quick start
    python fedavg.py --dataset cifar10 --beta 0.1           # the paper-scale run
"""
import common  # first, before torch: common.py's first lines make a Ctrl-C while starting one line

import torch

import run_folder

HEADLINE_METRIC = "test_acc"  # what the paper reports, in metrics.csv
HEADLINE = "best test_acc (FedALA Table 2 reports FedAvg's best)"
HEADLINE_LOCAL = ("final test_acc_mean (pFedLA Tables 1-2: Local Training, the mean over clients after the last "
                  "round)")
AUTO_IMAGE = "cnn"  # --model auto on images


def parse_args(argv=None):
    parser = common.base_parser(__doc__.splitlines()[0], script="fedavg", helps={"lr": common.LR_HELP}, lr=None)
    parser.add_argument("--local-training", action="store_true",
                        help="no aggregation: each client trains its own model alone and is evaluated on its own "
                        "test data (the 'Local Training' row of pFedLA's Tables 1-2)")
    parser.add_argument("--eval-local-models", action="store_true",
                        help="also evaluate each joining client's model after local training, before aggregation, "
                        "on its own test data (columns local_model_acc*; a reading of pFedLA's FedAvg rows)")
    return common.parse_args(parser, argv, common.fedala_learning_rate, checks=lambda args: [
        (not (args.eval_local_models and args.local_training),
         "--eval-local-models evaluates the local models of an aggregating run; --local-training already "
         "reports its local models as test_acc")])


def server_update(client_states, num_samples, aggregate=common.weighted_average):
    """The server's step: the new global model from the clients' trained models (K x D, or a list)
    and their sample counts. FedPake passes its own ``aggregate``."""
    return aggregate(common.as_rows(client_states), num_samples)


@torch.no_grad()
def evaluate_local(local_models, clients, worker, data, prefix="test"):
    """Each client's own model (row k of ``local_models`` belongs to ``clients[k]``) on its own test
    data: --local-training's models, or the round's trained models under --eval-local-models."""
    results = []
    for model_row, client in zip(local_models, clients):
        common.load_flat_state(worker, model_row)
        results.append(common.evaluate(worker, data, [data.test_idx[client]]))
    return common.accuracy_metrics(*(torch.cat(r) for r in zip(*results)), prefix=prefix)


def main(argv=None):
    args = parse_args(argv)
    algo = "local" if args.local_training else "fedavg"
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    global_model = common.build_model(args.model, data, auto_image=AUTO_IMAGE).to(device)
    if args.local_training:  # before anything is allocated or written
        common.check_client_models(global_model, args.num_clients)
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=AUTO_IMAGE), device,
                                   data)
    model_bytes = common.state_bytes(global_model)
    client_stack = torch.empty(common.clients_per_round(args), common.flatten_state(global_model).numel(),
                               device=device)  # the models the round's clients send back, one row each
    run = run_folder.Run(algo, args, data, device, script="fedavg",
                         headline_metric="test_acc_mean" if args.local_training else HEADLINE_METRIC,
                         headline=HEADLINE_LOCAL if args.local_training else HEADLINE)
    state = {"global_model": global_model}
    if args.local_training:  # every client starts from the same initial model and keeps its own
        state["local_models"] = common.flatten_state(global_model).detach().repeat(args.num_clients, 1)
    start = run.resume(state, rng)
    print(f"[{algo}] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} parameters, "
          f"{model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time")

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        if args.local_training:  # no server: each client goes on from its own model, which is also where it lands
            start_state = row = state["local_models"]
        else:
            start_state = dict.fromkeys(clients, common.flatten_state(global_model))
            row = dict(zip(clients, client_stack))  # where each client's model lands: no copies per client
        updates = pool.map(lambda model, client: common.client_update(model, start_state[client], data, client, args,
                                                                      round_, out=row[client]), clients)
        losses = [common.check_finite(loss, round_, client) for client, (_, loss) in zip(clients, updates)]
        if not args.local_training:
            num_samples = [len(data.train_idx[client]) for client in clients]
            common.load_flat_state(global_model, server_update(client_stack[:len(clients)], num_samples))
            run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            evaluated = (evaluate_local(state["local_models"], range(args.num_clients), pool.models[0], data)
                         if args.local_training else common.evaluate_global(global_model, data))
            if args.eval_local_models:  # client_stack still holds the round's trained models
                evaluated.update(evaluate_local(client_stack[:len(clients)], clients, pool.models[0], data,
                                                prefix="local_model"))
            run.log(round_, {**evaluated, "train_loss": sum(losses) / len(losses)})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
