"""The Python API: every ``trtllm-medusa`` command as a function a pipeline calls (docs/api.md).

Each function takes one options dataclass, whose fields and defaults are the command's flags, and
returns a result dataclass whose ``to_dict()`` is exactly what the command prints with ``--json``
(and whose ``render()`` is its text output). The command line (cli.py) parses flags into these
options, calls these functions and prints; it adds nothing else.

Every problem with the inputs raises :class:`~trtllm_medusa_ports.errors.PortError` (or a subclass)
carrying ``rule`` (the check rule id, where a rule refused), ``where`` (the file, tensor or field),
``what`` and ``fix``; nothing is left half-written when one is raised. A failed *verification* is a
result, not an error: ``VerifyReport.ok`` is False.

    from trtllm_medusa_ports import api
    res = api.convert(api.ConvertOptions(model_dir=..., medusa_model_dir=..., output_dir=...))
    report = api.verify(api.VerifyOptions(model_dir=..., checkpoint_dir=res.output_dir))

Names exported here are the promised surface; everything else in the package may change.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports.compat import Finding
from trtllm_medusa_ports.convert import ConvertOptions as _ConvertOptions
from trtllm_medusa_ports.convert import ConvertResult
from trtllm_medusa_ports.errors import CheckpointError, ConversionError, PortError, TreeError
from trtllm_medusa_ports.files.prompts import PromptInputs
from trtllm_medusa_ports.tree import MedusaTree

#: defined with the training (heads/train.py, which imports torch): read from there when first asked for, so that
#: importing the API stays torch-free for the commands that need no torch (a float or weight-only convert)
_TRAINING = ("TrainOptions", "FitOptions", "TrainResult")


_training: dict = {}


def __getattr__(name: str):
    if name in _TRAINING:
        if not _training:
            _training.update(_training_types())
        return _training[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _training_types() -> dict:
    """train-heads' options with the command's defaults (4 heads, --distill 0.5, progress shown)."""
    from trtllm_medusa_ports.heads import train

    @dataclass
    class FitOptions(train.FitOptions):
        __doc__ = ("How the heads are fitted; the defaults are train-heads' flags (``matmul_dtype`` ``auto``: bfloat16 "
                   "where the device computes it fast, float32 elsewhere).")
        num_heads: int = 4
        distill: float = 0.5
        quiet: bool = False
        matmul_dtype: str = "auto"

    @dataclass
    class TrainOptions(train.TrainOptions):
        __doc__ = ("train-heads: ``model_dir`` and ``output_dir``, what to train on (``prompts``), how to fit "
                   "(``fit``); the defaults are the command's flags.")
        fit: train.FitOptions = field(default_factory=FitOptions)
        dtype: str = "auto"

    for cls in (FitOptions, TrainOptions):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return {"FitOptions": FitOptions, "TrainOptions": TrainOptions, "TrainResult": train.TrainResult}

__all__ = [
    "PortError", "PromptInputs", "MedusaTree", "Finding",
    "ConvertOptions", "ConvertResult", "convert",
    "AddHeadsOptions", "AddHeadsResult", "add_heads",
    "CheckOptions", "CheckResult", "check",
    "VerifyOptions", "verify",
    "TrainOptions", "FitOptions", "TrainResult", "train_heads",  # noqa: F822  (module __getattr__)
    "TuneOptions", "TuneTreeResult", "tune_tree",
    "TreeOptions", "TreeResult", "tree",
    "HeadsInfo", "inspect_heads",
    "BuildOptions", "BuildResult", "build",
    "default_threads",
]


from trtllm_medusa_ports.threads import default_threads, torch_threads  # noqa: E402


# -- input validation (docs/api.md "Input validation") ----------------------------------------------
#: every API function checks its options against these specs before any work, so that a wrong type or an
#: out-of-range value is refused at the boundary (naming ``Class.field``) instead of failing deep inside.
#: A field may be None only where its default is None (or its spec says ``none=True``); ranges are the flags'
#: ``_int_in`` / ``_non_negative`` / ``_fraction`` ranges (cli.py); a plain ``type=int`` flag is checked for its
#: type only, its value by the rule that judges it (a tp_size of 0 by rule parallel-size, ...).
@dataclass(frozen=True)
class _Spec:
    kind: str  # path, int, float, bool, str, tree, list, ids, of, nested
    lo: float | None = None
    hi: float | None = None
    below: float | None = None  # exclusive upper bound
    choices: tuple | None = None
    none: bool = False  # None accepted although the default is not None
    flag: str | None = ""  # the flag spelling ("": --<field>; None: no flag)
    of: object = None  # kind "of" / "nested": a zero-argument callable returning the accepted type


def _P(**kw) -> _Spec:
    return _Spec("path", **kw)


def _I(lo: int | None = None, hi: int | None = None, **kw) -> _Spec:
    return _Spec("int", lo=lo, hi=hi, **kw)


def _F(lo: float | None = None, **kw) -> _Spec:
    return _Spec("float", lo=lo, **kw)


def _S(*choices: str, **kw) -> _Spec:
    return _Spec("str", choices=choices or None, **kw)


_B, _TREE, _STRS = _Spec("bool"), _Spec("tree"), _Spec("list")
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


_PROMPTS = _Spec("nested", flag=None, of=lambda: PromptInputs)
_SPECS: dict[str, dict[str, _Spec]] = {
    "ConvertOptions": dict(
        model_dir=_P(), medusa_model_dir=_P(), output_dir=_P(), dtype=_S(*_DTYPES), tp_size=_I(), pp_size=_I(),
        num_medusa_heads=_I(), num_medusa_layers=_I(), max_draft_len=_I(flag="--max_draft_len"), model_type=_S(),
        workers=_I(), use_parallel_embedding=_B, embedding_sharding_dim=_I(choices=(0, 1)), share_lm_head=_B,
        overwrite=_B, quiet=_B, allow_unsupported=_B, medusa_choices=_TREE, fast_path=_Spec("bool", flag=None),
        fsync=_B, **_QUANT, calib_dataset=_P(), calib_size=_I(1), calib_max_seq_length=_I(1), tokenizer_dir=_P(),
        device=_S(), threads=_I(1), moe_ep_size=_I(),
        calibration=_Spec("of", flag=None, of=_calibration_type)),
    "AddHeadsOptions": dict(
        base_checkpoint_dir=_P(), medusa_model_dir=_P(), output_dir=_P(), max_draft_len=_I(), overwrite=_B,
        dtype=_S(*_DTYPES), num_medusa_heads=_I(), num_medusa_layers=_I(), medusa_choices=_TREE, fsync=_B),
    "CheckOptions": dict(
        model_dir=_P(), medusa_model_dir=_P(), medusa_choices=_TREE, tp_size=_I(), pp_size=_I(), max_draft_len=_I(),
        num_medusa_heads=_I(), dtype=_S(*_DTYPES), share_lm_head=_B, **_QUANT, max_batch_size=_I(1),
        max_seq_len=_I(1), gpu_memory_gb=_F(0), prompts=_PROMPTS, tokenizer_dir=_P(), threads=_I(1), quiet=_B),
    "VerifyOptions": dict(
        model_dir=_P(), checkpoint_dir=_P(), medusa_choices=_TREE, prompts=_PROMPTS, tokenizer_dir=_P(),
        max_new_tokens=_I(), medusa_model_dir=_P(), max_quant_error=_F(0), threads=_I(1), quiet=_B,
        skip_tree_proof=_B, gemm_plugin=_S("auto", "fp8"), calib_dataset=_P(), calib_size=_I(1),
        calib_max_seq_length=_I(1), accept_unchecked_scales=_B, streaming=_Spec("bool", none=True),
        max_memory=_F(0), device=_S(), offload_dir=_P()),
    "TrainOptions": dict(
        model_dir=_P(), output_dir=_P(), prompts=_PROMPTS, tokenizer_dir=_P(), new_tokens=_I(1, 1 << 16),
        dtype=_S("auto", "float32", "bfloat16", "float16"), work_dir=_P(), resume=_B, overwrite=_B, device=_S(),
        fit=_Spec("nested", flag=None, of=_fit_type), stop_after=_I(flag=None), threads=_I(1),
        device_map=_S("auto"), dist_timeout=_I(1)),
    "FitOptions": dict(
        num_heads=_I(1, 64), num_layers=_I(1, 64), steps=_I(1), lr=_F(), batch_size=_I(1, none=True),
        share_lm_head=_B, seed=_I(), schedule=_S("cosine", "constant", flag=None), warmup=_F(0, flag=None),
        weight_decay=_F(0, flag=None), full_vocab=_B, negatives=_I(), distill=_F(), save_every=_I(1),
        matmul_dtype=_S("auto", "float32", "bfloat16", flag="--fit_dtype"), quiet=_B, heldout_fraction=_F(0, below=1)),
    "TuneOptions": dict(
        model_dir=_P(), medusa_model_dir=_P(), output=_P(), prompts=_PROMPTS, tokenizer_dir=_P(),
        new_tokens=_I(1, 1 << 16), max_nodes=_I(1, 4096), max_draft_len=_I(1, 4096), top_k=_I(1, 1000),
        estimate=_S("product", "joint"), baseline=_S(none=True), overwrite=_B, threads=_I(1), quiet=_B),
    "TreeOptions": dict(choices=_TREE, num_heads=_I(), max_draft_len=_I(), top_k=_I()),
    "BuildOptions": dict(checkpoint_dir=_P(), args=_STRS, allow_unsupported=_B),
    "PromptInputs": dict(prompt=_STRS, prompts_file=_P(), prompt_ids=_Spec("ids"), data=_P()),
    "inspect_heads": dict(path=_P(flag=None), data_check=_Spec("bool", flag="--no_data_check")),
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _expected(s: _Spec) -> str:
    """What a field of this spec accepts, in words."""
    if s.kind == "int" or s.kind == "float":
        text = "an integer" if s.kind == "int" else "a number"
        if s.choices:
            return f"{text}, one of {', '.join(map(str, s.choices))}"
        if s.lo is not None and s.hi is not None:
            return f"{text} in {s.lo}..{s.hi}"
        if s.lo is not None:
            return f"{text} >= {s.lo}" + (f" and below {s.below}" if s.below is not None else "")
        return text
    if s.kind == "str" and s.choices:
        return f"one of {', '.join(map(repr, s.choices))}"
    if s.kind in ("of", "nested"):
        t = s.of()
        if isinstance(t, type) and globals().get(t.__name__) is t:  # a type the API exports
            return f"a {t.__name__} (api.{t.__name__})"
        # a type of a module below (quant.calibrate.Calibration), loaded or not yet: one spelling either way
        return "a " + (f"{t.__module__.removeprefix('trtllm_medusa_ports.')}.{t.__qualname__}"
                       if isinstance(t, type) else "quant.calibrate.Calibration")
    return {"path": "a path (str or os.PathLike)", "bool": "a bool (True or False)", "str": "a string",
            "tree": "a medusa_choices tree: a preset name, @file or JSON text (str), or a list of paths",
            "list": "a list of strings", "ids": "a list of token-id lists (lists of int)"}[s.kind]


def _accepts(s: _Spec, v) -> bool:
    if s.kind == "path":
        return isinstance(v, (str, os.PathLike)) and str(v) != ""
    if s.kind in ("int", "float"):
        if not (_is_int(v) if s.kind == "int" else (_is_int(v) or isinstance(v, float))):
            return False
        return (v == v and (s.lo is None or v >= s.lo) and (s.hi is None or v <= s.hi)  # v == v: not NaN
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


def _check_fields(owner: str, values: dict, defaults: dict, error: type[PortError], label: str | None = None) -> None:
    """Raise ``error`` for the first value its spec (``_SPECS[owner]``) refuses, its ``where`` ``label.field``
    (``label``: the owner, or the path to a nested option such as ``TrainOptions.fit``); nested options too."""
    import math

    specs, label = _SPECS[owner], label or owner
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
                        where=f"{label}.{name}", fix=f"give {label}.{name} {_expected(s)}{none}{told}")
        if s.kind == "nested":
            _validate(v, error, f"{label}.{name}")


def _validate(opts, error: type[PortError] = PortError, where: str | None = None) -> None:
    """Check an options dataclass against its spec (the first class of its MRO that ``_SPECS`` names)."""
    owner = next((c.__name__ for c in type(opts).__mro__ if c.__name__ in _SPECS), None)
    if owner is None or not dataclasses.is_dataclass(opts):
        raise error(f"{opts!r} ({type(opts).__name__}) is not an options dataclass of trtllm_medusa_ports.api",
                    where=where or "options", fix="build the options with the api's classes, e.g. api.ConvertOptions(...)")
    values = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    defaults = {f.name: f.default for f in dataclasses.fields(opts) if f.default is not dataclasses.MISSING}
    _check_fields(owner, values, defaults, error, where)


def _validate_options(opts, cls_name: str, error: type[PortError] = PortError) -> None:
    """The function's options: an instance of its class (by name; TrainOptions is made lazily), then its fields."""
    if not any(c.__name__ == cls_name for c in type(opts).__mro__) or not dataclasses.is_dataclass(opts):
        raise error(f"{opts!r} ({type(opts).__name__}) is not a {cls_name}", where=cls_name,
                    fix=f"pass api.{cls_name}(...)")
    _validate(opts, error)


