"""FedALA: Adaptive Local Aggregation for personalized FL (Zhang et al., AAAI 2023).

FedAvg, except that a joining client does not overwrite its old local model with the
downloaded global model. It initialises its local model element-wise (Alg. 1; our choices: docs/fedala.md):

  Eq. (4)  Theta_hat_i = Theta_i + (Theta - Theta_i) (.) [1 for the lower |Theta|-p layers; W_i^p]
  Eq. (5)  W_i^p <- sigma(W_i^p - eta * dL(Theta_hat_i, D_i^s) / dW_i^p),  sigma = clip to [0, 1]
  Eq. (7)        dL/dW_i^p = dL/dTheta_hat_i^p (.) (Theta - Theta_i)^p

p counts layers (p=1: the last Linear layer, weight and bias), D_i^s is a fresh random s%
of the client's train data each round, W_i^p starts at ones and is kept per client. ALA is
off in round 1 (Theta^0 = Theta_i^0); a client's first ALA (round 2 with join ratio 1) trains
W until the loss settles (Alg. 1 l. 8-11): the std of the last 10 epoch losses below the threshold,
0.01 as the authors ran it ("we set it to 0.01 in our paper by default", TsingZ0/FedALA README.md),
with our cap of 100 epochs because a small threshold "may cause your system to get stuck" (the same
README). Every later ALA trains one epoch (l. 12-14).
Lower layers and all buffers come from the global model (l. 15). Then local SGD and FedAvg
aggregation of the trained local models (l. 16-18).

Evaluated model: each joining client's ALA-initialised model, before local training, on the
client's own test data; a client not joining the round is evaluated with its current local
model (its last trained one). Headline: the best pooled test accuracy over rounds. Also logged:
global_model_acc, the aggregated global model (l. 18) on every client's test data, pooled, which
is how FedPake's Tables 1-3 report FedALA (FedPake App. C.2: the global model of every method).

    python fedala.py --dataset synthetic --rounds 20        # offline quick start
    python fedala.py --dataset cifar10 --beta 0.1           # Table 2, Dir(0.1) CIFAR-10
"""
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import common

import math

import numpy as np
import torch
import torch.nn.functional as F

import run_folder

HEADLINE_METRIC = "test_acc"  # what the paper reports, in metrics.csv
HEADLINE = "best test_acc (FedALA Table 2: best accuracy of the local models)"
AUTO_IMAGE = "cnn"  # --model auto on images


def parse_args(argv=None):
    parser = common.base_parser(__doc__.splitlines()[0], script="fedala", lr=None,
                                helps={"lr": common.LR_HELP, "model": common.model_help(AUTO_IMAGE)})
    a = parser.add_argument
    a("--eta", type=float, default=1.0, help="learning rate eta of the ALA weights W (Alg. 1 l. 10)")
    a("--s", type=float, default=80, help="percent of the client's train data used by ALA each round")
    a("--p", type=int, default=1, help="ALA range: the top p layers (p=1: the last Linear layer)")
    a("--threshold", type=float, default=0.01,
      help="initial stage stops when the std of the last --num-pre-loss epoch losses is below this (default: "
           "0.01, the paper's: \"we set it to 0.01 in our paper by default\" TsingZ0/FedALA README.md @ a7a9b21)")
    a("--num-pre-loss", type=int, default=10, help="epoch losses looked at by the initial-stage rule")
    a("--max-init-epochs", type=int, default=100,
      help="ours, not the paper's: hard cap on the initial stage's weight-learning epochs, because \"a small "
           "threshold may cause your system to get stuck in the first iteration\" (the same README)")
    a("--no-ala", action="store_true", help="overwrite with the global model (FedAvg with personal copies)")
    return common.parse_args(parser, argv, common.fedala_learning_rate, checks=lambda args: [
        (math.isfinite(args.eta) and args.eta > 0, f"--eta must be a finite number > 0, got {args.eta}"),
        (0 < args.s <= 100, f"--s is a percent in (0, 100], got {args.s}"),
        (args.p >= 1, f"--p must be >= 1, got {args.p}"),
        (math.isfinite(args.threshold) and args.threshold >= 0, f"--threshold must be >= 0, got {args.threshold}"),
        (args.num_pre_loss >= 2, f"--num-pre-loss must be >= 2, got {args.num_pre_loss}"),
        (args.max_init_epochs >= 1, f"--max-init-epochs must be >= 1, got {args.max_init_epochs}")])


