"""RoPE's inverse frequencies as TensorRT-LLM 1.2.x computes them, for the reference executor: float32, as the
engine's tables hold them, whose angles (position x inverse frequency) are float32 products too
(``np.einsum(..., dtype=np.float32)`` in tensorrt_llm/functional.py ``RopeEmbeddingUtils``)."""

from __future__ import annotations

import math

import torch

from trtllm_medusa_ports.archs.semantics import YARN_DEFAULTS, Semantics, yarn_engine_mscale
from trtllm_medusa_ports.errors import ModelError


def _base_powers(rotary_dim: int, base: float) -> torch.Tensor:
    """``base ** (2i / rotary_dim)`` as the engine's table builders make it: the power in float64, then float32
    (numpy's ``(theta ** (np.arange(0, dim, 2) / dim)).astype(np.float32)``)."""
    return (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)).float()


def rope_inv_freq(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies of RoPE (float32, as the engine's table holds them), with the scaling types TensorRT-LLM
    1.2.x implements.

    ``linear`` divides positions by ``factor`` (the engine: ``1 / factor`` over the base's powers); ``llama3``
    rescales long wavelengths, element by element in double precision and stored as float32
    (tensorrt_llm/functional.py ``RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin``,
    ``apply_llama3_scaling``).
    """
    powers = _base_powers(rotary_dim, base)
    if not scaling:
        return 1.0 / powers
    kind = scaling.get("type") or scaling.get("rope_type")
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return (1.0 / factor) / powers
    if kind == "llama3":
        inv = (1.0 / powers).double()
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        orig = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = orig / low, orig / high
        smooth = (orig / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        return torch.where(is_mid, mid, scaled).float()
    why = (": the engine's attention kernels rescale RoPE's base by the sequence length as they run "
           "(update_rotary_base_n_scale, cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/"
           "decoderMaskedMultiheadAttentionUtils.h), which the executor does not model" if kind == "dynamic" else "")
    raise ModelError(
        f"rope scaling type {kind!r} is not implemented by the reference executor{why}",
        fix="validate on GPU (scripts/validate_on_gpu.sh); see docs/compatibility-rules.md (rope-scaling-unverified)",
    )


def longrope_inv_freq(rotary_dim: int, base: float, factors: tuple[float, ...]) -> torch.Tensor:
    """One of long_rope's two tables: each inverse frequency divided by its factor (the factors stored as float32,
    as the engine reads them: tensorrt_llm/layers/attention.py, ``create_sinusoidal_positions_long_rope_for_attention
    _plugin`` in tensorrt_llm/functional.py). The factors are usable: files/checkpoint_schema.py
    ``longrope_problems`` judged them when the checkpoint was read."""
    f = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (f * _base_powers(rotary_dim, base))  # float32 throughout, as upstream's numpy arrays


def longrope_mscale(max_positions: int, original_max_positions: int) -> float:
    """The factor long_rope multiplies cos and sin by where config.json gives none: sqrt(1 + ln(s) / ln(original))
    for s = max_position_embeddings / original_max_position_embeddings above 1, else 1 (upstream's ``_calc_mscale``;
    transformers' ``attention_factor`` for Phi-3 is the same)."""
    scale = max_positions / original_max_positions
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original_max_positions))


def yarn_inv_freq(rotary_dim: int, base: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN's inverse frequencies (float32) and cos / sin scale as the engine builds its table
    (tensorrt_llm/functional.py ``RopeEmbeddingUtils.create_sinusoidal_positions_yarn``, from
    ``create_attention_const_params``): frequencies in float32, interpolated (divided by ``factor``) below the
    correction range found from ``beta_fast`` / ``beta_slow`` at ``original_max_position_embeddings`` (floored and
    ceiled, clamped to the dimension), extrapolated above it, a linear ramp between."""
    o = {**YARN_DEFAULTS, **{k: v for k, v in scaling.items() if v is not None}}
    factor, original = float(o["factor"]), float(o["original_max_position_embeddings"])

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(float(o["beta_fast"]))), 0)
    high = min(math.ceil(correction_dim(float(o["beta_slow"]))), rotary_dim - 1)
    if low == high:
        high += 0.001  # as upstream: no zero-width ramp
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv, yarn_engine_mscale(scaling)


def global_rope(rotary_dim: int, semantics: Semantics) -> tuple[torch.Tensor, float]:
    """The inverse frequencies of a RoPE base's (global) table and the factor its cos and sin are multiplied by
    (1 but for YaRN), from the checkpoint's ``rotary_scaling`` (its ``type``, else ``rope_type``, as the engine
    reads it)."""
    scaling = semantics.rotary_scaling
    if scaling and scaling.get("type", scaling.get("rope_type")) == "yarn":
        if semantics.local_rotary_base is not None:  # the local layers would share the global cos / sin scale
            raise ModelError("yarn scaling with local RoPE layers is not implemented by the reference executor",
                             fix="see docs/compatibility-rules.md (rope-scaling-unverified)")
        return yarn_inv_freq(rotary_dim, semantics.rotary_base, scaling)
    return rope_inv_freq(rotary_dim, semantics.rotary_base, scaling), 1.0
