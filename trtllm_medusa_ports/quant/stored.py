"""What a quantized checkpoint's rank files must hold: each quantized layer's weight dtype and scales
(``quantized_layer_problems``, ``kv_scale_problems``), and the int8 weight-only bytes a family's own converter
stores for one GPU, which are refused with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_medusa_ports.quant.spec import BITS, QUANTIZED_LINEAR_TENSORS, fp8_quantized

if TYPE_CHECKING:
    pass


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


#: what a missing KV cache scale needs
KV_SCALE_FIX = "pass the checkpoint as it was written (by convert, or the quantizing tool)"


def kv_scale_message(att: str, kv_cache_quant_algo: str) -> str:
    """The one message for an attention layer without a KV cache scale (:func:`kv_scale_problems`), whoever reads it
    (add-heads and deploy: quant/prequantized.py; verify: reference/load_checks.py)."""
    return (f"{att} has no KV cache scale (kv_cache_scaling_factor, or k_cache_ and v_cache_scaling_factor), but "
            f"kv_cache_quant_algo is {kv_cache_quant_algo}: the engine would quantize its cache with a scale nobody "
            "measured")
