"""The shipped predictor's advice on fixed probe inputs is what it was when it was stored.

The inputs are the committed records' own probe measurements: for every pool source, its first
student in the records (seed 0, summed ranking) at a budget of 1 epoch and at its largest (5 on the lab's
pools, 3 on the real student's). For each, the ensemble's
probabilities, the policy's set, who answered and the race its gate plans (or none) are compared
with tests/data/shipped_advice.json,
so a refit, a change to the policy or to how a row is read shows here as changed advice, not
silently. After a deliberate refit (`advisor fit ... --out advisor/predictor_data`), store the new
advice with: ADVISOR_STORE_NUMBERS=1 pytest tests/stored/test_stored_advice.py
"""


import pytest
from helpers import stored_numbers

from capacity_advisor.advisor.predictor import Policy, label_rows, read_records
from capacity_advisor.advisor.probe.plan import load_predictor
from helpers import ROOT

STORE = ROOT / "tests" / "data" / "shipped_advice.json"


def fixed_inputs() -> list[dict]:
    rows = label_rows(read_records(ROOT / "calibration" / "records.jsonl"))
    largest = {}
    for r in rows:
        largest[r["source"]] = max(largest.get(r["source"], 0), r["budget"])
    chosen, seen = [], set()
    for r in rows:
        key = (r["source"], r["budget"])
        if r["seed"] == 0 and r["score"] == "sum" and r["budget"] in (1, largest[r["source"]]) \
                and key not in seen:
            seen.add(key)
            chosen.append(r)
    return chosen


def test_the_shipped_predictors_advice_on_stored_inputs_is_unchanged():
    shipped = load_predictor(None)
    policy = Policy.of(shipped)
    rows = fixed_inputs()
    assert len({r["source"] for r in rows}) == len({r["source"] for r in label_rows(
        read_records(ROOT / "calibration" / "records.jsonl"))}) and len(rows) == 2 * len({r["source"] for r in rows})
    got = {}
    for r in rows:
        d = policy.decide(shipped, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
        got[f"{r['source']} {r['student']} budget {r['budget']:g}"] = {
            "probabilities": d.advice.probabilities, "predictor": d.advice.strategy, "policy": d.strategy,
            "answered_by": d.answered_by, "confidence": d.advice.confidence, "race": d.race}
    want = stored_numbers(STORE, "advice", got)
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        assert (g["predictor"], g["policy"], g["answered_by"], g["confidence"]) == \
            (w["predictor"], w["policy"], w["answered_by"], w["confidence"]), key
        assert g["probabilities"] == pytest.approx(w["probabilities"], abs=1e-6), key
        assert g["race"] == w["race"], key
    # the stored advice is advice: probabilities that sum to one, a set among the options
    assert all(abs(sum(g["probabilities"].values()) - 1) < 1e-6 and g["policy"] in shipped.options for g in got.values())
