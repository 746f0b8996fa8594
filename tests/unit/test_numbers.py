"""The one pair of value tests (`core.numbers`) every reader of a user's file applies."""

from __future__ import annotations

import math

import pytest

from capacity_advisor.core.numbers import number, whole


@pytest.mark.parametrize("v, is_number, is_whole", [
    (0, True, True), (3, True, True), (-2, True, True), (2.5, True, False), (2.0, True, False),
    (True, False, False), (False, False, False), (None, False, False), ("3", False, False),
    (math.nan, False, False), (math.inf, False, False), (-math.inf, False, False),
    (10 ** 400, False, True),  # whole, but beyond any float: not a number a reader can compute with
    ([1], False, False), ({"a": 1}, False, False),
])
def test_number_and_whole(v, is_number, is_whole):
    assert number(v) is is_number and whole(v) is is_whole


def test_whole_bounds_are_inclusive_and_optional():
    assert whole(1, 1) and whole(5, 1, 5) and not whole(0, 1) and not whole(6, 1, 5) and whole(-7, hi=0)
    assert not whole(True, 0, 1)  # a bool is never a count, even inside the bounds

