"""Which memory mode verify runs in, and on which device.

* ``in-memory``: each side holds its whole model in float32 - transformers' first, freed, then the checkpoint's
  on the reference executor: about :data:`LIBRARIES_BYTES` + :data:`VERIFY_PER_FLOAT32` x the model's
  float32 size (``benchmarks/verify_memory.py``);
* ``streaming``: each side holds one decoder layer (or other module: embedding, lm_head, a Medusa head) at a
  time, read again from the files on every forward pass (``huggingface/streaming.py`` for transformers, the executor's
  ``streaming``): about :data:`LIBRARIES_BYTES` + :data:`STREAMING_PER_UNIT` x the largest such unit in float32,
  whatever the model's size, plus the activations and KV caches of the prompts; the results are identical.

``--streaming`` / ``--no_streaming`` choose; otherwise streaming is chosen when the in-memory estimate exceeds
``--max_memory`` (GB), or, without it, the memory this machine has available (``MemAvailable``, under a cgroup
limit where one is set): the rule and the base's sizes are ``huggingface.memory_mode``'s, which train-heads shares. The report
says which mode ran and why (``huggingface.memory_mode``).

May import: ``devices``, ``errors``, ``files``, ``huggingface.memory_mode``, ``quant``, ``reference``; no other verify module.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.huggingface.memory_mode import (
    GB,
    LIBRARIES_BYTES,
    STREAMING_PER_UNIT,
    VERIFY_PER_FLOAT32,
    MemoryMode,
    check_max_memory,
    hf_sizes,
    select,
    unit_sizes,
)
from trtllm_medusa_ports.machine import devices
from trtllm_medusa_ports.quant import QuantSpec, format_name
from trtllm_medusa_ports.reference.executor import streaming_group


def estimate(model_dir: str | Path, ckpt) -> tuple[int, int]:
    """(float32 bytes of the larger model, float32 bytes of the largest unit of either side), from the weight
    files' headers (nothing is read; memory_mode.hf_sizes for the base)."""
    base_total, base_unit = hf_sizes(model_dir)
    ckpt_total, ckpt_unit = 0, 0
    for r, tensors in enumerate(ckpt.ranks):
        total, unit = unit_sizes(((n, t.shape) for n, t in tensors.items()),
                                 lambda n, r=r: f"{r}:{streaming_group(n)}")
        ckpt_total, ckpt_unit = ckpt_total + total, max(ckpt_unit, unit)
    return max(base_total, ckpt_total), max(base_unit, ckpt_unit)


def check_device(device: str) -> str:
    """``device`` as torch names it (``cpu``, ``cuda``, ``cuda:N``), refused where torch cannot compute
    (devices.check_device) or where verify does not run (another device type)."""
    device = devices.check_device(device, "--device", ModelError)
    if torch.device(device).type not in ("cpu", "cuda"):
        raise ModelError(f"--device {device}: verify runs on cpu or cuda", fix="use cpu, cuda or cuda:N")
    return device


def default_device(device: str):
    """The scope in which torch's factory functions make tensors on ``device`` (``torch.device`` as a context
    manager); none on the CPU, where they make them anyway (the scope's dispatch costs about 40% of a small model's
    verify time)."""
    return contextlib.nullcontext() if torch.device(device).type == "cpu" else torch.device(device)


def cpu_scope(device: str):
    """Inside :func:`default_device` of ``device``: a scope in which factory functions make tensors on the CPU
    again (work on the files' tensors), none where ``device`` is the CPU already."""
    return contextlib.nullcontext() if torch.device(device).type == "cpu" else torch.device("cpu")


def choose(model_dir: str | Path, ckpt, *, streaming: bool | None, max_memory_gb: float | None,
           device: str = "cpu") -> MemoryMode:
    """The memory mode (see the module doc); a quantization streaming does not emulate is refused there."""
    cap = check_max_memory(max_memory_gb)
    total, unit = estimate(model_dir, ckpt)
    in_memory = LIBRARIES_BYTES + int(VERIFY_PER_FLOAT32 * total)
    streamed = LIBRARIES_BYTES + int(STREAMING_PER_UNIT * unit)
    mode, reason = select(streaming, max_memory_gb, in_memory)
    out = MemoryMode(mode, reason, device, total, unit, in_memory, streamed, cap)
    if out.streaming:
        refuse_unstreamed_quantization(QuantSpec.from_config(ckpt.config), out)
    return out


def refuse_unstreamed_quantization(spec: QuantSpec, mode: MemoryMode) -> None:
    """Streaming emulates weight-only quantization layer by layer; the formats whose scales verify re-derives by
    a calibration run (FP8, SmoothQuant, a quantized KV cache) and the tools' AWQ / SmoothQuant codes are checked
    against the whole transformers model at once, which streaming does not hold."""
    if spec.any and (not spec.weight_only or spec.needs_calibration):
        raise ModelError(f"{format_name(spec)}: streaming verify emulates weight-only quantization only ("
                         f"{mode.reason}; in memory it needs about {mode.estimated_in_memory_bytes / GB:.1f} GB)",
                         fix="verify in memory on a machine with that much (--no_streaming), or verify the same base "
                             "converted in float or weight-only here")
