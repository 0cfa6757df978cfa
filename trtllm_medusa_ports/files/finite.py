"""NaN/Inf detection that is cheap on half precision.

``torch.isfinite`` on float16/bfloat16 CPU tensors is slow (it dominated the
conversion profile); a value is non-finite exactly when all its exponent bits are
set, which an integer view tests quickly.
"""

from __future__ import annotations

import torch

from trtllm_medusa_ports.files.dtypes import BY_NAME, to_torch

_CHUNK = 1 << 22

#: float dtype -> (signed integer view of the same width, exponent mask), from the dtype table
_INT_OF_WIDTH = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_EXPONENT = {to_torch(d.name): (_INT_OF_WIDTH[d.itemsize], d.exponent) for d in BY_NAME.values() if d.bits}


def all_finite(t: torch.Tensor) -> bool:
    if not t.is_floating_point():
        return True
    spec = _EXPONENT.get(t.dtype)
    if spec is None:
        return bool(torch.isfinite(t).all())
    int_dtype, mask = spec
    bits = t.contiguous().view(int_dtype).reshape(-1)
    # in chunks: the temporaries stay small next to a vocab x hidden tensor
    for start in range(0, bits.numel(), _CHUNK):
        part = bits[start : start + _CHUNK]
        if bool(((part & mask) == mask).any()):
            return False
    return True


def count_non_finite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0
