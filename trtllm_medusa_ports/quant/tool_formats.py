"""Formats only NVIDIA's tools write: INT4 AWQ (``W4A16_AWQ``) and INT8 SmoothQuant per channel
(``W8A8_SQ_PER_CHANNEL``), as ModelOpt 0.21.1's ``export_tensorrt_llm_checkpoint`` writes them and TensorRT-LLM 1.2
computes them. Imports only torch; the executor and verify's emulation both use these functions, so the two sides
multiply with the same values.

What ModelOpt writes (read off its own exports, tests/fixtures/modelopt; ``modelopt/torch/export/``
``quantization_utils.py`` ``to_quantized_weight``):

* AWQ: ``weight`` int8 ``[out / 2, in]``, two int4 codes a byte along the *output* rows (row 2j in the low nibble,
  2j + 1 in the high one, two's complement), ``q = round(W' / s)`` clamped to [-8, 7]; ``weights_scaling_factor``
  float32 ``[out, in / group_size]`` (``amax / 7`` per group along the input); ``prequant_scaling_factor``
  ``[in]`` in the model dtype, with the weight stored divided by it (awq_lite folds its scale into the weight, q, k
  and v re-smoothed to one average scale: ``layer_utils.build_qkv``), so ``W ~ q * s * pre_quant_scale``.
* SmoothQuant: ``weight`` int8 ``[out, in]``, ``weights_scaling_factor`` float32 ``[out]`` (``amax / 127`` per
  output row), ``activation_scaling_factor`` float32 ``[1]``, ``prequant_scaling_factor`` ``[in]``:
  ``W ~ q * s[:, None] * pre_quant_scale``.

What TensorRT-LLM computes:

* AWQ (``quantization/layers.py`` ``WeightOnlyGroupwiseQuantLinear``; ``models/modeling_utils.py``
  ``preprocess_perlayer_weights`` transposes the scales and casts them to the model dtype, then the groupwise GEMM
  plugin): ``(x * pre_quant_scale) @ (q * s)``, the scales and the dequantized weight in the model dtype.
* SmoothQuant per channel is not a plugin algorithm (``quantization/mode.py`` ``W8A8_SQ_PLUGIN_LIST``), so
  ``smooth_quantize_ootb`` builds ``Int8SmoothQuantLinear``: ``x * pre_quant_scale`` in the model dtype, then
  quantize / dequantize with the per-tensor activation scale in float32 (nearest even, saturated to int8), back to
  the model dtype; the weight dequantized with its per-row scales in float32, then cast to the model dtype.
"""

from __future__ import annotations

import torch

AWQ = "W4A16_AWQ"
SQ = "W8A8_SQ_PER_CHANNEL"
TOOL_ALGOS = (AWQ, SQ)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """``[out / 2, in]`` int8 -> ``[out, in]`` int8 codes: row 2j from the low nibbles, 2j + 1 from the high ones."""
    wide = packed.to(torch.int16)
    low = ((wide << 12) >> 12).to(torch.int8)  # sign-extended low nibble
    high = (wide >> 4).to(torch.int8)
    return torch.stack([low, high], dim=1).reshape(packed.shape[0] * 2, packed.shape[1])


def awq_weight(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float32 values the groupwise GEMM multiplies ``x * pre_quant_scale`` with, ``[out, in]``."""
    q = unpack_int4_rows(packed)
    group = q.shape[1] // scales.shape[1]
    s = scales.to(dtype).repeat_interleave(group, dim=1)
    return (q.to(dtype) * s).float()


def awq_steps(scales: torch.Tensor, in_features: int) -> torch.Tensor:
    """One code's worth of weight per element (``[out, in]``, before the pre-quant scale): its group's scale."""
    return scales.float().repeat_interleave(in_features // scales.shape[1], dim=1)


def sq_weight(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``Int8SmoothQuantLinear``'s weight: dequantized per output row in float32, cast to the model dtype."""
    return (q.float() * scales.float()[:, None]).to(dtype).float()


def smoothed_input(x: torch.Tensor, pre_quant_scale: torch.Tensor, dtype: torch.dtype, *,
                   rounded: bool = True) -> torch.Tensor:
    """``x * pre_quant_scale`` as the engine computes it (both formats multiply before the GEMM): the two in the model
    dtype and their product rounded to it (``Int8SmoothQuantLinear`` multiplies two model-dtype tensors,
    tensorrt_llm/quantization/layers.py; the groupwise plugin takes the scale in the model dtype). ``x`` holds
    model-dtype values in float32; the product of two such values is exact in float32, so one rounding gives the
    model dtype's own product. ``rounded=False`` leaves that last rounding out (the scale still in the model
    dtype): verify's exact checks, where the rounding would turn float32 order noise between transformers and the
    executor into whole model-dtype steps (``QuantSpec.rounds_activations``)."""
    product = x * pre_quant_scale.to(dtype).float()
    return product.to(dtype).float() if rounded else product


def sq_activation(x: torch.Tensor, act_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``Int8SmoothQuantLinear``'s input after the smoothing: quantized and dequantized per tensor in float32
    (nearest even, saturated to [-128, 127]), then cast to the model dtype."""
    s = torch.tensor(act_scale, dtype=torch.float32)
    return (torch.round(x.float() / s).clamp(-128, 127) * s).to(dtype).float()


def effective_weight(algo: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(weight the GEMM multiplies with, pre-quant scale, one code's step per element)`` of one linear from its
    tensors (``weight``, ``weights_scaling_factor``, ``prequant_scaling_factor``): ``weight * pre_quant_scale`` is
    the float weight the quantization stands for, each element within half a step (times the pre-quant scale) of
    the weight it was quantized from."""
    pqs = tensors["prequant_scaling_factor"].reshape(-1)
    if algo == AWQ:
        w = awq_weight(tensors["weight"], tensors["weights_scaling_factor"], dtype)
        steps = awq_steps(tensors["weights_scaling_factor"], w.shape[1])
    else:
        w = sq_weight(tensors["weight"], tensors["weights_scaling_factor"].reshape(-1), dtype)
        steps = tensors["weights_scaling_factor"].float().reshape(-1, 1).expand_as(w)
    return w, pqs, steps
