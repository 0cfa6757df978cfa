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
        busy = busy_elsewhere()
        idle = round(cores - (busy if busy is not None else os.getloadavg()[0]))
    except (AttributeError, OSError):
        return torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), idle))


def busy_elsewhere(samples: int = 5, interval: float = 0.02, read=None) -> int | None:
    """Tasks running or ready to run now besides this process: the median of a few reads of /proc/loadavg's
    ``running/total`` field (this process counts itself once), or None where there is no such file. The
    one-minute load average this replaced still counted a command that had ended a minute ago: run right after
    one, train-heads took one thread of two and ran 1.5x slower."""
    import time

    read = read or (lambda: open("/proc/loadavg").read())  # noqa: SIM115
    counts = []
    for i in range(samples):
        try:
            counts.append(int(read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, sorted(counts)[len(counts) // 2])


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
