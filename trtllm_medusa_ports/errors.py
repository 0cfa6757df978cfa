"""Errors a user can act on.

Every error names the thing that is wrong (a file, a tensor, a config field),
what was expected, and how to fix it. The CLI prints ``str(error)`` and exits 1, or 2 for
an error of the command line itself (``usage=True``: docs/user-guide.md, "Exit codes"); it never shows a traceback
for a :class:`PortError`.
"""

from __future__ import annotations


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
