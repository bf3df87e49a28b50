"""Shared test helpers: the repository root on sys.path, running a script as a user would, and
reading what a run wrote."""
import csv
import importlib.util
import os
import re
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


BY_HAND = {"recheck": "--recheck-all", "flower_faults": "--flower-faults", "first_looks": "--first-looks"}  # marker: the option that selects it


def pytest_addoption(parser):
    parser.addoption("--recheck-all", action="store_true",
                     help="tests/test_results.py: re-run every committed run's first rounds, not only its sample "
                          "(run it before committing a run; about an hour on 2 cores)")
    parser.addoption("--first-looks", action="store_true",
                     help="tests/test_first_looks.py: run each algorithm doc's first look on Fashion-MNIST and hold "
                          "the lines it shows to what it prints (about 15 minutes on 2 cores)")
    parser.addoption("--flower-faults", action="store_true",
                     help="the Flower deployment's fault tests: a node killed mid-run, a failed run, the harness "
                          "that kills and restarts nodes (run them after a change to flower/ or tests/deploy.py; "
                          "about 5 minutes on 2 cores)")


# Files that start Flower (a SuperLink, SuperNodes, a Ray cluster or node workers): one pytest-xdist worker runs them
FLOWER_FILES = {"test_flower.py", "test_flower_deploy.py", "test_flower_deploy_faults.py", "test_flower_interrupt.py",
                "test_flower_resilience.py", "test_pfllib_folder.py", "test_first_hour.py"}


# Flower is an optional extra (requirements-flower.txt; the scripts need only requirements.txt): a test that needs it
# skips with this reason where it is not installed, by pytest.importorskip("flwr", reason=FLOWER_MISSING) or the
# mark ``needs_flower``. CI installs it (.ci/run sets CI=true): there, such a skip is a failure (below).
FLOWER_MISSING = "Flower is not installed (pip install -r requirements-flower.txt)"
needs_flower = pytest.mark.skipif(importlib.util.find_spec("flwr") is None, reason=FLOWER_MISSING)
# a skip for a Flower that is not there: the reason above, Flower's commands (tests/deploy.py's missing_tools), or
# pytest.importorskip("flwr")'s own message
SKIPPED_FOR_FLOWER = re.compile(r"Flower is not installed|Flower's commands|could not import 'flwr|"
                                r"No module named 'flwr")
ON_CI = os.environ.get("CI", "").lower() == "true"


def flower_skip_is_a_failure(report):
    """On CI (CI=true), a test or test file skipped for a Flower that is not installed is reported failed: CI
    installs requirements-flower.txt, so nothing of Flower's may go untested there unnoticed."""
    if ON_CI and report.skipped and isinstance(report.longrepr, tuple) \
            and SKIPPED_FOR_FLOWER.search(str(report.longrepr[2])):
        reason = report.longrepr[2]
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid}: {reason}, but CI installs requirements-flower.txt (CI=true): a Flower "
                           "test must run here, not skip")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    flower_skip_is_a_failure((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # a test file skipped as a whole (importorskip at its top)
    flower_skip_is_a_failure((yield).get_result())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """A test marked for a by-hand option (BY_HAND) is deselected unless the option is given. Under
    pytest-xdist (``-n 2 --dist loadgroup``, README) a file's tests share a worker, as its module fixtures
    want, and the files of FLOWER_FILES share one, so that no two Flower deployments run at once."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group("flower" if item.path.name in FLOWER_FILES else item.path.name))
    left_out = [marker for marker, option in BY_HAND.items() if not config.getoption(option)]
    kept, by_hand = [], []
    for item in items:
        (by_hand if any(item.get_closest_marker(marker) for marker in left_out) else kept).append(item)
    if by_hand:
        config.hook.pytest_deselected(items=by_hand)
        items[:] = kept


def run_script(script, *args, timeout=120, env=None):
    """Run ``python <script> <args>`` from the repository root; returns the CompletedProcess."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", **(env or {})})


def sighup_as_in_a_terminal():
    """``preexec_fn`` for a child that a test sends SIGHUP: its default disposition, as in a terminal's
    session, whatever this process inherited (under ``nohup`` SIGHUP is ignored, and an ignored SIGHUP
    stays ignored in the scripts)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def run_in_process(script, *args):
    """``python <script> <args>`` in this process (no interpreter start-up) on one torch thread,
    as ``run_script`` runs it, so that metrics equal a subprocess's bit for bit; returns the
    exit status."""
    import importlib

    import torch

    import run_folder
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_folder.run_main(importlib.import_module(script.removesuffix(".py").replace("/", ".")).main, [*map(str, args)])
        return 0
    except SystemExit as e:
        return e.code
    finally:
        torch.set_num_threads(threads)


def run_dir(out):
    """The single run folder created under ``out``."""
    (name,) = [d for d in os.listdir(out) if not d.startswith(".")]
    return os.path.join(out, name)


def metrics_rows(folder):
    """The rows of a run folder's metrics.csv, as dicts of strings."""
    with open(os.path.join(folder, "metrics.csv")) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test, as ``run_in_process``: tiny models run faster, and
    a run in this process equals a subprocess's bit for bit."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def script():
    return run_script


@pytest.fixture
def fabricated_publishers_files(monkeypatch):
    """For tests that fabricate the publishers' files (MNIST's idx, CIFAR's pickles) in miniature: their
    content is not the publishers', which data_formats.check_known_content refuses, so the table of the real
    content is emptied for the test (in this process only; tests/test_known_content.py tests the check)."""
    import data_formats
    monkeypatch.setattr(data_formats, "KNOWN_CONTENT", {})


def layer_state_keys(model):
    """For each layer (common.layers), the state_dict keys of its own parameters and buffers (weight and
    bias move together; BatchNorm's running statistics travel with their layer)."""
    import common
    out = []
    for name, m in common.layers(model):
        prefix = f"{name}." if name else ""
        own = [k for k, _ in m.named_parameters(recurse=False)] + [k for k, _ in m.named_buffers(recurse=False)]
        out.append([prefix + k for k in own])
    return out
