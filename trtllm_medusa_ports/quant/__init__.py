"""Quantized Medusa checkpoints: which formats, which tensors, and the exact arithmetic of each.

TensorRT-LLM 1.2.x facts this module follows (repository NVIDIA/TensorRT-LLM unless named):

* **Weight-only (W8A16, W4A16)**: the checkpoint keeps float weights and names ``quant_algo``;
  ``tensorrt_llm/models/modeling_utils.py`` ``preprocess_weights`` -> ``weight_only_quantize_dict``
  (``tensorrt_llm/models/convert_utils.py``) quantizes at load every tensor whose name contains
  ``qkv.weight``, ``dense.weight``, ``fc.weight``, ``proj.weight`` or ``gate.weight`` and matches no
  ``exclude_modules`` pattern (``fnmatch.fnmatchcase`` on the tensor name), per rank (the rank files are
  already split). The quantizer (``cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp``
  ``symmetric_quantize``) works on the transposed ``[in, out]`` weight: per output channel
  ``scale = max|w| / 128`` (int8) or ``/ 8`` (int4) in float32, no epsilon; ``q = round(w / scale)``
  with C ``round`` (halves away from zero), clamped to [-128, 127] or [-8, 7] (0 where the scale is 0);
  the scale is stored in the weight's dtype and the GEMM computes ``q * stored_scale``.
* **FP8** (per tensor, as NVIDIA's exporter ``modelopt/torch/export/`` in NVIDIA/TensorRT-Model-Optimizer
  writes it): ``weight`` float8_e4m3fn ``= (w / s_w).to(float8_e4m3fn)``, ``weights_scaling_factor``
  ``s_w = amax(w) / 448`` and ``activation_scaling_factor`` ``s_a = amax(x) / 448`` (max calibration),
  float32 ``[1]``; q, k and v share the max of their amaxes (``preprocess_linear_fusion``), and so do
  ``mlp.fc`` and ``mlp.gate``; scales are those of the unsplit tensor, the same on every rank.
  ``tensorrt_llm/quantization/layers.py`` ``FP8Linear.forward`` quantizes its input with
  ``s_a`` cast to the model dtype (``x / s_a``, round to nearest even, saturated to +-448) and scales the
  product by ``s_w * s_a`` (float32).
* **KV cache**: ``transformer.layers.{i}.attention.kv_cache_scaling_factor`` float32 ``[1]``;
  ``preprocess_weights`` adds ``kv_cache_rcp_scaling_factor = 1 / scale``; the kernels write
  ``sat(rne(x * rcp))`` and read ``q * scale`` (``decoderMaskedMultiheadAttentionUtils.h``). INT8:
  ``scale = max|qkv output| / 127`` before RoPE, q included (``tensorrt_llm/models/llama/convert.py``
  ``int8_kv_cache``); FP8: ``max(amax / 448, 1)`` (ModelOpt ``get_kv_cache_scaling_factor``).
* **What stays in float**: ``exclude_modules`` replaces upstream's default list (it is not merged,
  ``tensorrt_llm/quantization/quantize.py`` ``quantize_layers``), so ours repeats that default and adds
  ``*medusa_heads*`` as ``quantize_by_modelopt.py`` ``combine_medusa_weight`` does: the Medusa ResBlocks
  and lm_heads, the base lm_head, the embedding and the norms keep the checkpoint dtype.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import ConversionError
from trtllm_medusa_ports.files.checkpoint import QUANTIZE_LAYERS_DEFAULT_EXCLUDE

if TYPE_CHECKING:
    import torch

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
def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C ``round()`` on float32 (``symmetric_quantize``: ``round(weight_elt / col_scale)``): halves away from zero,
    and nothing below a half rounds up. ``floor(|x| + 0.5)`` is not that: for ``0.5 - 2**-25`` the sum rounds to
    1.0 in float32 first. The fraction ``x - trunc(x)`` is exact in float32, so comparing it with 0.5 is."""
    import torch

    whole = torch.trunc(x)
    return whole + torch.where((x - whole).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def weight_only_quantize(w: torch.Tensor, algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [..., out, in] int8 values, stored scale [..., out] in w's dtype)`` of one rank's ``[out, in]``
    weight, or of stacked experts ``[experts, out, in]`` (each expert on its own: the batched form of
    ``symmetric_quantize`` that weight_only_quantize_dict runs on 3-D weights), as upstream computes them
    (see the module doc)."""
    import torch

    bits = BITS[algo]
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    wf = w.float()
    scale = wf.abs().amax(dim=-1) * (1.0 / float(1 << (bits - 1)))  # per output channel, float32
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.where(scale[..., None] == 0, torch.zeros_like(wf),
                    round_half_away(wf / safe[..., None])).clamp(lo, hi)
    return q.to(torch.int8), scale.to(w.dtype)


def weight_only_dequantized(w: torch.Tensor, algo: str) -> torch.Tensor:
    """The float32 weight the weight-only GEMM multiplies by: ``q * stored_scale``."""
    q, scale = weight_only_quantize(w, algo)
    return q.float() * scale.float()[..., None]


def stored_weight_only_refusal(name: str) -> str:
    """Why int8 weight-only bytes a family's converter wrote cannot be read back."""
    return (f"{name} is stored int8 beside its per_channel_scale: a family's convert_checkpoint.py stores what "
            "torch.ops.trtllm.symmetric_quantize_last_axis_of_batched_matrix returns, bytes already permuted and "
            "interleaved for the mixed-precision GEMM of the GPU it ran on (preprocess_weights_for_mixed_gemm, by SM "
            "version: cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp), and nothing in the "
            "checkpoint says which SM; they are not a plain [in, out] matrix and cannot be read back here")


STORED_WEIGHT_ONLY_FIX = ("verify the float base converted here (trtllm-medusa convert --qformat int8_wo / int4_wo "
                          "writes float [out, in] weights without scales, which TensorRT-LLM quantizes at load); a "
                          "family's convert_checkpoint.py --disable_weight_only_quant_plugin checkpoint is no way round "
                          "it: TensorRT-LLM 1.2's build re-quantizes its transposed float weights and fails to load "
                          "them (quant/engine_load.py)")


#: quant_algo values the reference executor computes exactly
EMULATED = (None, "FP8", "W8A16", "W4A16", "W4A16_AWQ", "W8A8_SQ_PER_CHANNEL")


def fp8_scale(amax: float) -> float:
    """``amax / 448`` (ModelOpt ``get_scaling_factor``); an amax of 0 gives 1 (``export_amax``)."""
    return (amax if amax > 0 else FP8_MAX) / FP8_MAX


def fp8_cast(x: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn, saturated to +-448 (TensorRT's quantize layer; rounding to nearest even)."""
    import torch

    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_weight(w: torch.Tensor, scale: float) -> torch.Tensor:
    """The FP8 weight ModelOpt ``to_quantized_weight`` writes: ``(w / s_w)`` cast to float8_e4m3fn."""
    import torch

    return fp8_cast(w.float() / torch.tensor(scale, dtype=torch.float32))


def fp8_activation(x: torch.Tensor, act_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``FP8Linear``'s quantized input as float32 values (not yet multiplied back by the scale):
    ``x / s_a`` with ``s_a`` cast to the model dtype, saturated, rounded to float8_e4m3fn."""
    import torch

    s = torch.tensor(act_scale, dtype=torch.float32).to(dtype).float()
    return fp8_cast(x / s).float()


#: How ``FP8Linear.forward`` (tensorrt_llm/quantization/layers.py) multiplies, by the build's ``--gemm_plugin``:
#: ``auto`` (and trtllm-build's default, none): ``auto`` resolves to the model dtype (plugin/plugin.py), so the
#: FP8 operands are dequantized with both scales cast to the model dtype and multiplied in it; ``fp8``: the FP8
#: GEMM plugin scales the product by ``s_w * s_a`` in float32 (the input still quantized with ``s_a`` in the
#: model dtype).
FP8_GEMM_PATHS = ("auto", "fp8")


def _in_dtype(value: float, dtype: torch.dtype) -> torch.Tensor:
    import torch

    return torch.tensor(value, dtype=torch.float32).to(dtype)


def fp8_weight_value(q: torch.Tensor, scale: float, dtype: torch.dtype, gemm: str = "auto") -> torch.Tensor:
    """The float32 values an FP8 weight multiplies with (see :data:`FP8_GEMM_PATHS`)."""
    import torch

    if gemm == "fp8":
        return q.float() * torch.tensor(scale, dtype=torch.float32)
    return (q.to(dtype) * _in_dtype(scale, dtype)).float()


def fp8_input_value(x: torch.Tensor, act_scale: float, dtype: torch.dtype, gemm: str = "auto") -> torch.Tensor:
    """The float32 values an FP8 linear's input multiplies with: quantized with ``s_a`` in the model dtype, then
    dequantized with it there (``auto``) or scaled in float32 by the GEMM (``fp8``)."""
    import torch

    q = fp8_activation(x, act_scale, dtype)
    if gemm == "fp8":
        return q * torch.tensor(act_scale, dtype=torch.float32)
    return (q.to(dtype) * _in_dtype(act_scale, dtype)).float()


def fp8_requantized(q: torch.Tensor, scale: float, new_scale: float) -> torch.Tensor:
    """An FP8 weight moved to another scale as ``fuse_gate_mlp`` (tensorrt_llm/models/modeling_utils.py) moves
    ``mlp.fc`` and ``mlp.gate`` to the larger of their two scales when it fuses them: dequantized in float32,
    divided by the new scale, cast to float8_e4m3fn again (the smaller-scale half loses precision)."""
    import torch

    if scale == new_scale:
        return q
    return fp8_cast(q.float() * torch.tensor(scale, dtype=torch.float32) / torch.tensor(new_scale, dtype=torch.float32))


#: ``fuse_gate_mlp`` fuses a ``GatedMLP`` only for these activations (tensorrt_llm/models/modeling_utils.py);
#: trtllm-build's ``--use_fused_mlp`` is on by default (plugin/plugin.py)
FUSED_MLP_ACTIVATIONS = ("silu", "gelu")


def kv_scale(amax: float, algo: str) -> float:
    if algo == "INT8":
        return (amax if amax > 0 else 127.0) / 127.0
    return max(amax / FP8_MAX, 1.0)  # ModelOpt floors FP8 KV scales at 1 ("recommend ... 1")


def kv_quantized(x: torch.Tensor, scale: float, algo: str) -> torch.Tensor:
    """What the KV cache holds, read back: ``q(x * (1 / scale)) * scale`` (float32)."""
    import torch

    s = torch.tensor(scale, dtype=torch.float32)
    scaled = x.float() * torch.reciprocal(s)
    if algo == "INT8":
        q = torch.round(scaled).clamp(-128, 127)  # cvt.rni.sat.s8.f32: nearest even, saturated
    else:
        q = fp8_cast(scaled).float()
    return q * s


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
#: weight-only: a float weight is the usual form (quantized at load); int8 bytes a family's converter stored hold
#: their ``per_channel_scale`` beside them (WeightOnlyQuantLinear)
WEIGHT_ONLY_STORED = ("int8", ("per_channel_scale",))
QUANTIZED_LAYER_FIX = ("pass the checkpoint as the quantizing tool wrote it, or name the layer in exclude_modules if it "
                       "is meant to stay in float")


def is_scale_tensor(name: str) -> bool:
    """A quantization scale of a checkpoint: ``*_scaling_factor`` (weights, activation, prequant, KV cache) or
    ``*per_channel_scale`` (weight-only)."""
    return name.endswith("scaling_factor") or name.endswith("per_channel_scale")


@dataclass(frozen=True)
class LayerProblem:
    """A quantized linear that does not hold what its ``quant_algo`` declares."""

    rank: int
    weight: str  # the weight tensor's name
    dtype: str  # the weight's stored dtype, by name
    missing: tuple[str, ...]  # the scales it lacks
    #: the weight is stored quantized (its scales are what is missing); False: a float weight where the layer takes a
    #: quantized one (weight-only's float weights are never a problem)
    stored_quantized: bool
    message: str


def quantized_layer_problems(ranks: list[dict], quant_algo: str | None, exclude: list[str] | None
                             ) -> list[LayerProblem]:
    """Every decoder linear ``quant_algo`` quantizes (not excluded; MoE experts, 3-D, aside) whose weight is not in
    the dtype the quantized layer takes or lacks one of its scales (:data:`QUANTIZED_LINEAR_TENSORS`), and under
    weight-only every stored int8 weight without its ``per_channel_scale``. ``ranks``: per rank, name -> a tensor
    with ``dtype_name`` and ``shape`` (files/lazy_tensors.py LazyTensor)."""
    weight_only = quant_algo in BITS
    needs = WEIGHT_ONLY_STORED if weight_only else QUANTIZED_LINEAR_TENSORS.get(quant_algo)
    if needs is None:
        return []
    dtype, scales = needs
    out = []
    for r, tensors in enumerate(ranks):
        for name, t in tensors.items():
            if len(t.shape) == 3 or not fp8_quantized(name, exclude):
                continue
            if weight_only and t.dtype_name != dtype:
                continue
            linear = name[: -len(".weight")]
            missing = tuple(s for s in scales if f"{linear}.{s}" not in tensors)
            if t.dtype_name == dtype and not missing:
                continue
            out.append(LayerProblem(
                r, name, t.dtype_name, missing, t.dtype_name == dtype,
                f"rank {r}: {name} is {t.dtype_name}" + (f" without {', '.join(missing)}" if missing else "")
                + f", but quant_algo {quant_algo} makes {linear} a quantized layer taking {dtype} weights and "
                f"{', '.join(scales)} (tensorrt_llm/quantization/layers.py); the engine would not load it"))
    return out


def kv_scale_problems(ranks: list[dict], kv_cache_quant_algo: str | None) -> list[tuple[int, str]]:
    """(rank, attention module) of every attention layer (``attention.qkv.weight``) without a KV cache scale under a
    quantized KV cache: ``kv_cache_scaling_factor``, or ModelOpt's ``k_cache_scaling_factor`` and
    ``v_cache_scaling_factor`` (merged to their max at load, tensorrt_llm/models/modeling_utils.py)."""
    if not kv_cache_quant_algo:
        return []
    out = []
    for r, tensors in enumerate(ranks):
        for name in tensors:
            if not re.fullmatch(r"transformer\.layers\.\d+\.attention\.qkv\.weight", name):
                continue
            att = name[: -len(".qkv.weight")]
            if f"{att}.kv_cache_scaling_factor" in tensors or all(
                    f"{att}.{k}_cache_scaling_factor" in tensors for k in "kv"):
                continue
            out.append((r, att))
    return out
