"""One round of each algorithm as its script's main() runs it, composed from the script's own
client update and server step, for tests that drive rounds directly (``worker`` is one model
or a list of them, as in common.ClientPool)."""
import argparse

import torch

import common
import fedacd
import fedala
import fedavg
import pfedla
from tools import fedacd_diagnostics


def pool_of(worker, data):
    return common.ClientPool(worker if isinstance(worker, list) else [worker], [len(i) for i in data.train_idx])


def fedavg_round(global_model, worker, data, clients, args, round_, client_stack=None):
    """Returns the mean train loss; ``client_stack``, if given, receives the uploaded models."""
    global_state = common.flatten_state(global_model)
    client_states, losses = pool_of(worker, data).train(
        lambda model, client: fedavg.client_update(model, global_state, data, client, args, round_), clients)
    if client_stack is not None:
        client_stack[:len(clients)] = client_states
    num_samples = [len(data.train_idx[c]) for c in clients]
    common.load_flat_state(global_model, fedavg.server_update(client_states, num_samples))
    return sum(float(loss) for loss in losses) / len(losses)


def fedala_round(global_model, worker, local_models, ala, data, clients, args, round_, evaluate=False):
    """Returns (mean train loss, mean ALA epochs, per-client test results of every client or None)."""
    updates = pool_of(worker, data).map(lambda model, client: fedala.client_update(
        model, global_model, local_models[client], ala, data, client, args, round_, evaluate), clients)
    for client, update in zip(clients, updates):
        local_models[client] = update[0]
    num_samples = [len(data.train_idx[c]) for c in clients]
    common.load_flat_state(global_model, common.weighted_average(local_models[clients], num_samples))
    results = None
    if evaluate:
        evaluator = worker[0] if isinstance(worker, list) else worker
        by_client = dict(zip(clients, (u[3] for u in updates)))
        for client in sorted(set(range(data.num_clients)) - set(clients)):
            common.load_flat_state(evaluator, local_models[client])
            by_client[client] = common.evaluate(evaluator, data, [data.test_idx[client]])
        results = tuple(torch.cat([by_client[c][i] for c in range(data.num_clients)]) for i in range(3))
    return (sum(float(u[1]) for u in updates) / len(updates), sum(u[2] for u in updates) / len(updates), results)


def pfedla_round(hypernetworks, stored_models, worker, data, clients, args, round_, sizes):
    """Returns (mean train loss, bytes server->client, bytes client->server)."""
    ids = torch.as_tensor(clients, device=stored_models.device)
    alpha = hypernetworks(ids)
    theta_bar = pfedla.aggregate_layerwise(alpha, stored_models, sizes)
    is_retained = pfedla.retained_layers(alpha.detach(), ids, args.k)
    received = pfedla.with_retained_layers(theta_bar.detach(), stored_models, ids, sizes, is_retained)
    updates = pool_of(worker, data).map(lambda model, client: pfedla.client_update(
        model, received[clients.index(client)], data, client, args, round_), clients)
    pfedla.server_update(hypernetworks, stored_models, ids, theta_bar, received,
                         torch.stack([t for t, _ in updates]), args.hn_lr)
    element, num_params = stored_models.element_size(), stored_models.shape[1]
    retained_params = int((is_retained.long() * torch.as_tensor(sizes, device=is_retained.device)).sum())
    return (sum(float(loss) for _, loss in updates) / len(updates),
            (len(clients) * num_params - retained_params) * element,
            len(clients) * num_params * element)


def fedacd_round(global_model, worker, data, clients, args, round_, client_stack, risk=None):
    """Returns the round's statistics as fedacd.main logs them; ``client_stack`` receives the
    uploaded models."""
    global_state, classes = common.flatten_state(global_model), fedacd.held_classes(data)
    if risk is None:
        updates = pool_of(worker, data).map(lambda model, client: (*fedacd.client_update(
            model, global_state, data, client, classes, args, round_), None), clients)
    else:  # Table 3's average risk besides: tools/fedacd_diagnostics.py's client (FedACD without --fedavg)
        args = argparse.Namespace(**{**vars(args), "fedavg": False})
        updates = pool_of(worker, data).map(lambda model, client: fedacd_diagnostics.client_update(
            model, global_state, data, client, classes, args, round_, risk), clients)
    states, losses, scores, kls, risks = zip(*updates)
    client_stack[:len(clients)] = torch.stack(states)
    common.load_flat_state(global_model, fedacd.server_update(states, scores, args.uniform_agg))
    scores = torch.stack(scores)
    stats = {"train_loss": sum(float(loss) for loss in losses) / len(losses), "local_kl": float(torch.stack(kls).mean()),
             "score_min": float(scores.min()), "score_max": float(scores.max())}
    if risk is not None:
        stats["local_risk"] = float(torch.stack(risks).mean())
    return stats


def fedacd_local_train(model, data, idx, present, args, batch_seed, mixup_seed):
    """fedacd.client_update's local training of ``idx`` with these seeds: (mean loss, P^m)."""
    return fedacd.fedacd_local_training(model, common.make_optimizer(model, args),
                                        fedacd.mixup_epochs(data, idx, args, batch_seed, mixup_seed),
                                        lambda: ((data.x[b], data.y[b]) for b in idx.split(1024)), data.num_classes,
                                        present, args.lam, args.missing_delta)
