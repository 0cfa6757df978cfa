"""Which memory mode verify runs in, and on which device.

* ``in-memory``: each side holds its whole model in float32 - transformers' first, freed, then the checkpoint's
  on the reference executor: about :data:`LIBRARIES_BYTES` + :data:`IN_MEMORY_PER_FLOAT32` x the model's
  float32 size (``benchmarks/verify_memory.py``);
* ``streaming``: each side holds one decoder layer (or other module: embedding, lm_head, a Medusa head) at a
  time, read again from the files on every forward pass (``base_streaming.py`` for transformers, the executor's
  ``streaming``): about :data:`LIBRARIES_BYTES` + :data:`STREAMING_PER_UNIT` x the largest such unit in float32,
  whatever the model's size, plus the activations and KV caches of the prompts; the results are identical.

``--streaming`` / ``--no_streaming`` choose; otherwise streaming is chosen when the in-memory estimate exceeds
``--max_memory`` (GB), or, without it, the memory this machine has available (``MemAvailable``, under a cgroup
limit where one is set). The report says which mode ran and why (``memory_mode``).

May import: ``devices``, ``errors``, ``files``, ``quant``, ``reference``; no other verify module.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports import devices
from trtllm_medusa_ports.errors import ModelError, PortError
from trtllm_medusa_ports.files.lazy_tensors import read_tensor_files, weight_files
from trtllm_medusa_ports.quant import QuantSpec, format_name
from trtllm_medusa_ports.reference.executor import streaming_group

GB = 1e9
#: torch, transformers, this package and their first allocations (benchmarks/verify_memory.py's intercept)
LIBRARIES_BYTES = int(0.73 * GB)
#: the in-memory peak per float32 byte of the larger of the two models (benchmarks/verify_memory.py's slope)
IN_MEMORY_PER_FLOAT32 = 0.95
#: the streaming peak per float32 byte of the largest unit: the unit itself, its read buffer and a rounded copy
STREAMING_PER_UNIT = 3.0

#: a Hugging Face tensor of a decoder layer: ``model.layers.3.``, ``transformer.h.3.``, ``transformer.blocks.3.``
_HF_LAYER = re.compile(r"(.*?(?:^|\.)(?:layers|h|blocks|layer)\.\d+)\.")


@dataclass
class MemoryMode:
    """What verify runs with; the report's ``memory_mode``."""

    mode: str  # "in-memory" or "streaming"
    reason: str
    device: str
    #: float32 bytes: the larger of the base and the checkpoint, and the largest unit of either
    float32_bytes: int
    largest_unit_bytes: int
    estimated_in_memory_bytes: int
    estimated_streaming_bytes: int
    max_memory_bytes: int | None = None

    @property
    def streaming(self) -> bool:
        return self.mode == "streaming"

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.mode} on {self.device} ({self.reason}); estimated peak "
                f"{self.estimated_in_memory_bytes / GB:.2f} GB in memory, {self.estimated_streaming_bytes / GB:.2f} GB "
                f"streaming (largest layer {self.largest_unit_bytes / GB:.3f} GB in float32)")


def _units(names_shapes, group) -> tuple[int, int]:
    """(total float32 bytes, the largest group's) of ``(name, shape)`` pairs grouped by ``group(name)``."""
    sizes: dict[str, int] = {}
    for name, shape in names_shapes:
        n = 4
        for s in shape:
            n *= s
        sizes[group(name)] = sizes.get(group(name), 0) + n
    return sum(sizes.values()), max(sizes.values(), default=0)


def _hf_group(name: str) -> str:
    m = _HF_LAYER.match(name)
    return m.group(1) if m else name.rsplit(".", 1)[0]


def estimate(model_dir: str | Path, ckpt) -> tuple[int, int]:
    """(float32 bytes of the larger model, float32 bytes of the largest unit of either side), from the weight
    files' headers (nothing is read). A base whose files cannot be indexed counts as empty here: loading it
    reports why."""
    try:
        base = read_tensor_files(weight_files(Path(model_dir)), ModelError)
    except (PortError, OSError):
        base = {}
    base_total, base_unit = _units(((n, t.shape) for n, t in base.items()), _hf_group)
    ckpt_total, ckpt_unit = 0, 0
    for r, tensors in enumerate(ckpt.ranks):
        total, unit = _units(((n, t.shape) for n, t in tensors.items()), lambda n, r=r: f"{r}:{streaming_group(n)}")
        ckpt_total, ckpt_unit = ckpt_total + total, max(ckpt_unit, unit)
    return max(base_total, ckpt_total), max(base_unit, ckpt_unit)


def available_bytes() -> int | None:
    """The memory this process can use: ``MemAvailable`` (Linux), under the cgroup's limit where one is set."""
    out = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                out = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (out is None or int(text) < out):
            out = int(text)
    return out


def check_device(device: str) -> str:
    """``device`` as torch names it (``cpu``, ``cuda``, ``cuda:N``), refused where torch cannot compute
    (devices.check_device) or where verify does not run (another device type)."""
    device = devices.check_device(device, "--device", ModelError)
    if torch.device(device).type not in ("cpu", "cuda"):
        raise ModelError(f"--device {device}: verify runs on cpu or cuda", fix="use cpu, cuda or cuda:N")
    return device


def choose(model_dir: str | Path, ckpt, *, streaming: bool | None, max_memory_gb: float | None,
           device: str = "cpu") -> MemoryMode:
    """The memory mode (see the module doc); a quantization streaming does not emulate is refused there."""
    if max_memory_gb is not None and not max_memory_gb > 0:
        raise ModelError(f"--max_memory {max_memory_gb} must be a positive number of GB", fix="e.g. --max_memory 16")
    total, unit = estimate(model_dir, ckpt)
    in_memory = LIBRARIES_BYTES + int(IN_MEMORY_PER_FLOAT32 * total)
    streamed = LIBRARIES_BYTES + int(STREAMING_PER_UNIT * unit)
    cap = int(max_memory_gb * GB) if max_memory_gb is not None else None
    if streaming is not None:
        mode, reason = ("streaming", "--streaming") if streaming else ("in-memory", "--no_streaming")
    elif cap is not None:
        fits = in_memory <= cap
        mode = "in-memory" if fits else "streaming"
        reason = f"the in-memory estimate {'fits' if fits else 'exceeds'} --max_memory {max_memory_gb:g} GB"
    else:
        free = available_bytes()
        fits = free is None or in_memory <= free
        mode = "in-memory" if fits else "streaming"
        reason = ("the in-memory estimate fits the available memory" if fits else
                  f"the in-memory estimate exceeds the {free / GB:.1f} GB available")
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
