"""FedAvg (McMahan et al., AISTATS 2017), the common baseline of the other four scripts.

Each round (FedAvg's Algorithm 1, "FederatedAveraging"):
  1. the server samples round(join_ratio * N) clients and sends them the global model;
  2. ClientUpdate (client_update): each client runs --local-epochs epochs of minibatch SGD on its own data;
  3. the server sets the global model to the average of the returned models weighted by
     the clients' numbers of training samples, w <- sum_k n_k / n w^k (float buffers too).
The global model is evaluated on every client's test data (pooled accuracy, and the
mean and std over clients), and on the uniform test set under --test-split global.

pFedLA's "Local Training" row and its reading of FedAvg's local models are another program,
tools/fedavg_variants.py, built of this file's pieces.

Defaults follow FedALA's setup (20 clients, join ratio 1, batch 10, lr 0.005, or 0.1 on
MNIST and for fastText and ResNet-18, 1 local epoch, 2000 rounds, 4-layer CNN, Dir(0.1)).
Details and our choices: docs/fedavg.md.

    python fedavg.py --dataset synthetic --rounds 20        # offline quick start
    python fedavg.py --dataset cifar10 --beta 0.1           # the paper-scale run
"""
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common
import run_folder

import torch
import torch.nn.functional as F

HEADLINE_METRIC = "test_acc"  # what the paper reports, in metrics.csv
HEADLINE = "best test_acc (FedALA Table 2 reports FedAvg's best)"
AUTO_IMAGE = "cnn"  # --model auto on images


def parse_args(argv=None):
    parser = common.base_parser(__doc__.splitlines()[0], script="fedavg", lr=None,
                                helps={"lr": common.LR_HELP, "model": common.model_help(AUTO_IMAGE)})
    return common.parse_args(parser, argv, common.fedala_learning_rate)


def client_update(model, global_state, data, client, args, round_):
    """ClientUpdate(k, w) (Alg. 1): from the global model w (flat), for each local epoch i from 1 to E, for each
    batch b of client k's training data (shuffled each epoch), w <- w - lr * grad l(w; b), the step of
    torch.optim.SGD (with --momentum and --weight-decay, 0 in the paper). Returns (the trained model, flat; the
    mean minibatch loss, 0-dim: no host sync in the loop). The other scripts' clients train with
    common.local_train, the same arithmetic bit for bit (tests/test_local_training.py)."""
    common.load_flat_state(model, global_state)
    model.train()
    optimizer = common.make_optimizer(model, args)
    seed = common.client_seed(args.seed, round_, client)  # the batch order: repeatable, independent per client
    total, steps = torch.zeros((), device=data.x.device), 0
    for batch in common.epoch_batches(data.train_idx[client], args.batch_size, args.local_epochs, seed):
        loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()  # w <- w - lr * grad l(w; b)
        total, steps = total + loss.detach(), steps + 1
    return common.flatten_state(model), total / max(steps, 1)


def server_update(client_states, num_samples):
    """The server's step (Alg. 1's last line): the new global model, the average of the clients' trained models (K x D,
    or a list) weighted by their sample counts, w <- sum_k n_k / n w^k."""
    return common.weighted_average(client_states, num_samples)


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    global_model = common.build_model(args.model, data, auto_image=AUTO_IMAGE).to(device)
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=AUTO_IMAGE), device,
                                   data)
    model_bytes = common.state_bytes(global_model)
    # plumbing: the run folder (config.json, partition.json, the partition printed), its lock, Ctrl-C at a round's end
    run = run_folder.Run("fedavg", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedavg] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} parameters, "
          f"{model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time")

    # plumbing, not the algorithm: progress=, check_finite, run.add_bytes, log, checkpoint, stop (run_folder.py)
    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        global_state = common.flatten_state(global_model)
        client_states, losses = pool.train(lambda model, client: client_update(model, global_state, data, client,
                                                                               args, round_), clients,
                                           progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        num_samples = [len(data.train_idx[client]) for client in clients]
        common.load_flat_state(global_model, server_update(client_states, num_samples))
        del client_states  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses)})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