def _ids(prompts: PromptInputs, model_dir: Path, tokenizer_dir: Path | None) -> list[list[int]] | None:
    """Token ids of the given prompts (text through the tokenizer), or None when none were given."""
    from trtllm_medusa_ports.files.prompts import lazy_tokenizer, read_items

    items = read_items(prompts, lazy_tokenizer(tokenizer_dir or model_dir))
    return None if items is None else [it.ids for it in items]


# -- convert ------------------------------------------------------------------------------------
@dataclass
class ConvertOptions(_ConvertOptions):
    """``trtllm-medusa convert``'s options (convert.ConvertOptions) with the command's defaults: ``--dtype float16``
    (upstream's Medusa script's), ``--output_dir tllm_checkpoint``."""

    output_dir: Path = Path("tllm_checkpoint")
    dtype: str = "float16"


def convert(opts: ConvertOptions) -> ConvertResult:
    """``trtllm-medusa convert``: a Hugging Face base and its Medusa heads -> a TensorRT-LLM checkpoint."""
    from trtllm_medusa_ports.convert import convert as _convert
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    _validate_options(opts, "ConvertOptions", ConversionError)
    if opts.calib_dataset is not None:  # never write where the calibration text lives
        guard_output_dir(Path(opts.output_dir), {"--calib_dataset": Path(opts.calib_dataset)})
    unused = _check_calibration_flags(opts)
    res = _convert(opts)
    record = (res.config.get("medusa_ports") or {}).get("calibration") or {}
    res.warnings[:0] = unused + list(record.get("notes") or [])  # samples cut at the base's context
    return res


