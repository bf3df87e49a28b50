"""Statements of the docs held to the programs (issue 87, item 3): what `tools/reproduce.py --list` prints, what a
Flower run leaves for --resume, and the test suite's time given in one place (README), the other docs pointing
there."""
import os
import re

from conftest import ROOT
from tools import paper_tables, reproduce

DOCS = ["README.md", *sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                             if n.endswith(".md"))]


def read(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def test_readme_s_list_line_says_what_list_prints(capsys):
    (line,) = [line for line in read("README.md").splitlines() if "tools/reproduce.py --list" in line]
    said = line.split("#", 1)[1]
    assert "cells and methods" in said and "--dry-run" in said
    assert reproduce.main(["--list"]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert {line.split(":", 1)[0] for line in out if not line.startswith(" ")} >= set(paper_tables.TABLES)
    assert not any("python " in line for line in out)  # names, not commands: those are --dry-run's
    assert reproduce.main(["synthetic", "--dry-run"]) in (0, None)
    dry = capsys.readouterr().out
    assert "python fedavg.py " in dry


def test_running_md_says_flower_runs_checkpoint_and_resume_as_flower_md_and_the_tests_do():
    text = " ".join(read(os.path.join("docs", "running.md")).split())
    assert "Flower runs (`flower/app.py`) write no checkpoint" not in text
    assert "Flower runs (`flower/app.py`) write the script's checkpoint.pt too and continue with `python " \
           "flower/app.py --resume RUN_DIR" in text
    assert "python flower/app.py --resume" in read(os.path.join("docs", "flower.md"))
    resilience = read(os.path.join("tests", "test_flower_resilience.py"))
    assert "def test_a_stopped_server_resumes_to_the_uninterrupted_metrics(" in resilience
    assert "run.checkpoint(round_, state, rng)" in read("flower/app.py")  # the script's Run writes it


DURATION = re.compile(r"\b\d+(?:[.,]\d+)?(?:-\d+)?\s*(?:s|sec|seconds|min|minutes)\b|\b\d+ min \d+ s\b")


def test_the_suite_s_time_is_stated_in_readme_alone():
    """A line that names the test suite's command or the suite and a duration stands in README only; others point."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(read(doc).splitlines(), 1):
            suite = re.search(r"python -m pytest -q(?: -n \d+)?\s*(?:`|\)|$|#)|\bthe (?:whole |test )?suite\b", line)
            if suite and DURATION.search(line):
                found.append((doc, number, line.strip()))
    assert [doc for doc, *_ in found] == ["README.md"], found
    assert "README" in read(os.path.join("docs", "running.md")).split("python -m pytest -q -n 2", 1)[1].split("\n")[0]


def test_readme_says_help_waits_for_torch_as_it_does():
    """README: `python SCRIPT --help` prints once torch has loaded (the parser is built by common.py). Should --help
    come to print before torch loads, README's sentence and its measured seconds must change with it."""
    import subprocess
    import sys
    assert "it prints once torch has loaded" in " ".join(read("README.md").split())
    probe = ("import runpy, sys\nsys.argv = ['fedavg.py', '--help']\ntry:\n    runpy.run_path('fedavg.py', "
             "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('torch loaded:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "--rounds" in out and out.rstrip().endswith("torch loaded: True"), out[-300:]
