"""pFedLA and HeurpFedLA (Ma et al., "Layer-wised Model Aggregation for Personalized
Federated Learning", CVPR 2022). Our choices where the paper is silent: docs/pfedla.md.

The server keeps the latest trained model theta_j of every client (Alg. 1 "intermediate parameters", one row of an
N x D tensor, the model's float state flattened) and one hypernetwork HN_i(v_i; psi_i) per client that outputs
layer-wise aggregation weights alpha_i (Eq. 3-4). Each round (Alg. 1):
  l. 5   theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l for every layer l (Eq. 5-6);
  l. 6   client i runs --local-epochs of SGD from theta_bar_i, returns Delta theta_i;
  l. 7   the server stores theta_i := theta_bar_i + Delta theta_i;
  l. 8   v_i, psi_i += hn_lr (d theta_bar_i / d(v_i, psi_i))^T Delta theta_i (Eq. 10-11),
         i.e. gradient descent on 1/2 ||theta_bar_i - stop_grad(theta_bar_i + Delta theta_i)||^2:
         the personalised model moves towards the trained one.
HeurpFedLA (--k K, Alg. 2, Eq. 12): the K layers with the largest self-weight alpha_i^{l,i} are neither aggregated
nor sent; client i keeps its own theta_i^l for them (l. 7, 13). The hypernetwork step (l. 10) still uses
theta_bar_i of l. 5, the full aggregate, and Delta theta_i over all layers (its return line), so the heads of the
retained layers learn too. K=0 is pFedLA.

A "layer" is a module that owns parameters; BatchNorm running statistics are aggregated with their layer, integer
buffers are not aggregated. The clients of a round are handled "in parallel" (Alg. 1 l. 4): all personalised
models of a round are built from the stored models at the start of the round. Evaluated model: theta_bar_i, built
from the current hypernetworks and stored models (what client i receives next), on client i's test data; the paper
reports the unweighted mean over clients (test_acc_mean).

    python pfedla.py --dataset synthetic --rounds 10          # offline quick start (mlp)
    python pfedla.py --dataset cifar10                        # Table 1, 10 clients, non-IID_1
    python pfedla.py --dataset emnist --k 1                   # HeurpFedLA (Table 1 / 3)
"""
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import run_folder

HEADLINE_METRIC = "test_acc_mean"  # what the paper reports, in metrics.csv
HEADLINE = "test_acc_mean (unweighted mean over clients; Table 1 after 600 rounds)"
AUTO_IMAGE = "pfedlacnn"  # --model auto on images: the CNN of Sec. 4.1


def parse_args(argv=None):
    def resolve(args):  # Sec. 4.2: lr 0.01 for CIFAR, 0.005 for EMNIST and FashionMNIST
        args.lr = (0.005 if args.dataset in ("emnist", "fmnist") else 0.01) if args.lr is None else args.lr

    parser = common.base_parser(__doc__.splitlines()[0], script="pfedla", partition="pfedla1", num_clients=10,
                                join_ratio=1.0, local_epochs=10, batch_size=32, lr=None, rounds=600, train_ratio=0.70,
                                helps={"lr": "local learning rate (default: 0.005 on emnist and fmnist, else 0.01)",
                                       "model": common.model_help(AUTO_IMAGE)})
    a = parser.add_argument
    a("--k", type=int, default=0, help="HeurpFedLA: layers kept local (top-k self-weight); 0 = pFedLA")
    a("--embed-dim", type=int, default=100, help="size of the embedding v_i")
    a("--hidden-dim", type=int, default=100, help="width of the hypernetwork MLP (3 hidden layers)")
    a("--hn-lr", type=float, default=1.0, help="step size of the hypernetwork update (Alg. 1 l. 8; plain SGD, "
      "the paper gives none)")
    return common.parse_args(parser, argv, resolve, checks=lambda args: [
        (args.k >= 0, f"--k must be >= 0, got {args.k}"),
        (math.isfinite(args.hn_lr) and args.hn_lr >= 0, f"--hn-lr must be a finite number >= 0, got {args.hn_lr}"),
        (1 <= args.embed_dim <= 100000 and 1 <= args.hidden_dim <= 100000,
         "--embed-dim and --hidden-dim must be in [1, 100000]")])