#: convert's flags of the calibration pass, with their defaults
_CALIBRATION_FLAGS = (("--calib_dataset", "calib_dataset", None), ("--calib_size", "calib_size", 512),
                      ("--calib_max_seq_length", "calib_max_seq_length", 512),
                      ("--tokenizer_dir", "tokenizer_dir", None), ("--device", "device", "cpu"),
                      ("--threads", "threads", None))


def _check_calibration_flags(opts: ConvertOptions) -> list[str]:
    """The warning for calibration flags set on a conversion that runs no calibration (a float or weight-only
    format, or a given ``ConvertOptions.calibration``): never ignored in silence. A path among them that does not
    exist is an error (a typo would otherwise pass unseen). Where a calibration runs, ``--device`` is checked by
    computing on it (devices.check_device) before anything is read."""
    from trtllm_medusa_ports.quant import spec_from_flags

    spec = spec_from_flags(opts)
    if spec.needs_calibration and opts.calibration is None:
        from trtllm_medusa_ports.devices import check_device

        check_device(opts.device, "--device", ConversionError)
        return []
    given = [flag for flag, name, default in _CALIBRATION_FLAGS if getattr(opts, name) != default]
    for flag, name in (("--calib_dataset", "calib_dataset"), ("--tokenizer_dir", "tokenizer_dir")):
        path = getattr(opts, name)
        if path is not None and not Path(path).exists():
            raise ConversionError(f"{flag}: no such file or directory (and nothing is calibrated: the flag does not "
                                  "apply)", where=str(path), fix=f"drop {flag}, or correct the path")
    if not given:
        return []
    if spec.needs_calibration:
        why = "ConvertOptions.calibration is given and used as it is"
    elif spec.weight_only:
        why = (f"weight-only {spec.quant_algo} calibrates nothing (TensorRT-LLM quantizes the weights at load, from "
               "the weights alone)")
    else:
        why = "a float checkpoint calibrates nothing"
    return [f"{', '.join(given)}: ignored, {why}; drop {'it' if len(given) == 1 else 'them'}, or calibrate with "
            "--qformat fp8 or --kv_cache_dtype fp8 / int8"]


