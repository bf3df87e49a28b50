"""FedAvg's two other readings in pFedLA's Tables 1-2, built of fedavg.py's pieces (fedavg.py is FedAvg alone).

--local-training is the "Local Training" baseline of pFedLA's Tables 1 and 2: FedAvg's server
step is skipped and nothing is sent; each client trains its own model, from the common initial
model on, on its own data (fedavg.client_update), and is evaluated on its own test data.

--eval-local-models runs FedAvg (fedavg.server_update) and also evaluates each joining client's model
after this round's local training, before aggregation, on its own test data (columns local_model_acc,
local_model_acc_mean, ...): the "FedAvg fine-tuned locally" reading of FedAvg's rows in pFedLA's
Tables 1-2. Training is unchanged: its other columns are fedavg.py's.

Give one of the two: without either this would be fedavg.py, which is where plain FedAvg runs (a new run is
refused in one line; a fedavg.py run still continues here with --resume). These were fedavg.py's flags: a run
made as ``fedavg.py --local-training`` (its config.json keeps that command) continues here with --resume, and its
command runs here with the same flags (docs/running.md).

main() copies fedavg.py's round loop (sampling, fedavg.client_update, fedavg.server_update, evaluation, the run
folder); a test keeps its FedAvg columns equal to fedavg.py's, bit for bit (tests/test_local_training.py,
test_eval_local_models_reports_the_trained_models_before_aggregation_and_changes_nothing).

    python tools/fedavg_variants.py --local-training --dataset synthetic --rounds 20
    python tools/fedavg_variants.py --eval-local-models --dataset synthetic --rounds 20
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the scripts, by name
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common  # noqa: E402

import torch  # noqa: E402

import fedavg  # noqa: E402
import run_folder  # noqa: E402

PROGRAM = "tools/fedavg_variants"  # config.json's script; --resume checks it (tools/run_records.MOVED)
HEADLINE_LOCAL = ("final test_acc_mean (pFedLA Tables 1-2: Local Training, the mean over clients after the last "
                  "round)")


def parse_args(argv=None):
    parser = common.base_parser(__doc__.splitlines()[0], script=PROGRAM, helps={"lr": common.LR_HELP}, lr=None)
    parser.add_argument("--local-training", action="store_true",
                        help="no aggregation: each client trains its own model alone and is evaluated on its own "
                        "test data (the 'Local Training' row of pFedLA's Tables 1-2)")
    parser.add_argument("--eval-local-models", action="store_true",
                        help="also evaluate each joining client's model after local training, before aggregation, "
                        "on its own test data (columns local_model_acc*; a reading of pFedLA's FedAvg rows)")
    return common.parse_args(parser, argv, common.fedala_learning_rate, checks=lambda args: [
        (args.local_training or args.eval_local_models or args.resume,
         "tools/fedavg_variants.py runs --local-training or --eval-local-models: give one (plain FedAvg is "
         "fedavg.py)"),
        (not (args.eval_local_models and args.local_training),
         "--eval-local-models evaluates the local models of an aggregating run; --local-training already "
         "reports its local models as test_acc")])


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
    build = lambda: common.build_model(args.model, data, auto_image=fedavg.AUTO_IMAGE)  # noqa: E731
    global_model = build().to(device)
    if args.local_training:  # before anything is allocated or written
        common.check_client_models(global_model, args.num_clients)
    pool = common.ClientPool.build(args, build, device, data)
    model_bytes = common.state_bytes(global_model)
    run = run_folder.Run(algo, args, data, device, script=PROGRAM,
                         headline_metric="test_acc_mean" if args.local_training else fedavg.HEADLINE_METRIC,
                         headline=HEADLINE_LOCAL if args.local_training else fedavg.HEADLINE)
    state = {"global_model": global_model}
    if args.local_training:  # every client starts from the same initial model and keeps its own
        state["local_models"] = common.flatten_state(global_model).detach().repeat(args.num_clients, 1)
    start = run.resume(state, rng)
    print(f"[{algo}] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} parameters, "
          f"{model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time")

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        # no server under --local-training: each client goes on from its own model
        start_state = state["local_models"] if args.local_training else dict.fromkeys(
            clients, common.flatten_state(global_model))
        client_states, losses = pool.train(lambda model, client: fedavg.client_update(
            model, start_state[client], data, client, args, round_), clients,
                                           progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        if args.local_training:
            state["local_models"][clients] = client_states
        else:
            num_samples = [len(data.train_idx[client]) for client in clients]
            common.load_flat_state(global_model, fedavg.server_update(client_states, num_samples))
            run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if run.should_eval(round_):
            evaluated = (evaluate_local(state["local_models"], range(args.num_clients), pool.models[0], data)
                         if args.local_training else common.evaluate_global(global_model, data))
            if args.eval_local_models:
                evaluated.update(evaluate_local(client_states, clients, pool.models[0], data,
                                                prefix="local_model"))
            run.log(round_, {**evaluated, "train_loss": sum(losses) / len(losses)})
        del client_states  # frees the K x D rows before the next round (peak memory: one round's rows)
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish()


if __name__ == "__main__":
    run_folder.run_main(main)
