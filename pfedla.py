"""pFedLA and HeurpFedLA (Ma et al., "Layer-wised Model Aggregation for Personalized
Federated Learning", CVPR 2022), SPEC section 4.

The server keeps the latest trained model theta_j of every client (Alg. 1 "intermediate
parameters", one row of an N x D tensor in common.flatten_state order) and one
hypernetwork HN_i(v_i; psi_i) per client that outputs layer-wise aggregation weights
alpha_i (Eq. 3-4). Each round (Alg. 1):
  l. 5   theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l for every layer l (Eq. 5-6);
  l. 6   client i runs --local-epochs of SGD from theta_bar_i, returns Delta theta_i;
  l. 7   the server stores theta_i := theta_bar_i + Delta theta_i;
  l. 8   v_i, psi_i += hn_lr (d theta_bar_i / d(v_i, psi_i))^T Delta theta_i (Eq. 10-11),
         i.e. gradient descent on 1/2 ||theta_bar_i - stop_grad(theta_bar_i + Delta theta_i)||^2:
         the personalised model moves towards the trained one.
HeurpFedLA (--k K, Alg. 2, Eq. 12): the K layers with the largest self-weight alpha_i^{l,i}
are neither aggregated nor sent; client i keeps its own theta_i^l for them. K=0 is pFedLA.

A "layer" is a module that owns parameters (common.layers); BatchNorm running statistics
are aggregated with their layer, integer buffers are not aggregated. The clients of a round
are handled "in parallel" (Alg. 1 l. 4): all personalised models of a round are built from
the stored models at the start of the round. Evaluated model: theta_bar_i, built from the
current hypernetworks and stored models (what client i receives next), on client i's test
data; the paper reports the unweighted mean over clients (test_acc_mean).

    python pfedla.py --dataset synthetic --rounds 10          # offline quick start (mlp)
    python pfedla.py --dataset cifar10                        # Table 1, 10 clients, non-IID_1
    python pfedla.py --dataset emnist --k 1                   # HeurpFedLA (Table 1 / 3)
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import common


def parse_args(argv=None):
    def resolve(args):
        if args.lr is None:  # Sec. 4.2: 0.01 for CIFAR, 0.005 for EMNIST and FashionMNIST
            args.lr = 0.005 if args.dataset in ("emnist", "fmnist") else 0.01

    parser = common.base_parser(__doc__.splitlines()[0], partition="pfedla1", num_clients=10, join_ratio=1.0,
                                local_epochs=10, batch_size=32, lr=None, rounds=600, train_ratio=0.70)
    parser.add_argument("--k", type=int, default=0, help="HeurpFedLA: layers kept local (top-k self-weight); 0 = pFedLA")
    parser.add_argument("--embed-dim", type=int, default=100, help="size of the embedding v_i")
    parser.add_argument("--hidden-dim", type=int, default=100, help="width of the hypernetwork MLP (3 hidden layers)")
    parser.add_argument("--hn-lr", type=float, default=1.0,
                        help="step size of the hypernetwork update Eq. (10)-(11) (plain SGD; the paper gives none)")
    args = common.parse_args(parser, argv, resolve)
    if args.k < 0 or args.hn_lr < 0 or args.embed_dim < 1 or args.hidden_dim < 1:
        raise common.UserError("--k and --hn-lr must be >= 0, --embed-dim and --hidden-dim >= 1")
    return args


class LayerHypernetworks(nn.Module):
    """The N hypernetworks HN_i(v_i; psi_i) of Eq. (4), batched: every tensor has a leading
    client dimension, so all clients' hypernetworks run as one einsum per layer.

    HN_i: embedding v_i -> 3 x (Linear, ReLU) -> one linear head per model layer l giving N
    scores -> softmax over clients, so alpha_i^l >= 0 and sum_j alpha_i^{l,j} = 1 (Eq. 3).
    Initialisation as nn.Linear / nn.Embedding (U(+-1/sqrt(fan_in)), N(0, 1)): alpha starts
    close to uniform."""

    def __init__(self, num_clients, num_layers, embed_dim=100, hidden_dim=100, hidden_layers=3):
        super().__init__()
        n = num_clients

        def uniform(*shape, fan_in):
            return nn.Parameter(torch.empty(*shape).uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in)))

        self.embedding = nn.Parameter(torch.randn(n, embed_dim))  # v_i
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

    def params_per_client(self):
        return sum(p[0].numel() for p in self.parameters())


def layer_sizes(model):
    """Length of each layer's block in the flat state (common.flatten_state order). A layer's
    float parameters and buffers are consecutive there, and the layers cover the whole vector."""
    offsets, offset = {}, 0
    for key, v in model.state_dict().items():
        if v.is_floating_point():
            offsets[key] = (offset, offset + v.numel())
            offset += v.numel()
    sizes, end = [], 0
    for keys in common.layer_state_keys(model):
        spans = [offsets[k] for k in keys if k in offsets]
        if spans[0][0] != end or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            raise common.UserError("pfedla.py needs each layer's parameters and buffers to be consecutive in the "
                                   "model's state_dict")
        sizes.append(spans[-1][1] - end)
        end = spans[-1][1]
    if end != offset:
        raise common.UserError("pfedla.py: the model has float buffers outside parameter-owning modules")
    return sizes


def aggregate_layerwise(alpha, client_models, sizes):
    """Eq. (5)-(6): theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l, for every layer l.
    alpha (S, layers, N), client_models (N, D) -> personalised models (S, D)."""
    blocks = client_models.split(sizes, dim=1)
    return torch.cat([alpha[:, l] @ block for l, block in enumerate(blocks)], dim=1)


def retained_layers(alpha, clients, k):
    """Eq. (12), Alg. 2 l. 6: for each client i, the k layers with the largest self-weight
    alpha_i^{l,i}, as a (S, layers) boolean mask."""
    self_weight = alpha[torch.arange(len(clients), device=clients.device), :, clients]  # (S, layers)
    keep = torch.zeros_like(self_weight, dtype=torch.bool)
    if k > 0:
        keep.scatter_(1, self_weight.topk(k, dim=1).indices, True)
    return keep


def personalised_models(alpha, client_models, clients, sizes, keep):
    """Alg. 1 l. 5 / Alg. 2 l. 7 and 13: the layer-wise aggregate, except for the retained
    layers (``keep``), where client i has its own theta_i^l (its last trained model, which is
    also the server's stored row i, so the simulation reads it from there)."""
    theta_bar = aggregate_layerwise(alpha, client_models, sizes)
    keep_entries = keep.repeat_interleave(torch.as_tensor(sizes, device=keep.device), dim=1)
    return torch.where(keep_entries, client_models[clients], theta_bar)


def hypernetwork_step(hypernetworks, theta_bar, delta, hn_lr):
    """Alg. 1 l. 8, Eq. (10)-(11): (v_i, psi_i) += hn_lr (d theta_bar_i / d(v_i, psi_i))^T Delta theta_i.
    Written as one SGD step on 1/2 ||theta_bar_i - stop_grad(theta_bar_i + Delta theta_i)||^2, whose
    gradient is -(d theta_bar_i / d psi_i)^T Delta theta_i: theta_bar_i moves towards the trained
    model. Summed over clients, since every client has its own v_i, psi_i."""
    loss = 0.5 * (theta_bar - (theta_bar + delta).detach()).pow(2).sum()
    grads = torch.autograd.grad(loss, list(hypernetworks.parameters()))
    with torch.no_grad():
        for p, g in zip(hypernetworks.parameters(), grads):
            p.sub_(hn_lr * g)


def pfedla_round(hypernetworks, client_models, worker, data, clients, args, round_, sizes):
    """One round of Alg. 1 (Alg. 2 for k > 0) over ``clients``. ``client_models`` (N, D) is
    updated in place; ``worker``: one model or a list (see common.for_each_client). Returns
    (mean train loss, bytes server->client, bytes client->server)."""
    ids = torch.as_tensor(clients, device=client_models.device)
    alpha = hypernetworks(ids)                                            # Eq. (3)-(4)
    keep = retained_layers(alpha.detach(), ids, args.k)                   # Alg. 2 l. 6, Eq. (12)
    theta_bar = personalised_models(alpha, client_models, ids, sizes, keep)  # Alg. 1 l. 5, Eq. (5)-(6)
    trained = torch.empty(theta_bar.shape, device=theta_bar.device)

    def train_one(model, slot, client):
        common.load_flat_state(model, theta_bar[slot].detach())           # l. 10-11: client sets theta_i
        loss = common.local_train(model, data, data.train_idx[client], args,
                                  common.client_seed(args.seed, round_, client))  # l. 12-14
        common.flatten_state(model, out=trained[slot])
        return loss

    client_sizes = [len(data.train_idx[c]) for c in clients]
    losses = [common.check_finite(loss, round_, client)
              for client, loss in zip(clients, common.for_each_client(train_one, clients, worker, client_sizes))]
    delta = trained - theta_bar.detach()                                  # Delta theta_i, sent to the server
    hypernetwork_step(hypernetworks, theta_bar, delta, args.hn_lr)        # l. 8, Eq. (10)-(11)
    client_models[ids] = trained  # l. 7: theta_i := theta_bar_i + Delta theta_i, i.e. the trained model (bit-exact)
    element, num_params = client_models.element_size(), client_models.shape[1]
    retained = int((keep.long() * torch.as_tensor(sizes, device=keep.device)).sum())
    bytes_down = (len(clients) * num_params - retained) * element         # retained layers are not sent
    bytes_up = len(clients) * num_params * element                        # Delta theta_i of the whole model
    return sum(losses) / len(losses), bytes_down, bytes_up


@torch.no_grad()
def evaluate_personalised(hypernetworks, client_models, worker, data, sizes, k):
    """Every client's theta_bar_i (what it receives next) on its own test data. Also returns the
    mean self-weight alpha_i^{l,i} over clients and layers (a diagnostic of personalisation)."""
    ids = torch.arange(data.num_clients, device=client_models.device)
    alpha = hypernetworks(ids)
    keep = retained_layers(alpha, ids, k)
    results = []
    for i in range(data.num_clients):  # one client at a time: N x D personalised models never exist at once
        common.load_flat_state(worker, personalised_models(alpha[i:i + 1], client_models, ids[i:i + 1], sizes,
                                                           keep[i:i + 1])[0])
        results.append(common.evaluate(worker, data, [data.test_idx[i]]))
    metrics = common.accuracy_metrics(*(torch.cat(r) for r in zip(*results)))
    metrics["self_weight"] = float(alpha[ids, :, ids].mean())
    return metrics


def main(argv=None):
    args = parse_args(argv)
    algo = "heurpfedla" if args.k > 0 else "pfedla"
    run = common.Run(algo, args, headline="test_acc_mean (unweighted mean over clients; Table 1 after 600 rounds)")
    data = run.data
    worker = common.build_model(args.model, data, auto_image="lenet").to(run.device)
    sizes = layer_sizes(worker)
    if args.k > len(sizes):
        raise common.UserError(f"--k {args.k} is more than the model's {len(sizes)} layers")
    # Alg. 1 l. 1: every client starts from the same initial model
    client_models = common.flatten_state(worker).detach().repeat(args.num_clients, 1)
    hypernetworks = LayerHypernetworks(args.num_clients, len(sizes), args.embed_dim, args.hidden_dim).to(run.device)
    state = {"hypernetworks": hypernetworks, "client_models": client_models}
    start = run.resume(state)
    client_models = state["client_models"]
    workers = common.client_workers(args, lambda: common.build_model(args.model, data, auto_image="lenet"),
                                    run.device, max(1, round(args.join_ratio * args.num_clients)))
    print(f"[{algo}] model {worker.__class__.__name__}: {client_models.shape[1]} parameters in {len(sizes)} layers; "
          f"hypernetworks: {args.num_clients} x {hypernetworks.params_per_client()} = "
          f"{sum(p.numel() for p in hypernetworks.parameters())} parameters; {len(workers)} client(s) at a time")

    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(run.rng, args.num_clients, args.join_ratio)
        train_loss, down, up = pfedla_round(hypernetworks, client_models, workers, data, clients, args, round_, sizes)
        run.add_bytes(down=down, up=up)
        if run.should_eval(round_):
            run.log(round_, {**evaluate_personalised(hypernetworks, client_models, worker, data, sizes, args.k),
                             "train_loss": train_loss})
        run.checkpoint(round_, state)
    with torch.no_grad():  # Fig. 7: the weight each layer gives to the client's own model, mean over clients
        ids = torch.arange(args.num_clients, device=run.device)
        self_weight = hypernetworks(ids)[ids, :, ids].mean(0).tolist()
    per_layer = [[name, round(w, 4)] for (name, _), w in zip(common.layers(worker), self_weight)]
    print(f"[{algo}] mean self-weight alpha_i^(l,i) per layer: " + ", ".join(f"{n} {w:.3f}" for n, w in per_layer))
    run.finish({"self_weight_per_layer": per_layer})


if __name__ == "__main__":
    common.run_main(main)