@dataclass
class AddHeadsOptions:
    """``convert --base_checkpoint_dir``: heads added to a TensorRT-LLM checkpoint NVIDIA's tools quantized. The base
    keeps its dtype, quantization and mapping: ``dtype`` None or ``"auto"`` means the base's, and another is refused
    (``quant.prequantized.FlagConflict``); the rest is checked as ``convert`` checks it."""

    base_checkpoint_dir: Path
    medusa_model_dir: Path
    output_dir: Path = Path("tllm_checkpoint")
    max_draft_len: int = 63
    overwrite: bool = False
    dtype: str | None = None
    num_medusa_heads: int | None = None
    num_medusa_layers: int | None = None
    medusa_choices: str | None = None
    fsync: bool = False


@dataclass
class AddHeadsResult:
    output_dir: Path
    config: dict
    warnings: list[str] = field(default_factory=list)
    text: str = ""

    def to_dict(self) -> dict:
        return {"output_dir": str(self.output_dir), "config": self.config}

    def render(self) -> str:
        return self.text


def add_heads(opts: AddHeadsOptions) -> AddHeadsResult:
    from trtllm_medusa_ports.quant.prequantized import add_heads as _add

    _validate_options(opts, "AddHeadsOptions", ConversionError)
    res = _add(Path(opts.base_checkpoint_dir), Path(opts.medusa_model_dir), Path(opts.output_dir),
               max_draft_len=opts.max_draft_len, overwrite=opts.overwrite, dtype=opts.dtype,
               num_medusa_heads=opts.num_medusa_heads, num_medusa_layers=opts.num_medusa_layers,
               medusa_choices=opts.medusa_choices, fsync=opts.fsync)
    return AddHeadsResult(res.output_dir, res.config, list(res.warnings), res.summary())


