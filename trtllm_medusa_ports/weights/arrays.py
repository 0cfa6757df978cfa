"""The few array operations the weight layouts need, on torch tensors and numpy arrays alike.

The split rules (sharding.py) and the families' layout combines (archs/) are written once, with
these and with slicing/``reshape`` (which both libraries share). They run on torch tensors on the
tensor path and the ``meta`` device, and on numpy integer stand-ins when files/byte_moves.py
traces which bytes go where - which is how a conversion that only moves bytes never imports torch.
Each function dispatches on its input: numpy arrays stay numpy, anything else is a torch tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:
    import torch

Array = Union["torch.Tensor", np.ndarray]


def is_numpy(t: object) -> bool:
    return isinstance(t, np.ndarray)


def cat(parts: Sequence[Array], dim: int = 0) -> Array:
    """``torch.cat`` / ``np.concatenate``."""
    if all(is_numpy(p) for p in parts):
        return np.concatenate(list(parts), axis=dim)
    import torch

    return torch.cat(list(parts), dim=dim)


def chunk(t: Array, chunks: int, dim: int = 0) -> tuple[Array, ...]:
    """``torch.chunk``: pieces of ``ceil(size / chunks)`` along ``dim``, the last one shorter (so there
    may be fewer than ``chunks``); an empty dimension gives ``chunks`` empty pieces."""
    if not is_numpy(t):
        return tuple(t.chunk(chunks, dim=dim))
    if chunks < 1:
        raise ValueError(f"chunk expects at least one chunk, got {chunks}")
    size = t.shape[dim]
    step = -(-size // chunks)
    index: list = [slice(None)] * t.ndim
    if size == 0:
        return (t,) * chunks
    out = []
    for start in range(0, size, step):
        index[dim] = slice(start, start + step)
        out.append(t[tuple(index)])
    return tuple(out)


def zeros_like_rows(t: Array, rows: int) -> Array:
    """Zeros of ``t``'s dtype (and device) with ``rows`` rows and ``t``'s other dimensions."""
    shape = (rows,) + tuple(t.shape[1:])
    if is_numpy(t):
        return np.zeros(shape, dtype=t.dtype)
    import torch

    return torch.zeros(shape, dtype=t.dtype, device=t.device)


def swap_last(t: Array) -> Array:
    """The last two dimensions swapped (``torch.transpose(-1, -2)`` / ``np.swapaxes``), a view."""
    if is_numpy(t):
        return np.swapaxes(t, -1, -2)
    return t.transpose(-1, -2)


def contiguous(t: Array) -> Array:
    return np.ascontiguousarray(t) if is_numpy(t) else t.contiguous()
