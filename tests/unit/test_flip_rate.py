"""The flip rate: how often the seeds of one cell (pool source, ranking, student, budget) get
different advice. On synthetic records the answer is known; on the committed records the shipped
policy's advice for the seeds of one unit is reported and counted."""

import pytest

from capacity_advisor.advisor.fit import compact
from capacity_advisor.advisor.predictor import (
    Policy, cross_validate, flips, label_rows, read_records, seed_advice, seed_spread,
)
from helpers import ROOT

STUDENTS = {f"s{i}": 10_000 * (i + 1) for i in range(6)}
INPUT = "gap_train_loss_drop_rel"


def _record(student, n_params, seed, strategy, x, accuracy):
    return {"model": {"spec": f"lab:{student}", "n_params": n_params, "hidden_size": 64, "n_layers": 2},
            "strategy": strategy, "features": {INPUT: x},
            "evals": [{"epoch": 0.0, "step": 0, "accuracy": 0.1}, {"epoch": 1.0, "step": 10, "accuracy": accuracy}],
            "unit": {"lab": 2, "task": "t", "teacher": "program", "score": "sum", "size": student, "seed": seed}}


def synthetic(x_of):
    """Six students, two seeds: the input is x_of(student index, seed); D_low wins by 20 points
    where it is positive, D_high where it is negative."""
    recs = []
    for i, (student, n) in enumerate(STUDENTS.items()):
        for seed in (0, 1):
            x = x_of(i, seed)
            recs.append(_record(student, n, seed, "high", x, 0.5))
            recs.append(_record(student, n, seed, "low", x, 0.7 if x > 0 else 0.3))
    return label_rows(recs, budgets=(1,))


def _cv(rows):
    table = cross_validate(rows, "student", "logistic", (INPUT,), n_members=2)
    return compact({"student": table})["student"]


def test_flips_counts_the_cells_whose_seeds_disagree():
    def row(student, seed, budget=1.0):
        return {"source": "a", "score": "sum", "student": student, "seed": seed, "budget": budget, "features": {}}

    pairs = [(row("x", 0), "high"), (row("x", 1), "high"),                      # agree
             (row("y", 0), "high"), (row("y", 1), "low"),                       # flip
             (row("z", 0), "low"), (row("z", 1), "low"), (row("z", 2), "high"),  # flip (one of three seeds)
             (row("w", 0), "low")]                                              # one seed: no cell
    assert flips(pairs) == {"flip_rate": pytest.approx(2 / 3), "flip_cells": 3}
    assert flips(pairs[:2]) == {"flip_rate": 0.0, "flip_cells": 1}
    assert flips(pairs[-1:]) == {"flip_rate": None, "flip_cells": 0}
    spread = [(row("x", 0), 0.2), (row("x", 1), 0.5), (row("z", 0), 0.1), (row("z", 1), 0.9), (row("z", 2), 0.4)]
    assert seed_spread(spread) == pytest.approx((0.3 + 0.8) / 2)


def test_a_students_pretraining_builds_are_more_repeats_of_its_cell():
    from capacity_advisor.advisor.predictor import noise_floor

    recs = []
    for build, seed, low in ((0, 0, 0.7), (0, 1, 0.7), (1, 0, 0.3), (2, 1, 0.3)):
        for strategy, acc in (("high", 0.5), ("low", low)):
            r = _record("m", 10_000, seed, strategy, 1.0, acc)
            if build:
                r["unit"]["build"] = build
            recs.append(r)
    rows = label_rows(recs, budgets=(1,))
    assert {(r["student"], r["build"], r["repeat"], r["label"]) for r in rows} == {
        ("lab:m", 0, 0, "low"), ("lab:m", 0, 1, "low"), ("lab:m", 1, "b1-s0", "high"), ("lab:m", 2, "b2-s1", "high")}
    assert len({r["unit"] for r in rows}) == 4  # a build's seed 0 is not the ladder build's seed 0
    assert flips([(r, r["label"]) for r in rows]) == {"flip_rate": 1.0, "flip_cells": 1}
    # each row's floor is the majority of the other three: the two other builds outvote its own build's other seed
    assert {r["repeat"]: c for r, c in noise_floor(rows)} == {0: "high", 1: "high", "b1-s0": "low", "b2-s1": "low"}


def test_seeds_with_identical_inputs_never_flip():
    rows = synthetic(lambda i, seed: 1.0 if i % 2 else -1.0)
    got = _cv(rows)
    for method in ("policy", "predictor", "always high", "always low", "size rule"):
        assert got[method]["flip_cells"] == len(STUDENTS), method
        assert got[method]["flip_rate"] == 0.0, method
    assert got["predictor"]["p_low_spread"] == pytest.approx(0.0, abs=1e-9)
    assert got["noise floor"]["flip_rate"] == 0.0  # the labels agree across seeds too