# -- check --------------------------------------------------------------------------------------
@dataclass
class CheckOptions:
    """``trtllm-medusa check``: what TensorRT-LLM 1.2 serves for this base (heads, tree, parallelism, quantization)."""

    model_dir: Path
    medusa_model_dir: Path | None = None
    medusa_choices: str | None = None
    tp_size: int = 1
    pp_size: int = 1
    max_draft_len: int = 63
    num_medusa_heads: int | None = None
    dtype: str | None = None
    share_lm_head: bool = False
    qformat: str | None = None
    use_weight_only: bool = False
    weight_only_precision: str | None = None
    kv_cache_dtype: str | None = None
    int8_kv_cache: bool = False
    #: the memory plan's serving sizes (None: not judged)
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    gpu_memory_gb: float | None = None
    #: prompts to measure the activation range on (rule float16-range); none: not measured
    prompts: PromptInputs = field(default_factory=PromptInputs)
    tokenizer_dir: Path | None = None
    threads: int | None = None
    quiet: bool = False


@dataclass
class CheckResult:
    compatible: bool
    architecture: str | None
    findings: list[Finding]
    memory: object = None  # memory.MemoryPlan, or None where the inputs give none
    fit: dict = field(default_factory=dict)  # the serving sizes the plan is judged at

    def to_dict(self) -> dict:
        return {"compatible": self.compatible, "architecture": self.architecture,
                "findings": [f.to_dict() for f in self.findings],
                "memory": self.memory.to_dict(**self.fit) if self.memory else None}

    def render(self) -> str:
        lines = [f"architecture: {self.architecture}"]
        width = max((len(f.rule) for f in self.findings), default=0)
        for f in self.findings:
            lines.append(f"{f.severity.upper():8s} {f.rule:{width}s}  {f.message}")
            lines.append(f"{'':8s} {'':{width}s}  fix: {f.fix}")
        if self.memory:
            lines.append(self.memory.render(**self.fit))
        lines.append("COMPATIBLE" if self.compatible else "NOT COMPATIBLE")
        return "\n".join(lines)


def _memory_plan(opts: CheckOptions):
    """The memory plan of what check was asked about, or None where the inputs cannot give one (the findings
    say why)."""
    from trtllm_medusa_ports.convert import plan_layout
    from trtllm_medusa_ports.memory import memory_plan

    try:
        copts = ConvertOptions(model_dir=Path(opts.model_dir),
                               medusa_model_dir=Path(opts.medusa_model_dir) if opts.medusa_model_dir else None,
                               output_dir=Path("unused"), dtype=opts.dtype or "float16", tp_size=opts.tp_size,
                               pp_size=opts.pp_size, max_draft_len=opts.max_draft_len or 63,
                               share_lm_head=opts.share_lm_head, qformat=opts.qformat,
                               use_weight_only=opts.use_weight_only, weight_only_precision=opts.weight_only_precision,
                               kv_cache_dtype=opts.kv_cache_dtype, int8_kv_cache=opts.int8_kv_cache)
        return memory_plan(*plan_layout(copts))
    except (PortError, ValueError, KeyError, ZeroDivisionError, RuntimeError):
        return None


