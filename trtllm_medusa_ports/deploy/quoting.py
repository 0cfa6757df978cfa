"""Values written into generated code, one quoting function per language the bundle writes.

A checkpoint is downloaded input: its config.json, the tree source it records, the directory names it and the
tokenizer come in are data, and a generated script is code. Every value from an input reaches a script only
through these functions (never formatted into a line, never into a comment), and a path or recorded text holding a
newline or another control character is refused before anything is written (:func:`plain_text`).

- shell: :func:`sh` (``shlex.quote``: one word, nothing expanded), :func:`sh_argv` for a command line;
- Python: :func:`py` (``repr`` of a str, int, float or a list of them: a literal that evaluates to the value);
- YAML: :func:`yaml` (JSON, which YAML 1.2 reads as the same value, ASCII only);
- Triton's pbtxt: :func:`pbtxt` (the text to place between a ``string_value``'s double quotes: protobuf text
  format's escapes for the backslash, the quotes and any byte outside printable ASCII).

May import: ``errors`` only.
"""

from __future__ import annotations

import json
import re
import shlex

from trtllm_medusa_ports.errors import ModelError

#: C0 controls (newline, carriage return, tab, escape, ...), DEL and the C1 controls
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plain_text(value: str, what: str, where: str, fix: str) -> str:
    """``value`` when it holds no control character; else refused naming ``what`` and the character's position."""
    m = _CONTROL.search(value)
    if m:
        raise ModelError(f"{what} holds the control character {m.group()!r} at offset {m.start()} ({value!r}): "
                         "the bundle's scripts would carry it", where=where, fix=fix)
    return value


def sh(value: object) -> str:
    return shlex.quote(str(value))


def sh_argv(argv: list) -> str:
    """A command line: each word through :func:`sh`."""
    return " ".join(sh(a) for a in argv)


def py(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float, list)):
        raise TypeError(f"no Python literal is written for a {type(value).__name__}")
    if isinstance(value, list):
        return "[" + ", ".join(py(v) for v in value) + "]"
    return repr(value)


def yaml(value: object) -> str:
    return json.dumps(value, ensure_ascii=True)


def pbtxt(value: object) -> str:
    out = []
    for byte in str(value).encode():
        ch = chr(byte)
        if ch in ('"', "'", "\\"):
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7f:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")  # octal escape of each UTF-8 byte
    return "".join(out)
