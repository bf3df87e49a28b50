"""Every value read from a run's files and written into a table row or a one-line message goes through one escaping
(tools/compare.py's one_line): a newline, a pipe and a backslash in each column of tools/reproduce.py's report,
its paper-tables section and tools/compare.py's table leave every row one line with its cells, and the reader sees
the value itself (markdown shows a doubled backslash as one and '\\|' as '|'). Also the report tools' damaged
inputs: a run file nested too deeply, a paper-tables target that is not UTF-8. Fabricated inputs only."""
import json
import os
import re

import pytest

from tools import compare, reproduce

VALUE = "x\n|y\\|z\\"  # a newline, a pipe, a backslash before a pipe and one at the end
SHOWN = "x\\n|y\\|z\\"  # what a reader must see: the newline escaped, every other character as it is


def gfm_cells(line):
    """A markdown table row's cells as GitHub's markdown reads them: split at each '|' without a backslash
    before it, then each cell's backslash escapes of punctuation undone (what a reader sees)."""
    assert line.startswith("| ") and line.endswith(" |"), line
    cells = re.split(r"(?<!\\)\|", line[1:-1])
    return [re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", c.strip()) for c in cells]


def test_the_escaping_itself():
    assert compare.one_line(VALUE) == SHOWN
    assert compare.one_line(VALUE, markdown=True) == "x\\n\\|y\\\\\\|z\\\\"
    assert gfm_cells("| " + compare.one_line(VALUE, markdown=True) + " |") == [SHOWN]
    assert compare.one_line("a\r\x00\x1b") == "a\\r\\x00\\x1b"


def test_each_column_of_the_report_keeps_its_row_and_shows_the_value():
    table = {"metric": {"summary": "best", "column": "test_acc", "protocol": "p"}, "rounds": 2}
    method = {"method": "M" + VALUE, "script": "fedavg.py", "paper": 50.0,
              "metric": {"summary": "best", "column": "acc" + VALUE}}
    cell = {"name": "cell" + VALUE, "methods": [method]}
    seeds = [{"seed": s, "value": v, "done": 1, "state": "unfinished", "sec_per_round": 1.0,
              "hardware": "cpu" + VALUE, "problem": None, "left_out": ["run" + VALUE]} for s, v in ((0, 1.0), (1, 1.1))]
    seeds.append({"seed": 2, "value": None, "done": 1, "state": "unfinished", "sec_per_round": None,
                  "hardware": "cpu" + VALUE, "problem": "damaged: config.json has " + VALUE, "left_out": []})
    row = {"jobs": [{"seed": s} for s in range(4)], "seeds": seeds}
    line = reproduce.report_row(table, cell, method, row, 2, others=[("other" + VALUE, [50.0, 50.1])])
    assert "\n" not in line
    cells = gfm_cells(line)
    assert len(cells) == 11, cells  # cell, method, paper, ours, n, ours vs paper, apart, rounds, s/round, hardware, notes
    assert cells[0] == "cell" + SHOWN and cells[1] == "M" + SHOWN and cells[6] == "below other" + SHOWN
    assert cells[9] == "cpu" + SHOWN
    for words in ("metric: best acc" + SHOWN, "seed 2: damaged: config.json has " + SHOWN,
                  "seed 0: left out run" + SHOWN):
        assert words in cells[10], cells[10]


def test_each_column_of_the_paper_tables_section_keeps_its_row():
    tables = {"t": {"title": "T", "rounds": 2, "metric": {"summary": "best", "column": "test_acc", "protocol": "p"},
                    "cells": [{"name": "c" + VALUE, "methods": [
                        {"method": "M" + VALUE, "script": "fedavg.py", "paper": 1.0,
                         "metric": {"summary": "best", "column": "a" + VALUE}}]}]}}
    rows = [ln for ln in reproduce.paper_tables_markdown(tables).splitlines() if ln.startswith("| cx")]
    assert len(rows) == 1
    cells = gfm_cells(rows[0])
    assert len(cells) == 4 and cells[0] == "c" + SHOWN and cells[1] == "M" + SHOWN
    assert cells[2] == "1.00 (best a" + SHOWN + ")"


def test_each_column_of_compare_s_table_keeps_its_row(tmp_path, capsys):
    args = {"dataset": "synthetic", "partition": "dir", "num_clients": 4, "rounds": 2, "seed": 0, "lr": 0.1}
    column = "acc|y\\|z\\"  # metrics.csv is read line by line: its header holds no newline
    for name, algo, lr in (("a", "fed" + VALUE, "lr" + VALUE), ("b", "fed" + VALUE, 0.2)):
        folder = tmp_path / name
        os.makedirs(folder)
        (folder / "config.json").write_text(json.dumps({"algorithm": algo, "args": {**args, "lr": lr}}))
        with open(folder / "metrics.csv", "w", newline="") as f:
            import csv
            writer = csv.writer(f)
            writer.writerow(["round", column, "seconds", "mb_down", "mb_up"])
            writer.writerows([[1, 10.0, 1.0, 1.0, 1.0], [2, 20.0, 2.0, 2.0, 2.0]])
    compare.main([str(tmp_path), "--metric", column])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4, out  # header, rule, one line per run
    for line in out[2:]:
        assert line.startswith("fed" + SHOWN) and " " + column + " " in line
    assert any("lr=lr" + SHOWN in line for line in out[2:])


def test_a_run_file_nested_too_deeply_is_a_damaged_run_not_a_traceback(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.csv").write_text("round,test_acc,seconds,mb_down,mb_up\n1,10,1,1,1\n")
    deep = "[" * 100000 + "]" * 100000
    for name in ("config.json", "summary.json"):
        (folder / name).write_text('{"args": ' + deep + "}")
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "unreadable config.json" in out[2] and "damaged: summary.json" in out[2], out


def test_markdown_paper_tables_into_a_file_that_is_not_utf8_is_one_line_and_leaves_it(tmp_path, capsys):
    doc = tmp_path / "results.md"
    doc.write_bytes(b"x\xff\n")
    try:
        reproduce.main(["--markdown-paper-tables", str(doc)])
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {doc} is not UTF-8 text (damaged?): it was not changed\n"
    assert doc.read_bytes() == b"x\xff\n"


# ----------------------------------------------------------------------------- issue 89: every recorded field

FORGED = "x\n| forged | row |\x1b\x00"  # a newline, pipes and control characters


def _fields(config=None, args=None, summary=None, other=None):
    """What one run's files hold besides the usual; ``other``: the other run's (its _fields), where it must share
    the data's kind for the field to be shown."""
    return {"config": config or {}, "args": args or {}, "summary": summary or {}, "other": other}


RECORDED = [  # (the field forged in one run's files, what is set; every one is shown in its row)
    ("algorithm", _fields(config={"algorithm": FORGED})),
    ("args.dataset", _fields(args={"dataset": FORGED})),
    ("args.partition", _fields(args={"partition": FORGED})),
    ("args.beta", _fields(args={"beta": FORGED})),
    ("args.num_clients", _fields(args={"num_clients": FORGED})),
    ("args.seed", _fields(args={"seed": FORGED})),
    ("args.rounds", _fields(args={"rounds": FORGED})),
    ("args.lr", _fields(args={"lr": FORGED})),
    ("a flag of its own", _fields(args={"model": FORGED})),
    ("dataset_folder", _fields(config={"dataset_folder": {"partition": FORGED, "alpha": FORGED}},
                               args={"dataset": "/data/FashionMNIST-dir"})),
    ("data_sha256", _fields(config={"data_sha256": FORGED, "dataset_folder": {}},
                            args={"dataset": "/data/FashionMNIST-dir"},
                            other=_fields(config={"data_sha256": "a" * 64, "dataset_folder": {}},
                                          args={"dataset": "/data/FashionMNIST-dir"}))),
    ("summary.json status", _fields(summary={"status": FORGED})),
    ("summary.json algorithm", _fields(summary={"algorithm": FORGED})),
    ("summary.json rounds_done", _fields(summary={"rounds_done": FORGED})),
    ("summary.json a metric's name", _fields(summary={FORGED: {"best": "-", "final": 1, "last10_mean": 1}})),
]


def _compare_run(folder, lr, forged):
    os.makedirs(folder)
    args = {"dataset": "mnist", "partition": "dir", "beta": 0.1, "num_clients": 4, "rounds": 2, "seed": 0, "lr": lr,
            **forged["args"]}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"algorithm": "fedavg", "args": args, **forged["config"]}, f)
    with open(os.path.join(folder, "metrics.csv"), "w") as f:
        f.write("round,test_acc,seconds,mb_down,mb_up\n1,10.0,1.0,1.0,1.0\n2,20.0,2.0,2.0,2.0\n")
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"algorithm": "fedavg", "rounds": 2, "rounds_done": 2, "headline_metric": "test_acc",
                   **forged["summary"]}, f)


@pytest.mark.parametrize("field, forged", RECORDED, ids=[c[0] for c in RECORDED])
def test_a_newline_pipe_or_control_character_in_any_recorded_field_keeps_compare_s_rows(field, forged, tmp_path,
                                                                                       capsys):
    """Two runs of other settings: two rows, whatever one of them recorded in any field its row shows, which is
    there escaped once (compare.one_line)."""
    _compare_run(tmp_path / "a", 0.1, forged)
    _compare_run(tmp_path / "b", 0.2, forged["other"] or _fields())
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 4, out  # header, rule, one row per run
    assert not any(c in out for c in "\x1b\x00")
    assert "x\\n| forged" in out, out


def test_an_older_run_s_folder_name_keeps_compare_s_rows(tmp_path, capsys):
    """A run without config.json: its algorithm is what its folder's name says, a newline and all."""
    _compare_run(tmp_path / "b", 0.2, _fields())
    older = tmp_path / "fed\n| forged |\x1b-mnist-s0-20260101-000000"
    os.makedirs(older)
    (older / "metrics.csv").write_text("round,test_acc\n1,10.0\n")
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 4 and "\x1b" not in out and "fed\\n| forged |\\x1b" in out, out