def _position_range(opts: CheckOptions) -> list:
    """Learned-position bases: ``--max_seq_len`` and the tree's depth against the position table."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.compat import learned_position_range
    from trtllm_medusa_ports.files.hf_model import HFConfig
    from trtllm_medusa_ports.tree import MedusaTree, resolve_choices

    try:
        hf = HFConfig.read(opts.model_dir)
        adapter = adapter_for(hf.architecture)
        heads = opts.num_medusa_heads or 4
        paths, _ = resolve_choices(opts.medusa_choices or "mc_sim_7b_63", heads)
        depth = MedusaTree.from_spec(paths, num_heads=heads).depth
        return learned_position_range(hf, adapter, opts.max_seq_len, depth)
    except PortError:  # the base and tree rules already report an unreadable config or tree
        return []


def check(opts: CheckOptions) -> CheckResult:
    from trtllm_medusa_ports.compat import activation_range_finding, errors_of, serving_findings
    from trtllm_medusa_ports.compat import check as _check
    from trtllm_medusa_ports.quant import spec_from_flags

    _validate_options(opts, "CheckOptions")
    spec = spec_from_flags(opts)
    arch, findings = _check(opts.model_dir, opts.medusa_model_dir, medusa_choices=opts.medusa_choices,
                            tp_size=opts.tp_size, pp_size=opts.pp_size, max_draft_len=opts.max_draft_len,
                            dtype=opts.dtype, num_medusa_heads=opts.num_medusa_heads, quantization=spec)
    findings += _position_range(opts)
    plan = _memory_plan(opts)
    prompts = _ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir)
    if prompts:
        import sys

        from trtllm_medusa_ports.verify import measure_activation_range

        if not opts.quiet:
            print(f"check: measuring the activation range on {len(prompts)} prompt(s) with transformers",
                  file=sys.stderr, flush=True)
        with torch_threads(opts.threads):
            findings.append(activation_range_finding(*measure_activation_range(opts.model_dir, prompts), opts.dtype))
    fit = dict(batch=opts.max_batch_size, seq_len=opts.max_seq_len, gpu_memory_gb=opts.gpu_memory_gb)
    findings += serving_findings(plan.to_dict(**fit) if plan else None, opts.max_seq_len, opts.gpu_memory_gb)
    return CheckResult(not errors_of(findings), arch, findings, plan, fit)


# -- verify -------------------------------------------------------------------------------------
@dataclass
class VerifyOptions:
    """``trtllm-medusa verify``: logits parity, heads parity and greedy equivalence of a checkpoint (CPU or GPU)."""

    model_dir: Path
    checkpoint_dir: Path
    medusa_choices: str | None = None  # default: mc_sim_7b_63 cut to the heads' depth
    prompts: PromptInputs = field(default_factory=PromptInputs)  # none: a few prompts of ids
    tokenizer_dir: Path | None = None
    max_new_tokens: int = 32
    medusa_model_dir: Path | None = None  # default: the path recorded at conversion
    max_quant_error: float | None = None
    threads: int | None = None
    quiet: bool = False
    skip_tree_proof: bool = False  # the tree proof (every node accepted with greedy's own drafts) is on by default
    gemm_plugin: str = "auto"  # FP8 checkpoints: the --gemm_plugin the engine is built with (auto or fp8)
    #: a tool's quantized checkpoint (no calibration recorded): the samples it was calibrated on, so that its
    #: activation / KV scales are re-derived; otherwise they fail verify unless accept_unchecked_scales
    calib_dataset: Path | None = None
    calib_size: int | None = None  # default: every sample of calib_dataset
    calib_max_seq_length: int = 512
    accept_unchecked_scales: bool = False
    #: memory (verify/mode.py): True streams both sides one layer at a time, False holds each whole, None chooses
    #: streaming where the in-memory estimate exceeds max_memory (GB; default: the memory available)
    streaming: bool | None = None
    max_memory: float | None = None
    device: str = "cpu"  # cpu, cuda or cuda:N: where both sides compute
    offload_dir: Path | None = None  # streaming: where transformers' weights wait (default: the temporary directory)


def verify(opts: VerifyOptions):
    """A :class:`~trtllm_medusa_ports.verify.VerifyReport` (``ok``, ``to_dict()``, ``render()``)."""
    from trtllm_medusa_ports.verify import verify as _verify

    _validate_options(opts, "VerifyOptions")
    prompts = _ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir)
    return _verify(opts.model_dir, opts.checkpoint_dir, medusa_choices=opts.medusa_choices, prompts=prompts,
                   max_new_tokens=opts.max_new_tokens, quiet=opts.quiet, medusa_model_dir=opts.medusa_model_dir,
                   threads=opts.threads, max_quant_error=opts.max_quant_error, skip_tree_proof=opts.skip_tree_proof,
                   gemm_plugin=opts.gemm_plugin, calibration=_tool_calibration(opts),
                   accept_unchecked_scales=opts.accept_unchecked_scales, streaming=opts.streaming,
                   max_memory=opts.max_memory, device=opts.device, offload_dir=opts.offload_dir)


def _tool_calibration(opts: VerifyOptions) -> list[list[int]] | None:
    """The calibration samples given for a tool's checkpoint (token ids), or None."""
    if opts.calib_dataset is None:
        return None
    from trtllm_medusa_ports.quant.calibrate import read_calibration_samples

    samples, _ = read_calibration_samples(opts.calib_dataset, Path(opts.model_dir), size=opts.calib_size,
                                          max_seq_length=opts.calib_max_seq_length, tokenizer_dir=opts.tokenizer_dir)
    return samples