class LayerHypernetworks(nn.Module):
    """The N hypernetworks HN_i(v_i; psi_i) of Eq. (4), batched: every tensor has a leading
    client dimension, so all clients' hypernetworks run as one einsum per layer.

    HN_i: embedding v_i -> 3 x (Linear, ReLU) -> one linear head per model layer l giving N scores -> softmax over
    clients, so alpha_i^l >= 0 and sum_j alpha_i^{l,j} = 1 (Eq. 3). Initialisation as nn.Linear / nn.Embedding
    (U(+-1/sqrt(fan_in)), N(0, 1)), drawn from ``generator``: alpha starts close to uniform."""

    def __init__(self, num_clients, num_layers, embed_dim=100, hidden_dim=100, hidden_layers=3, generator=None):
        super().__init__()
        n = num_clients

        def uniform(*shape, fan_in):
            bound = 1 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound, generator=generator))

        self.embedding = nn.Parameter(torch.randn(n, embed_dim, generator=generator))  # v_i
        dims = [embed_dim] + [hidden_dim] * hidden_layers
        self.mlp_weight = nn.ParameterList([uniform(n, a, b, fan_in=a) for a, b in zip(dims, dims[1:])])
        self.mlp_bias = nn.ParameterList([uniform(n, b, fan_in=a) for a, b in zip(dims, dims[1:])])
        self.head_weight = uniform(n, hidden_dim, num_layers, n, fan_in=hidden_dim)  # one head per layer
        self.head_bias = uniform(n, num_layers, n, fan_in=hidden_dim)

    def forward(self, clients):
        """alpha_i for each client id in ``clients`` (S,): a tensor (S, layers, N), Eq. (3)."""
        h = self.embedding[clients]
        for w, b in zip(self.mlp_weight, self.mlp_bias):
            h = F.relu(torch.einsum("si,sio->so", h, w[clients]) + b[clients])
        scores = torch.einsum("sh,shlj->slj", h, self.head_weight[clients]) + self.head_bias[clients]
        return scores.softmax(dim=-1)


def layer_sizes(model):
    """Length of each layer's block in the model's flat float state (the float entries of its state_dict, in order). A
    layer is a module that owns parameters; its parameters and float buffers (BatchNorm's running statistics) must
    be consecutive, and the layers must cover the whole vector in their registration order."""
    layers = [(name, m) for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    owner = {(f"{name}." if name else "") + k: i for i, (name, m) in enumerate(layers)
             for k, _ in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]}
    sizes = [0] * len(layers)
    order = []
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            if key not in owner:
                raise ValueError(f"float buffer {key} is outside the parameter-owning modules")
            if not order or order[-1] != owner[key]:
                order.append(owner[key])
            sizes[owner[key]] += value.numel()
    if order != list(range(len(layers))):
        raise ValueError("each layer's parameters and buffers must be consecutive in the state_dict")
    return sizes


def flatten_state(model):
    """common.py's, so that the pieces paste alone: the state_dict's float entries as one vector (a stored model)."""
    return torch.cat([v.reshape(-1) for v in model.state_dict().values() if v.is_floating_point()])


def load_flat_state(model, flat):
    """``flatten_state``'s inverse, in place; integer buffers (BatchNorm's batch count) are kept."""
    state = [v for v in model.state_dict().values() if v.is_floating_point()]  # detached views: copy_ needs no no_grad
    for v, part in zip(state, flat.split([v.numel() for v in state])):
        v.copy_(part.view_as(v))


def aggregate_layerwise(alpha, stored_models, sizes):
    """Eq. (5)-(6): theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l, for every layer l. alpha (S, layers, N),
    stored_models (N, D) -> personalised models (S, D)."""
    blocks = stored_models.split(sizes, dim=1)
    return torch.cat([alpha[:, l] @ block for l, block in enumerate(blocks)], dim=1)


def retained_layers(alpha, clients, k):
    """Eq. (12), Alg. 2 l. 6: for each client i, the k layers with the largest self-weight alpha_i^{l,i}, as a (S,
    layers) boolean mask. ``alpha`` (S, layers, N) as ``LayerHypernetworks`` returns it for ``clients``, the S
    client ids (a list or a tensor)."""
    clients = torch.as_tensor(clients, device=alpha.device)
    self_weight = alpha[torch.arange(len(clients), device=alpha.device), :, clients]  # (S, layers)
    is_retained = torch.zeros_like(self_weight, dtype=torch.bool)
    if k > 0:
        is_retained.scatter_(1, self_weight.topk(k, dim=1).indices, True)
    return is_retained


