"""Tensor dtypes by name ("float16", "bfloat16", ...), without importing torch.

Planning a conversion and moving its bytes needs only a dtype's name, its safetensors code, its
size and, for the NaN/Inf test, its exponent bits; torch (1-2 s to import) is imported by
:func:`to_torch` only where a tensor is made. Names are torch's own (``str(torch.float16)``
without ``torch.``), so :func:`name_of` and :func:`to_torch` are each other's inverse.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str
    safetensors: str  # the header's dtype code
    itemsize: int
    floating: bool
    #: for floats: the numpy unsigned type of the same width and the exponent mask; a value is NaN/Inf
    #: exactly when every exponent bit is set
    bits: str | None = None
    exponent: int = 0


_TABLE = (
    DType("float64", "F64", 8, True, "uint64", 0x7FF0000000000000),
    DType("float32", "F32", 4, True, "uint32", 0x7F800000),
    DType("float16", "F16", 2, True, "uint16", 0x7C00),
    DType("bfloat16", "BF16", 2, True, "uint16", 0x7F80),
    # FP8 weights of quantized checkpoints (no infinities; the NaN/Inf byte check does not apply: they are
    # cast from checked float tensors with saturation, trtllm_medusa_ports/quant)
    DType("float8_e4m3fn", "F8_E4M3", 1, True),
    DType("int64", "I64", 8, False),
    DType("int32", "I32", 4, False),
    DType("int16", "I16", 2, False),
    DType("int8", "I8", 1, False),
    DType("uint8", "U8", 1, False),
    DType("bool", "BOOL", 1, False),
)
#: name -> dtype, for every dtype a safetensors file read here may hold
BY_NAME = {d.name: d for d in _TABLE}
#: safetensors header code -> dtype
BY_SAFETENSORS = {d.safetensors: d for d in _TABLE}
#: the dtypes of a TensorRT-LLM checkpoint written here (and of the base weights it reads)
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")


def itemsize(name: str) -> int:
    """Bytes per element; a dtype outside the table (from a pickle: torch is loaded) asks torch."""
    d = BY_NAME.get(name)
    return d.itemsize if d is not None else to_torch(name).itemsize


def is_floating(name: str) -> bool:
    d = BY_NAME.get(name)
    return d.floating if d is not None else to_torch(name).is_floating_point


def to_torch(name: str) -> torch.dtype:
    """The torch dtype of a name (imports torch)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise KeyError(f"{name!r} is not a torch dtype")
    return dtype


