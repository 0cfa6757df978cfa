"""The conversion's jobs, quantized: FP8 weights and their scales, KV-cache scales (trtllm_medusa_ports/quant).

Weight-only formats change no job: TensorRT-LLM quantizes the float weights at load
(``preprocess_weights``), so those conversions stay on the byte path. For FP8 every quantized linear's
weight is read twice, in bounded chunks on the byte path: once for its amax (:func:`measure_weights`;
the scale of the unsplit tensor, shared by ``mlp.fc`` and ``mlp.gate``), then again when it is written,
cast per rank with that scale.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
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
from trtllm_medusa_ports.weights.sharding import Split

if TYPE_CHECKING:
    from trtllm_medusa_ports.quant.calibrate import Calibration

_LABEL = re.compile(r"layers\.(\d+)\.(.+)\.weight")


def _constant(label: str, value: Callable[[], float], targets: list[tuple[int, str]]):
    """A float32 ``[1]`` scale tensor; ``value`` is read when the tensor is written (after the amax pass)."""
    from trtllm_medusa_ports.conversion.plan import Job, first_input

    def load():
        import torch

        return [torch.tensor([value()], dtype=torch.float32)]

    return Job(label, load, [(1,)], first_input,
                Split.REPLICATE, targets, cast_to="float32", stored_dtype="float32")


def _tensor_amax(job, dtype: str, on_non_finite: Callable) -> float:
    """The amax of a job the byte path cannot take (a value transform, a pickle): its sources whole."""
    from trtllm_medusa_ports.conversion.plan import job_inputs
    from trtllm_medusa_ports.files.finite import all_finite

    plain, inputs = job_inputs(job, dtype)
    if not all(all_finite(t) for t in inputs):
        raise on_non_finite(job)
    combined = plain.combine(inputs)  # one tensor, or (q, k, v) for the split that fuses them per rank
    parts = combined if isinstance(combined, (tuple, list)) else (combined,)
    return max((float(p.float().abs().max()) for p in parts if p.numel()), default=0.0)


@dataclass
class WeightScales:
    """The FP8 weight scale of every scale group (``(layer, group)``, quant.scale_group), measured by
    :func:`measure_weights` between planning and writing: the FP8 weights and their
    ``weights_scaling_factor`` tensors read it when they are written."""

    amax: dict[tuple[int, str], float] = field(default_factory=dict)
    jobs: dict[str, tuple[int, str]] = field(default_factory=dict)  # FP8 weight job label -> its group

    def scale(self, key: tuple[int, str]) -> float:
        if key not in self.amax:
            raise AssertionError(f"FP8 scale of {key} read before the amax pass")
        return fp8_scale(self.amax[key])


def quantize_jobs(jobs: list, cfg: dict, spec: QuantSpec, dtype: str, calibration: Calibration | None,
                  num_layers: int) -> tuple[list, WeightScales]:
    """``jobs`` with FP8 casts and the scale tensors TensorRT-LLM's quantized layers declare, and the
    weight scales they read (filled by :func:`measure_weights` before anything is written)."""
    out = []
    scales = WeightScales()
    if spec.quant_algo == "FP8":
        assert calibration is not None
        linears = {}
        for job in jobs:
            name = job.targets[0][1] if job.targets else ""
            m = _LABEL.fullmatch(job.label)
            if m and fp8_quantized(name, EXCLUDE_MODULES):
                linears[job.label] = (int(m.group(1)), m.group(2), job)
        for job in jobs:
            if job.label not in linears:
                out.append(job)
                continue
            i, short, _ = linears[job.label]
            key = (i, scale_group(short))
            scales.jobs[job.label] = key
            members = [s for s in scale_members(short) if (i, s) in calibration.inputs] or [short]
            if (i, short) not in calibration.inputs:
                raise ConversionError(f"calibration saw no input of layers.{i}.{short}",
                                      fix="the transformers model did not run this layer; report it")
            a_scale = fp8_scale(max(calibration.inputs[(i, s)] for s in members))
            out.append(dataclasses.replace(job, stored_dtype="float8_e4m3fn", fp8_group=key,
                                           post=lambda t, k=key: fp8_weight(t, scales.scale(k))))
            base_targets = [(r, n[: -len(".weight")]) for r, n in job.targets]
            for suffix, value in (("weights_scaling_factor", lambda k=key: scales.scale(k)),
                                  ("activation_scaling_factor", lambda v=a_scale: v)):
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
            if i not in calibration.kv_cached:
                raise ConversionError(f"the calibration holds no KV-cache range for layer {i} (a calibration file "
                                      "written before the ranges were measured on the cached K and V)",
                                      where=calibration.source or None,
                                      fix="calibrate again (omit the saved calibration, or write a new one)")
            value = kv_scale(calibration.kv_cached[i], spec.kv_cache_quant_algo)
            targets = [(r, n[: -len("qkv.weight")] + "kv_cache_scaling_factor") for r, n in job.targets]
            out.append(_constant(f"layers.{i}.attention.kv_cache_scaling_factor", lambda v=value: v, targets))
    return out, scales


def measure_weights(jobs: list, moves: list, scales: WeightScales, dtype: str, *, threads: int, quiet: bool,
                    on_non_finite: Callable) -> None:
    """Pass 1 of FP8: the amax of every FP8 weight, one tensor at a time, into ``scales``; the byte
    path's chunked read where the weight's plan is a pure layout (files/byte_moves.py ``ByteMover.amax``),
    its whole sources otherwise. Lanes run side by side (numpy and the kernel release the GIL).
    ``on_non_finite(job)`` gives the error for a weight holding NaN/Inf, or overflowing ``dtype``."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from trtllm_medusa_ports.files.byte_moves import ByteMover, MoveKind, NonFinite
    from trtllm_medusa_ports.files.dtypes import to_torch
    from trtllm_medusa_ports.machine.progress import progress

    work = [(job, move) for job, move in zip(jobs, moves, strict=True) if job.label in scales.jobs]
    if not work:
        return
    mover = ByteMover(lambda rank, name: 0, lambda rank: -1)
    bar = progress(len(work), quiet, desc="fp8 amax", unit="weight")

    def one(job, move) -> float:
        if move.kind is MoveKind.FP8:
            try:
                raw = mover.amax(move)
            except NonFinite:
                raise on_non_finite(job) from None
            # rounding is monotonic: the amax in the checkpoint dtype is the source amax rounded to it
            value = float(torch.tensor(raw, dtype=torch.float32).to(to_torch(dtype)).float())
            if not math.isfinite(value):  # the largest value overflows the checkpoint dtype
                raise on_non_finite(job)
        else:
            value = _tensor_amax(job, dtype, on_non_finite)
        bar.update()
        return value

    try:
        if threads > 1 and len(work) > 1:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                values = list(pool.map(lambda jm: one(*jm), work))
        else:
            values = [one(job, move) for job, move in work]
    finally:
        mover.close()
        bar.close()
    for (job, _), value in zip(work, values, strict=True):
        key = scales.jobs[job.label]
        scales.amax[key] = max(scales.amax.get(key, 0.0), value)
    for job, move in work:
        if move.kind is MoveKind.FP8:
            move.fp8.scale = scales.scale(scales.jobs[job.label])
