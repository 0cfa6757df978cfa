"""What Triton's TensorRT-LLM backend does with a model repository's configuration, written from its source
(TensorRT-LLM 1.2, ``triton_backend/``; tests/standin/LEDGER.md), outside the stand-in package as runtime_buffers.py
is: nothing here is importable as ``tensorrt_llm``.

- :func:`csv_str_to_vec_vec_int`: ``utils::csvStrToVecVecInt`` (inflight_batcher_llm/src/utils.cc): read up to each
  ``}`` (a last group without one is dropped, as ``getline`` meets the end), drop one leading ``{``, then
  ``csvStrToVecInt``: skip whitespace, read up to each ``,``, ``std::stoi`` (leading whitespace, a sign, digits; an
  error where no digit starts it); an empty result is an error. ``ModelState::GetParameter`` catches any error and the
  backend then logs that medusa_choices is not specified and serves mc_sim_7b_63: :func:`medusa_choices_served`.
- :func:`fill_template`: tools/fill_template.py: the argument split on ``,`` then ``:``, a backslash escaping the next
  character in each split; every key must occur in the template; ``string.Template.safe_substitute`` (an unfilled
  ``${key}`` stays), ``max_queue_size`` and ``max_queue_delay_microseconds`` default to 0.
"""

import re
import string

DEFAULT_TREE = "mc_sim_7b_63"


def _stoi(text: str) -> int:
    m = re.match(r"\s*([+-]?\d+)", text)
    if m is None:
        raise ValueError(f"stoi: no conversion: {text!r}")
    return int(m.group(1))


def csv_str_to_vec_int(text: str) -> list[int]:
    if not text:
        raise ValueError("Cannot convert empty string to vector of vector of ints")
    out, rest = [], text
    while True:
        rest = rest.lstrip()
        piece, sep, rest = rest.partition(",")
        if not piece:
            break
        out.append(_stoi(piece))
        if not sep:
            break
    if not out:
        raise ValueError("Empty vector")
    return out


def csv_str_to_vec_vec_int(text: str) -> list[list[int]]:
    if not text:
        raise ValueError("Cannot convert empty string to vector of vector of ints")
    out, rest = [], text
    while True:
        piece, sep, rest = rest.partition("}")
        if not piece or not sep:  # getline: empty, or the end met before a '}'
            break
        if piece[0] == "{":
            piece = piece[1:]
        out.append(csv_str_to_vec_int(piece))
        rest = rest.lstrip()
        comma = rest.find(",")
        rest = "" if comma < 0 else rest[comma + 1:]
        rest = rest.lstrip()
    if not out:
        raise ValueError("Empty vector of vector")
    return out


def medusa_choices_served(decoding_mode: str, value: str) -> list[list[int]] | str:
    """The tree the C++ backend serves for these two parameters: the parsed groups, or DEFAULT_TREE."""
    if decoding_mode != "medusa":
        return DEFAULT_TREE
    try:
        return csv_str_to_vec_vec_int(value)
    except ValueError:
        return DEFAULT_TREE


def _split(text: str, delimiter: str) -> list[str]:
    out, current, escape = [], "", False
    for ch in text:
        if escape:
            current, escape = current + ch, False
        elif ch == delimiter:
            out.append(current)
            current = ""
        elif ch == "\\":
            escape = True
        else:
            current += ch
    return out + [current]


def fill_template(template: str, argument: str) -> str:
    values = {"max_queue_size": 0, "max_queue_delay_microseconds": 0}
    for piece in _split(argument, ","):
        key, value = _split(piece, ":")
        assert key in template, f"key '{key}' does not exist in the template"
        values[key] = value
    return string.Template(template).safe_substitute(values)
