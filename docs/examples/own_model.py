"""Any of the five scripts with a model of your own, the scripts unchanged: an nn.Module in place of --model.

Every script builds its models (the global model and the clients') with common.build_model(name, data, ...). This
program puts ``build`` in that function's place, which makes ``OwnModel`` for the data, and runs the script named
first with the flags after it. Run it from the repository root:

    python docs/examples/own_model.py fedala --dataset synthetic --rounds 5
    python docs/examples/own_model.py --resume RUN_DIR      # what a stopped run prints; the script is config.json's

Replace OwnModel by yours: it is given the shape of one sample and the number of classes and returns logits. The
scripts take it as their own: FedALA's --p counts its modules that own parameters from the output down (register
them in forward order), pFedLA weighs each such module, FedPake and FedACD aggregate its flat state (FedACD's input
mixup needs float samples). A model that cannot take the data is refused in one line, exit status 2, before
anything is written, as --model is: build() runs it once on one sample (models.run_once).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # not at the top
if __name__ == "__main__":  # run as a program, not imported: a Ctrl-C while torch loads ends in one line
    import startup  # noqa: F401  first, before torch loads (seconds; startup.py)
import importlib  # noqa: E402
import functools  # noqa: E402

import torch.nn as nn  # noqa: E402

import common  # noqa: E402
import models  # noqa: E402
import run_folder  # noqa: E402

PROGRAM = "docs/examples/own_model.py"
SCRIPTS = ("fedavg", "fedala", "pfedla", "fedpake", "fedacd")


class OwnModel(nn.Module):
    """The example's model: one hidden layer over the flattened sample."""

    def __init__(self, sample_shape, num_classes, hidden=128):
        super().__init__()
        self.hidden = nn.Linear(math.prod(sample_shape), hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.out(self.hidden(x.flatten(1)).relu())


def build(name, data, auto_image=None):
    """common.build_model's place: OwnModel for ``data``, run once on one sample, so that data it cannot take is
    refused in one line (exit status 2) while the script sets up, before its run folder exists."""
    if name != "auto":
        raise common.UserError(f"--model {name}: this program trains {OwnModel.__name__}; leave --model out")
    model, shape = OwnModel(tuple(data.x.shape[1:]), data.num_classes), tuple(data.x.shape[1:])
    try:
        models.run_once(model, data.x[:1])
    except Exception as e:  # noqa: BLE001  a shape or dtype its layers do not take
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise common.UserError(f"{OwnModel.__name__} does not take samples of shape {shape}, "
                               f"{str(data.x.dtype).removeprefix('torch.')} ({why})") from None
    return model


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else None
    if name == "--resume" and len(argv) > 1:  # the script the run folder records (flower's runs are not ours)
        name = run_folder.read_json(os.path.join(argv[1], "config.json")).get("script")
    if name not in SCRIPTS:
        raise common.UserError(f"usage: python {PROGRAM} SCRIPT [its flags], SCRIPT one of {', '.join(SCRIPTS)}; "
                               f"or python {PROGRAM} --resume RUN_DIR")
    common.build_model = build  # the one function every script builds its models with
    run_folder.Run = functools.partial(run_folder.Run, program=PROGRAM)  # a stop prints: python PROGRAM --resume DIR
    return importlib.import_module(name).main(argv[1:] if argv[0] in SCRIPTS else argv)


if __name__ == "__main__":
    run_folder.run_main(main)