# -- train-heads ----------------------------------------------------------------------------------
def train_heads(opts):
    """``trtllm-medusa train-heads`` (:class:`TrainOptions` -> :class:`TrainResult`)."""
    # Raises heads.train.TrainingInterrupted (a KeyboardInterrupt) when stopped by a signal; the saved state
    # continues with resume=True. Under torchrun every rank calls it with the same options (heads/distributed.py);
    # rank 0 writes, the others return the same result.
    from trtllm_medusa_ports.heads.train import train

    _validate_options(opts, "TrainOptions")
    threads = opts.threads
    ranks_here = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if threads is None and ranks_here.isdigit() and int(ranks_here) > 1:  # the idle cores shared by this node's ranks
        threads = max(1, default_threads() // int(ranks_here))
    with torch_threads(threads):
        return train(opts)


# -- tune-tree ------------------------------------------------------------------------------------
@dataclass
class TuneOptions:
    """``trtllm-medusa tune-tree``: a medusa_choices tree from the heads' measured accuracy."""

    model_dir: Path
    medusa_model_dir: Path
    output: Path | None = None  # the choices file to write (None: not written)
    prompts: PromptInputs = field(default_factory=PromptInputs)  # none: the packaged held-out prompts
    tokenizer_dir: Path | None = None
    new_tokens: int = 64
    max_nodes: int = 63
    max_draft_len: int = 63
    top_k: int = 10
    estimate: str = "product"
    baseline: str | None = "mc_sim_7b_63"
    overwrite: bool = False
    threads: int | None = None
    quiet: bool = False


@dataclass
class TuneTreeResult:
    output: Path | None
    result: object  # tune.TuneResult

    @property
    def paths(self) -> list[list[int]]:
        return self.result.paths

    @property
    def unused_heads(self) -> list[int]:
        """Heads no node of the tree reads (the engine computes them anyway)."""
        depth = max(map(len, self.result.paths), default=0)
        return list(range(depth, len(self.result.accuracy)))

    @property
    def notes(self) -> list[str]:
        """What a user should know beside the tree (the command prints these on stderr)."""
        if not self.unused_heads:
            return []
        depth = max(map(len, self.result.paths))
        return [f"the tree uses {depth} of the {len(self.result.accuracy)} heads: heads {self.unused_heads[0]}.."
                f"{self.unused_heads[-1]} are computed by the engine but no tree node reads them"]

    def to_dict(self) -> dict:
        return {"output": str(self.output) if self.output else None, **self.result.to_dict(),
                "unused_heads": self.unused_heads, "notes": self.notes}

    def render(self) -> str:
        import io

        from trtllm_medusa_ports.tune import print_table

        res, buf = self.result, io.StringIO()
        print(f"measured on {res.positions} positions; each head's cumulative top-k accuracy:", file=buf)
        print_table(res.accuracy, file=buf)
        depth = max(map(len, res.paths))
        where = f" -> {self.output} (use it as --medusa_choices @{self.output})" if self.output else ""
        print(f"tree: {len(res.paths)} nodes, depth {depth}{where}", file=buf)
        print(f"predicted tokens per step: {res.predicted_tokens_per_step:.2f} ({res.estimate} estimate); "
              f"on the measured text: {res.measured_on_text:.2f}", file=buf)
        if res.baseline:
            b = res.baseline
            print(f"{b['name']} ({b['num_nodes']} nodes at the heads' depth): predicted "
                  f"{b['predicted_tokens_per_step']:.2f}, on the measured text: {b['acceptance_on_measured_text']:.2f}",
                  file=buf)
        return buf.getvalue().rstrip("\n")


def tune_tree(opts: TuneOptions) -> TuneTreeResult:
    from trtllm_medusa_ports.tune import tune, write_choices

    _validate_options(opts, "TuneOptions")
    if opts.output is not None:
        out = Path(opts.output).resolve()
        inputs = {"--model_dir": opts.model_dir, "--medusa_model_dir": opts.medusa_model_dir,
                  "--tokenizer_dir": opts.tokenizer_dir, **opts.prompts.paths()}
        for flag, src in inputs.items():
            s = Path(src).resolve() if src else None
            if s is not None and (out == s or s in out.parents):  # never write over or into an input
                raise PortError(f"--output {opts.output} is {'the input' if out == s else 'inside the input'} {flag}",
                                where=str(opts.output),
                                fix=f"write the tree outside {flag}, e.g. --output ./tree.json")
    ids = _ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir)
    with torch_threads(opts.threads):
        res = tune(opts.model_dir, opts.medusa_model_dir, prompt_ids=ids, tokenizer_dir=opts.tokenizer_dir,
                   max_nodes=opts.max_nodes, max_draft_len=opts.max_draft_len, top_k=opts.top_k,
                   new_tokens=opts.new_tokens, estimate=opts.estimate, baseline=opts.baseline or None,
                   quiet=opts.quiet)
    if opts.output is not None:
        write_choices(res.paths, opts.output, overwrite=opts.overwrite)
    return TuneTreeResult(Path(opts.output) if opts.output is not None else None, res)


# -- tree -----------------------------------------------------------------------------------------
@dataclass
class TreeOptions:
    """``trtllm-medusa tree``: a medusa_choices tree (preset, @file or JSON list) and TensorRT-LLM's buffers."""

    choices: str
    num_heads: int | None = None
    max_draft_len: int | None = None
    top_k: int = 10


