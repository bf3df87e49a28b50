"""Every report command in docs/results.md and README.md prints the table pasted beside it.

Each `python tools/reproduce.py ... --report` line of a fenced block is run on a copy of the committed
runs in results/ (its `--out results` pointed at the copy, since a report also writes TABLE.md and the
curves); the markdown table it prints must stand in the document after the command, row for row. And
every report table pasted in "Measured here" comes from one of those commands, so no pasted table is
left without the command that makes it. A report reads metrics.csv and config.json only: no dataset
is needed (PFLlib's folders included)."""
import os
import re
import shlex
import shutil

import pytest

from conftest import ROOT
from tools import reproduce

DOCS = [os.path.join(ROOT, "docs", "results.md"), os.path.join(ROOT, "README.md")]
HEADER = "| cell | method | paper | ours |"


def report_commands(path):
    """(line number, argv after tools/reproduce.py) of each --report command in a fenced block."""
    found, fenced = [], False
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                fenced = not fenced
            elif fenced and "tools/reproduce.py" in line and "--report" in line:
                argv = shlex.split(line.split("#", 1)[0])
                found.append((number, argv[argv.index("tools/reproduce.py") + 1:]))
    return found


def tables_after(path, number):
    """Each markdown table that starts with the report's header after line ``number``, as its lines."""
    with open(path) as f:
        lines = [line.rstrip("\n") for line in f][number:]
    tables, current = [], None
    for line in lines:
        if line.startswith(HEADER):
            current = [line]
            tables.append(current)
        elif current is not None and line.startswith("|"):
            current.append(line)
        else:
            current = None
    return tables


def of_the_committed_runs(argv):
    """A report of results/ (the committed runs); one without --out reports the reader's own runs/reproduce/."""
    return "--out" in argv and argv[argv.index("--out") + 1] in ("results", "results/")


COMMANDS = [(os.path.basename(path), number, argv) for path in DOCS for number, argv in report_commands(path)
            if of_the_committed_runs(argv)]


@pytest.fixture(scope="module")
def results_copy(tmp_path_factory):
    copy = tmp_path_factory.mktemp("doc-reports") / "results"
    shutil.copytree(os.path.join(ROOT, "results"), copy)
    return str(copy)


def printed_table(argv, results_copy, capsys, monkeypatch):
    argv = [results_copy if argv[i - 1] == "--out" else a for i, a in enumerate(argv)]
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]


def test_the_documents_have_report_commands():
    assert len(COMMANDS) >= 5, COMMANDS


@pytest.mark.parametrize("doc, number, argv", COMMANDS, ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_a_report_command_prints_the_table_pasted_after_it(doc, number, argv, results_copy, capsys, monkeypatch):
    printed = printed_table(argv, results_copy, capsys, monkeypatch)
    assert printed and printed[0].startswith(HEADER)
    path = os.path.join(ROOT, "docs", doc) if doc != "README.md" else os.path.join(ROOT, doc)
    pasted = tables_after(path, number)
    assert printed in pasted, (f"{doc}:{number}: `{shlex.join(argv)}` prints a table that is not pasted after it:\n"
                               + "\n".join(printed))


def test_every_pasted_report_table_has_its_command(results_copy, capsys, monkeypatch):
    path = DOCS[0]
    with open(path) as f:
        text = f.read()
    measured = text.split("## Measured here", 1)[1].split("\n## ", 1)[0]
    first_line = text[:text.index("## Measured here")].count("\n")
    pasted = tables_after(path, first_line)
    pasted = [t for t in pasted if "\n".join(t) in measured]
    printed = [printed_table(argv, results_copy, capsys, monkeypatch)
               for doc, _, argv in COMMANDS if doc == "results.md"]
    orphans = [t[2] for t in pasted if t not in printed]
    assert not orphans, f"tables in docs/results.md that no report command prints (first rows): {orphans}"


def test_the_table_check_fails_on_a_changed_number(tmp_path):
    """The comparison is row for row: one digit changed in a pasted row is found."""
    doc = tmp_path / "doc.md"
    doc.write_text(f"```bash\npython tools/reproduce.py synthetic --out results --report\n```\n\n{HEADER} x |\n"
                   "|---|\n| synthetic-1-1 | FedAvg | 87.76 |\n")
    (number, argv), = report_commands(str(doc))
    assert argv == ["synthetic", "--out", "results", "--report"]
    assert tables_after(str(doc), number) == [[f"{HEADER} x |", "|---|", "| synthetic-1-1 | FedAvg | 87.76 |"]]
    assert [f"{HEADER} x |", "|---|", "| synthetic-1-1 | FedAvg | 87.75 |"] not in tables_after(str(doc), number)
    assert re.search("87.76", doc.read_text())


# README's "On real data" table: its first column names the paper table and cell a report prints
README_TABLES = {"pFedLA Table 1": ("pfedla-t1", "fmnist"), "pFedLA Table 2": ("pfedla-t2", "fmnist"),
                 "PFLlib leaderboard, Dir(0.1)": ("pfllib-fmnist", "dir"),
                 "PFLlib leaderboard, pathological": ("pfllib-fmnist", "pat"),
                 "pFedLA Table 1, another reading": ("pfedla-fmnist-sensitivity", "t1-fedavg-local-models"),
                 "pFedLA Table 2, another reading": ("pfedla-fmnist-sensitivity", "t2-fedavg-local-models")}
README_SEEDS = {"pfedla-fmnist-sensitivity": ["--seeds", "0"]}  # a table's seeds, where fewer than the default 0 1 2
SUMMARIES = ["README.md", os.path.join("docs", "results.md")]  # README's "On real data", results.md's summary


def readme_real_data_rows(doc="README.md"):
    """(paper table, cell, method, ours, n) of each row of README's "On real data" table (or results.md's summary)."""
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    block = "| table, Fashion-MNIST |" + text.split("\n| table, Fashion-MNIST |", 1)[1].split("\n\n", 1)[0]
    rows, where = [], None
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0]:
            where = README_TABLES[max((k for k in README_TABLES if cells[0].startswith(k)), key=len)]
        rows.append((*where, cells[1], cells[2], cells[3]))
    return rows


@pytest.mark.parametrize("doc", SUMMARIES)
def test_readme_s_real_data_numbers_are_the_reports(doc, results_copy, capsys, monkeypatch):
    rows = readme_real_data_rows(doc)
    assert len(rows) >= 6
    printed = {}
    for table in sorted({r[0] for r in rows}):
        argv = [table, *README_SEEDS.get(table, []), "--out", "results", "--report"]
        for line in printed_table(argv, results_copy, capsys, monkeypatch)[2:]:
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            printed[(table, cells[0], cells[1])] = (cells[3], cells[4])
    assert [(t, c, m, printed.get((t, c, m))) for t, c, m, _, _ in rows] == \
        [(t, c, m, (ours, n)) for t, c, m, ours, n in rows]
