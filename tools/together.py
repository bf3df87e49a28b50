"""Clients together: the local SGD of a round's clients as one stacked computation with torch.func, the
same arithmetic as training them one after another (common.local_train, FedAvg's ClientUpdate), up to the
order of float sums. A tested piece to paste, needing only torch; no script runs it (docs/speed.md, "Clients
together": on a CPU it takes 1.21x the loop's time, and no GPU measurement has shown the gain that would put
it on the round's path). tests/test_together.py holds it equal to the loop; tests/bench_together.py times a
FedAvg round's local training both ways on any device.

Step s trains every client that still has a step s at once: ``vmap(grad(loss))`` over the clients'
stacked parameters (K, ...), ``functional_call`` of the one model on each client's batch s. The clients
are sorted by their number of steps, most first, so those still training at step s are the first k_s
of the stack; a batch shorter than the widest is padded with weight-0 samples. The update is
torch.optim.SGD's (weight decay, then momentum with its buffer set to the first gradient, then the
step), on all k_s clients' parameters at once, one tensor per parameter of the model.
"""
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap


def stack_batches(batches, device):
    """The clients' minibatches (per client its index tensors, in order) as (S, K, W) indices into the
    data and (S, K, W) 0/1 weights: row [s, k] is client k's step s, padded to the widest batch W with
    weight-0 samples; S is the most steps of any client. One gather on ``device``."""
    steps, width = max(map(len, batches), default=0), max((len(b) for bs in batches for b in bs), default=1)
    starts, lengths = torch.zeros(steps, len(batches), dtype=torch.long), torch.zeros(steps, len(batches),
                                                                                      dtype=torch.long)
    offset = 0
    for k, client_batches in enumerate(batches):
        sizes = torch.tensor([len(b) for b in client_batches], dtype=torch.long)
        lengths[:len(sizes), k] = sizes
        starts[:len(sizes), k] = offset + sizes.cumsum(0) - sizes
        offset += int(sizes.sum())
    slot = torch.arange(width)
    real = slot < lengths[:, :, None]
    flat = torch.cat([b for bs in batches for b in bs]) if offset else torch.zeros(1, dtype=torch.long, device=device)
    index = flat[torch.where(real, starts[:, :, None] + slot, 0).to(device, non_blocking=True)]
    return index, real.to(device, non_blocking=True)


def train_together(model, starts, batches, x, y, lr, momentum=0.0, weight_decay=0.0):
    """K clients' local SGD from their flat start states ``starts`` (K x D, ``model``'s parameters in
    named_parameters order; a model without buffers, e.g. no BatchNorm), client k on its minibatches
    ``batches[k]`` (index tensors into ``x``, ``y``). Returns (the trained states, K x D; each client's mean
    minibatch loss, (K,)), what K calls of common.local_train return."""
    names, shapes = zip(*[(n, p.shape) for n, p in model.named_parameters()])
    steps = [len(b) for b in batches]
    order = sorted(range(len(batches)), key=lambda k: -steps[k])  # most steps first: the active clients a prefix
    index, real = stack_batches([batches[k] for k in order], x.device)
    weight = real.to(starts.dtype)
    sorted_rows = starts[torch.as_tensor(order, device=starts.device)]
    params = [piece.reshape(len(order), *shape).contiguous()
              for piece, shape in zip(sorted_rows.split([s.numel() for s in shapes], 1), shapes)]
    buffers = [torch.zeros_like(p) for p in params] if momentum else []

    def loss(client_params, xb, yb, wb):  # one client's mean cross-entropy over the real samples of its batch
        per_sample = F.cross_entropy(functional_call(model, dict(zip(names, client_params)), (xb,)), yb,
                                     reduction="none")
        mean = (per_sample * wb).sum() / wb.sum()
        return mean, mean

    step = vmap(grad(loss, has_aux=True))
    total = torch.zeros(len(order), dtype=starts.dtype, device=starts.device)
    training = [sum(n > s for n in steps) for s in range(index.shape[0])]  # k_s
    model.train()
    for s, k in enumerate(training):
        rows, batch = [p[:k] for p in params], index[s, :k]
        grads, losses = step(rows, x[batch], y[batch], weight[s, :k])
        if weight_decay:
            grads = [g.add(p, alpha=weight_decay) for g, p in zip(grads, rows)]
        if momentum:
            momentum_rows = [b[:k] for b in buffers]
            for b, g in zip(momentum_rows, grads):
                if s == 0:
                    b.copy_(g)
                else:
                    b.mul_(momentum).add_(g)
            grads = momentum_rows
        for p, g in zip(rows, grads):
            p.add_(g, alpha=-lr)
        total[:k] += losses.detach()
    back = torch.as_tensor(sorted(range(len(order)), key=order.__getitem__), device=starts.device)
    trained = torch.cat([p.reshape(len(order), -1) for p in params], 1)[back]
    mean = total / torch.as_tensor([max(steps[k], 1) for k in order], dtype=total.dtype, device=total.device)
    return trained, mean[back]
