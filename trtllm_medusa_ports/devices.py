"""What a device computes fast, measured: bfloat16 against float32 (:func:`bfloat16_slowdown`,
:func:`choose_dtype`), and which GPUs a torchrun rank takes (:func:`rank_gpus`).

``train-heads`` computes in bfloat16 where that is fast (CPUs with AVX512-BF16 or AMX, GPUs from Ampere on) and in
float32 elsewhere - on a CPU without bfloat16 units a held-out run measured ``--fit_dtype bfloat16`` 42x slower
than float32 (32-47 s a step of a 270M base). torch emulates bfloat16 where the units are missing, so a small
matmul in both dtypes is timed, once per device and process.
"""

from __future__ import annotations

import functools
import time


def rank_gpus(local_rank: int, local_world: int, count: int) -> list[int]:
    """The GPUs of one of ``local_world`` ranks on a node of ``count`` (torchrun's ``LOCAL_RANK`` /
    ``LOCAL_WORLD_SIZE``): a contiguous block of ``count // local_world``, at least one (all of them for one rank)."""
    if count <= 0:
        return []
    per = max(1, count // max(1, local_world))
    first = (local_rank * per) % count
    return list(range(first, min(count, first + per)))


# -- bfloat16 only where the device computes it fast (train-heads --dtype / --fit_dtype auto) -------------------
#: bfloat16 is the default where its matmul takes at most this share of float32's time (clearly faster: a ratio
#: near 1 could flip between runs, and with it the corpus' cache key)
FAST_RATIO = 0.8
#: an explicit bfloat16 warns where its matmul takes more than this many times float32's
SLOW_RATIO = 3.0


@functools.cache
def bfloat16_slowdown(device: str = "cpu") -> float:
    """Time of a bfloat16 matmul over a float32 one on ``device`` (below 1: bfloat16 is faster): the best of 5
    after a warm-up, of a 256x256 product on a CPU, 2048x2048 on a GPU. Measured once per device and process;
    raises what torch raises where bfloat16 cannot be multiplied at all."""
    import torch

    dev = torch.device(device)
    n = 2048 if dev.type == "cuda" else 256
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dev), torch.randn(n, n, generator=g).to(dev)

    def best(dtype) -> float:
        x, y = a.to(dtype), b.to(dtype)
        times = []
        for _ in range(6):  # the first is the warm-up (kernels chosen, pages touched)
            t0 = time.perf_counter()
            x @ y
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        return max(min(times[1:]), 1e-9)

    return best(torch.bfloat16) / best(torch.float32)


def choose_dtype(requested: str, device: str, flag: str, *, slowdown: float | None = None) -> tuple[str, str | None]:
    """The compute dtype for ``requested`` on ``device``, and a warning (or None).

    ``auto``: bfloat16 where the device's bfloat16 matmul is clearly faster than float32 (at most
    :data:`FAST_RATIO` of its time), float32 elsewhere. An explicit bfloat16 is kept; where it is more than
    :data:`SLOW_RATIO` times slower the warning says so with the measured ratio. Other dtypes are returned as
    given, unprobed. ``slowdown``: the probe's ratio (None: measured here, once; tests inject it)."""
    if requested not in ("auto", "bfloat16"):
        return requested, None
    if slowdown is None:
        try:
            slowdown = bfloat16_slowdown(device)
        except (RuntimeError, TypeError) as exc:  # no bfloat16 matmul on this device or build at all
            if requested == "auto":
                return "float32", None
            why = " ".join(str(exc).split())[:160]
            return requested, f"{flag} bfloat16: {device} cannot multiply in bfloat16 ({type(exc).__name__}: {why})"
    if requested == "auto":
        return ("bfloat16" if slowdown <= FAST_RATIO else "float32"), None
    if slowdown > SLOW_RATIO:
        return requested, (f"{flag} bfloat16 on {device}: a bfloat16 matmul measured {slowdown:.1f}x slower than "
                           "float32 here (no fast bfloat16 units: a held-out run on such a CPU took 32-47 s a step "
                           f"of a 270M base, 42x float32's); leave {flag} at auto or pass {flag} float32")
    return requested, None
