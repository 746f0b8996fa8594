"""Stored numbers: the held-out table `advisor fit` computes on the committed calibration records of
the lab's first eleven pool sources (a small logistic ensemble, so it runs in seconds), against
tests/data/cv_table.json. A change to
labelling, folds, the policy's threshold search, the gate's choice and the replayed races, the
baselines, the noise floor or the flip rate across seeds that moves any figure shows here.

To store new numbers after a deliberate change (or new records):
ADVISOR_STORE_NUMBERS=1 pytest tests/stored/test_stored_cv.py
"""

from pathlib import Path

import pytest
from helpers import stored_numbers

from capacity_advisor.advisor.fit import CHOOSE_BY, compact
from capacity_advisor.advisor.predictor import FEATURE_SETS, cross_validate, label_rows, read_records, unit_of
from capacity_advisor.advisor.predictor.gate import SCOUTS
from capacity_advisor.advisor.predictor.races import with_curves
from helpers import ROOT

RECORDS = ROOT / "calibration" / "records.jsonl"
STORED = Path(__file__).parents[1] / "data" / "cv_table.json"
# the pool sources of the table stored (the lab's first two recipes); the sources published since sit
# beside them in the file and in the shipped fit, and are left out here to keep this check's size
FIRST_SOURCES = ("lab1:addition/lab:teacher@T1", "lab1:modchain/lab:teacher@T1", "lab1:modchain/program",
                 "lab2:addition/lab:teacher-xl@T0.7", "lab2:addition/lab:teacher@T1", "lab2:listmax/lab:teacher-xl@T1",
                 "lab2:listmax/lab:teacher@T0.7", "lab2:listmax/program", "lab2:modchain/lab:teacher-xl@T1",
                 "lab2:modchain/lab:teacher@T1", "lab2:modchain/program")


@pytest.mark.slow
@pytest.mark.parametrize("split", ["source"])  # one split: the others run the same code on other folds
def test_the_cv_table_of_the_committed_records_matches_the_stored_numbers(split):
    records = [r for r in read_records(RECORDS) if unit_of(r)["source"] in FIRST_SOURCES]
    assert len(records) == 906
    rows = with_curves(label_rows(records), records)
    table = cross_validate(rows, split, "logistic", FEATURE_SETS["contrast"], n_members=2, policy_split=CHOOSE_BY,
                           scouts=SCOUTS)  # the shipped gate's grid (`advisor fit --scout`)
    got = compact({split: table})[split]
    want = stored_numbers(STORED, split, got)
    assert sorted(got) == sorted(want)
    for method, row in want.items():
        assert got[method]["rows"] == row["rows"], method
        for key in ("regret", "decision_accuracy", "flip_rate", "p_low_spread"):
            assert got[method].get(key) == pytest.approx(row.get(key), abs=1e-6), (method, key)
        assert got[method]["flip_cells"] == row["flip_cells"], method
        if "other_seed" in row:  # the gated race, and beside it the policy, the predictor, always-high
            assert got[method]["other_seed"]["regret"] == pytest.approx(row["other_seed"]["regret"], abs=1e-6), method
        if "within_3_points" in row:  # TuneAhead's share of good-enough decisions: never below decision accuracy
            assert got[method]["within_3_points"] == pytest.approx(row["within_3_points"], abs=1e-6), method
            assert got[method]["within_3_points"] >= got[method]["decision_accuracy"] - 1e-9, method
    gated = got["gated race"]
    assert gated["overhead"] == pytest.approx(want["gated race"]["overhead"], abs=1e-6)
    # the same race on every held-out pool: what the gate saves against it, and what that costs
    every = gated["race_every_pool"]
    assert every == pytest.approx(want["gated race"]["race_every_pool"], abs=1e-6)
    assert every["rows"] == gated["rows"] and every["overhead"] >= gated["overhead"]  # every fold's gate opens here
    assert gated["compute_saved"] == pytest.approx(1 - gated["overhead"] / every["overhead"])
    assert sorted(gated["caps"]) == sorted(want["gated race"]["caps"])
    for cap, row in want["gated race"]["caps"].items():
        assert gated["caps"][cap] == pytest.approx(row, abs=1e-6), cap
