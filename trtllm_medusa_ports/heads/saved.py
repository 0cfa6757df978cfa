"""Writing a torch object whole or not at all (the corpus cache, the training state): ``save_whole`` writes a
temporary beside the target and renames it, and names the disk error (``os_error_text``) when it cannot.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import HeadsError


def os_error_text(exc: OSError) -> str:
    """``ENOSPC: No space left on device``."""
    import errno

    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno is not None else "OSError"
    return f"{name}: {exc.strerror or exc}"


class _Sink:
    """What ``torch.save`` writes through: every byte written, or the ``OSError`` kept. torch turns a failed
    write into a ``RuntimeError`` ("unexpected pos ..."), so the disk's own error is read from here."""

    def __init__(self, fd: int):
        self.fd = fd
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        except OSError as exc:
            self.error = self.error or exc
            raise
        return len(view)

    def flush(self) -> None:
        pass


def save_whole(obj, path: Path, what: str, *, fix: str) -> None:
    """``torch.save(obj)`` to ``path`` whole or not at all: written to ``<path>.tmp``, synced and renamed over it.
    A failed write (a full disk, a read-only one) removes the temporary file, leaves what ``path`` held, and is
    one :class:`HeadsError` naming the file and the errno."""
    tmp = path.with_suffix(".tmp")
    sink: _Sink | None = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            sink = _Sink(fd)
            torch.save(obj, sink)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, Exception):  # Ctrl-C: no temporary left, the last whole file stands
            raise
        err = exc if isinstance(exc, OSError) else sink.error if sink is not None else None
        if err is None:
            raise
        raise HeadsError(f"could not write {what} ({os_error_text(err)}); nothing half-written was left",
                         where=str(path), fix=fix) from None
