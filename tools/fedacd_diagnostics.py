"""FedACD's diagnostics and its FedAvg baseline (Tables 3, 5 and 9), built of fedacd.py's pieces.

fedacd.py is FedACD alone; this program runs the same rounds with, as asked:
--fedavg   the FedAvg of FedACD's Tables 3, 5 and 9: plain cross-entropy in the local update on
           fedacd.py's minibatches and the sample-weighted mean at the server (FedAvg, as fedavg.py),
           no P^m and no score; input mixup stays on unless --no-mixup (Table 5's "FedAvg w/ Input
           Mixup" keeps it, Tables 3 and 9's plain FedAvg turn it off);
--log-risk local_risk on evaluation rounds: Table 3's average risk of the round's local models over
           the client distributions (Eq. 3), each model on the whole test set;
--log-kl   with --fedavg: local_kl, score_min, score_max (Table 9) of FedAvg's local models, one more
           pass of each trained model over its train data (FedACD logs them always: its score needs them).
These add columns to the same training: without --fedavg the other columns are fedacd.py's.

These were fedacd.py's flags: a run made as ``fedacd.py --fedavg`` (its config.json keeps that command)
continues here with --resume, and its command runs here with the same flags (docs/running.md).

main() copies fedacd.py's round loop (sampling, the client update, the server step, evaluation, the run folder);
tests/test_fedacd.py's test_fedavg_flag_gives_fedavg_py_metrics_and_fedacd_diagnostics keeps it equal to fedacd.py
(without --fedavg) and to fedavg.py (--fedavg --no-mixup), bit for bit.

    python tools/fedacd_diagnostics.py --dataset synthetic --fedavg --no-mixup --log-kl --rounds 20
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the scripts, by name
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fedacd  # noqa: E402
import run_folder  # noqa: E402

PROGRAM = "tools/fedacd_diagnostics"  # config.json's script; --resume checks it (tools/run_records.MOVED)
FEDAVG_HEADLINE = ("global_acc: FedAvg's global model on the uniform test set (the FedAvg baseline, in brackets "
                   "in FedACD's Table 1; the paper does not say best or final round)")


def parse_args(argv=None):
    parser = fedacd.make_parser(PROGRAM)
    parser.description = __doc__.split("\n\n")[0]  # this program's, not fedacd.py's
    a = parser.add_argument
    a("--fedavg", action="store_true",
      help="FedAvg on FedACD's settings (the FedAvg rows of Tables 3, 5, 9): cross-entropy and the sample-weighted "
           "mean in place of FedACD's loss and score weights; mixup as --no-mixup says; it logs local_risk only "
           "with --log-risk and local_kl, score_min, score_max only with --log-kl (default: off)")
    a("--log-risk", action="store_true",
      help="log local_risk, Table 3's average risk of the round's local models (each on the whole test set), on "
           "evaluation rounds (default: off)")
    a("--log-kl", action="store_true",
      help="with --fedavg: log local_kl, score_min, score_max (Table 9), one more pass of each trained model over "
           "its train data (default: off; FedACD logs them always, its score needs them)")
    return common.parse_args(parser, argv, fedacd.resolve, checks=lambda args: [*fedacd.checks(args), (
        not (args.fedavg and args.uniform_agg), "--fedavg aggregates by sample counts: drop --uniform-agg")])


def fedavg_local_training(model, optimizer, epochs):
    """--fedavg's local update on fedacd.py's minibatches: FedAvg's cross-entropy (fedavg.py's loss to the
    bit without mixup, through ``fedacd.mixup_loss`` with it); no P^m. Returns the mean minibatch loss."""
    model.train()
    total, steps = torch.zeros((), device=next(model.parameters()).device), 0
    for epoch in epochs:
        for x, y_a, y_b, mix in epoch:
            logits = model(x)
            loss = F.cross_entropy(logits, y_a) if mix == 1 else fedacd.mixup_loss(
                lambda logits, y: F.cross_entropy(logits, y, reduction="none"), logits, y_a, y_b, mix)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            steps += 1
    return total / steps


def per_class_errors(model, data, class_test_idx):
    """eps(w): per-class error rates on the uniform test set (0 for a class it lacks)."""
    correct, count, _ = common.evaluate(model, data, class_test_idx)
    return torch.where(count > 0, 1 - correct / count.clamp_min(1), torch.zeros_like(count))


def average_risk(errors, priors):
    """Eq. (3): R(w_m) = 1/M sum_n eps(w_m) . pi^n, ``priors`` the (M, C) client label priors."""
    return (priors @ errors.to(priors.dtype)).mean()


def client_update(model, global_state, data, client, classes, args, round_, risk=None):
    """fedacd.client_update, or with --fedavg FedAvg's local update on the same minibatches (its score V_m
    only with --log-kl); with ``risk = (class_test_idx, priors)`` also the trained model's average risk
    (Table 3). Returns (the trained model, flat; mean loss; V_m; KL; risk),
    None for what was not computed."""
    if not args.fedavg:
        trained, loss, score, kl = fedacd.client_update(model, global_state, data, client, classes, args, round_)
    else:
        common.load_flat_state(model, global_state)
        idx = data.train_idx[client]
        seeds = common.client_seed(args.seed, round_, client), common.client_seed(args.seed, round_, client, tag=1)
        loss = fedavg_local_training(model, common.make_optimizer(model, args),
                                     fedacd.mixup_epochs(data, idx, args, *seeds))
        score = kl = None
        if args.log_kl:
            P = fedacd.probability_matrix(model, ((data.x[b], data.y[b]) for b in idx.split(1024)), data.num_classes)
            score, kl = fedacd.aggregation_score(P, classes[client], args.tau, reduction=args.score_kl)
        trained = common.flatten_state(model)
    local_risk = average_risk(per_class_errors(model, data, risk[0]), risk[1]) if risk is not None else None
    return trained, loss, score, kl, local_risk


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    if args.mixup and not data.x.is_floating_point():
        raise common.UserError("input mixup needs real-valued inputs; use --no-mixup for token data")
    auto_image = "resnet18" if args.dataset == "tinyimagenet" else fedacd.AUTO_IMAGE
    build = lambda: common.build_model(args.model, data, auto_image=auto_image)  # noqa: E731
    global_model = build().to(device)
    pool = common.ClientPool.build(args, build, device, data)
    model_bytes = common.state_bytes(global_model)
    counts = torch.as_tensor(data.train_counts, dtype=torch.float64, device=device)
    classes = fedacd.held_classes(data)
    priors = counts / counts.sum(1, keepdim=True)  # pi^n of the average risk
    risk_test = data.global_test_idx if data.global_test_idx is not None else torch.cat(data.test_idx)
    class_test_idx = [risk_test[data.y[risk_test] == c] for c in range(data.num_classes)]
    run = run_folder.Run("fedacd-fedavg" if args.fedavg else "fedacd", args, data, device, script=PROGRAM,
                         headline_metric=fedacd.HEADLINE_METRIC,
                         headline=FEDAVG_HEADLINE if args.fedavg else fedacd.HEADLINE)
    state = {"global_model": global_model}
    start = run.resume(state, rng)
    print(f"[fedacd] model {global_model.__class__.__name__}: {common.flatten_state(global_model).numel()} "
          f"parameters, {model_bytes / 2**20:.2f} MB; {len(pool)} client(s) at a time"
          + ("; --fedavg: FedAvg's loss and aggregation" if args.fedavg else ""))

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        evaluate = run.should_eval(round_)
        risk = (class_test_idx, priors) if evaluate and args.log_risk else None  # Table 3's diagnostic
        global_state = common.flatten_state(global_model)
        client_states, losses, scores, kls, risks = pool.train(lambda model, client: client_update(
            model, global_state, data, client, classes, args, round_, risk), clients,
                                                               progress=run.progress(round_))
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        if args.fedavg:
            num_samples = [len(data.train_idx[client]) for client in clients]
            new_global = common.weighted_average(client_states, num_samples)
        else:
            new_global = fedacd.server_update(client_states, scores, args.uniform_agg)
        common.load_flat_state(global_model, new_global)
        del client_states  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        score_bytes = 0 if args.fedavg else 8  # FedAvg's server does not need the score V_m
        run.add_bytes(down=model_bytes * len(clients), up=(model_bytes + score_bytes) * len(clients))
        if evaluate:
            diagnostics = {}
            if scores[0] is not None:  # Table 9: FedACD always, --fedavg with --log-kl
                scores = torch.stack(scores)
                diagnostics.update(local_kl=float(torch.stack(kls).mean()), score_min=float(scores.min()),
                                   score_max=float(scores.max()))
            if args.log_risk:
                diagnostics["local_risk"] = float(torch.stack(risks).mean())
            run.log(round_, {**common.evaluate_global(global_model, data), "train_loss": sum(losses) / len(losses),
                             **diagnostics})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    risks = [float(r["local_risk"]) for r in run.rows if "local_risk" in r]  # Table 3: lower is better
    run.finish({"local_risk": {"best": min(risks), "final": risks[-1], "last10_mean": sum(risks[-10:]) / len(
        risks[-10:])}} if risks else None)


if __name__ == "__main__":
    run_folder.run_main(main)