def test_seeds_with_opposite_inputs_across_the_threshold_all_flip():
    rows = synthetic(lambda i, seed: 1.0 if seed == 0 else -1.0)
    assert {r["label"] for r in rows if r["seed"] == 0} == {"low"} and {r["label"] for r in rows if r["seed"] == 1} == {"high"}
    got = _cv(rows)
    assert got["predictor"]["flip_rate"] == 1.0
    assert got["predictor"]["regret"] == pytest.approx(0.0)  # each seed gets its own right answer
    assert got["predictor"]["p_low_spread"] > 0  # P(D_low) crosses one half between the seeds
    for method in ("always high", "always low", "size rule"):  # nothing a seed changes: 0 by construction
        assert got[method]["flip_rate"] == 0.0, method
    assert got["noise floor"]["flip_rate"] == 1.0  # each seed gets the other seed's label


def test_the_shipped_policy_reports_the_advice_of_both_seeds_of_a_committed_unit():
    from capacity_advisor.advisor.probe.plan import load_predictor

    shipped = load_predictor(None)
    policy = Policy.of(shipped)
    rows = label_rows(read_records(ROOT / "calibration" / "records.jsonl"))
    every = [r for r in rows if r["student"] == "lab:m" and r["source"] == "lab2:modchain/program"]
    # the ladder's build on seeds 0 and 1, and builds 1 and 2 on the same seeds: six repeats of one cell
    assert {r["repeat"] for r in every} == {0, 1, "b1-s0", "b1-s1", "b2-s0", "b2-s1"}
    both = seed_advice(shipped, policy, every)
    assert all(set(c["advice"]) == {r["repeat"] for r in every} for c in both["cells"])
    unit = [r for r in every if r["build"] == 0]
    assert {r["seed"] for r in unit} == {0, 1}
    got = seed_advice(shipped, policy, unit)
    assert got["flip_cells"] == len(got["cells"]) == len({r["budget"] for r in unit})
    for cell in got["cells"]:
        assert set(cell["advice"]) == {0, 1}
        for r in (r for r in unit if r["budget"] == cell["cell"][-1]):
            d = policy.decide(shipped, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
            assert cell["advice"][r["seed"]] == d.strategy
            assert cell["p_low"][r["seed"]] == pytest.approx(d.advice.probabilities["low"])
        assert cell["agree"] == (cell["advice"][0] == cell["advice"][1])
    assert got["flip_rate"] == pytest.approx(sum(not c["agree"] for c in got["cells"]) / len(got["cells"]))
    assert got["p_low_spread"] == pytest.approx(sum(abs(c["p_low"][0] - c["p_low"][1]) for c in got["cells"])
                                                / len(got["cells"]))


def test_build_spread_sets_the_spread_over_builds_beside_the_spread_over_seeds(tmp_path):
    import json

    from experiments.build_spread import build_spread

    def rec(build, seed, strategy, accs):
        r = _record("m", 108_736, seed, strategy, 0.0, 0.0)
        r["evals"] = [{"epoch": 0.0, "step": 0, "accuracy": 0.1}] + [
            {"epoch": e, "step": int(10 * e), "accuracy": a} for e, a in zip((1.0, 3.0, 5.0), accs)]
        if build:
            r["unit"]["build"] = build
        return r

    # build 0 and 1: D_low ends ahead; build 2: D_high does. Seeds differ by 0.02 within a build.
    low_end = {0: 0.9, 1: 0.8, 2: 0.3}
    own, builds = tmp_path / "own", tmp_path / "builds"
    for folder, which in ((own, (0,)), (builds, (1, 2))):
        folder.mkdir()
        rows = [rec(b, s, opt, [0.5, 0.5, 0.5] if opt == "high" else [0.2, 0.5, low_end[b] + 0.02 * s])
                for b in which for s in (0, 1) for opt in ("high", "low")]
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = build_spread([own, builds])
    (source, by_size), = got.items()
    end = by_size["m"]["5"]
    assert end["repeats"] == 6 and sorted(end["builds"]) == [0, 1, 2]
    assert end["builds"][1]["low"] == pytest.approx(0.81) and end["builds"][2]["high"] == pytest.approx(0.5)
    assert (end["builds_low_ahead"], end["builds_high_ahead"]) == (2, 1)
    assert end["build_spread"]["low"] == pytest.approx(0.6) and end["build_spread"]["high"] == pytest.approx(0.0)
    assert end["seed_spread"]["low"] == pytest.approx(0.02) and end["seed_spread"]["high"] == pytest.approx(0.0)
    assert by_size["m"]["1"]["builds_low_ahead"] == 0 and by_size["m"]["1"]["builds_high_ahead"] == 3
    from experiments.build_spread import compact_table

    # the compact table: one row per student, the three epochs' pairs, then the two spreads per epoch
    row = next(line for line in compact_table(got).splitlines() if line.startswith("| m |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["m", "3 × 2", "0.50 / 0.20", "0.50 / 0.50", "0.50 / 0.68"]
    assert cells[5] == "0.00 / 0.00; 0.00 / 0.00; 0.00 / 0.02"
    assert cells[6] == "0.00 / 0.00; 0.00 / 0.00; 0.00 / 0.60"
    one = compact_table(build_spread([own]))  # the ladder's build alone: no spread over builds to state
    row = next(line for line in one.splitlines() if line.startswith("| m |"))
    assert row.rstrip().endswith("| —; —; — |") and "| 1 × 2 |" in row
