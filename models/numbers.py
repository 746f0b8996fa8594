"""The two value tests every reader of a user's file applies: a finite real number and a whole
number. Neither is a bool: JSON keeps `true` apart from `1`, Python counts True as an int."""

from __future__ import annotations

import math
from typing import Any


def number(v: Any) -> bool:
    """A finite int or float (an int beyond any float counts as not finite)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def whole(v: Any, lo: int | None = None, hi: int | None = None) -> bool:
    """An int, not a bool, within [lo, hi] where they are given."""
    return (isinstance(v, int) and not isinstance(v, bool)
            and (lo is None or v >= lo) and (hi is None or v <= hi))