def name_of(dtype: torch.dtype) -> str:
    """The name of a torch dtype: ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


# -- casts without torch ------------------------------------------------------------------------
#: source and target dtypes :func:`cast_bits` converts exactly as torch's CPU ``Tensor.to`` does
NUMPY_CASTS = ("float32", "float16", "bfloat16")


def can_cast_without_torch(src: str, dst: str) -> bool:
    return src in NUMPY_CASTS and dst in NUMPY_CASTS


def cast_bits(data, src: str, dst: str, out=None):
    """Cast raw little-endian ``src`` values (a bytes-like object) to ``dst``; returns a numpy array
    of ``dst``'s bits (uint16/uint32): ``out`` where given (a writable array of that many elements,
    reused between chunks so that no chunk needs fresh memory).

    The result is bit for bit what torch's CPU cast gives for finite values, and NaN/Inf stay
    non-finite (conversion refuses them anyway): torch widens float16 and bfloat16 to float32
    exactly (``c10::Half`` and ``c10::BFloat16`` convert through ``float``), rounds float32 to
    float16 to nearest-even with overflow to infinity (numpy's ``astype`` does the same), and rounds
    float32 to bfloat16 to nearest-even by adding ``0x7FFF`` plus the lowest kept bit before
    dropping the low 16 bits (c10/util/BFloat16.h, ``round_to_nearest_even``).
    """
    import numpy as np

    if not can_cast_without_torch(src, dst):
        raise ValueError(f"no torch-free cast from {src} to {dst}")
    if (src, dst) == ("bfloat16", "float16"):
        return _bfloat16_to_float16(np.frombuffer(data, dtype=np.uint16), out)
    if out is not None:
        np.copyto(out, cast_bits(data, src, dst), casting="no")
        return out
    if src == "float32":
        wide = np.frombuffer(data, dtype=np.float32)
    elif src == "float16":
        wide = np.frombuffer(data, dtype=np.float16).astype(np.float32)
    else:  # bfloat16: the high half of a float32
        wide = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dst == "float32":
        return wide.view(np.uint32)
    if dst == "float16":
        with np.errstate(over="ignore"):  # overflow gives inf, as torch's; the caller rejects it
            return wide.astype(np.float16).view(np.uint16)
    bits = wide.view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(wide)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


#: elements per block of :func:`_bfloat16_to_float16`. Two lanes cast side by side, and each numpy
#: call takes the GIL: two threads on 2 cores cast 1.1 GB/s in all with 2^14-element blocks, 2.6
#: with 2^16, 3.6 with 2^20 (benchmarks/casts.py). The temporaries are reused (see :func:`scratch`),
#: so a block never touches fresh memory.
_BLOCK = 1 << 20

_local = threading.local()


def scratch(name: str, size: int, dtype):
    """A numpy array of ``size`` elements of ``dtype``, this thread's own, reused from call to call
    (grown when needed, kept for the thread's life): chunk loops get their temporaries without
    allocating fresh memory for every chunk. Contents are undefined."""
    import numpy as np

    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    dtype = np.dtype(dtype)
    buf = bufs.get(name)
    if buf is None or buf.nbytes < size * dtype.itemsize:
        buf = bufs[name] = np.empty(size * dtype.itemsize, dtype=np.uint8)
    return buf[: size * dtype.itemsize].view(dtype)


def _bfloat16_to_float16(bits, out=None):
    """bfloat16 bits to float16 bits, as torch's cast (through float32, rounded to nearest-even).

    Where the value is a normal float16 (bfloat16 exponent 113..142) the cast is exact and only moves
    fields: float16 keeps the sign, rebiases the exponent by 127 - 15 = 112 and widens the 7-bit
    mantissa to 10 bits, which in one step is ``((b & 0x7FFF) - (112 << 7)) << 3``. The few other
    values (zeros, float16 subnormals, overflow, NaN/Inf) take the float32 route. Worked in blocks
    through reused temporaries: several times numpy's float32 route on weights (benchmarks/casts.py).
    """
    import numpy as np

    if out is None:
        out = np.empty_like(bits)
    size = min(_BLOCK, bits.size)
    magnitude, sign = scratch("bf16-magnitude", size, np.uint16), scratch("bf16-sign", size, np.uint16)
    other = scratch("bf16-other", size, bool)
    rest = []
    for i in range(0, bits.size, _BLOCK):
        b = bits[i:i + _BLOCK]
        n = b.size
        o, m, s, f = out[i:i + n], magnitude[:n], sign[:n], other[:n]
        np.bitwise_and(b, np.uint16(0x7FFF), out=m)
        np.subtract(m, np.uint16(112 << 7), out=o)
        np.left_shift(o, np.uint16(3), out=o)
        np.bitwise_and(b, np.uint16(0x8000), out=s)
        np.bitwise_or(o, s, out=o)
        # outside [113 << 7, 143 << 7) the subtraction wraps, so one unsigned comparison finds them
        np.subtract(m, np.uint16(113 << 7), out=m)
        np.greater_equal(m, np.uint16(30 << 7), out=f)
        if f.any():
            rest.append(np.flatnonzero(f) + i)
    if rest:
        idx = np.concatenate(rest)
        wide = (bits[idx].astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):
            out[idx] = wide.astype(np.float16).view(np.uint16)
    return out
