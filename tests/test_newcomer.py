"""What a newcomer reads first holds: README's Set up (an environment, the Python tested, the CPU-only route), the
quick start writing under runs/ (ignored by git), README's flag table naming every flag the scripts share,
--stop-after shown in --help, a license to paste under and the references to cite, each paper in one place."""
import os
import re
import subprocess

import pytest

import common
from conftest import ROOT

README = open(os.path.join(ROOT, "README.md")).read()


def section(title):
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_set_up_has_an_environment_the_python_tested_and_a_cpu_only_route_ci_does_not_use():
    setup = section("Set up")
    assert "python3 -m venv" in setup and "pip install -r requirements.txt" in setup
    assert re.search(r"Python 3\.\d+", setup)
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    assert "download.pytorch.org" not in open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"cpu family \d+, model \d+", setup)  # timings name the machine they were measured on


def test_the_quick_start_writes_its_runs_and_plot_where_git_ignores_them():
    quick = section("Quick start (offline, under a minute on a laptop CPU)")
    outputs = re.findall(r"--plot (\S+)", quick)
    assert outputs and all(o.startswith("runs/") for o in outputs), outputs
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/curves.png"], cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0


def test_the_flag_table_names_every_flag_the_scripts_share_and_points_to_help_for_the_rest():
    table = section("Shared flags")
    shared = [a.option_strings[-1] for a in common.base_parser("x")._actions if a.option_strings != ["-h", "--help"]]
    missing = [flag for flag in shared if f"| `{flag}` |" not in table]
    assert not missing, f"README's flag table lacks {missing}"
    assert "--help" in table


def test_stop_after_is_shown_in_help():
    text = common.base_parser("x", script="fedavg").format_help()
    assert "--stop-after N" in text and "--resume" in text.split("--stop-after N", 2)[2]


def test_a_license_to_paste_under_and_every_paper_cited_in_one_place():
    license_text = open(os.path.join(ROOT, "LICENSE")).read()
    assert license_text.startswith("MIT License") and "Permission is hereby granted" in license_text
    citation = open(os.path.join(ROOT, "CITATION.cff")).read()
    assert "cff-version: 1.2.0" in citation and "license: MIT" in citation and "\ntitle: " in citation
    cite = section("License and citing")
    assert "[LICENSE](LICENSE)" in cite and "[CITATION.cff](CITATION.cff)" in cite
    titles = re.findall(r'^    title: "(.+)"$', citation, re.M)
    assert len(titles) == 6, titles  # the five algorithms' papers and FedProx's (the synthetic data)
    for title in titles:
        assert title in " ".join(cite.split()), f"README does not cite {title}"
    # each script names its paper; the full reference for it is here
    for script, name, key in [("fedavg.py", "FedAvg", "AISTATS"), ("fedala.py", "FedALA", "AAAI"),
                              ("pfedla.py", "pFedLA", "CVPR"), ("fedpake.py", "FedPake", "2408.11278"),
                              ("fedacd.py", "FedACD", "IJCAI")]:
        first_line = open(os.path.join(ROOT, script)).read().split("\n\n")[0]  # the docstring's first paragraph
        assert key in first_line and f"\n* {name}: " in cite and key in cite.split(f"\n* {name}: ")[1].split("\n")[0]


def test_citation_cff_is_valid_yaml_with_the_fields_github_reads():
    yaml = pytest.importorskip("yaml")
    citation = yaml.safe_load(open(os.path.join(ROOT, "CITATION.cff")))
    assert {"cff-version", "message", "title", "authors", "type"} <= set(citation)
    for reference in citation["references"]:
        assert reference["title"] and reference["authors"] and reference["year"]
