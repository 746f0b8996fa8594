"""experiments.learning_speed: races replayed per band of the probe's learning speed."""

import math

import pytest

from capacity_advisor.advisor.predictor.labels import learning_speed
from experiments.learning_speed import by_speed, markdown


def _row(speed: float, late: bool) -> dict:
    """D_high flat at 0.5; D_low at 0.9 from the first evaluation (a fast learner's early winner) or
    only from 60 % of the budget (`late`)."""
    epochs = [k / 4 for k in range(1, 5)]
    low = [(e, 0.9 if not late or e >= 0.6 else 0.2) for e in epochs]
    return {"source": "s", "score": "sum", "student": "st", "repeat": 0, "budget": 1.0, "label": "low",
            "accuracy": {"high": 0.5, "low": 0.9}, "features": {"high_accuracy_gain": speed / 2, "low_accuracy_gain": speed},
            "curves": {"high": [(e, 0.5) for e in epochs], "low": low}}


def test_a_fast_learners_short_race_keeps_the_winner_and_a_slow_learners_needs_the_long_one():
    assert learning_speed({"high_accuracy_gain": 0.1, "low_accuracy_gain": -0.2}) == 0.1
    assert math.isnan(learning_speed({}))
    rows = [_row(0.5, False)] * 3 + [_row(0.01, True)] * 2
    table = by_speed(rows, fractions=(0.25, 1.0))
    assert [(t["band"][0], t["rows"]) for t in table] == [(-math.inf, 2), (0.3, 3)]  # empty bands left out
    slow, fast = table
    assert fast["races"][0.25] == pytest.approx((0.0, 0.25))  # the winner shows at the first evaluation
    assert slow["races"][0.25] == pytest.approx((40.0, 0.25)) and slow["races"][1.0] == pytest.approx((0.0, 1.0))
    assert slow["always_high"] == pytest.approx(40.0)
    lines = markdown(table).splitlines()
    assert lines[0].startswith("| learning speed |") and "| < 0.05 | 2 | 1 | 40.00 | 40.00 at 25% | 0.00 at 100% |" in lines