@dataclass
class TreeResult:
    tree: MedusaTree
    notes: list[str] = field(default_factory=list)  # what was done to the input (a preset pruned)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**self.tree.to_dict(), "warnings": self.warnings}

    def render(self, draw: bool = False) -> str:
        if draw:
            from trtllm_medusa_ports.tune import draw as draw_tree

            lines = [draw_tree(self.tree)]
        else:
            d = self.tree.to_dict()
            lines = [f"nodes: {d['num_nodes']} (+ root), depth: {d['depth']}, top-k per depth: {d['medusa_topks']}",
                     f"position_offsets: {d['position_offsets']}", f"leaf paths: {len(d['paths_indices'])}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def tree(opts: TreeOptions) -> TreeResult:
    from trtllm_medusa_ports.tree import resolve_choices, upstream_quirks

    _validate_options(opts, "TreeOptions", TreeError)
    paths, pruned = resolve_choices(opts.choices, opts.num_heads)
    t = MedusaTree.from_spec(paths, top_k=opts.top_k, num_heads=opts.num_heads, max_draft_len=opts.max_draft_len)
    return TreeResult(t, [pruned] if pruned else [], upstream_quirks([list(p) for p in t.paths]))


# -- inspect-heads --------------------------------------------------------------------------------
@dataclass
class HeadsInfo:
    summary: dict
    heads: object = None  # heads.MedusaHeads (lazy tensors)

    def to_dict(self) -> dict:
        """One type per key: ``vocab_size`` is the heads' own vocabulary (an int) or None where they have none
        (heads projecting with the base lm_head); ``vocab_size_note`` says why it is None (else None)."""
        d = dict(self.summary)
        v = d.get("vocab_size")
        note = None
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool)):
            note, v = str(v), None
        elif v is None and d.get("shares_base_lm_head"):
            note = "the base's (the heads use its lm_head)"
        d["vocab_size"] = v
        out = {}
        for k, val in d.items():  # the note right after the size it explains
            out[k] = val
            if k == "vocab_size":
                out["vocab_size_note"] = note
        return out

    def render(self) -> str:
        d = self.to_dict()
        note = d.pop("vocab_size_note")
        if note is not None:
            d["vocab_size"] = note  # the text output says it in words
        lines = [f"{k:22s}: {v}" for k, v in d.items() if k != "warnings"]
        return "\n".join(lines + [f"warning: {w}" for w in d["warnings"]])


def inspect_heads(path: str | Path, *, data_check: bool = True) -> HeadsInfo:
    """``trtllm-medusa inspect-heads``: a Medusa head checkpoint of any layout; ``data_check``: scan for NaN/Inf."""
    from trtllm_medusa_ports.errors import HeadsError
    from trtllm_medusa_ports.heads import load_heads

    _check_fields("inspect_heads", {"path": path, "data_check": data_check}, {"data_check": True}, HeadsError)
    heads = load_heads(path)
    if data_check:
        heads.check_finite()
    return HeadsInfo(heads.summary(), heads)


# -- build ----------------------------------------------------------------------------------------
@dataclass
class BuildOptions:
    """``trtllm-medusa build``: ``trtllm-build`` with this project's architectures registered (needs tensorrt_llm
    1.2; not installable on CPU-only machines)."""

    checkpoint_dir: Path
    args: list[str] = field(default_factory=list)  # trtllm-build's own flags (--output_dir, --max_batch_size, ...)
    allow_unsupported: bool = False


@dataclass
class BuildResult:
    checkpoint_dir: Path
    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_dict(self) -> dict:
        return {"checkpoint_dir": str(self.checkpoint_dir), "returncode": self.returncode, "ok": self.ok}


def build(opts: BuildOptions) -> BuildResult:
    """Raises :class:`~trtllm_medusa_ports.errors.CheckpointError` for a missing or unreadable checkpoint and for
    one the build rules refuse (``rules`` names them); a failed ``trtllm-build`` is ``BuildResult.ok`` False."""
    from trtllm_medusa_ports.compat import ERROR
    from trtllm_medusa_ports.engine.build import checkpoint_findings, read_checkpoint_config
    from trtllm_medusa_ports.engine.build import main as build_main

    _validate_options(opts, "BuildOptions", CheckpointError)
    ckpt = Path(opts.checkpoint_dir)
    if not ckpt.is_dir():
        raise CheckpointError("no such checkpoint directory (no config.json)" if not ckpt.exists() else "not a directory",
                              where=str(ckpt), fix="pass the --output_dir of trtllm-medusa convert")
    cfg = read_checkpoint_config(ckpt)
    errors = [f for f in checkpoint_findings(cfg, ckpt / "config.json", opts.allow_unsupported)
              if f.severity == ERROR]
    if errors:
        raise CheckpointError("; ".join(f"[{f.rule}] {f.message}" for f in errors), where=str(ckpt / "config.json"),
                              fix="; ".join(dict.fromkeys(f.fix for f in errors)), rules=[f.rule for f in errors])
    rc = build_main(str(ckpt), list(opts.args), allow_unsupported=opts.allow_unsupported)
    return BuildResult(ckpt, rc)
