"""Every `python ...` command that README.md and docs/*.md show a reader (in code blocks, indented blocks and
inline code) names a program that exists and whose command line accepts the flags as shown: each is parsed by
the program's own parser (its main() up to its first complete parse_args; for the algorithm scripts and their
tools/ programs, their own parse_args whole: argparse, then their checks of the values), nothing is run. A
moved or renamed flag, or a renamed program, cannot leave a doc behind."""
import json
import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT

DOCS = ["README.md", *sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                             if name.endswith(".md"))]
# a run of flags left to the reader ("<the same flags>", "..."): the flags around it are checked without it
ELIDED = re.compile(r"<[^>]*>|(?<!\S)(\.\.\.|…)(?!\S)")
# a value the reader fills in (DIR, N, RUN, TABLE): parsed as "1", which every flag's type takes;
# ALGORITHM, where flower/app.py wants one, as an algorithm
FILLED_IN = re.compile(r"[A-Z][A-Z0-9_]*")
FILL = {"ALGORITHM": "fedavg"}


# programs whose parse_args(argv) checks the values after argparse (common.parse_args: --join-ratio in (0, 1],
# --kappa >= 0, --p >= 1, ...): the checker runs it whole, so a value the program refuses is found
CHECKED = {"fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py", "tools/fedavg_variants.py",
           "tools/fedacd_diagnostics.py"}


def checked(program, argv):
    """Whether the program's own checks run: not on --resume, whose checks read the run folder (RUN: a placeholder)."""
    return program in CHECKED and "--resume" not in argv


def not_parsed(program, argv):
    """Why a command is not parsed here (flower/app.py does these before or instead of parsing), or None."""
    if program == "flower/app.py" and argv[:1] in (["--app-folder"], ["--node-worker"]):
        return "writes the app folder, or is flower/node.py's worker: not parsing"
    if program == "flower/app.py" and "--resume" in argv:
        return "reads the run folder first (the scripts' --resume is parsed with the scripts)"
    return None

RUNNER = r'''
import argparse, contextlib, importlib.util, inspect, io, json, os, sys
sys.path.insert(0, os.getcwd())

class Parsed(BaseException):
    pass

original = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    result = original(self, args, namespace)
    raise Parsed()
argparse.ArgumentParser.parse_args = parse_args

modules, results = {}, []
for script, argv, checked in json.load(sys.stdin):
    if script not in modules:
        name = "doc_command_" + script.replace("/", "_").replace(".", "_")
        spec = importlib.util.spec_from_file_location(name, script)
        modules[script] = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        spec.loader.exec_module(modules[script])
    err = io.StringIO()
    try:
        sys.argv = [script, *argv]
        main = modules[script].main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            if checked:  # the script's own parse_args: argparse, then its checks of the values
                argparse.ArgumentParser.parse_args = original
                try:
                    modules[script].parse_args(argv)
                finally:
                    argparse.ArgumentParser.parse_args = parse_args
                raise Parsed()
            main(argv) if inspect.signature(main).parameters else main()
        outcome = None if {"-h", "--help"} & set(argv) else "its main() returned without parsing its command line"
    except Parsed:
        outcome = None
    except SystemExit as e:
        outcome = None if e.code in (0, None) else f"exit status {e.code}: {err.getvalue().strip()}"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e} {err.getvalue().strip()}"
    results.append(outcome)
print(json.dumps(results))
'''


