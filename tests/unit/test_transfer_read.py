"""experiments.transfer reads a calibration folder still running from its runs' record.json files;
each run keeps the seed its unit folder names, so two seeds of one student are two units, not one."""

import json

import pytest

from capacity_advisor.advisor.predictor.labels import unit_of
from experiments.transfer import read_records


def test_a_running_calibration_folder_keeps_each_units_seed(tmp_path):
    for seed in (0, 1):
        for s in ("high", "low"):
            run = tmp_path / "units" / f"lab:smollm2-135m-s{seed}" / s
            run.mkdir(parents=True)
            (run / "record.json").write_text(json.dumps({
                "strategy": s, "model": {"spec": "lab:smollm2-135m"}, "settings": {"seed": None},
                "pool": {"task": "linear", "teacher": "scripted"},
                "evals": [{"step": 0, "epoch": 0.0, "accuracy": 0.1}]}))
    records = read_records([tmp_path])
    assert sorted(unit_of(r)["seed"] for r in records) == [0, 0, 1, 1]
    assert {(unit_of(r)["repeat"], r["strategy"]) for r in records} == {(0, "high"), (0, "low"), (1, "high"), (1, "low")}


def test_the_gated_race_is_replayed_with_the_plans_own_stops(monkeypatch):
    """A gate whose race has a tie check or a lead rule is judged as `advisor train` would run it:
    the transfer's "gated race (shipped)" equals the replay of that very race on each row."""
    import math

    from helpers import ROOT

    import experiments.transfer as transfer
    from capacity_advisor.advisor.predictor import Policy, label_rows
    from capacity_advisor.advisor.predictor.gate import Gate
    from capacity_advisor.advisor.predictor.races import with_curves

    records = read_records([ROOT / "calibration" / "lab2" / "subtraction-explore"])[:12]  # six units: D_high wins
    rows = with_curves(label_rows(records), records)
    for gate in (Gate(0.0, math.inf, 0.75, tie=0.3), Gate(0.0, math.inf, 1.0, k=1, margin=0.0)):
        monkeypatch.setattr(transfer.Policy, "of", classmethod(lambda cls, p, g=gate: Policy(margin=2.0, gate=g)))
        got = transfer.judge(records)["methods"]["gated race (shipped)"]["all"]
        want = [gate.replay(r) for r in rows]
        plain = [Gate(0.0, math.inf, gate.fraction).replay(r) for r in rows]  # the same share, no stop before it
        assert got["rows"] == len(rows) == 24 and want != plain
        assert got["overhead"] == pytest.approx(sum(s for _, s in want) / len(want)), gate