def with_retained_layers(theta_bar, stored_models, clients, sizes, is_retained):
    """Alg. 2 l. 7 and 13: the model client i starts local training from: the layer-wise aggregate theta_bar_i, except
    for its retained layers (``is_retained``), where it has its own theta_i^l (its last trained model, which is also
    the server's stored row i, so the simulation reads it from there). With no retained layer this is theta_bar_i
    itself."""
    own = stored_models[clients].split(sizes, dim=1)
    return torch.cat([torch.where(is_retained[:, l, None], own[l], block)
                      for l, block in enumerate(theta_bar.split(sizes, dim=1))], dim=1)


def hypernetwork_step(hypernetworks, theta_bar, update, hn_lr):
    """Alg. 1 l. 8, Eq. (10)-(11): (v_i, psi_i) += hn_lr (d theta_bar_i / d(v_i, psi_i))^T Delta theta_i, ``update``
    the clients' Delta theta_i (S, D), trained minus received; summed over clients (each has its own v_i, psi_i).
    One SGD step on 1/2 ||theta_bar_i - stop_grad(theta_bar_i + Delta theta_i)||^2: theta_bar_i moves towards the
    trained model. The step size is ours: Eq. (10)-(11) give none (pfedla.py's --hn-lr 1.0; the public
    re-implementation subtracts 5e-3 times the same vector, with other hypernetworks: docs/pfedla.md).
    Precondition: ``theta_bar`` must be the server's own aggregate, still attached to the graph of ``hypernetworks``
    (``aggregate_layerwise(hypernetworks(clients), ...)`` of this round, not detached and not the copy a client
    received): the gradient flows through it."""
    if theta_bar.grad_fn is None:
        raise ValueError("hypernetwork_step needs theta_bar attached to the hypernetworks' graph (the server's "
                         "aggregate_layerwise(hypernetworks(clients), ...) of this round), not a detached copy")
    loss = 0.5 * (theta_bar - (theta_bar + update).detach()).pow(2).sum()
    grads = torch.autograd.grad(loss, list(hypernetworks.parameters()))
    with torch.no_grad():
        for p, g in zip(hypernetworks.parameters(), grads):
            p.sub_(hn_lr * g)


def client_update(model, theta_bar_i, data, client, args, round_):
    """Client i (Alg. 1 l. 10-14): set its model to the received theta_bar_i (flat) and run local SGD. Returns (the
    trained model, flat; the mean training loss, 0-dim). The client sends Delta theta_i = trained - theta_bar_i."""
    load_flat_state(model, theta_bar_i)
    loss = common.local_train(model, data, data.train_idx[client], args, common.client_seed(args.seed, round_, client))
    return flatten_state(model), loss


def server_update(hypernetworks, stored_models, clients, theta_bar, received, trained, hn_lr):
    """The server after the round (Alg. 1 l. 7-8, Alg. 2 l. 9-10): Delta theta_i = trained - received (what the client
    started from, retained layers included: the return line of Alg. 2), the hypernetwork step with the full
    aggregate theta_bar_i of l. 5 and that Delta over all layers, then theta_i := received + Delta theta_i stored,
    i.e. the trained model (bit-exact)."""
    trained = common.as_rows(trained)
    hypernetwork_step(hypernetworks, theta_bar, trained - received, hn_lr)
    stored_models[clients] = trained


@torch.no_grad()
def evaluate_personalised(hypernetworks, stored_models, worker, data, sizes, k):
    """Every client's theta_bar_i (what it receives next) on its own test data. Also returns the mean self-weight
    alpha_i^{l,i} over clients and layers (a diagnostic of personalisation)."""
    ids = torch.arange(data.num_clients, device=stored_models.device)
    alpha = hypernetworks(ids)
    is_retained = retained_layers(alpha, ids, k)
    results = []
    for i in range(data.num_clients):  # one client at a time: N x D personalised models never exist at once
        theta_bar = aggregate_layerwise(alpha[i:i + 1], stored_models, sizes)
        received = with_retained_layers(theta_bar, stored_models, ids[i, None], sizes, is_retained[i, None])
        load_flat_state(worker, received[0])
        results.append(common.evaluate(worker, data, [data.test_idx[i]]))
    metrics = common.accuracy_metrics(*(torch.cat(r) for r in zip(*results)))
    metrics["self_weight"] = float(alpha[ids, :, ids].mean())
    return metrics


