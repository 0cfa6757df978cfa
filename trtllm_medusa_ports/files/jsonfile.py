"""JSON from users' files: every way it can be wrong becomes one :class:`PortError` naming the file.

Covers what ``json.loads`` alone turns into tracebacks, hangs or memory exhaustion: unreadable
files, FIFOs and other non-regular files (opening one blocks), files far larger than any real one
(refused before they are read), bytes that are not UTF-8, nesting deeper than Python's parser
allows (``RecursionError``), a number longer than Python converts to an integer (``ValueError:
Exceeds the limit (4300 digits)``, reported with the field that holds it), and a top-level value
of the wrong type.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from trtllm_medusa_ports.errors import PortError

#: The largest JSON file :func:`read_json` reads whole (a model's or the heads' config.json, a shard
#: index, a converted checkpoint's config.json). The largest real ones are the shard indexes of
#: mixture-of-experts models, about 100 bytes a tensor: even 100k tensors make about 10 MB; a
#: config.json takes kilobytes. No real input comes near 64 MiB; a multi-gigabyte file passed by
#: mistake is refused by its size before a byte of it is read.
MAX_JSON_FILE_BYTES = 64 << 20


def is_int(v: Any, least: int | None = None) -> bool:
    """Whether ``v`` is an integer as JSON writes one (Python counts ``true`` as the int 1: a bool is not one), at
    least ``least`` where given."""
    return isinstance(v, int) and not isinstance(v, bool) and (least is None or v >= least)


def is_number(v: Any) -> bool:
    """Whether ``v`` is an int or a float as JSON writes one (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


def size_text(n: int) -> str:
    """``6442450944`` -> ``'6.0 GiB (6442450944 bytes)'``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def read_bytes_limited(path: Path, error: type[PortError], *, limit: int, fix: str, what: str = "the file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or ``error`` naming the file, its size and the
    limit (checked before reading, and again by what was read: a file that grows meanwhile is refused too)."""
    path = Path(path)
    require_regular_file(path, error, fix)

    def too_big(size: int) -> PortError:
        return error(f"{what} is {size_text(size)}, more than the {size_text(limit)} any real one takes; "
                     "it was not read", where=str(path), fix=fix)

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:  # never read a huge (or sparse) file whole
                raise too_big(size)
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read ({exc.strerror})", where=str(path), fix=fix) from None
    if len(data) > limit:
        raise too_big(len(data))
    return data


class _LongInt:
    """Stands for an integer literal too long for ``int()`` while the value is searched for it."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits


def _step(at: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{at}[{key}]"
    if key.isidentifier():
        return f"{at}.{key}" if at else key
    return f"{at}[{json.dumps(key if len(key) <= 40 else key[:40] + '...')}]"


def _field_of(value: Any, target: object) -> str:
    """Where ``target`` sits in ``value``: ``rope_scaling.factor``, ``weight_map["a b"]``, ``[3][0]`` ('' for the
    value itself). Iterative: the value may nest as deep as the parser allows."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, at = stack.pop()
        if v is target:
            return at
        if isinstance(v, dict):
            stack.extend((item, _step(at, k)) for k, item in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((item, _step(at, i)) for i, item in reversed(list(enumerate(v))))
    return ""


def loads(text: str, error: type[PortError], *, where: str, fix: str, at: str = "") -> Any:
    """``json.loads(text)``, with what it raises besides a syntax error turned into ``error``: nesting deeper than
    the parser allows, and an integer longer than Python converts (``sys.get_int_max_str_digits()``, 4300 by
    default), named by its field. ``json.JSONDecodeError`` propagates (callers word it, or try another syntax).
    ``at``: what in ``where`` the text is (``line 3``), put before the message."""
    lead = f"{at}: " if at else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise error(f"{lead}nests JSON deeper than can be read", where=where, fix=fix) from None
    except ValueError as exc:  # only Python's int-digit limit: parse again, keeping the long literals
        first = str(exc)
    found: list[_LongInt] = []

    def parse_int(s: str) -> int | _LongInt:
        try:
            return int(s)
        except ValueError:
            found.append(_LongInt(len(s.lstrip("-"))))
            return found[-1]

    try:
        value = json.loads(text, parse_int=parse_int)
    except (ValueError, RecursionError):
        value = None
    if not found:  # not the digit limit after all
        raise error(f"{lead}is not valid JSON ({first})", where=where, fix=fix) from None
    field = _field_of(value, found[0])
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
    subject = f"field {field}" if field else "the value"
    raise error(f"{lead}{subject} is an integer of {found[0].digits} digits, more than Python reads ({limit}); "
                "no real value is that long", where=where,
                fix=f"correct {subject} (a real value has a few digits); {fix}") from None


def parse_json(data: bytes | str, error: type[PortError], *, where: str, fix: str, kind: type | None = dict) -> Any:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise error(f"is not UTF-8 text ({exc.reason} at byte {exc.start})", where=where, fix=fix) from None
    try:
        value = loads(text, error, where=where, fix=fix)
    except json.JSONDecodeError as exc:
        raise error(f"is not valid JSON ({exc})", where=where, fix=fix) from None
    if kind is not None and not isinstance(value, kind):
        raise error(f"must hold a JSON {'object' if kind is dict else kind.__name__}, not {type(value).__name__}",
                    where=where, fix=fix)
    return value


def read_json(path: Path, error: type[PortError], *, fix: str, kind: type | None = dict,
              limit: int = MAX_JSON_FILE_BYTES) -> Any:
    """The JSON value of a file, or ``error`` naming the file, what is wrong and ``fix``; a file over ``limit``
    bytes is refused unread."""
    path = Path(path)
    data = read_bytes_limited(path, error, limit=limit, fix=fix, what=f"the JSON file {path.name}")
    return parse_json(data, error, where=str(path), fix=fix, kind=kind)