class ALA:
    """Adaptive Local Aggregation for ``num_clients`` clients of the architecture ``model``.

    p counts layers, i.e. modules that own parameters, from the output down. Needs only torch and
    numpy: it can be pasted into any client code. Holds each client's element-wise weights W_i^p (one
    flat row per client, ones at the start, Alg. 1 l. 2) and whether the client is still in its initial
    stage (``initial_stage``, the official ALA.py's ``start_phase``). ``initialise`` works on plain
    nn.Modules: it learns W_i^p with the global and local models frozen and writes Theta_hat_i (Eq. 4)
    into the local model in place. The caller skips it
    in round 1 (Alg. 1: Theta^0 = Theta_i^0), where it would learn W on two equal models and end the
    client's initial stage at once.
    """

    def __init__(self, model, num_clients, p=1, eta=1.0, s=80, batch_size=10, threshold=0.01, num_pre_loss=10,
                 max_init_epochs=100):
        layers = [(name, m) for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
        if not 1 <= p <= len(layers):
            raise ValueError(f"p={p} is outside 1..{len(layers)}, the layers of {model.__class__.__name__}")
        self.top = [f"{name}.{k}" if name else k  # parameter names of the top p layers
                    for name, m in layers[-p:] for k, _ in m.named_parameters(recurse=False)]
        self.shapes = [model.get_parameter(k).shape for k in self.top]
        self.sizes = [shape.numel() for shape in self.shapes]
        self.eta, self.s, self.batch_size = eta, s, batch_size
        self.threshold, self.num_pre_loss, self.max_init_epochs = threshold, num_pre_loss, max_init_epochs
        self.weights = torch.ones(num_clients, sum(self.sizes), device=next(model.parameters()).device)
        self.initial_stage = [True] * num_clients
        self.init_losses = [[] for _ in range(num_clients)]  # epoch losses of each client's initial stage

    def client_weights(self, client):
        """W_i^p as tensors shaped like the top-p parameters (views: in-place updates persist)."""
        return [w.view(shape) for w, shape in zip(self.weights[client].split(self.sizes), self.shapes)]

    def subset(self, n, generator):
        """Alg. 1 l. 7: a random s% of the client's n train samples (at least one)."""
        return torch.randperm(n, generator=generator)[:max(1, round(self.s / 100 * n))]

    def initialise(self, client, global_model, local_model, x, y, generator):
        """Alg. 1 l. 7-15 on one client: train W_i^p by Eq. (5)/(7) on a random s% of (x, y),
        clip it, and leave Theta_hat_i (Eq. 4) in ``local_model``, which holds the client's old
        local model Theta_i on entry. ``generator`` (CPU) draws the subset and the batch order.
        ``global_model`` is not changed. Returns the number of weight-learning epochs."""
        glob = global_model.state_dict()
        params = dict(local_model.named_parameters())
        top = [params[k] for k in self.top]
        old = [p.detach().clone() for p in top]  # Theta_i^p, the old local top layers
        update = [glob[k] - o for k, o in zip(self.top, old)]  # (Theta - Theta_i)^p, the "update" of Eq. (3)
        weights = self.client_weights(client)
        with torch.no_grad():
            local_model.load_state_dict(glob)  # lower layers and buffers from the global model (l. 15)
            for p, o, u, w in zip(top, old, update, weights):
                p.copy_(torch.addcmul(o, u, w))  # Eq. (4): Theta_i + (Theta - Theta_i) (.) W
        lower = [p for k, p in params.items() if k not in self.top and p.requires_grad]
        for p in lower:  # only W is trained (gradients stop at the top p layers)
            p.requires_grad_(False)
        subset = self.subset(len(y), generator)
        local_model.train()
        epochs = 0
        while True:
            order = subset[torch.randperm(len(subset), generator=generator)].to(y.device, non_blocking=True)
            total, steps = torch.zeros((), device=y.device), 0
            starts = list(range(0, len(order), self.batch_size))
            if len(starts) > 1 and len(order) - starts[-1] == 1:  # no batch of one sample (BatchNorm)
                starts.pop()
            for start, end in zip(starts, starts[1:] + [len(order)]):
                batch = order[start:end]
                loss = F.cross_entropy(local_model(x[batch]), y[batch])
                grads = torch.autograd.grad(loss, top)  # dL / dTheta_hat^p
                with torch.no_grad():
                    for p, o, u, w, g in zip(top, old, update, weights, grads):
                        w.addcmul_(g, u, value=-self.eta).clamp_(0, 1)  # Eq. (7), then sigma (l. 10-11, 13-14)
                        p.copy_(torch.addcmul(o, u, w))  # Eq. (4) with the new W
                total, steps = total + loss.detach(), steps + 1
            epochs += 1
            if not self.initial_stage[client]:
                break  # Alg. 1 l. 12-14: one epoch after the initial stage
            losses = self.init_losses[client]
            losses.append(float(total) / steps)  # mean batch loss of the epoch: one host sync per epoch
            settled = len(losses) >= self.num_pre_loss and np.std(losses[-self.num_pre_loss:]) < self.threshold
            if settled or epochs >= self.max_init_epochs:  # Alg. 1 l. 9: "while W does not converge"
                self.initial_stage[client] = False
                break
        for p in lower:
            p.requires_grad_(True)
        with torch.no_grad():  # train-mode BatchNorm moved the running statistics: back to the global ones
            for k, b in local_model.named_buffers():
                b.copy_(glob[k])
        return epochs

    def state_dict(self):
        return {"weights": self.weights, "initial_stage": list(self.initial_stage),
                "init_losses": [list(l) for l in self.init_losses]}

    def load_state_dict(self, state):
        self.weights.copy_(state["weights"])
        self.initial_stage = list(state["initial_stage"])
        self.init_losses = [list(l) for l in state["init_losses"]]


def client_update(model, global_model, local_state, ala, data, client, args, round_, evaluate=False):
    """Client i in round t (Alg. 1 l. 7-17): ALA initialises the local model from the old one (``local_state``,
    flat) and the global model (l. 7-15), then local training (l. 16); ALA is off in round 1. Returns (the
    trained local model, flat; the mean training loss, 0-dim; the number of ALA epochs; if ``evaluate``, the
    test result (correct, count, summed loss) of the ALA-initialised model)."""
    idx = data.train_idx[client]
    if round_ == 1 or args.no_ala:
        model.load_state_dict(global_model.state_dict())
        ala_epochs = 0
    else:
        common.load_flat_state(model, local_state)  # the old local model Theta_i^{t-1}
        generator = torch.Generator().manual_seed(common.client_seed(args.seed, round_, client, tag=1))
        ala_epochs = ala.initialise(client, global_model, model, data.x[idx], data.y[idx], generator)
    result = common.evaluate(model, data, [data.test_idx[client]]) if evaluate else None
    loss = common.local_train(model, data, idx, args, common.client_seed(args.seed, round_, client))
    return common.flatten_state(model), loss, ala_epochs, result


def global_model_accuracy(global_model, data):
    """The aggregated global model Theta (Alg. 1 l. 18) on every client's own test data, pooled
    (correct over all test samples, %): FedALA as FedPake's Tables 1-3 evaluate it."""
    return common.accuracy_metrics(*common.evaluate(global_model, data, data.test_idx))["test_acc"]


def main(argv=None):
    args = parse_args(argv)
    device = common.resolve_device(args.device)
    rng = common.seed_everything(args.seed)
    data = common.load_federated_data(args, device)
    global_model = common.build_model(args.model, data, auto_image=AUTO_IMAGE).to(device)
    try:  # ALA checks --p against the model's layers
        ala = ALA(global_model, args.num_clients, p=args.p, eta=args.eta, s=args.s, batch_size=args.batch_size,
                  threshold=args.threshold, num_pre_loss=args.num_pre_loss, max_init_epochs=args.max_init_epochs)
    except ValueError as e:
        raise common.UserError(f"--p {args.p}: {e}") from None
    common.check_client_models(global_model, args.num_clients)
    local_models = common.flatten_state(global_model).repeat(args.num_clients, 1)  # Alg. 1 l. 1
    pool = common.ClientPool.build(args, lambda: common.build_model(args.model, data, auto_image=AUTO_IMAGE), device,
                                   data)
    model_bytes = common.state_bytes(global_model)
    # plumbing: the run folder (config.json, partition.json, the partition printed), its lock, Ctrl-C at a round's end
    run = run_folder.Run("fedala", args, data, device, headline_metric=HEADLINE_METRIC, headline=HEADLINE)
    state = {"global_model": global_model, "local_models": local_models, "ala": ala}
    start = run.resume(state, rng)
    print(f"[fedala] model {global_model.__class__.__name__}: {local_models.shape[1]} parameters; ALA on the top "
          f"p={args.p} layer(s) ({', '.join(ala.top)}): {ala.weights.shape[1]} learnable weights per client"
          f"{' (off: --no-ala)' if args.no_ala else ''}; {len(pool)} client(s) at a time")

    # plumbing, not the algorithm: progress=, check_finite, run.add_bytes, log, checkpoint, stop (run_folder.py)
    for round_ in range(start, args.rounds + 1):
        clients = common.sample_clients(rng, args.num_clients, args.join_ratio)  # Alg. 1 l. 4-5
        evaluate = run.should_eval(round_)
        in_initial_stage = [c for c in clients if ala.initial_stage[c]]
        client_states, losses, ala_epochs, results = pool.train(lambda model, client: client_update(
            model, global_model, local_models[client], ala, data, client, args, round_, evaluate), clients,
                                                                progress=run.progress(round_))  # l. 6-17
        local_models[clients] = client_states  # each client's local model Theta_i, kept for its next round
        losses = [common.check_finite(loss, round_, client) for client, loss in zip(clients, losses)]
        num_samples = [len(data.train_idx[client]) for client in clients]
        common.load_flat_state(global_model, common.weighted_average(client_states, num_samples))  # l. 18
        del client_states  # frees the K x D rows before evaluation and the next round (peak memory: one round's rows)
        done = [c for c in in_initial_stage if not ala.initial_stage[c]]
        if done:
            print(f"[fedala] round {round_}: initial stage (Alg. 1 l. 8-11) done on {len(done)} client(s) after "
                  f"{[len(ala.init_losses[c]) for c in done]} weight-learning epochs")
        run.add_bytes(down=model_bytes * len(clients), up=model_bytes * len(clients))
        if evaluate:  # joining clients: their ALA-initialised models; the others: their current local models
            results = dict(zip(clients, results))
            for client in sorted(set(range(args.num_clients)) - set(clients)):
                common.load_flat_state(pool.models[0], local_models[client])
                results[client] = common.evaluate(pool.models[0], data, [data.test_idx[client]])
            totals = [torch.cat([results[c][i] for c in range(args.num_clients)]) for i in range(3)]
            run.log(round_, {**common.accuracy_metrics(*totals), "train_loss": sum(losses) / len(losses),
                             "ala_epochs": sum(ala_epochs) / len(ala_epochs),
                             "global_model_acc": global_model_accuracy(global_model, data)})
        run.checkpoint(round_, state, rng)
        if run.stop_requested(round_):  # Ctrl-C: this round's checkpoint is written
            return run.stop(round_)
    run.finish({"ala_weights_per_client": ala.weights.shape[1],
                "initial_stage_epochs": [len(losses) for losses in ala.init_losses]})


if __name__ == "__main__":
    run_folder.run_main(main)
