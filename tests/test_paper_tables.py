"""tools/paper_tables.py: the schema of every table, the same settings for a baseline as for its algorithm (by
parsing each run's command line with the script's own parse_args; nothing is trained or loaded), and the
paper numbers quoted in docs/<algo>.md present in the tables."""
import importlib
import math
import os
import re

import pytest

import common
from tools import paper_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = paper_tables.TABLES
SOURCES = {"fedala": "fedala.py", "pfedla": "pfedla.py", "fedpake": "fedpake.py", "fedacd": "fedacd.py",
           "synthetic": None}
SUMMARIES = {"best", "final", "last10"}
# The metrics.csv header of each script (mb_total: mb_down + mb_up, computed by the runner); global_acc and
# global_loss only under --test-split global.
COMMON_COLUMNS = {"round", "test_acc", "test_acc_mean", "test_acc_std", "test_loss", "train_loss", "seconds",
                  "sec_per_round", "mb_down", "mb_up", "host_mb", "mb_total"}
COLUMNS = {"fedavg.py": COMMON_COLUMNS,
           "fedala.py": COMMON_COLUMNS | {"ala_epochs", "global_model_acc"},
           "pfedla.py": COMMON_COLUMNS | {"self_weight"},
           "fedpake.py": COMMON_COLUMNS | {"high_fraction", "macro_classes", "agg_seconds"},
           "fedacd.py": COMMON_COLUMNS | {"local_kl", "score_min", "score_max"},
           # the programs of tools/ that run a script's other modes (--eval-local-models; --log-risk)
           paper_tables.FEDAVG_VARS: COMMON_COLUMNS | {"local_model_acc", "local_model_acc_mean", "local_model_acc_std",
                                                       "local_model_loss"},
           paper_tables.FEDACD_DIAG: COMMON_COLUMNS | {"local_kl", "score_min", "score_max", "local_risk"}}
SCRIPT_OF = {paper_tables.FEDAVG_VARS: "fedavg.py", paper_tables.FEDACD_DIAG: "fedacd.py"}  # the algorithm they run
GLOBAL_COLUMNS = {"global_acc", "global_loss"}
# The settings every run of a cell must share with the cell's algorithm (argparse dests).
SHARED = ["dataset", "partition", "beta", "classes_per_client", "balance", "num_clients", "join_ratio", "rounds",
          "local_epochs", "batch_size", "lr", "momentum", "weight_decay", "model", "test_split", "train_ratio",
          "eval_every", "samples_per_client", "seed"]
PARTITION = {"partition", "beta", "classes_per_client", "balance", "samples_per_client"}
# Flags that common + cell flags must state explicitly in a paper table (not left to a script's default).
EXPLICIT = ["--dataset", "--num-clients", "--join-ratio", "--local-epochs", "--batch-size", "--lr", "--momentum",
            "--weight-decay", "--model", "--test-split", "--eval-every"]
ID = re.compile(r"^[a-z0-9-]+$")
CELL_ID = re.compile(r"^[a-z0-9.-]+$")


