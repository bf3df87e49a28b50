"""The code that README.md and docs/*.md name exists: every `module.name` of ours in backticks (a top-level
module, tools.X or flower.X), an attribute path included (`common.ClientPool.train`), resolves by import and
getattr, and every keyword of a `module.name(..., key=...)` is a parameter of that callable. A rename or a
removed keyword fails here rather than leaving a doc behind. File names (`fedavg.py`, `pfedla.csv`) are no
names of code; third-party modules (torch., np.) are not ours. Nothing else is passed over: a span that names
code of ours and should not be checked goes in NOT_CODE with its reason."""
import glob
import importlib
import inspect
import os
import re

import pytest

from conftest import ROOT, needs_flower

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
OURS = sorted({os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py"))}
              | {f"{folder}.{os.path.basename(p)[:-3]}" for folder in ("tools", "flower")
                 for p in glob.glob(os.path.join(ROOT, folder, "*.py"))}, key=len, reverse=True)
FILE_SUFFIXES = {"py", "md", "csv", "json", "png", "npz", "pt", "txt", "sh", "cff", "ini", "html", "pkl", "gz"}
# `module.name` spans that look like code of ours but are not names to resolve: span -> why
NOT_CODE = {}
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
NAME = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(m) for m in OURS) + r")((?:\.[A-Za-z_]\w*)*)(?![\w.])")


def spans(path):
    """(line number, text) of each inline code span of a Markdown file, fenced code blocks left out."""
    fenced, out = False, []
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.extend((number, m.group(1)) for m in SPAN.finditer(line))
    return out


def call_keywords(text):
    """The keywords given at the top level of the call whose '(' opens ``text``; None if it is no call."""
    if not text.startswith("("):
        return None
    depth, top = 0, []
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0:
            text = text[:i]
            break
        top.append(char if depth == 1 else " ")  # nested brackets blanked: their keywords are another call's
    return re.findall(r"(?<![\w.])([A-Za-z_]\w*)\s*=(?!=)", "".join(top))


def references():
    """(where, module, attribute path, keywords or None) of every name of ours in the docs' code spans."""
    found = []
    for path in DOCS:
        for number, span in spans(path):
            if span in NOT_CODE:
                continue
            for m in NAME.finditer(span):
                module, attrs = m.group(1), m.group(2).split(".")[1:]
                if attrs[-1:] and attrs[-1] in FILE_SUFFIXES:  # a file: fedavg.py, pfedla.csv
                    continue
                where = f"{os.path.relpath(path, ROOT)}:{number}: `{span}`"
                found.append((where, module, attrs, call_keywords(span[m.end():])))
    return found


REFERENCES = references()


def resolve(module, attrs):
    obj = importlib.import_module(module)
    for name in attrs:
        obj = getattr(obj, name)
    return obj


def test_the_docs_name_code_of_ours():
    """The scan itself finds what it must (a broken pattern would find nothing and pass)."""
    names = {".".join([module, *attrs]) for _, module, attrs, _ in REFERENCES}
    assert {"common.local_train", "fedpake.server_update", "run_folder.atomic_write", "tools.paper_tables",
            "common.ClientPool.train"} <= names
    assert len(REFERENCES) >= 40
    assert all(module for _, module, attrs, _ in REFERENCES)


@pytest.mark.parametrize("where,module,attrs,keywords", [  # flower.X needs requirements-flower.txt: skips without
    pytest.param(*r, id=r[0], marks=needs_flower if r[1].startswith("flower.") else ()) for r in REFERENCES])
def test_a_named_module_attribute_and_its_keywords_exist(where, module, attrs, keywords):
    try:
        obj = resolve(module, attrs)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{where} names {'.'.join([module, *attrs])}, which does not exist ({e})")
    if keywords:
        parameters = inspect.signature(obj).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            unknown = [k for k in keywords if k not in parameters]
            assert not unknown, f"{where}: {'.'.join([module, *attrs])} takes no {', '.join(unknown)}"


def test_the_check_catches_a_stale_name_and_keyword(tmp_path, monkeypatch):
    """Planted in a doc: a name that is gone and a keyword that is not a parameter both fail."""
    doc = tmp_path / "stale.md"
    doc.write_text("See `common.FedData` and `common.sample_clients(rng, 5, ratio=0.5)`, and\n"
                   "```\n`common.not_checked_in_a_fence`\n```\n`fedavg.py` is a file.\n")
    monkeypatch.setattr(__import__(__name__), "DOCS", [str(doc)])
    found = references()
    assert [(m, a, k) for _, m, a, k in found] == [("common", ["FedData"], None),
                                                 ("common", ["sample_clients"], ["ratio"])]
    with pytest.raises(pytest.fail.Exception, match="common.FedData, which does not exist"):
        test_a_named_module_attribute_and_its_keywords_exist(found[0][0], *found[0][1:])
    with pytest.raises(AssertionError, match="takes no ratio"):
        test_a_named_module_attribute_and_its_keywords_exist(found[1][0], *found[1][1:])
