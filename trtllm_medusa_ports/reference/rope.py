"""RoPE's inverse frequencies as TensorRT-LLM 1.2.x computes them, for the reference executor."""

from __future__ import annotations

import math

import torch

from trtllm_medusa_ports.errors import ModelError


def rope_inv_freq(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies of RoPE, with the scaling types TensorRT-LLM 1.2.x implements.

    ``linear`` divides positions by ``factor`` (same as dividing inv_freq); ``llama3``
    rescales long wavelengths (tensorrt_llm/functional.py ``RopeEmbeddingUtils``).
    """
    import torch

    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    if not scaling:
        return inv
    kind = scaling.get("type") or scaling.get("rope_type")
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        orig = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = orig / low, orig / high
        smooth = (orig / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        return torch.where(is_mid, mid, scaled)
    raise ModelError(
        f"rope scaling type {kind!r} is not implemented by the reference executor",
        fix="see docs/compatibility-rules.md (rope-scaling-unsupported)",
    )
