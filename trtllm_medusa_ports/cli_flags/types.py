"""argparse types with a range, named in the error: the ranges of the commands' flags. Each carries what it accepts
(``accepts``), to which the API's validation specs in options/validation.py are held by a test, so that the CLI and
the API accept the same values.

May import: the standard library only.
"""

from __future__ import annotations

import argparse
import math


def int_in(lo: int, hi: int | None = None):
    """An argparse type: an integer in [lo, hi] (hi None: no upper bound), named in the error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo and hi is None:
            raise argparse.ArgumentTypeError(f"{v} must be at least {lo}")
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is outside {lo}..{hi}")
        return v
    parse.accepts = ("int", lo, hi, False, False)
    return parse


def number_in(lo: float, hi: float):
    """An argparse type: a number in [lo, hi] (NaN refused), named in the error."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= v <= hi:  # NaN too
            raise argparse.ArgumentTypeError(f"{v} is outside {lo:g}..{hi:g}")
        return v
    parse.accepts = ("float", lo, hi, False, False)
    return parse


def non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0 (NaN and infinity refused: ``--max_memory inf`` was an OverflowError
    deep in verify), named in the error."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and math.isfinite(v)):  # NaN too
        raise argparse.ArgumentTypeError(f"{v} must be a number >= 0, and finite")
    return v


def positive(text: str) -> float:
    """An argparse type: a finite number > 0, named in the error."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v > 0 and math.isfinite(v)):  # NaN too
        raise argparse.ArgumentTypeError(f"{v} must be a number above 0, and finite")
    return v


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1), named in the error."""
    v = non_negative(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"{v} must be below 1")
    return v


#: what each range type accepts, as (kind, lowest, highest, lowest excluded, highest excluded): the API's validation
#: specs (options/validation.py) are held to it (tests/test_api_inputs.py)
non_negative.accepts = ("float", 0, None, False, False)
positive.accepts = ("float", 0, None, True, False)
fraction.accepts = ("float", 0, 1, False, True)
