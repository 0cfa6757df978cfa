"""Errors a user can act on.

Every error names the thing that is wrong (a file, a tensor, a config field),
what was expected, and how to fix it. The CLI prints ``str(error)`` and exits 1, or 2 for
an error of the command line itself (``usage=True``: docs/user-guide.md, "Exit codes"), and under ``--json`` also
prints :func:`failure`'s object on stdout; it never shows a traceback for a :class:`PortError`.
"""

from __future__ import annotations

#: every command's exit codes, one rule (docs/user-guide.md, "Exit codes"): a script tells "could not run" (1, 2)
#: from "ran, and found a problem" (3)
EXIT_OK = 0
EXIT_INPUT = 1  # could not run: an input is wrong, missing or does not fit the flags (Python's own habit for errors)
EXIT_USAGE = 2  # could not run: the command line alone is wrong (argparse's code)
EXIT_FOUND = 3  # ran, and found a problem: check NOT COMPATIBLE, verify FAILED (demo's verify included)
EXIT_INTERRUPTED = 130
EXIT_CODES = {EXIT_OK: "success", EXIT_INPUT: "could not run: an input is wrong, missing or does not fit the flags",
              EXIT_USAGE: "could not run: the command line alone is wrong",
              EXIT_FOUND: "ran, and found a problem (check: NOT COMPATIBLE; verify: FAILED)",
              EXIT_INTERRUPTED: "interrupted (SIGINT or SIGTERM); nothing was left half-written"}


def failure(what: str, *, where: str | None = None, fix: str | None = None, exit_code: int, kind: str = "PortError",
            rules: list[str] | None = None) -> dict:
    """The one JSON object a command prints on stdout for a failure under ``--json``."""
    return {"error": what, "where": where, "fix": fix, "exit_code": exit_code, "meaning": EXIT_CODES.get(exit_code),
            "type": kind, "rules": list(rules or [])}


class PortError(Exception):
    """Base class: a problem with the user's input, explained.

    ``what``: what is wrong and what was expected; ``where``: the file, tensor or config field (or None);
    ``fix``: how to fix it; ``rule``: the compatibility rule id that refused (docs/compatibility-rules.md),
    where a rule did, else None. ``rules``: every rule that refused. ``usage``: the command line alone is wrong (a
    flag's value of the wrong form or outside its range, judged before any input is read): the CLI exits 2.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None,
                 rules: list[str] | None = None, usage: bool = False):
        self.what = what
        self.usage = usage
        self.where = where
        self.fix = fix
        self.rules = list(rules or [])
        super().__init__(self._render())

    @property
    def rule(self) -> str | None:
        return self.rules[0] if self.rules else None

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "rule": self.rule, "rules": self.rules, "where": self.where,
                "what": self.what, "fix": self.fix, "usage": self.usage}

    @property
    def exit_code(self) -> int:
        return EXIT_USAGE if self.usage else EXIT_INPUT

    def failure(self) -> dict:
        return failure(self.what, where=self.where, fix=self.fix, exit_code=self.exit_code, kind=type(self).__name__,
                       rules=self.rules)

    def _render(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class TreeError(PortError):
    """An invalid ``medusa_choices`` tree."""


class HeadsError(PortError):
    """A Medusa head checkpoint that cannot be read or is inconsistent."""


class ModelError(PortError):
    """A base model directory that cannot be read or is inconsistent."""


class CheckpointError(PortError):
    """A TensorRT-LLM checkpoint directory that cannot be read or written."""


class ConversionError(PortError):
    """The conversion was refused or failed; nothing was written."""
