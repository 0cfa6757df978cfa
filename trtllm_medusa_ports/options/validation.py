"""The API's input validation (docs/api.md "Input validation"): one spec per field of every options dataclass
(``SPECS``) and the validator every api function calls before any work (``validate_options``, ``check_fields``).

May import: the standard library, errors, files.prompts and files.tokenizer (heads.train and quant.calibrate lazily, for the types
they define); never api or cli.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.prompts import PromptInputs
from trtllm_medusa_ports.files.tokenizer import CHAT_TEMPLATE_MODES


#: every API function checks its options against these specs before any work, so that a wrong type or an
#: out-of-range value is refused at the boundary (naming ``Class.field``) instead of failing deep inside.
#: A field may be None only where its default is None (or its spec says ``none=True``); ranges are the flags'
#: ``int_in`` / ``non_negative`` / ``fraction`` ranges (cli_flags/types.py); a plain ``type=int`` flag is
#: checked for its type only, its value by the rule that judges it (a tp_size of 0 by rule parallel-size, ...).
@dataclass(frozen=True)
class Spec:
    kind: str  # path, int, float, bool, str, tree, list, ids, of, nested
    lo: float | None = None
    hi: float | None = None
    below: float | None = None  # exclusive upper bound
    lo_excluded: bool = False  # ``lo`` itself refused (a number above it)
    choices: tuple | None = None
    none: bool = False  # None accepted although the default is not None
    flag: str | None = ""  # the flag spelling ("": --<field>; None: no flag)
    of: object = None  # kind "of" / "nested": a zero-argument callable returning the accepted type


def _P(**kw) -> Spec:
    return Spec("path", **kw)


def _I(lo: int | None = None, hi: int | None = None, **kw) -> Spec:
    return Spec("int", lo=lo, hi=hi, **kw)


def _F(lo: float | None = None, **kw) -> Spec:
    return Spec("float", lo=lo, **kw)


def _S(*choices: str, **kw) -> Spec:
    return Spec("str", choices=choices or None, **kw)


_B, _TREE, _STRS = Spec("bool"), Spec("tree"), Spec("list")
_CHAT = _S(*CHAT_TEMPLATE_MODES)
_DTYPES = ("auto", "float32", "float16", "bfloat16")
_QUANT = dict(qformat=_S("fp8", "int8_wo", "int4_wo", "full_prec"), use_weight_only=_B,
              weight_only_precision=_S("int8", "int4"), kv_cache_dtype=_S("fp8", "int8"), int8_kv_cache=_B)


def _calibration_type():
    import sys

    mod = sys.modules.get("trtllm_medusa_ports.quant.calibrate")  # not loaded: nothing can be a Calibration yet
    return mod.Calibration if mod is not None else ()


def _fit_type():
    from trtllm_medusa_ports.heads import train

    return train.FitOptions


#: the types of these fields that the API exports under their own name (api.PromptInputs)
_API_TYPES = (PromptInputs,)
_PROMPTS = Spec("nested", flag=None, of=lambda: PromptInputs)
SPECS: dict[str, dict[str, Spec]] = {
    "ConvertOptions": dict(
        revision=_S(), chat_template=_CHAT,
        model_dir=_P(), medusa_model_dir=_P(), output_dir=_P(), dtype=_S(*_DTYPES), tp_size=_I(), pp_size=_I(),
        num_medusa_heads=_I(), num_medusa_layers=_I(), max_draft_len=_I(flag="--max_draft_len"), model_type=_S(),
        workers=_I(), use_parallel_embedding=_B, embedding_sharding_dim=_I(choices=(0, 1)), share_lm_head=_B,
        overwrite=_B, quiet=_B, allow_unsupported=_B, medusa_choices=_TREE, fast_path=Spec("bool", flag=None),
        fsync=_B, **_QUANT, calib_dataset=_P(), calib_size=_I(1), calib_max_seq_length=_I(1), tokenizer_dir=_P(),
        device=_S(), threads=_I(1), moe_ep_size=_I(),
        calibration=Spec("of", flag=None, of=_calibration_type)),
    "AddHeadsOptions": dict(
        base_checkpoint_dir=_P(), medusa_model_dir=_P(), output_dir=_P(), max_draft_len=_I(), overwrite=_B,
        dtype=_S(*_DTYPES), num_medusa_heads=_I(), num_medusa_layers=_I(), medusa_choices=_TREE, fsync=_B),
    "CheckOptions": dict(
        revision=_S(),
        model_dir=_P(), medusa_model_dir=_P(), medusa_choices=_TREE, tp_size=_I(), pp_size=_I(), max_draft_len=_I(),
        num_medusa_heads=_I(), dtype=_S(*_DTYPES), share_lm_head=_B, **_QUANT, max_batch_size=_I(1),
        max_seq_len=_I(1), gpu_memory_gb=_F(0), prompts=_PROMPTS, tokenizer_dir=_P(), threads=_I(1), quiet=_B),
    "VerifyOptions": dict(
        revision=_S(),
        model_dir=_P(), checkpoint_dir=_P(), medusa_choices=_TREE, prompts=_PROMPTS, tokenizer_dir=_P(),
        max_new_tokens=_I(), medusa_model_dir=_P(), max_quant_error=_F(0), threads=_I(1), quiet=_B,
        min_quant_agreement=_F(0, hi=1, none=True), override_medusa_choices=_B, skip_tree_proof=_B, gemm_plugin=_S("auto", "fp8"), calib_dataset=_P(), calib_size=_I(1),
        calib_max_seq_length=_I(1), accept_unchecked_scales=_B, streaming=Spec("bool", none=True),
        max_memory=_F(0, lo_excluded=True), device=_S(), offload_dir=_P()),
    "TrainOptions": dict(
        revision=_S(), chat_template=_CHAT,
        model_dir=_P(), output_dir=_P(), prompts=_PROMPTS, tokenizer_dir=_P(), new_tokens=_I(1, 1 << 16),
        dtype=_S("auto", "float32", "bfloat16", "float16"), work_dir=_P(), resume=_B, overwrite=_B, device=_S(),
        fit=Spec("nested", flag=None, of=_fit_type), stop_after=_I(flag=None), threads=_I(1),
        device_map=_S("auto"), dist_timeout=_I(1), streaming=Spec("bool", none=True), max_memory=_F(0, lo_excluded=True),
        offload_dir=_P()),
    "FitOptions": dict(
        num_heads=_I(1, 64), num_layers=_I(1, 64), steps=_I(1), lr=_F(0, lo_excluded=True), batch_size=_I(1, none=True),
        share_lm_head=_B, seed=_I(), schedule=_S("cosine", "constant", flag=None), warmup=_F(0, flag=None),
        weight_decay=_F(0, flag=None), full_vocab=_B, negatives=_I(), distill=_F(), save_every=_I(1),
        matmul_dtype=_S("auto", "float32", "bfloat16", flag="--fit_dtype"), quiet=_B, heldout_fraction=_F(0, below=1),
        corpus=_S(flag=None)),
    "TuneOptions": dict(
        revision=_S(), chat_template=_CHAT,
        model_dir=_P(), medusa_model_dir=_P(), output=_P(), prompts=_PROMPTS, tokenizer_dir=_P(),
        new_tokens=_I(1, 1 << 16), max_nodes=_I(1, 4096), max_draft_len=_I(1, 4096), top_k=_I(1, 1000),
        estimate=_S("product", "joint"), baseline=_S(none=True), overwrite=_B, threads=_I(1), quiet=_B),
    "TreeOptions": dict(choices=_TREE, num_heads=_I(), max_draft_len=_I(), top_k=_I()),
    "BuildOptions": dict(checkpoint_dir=_P(), args=_STRS, allow_unsupported=_B),
    "DeployOptions": dict(
        checkpoint_dir=_P(), tokenizer_dir=_P(), output_dir=_P(), engine_dir=_P(), medusa_choices=_TREE,
        override_medusa_choices=_B, max_batch_size=_I(1), max_input_len=_I(1), max_seq_len=_I(1), gpu_memory_gb=_F(0),
        overwrite=_B),
    "PromptInputs": dict(prompt=_STRS, prompts_file=_P(), prompt_ids=Spec("ids"), data=_P()),
    "inspect_heads": dict(path=_P(flag=None), data_check=Spec("bool", flag="--no_data_check")),
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
        t = s.of()
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
        if not (_is_int(v) if s.kind == "int" else (_is_int(v) or isinstance(v, float))):
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
        return isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) and all(map(_is_int, p)) for p in v)
    t = s.of()
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
