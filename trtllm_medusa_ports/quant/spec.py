"""Which quantization a checkpoint has and which of its tensors it touches: the formats' flags (upstream's spellings)
and ``QuantSpec``, the tensors weight-only and FP8 quantize (``exclude_modules`` matched as the build matches it),
the scale groups, the formats the reference executor emulates, a format's name in words. The facts are listed in
the package's doc (quant/__init__.py).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import ConversionError
from trtllm_medusa_ports.files.checkpoint import QUANTIZE_LAYERS_DEFAULT_EXCLUDE

if TYPE_CHECKING:
    pass


#: ``--qformat`` (examples/quantization/quantize.py names) -> quant_algo
QFORMATS = {"fp8": "FP8", "int8_wo": "W8A16", "int4_wo": "W4A16"}
#: ``--weight_only_precision`` (examples/medusa/convert_checkpoint.py) -> quant_algo
WEIGHT_ONLY_PRECISIONS = {"int8": "W8A16", "int4": "W4A16"}
#: ``--kv_cache_dtype`` -> kv_cache_quant_algo
KV_CACHE_DTYPES = {"fp8": "FP8", "int8": "INT8"}
#: tensorrt_llm/quantization/quantize.py quantize_layers' default exclusions, plus the Medusa heads, plus the
#: default of tensorrt_llm/models/convert_utils.py weight_only_quantize_dict (``*shared_expert_gate.weight``):
#: the written list replaces both defaults, and the load-time quantizer matches *tensor* names, on which
#: ``*shared_expert_gate`` never matches, while ``gate.weight`` is one of its name substrings - without it
#: a weight-only Qwen2-MoE's shared-expert gate would be quantized at load into a layer quantize_layers left float
EXCLUDE_MODULES = [*QUANTIZE_LAYERS_DEFAULT_EXCLUDE, "*shared_expert_gate.weight", "*medusa_heads*"]
#: tensorrt_llm/models/convert_utils.py weight_only_quantize_dict ``quant_weights``: name substrings
WEIGHT_ONLY_NAMES = ("qkv.weight", "dense.weight", "fc.weight", "proj.weight", "gate.weight")
#: the linears of a decoder layer TensorRT-LLM quantizes (ColumnLinear / RowLinear of Attention and the MLPs)
_LINEAR = re.compile(r"transformer\.layers\.\d+\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj))")
#: the decoder linears that read the hidden state and split their outputs over tp (ColumnLinear); the others of
#: :func:`linear_of` (``attention.dense``, ``mlp.proj``) write the hidden state and split their inputs (RowLinear)
COLUMN_LINEARS = ("attention.qkv", "mlp.fc", "mlp.gate")
FP8_MAX = 448.0
BITS = {"W8A16": 8, "W4A16": 4}


@dataclass(frozen=True)
class QuantSpec:
    """What a checkpoint is quantized to: ``quant_algo`` and ``kv_cache_quant_algo`` (None: float)."""

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None

    @property
    def any(self) -> bool:
        return bool(self.quant_algo or self.kv_cache_quant_algo)

    @property
    def needs_calibration(self) -> bool:
        """FP8 and SmoothQuant activation scales and KV-cache scales come from running the base (max calibration)."""
        return self.quant_algo in ("FP8", "W8A8_SQ_PER_CHANNEL") or self.kv_cache_quant_algo is not None

    @property
    def weight_only(self) -> bool:
        return self.quant_algo in BITS

    @property
    def rounds_activations(self) -> bool:
        """The engine rounds values that depend on the input, not only constants: FP8 / INT8 activations, a
        quantized KV cache, and AWQ / SmoothQuant's ``x * pre_quant_scale`` rounded to the model dtype. Such a
        rounding turns float32 order noise between two correct implementations (transformers' SDPA kernel against
        the executor's softmax, which rounds differently on each CPU path) into a step of the rounded value, so
        verify's exact checks leave these roundings out on both sides and measure their effect apart."""
        return (self.quant_algo in ("FP8", "W8A8_SQ_PER_CHANNEL", "W4A16_AWQ")
                or self.kv_cache_quant_algo is not None)

    def config(self) -> dict:
        """The checkpoint's ``quantization`` section (tensorrt_llm/models/modeling_utils.py QuantConfig)."""
        out: dict = {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo}
        if self.any:
            out["exclude_modules"] = list(EXCLUDE_MODULES)
        return out

    @classmethod
    def from_config(cls, cfg: dict) -> QuantSpec:
        q = cfg.get("quantization") or {}
        return cls(q.get("quant_algo"), q.get("kv_cache_quant_algo"))


def resolve_spec(*, qformat: str | None = None, use_weight_only: bool = False,
                 weight_only_precision: str | None = None, kv_cache_dtype: str | None = None,
                 int8_kv_cache: bool = False) -> QuantSpec:
    """The spec from upstream's flag spellings; contradictions are refused, never resolved silently; every refusal
    is the command line's (``usage``: exit 2)."""
    algo = None
    if qformat not in (None, "full_prec"):
        if qformat not in QFORMATS:
            raise ConversionError(f"--qformat {qformat!r} is not offered",
                                  fix="use fp8, int8_wo or int4_wo; AWQ and SmoothQuant bases come from NVIDIA's "
                                      "tools (examples/quantization/quantize.py)", usage=True)
        algo = QFORMATS[qformat]
    if use_weight_only or weight_only_precision is not None:
        precision = weight_only_precision or "int8"
        if precision not in WEIGHT_ONLY_PRECISIONS:
            raise ConversionError(f"--weight_only_precision {precision!r} is not offered",
                                  fix="use int8 or int4 (int4_gptq needs GPTQ weights: NVIDIA's tools)", usage=True)
        if not use_weight_only:
            raise ConversionError(f"--weight_only_precision {precision} without --use_weight_only",
                                  fix="add --use_weight_only (as upstream's convert_checkpoint.py)", usage=True)
        wo = WEIGHT_ONLY_PRECISIONS[precision]
        if qformat == "full_prec":
            raise ConversionError(f"--qformat full_prec and --use_weight_only (weight-only {precision}) ask for two "
                                  "formats: full_prec keeps every weight float",
                                  fix="drop --qformat full_prec for weight-only, or drop --use_weight_only", usage=True)
        if algo is not None and algo != wo:
            raise ConversionError(f"--qformat {qformat} and --use_weight_only --weight_only_precision {precision} "
                                  "ask for two formats", fix="pass one of them", usage=True)
        algo = wo
    kv = None
    if kv_cache_dtype is not None:
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConversionError(f"--kv_cache_dtype {kv_cache_dtype!r} is not offered", fix="use fp8 or int8", usage=True)
        kv = KV_CACHE_DTYPES[kv_cache_dtype]
    if int8_kv_cache:
        if kv not in (None, "INT8"):
            raise ConversionError(f"--int8_kv_cache and --kv_cache_dtype {kv_cache_dtype} contradict each other",
                                  fix="pass one of them", usage=True)
        kv = "INT8"
    return QuantSpec(algo, kv)


def spec_from_flags(flags) -> QuantSpec:
    """:func:`resolve_spec` of anything carrying the flag attributes (parsed arguments, ConvertOptions)."""
    return resolve_spec(qformat=flags.qformat, use_weight_only=flags.use_weight_only,
                        weight_only_precision=flags.weight_only_precision, kv_cache_dtype=flags.kv_cache_dtype,
                        int8_kv_cache=flags.int8_kv_cache)


def is_excluded(name: str, exclude: list[str] | None) -> bool:
    """tensorrt_llm/quantization/quantize.py: ``fnmatch.fnmatchcase`` on the full dotted name."""
    return any(fnmatch.fnmatchcase(name, p) for p in (exclude or []))


def linear_of(tensor_name: str) -> str | None:
    """The quantized linear a checkpoint tensor belongs to (``transformer.layers.3.mlp.fc``), or None."""
    m = _LINEAR.match(tensor_name)
    return m.group(0) if m and tensor_name[m.end():m.end() + 1] == "." else None


def weight_only_quantized(name: str, exclude: list[str] | None) -> bool:
    """Whether ``weight_only_quantize_dict`` quantizes this checkpoint tensor at load."""
    return any(s in name for s in WEIGHT_ONLY_NAMES) and not is_excluded(name, exclude)


def fp8_quantized(name: str, exclude: list[str] | None) -> bool:
    """Whether a ``*.weight`` tensor is an FP8 linear's weight (its module replaced by ``fp8_quantize``)."""
    lin = linear_of(name)
    return lin is not None and name == lin + ".weight" and not is_excluded(lin, exclude)


def scale_group(linear: str) -> str:
    """Linears sharing one FP8 weight and activation scale: ``mlp.fc`` with ``mlp.gate`` (ModelOpt
    ``build_mlp_config`` runs ``preprocess_linear_fusion`` on them for FP8); q, k and v are one tensor."""
    return linear[: -len(".gate")] + ".fc" if linear.endswith("mlp.gate") else linear


def scale_members(linear: str) -> tuple[str, ...]:
    """The linears of ``linear``'s scale group (see :func:`scale_group`)."""
    group = scale_group(linear)
    return (group, group[: -len(".fc")] + ".gate") if group.endswith("mlp.fc") else (group,)


# -- arithmetic --------------------------------------------------------------------------------------


#: quant_algo values the reference executor computes exactly
EMULATED = (None, "FP8", "W8A16", "W4A16", "W4A16_AWQ", "W8A8_SQ_PER_CHANNEL")


def format_name(spec: QuantSpec) -> str:
    parts = [spec.quant_algo or "float"]
    if spec.kv_cache_quant_algo:
        parts.append(f"{spec.kv_cache_quant_algo} KV cache")
    return ", ".join(parts)


# -- what a quantized checkpoint must hold (add-heads' base validation; meant for verify's executor too) --------------
#: the weight dtype and scales each quantized linear of a ``quant_algo`` declares (tensorrt_llm/quantization/layers.py:
#: FP8Linear, WeightOnlyGroupwiseQuantLinear with pre_quant_scale, Int8SmoothQuantLinear); a float weight there would
#: not load into the engine
QUANTIZED_LINEAR_TENSORS: dict[str, tuple[str, tuple[str, ...]]] = {
    "FP8": ("float8_e4m3fn", ("weights_scaling_factor", "activation_scaling_factor")),
    "W4A16_AWQ": ("int8", ("weights_scaling_factor", "prequant_scaling_factor")),
    "W8A8_SQ_PER_CHANNEL": ("int8", ("weights_scaling_factor", "prequant_scaling_factor", "activation_scaling_factor")),
}
