"""Every command's flag table in docs/user-guide.md, rendered from its argparse parser (as ``families`` renders the
family tables from the adapters): no flag is missing from the docs or listed twice, and a default or a help text
changes in one place. ``python -m trtllm_medusa_ports.cli_flags.tables --write`` rewrites the tables between each
command's ``<!-- flags:<command>:begin -->`` and ``<!-- flags:<command>:end -->`` markers; a test fails when the
docs and the parsers differ.

May import: the standard library and cli_flags (the parsers).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DOCUMENT = "docs/user-guide.md"


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    from trtllm_medusa_ports.cli_flags.parsers import build_parser

    parser = build_parser(dict.fromkeys(_names(), lambda args: 0))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _names() -> list[str]:
    from trtllm_medusa_ports.cli_flags.parsers import COMMAND_PARSERS

    return list(COMMAND_PARSERS)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off"
    if action.default is None or action.default == argparse.SUPPRESS:
        return "none"
    if isinstance(action.default, list):
        return "none" if not action.default else ", ".join(map(str, action.default))
    return f"`{action.default}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render(command: str, parser: argparse.ArgumentParser) -> str:
    """The markdown table of one command's flags: the flag and its other spellings, the default, the help (and the
    choices where the flag has them)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        names = " / ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest.upper()}` (positional)"
        meaning = _cell(a.help % {"default": a.default} if a.help and "%(" in a.help else a.help or "")
        if a.choices is not None and not isinstance(a.choices, range):
            meaning += ("; " if meaning else "") + "one of " + ", ".join(f"`{c}`" for c in a.choices)
        rows.append(f"| {names} | {_default(a)} | {meaning} |")
    return "\n".join(rows)


def _marked(command: str) -> re.Pattern:
    return re.compile(rf"(<!-- flags:{re.escape(command)}:begin -->\n)(.*?)(\n<!-- flags:{re.escape(command)}:end -->)",
                      re.S)


def rendered_document(text: str) -> str:
    """``text`` with every command's marked table rendered anew."""
    for command, parser in _command_parsers().items():
        pattern = _marked(command)
        if not pattern.search(text):
            raise ValueError(f"{DOCUMENT} has no <!-- flags:{command}:begin --> ... end marker pair")
        text = pattern.sub(lambda m, c=command, p=parser: m.group(1) + render(c, p) + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the tables in {DOCUMENT}")
    args = ap.parse_args(argv)
    path = Path(DOCUMENT)
    text = path.read_text()
    new = rendered_document(text)
    if args.write:
        path.write_text(new)
    elif new != text:
        print(f"{DOCUMENT}'s flag tables differ from the parsers: run with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
