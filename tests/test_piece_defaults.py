"""A paper piece pasted with its defaults behaves as its script: every default of a piece (a function or class of a
script) that a flag sets is that flag's default, and the script's call passes the flag (issue 87, item 4)."""
import ast
import importlib
import inspect
import os

import pytest

from conftest import ROOT

SCRIPTS = ["fedavg", "fedala", "pfedla", "fedpake", "fedacd"]
ALIASES = {("fedacd", "aggregation_score", "reduction"): "score_kl"}  # a parameter a flag of another name sets
CALLED_AS = {("fedpake", "aggregate"): "fedpake_aggregate"}  # server_update's form: one-pass or chunked, one signature
NOT_FLAGS = {  # defaulted parameters no flag sets: what a caller passes, or a constant of the piece
    "argv", "script",  # the command line itself
    "evaluate", "uniform",  # fedala.client_update, fedacd.server_update: the caller's mode
    "generator", "random_micro", "random_macro", "stats",  # random sources and an output dict: the caller's
    "hidden_layers",  # pfedla.LayerHypernetworks: 3, the paper's, no flag
    "chunk_elems",  # fedpake_aggregate_chunked: the chunk's size, the same result
    "eps", "dtype", "device",  # numerical guards and placement
}


def pieces(name):
    """(piece name, callable whose signature holds the defaults) of every function and class defined in a script."""
    module = importlib.import_module(name)
    for key, obj in vars(module).items():
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == name:
            yield key, obj.__init__ if inspect.isclass(obj) else obj


def flag_of(name, piece, parameter, args):
    flag = ALIASES.get((name, piece, parameter), parameter)
    return flag if flag in args and parameter not in NOT_FLAGS else None


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_piece_s_defaults_are_its_script_s_flag_defaults(name):
    args = vars(importlib.import_module(name).parse_args([]))  # the script's defaults (its paper's main setting)
    checked = []
    for piece, target in pieces(name):
        for parameter in inspect.signature(target).parameters.values():
            if parameter.default is inspect.Parameter.empty:
                continue
            flag = flag_of(name, piece, parameter.name, args)
            assert flag or parameter.name in NOT_FLAGS, f"{name}.{piece}({parameter.name}=...) has no flag: list it"
            if flag:
                assert parameter.default == args[flag], \
                    f"{name}.{piece}'s {parameter.name}={parameter.default!r}, {name}.py runs --{flag} {args[flag]!r}"
                checked.append(f"{piece}.{parameter.name}")
    expected = {"fedavg": [], "fedala": ["ALA.p", "ALA.eta", "ALA.s", "ALA.threshold"],
                "pfedla": ["LayerHypernetworks.embed_dim", "LayerHypernetworks.hidden_dim"],
                "fedpake": ["fedpake_aggregate.kappa", "fedpake_aggregate.n_micro", "fedpake_aggregate.delta"],
                "fedacd": ["aggregation_score.reduction", "fedacd_local_training.lam",
                           "fedacd_local_training.missing_delta"]}[name]
    assert set(expected) <= set(checked), checked


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_passes_each_flag_backed_parameter_from_its_flag(name):
    """Where a script calls one of its pieces, every flag-backed parameter it passes is ``args.<that flag>``, and none
    it leaves out is one a flag sets: so the defaults above are what it runs."""
    args = vars(importlib.import_module(name).parse_args([]))
    signatures = {piece: inspect.signature(target) for piece, target in pieces(name)}
    tree = ast.parse(open(os.path.join(ROOT, f"{name}.py")).read())
    calls = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        func = CALLED_AS.get((name, func), func)
        if func not in signatures:
            continue
        params = [p for p in signatures[func].parameters.values() if p.name != "self"]
        passed = {params[i].name: value for i, value in enumerate(node.args) if i < len(params)}
        passed.update({k.arg: k.value for k in node.keywords if k.arg})
        for parameter in params:
            flag = parameter.default is not inspect.Parameter.empty and flag_of(name, func, parameter.name, args)
            if not flag:
                continue
            calls += 1
            value = passed.get(parameter.name)
            assert value is not None, f"{name}.py calls {func} without {parameter.name} (--{flag})"
            assert ast.unparse(value) == f"args.{flag}", f"{name}.py passes {func}({parameter.name}=" \
                                                         f"{ast.unparse(value)}), not args.{flag}"
    assert calls or name == "fedavg", name  # fedavg.py's pieces take no flag-backed default