def doc_lines(path):
    """(line number, text) of the lines a reader could paste: code blocks (fenced or indented) with their
    continuation lines joined, and inline code spans that start with python."""
    found, fenced, block = [], False, []
    for n, line in enumerate(open(os.path.join(ROOT, path)).read().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            if block and block[-1][1].endswith("\\"):
                block[-1] = (block[-1][0], block[-1][1][:-1] + " " + line.strip())
            else:
                block.append((n, line.strip()))
        found += [(n, m.group(1)) for m in re.finditer(r"`((?:\S*/)?python3? [^`]+)`", line)]
    return block + found


def doc_commands():
    """[(where, program, argv)] of every python command the docs show, placeholders left out."""
    commands = []
    for path in DOCS:
        for n, text in doc_lines(path):
            try:  # [--rounds N]: an optional part, checked as if given
                words = shlex.split(ELIDED.sub(" ", text).replace("[", " ").replace("]", " "), comments=True)
            except ValueError:  # an unclosed quote: prose, not a command
                continue
            for part in " ".join(shlex.quote(w) if w not in ("&&", ";", "|", "||") else "\n" for w in words).split("\n"):
                part = shlex.split(part)
                while part and re.fullmatch(r"[A-Z_]+=\S*", part[0]):  # VAR=value before the command
                    part = part[1:]
                if len(part) < 2 or not re.fullmatch(r"(\S*/)?python3?", part[0]) or part[1].startswith("-"):
                    continue  # not python, or python -m / -c
                program, argv = part[1], [FILL.get(w, "1") if FILLED_IN.fullmatch(w) else w for w in part[2:]]
                if not re.fullmatch(r"[a-z_/]+\.py", program) or not_parsed(program, argv):
                    continue  # SCRIPT, X.py, $a.py: a pattern, not a command
                if argv or not ELIDED.search(text):  # `python flower/app.py ...`: its flags left to the reader
                    commands.append((f"{path}:{n}", program, argv))
    return commands


def test_the_docs_show_python_commands_of_every_kind():
    programs = {program for _, program, _ in doc_commands()}
    assert {"fedavg.py", "fedala.py", "pfedla.py", "fedpake.py", "fedacd.py", "tools/reproduce.py",
            "tools/compare.py", "tools/fedacd_diagnostics.py", "tools/pfllib_venv.py"} <= programs, programs
    assert len(doc_commands()) > 150


def test_every_python_command_in_the_docs_names_a_program_that_accepts_its_flags():
    commands = doc_commands()
    missing = [f"{where}: {program} does not exist" for where, program, _ in commands
               if not os.path.isfile(os.path.join(ROOT, program))]
    assert not missing, "\n".join(missing)
    try:
        import flwr  # noqa: F401
    except ImportError:  # without requirements-flower.txt flower/app.py cannot start: its commands are not checked
        commands = [c for c in commands if not c[1].startswith("flower/")]
    done = subprocess.run([sys.executable, "-c", RUNNER],
                          input=json.dumps([[p, a, checked(p, a)] for _, p, a in commands]),
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    refused = [f"{where}: python {program} {shlex.join(argv)}\n    {outcome}"
               for (where, program, argv), outcome in zip(commands, json.loads(done.stdout.splitlines()[-1]))
               if outcome]
    assert not refused, "\n".join(refused)


def test_a_refused_flag_is_found(tmp_path):
    """The check itself: a flag the program does not have is refused, a good one passes."""
    done = subprocess.run([sys.executable, "-c", RUNNER], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          input=json.dumps([["tools/compare.py", ["runs/", "--no-such-flag"], False],
                                            ["tools/compare.py", ["runs/", "--metric", "test_loss"], False]]))
    first, second = json.loads(done.stdout.splitlines()[-1])
    assert first and "--no-such-flag" in first and second is None


def test_a_value_the_script_refuses_after_argparse_is_found():
    """Values argparse takes but the script's own checks refuse, as a doc would show them, are refused; the
    same commands with good values pass."""
    bad = [("fedavg.py", ["--dataset", "synthetic", "--join-ratio", "2"], "--join-ratio must be in (0, 1]"),
           ("fedpake.py", ["--kappa", "-1"], "--kappa must be >= 0"), ("fedala.py", ["--p", "0"], "--p must be >= 1"),
           ("tools/fedacd_diagnostics.py", ["--fedavg", "--uniform-agg"], "--fedavg aggregates by sample counts")]
    good = [("fedavg.py", ["--dataset", "synthetic", "--join-ratio", "0.5"]), ("fedpake.py", ["--kappa", "inf"]),
            ("fedala.py", ["--p", "2"]), ("tools/fedacd_diagnostics.py", ["--fedavg"])]
    commands = [(p, a, checked(p, a)) for p, a, *_ in bad + good]
    done = subprocess.run([sys.executable, "-c", RUNNER], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          input=json.dumps(commands), env={**os.environ, "OMP_NUM_THREADS": "1"})
    outcomes = json.loads(done.stdout.splitlines()[-1])
    for (program, argv, line), outcome in zip(bad, outcomes):
        assert outcome and line in outcome, (program, argv, outcome)
    assert outcomes[len(bad):] == [None] * len(good)
