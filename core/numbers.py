"""The two value tests every reader of a user's file applies: a finite real number and a whole
number. Neither is a bool: JSON keeps `true` apart from `1`, Python counts True as an int.
`strict_loads` is the JSON parse of files whose every number must be one of them (records, a
lab build's `build.json`): Python's own parser takes NaN, Infinity and overflowing floats."""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DIGITS = 30  # no count, size or seed comes near it; int() of a longer one takes time growing with its square


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


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of more than {MAX_DIGITS} digits")
    return int(text)


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text[:20]} overflows a float")
    return x


def strict_loads(text: str | bytes) -> Any:
    """json.loads that refuses NaN / Infinity literals, floats that overflow and integers of more
    than MAX_DIGITS digits (each a ValueError naming it)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)
