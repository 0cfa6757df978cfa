"""JSON from users' files: every way it can be wrong becomes one :class:`PortError` naming the file.

Covers what ``json.loads`` alone turns into tracebacks or hangs: unreadable files, FIFOs and
other non-regular files (opening one blocks), bytes that are not UTF-8, nesting deeper than
Python's parser allows (``RecursionError``), and a top-level value of the wrong type.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from trtllm_medusa_ports.errors import PortError


def require_regular_file(path: Path, error: type[PortError], fix: str) -> None:
    """Refuse anything that is not a regular file before opening it (a FIFO would block)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise error(f"cannot read ({exc.strerror})", where=str(path), fix=fix) from None
    except ValueError:  # a NUL byte in the name: no such path can exist
        raise error("is not a valid path (it contains a NUL byte)", where=repr(str(path)), fix=fix) from None
    if not stat.S_ISREG(mode):
        raise error("is not a regular file", where=str(path), fix=fix)


def parse_json(data: bytes | str, error: type[PortError], *, where: str, fix: str, kind: type | None = dict) -> Any:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise error(f"is not UTF-8 text ({exc.reason} at byte {exc.start})", where=where, fix=fix) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"is not valid JSON ({exc})", where=where, fix=fix) from None
    except RecursionError:
        raise error("nests JSON deeper than can be read", where=where, fix=fix) from None
    if kind is not None and not isinstance(value, kind):
        raise error(f"must hold a JSON {'object' if kind is dict else kind.__name__}, not {type(value).__name__}",
                    where=where, fix=fix)
    return value


def read_json(path: Path, error: type[PortError], *, fix: str, kind: type | None = dict) -> Any:
    """The JSON value of a file, or ``error`` naming the file, what is wrong and ``fix``."""
    path = Path(path)
    require_regular_file(path, error, fix)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read ({exc.strerror})", where=str(path), fix=fix) from None
    return parse_json(data, error, where=str(path), fix=fix, kind=kind)
