"""How many torch threads the computing commands use (check's range pass, verify, train-heads, tune-tree)."""

from __future__ import annotations

import contextlib
import os


def default_threads() -> int:
    """torch threads for the commands that compute (check's range pass, verify, train-heads, tune-tree): the
    cores nobody else is using, at least one, at most torch's own default.

    These commands run thousands of small operations; when torch's threads outnumber the idle cores every
    operation waits for a descheduled thread. Measured on 2 cores with one busy: verify of SmolLM2-135M took
    13 s on one thread and 290 s on two; train-heads and tune-tree on Gemma-3 270M ran 5-7x slower on two.
    On an idle machine this is torch's default."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
        idle = round(cores - os.getloadavg()[0])
    except (AttributeError, OSError):
        return torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), idle))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch computes with ``n`` threads (None: :func:`default_threads`) inside, as before outside."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n or default_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)
