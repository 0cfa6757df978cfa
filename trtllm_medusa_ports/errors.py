"""Errors a user can act on.

Every error names the thing that is wrong (a file, a tensor, a config field),
what was expected, and how to fix it. The CLI prints ``str(error)`` and exits 1;
it never shows a traceback for a :class:`PortError`.
"""

from __future__ import annotations


class PortError(Exception):
    """Base class: a problem with the user's input, explained."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self._render())

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
