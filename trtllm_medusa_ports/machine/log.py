"""The project's log: every warning, note and status line goes through the ``trtllm_medusa_ports`` logger (the
package's own, with a ``NullHandler`` as libraries keep one: an API caller sees what its own logging configuration
shows, and the records), never through ``print``. Results go to stdout, errors of a command to stderr as
``error: ...``, progress bars to stderr (tqdm; ``--quiet`` turns them off).

The CLI shows the log on stderr at ``--log_level``, TensorRT-LLM's names for its levels (tensorrt_llm/logger.py
``severity_map``; trtllm-build's ``--log_level``): ``internal_error``, ``error``, ``warning``, ``info`` (the default,
as trtllm-build's), ``verbose``, ``debug``. A warning reads ``warning: ...``; a note or status line carries its own
lead (``note:``, ``verify:``, ...); a debug line reads ``debug: ...``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

NAME = "trtllm_medusa_ports"
#: TensorRT-LLM's level names -> logging's levels (verbose and debug both: logging.DEBUG, as tensorrt_llm/logger.py)
LEVELS = {"internal_error": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING,
          "info": logging.INFO, "verbose": logging.DEBUG, "debug": logging.DEBUG}
DEFAULT_LEVEL = "info"

logging.getLogger(NAME).addHandler(logging.NullHandler())


def get(name: str | None = None) -> logging.Logger:
    """The package's logger, or its child ``name`` (a module's)."""
    return logging.getLogger(NAME if not name else f"{NAME}.{name.removeprefix(NAME + '.')}")


class _Format(logging.Formatter):
    LEAD = {logging.CRITICAL: "error: ", logging.ERROR: "error: ", logging.WARNING: "warning: ",
            logging.INFO: "", logging.DEBUG: "debug: "}

    def format(self, record: logging.LogRecord) -> str:
        return self.LEAD.get(record.levelno, "") + record.getMessage()


class _Stderr(logging.Handler):
    """Writes to ``sys.stderr`` as it is at each record (a caller that swaps it, as pytest does, gets the lines)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001  (logging's own rule: a handler never raises)
            self.handleError(record)


@contextlib.contextmanager
def shown(level: str = DEFAULT_LEVEL) -> Iterator[None]:
    """The package's log on stderr at ``level`` (a name of :data:`LEVELS`) while the block runs; the logger's level,
    handlers and propagation are as they were after it (the CLI's; an API call adds nothing)."""
    log = logging.getLogger(NAME)
    handler = _Stderr()
    handler.setFormatter(_Format())
    before = (log.level, log.propagate)
    log.addHandler(handler)
    log.setLevel(LEVELS[level])
    log.propagate = False  # the root logger's handlers (a user's basicConfig) would print each line twice
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(before[0])
        log.propagate = before[1]
