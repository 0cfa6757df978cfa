"""The API's input validation (docs/api.md "Input validation"): one spec per field of every options dataclass
(``SPECS``, made from declared.py) and the validator every api function calls before any work
(``validate_options``, ``check_fields``).

May import: the standard library, declared, errors and files.prompts (heads.fit and quant.calibrate lazily, for the
types they define); never api or cli.
"""

from __future__ import annotations

import dataclasses
import math
import os

from trtllm_medusa_ports.declared import Spec, specs
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.jsonfile import is_int
from trtllm_medusa_ports.files.prompts import PromptInputs

#: every API function checks its options against these specs before any work, so that a wrong type or an
#: out-of-range value is refused at the boundary (naming ``Class.field``) instead of failing deep inside.
#: A field may be None only where its default is None (or its spec says ``none=True``); the ranges are the flags'
#: (both made from declared.py); a plain ``type=int`` flag is checked for its type only, its value by the rule that
#: judges it (a tp_size of 0 by rule parallel-size, ...).
SPECS: dict[str, dict[str, Spec]] = specs()


def _calibration_type():
    import sys

    mod = sys.modules.get("trtllm_medusa_ports.quant.calibrate")  # not loaded: nothing can be a Calibration yet
    return mod.Calibration if mod is not None else ()


def _fit_type():
    from trtllm_medusa_ports.heads import fit

    return fit.FitOptions


#: the types a spec names (kind "of" / "nested"), each read when first asked for
_TYPES = {"Calibration": _calibration_type, "FitOptions": _fit_type, "PromptInputs": lambda: PromptInputs}
#: the types of these fields that the API exports under their own name (api.PromptInputs)
_API_TYPES = (PromptInputs,)


def _expected(s: Spec) -> str:
    """What a field of this spec accepts, in words."""
    if s.kind == "int" or s.kind == "float":
        text = "an integer" if s.kind == "int" else "a number"
        if s.choices:
            return f"{text}, one of {', '.join(map(str, s.choices))}"
        if s.lo is not None and s.hi is not None:
            return f"{text} in {s.lo}..{s.hi}"
        if s.lo is not None:
            return (f"{text} above {s.lo}" if s.lo_excluded else f"{text} >= {s.lo}") + (
                f" and below {s.below}" if s.below is not None else "")
        return text
    if s.kind == "str" and s.choices:
        return f"one of {', '.join(map(repr, s.choices))}"
    if s.kind in ("of", "nested"):
        t = _TYPES[s.of]()
        if isinstance(t, type) and t in _API_TYPES:  # a type the API exports
            return f"a {t.__name__} (api.{t.__name__})"
        # a type of a module below (quant.calibrate.Calibration), loaded or not yet: one spelling either way
        return "a " + (f"{t.__module__.removeprefix('trtllm_medusa_ports.')}.{t.__qualname__}"
                       if isinstance(t, type) else "quant.calibrate.Calibration")
    return {"path": "a path (str or os.PathLike)", "bool": "a bool (True or False)", "str": "a string",
            "tree": "a medusa_choices tree: a preset name, @file or JSON text (str), or a list of paths",
            "list": "a list of strings", "ids": "a list of token-id lists (lists of int)"}[s.kind]


def _accepts(s: Spec, v) -> bool:
    if s.kind == "path":
        return isinstance(v, (str, os.PathLike)) and str(v) != ""
    if s.kind in ("int", "float"):
        if not (is_int(v) if s.kind == "int" else (is_int(v) or isinstance(v, float))):
            return False
        return (math.isfinite(v) and (s.lo is None or (v > s.lo if s.lo_excluded else v >= s.lo))  # NaN, inf refused
                and (s.hi is None or v <= s.hi)
                and (s.below is None or v < s.below) and (not s.choices or v in s.choices))
    if s.kind == "bool":
        return isinstance(v, bool)
    if s.kind == "str":
        return isinstance(v, str) and (not s.choices or v in s.choices)
    if s.kind == "tree":
        return isinstance(v, (str, list))
    if s.kind == "list":
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
    if s.kind == "ids":
        return isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) and all(map(is_int, p)) for p in v)
    t = _TYPES[s.of]()
    return isinstance(t, type) and isinstance(v, t)


def check_fields(owner: str, values: dict, defaults: dict, error: type[PortError], label: str | None = None) -> None:
    """Raise ``error`` for the first value its spec (``SPECS[owner]``) refuses, its ``where`` ``label.field``
    (``label``: the owner, or the path to a nested option such as ``TrainOptions.fit``); nested options too."""
    import math

    specs, label = SPECS[owner], label or owner
    for name, v in values.items():
        s = specs.get(name)
        if s is None:  # a field with no spec (an addition the table does not know yet) is left to the command
            continue
        default = defaults.get(name, dataclasses.MISSING)
        if v is None and (default is None or s.none):
            continue
        if not _accepts(s, v):
            flag = s.flag if s.flag != "" else f"--{name}"
            shown = "nan" if isinstance(v, float) and math.isnan(v) else repr(v)
            given = f"{flag} {shown}" if flag else shown
            none = " (or None)" if default is None or s.none else ""
            told = f"; the default is {default!r}" if default not in (dataclasses.MISSING, None) else ""
            raise error(f"{given} ({type(v).__name__}) is not {_expected(s)}{none}",
                        where=f"{label}.{name}", fix=f"give {label}.{name} {_expected(s)}{none}{told}", usage=True)
        if s.kind == "nested":
            validate(v, error, f"{label}.{name}")


def validate(opts, error: type[PortError] = PortError, where: str | None = None) -> None:
    """Check an options dataclass against its spec (the first class of its MRO that ``SPECS`` names)."""
    owner = next((c.__name__ for c in type(opts).__mro__ if c.__name__ in SPECS), None)
    if owner is None or not dataclasses.is_dataclass(opts):
        raise error(f"{opts!r} ({type(opts).__name__}) is not an options dataclass of trtllm_medusa_ports.api",
                    where=where or "options", fix="build the options with the api's classes, e.g. api.ConvertOptions(...)")
    values = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    defaults = {f.name: f.default for f in dataclasses.fields(opts) if f.default is not dataclasses.MISSING}
    check_fields(owner, values, defaults, error, where)


def validate_options(opts, cls_name: str, error: type[PortError] = PortError) -> None:
    """The function's options: an instance of its class (by name; TrainOptions is made lazily), then its fields."""
    if not any(c.__name__ == cls_name for c in type(opts).__mro__) or not dataclasses.is_dataclass(opts):
        raise error(f"{opts!r} ({type(opts).__name__}) is not a {cls_name}", where=cls_name,
                    fix=f"pass api.{cls_name}(...)")
    validate(opts, error)
