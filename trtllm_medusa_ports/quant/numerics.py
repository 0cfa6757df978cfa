"""The exact arithmetic of each format, as TensorRT-LLM computes it (the package's doc lists the sources):
weight-only's per-channel quantization and its dequantized values, FP8's scales, casts and the values its GEMMs
read, the quantized KV cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtllm_medusa_ports.quant.spec import BITS, FP8_MAX

if TYPE_CHECKING:
    import torch


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
