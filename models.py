"""The models the scripts train, and ``build_model``, which picks one for the data (``--model``) and refuses, in
one line, data a model does not take. torch and torchvision only (torchvision for the ResNets), so that a model can
be copied out; docs/running.md lists them.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from exits import UserError


def _pooled_side(size):
    return ((size - 4) // 2 - 4) // 2  # twice conv5x5 (no padding) then maxpool 2


class CNN(nn.Module):
    """FedAvg's 4-layer CNN (McMahan et al. 2017) as used by FedALA / PFLlib."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * _pooled_side(image_size) ** 2, 512)  # 1024 / 1600 / 10816 for 28 / 32 / 64
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(F.relu(self.fc1(x.flatten(1))))


class PFedLACNN(nn.Module):
    """pFedLA's CNN (Sec. 4.1: "the same CNN architectures as in FedFomo, FedBN and pFedHN"):
    conv5x5(in,16) [BN] ReLU maxpool2, conv5x5(16,32) [BN] ReLU maxpool2, fc(.,120) ReLU,
    fc(120,84) ReLU, fc(84,classes); BatchNorm after the convs for colour inputs only. 121,278
    parameters on CIFAR-10 and 85,822 on EMNIST digits: Table 3's costs are 1500 x these sizes."""
    CHANNELS = (16, 32)

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        bn, (c1, c2) = in_channels == 3, self.CHANNELS
        self.conv1 = nn.Conv2d(in_channels, c1, 5)
        self.bn1 = nn.BatchNorm2d(c1) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(c1, c2, 5)
        self.bn2 = nn.BatchNorm2d(c2) if bn else nn.Identity()
        self.fc1 = nn.Linear(c2 * _pooled_side(image_size) ** 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class LeNet(PFedLACNN):
    """LeNet-5: the same layers with 6 and 16 channels (BatchNorm for colour inputs only)."""
    CHANNELS = (6, 16)


class SimpleCNN(nn.Module):
    """The "simple CNN" of FedRoD / FedNH used by FedACD."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.fc1 = nn.Linear(64 * _pooled_side(image_size) ** 2, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class MLP(nn.Module):
    """fc(d, 64) ReLU fc(64, classes), for vector data (synthetic, user npz of vectors)."""

    def __init__(self, in_features, num_classes, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(F.relu(self.fc1(x.flatten(1))))


class FastText(nn.Module):
    """Embedding(vocab, 32), the mean embedding, fc(32, 32), fc(32, classes): the authors' fastText (TsingZ0/FedALA
    system/flcore/trainmodel/models.py @ 7939ca7). The mean is theirs: over all L positions of the (N, L) ids, padding
    included (id 0 embeds to zeros, so a text of n tokens gets its token sum / L), not over the n tokens."""

    def __init__(self, vocab_size, num_classes, embed_dim=32, hidden=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        return self.fc(self.fc1(self.embedding(tokens).mean(1)))


MODELS = ["cnn", "pfedlacnn", "lenet", "simplecnn", "resnet18", "resnet34", "mlp", "fasttext"]


def build_model(name, data, auto_image="cnn"):
    """The model ``name`` for ``data`` (``auto``: ``auto_image`` on images, else mlp or fasttext). It runs once on one
    sample (``run_once``), so that data it does not take is refused in one line, before any run folder exists."""
    x = data.x
    if name == "auto":
        name = "fasttext" if not x.is_floating_point() else ("mlp" if x.dim() == 2 else auto_image)
    if name not in MODELS:
        raise UserError(f"unknown model '{name}'; choose auto, {', '.join(MODELS)}")
    try:
        model = _model(name, data)
        run_once(model, x[:1])
        if x.is_cuda:
            deterministic_pooling(model)
        # channels-last weights for channels-last images, or cuDNN converts them on every call; CUDA only: on
        # a CPU other kernels run (ResNet-18's gradients change). Flat states keep the logical order
        return model.to(memory_format=torch.channels_last) if x.is_cuda and x.dim() == 4 else model
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  a shape or dtype its layers do not take, a vocabulary too large
        with torch.random.fork_rng(devices=[]):  # trying the other models draws initial weights
            takes = [m for m in MODELS if m != name and _takes(m, data)]
        why = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        raise UserError(f"--model {name} does not take samples of shape {tuple(x.shape[1:])}, "
                        f"{str(x.dtype).removeprefix('torch.')} ({why}); models that do: {', '.join(takes) or 'none'}")


class GlobalAvgPool(nn.Module):
    """``nn.AdaptiveAvgPool2d(1)`` as a mean over height and width: the same values, and a backward that CUDA admits
    under ``torch.use_deterministic_algorithms`` (AdaptiveAvgPool2d's raises there)."""

    def forward(self, x):
        return x.mean((2, 3), keepdim=True)


def deterministic_pooling(model):
    """Replace ``model``'s ``AdaptiveAvgPool2d(1)`` modules (torchvision's ResNets end in one) by GlobalAvgPool, in
    place; build_model does it for data on CUDA only, so that CPU runs keep the original kernel and their arithmetic."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.AdaptiveAvgPool2d) and child.output_size in (1, (1, 1)):
                setattr(module, child_name, GlobalAvgPool())
    return model


def run_once(model, sample):
    """One forward pass of ``model`` on ``sample`` on the CPU, which raises if the model does not take the data and
    changes nothing: eval mode (BatchNorm's statistics stay), no gradient, then the mode and torch's RNG restored."""
    was_training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model.eval()(sample.cpu())
    finally:
        model.train(was_training)


def _takes(name, data):
    try:
        run_once(_model(name, data), data.x[:1])
        return True
    except Exception:  # noqa: BLE001
        return False


def _model(name, data):
    x, k = data.x, data.num_classes
    if name == "mlp":
        return MLP(x.shape[1:].numel(), k)
    if name == "fasttext":
        if x.is_floating_point():
            raise UserError("--model fasttext needs token ids: integer (N, length) data, e.g. --dataset agnews")
        return FastText(data.vocab_size, k)
    if x.dim() != 4:
        raise UserError(f"--model {name} needs image data (N, C, H, W); {data.info.get('name', 'this dataset')} "
                        f"has shape {tuple(x.shape[1:])}; use --model {'mlp' if x.is_floating_point() else 'fasttext'}")
    channels, size = x.shape[1], x.shape[2]
    small_cnn = {"cnn": CNN, "pfedlacnn": PFedLACNN, "lenet": LeNet, "simplecnn": SimpleCNN}.get(name)
    if small_cnn:
        if _pooled_side(min(x.shape[2:])) < 1:
            raise ValueError("it needs images of at least 16x16")  # build_model's message names the models that do
        return small_cnn(channels, k, size)
    import torchvision
    model = getattr(torchvision.models, name)(weights=None, num_classes=k)
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model


def layers(model):
    """Modules that own parameters, in registration (= forward) order: the "layers" that layer-wise
    methods count (a range of top layers, a weight per layer)."""
    return [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
