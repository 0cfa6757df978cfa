"""The torch device a command computes on (convert's calibration pass, train-heads), checked by computing on it.

``torch.device(...)`` accepts names nothing can run on: ``meta`` holds no values, ``cuda`` parses on a
machine without CUDA, ``cuda:7`` on one with two GPUs. Only allocating there and multiplying tells, so that
is the check, run when the flags are read, before any model is loaded.

What a device computes fast is measured the same way (:func:`bfloat16_slowdown`, :func:`choose_dtype`):
``train-heads`` computes in bfloat16 where that is fast (CPUs with AVX512-BF16 or AMX, GPUs from Ampere on) and in
float32 elsewhere - on a CPU without bfloat16 units a held-out run measured ``--fit_dtype bfloat16`` 42x slower
than float32 (32-47 s a step of a 270M base). torch emulates bfloat16 where the units are missing, so a small
matmul in both dtypes is timed, once per device and process.
"""

from __future__ import annotations

import functools
import time

from trtllm_medusa_ports.errors import PortError

DEVICE_FIX = ("use --device cpu, or cuda / cuda:N for a GPU this torch can reach (python -c \"import torch; "
              "print(torch.cuda.is_available(), torch.cuda.device_count())\")")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def check_device(device: str, flag: str = "--device", error: type[PortError] = PortError) -> str:
    """``device`` as torch spells it, when torch can allocate a tensor there and multiply two; otherwise
    ``error`` naming ``flag``, the device and what torch said (never a traceback from deep in the run)."""
    import torch

    if not isinstance(device, str) or not device.strip():
        raise error(f"{flag} {device!r} names no device", fix=DEVICE_FIX)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise error(f"{flag} {device!r} is not a torch device ({_first_line(exc)})", fix=DEVICE_FIX) from None
    if dev.type == "meta":
        raise error(f"{flag} {device}: the meta device holds shapes but no values, so nothing can be computed on it",
                    fix=DEVICE_FIX)
    try:
        torch.empty(1, device=dev)
        a = torch.ones(2, 2, device=dev)
        got = float((a @ a).sum().cpu())
    except Exception as exc:  # noqa: BLE001 - RuntimeError, AssertionError (a torch built without CUDA), ...
        raise error(f"{flag} {device}: torch cannot compute there ({_first_line(exc)})", fix=DEVICE_FIX) from None
    if got != 8.0:
        raise error(f"{flag} {device}: a 2x2 product of ones came out {got}, not 8", fix=DEVICE_FIX)
    return str(dev)


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
