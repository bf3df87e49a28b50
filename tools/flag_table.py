"""The flags every script shares and each script's default for them, as a markdown table (docs/running.md pastes
it; tests/test_first_hour.py holds the pasted table to this output, so it follows the parsers).

    python tools/flag_table.py
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import common  # noqa: E402
import fedacd  # noqa: E402
import fedala  # noqa: E402
import fedavg  # noqa: E402
import fedpake  # noqa: E402
import pfedla  # noqa: E402

SCRIPTS = {"fedavg.py": fedavg, "fedala.py": fedala, "pfedla.py": pfedla, "fedpake.py": fedpake, "fedacd.py": fedacd}


def shared_actions(parser):
    """{flag: action} of ``parser``'s flags that common.base_parser makes."""
    shared = {a.option_strings[0] for a in common.base_parser("x")._actions if a.option_strings != ["-h", "--help"]}
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings[:1] and a.option_strings[0] in shared}


def default_cell(action):
    """A flag's default as its --help states it: the help's own '(default: ...)' where the default depends on the
    data, 'auto: X on images' for --model, else the value."""
    text = " ".join((action.help or "").split())
    if text.startswith("auto (default): "):
        return "auto: " + text.split(": ", 1)[1].split(" on images")[0] + " on images"
    stated = re.search(r"\(default: ((?:[^()]|\([^()]*\))*)\)", text)
    if stated and action.default in (None, "auto"):
        return stated[1]
    value = action.default
    if isinstance(value, bool) or value is None:
        return {True: "on", False: "off", None: "none"}[value]
    return f"`{value}`" if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def table():
    """The markdown table: one row per shared flag, one column per script."""
    actions = {name: shared_actions(parser) for name, parser in parsers().items()}
    flags = list(actions["fedavg.py"])
    lines = ["| flag | " + " | ".join(f"`{name}`" for name in SCRIPTS) + " |",
             "|---|" + "---|" * len(SCRIPTS)]
    for flag in flags:
        lines.append(f"| `{flag}` | " + " | ".join(default_cell(actions[name][flag]) for name in SCRIPTS) + " |")
    return "\n".join(lines)


class _Built(Exception):
    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def _built(parser, *args, **kwargs):
    raise _Built(parser)


def parsers():
    """Each script's parser as its parse_args builds it, the one whose --help it prints (taken where the script
    hands it to common.parse_args)."""
    found, parse = {}, common.parse_args
    for name, module in SCRIPTS.items():
        common.parse_args = _built
        try:
            module.parse_args([])
        except _Built as built:
            found[name] = built.parser
        finally:
            common.parse_args = parse
    return found


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(table())


if __name__ == "__main__":
    main()