def main(argv=None):
    args = parse_args(argv)
    algo = "heurpfedla" if args.k > 0 else "pfedla"
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    model = common.build_model(args.model, data, auto_image=AUTO_IMAGE).to(device)
    try:
        sizes = layer_sizes(model)
    except ValueError as e:
        raise common.UserError(f"pfedla.py cannot split --model {args.model} into layers: {e}")
    if args.k > len(sizes):
        raise common.UserError(f"--k {args.k} is more than the model's {len(sizes)} layers")
    with torch.device("meta"):  # before anything is allocated (the meta device allocates and draws nothing)
        hn_params = sum(p.numel() for p in LayerHypernetworks(args.num_clients, len(sizes), args.embed_dim,
                                                               args.hidden_dim).parameters())
    model_params = sum(p.numel() for p in model.parameters())
    common.check_fits(f"the hypernetworks ({args.num_clients} x --embed-dim {args.embed_dim}, --hidden-dim "
                      f"{args.hidden_dim}: {hn_params} parameters, with their gradients) and the {args.num_clients} "
                      "client models", (2 * hn_params + args.num_clients * model_params) * 4, device)
    stored_models = flatten_state(model).repeat(args.num_clients, 1)  # Alg. 1 l. 1
    hypernetworks = LayerHypernetworks(args.num_clients, len(sizes), args.embed_dim, args.hidden_dim,
                                       generator=torch.default_generator).to(device)  # --seed's, after the model
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=AUTO_IMAGE), device,
                                   data)
    # plumbing: the run folder (config.json, partition.json, the partition printed), its lock, Ctrl-C at a round's end
    run = run_folder.Run(algo, args, data, device, script="pfedla", headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"hypernetworks": hypernetworks, "stored_models": stored_models}
    start = run.resume(state, rng)
    element, num_params = stored_models.element_size(), stored_models.shape[1]
    print(f"[{algo}] model {model.__class__.__name__}: {num_params} parameters in {len(sizes)} layers; "
          f"hypernetworks: {args.num_clients} x {hn_params // args.num_clients} = {hn_params} parameters; "
          f"{len(pool)} client(s) at a time")

    # plumbing, not the algorithm: progress=, check_finite, run.add_bytes, log, checkpoint, stop (run_folder.py)
    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)
        ids = torch.as_tensor(clients, device=device)
        alpha = hypernetworks(ids)                                               # Alg. 1 l. 5
        theta_bar = aggregate_layerwise(alpha, stored_models, sizes)             # Alg. 1 l. 5
        is_retained = retained_layers(alpha.detach(), ids, args.k)               # Alg. 2 l. 6
        received = with_retained_layers(theta_bar.detach(), stored_models, ids, sizes, is_retained)  # l. 7, 13
        row_of = {client: row for row, client in enumerate(clients)}
        trained, losses = pool.train(lambda model, client: client_update(model, received[row_of[client]], data,
                                                                         client, args, round_), clients,
                                     progress=run.progress(round_))  # l. 10-14
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        server_update(hypernetworks, stored_models, ids, theta_bar, received, trained, args.hn_lr)  # Alg. 1 l. 7-8
        del trained  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        retained_params = int((is_retained.long() * torch.as_tensor(sizes, device=device)).sum())  # not sent
        run.add_bytes(down=(len(clients) * num_params - retained_params) * element,
                      up=len(clients) * num_params * element)
        if run.should_eval(round_):
            run.log(round_, {**evaluate_personalised(hypernetworks, stored_models, pool.models[0], data, sizes, args.k),
                             "train_loss": sum(losses) / len(losses)})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    with torch.no_grad():  # Fig. 7: the weight each layer gives to the client's own model, mean over clients
        ids = torch.arange(args.num_clients, device=device)
        self_weight = hypernetworks(ids)[ids, :, ids].mean(0).tolist()
    per_layer = [[name, round(w, 4)] for (name, _), w in zip(common.layers(model), self_weight)]
    print(f"[{algo}] mean self-weight alpha_i^(l,i) per layer: " + ", ".join(f"{n} {w:.3f}" for n, w in per_layer))
    run.finish({"self_weight_per_layer": per_layer})


if __name__ == "__main__":
    run_folder.run_main(main)
