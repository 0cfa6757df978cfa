"""The conversion's jobs, quantized: FP8 weights and their scales, KV-cache scales (trtllm_medusa_ports/quant).

Weight-only formats change no job: TensorRT-LLM quantizes the float weights at load
(``preprocess_weights``), so those conversions stay on the byte path. For FP8 every quantized linear's
weight is read twice, one tensor at a time: once for its amax (the scale of the unsplit tensor, shared
by ``mlp.fc`` and ``mlp.gate``), then again when it is written, cast per rank with that scale.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import ConversionError
from trtllm_medusa_ports.quant import (
    EXCLUDE_MODULES,
    QuantSpec,
    fp8_quantized,
    fp8_scale,
    fp8_weight,
    kv_scale,
    scale_group,
    scale_members,
)
from trtllm_medusa_ports.sharding import Split

if TYPE_CHECKING:
    from trtllm_medusa_ports.quant.calibrate import Calibration

_LABEL = re.compile(r"layers\.(\d+)\.(.+)\.weight")


def _constant(label: str, value: float, targets: list[tuple[int, str]]):
    from trtllm_medusa_ports.convert import _first_input, _Job

    def load(v=value):
        import torch

        return [torch.tensor([v], dtype=torch.float32)]

    return _Job(label, load, [(1,)], _first_input,
                Split.REPLICATE, targets, cast_to="float32", stored_dtype="float32")


def _amax(job, dtype: str) -> float:
    from trtllm_medusa_ports.convert import job_inputs

    plain, inputs = job_inputs(job, dtype)
    combined = plain.combine(inputs)  # one tensor, or (q, k, v) for the split that fuses them per rank
    parts = combined if isinstance(combined, (tuple, list)) else (combined,)
    return max((float(p.float().abs().max()) for p in parts if p.numel()), default=0.0)


def quantize_jobs(jobs: list, cfg: dict, spec: QuantSpec, dtype: str, calibration: Calibration | None,
                  num_layers: int) -> list:
    """``jobs`` with FP8 casts and the scale tensors TensorRT-LLM's quantized layers declare."""
    out = []
    if spec.quant_algo == "FP8":
        assert calibration is not None
        linears = {}
        for job in jobs:
            name = job.targets[0][1] if job.targets else ""
            m = _LABEL.fullmatch(job.label)
            if m and fp8_quantized(name, EXCLUDE_MODULES):
                linears[job.label] = (int(m.group(1)), m.group(2), job)
        weight_amax: dict[tuple[int, str], float] = {}
        for i, short, job in linears.values():  # pass 1: amax of every unsplit weight, one at a time
            key = (i, scale_group(short))
            weight_amax[key] = max(weight_amax.get(key, 0.0), _amax(job, dtype))
        for job in jobs:
            if job.label not in linears:
                out.append(job)
                continue
            i, short, _ = linears[job.label]
            group = scale_group(short)
            w_scale = fp8_scale(weight_amax[(i, group)])
            members = [s for s in scale_members(short) if (i, s) in calibration.inputs] or [short]
            if (i, short) not in calibration.inputs:
                raise ConversionError(f"calibration saw no input of layers.{i}.{short}",
                                      fix="the transformers model did not run this layer; report it")
            a_scale = fp8_scale(max(calibration.inputs[(i, s)] for s in members))
            out.append(dataclasses.replace(job, stored_dtype="float8_e4m3fn",
                                           post=lambda t, s=w_scale: fp8_weight(t, s)))
            base_targets = [(r, n[: -len(".weight")]) for r, n in job.targets]
            for suffix, value in (("weights_scaling_factor", w_scale), ("activation_scaling_factor", a_scale)):
                out.append(_constant(f"layers.{i}.{short}.{suffix}", value,
                                     [(r, f"{n}.{suffix}") for r, n in base_targets]))
    else:
        out = list(jobs)
    if spec.kv_cache_quant_algo:
        assert calibration is not None
        for job in jobs:
            m = _LABEL.fullmatch(job.label)
            if not (m and m.group(2) == "attention.qkv"):
                continue
            i = int(m.group(1))
            value = kv_scale(calibration.qkv_outputs.get(i, 0.0), spec.kv_cache_quant_algo)
            targets = [(r, n[: -len("qkv.weight")] + "kv_cache_scaling_factor") for r, n in job.targets]
            out.append(_constant(f"layers.{i}.attention.kv_cache_scaling_factor", value, targets))
    return out
