"""FedProx (Li et al., MLSys 2020): FedAvg whose clients minimise h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2 (Eq. 2).

The example of docs/layout.md, "Adding your own algorithm": fedavg.py's round with FedProx's client update, each
piece from common.py. Run it from the repository root (every shared flag of fedavg.py, and --mu):

    python docs/examples/fedprox.py --dataset synthetic --rounds 20 --local-epochs 5 --mu 1   # beside fedavg.py's
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # not at the top
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import run_folder  # noqa: E402

PROGRAM = "docs/examples/fedprox"  # config.json's script: `--resume` runs it again
HEADLINE_METRIC, HEADLINE = "test_acc", "best test_acc (FedProx plots the global model's test accuracy by round)"


def parse_args(argv=None):
    parser = common.base_parser(__doc__.splitlines()[0], script=PROGRAM, helps={"lr": common.LR_HELP}, lr=None)
    parser.add_argument("--mu", type=float, default=0.01, help="mu of the proximal term, Eq. (2)")
    return common.parse_args(parser, argv, common.fedala_learning_rate,
                             checks=lambda args: [(args.mu >= 0, f"--mu must be >= 0, got {args.mu}")])


def proximal_term(model, global_params, mu):
    """mu/2 ||w - w^t||^2 over the model's parameters (Eq. 2)."""
    return mu / 2 * sum(((w - w_t) ** 2).sum() for w, w_t in zip(model.parameters(), global_params))


def client_update(model, global_state, data, client, args, round_):
    """FedProx's local solver: minibatch SGD on h_k from the global model w^t (flat). Returns (the trained model,
    flat; the mean cross-entropy, 0-dim)."""
    common.load_flat_state(model, global_state)
    global_params = [w.detach().clone() for w in model.parameters()]
    model.train()
    optimizer = common.make_optimizer(model, args)
    total, steps = torch.zeros((), device=data.x.device), 0
    seed = common.client_seed(args.seed, round_, client)
    for batch in common.epoch_batches(data.train_idx[client], args.batch_size, args.local_epochs, seed):
        loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
        optimizer.zero_grad(set_to_none=True)
        (loss + proximal_term(model, global_params, args.mu)).backward()
        optimizer.step()
        total, steps = total + loss.detach(), steps + 1
    return common.flatten_state(model), total / max(steps, 1)


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    build = lambda: common.build_model(args.model, data, auto_image="cnn")  # noqa: E731
    global_model = build().to(device)
    pool = common.ClientPool.build(args, build, device, data)
    model_bytes = common.state_bytes(global_model)
    run = run_folder.Run("fedprox", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE,
                         script=PROGRAM)
    state = {"global_model": global_model}
    start = run.resume(state, rng)

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        global_state = common.flatten_state(global_model)
        client_states, losses = pool.train(lambda model, client: client_update(model, global_state, data, client,
                                                                               args, round_), clients,
                                           progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        num_samples = [len(data.train_idx[client]) for client in clients]
        common.load_flat_state(global_model, common.weighted_average(client_states, num_samples))
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses)})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