def runs():
    """(table id, table, cell, method, argv) for every run."""
    for tid, table in TABLES.items():
        for cell in table["cells"]:
            for method in cell["methods"]:
                argv = [*table["common"], *cell["flags"], *method["flags"], "--rounds", str(table["rounds"])]
                yield tid, table, cell, method, argv


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def flag_value(argv, flag):
    """The value argparse would take for ``flag`` (the last occurrence), or None."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else None


# ----------------------------------------------------------------------------------------------- schema

def test_table_ids_and_keys():
    assert isinstance(TABLES, dict) and TABLES
    assert "synthetic" in TABLES and "synthetic-sweep" in TABLES
    for tid, table in TABLES.items():
        assert ID.match(tid), tid
        assert set(table) == {"title", "source", "metric", "rounds", "common", "cells"}, tid
        assert isinstance(table["title"], str) and table["title"], tid
        assert table["source"] in SOURCES, tid
        assert isinstance(table["rounds"], int) and not isinstance(table["rounds"], bool) and table["rounds"] > 0
        assert isinstance(table["common"], list) and all(isinstance(f, str) for f in table["common"]), tid
        assert isinstance(table["cells"], list) and table["cells"], tid


def check_metric(metric, where):
    assert isinstance(metric, dict) and {"summary", "column", "protocol"} <= set(metric), where
    assert set(metric) - {"summary", "column", "protocol"} <= {"compare"}, where
    assert metric.get("compare", "ratio to the first method") == "ratio to the first method", where
    assert metric["summary"] in SUMMARIES, where
    assert isinstance(metric["column"], str) and metric["column"], where
    assert isinstance(metric["protocol"], str) and len(metric["protocol"]) > 20, where


def test_cells_and_methods():
    for tid, table in TABLES.items():
        check_metric(table["metric"], tid)
        names = [c["name"] for c in table["cells"]]
        assert len(names) == len(set(names)), tid
        for cell in table["cells"]:
            where = f"{tid}/{cell.get('name')}"
            assert set(cell) == {"name", "flags", "methods"}, where
            assert CELL_ID.match(cell["name"]), where
            assert isinstance(cell["flags"], list) and all(isinstance(f, str) for f in cell["flags"]), where
            assert isinstance(cell["methods"], list) and cell["methods"], where
            methods = [m["method"] for m in cell["methods"]]
            assert len(methods) == len(set(methods)), where
            for m in cell["methods"]:
                w = f"{where}/{m.get('method')}"
                assert {"method", "script", "flags", "paper"} <= set(m), w
                assert set(m) <= {"method", "script", "flags", "paper", "paper_std", "metric"}, w
                assert isinstance(m["method"], str) and m["method"], w
                assert m["script"] in COLUMNS and os.path.isfile(os.path.join(ROOT, m["script"])), w
                assert isinstance(m["flags"], list) and all(isinstance(f, str) for f in m["flags"]), w
                assert m["paper"] is None or is_number(m["paper"]), w
                if "paper_std" in m:
                    assert m["paper"] is not None and is_number(m["paper_std"]) and m["paper_std"] >= 0, w
                if "metric" in m:
                    check_metric(m["metric"], w)
                if table["source"] == "synthetic":
                    assert m["paper"] is None and "paper_std" not in m, w


def test_rounds_come_from_the_table_only():
    for tid, table, cell, method, argv in runs():
        assert "--rounds" not in table["common"] + cell["flags"] + method["flags"], (tid, cell["name"])


def test_every_paper_cell_has_its_algorithm_and_a_number():
    for tid, table in TABLES.items():
        if table["source"] == "synthetic":
            continue
        # a sensitivity table of ours may hold cells that re-read a baseline row alone (e.g. FedAvg's
        # evaluated model); the table as a whole still runs the paper's algorithm
        sensitivity = table["title"].startswith("Sensitivity (ours")
        assert SOURCES[table["source"]] in [SCRIPT_OF.get(m["script"], m["script"]) for c in table["cells"]
                                            for m in c["methods"]], tid
        for cell in table["cells"]:
            scripts = [SCRIPT_OF.get(m["script"], m["script"]) for m in cell["methods"]]
            assert sensitivity or SOURCES[table["source"]] in scripts, (tid, cell["name"])
            assert any(m["paper"] is not None for m in cell["methods"]), (tid, cell["name"])


def written_columns(script, argv):
    """The columns a run of ``script`` with ``argv`` writes: tools/fedacd_diagnostics.py's only where asked for
    (local_risk: --log-risk; --fedavg's local_kl and scores: --log-kl)."""
    columns = COLUMNS[script]
    if flag_value(argv, "--test-split") == "global":
        columns = columns | GLOBAL_COLUMNS
    if script == paper_tables.FEDACD_DIAG:
        if "--log-risk" not in argv:
            columns = columns - {"local_risk"}
        if "--fedavg" in argv and "--log-kl" not in argv:
            columns = columns - {"local_kl", "score_min", "score_max"}
    return columns


def test_metric_columns_are_written_by_the_scripts():
    for tid, table, cell, method, argv in runs():
        column = method.get("metric", table["metric"])["column"]
        assert column in written_columns(method["script"], argv), (tid, cell["name"], method["method"], column)


def test_fedacd_diagnostics_are_asked_for_by_the_cells_that_quote_them_only():
    """Table 3's local_risk and Table 9's --fedavg local_kl cost passes over data: only their cells ask."""
    for tid, table, cell, method, argv in runs():
        if SCRIPT_OF.get(method["script"], method["script"]) == "fedacd.py":
            column = method.get("metric", table["metric"])["column"]
            assert ("--log-risk" in argv) == (column == "local_risk"), (tid, cell["name"], method["method"])
            assert "--log-kl" not in argv or column == "local_kl", (tid, cell["name"], method["method"])
    assert "local_risk" not in written_columns(paper_tables.FEDACD_DIAG, ["--test-split", "global"])
    assert "local_kl" not in written_columns(paper_tables.FEDACD_DIAG, ["--fedavg"])


def test_left_out_entries():
    assert isinstance(paper_tables.LEFT_OUT, list)
    for entry in paper_tables.LEFT_OUT:
        assert {"table", "cell", "method", "paper", "why"} <= set(entry) <= {"table", "cell", "method", "paper",
                                                                           "paper_std", "why"}, entry
        assert entry["table"] in TABLES or entry["table"] in paper_tables.NOT_RUN_TABLES, entry
        assert is_number(entry["paper"]) and entry["why"], entry
        assert CELL_ID.match(entry["cell"]), entry
        assert "paper_std" not in entry or is_number(entry["paper_std"]), entry


# ------------------------------------------------------------------------- same settings for every method

def parse(script, argv):
    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    try:
        return module.parse_args(argv)
    except SystemExit as e:  # argparse refused a flag: report the command rather than a bare exit
        pytest.fail(f"{script} {' '.join(argv)}: parse_args exited with {e.code}")


@pytest.mark.parametrize("tid", list(TABLES))
def test_every_method_of_a_cell_runs_with_the_algorithms_settings(tid):
    table = TABLES[tid]
    algorithm = SOURCES[table["source"]]
    for cell in table["cells"]:
        parsed = [(m, parse(m["script"], [*table["common"], *cell["flags"], *m["flags"],
                                          "--rounds", str(table["rounds"])])) for m in cell["methods"]]
        # the reference: the cell's algorithm (the first method of the source's script), else the first method
        ref_method, ref = next(((m, a) for m, a in parsed if SCRIPT_OF.get(m["script"], m["script"]) == algorithm),
                               parsed[0])
        assert ref.rounds == table["rounds"]
        # synthetic data is generated per client: the partition settings do not apply to it; nor the split to a
        # PFLlib dataset folder's clients (where it exists, every script takes them as they are: --test-split client)
        ignored = PARTITION if common.synthetic_setting(ref.dataset) is not None else set()
        if ref.dataset.startswith("{data_dir}/"):
            ignored = PARTITION | {"test_split", "train_ratio"}
        for m, args in parsed:
            for dest in set(SHARED) - ignored:
                if hasattr(ref, dest) or hasattr(args, dest):
                    assert getattr(args, dest, None) == getattr(ref, dest, None), \
                        (tid, cell["name"], m["method"], ref_method["method"], dest)


def test_paper_tables_state_their_settings_explicitly():
    for tid, table in TABLES.items():
        if table["source"] == "synthetic":
            continue
        for cell in table["cells"]:
            given = table["common"] + cell["flags"]
            # a PFLlib dataset folder under --data-dir (tools/reproduce.py) is split already: its scripts refuse
            # the flags that partition or split, so the cell states none of them
            folder = (flag_value(given, "--dataset") or "").startswith("{data_dir}/")
            if folder:
                resplit = {"--partition", "--beta", "--classes-per-client", "--balance", "--samples-per-client",
                           "--dominant-share", "--train-ratio", "--test-split"}
                stated = set(given) | {f for method in cell["methods"] for f in method["flags"]}
                assert not resplit & stated, (tid, cell["name"], resplit & stated)
            missing = [f for f in EXPLICIT if f not in given and not (folder and f == "--test-split")]
            if common.synthetic_setting(flag_value(given, "--dataset")) is None and not folder:
                missing += [f for f in ("--partition",) if f not in given]
            assert not missing, (tid, cell["name"], missing)
            if flag_value(given, "--partition") == "dir":
                assert "--beta" in given, (tid, cell["name"])


def test_the_synthetic_tables_share_one_setting():
    assert TABLES["synthetic"]["common"] == TABLES["synthetic-sweep"]["common"]
    assert TABLES["synthetic"]["rounds"] == TABLES["synthetic-sweep"]["rounds"] == 300
    scripts = {m["script"] for c in TABLES["synthetic"]["cells"] for m in c["methods"]}
    assert scripts == set(COLUMNS) - set(SCRIPT_OF)


# ------------------------------------------------------------------------------ paper numbers in the docs

def doc_paper_numbers(path):
    """Decimal numbers in the table rows of a doc's paper-number section(s): after a line that says "paper
    numbers" or "paper's numbers", the first markdown table (or, under such a heading, every table up to the
    next heading). Code spans and the first column (the setting or command) are dropped."""
    lines = open(path).read().splitlines()
    numbers = []
    for i, line in enumerate(lines):
        if not re.search(r"paper(?:'s)? numbers", line, re.IGNORECASE):
            continue
        heading = line.startswith("#")
        seen_table = False
        for row in lines[i + 1:]:
            if heading and row.startswith("#"):
                break
            if not row.startswith("|"):
                if seen_table and not heading:
                    break
                continue
            seen_table = True
            if re.match(r"^\|[\s|:-]+\|$", row):  # the separator row
                continue
            columns = re.sub(r"`[^`]*`", "", row).strip().strip("|").split("|")[1:]
            numbers += [float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", "|".join(columns))]
    return numbers


def source_of(table_id):
    return TABLES[table_id]["source"] if table_id in TABLES else paper_tables.NOT_RUN_TABLES[table_id][0]


def paper_values(source):
    values = [v for t in TABLES.values() if t["source"] == source for c in t["cells"] for m in c["methods"]
              for v in (m["paper"], m.get("paper_std")) if v is not None]
    values += [v for e in paper_tables.LEFT_OUT if source_of(e["table"]) == source
               for v in (e["paper"], e.get("paper_std")) if v is not None]
    return values


@pytest.mark.parametrize("source", ["fedala", "pfedla", "fedpake", "fedacd"])
def test_paper_numbers_quoted_in_the_docs_are_in_the_tables(source):
    numbers = doc_paper_numbers(os.path.join(ROOT, "docs", f"{source}.md"))
    assert len(numbers) >= 9, f"docs/{source}.md: no paper-number table found"
    values = paper_values(source)
    missing = sorted({n for n in numbers if not any(abs(n - v) < 1e-9 for v in values)})
    assert not missing, f"docs/{source}.md quotes paper numbers that tools/paper_tables.py lacks: {missing}"


def test_fedpake_time_table_is_the_papers_minutes_in_seconds_compared_by_ratio():
    """Appendix Table 6: 0.246 / 0.249 / 0.248 min per iteration (FedAvg, FedALA, FedPake), x 60; the same
    runs as Table 1's CIFAR-10 Dir(0.1) cell, compared by the ratio to FedAvg (hardware differs)."""
    table = TABLES["fedpake-t6"]
    (cell,) = table["cells"]
    assert [(m["method"], m["paper"]) for m in cell["methods"]] == \
        [("FedAvg", round(0.246 * 60, 2)), ("FedALA", round(0.249 * 60, 2)), ("FedPake", round(0.248 * 60, 2))]
    assert table["metric"]["column"] == "sec_per_round" and table["metric"]["compare"] == "ratio to the first method"
    same = next(c for c in TABLES["fedpake-t1"]["cells"] if c["name"] == "cifar10-dir0.1")
    assert cell["flags"] == same["flags"] and table["common"] == TABLES["fedpake-t1"]["common"]
