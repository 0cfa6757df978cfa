"""Which memory mode a command that runs the Hugging Face base runs in (``verify``, ``train-heads``): what both
estimate and how both choose.

* ``in-memory``: the command holds the whole base (transformers' model in float32);
* ``streaming``: one decoder layer (or other module: embedding, final norm, lm_head) at a time, read again from a
  temporary file on every forward pass (``huggingface/streaming.py``): the same values and kernels, bounded memory.

Each command estimates its own in-memory and streaming peaks from these sizes (the weight files' headers, nothing
read) and its measured slopes (``benchmarks/verify_memory.py``, ``benchmarks/train_memory.py``); :func:`select`
applies the one rule: ``--streaming`` / ``--no_streaming`` decide; otherwise streaming where the in-memory estimate
exceeds ``--max_memory`` GB or, without it, the memory this machine has available (``MemAvailable``, under a
cgroup limit where one is set) - shared by the ranks torchrun started on this node.

Imports the file layer and errors only: verify and train-heads both import it, never each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from trtllm_medusa_ports.errors import ModelError, PortError
from trtllm_medusa_ports.files.lazy_tensors import read_tensor_files, weight_files

GB = 1e9
# -- the one formula of both commands (benchmarks/verify_memory.py, benchmarks/train_memory.py measure it; the user
# guide's "Large bases" and benchmarks/README.md quote it through :func:`in_memory_formula` / :func:`streaming_formula`,
# which tests/test_memory_bounds.py holds them to) --------------------------------------------------------------
#: torch, transformers, this package and their first allocations, with the allocator's slack (0.26 GB of RSS for
#: the imports alone; the intercept of the measured lines)
LIBRARIES_BYTES = int(0.73 * GB)
#: verify in memory: the peak per float32 byte of the larger of base and checkpoint (each side's model in float32,
#: one after the other; on bfloat16 files transformers' float32 copy beside the mapped file)
VERIFY_PER_FLOAT32 = 1.5
#: train-heads in memory: the corpus pass's peak per float32 byte of the base (the fit's own memory on top:
#: heads/train.py fit_bytes)
TRAIN_PER_FLOAT32 = 1.35
#: streaming, both commands: the peak per float32 byte of the largest unit (the unit, its read buffer, a cast copy)
STREAMING_PER_UNIT = 3.0


def in_memory_formula(per_float32: float, size: str) -> str:
    """The in-memory estimate in words: ``0.73 GB + 1.5x <size>``."""
    return f"{LIBRARIES_BYTES / GB:.2f} GB + {per_float32:g}x {size}"


def streaming_formula() -> str:
    """The streaming estimate in words: ``0.73 GB + 3x the largest unit``."""
    return f"{LIBRARIES_BYTES / GB:.2f} GB + {STREAMING_PER_UNIT:g}x the largest unit in float32"

#: a Hugging Face tensor of a decoder layer: ``model.layers.3.``, ``transformer.h.3.``, ``transformer.blocks.3.``
_HF_LAYER = re.compile(r"(.*?(?:^|\.)(?:layers|h|blocks|layer)\.\d+)\.")


@dataclass
class MemoryMode:
    """What a command runs with: verify's report's and train-heads' result's ``huggingface.memory_mode``."""

    mode: str  # "in-memory" or "streaming"
    reason: str
    device: str
    #: float32 bytes: the model (verify: the larger of the base and the checkpoint) and its largest unit (of either)
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


def unit_sizes(names_shapes: Iterable[tuple[str, tuple[int, ...]]], group: Callable[[str], str]) -> tuple[int, int]:
    """(total float32 bytes, the largest group's) of ``(name, shape)`` pairs grouped by ``group(name)``."""
    sizes: dict[str, int] = {}
    for name, shape in names_shapes:
        n = 4
        for s in shape:
            n *= s
        sizes[group(name)] = sizes.get(group(name), 0) + n
    return sum(sizes.values()), max(sizes.values(), default=0)


def hf_unit(name: str) -> str:
    """The streaming unit a Hugging Face tensor belongs to: its decoder layer, else its module."""
    m = _HF_LAYER.match(name)
    return m.group(1) if m else name.rsplit(".", 1)[0]


def hf_sizes(model_dir: str | Path) -> tuple[int, int]:
    """(float32 bytes of the base, float32 bytes of its largest unit), from the weight files' headers. A base whose
    files cannot be indexed counts as empty here: loading it reports why."""
    try:
        base = read_tensor_files(weight_files(Path(model_dir)), ModelError)
    except (PortError, OSError):
        base = {}
    return unit_sizes(((n, t.shape) for n, t in base.items()), hf_unit)


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


def check_max_memory(max_memory_gb: float | None) -> int | None:
    """``--max_memory`` in bytes (None: not given), refused unless a positive number of GB."""
    if max_memory_gb is None:
        return None
    if not max_memory_gb > 0:
        raise ModelError(f"--max_memory {max_memory_gb} must be a positive number of GB", fix="e.g. --max_memory 16",
                         usage=True)
    return int(max_memory_gb * GB)


def ignored_max_memory(streaming: bool | None, max_memory_gb: float | None) -> list[str]:
    """The note that ``--max_memory`` was not used (both commands say it): ``--streaming`` / ``--no_streaming``
    chose the mode, so the budget judged nothing."""
    if max_memory_gb is None or streaming is None:
        return []
    return [f"--max_memory ignored: --{'streaming' if streaming else 'no_streaming'} chose the memory mode"]


def select(streaming: bool | None, max_memory_gb: float | None, in_memory_bytes: int, *,
           ranks_here: int = 1) -> tuple[str, str]:
    """``(mode, reason)``: the flags' choice, else streaming where ``in_memory_bytes`` (one process's estimate)
    exceeds ``--max_memory`` (per process) or this machine's available memory divided among ``ranks_here``
    processes (torchrun's ranks on this node, each holding its own copy)."""
    cap = check_max_memory(max_memory_gb)
    if streaming is not None:
        return ("streaming", "--streaming") if streaming else ("in-memory", "--no_streaming")
    if cap is not None:
        fits = in_memory_bytes <= cap
        return ("in-memory" if fits else "streaming",
                f"the in-memory estimate {'fits' if fits else 'exceeds'} --max_memory {max_memory_gb:g} GB")
    free = available_bytes()
    each = None if free is None else free // max(1, ranks_here)
    fits = each is None or in_memory_bytes <= each
    if fits:
        return "in-memory", "the in-memory estimate fits the available memory"
    ranks = f" among {ranks_here} ranks on this node ({each / GB:.1f} GB each)" if ranks_here > 1 else ""
    return "streaming", f"the in-memory estimate exceeds the {free / GB:.1f} GB available{ranks}"
