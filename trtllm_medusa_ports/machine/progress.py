"""Progress of long work on stderr (tqdm), silenced by ``--quiet``; imports nothing of the package."""

from __future__ import annotations

import sys


class Silent:
    """The progress bar of a --quiet conversion, which does not import tqdm (0.02 s of its start)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, quiet: bool, desc: str = "convert", unit: str = "tensor"):
    if quiet:
        return Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr)
