"""SIGINT and SIGTERM while an output is written: honoured at any moment, never half-honoured.

The command line installs :func:`handled` for its whole run: either signal raises ``KeyboardInterrupt`` where the
program is (the partial output is removed as it unwinds) and is also recorded. The record matters because Python
can swallow a ``KeyboardInterrupt``: raised while a finalizer (``__del__``) or a callback runs, it is printed as
"Exception ignored" and the program goes on. :func:`honour` raises for any signal recorded so far, and an output
directory calls it just before it is swapped in (files/checkpoint.py ``atomic_output_dir``): a swallowed Ctrl-C still
leaves the old output as it was, and the command exits 130.

:func:`deferred` holds signals back (recorded, not raised) across the few system calls that swap an output in, so
the swap is never cut in two; a signal that arrived meanwhile is seen by :func:`arrived_since` and the swap undone.

May import: nothing of the package.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: the signals a command honours as an interruption
SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: every signal received since :func:`handled` (or a :func:`deferred` of its own) was installed, in order
_received: list[int] = []
_holding = [0]  # > 0 inside deferred(): record only


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    _received.append(int(signum))
    if not _holding[0]:
        raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` and are recorded, inside; the handlers before are put back after
    (a caller running the command line in-process keeps its own). Outside the main thread: nothing is installed."""
    if not _main_thread():
        yield
        return
    before = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS}
    _received.clear()
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
        _received.clear()


def received() -> int:
    """How many signals were received since :func:`handled` began (a mark for :func:`arrived_since`)."""
    return len(_received)


def arrived_since(mark: int) -> bool:
    return len(_received) > mark


def honour() -> None:
    """``KeyboardInterrupt`` where any signal was received, even one whose ``KeyboardInterrupt`` Python swallowed."""
    if _received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[int]:
    """Inside, SIGINT and SIGTERM are recorded, not raised; yields the :func:`received` mark at entry. Where the
    command line's handlers are not installed (an API caller's program), ours stand in for the block and what they
    recorded is forgotten after it (the caller's own handlers are put back). A signal the block did not act on is
    raised as ``KeyboardInterrupt`` when it ends."""
    if not _main_thread():
        yield received()
        return
    ours = {sig: signal.getsignal(sig) is _on_signal for sig in SIGNALS}
    before = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS if not ours[sig]}
    mark = received()
    _holding[0] += 1
    try:
        yield mark
    finally:
        _holding[0] -= 1
        for sig, old in before.items():
            signal.signal(sig, old)
        late = arrived_since(mark)
        if before:
            del _received[mark:]
    if late:  # held back until the block was done: honoured now
        raise KeyboardInterrupt
