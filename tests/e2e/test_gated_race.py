"""The gated race (advisor.predictor.gate): chosen held out under an overhead cap, replayed on the
records' curves, judged more strictly on other seeds and on the other half of the problems; the
live race's wait for a slow starter; and the plan end to end: `advisor recommend` on a lab student
whose probe opens the gate plans the race, `advisor train MANIFEST` runs it without a flag, keeps
the leader and its best checkpoint. A closed gate costs nothing extra; a bad race is one error line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from helpers import RACE_MANIFEST, ROOT, one_error_line, race_curve, race_manifest, real_pool, run

from capacity_advisor.training.text_metrics import REPETITION_KEYS
from capacity_advisor.advisor.predictor import Policy, Predictor
from capacity_advisor.advisor.predictor.gate import (
    CAP, GAP_SCOUTS, NO_SCOUT, RACE_GRIDS, SCOUTS, SCOUTS_BOTH, Gate, as_scout, choose_gate, gated_picks,
    judged_on_other_repeats,
)
from capacity_advisor.advisor.predictor.races import race, with_curves
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.race import RaceRule, decide, gaining, holds_back

SHIPPED = ROOT / "advisor" / "predictor_data"
ALWAYS_HIGH = Policy(margin=2.0)  # the policy's set is D_high wherever the gate stays shut


def row(name: str, p_low: float, late_low: bool, budget: float = 2.0, seed: int = 0) -> tuple[dict, dict]:
    """A held-out measurement and its row: D_high flat at 0.5; D_low behind until 60 % of the budget,
    then at 0.9 (`late_low`), or flat at 0.2."""
    epochs = [budget * k / 8 for k in range(1, 9)]
    low = [(e, 0.9 if late_low and e >= 0.6 * budget else 0.2) for e in epochs]
    r = {"source": name, "score": "sum", "student": "lab:s", "seed": seed, "repeat": seed, "budget": budget,
         "features": {}, "accuracy": {"high": 0.5, "low": 0.9 if late_low else 0.2},
         "curves": {"high": [(e, 0.5) for e in epochs], "low": low}}
    return {"row": r, "probs": {"high": 1 - p_low, "low": p_low}, "outside": False, "ratio": 0.0}, r


def rejects_non_numbers(policy: Policy, key: str) -> None:
    """A predictor file whose gate holds a string, a boolean or a list at `key` is refused."""
    from capacity_advisor.advisor.predictor.checks import policy_thresholds

    for bad in ({key: "x"}, {key: True}, {key: [0.5]}):
        with pytest.raises(InputError, match="meta.policy"):
            policy_thresholds({**policy.to_dict(), "race": {**policy.to_dict()["race"], **bad}})

def test_the_gate_opens_where_d_low_may_win_and_stays_within_its_cap():
    measured = [row("a", 0.7, True)[0] for _ in range(2)] + [row("b", 0.05, False)[0] for _ in range(8)]
    gate = choose_gate(measured, ALWAYS_HIGH, cap=0.2)
    assert 0.05 < gate.threshold <= 0.7 and gate.cap == 0.2  # opens on the two D_low rows only
    assert gate.fraction >= 0.6  # a race stopped before D_low's gain would keep D_high
    picks = gated_picks(measured, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in picks] == ["low"] * 2 + ["high"] * 8
    overhead = sum(o for *_, o in picks) / len(picks)
    assert 0 < overhead <= 0.2 and all(o == 0 for *_, o in picks[2:])  # a shut gate costs nothing
    # the races it opens held to half a run each on average: none waits long enough for this D_low
    # (it overtakes at 60 %), so no gate beats the shut one, which costs nothing
    halved = choose_gate(measured, ALWAYS_HIGH, 0.2, open_cap=0.5)
    assert halved.open_cap == 0.5 and Gate.from_dict(halved.to_dict()) == halved
    opened = [o for *_, o in gated_picks(measured, ALWAYS_HIGH, halved) if o > 0]
    assert not opened or sum(opened) / len(opened) <= 0.5
    # no room for a race: the gate never opens, and the advice is the policy's set
    shut = choose_gate(measured, ALWAYS_HIGH, cap=0.0)
    assert all(c == "high" and o == 0 for _, c, o in gated_picks(measured, ALWAYS_HIGH, shut))


def test_a_fast_learner_is_raced_shorter_where_the_gate_was_chosen_so():
    """`--race-grid fast`: where the probe's faster set gained a lot (a fast learner), the winner shows
    early and the race may stop sooner; a slow learner's D_low overtakes late and needs the long race.
    Under a 15 % cap only the gate with a fast learner's stop races both kinds rightly."""
    from dataclasses import replace

    from capacity_advisor.advisor.predictor.checks import gate_ok
    from capacity_advisor.advisor.predictor.evaluate import regret as lost

    def learner(name, p_low, speed, early_low):
        m, r = row(name, p_low, True)
        if early_low:  # D_low ahead from the first evaluation
            r["curves"]["low"] = [(e, 0.9) for e, _ in r["curves"]["low"]]
        r["features"] = {"high_accuracy_gain": speed / 2, "low_accuracy_gain": speed}
        return m

    measured = ([learner("fast", 0.7, 0.5, True) for _ in range(4)] + [learner("slow", 0.7, 0.05, False) for _ in range(2)]
                + [row("b", 0.05, False)[0] for _ in range(14)])
    plain = choose_gate(measured, ALWAYS_HIGH, cap=0.15)
    fast = choose_gate(measured, ALWAYS_HIGH, cap=0.15, races=RACE_GRIDS["fast"])
    regret = lambda g: sum(lost(r, c) for r, c, _ in gated_picks(measured, ALWAYS_HIGH, g))  # noqa: E731
    assert plain.fast_fraction is None and regret(plain) > 0  # a short race misses the slow learner's late D_low
    assert fast.fast_fraction is not None and fast.fast_fraction < 0.6 <= fast.fraction and regret(fast) == 0
    picks = gated_picks(measured, ALWAYS_HIGH, fast)
    assert [c for _, c, _ in picks[:6]] == ["low"] * 6 and all(c == "high" and o == 0 for _, c, o in picks[6:])
    assert all(o < 0.6 for *_, o in picks[:4]) and all(o >= 0.6 for *_, o in picks[4:6])  # the fast ones stop sooner
    assert sum(o for *_, o in picks) / len(picks) <= 0.15
    # the plan says so, and a predictor file keeps it (absent where there is none, as files from before)
    d = fast.to_dict()
    assert Gate.from_dict(d) == fast and gate_ok(d) and "fast_gain" not in plain.to_dict() and gate_ok(plain.to_dict())
    assert not gate_ok({k: v for k, v in d.items() if k != "fast_gain"}) and not gate_ok({**d, "fast_fraction": 0})
    policy = replace(ALWAYS_HIGH, gate=fast)
    quick = policy.race_plan(0.7, {}, measured[0]["row"]["features"])
    slow = policy.race_plan(0.7, {}, measured[4]["row"]["features"])
    assert quick["fraction"] == fast.fast_fraction and "faster set raised held-out accuracy by 0.50" in quick["why"]
    assert slow["fraction"] == fast.fraction and "faster set" not in slow["why"]
    assert policy.race_plan(0.7, {}) == slow and "where the probe's faster set" in fast.describe()


def test_a_cap_in_tokens_prices_each_race_by_the_set_it_trains_beyond_the_kept_one():
    """Four of ten rows need a race to 60 % of the budget to find D_low: 25 % of a run on average,
    over a 20 % cap counted as a share of a run, so that gate stays shut. Where D_low's responses are
    three times D_high's, the D_high run a race keeping D_low trains beside it costs a third of its
    share in tokens, and a cap in tokens lets it open; where D_low's are a third of D_high's, it
    costs three times its share and the cap in tokens keeps the gate shut."""
    from capacity_advisor.advisor.predictor.gate import in_tokens, race_cost

    def rows(low_tokens: float):
        out = [row("a", 0.7, True)[0] for _ in range(4)] + [row("b", 0.05, False)[0] for _ in range(6)]
        for m in out:
            m["row"]["tokens"] = {"high": 1000.0, "low": low_tokens}
        return out

    long_low = rows(3000.0)
    assert all(c == "high" for _, c, _ in gated_picks(long_low, ALWAYS_HIGH, choose_gate(long_low, ALWAYS_HIGH, 0.2)))
    gate = choose_gate(long_low, ALWAYS_HIGH, 0.2, cost="tokens")
    assert gate.cost == "tokens" and Gate.from_dict(gate.to_dict()) == gate and gate.to_dict()["cost"] == "tokens"
    picks = gated_picks(long_low, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in picks] == ["low"] * 4 + ["high"] * 6
    share = picks[0][2]
    assert share >= 0.6 and race_cost(picks[0][0], "low", share, "tokens") == pytest.approx(share / 3)
    got = in_tokens(picks)
    assert got["overhead_tokens"] == pytest.approx(0.4 * share / 3) and got["overhead_tokens"] <= 0.2
    assert got["overhead_tokens_where_open"] == pytest.approx(share / 3)
    assert sum(o for *_, o in picks) / len(picks) > 0.2  # over the cap as a share of a run: tokens let it open
    short_low = rows(1000.0 / 3)
    shut = choose_gate(short_low, ALWAYS_HIGH, 0.2, cost="tokens")
    assert all(c == "high" for _, c, _ in gated_picks(short_low, ALWAYS_HIGH, shut))
    # a row whose records do not say their tokens counts at its share, and the figure says how many did
    unknown = dict(picks[0][0], tokens={"high": None, "low": 3000.0})
    assert race_cost(unknown, "low", 0.5, "tokens") == 0.5
    assert in_tokens([(unknown, "low", 0.5), (picks[-1][0], "high", 0.0)]) == {
        "overhead_tokens": 0.25, "overhead_tokens_where_open": 0.5, "tokens_unknown": 1}
    assert Gate.from_dict(choose_gate(long_low, ALWAYS_HIGH, 0.2).to_dict()).cost == "share"
    assert "cost" not in choose_gate(long_low, ALWAYS_HIGH, 0.2).to_dict()  # files from before read as they did


def test_a_gate_chosen_over_several_splits_is_chosen_for_the_worst_of_them():
    """Left out by source, the predictor is sure of D_low's rows (P(D_low) 0.7); left out by task it is
    less sure of them (0.3): the source split alone chooses the most cautious gate that serves it
    (0.7), which stays shut on the task split's D_low rows; both splits together open it lower."""
    by_source = [row("a", 0.7, True)[0] for _ in range(2)] + [row("b", 0.05, False)[0] for _ in range(8)]
    by_task = [row("a", 0.3, True)[0] for _ in range(2)] + [row("b", 0.05, False)[0] for _ in range(8)]
    alone = choose_gate(by_source, ALWAYS_HIGH, 0.2)
    assert 0.3 < alone.threshold <= 0.7
    missed = gated_picks(by_task, ALWAYS_HIGH, alone)
    assert [c for _, c, _ in missed][:2] == ["high", "high"]  # on a new task it stays shut where D_low wins
    both = choose_gate(by_source, ALWAYS_HIGH, 0.2, by_task)
    for measured in (by_source, by_task):
        picks = gated_picks(measured, ALWAYS_HIGH, both)
        assert [c for _, c, _ in picks][:2] == ["low", "low"] and sum(o for *_, o in picks) / len(picks) <= 0.2
    assert Policy(margin=2.0).choose({"high": 0.6, "low": 0.4}, False, 0.0) == "high"
    from capacity_advisor.advisor.predictor.policy import with_gate

    assert with_gate(ALWAYS_HIGH, [by_source, by_task], 0.2).gate == both
    assert with_gate(ALWAYS_HIGH, by_source, 0.2).gate == alone and with_gate(ALWAYS_HIGH, [], 0.2) == ALWAYS_HIGH


def test_a_gate_held_to_half_a_run_where_it_opens_races_until_one_set_clearly_leads():
    """D_low ahead by 40 points from the first evaluation: a race that stops on a clear lead finds it
    at an eighth of the budget, where a race to a share would train the losing set to that share.
    Held to half a run where it opens, the gate's race is such an adaptive one, and it plans the stop."""
    epochs = [2.0 * k / 8 for k in range(1, 9)]
    clear = {"source": "c", "score": "sum", "student": "lab:s", "seed": 0, "repeat": 0, "budget": 2.0,
             "features": {}, "accuracy": {"high": 0.5, "low": 0.9},
             "curves": {"high": [(e, 0.5) for e in epochs], "low": [(e, 0.9) for e in epochs]}}
    measured = ([{"row": clear, "probs": {"high": 0.4, "low": 0.6}, "outside": False, "ratio": 0.0}] * 2
                + [row("b", 0.05, False)[0] for _ in range(8)])
    assert choose_gate(measured, ALWAYS_HIGH, 0.2, open_cap=0.5).k is None  # the shipped grid has no adaptive race
    gate = choose_gate(measured, ALWAYS_HIGH, 0.2, open_cap=0.5, races=RACE_GRIDS["adaptive"])
    assert gate.k is not None and gate.threshold <= 0.6
    assert gate.replay(clear) == ("low", 0.125)  # stopped at the first evaluation, on the lead
    picks = gated_picks(measured, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in picks] == ["low"] * 2 + ["high"] * 8 and all(o == 0 for *_, o in picks[2:])
    assert Gate.from_dict(gate.to_dict()) == gate and gate.to_dict()["k"] == gate.k
    assert "until one leads by more than" in gate.describe()
    patient = choose_gate(measured, ALWAYS_HIGH, 0.2, open_cap=0.5, races=RACE_GRIDS["patient"])
    assert patient.replay(clear) == ("low", 0.125)  # a D_low lead stops a patient race at once
    # a race to a share of the budget states no lead rule, so files from before read as they did
    assert "k" not in Gate(0.2, math.inf, 0.5).to_dict()
    policy = Policy(0.5, 0.1, True, gate)
    assert Policy.from_dict(policy.to_dict()) == policy
    plan = policy.race_plan(0.6, {})
    assert (plan["k"], plan["margin"], plan["patient"], plan["fraction"]) == (gate.k, gate.margin, gate.patient,
                                                                              gate.fraction)
    from capacity_advisor.advisor.predictor.checks import policy_thresholds

    from capacity_advisor.advisor.recommendation.draws import race_headline

    line = race_headline({**plan, "fraction": 1.0, "patient": True, "expected": None})
    assert line.startswith(f"Race D_high against D_low until one leads by more than {gate.margin:.0%} and the noise at "
                           f"{gate.k} evaluation") and "(D_high only once D_low is not gaining)" in line
    assert line.endswith("at most to the end of your budget, then keep the leader (up to a second full run)")
    for bad in ({"k": 0}, {"k": 1.5}, {"margin": 1.0}, {"margin": "x"}, {"patient": "yes"}):
        raw = {**policy.to_dict(), "race": {**policy.to_dict()["race"], **bad}}
        with pytest.raises(InputError, match="meta.policy"):
            policy_thresholds(raw)


def test_a_gate_with_a_tie_check_stops_early_where_d_low_shows_nothing_and_plans_the_check():
    """Rows the predictor is unsure of (P(D_low) 0.4): two where D_low leads throughout and wins, two
    where its early lead is overtaken at 5/8 of the budget, six where it never leads. Only a race past
    5/8 keeps the right set everywhere, at 5/8 on every row; with the tie grid the gate's race
    stops the six at the check for D_high, for less, and keeps the right set on all ten."""
    epochs = [2.0 * k / 8 for k in range(1, 9)]
    def unsure(name, high, low):
        r = {"source": name, "score": "sum", "student": "lab:s", "seed": 0, "repeat": 0, "budget": 2.0,
             "features": {}, "accuracy": {"high": max(high), "low": max(low)},
             "curves": {"high": list(zip(epochs, high)), "low": list(zip(epochs, low))}}
        return {"row": r, "probs": {"high": 0.6, "low": 0.4}, "outside": False, "ratio": 0.0}

    measured = ([unsure("wins", [0.5] * 8, [0.6] * 8)] * 2 + [unsure("overtaken", [0.5] * 4 + [0.7] * 4, [0.6] * 8)] * 2
                + [unsure("nothing", [0.5] * 8, [0.3] * 8)] * 6)
    right = ["low"] * 2 + ["high"] * 8
    fixed = choose_gate(measured, ALWAYS_HIGH, 1.0)
    tie = choose_gate(measured, ALWAYS_HIGH, 1.0, races=RACE_GRIDS["tie"])
    for gate in (fixed, tie):
        assert [c for _, c, _ in gated_picks(measured, ALWAYS_HIGH, gate)] == right
    cost = lambda g: sum(o for *_, o in gated_picks(measured, ALWAYS_HIGH, g)) / len(measured)  # noqa: E731
    assert (fixed.fraction, fixed.tie, cost(fixed)) == (0.6, None, 0.625)  # the first evaluation past 5/8
    assert tie.tie is not None and cost(tie) == pytest.approx((4 * 0.75 + 6 * 0.25) / 10)
    assert Gate.from_dict(tie.to_dict()) == tie and "unless D_low has been ahead at an evaluation or is gaining" in tie.describe()
    assert "tie" not in Gate(0.2, math.inf, 0.5).to_dict()  # files from before read as they did
    policy = Policy(0.5, 0.1, True, tie)
    assert Policy.from_dict(policy.to_dict()) == policy and policy.race_plan(0.4, {})["tie"] == tie.tie
    from capacity_advisor.advisor.predictor.checks import policy_thresholds
    from capacity_advisor.advisor.recommendation.draws import race_headline

    assert "stops for D_high unless D_low has led or is gaining" in race_headline({**policy.race_plan(0.4, {}),
                                                                                    "expected": None})
    for bad in ({"tie": tie.fraction}, {"tie": 0}, {"tie": "x"}, {"tie": True}):
        with pytest.raises(InputError, match="meta.policy"):
            policy_thresholds({**policy.to_dict(), "race": {**policy.to_dict()["race"], **bad}})


def test_the_gate_reads_the_probes_own_contrast_too():
    gate = Gate(threshold=math.inf, headroom=0.3, fraction=0.5)
    assert gate.opens(0.01, {"gap_accuracy_gain_headroom": 0.4}).startswith("in the probe D_low raised")
    assert gate.opens(0.01, {"gap_accuracy_gain_headroom": 0.2}) is None
    assert gate.opens(math.nan, {"gap_accuracy_gain_headroom": math.nan}) is None
    assert Gate.from_dict(gate.to_dict()) == gate and gate.to_dict()["threshold"] is None


def test_where_the_probe_already_raced_for_d_low_the_gate_takes_its_lead_at_no_cost():
    """D_low rows where D_low led by 60 points in the probe and rows where it led by 25 but D_high won
    in the end: the gate chosen takes the probe's lead only from above the misleading rows', at no
    cost."""
    def with_contrast(m, gain):
        m["row"]["features"] = {"base_accuracy": 0.0, "low_accuracy_gain": gain, "high_accuracy_gain": 0.0}
        return m

    clear = [with_contrast(row("a", 0.7, True)[0], 0.6) for _ in range(2)]
    misleading = [with_contrast(row("b", 0.3, False)[0], 0.25) for _ in range(2)]
    rest = [with_contrast(row("c", 0.05, False)[0], 0.0) for _ in range(6)]
    measured = clear + misleading + rest
    assert choose_gate(measured, ALWAYS_HIGH, cap=0.2).scout == math.inf  # the shipped grid offers no scout
    gate = choose_gate(measured, ALWAYS_HIGH, cap=0.2, scouts=SCOUTS)
    assert 0.25 < gate.scout <= 0.6  # the probe's lead decides on the clear rows only
    picks = gated_picks(measured, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in picks] == ["low"] * 2 + ["high"] * 8 and all(o == 0 for *_, o in picks)
    assert gate.scouts({"low_accuracy_gain": 0.6, "high_accuracy_gain": 0.0}).startswith("the probe already raced")
    assert gate.scouts({"gap_accuracy_gain": 0.6}) is not None and gate.scouts({}) is None
    assert Gate.from_dict(gate.to_dict()) == gate and "(the probe already raced)" in gate.describe()
    assert "scout" not in Gate(0.2, math.inf, 0.5).to_dict()  # files from before read as they did
    # the policy answers D_low from the probe, with no race, before its own thresholds or fallback
    from capacity_advisor.advisor.predictor.advice import PROBE_RACE

    policy = Policy(0.5, 0.1, True, Gate(0.2, math.inf, 1.0, scout=0.5))
    assert Policy.from_dict(policy.to_dict()) == policy
    rejects_non_numbers(policy, "scout")
    from capacity_advisor.advisor.probe.plan import load_predictor

    predictor = load_predictor(str(SHIPPED))
    measured = {**json.loads((ROOT / "calibration" / "records.jsonl").open().readline())["features"],
                "base_accuracy": 0.1, "low_accuracy_gain": 0.5, "high_accuracy_gain": 0.1}  # D_low leads by 0.4
    assert policy.decide(predictor, measured, 1e6, 2.0, "sum", student="lab:x").answered_by != PROBE_RACE  # 0.4 < 0.5
    scouting = Policy(0.5, 0.1, True, Gate(0.2, math.inf, 1.0, scout=0.4))
    d = scouting.decide(predictor, measured, 1e6, 2.0, "sum", student="lab:x")
    assert (d.strategy, d.answered_by, d.race) == ("low", PROBE_RACE, None)
    assert "accuracy 0.40 more than D_high" in d.why and d.advice_given("words").confidence == "medium"


def test_where_d_highs_tokens_are_less_likely_one_by_one_the_gate_may_take_d_low_from_the_pool_alone():
    """Rows where D_low wins late with a likelihood gap per token of -0.8 (a bare-answer D_high against
    worked solutions, ranked by the sum), rows where D_high wins at -0.1, and rows where D_high wins
    ranked by the mean (whose gap is never negative): offered the gap scouts (`--gap-scout`), the gate
    chosen takes D_low without a race on the first kind only, where the plain gate races them; the
    same gap read under the mean ranking never decides."""
    def with_gap(m, gap, score="sum"):
        m["row"]["features"], m["row"]["score"] = {"likelihood_gap_per_token": gap}, score
        return m

    bare = [with_gap(row("a", 0.5, True)[0], -0.8) for _ in range(3)]
    near = [with_gap(row("b", 0.05, False)[0], -0.1) for _ in range(3)]
    by_mean = [with_gap(row("c", 0.05, False)[0], -0.8, "mean") for _ in range(4)]
    measured = bare + near + by_mean
    offered = tuple((*as_scout(sc)[:2], g) for sc in NO_SCOUT for g in GAP_SCOUTS)
    plain = choose_gate(measured, ALWAYS_HIGH, cap=1.0)
    gate = choose_gate(measured, ALWAYS_HIGH, cap=1.0, scouts=offered)
    assert plain.gap_scout == -math.inf and -0.8 <= gate.gap_scout < -0.1
    picks = gated_picks(measured, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in picks] == ["low"] * 3 + ["high"] * 7 and all(o == 0 for *_, o in picks)
    assert all(o > 0 for *_, o in gated_picks(measured, ALWAYS_HIGH, plain)[:3])  # the plain gate races them
    assert gate.gap_scouts({"likelihood_gap_per_token": -0.8}, "sum").startswith("D_high's responses are less likely")
    assert gate.gap_scouts({"likelihood_gap_per_token": -0.8}, "mean") is None
    assert gate.gap_scouts({"likelihood_gap_per_token": None}, "sum") is None and gate.gap_scouts({}, "sum") is None
    assert Gate.from_dict(gate.to_dict()) == gate and "without a race where likelihood_gap_per_token" in gate.describe()
    assert "gap_scout" not in plain.to_dict()  # files from before read as they did
    # the policy answers D_low from the pool, before its own thresholds, and says who answered
    from capacity_advisor.advisor.predictor.advice import POOL_GAP
    from capacity_advisor.advisor.probe.plan import load_predictor

    policy = Policy(0.5, 0.1, True, Gate(math.inf, math.inf, 1.0, gap_scout=-0.25))
    assert Policy.from_dict(policy.to_dict()) == policy
    rejects_non_numbers(policy, "gap_scout")
    predictor = load_predictor(str(SHIPPED))
    features = json.loads((ROOT / "calibration" / "records.jsonl").open().readline())["features"]
    d = policy.decide(predictor, {**features, "likelihood_gap_per_token": -0.9}, 1e6, 2.0, "sum", student="lab:x")
    assert (d.strategy, d.answered_by, d.race) == ("low", POOL_GAP, None) and "-0.90" in d.why
    assert d.advice_given("words").confidence == "medium"
    for score, gap in (("mean", -0.9), ("sum", -0.1)):
        assert policy.decide(predictor, {**features, "likelihood_gap_per_token": gap}, 1e6, 2.0, score,
                             student="lab:x").answered_by != POOL_GAP


def test_where_the_gate_would_race_but_the_probe_shows_d_high_far_ahead_it_takes_d_high_at_no_cost():
    """Rows where D_low wins late (the probe's D_high lead 0.2: a slow starter) and rows where D_high
    wins and led the probe by 0.6, all with P(D_low) that opens a gate: offered a scout for D_high, the
    gate chosen takes D_high without a race on the second kind only, for the same regret at less
    training; without `--high-scout` it races them all."""
    def with_lead(m, lead):
        m["row"]["features"] = {"base_accuracy": 0.0, "high_accuracy_gain": lead, "low_accuracy_gain": 0.0}
        return m

    slow = [with_lead(row("a", 0.5, True)[0], 0.2) for _ in range(3)]
    clear = [with_lead(row("b", 0.5, False)[0], 0.6) for _ in range(3)]
    measured = slow + clear
    plain = choose_gate(measured, ALWAYS_HIGH, cap=1.0, scouts=SCOUTS)
    gate = choose_gate(measured, ALWAYS_HIGH, cap=1.0, scouts=SCOUTS_BOTH)
    assert plain.high_scout == math.inf and 0.2 < gate.high_scout <= 0.6
    raced, scouted = gated_picks(measured, ALWAYS_HIGH, plain), gated_picks(measured, ALWAYS_HIGH, gate)
    assert [c for _, c, _ in scouted] == ["low"] * 3 + ["high"] * 3 == [c for _, c, _ in raced]
    assert all(o > 0 for *_, o in scouted[:3]) and all(o == 0 for *_, o in scouted[3:])
    assert all(o > 0 for *_, o in raced)
    assert Gate.from_dict(gate.to_dict()) == gate and "takes D_high instead of a race" in gate.describe()
    assert "high_scout" not in plain.to_dict()  # files from before read as they did
    assert gate.scouts_high({"high_accuracy_gain": 0.6, "low_accuracy_gain": 0.0}).startswith("the probe already raced")
    assert gate.scouts_high({"high_accuracy_gain": 0.2, "low_accuracy_gain": 0.0}) is None and gate.scouts_high({}) is None
    # the policy answers D_high from the probe only where its gate would race
    from capacity_advisor.advisor.predictor.advice import PROBE_RACE
    from capacity_advisor.advisor.probe.plan import load_predictor

    policy = Policy(0.5, 0.1, True, Gate(0.0, math.inf, 1.0, high_scout=0.5))  # opens on any P(D_low)
    assert Policy.from_dict(policy.to_dict()) == policy
    rejects_non_numbers(policy, "high_scout")
    predictor = load_predictor(str(SHIPPED))
    features = json.loads((ROOT / "calibration" / "records.jsonl").open().readline())["features"]
    ahead = {**features, "base_accuracy": 0.1, "high_accuracy_gain": 0.7, "low_accuracy_gain": 0.1}  # by 0.6
    d = policy.decide(predictor, ahead, 1e6, 2.0, "sum", student="lab:x")
    assert (d.strategy, d.answered_by, d.race) == ("high", PROBE_RACE, None) and "0.60 more than D_low" in d.why
    near = {**ahead, "high_accuracy_gain": 0.4}  # by 0.3: the race stands
    assert policy.decide(predictor, near, 1e6, 2.0, "sum", student="lab:x").race is not None
    shut = Policy(0.5, 0.1, True, Gate(math.inf, math.inf, 1.0, high_scout=0.5))  # never races: the scout never speaks
    assert shut.decide(predictor, ahead, 1e6, 2.0, "sum", student="lab:x").answered_by != PROBE_RACE


def test_a_policy_with_a_gate_plans_the_race_and_its_file_is_checked():
    from capacity_advisor.advisor.predictor.checks import policy_thresholds

    policy = Policy(0.5, 0.1, True, Gate(0.2, math.inf, 0.6, None, CAP))
    assert Policy.from_dict(policy.to_dict()) == policy
    assert policy.race_plan(0.3, {}) == {"fraction": 0.6, "wait": None, "why": "P(D_low) 0.30 reaches the gate's 0.2"}
    assert policy.race_plan(0.1, {}) is None and Policy().race_plan(0.9, {}) is None
    assert "races D_high against D_low to 60% of the budget where P(D_low) ≥ 0.2" in policy.describe()
    for bad in ({"fraction": 0}, {"fraction": 1.5}, {"wait": 0.5}, {"threshold": "x"}, {"cap": None}, {"extra": 1}):
        raw = {**policy.to_dict(), "race": {**policy.to_dict()["race"], **bad}}
        with pytest.raises(InputError, match="meta.policy"):
            policy_thresholds(raw)


def test_the_stricter_judgment_scores_a_pick_on_the_other_seeds():
    _, a = row("a", 0.5, True, seed=0)
    _, b = row("a", 0.5, False, seed=1)  # the same cell: on seed 1 D_high wins
    got = judged_on_other_repeats([(a, "low", 0.5), (b, "high", 0.0)], [a, b])
    # seed 0's D_low judged on seed 1 (D_low 0.2 against D_high 0.5) loses 30 points; seed 1's D_high on seed 0 loses 40
    assert got["rows"] == 2 and got["regret"] == pytest.approx(35.0) and got["decision_accuracy"] == 0


def test_races_decide_on_one_half_of_the_problems_and_are_judged_on_the_other():
    def record(strategy: str, correct: list[str]) -> dict:
        evals = [{"step": 0, "epoch": 0.0, "accuracy": 0.0}] + [
            {"step": i, "epoch": i / 2, "accuracy": c.count("1") / len(c), "correct": c} for i, c in enumerate(correct, 1)]
        return {"model": {"n_params": 1000}, "strategy": strategy, "mix": 0.0, "evals": evals, "features": {},
                "unit": {"task": "t", "score": "sum", "size": "s", "seed": 0}}

    # D_high: right on the even problems only; D_low: right on the odd ones only
    records = [record("high", ["1010", "1010"]), record("low", ["0101", "0101"])]
    from capacity_advisor.advisor.predictor import label_rows

    rows = with_curves(label_rows(records), records)
    r = next(x for x in rows if x["budget"] == 1)
    assert r["curves"] == {"high": [(0.5, 1.0), (1.0, 1.0)], "low": [(0.5, 0.0), (1.0, 0.0)]}  # the even half
    assert r["judge"] == {"high": 0.0, "low": 1.0}  # the odd half
    assert r["n_eval"] == 2  # an adaptive race's noise is that of the 2 problems it reads
    kept, _ = race(r["curves"]["high"], r["curves"]["low"], 1.0, 0.5)
    assert kept == "high"  # picked on the even half, where it is wrong on the odd


def test_a_race_waits_for_a_slow_starter_that_is_gaining():
    high, low = [(e / 4, 0.5) for e in range(1, 9)], [(e / 4, min(0.9, 0.11 * e)) for e in range(1, 9)]
    assert race(high, low, 2.0, 0.5) == ("high", 0.5)  # stopped at half the budget, D_low still behind (0.44)
    assert race(high, low, 2.0, 0.5, wait=1.0) == ("low", 0.625)  # waited while it gained, until it led (0.55)
    assert gaining([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]) and not gaining([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])
    assert not gaining([0.2, 0.2, 0.2], [0.1, 0.2, 0.3])  # not behind: nothing to wait for
    # the live race reads the same: per-problem rows, D_low behind at the share, then ahead
    ten = lambda n: [1] * n + [0] * (10 - n)  # noqa: E731
    curves = {"high": race_curve([ten(5)] * 6), "low": race_curve([ten(1), ten(2), ten(3), ten(4), ten(6), ten(7)])}
    _, stop = decide(curves, RaceRule(fraction=0.5, k=None, wait=1.0), RACE_MANIFEST)
    assert stop["reason"] == "wait" and stop["winner"] == "low" and stop["step"] == 5
    _, stop = decide(curves, RaceRule(fraction=0.5, k=None), RACE_MANIFEST)
    assert stop["reason"] == "fraction" and stop["winner"] == "high" and stop["step"] == 4
    with pytest.raises(InputError, match="wait 0.4"):
        RaceRule(fraction=0.5, wait=0.4).check()


def test_a_patient_race_is_not_stopped_by_the_early_lead_of_d_high_over_a_slow_starter():
    """An adaptive race stops on the first clear lead: D_high's, over a D_low that overtakes later.
    A patient one lets a D_high lead pass until D_low has had three evaluations and is not gaining;
    a D_low lead still stops it at once. Replayed and live alike."""
    high, low = [(e / 4, 0.5) for e in range(1, 9)], [(e / 4, min(0.9, 0.11 * e)) for e in range(1, 9)]
    assert race(high, low, 2.0, 0.5, k=1, wait=1.0) == ("high", 0.125)
    assert race(high, low, 2.0, 0.5, k=1, wait=1.0, patient=True) == ("low", 0.625)
    falling = [(e, 0.3 - 0.01 * i) for i, (e, _) in enumerate(high)]  # D_high clear, D_low losing ground
    assert race(high, falling, 2.0, 1.0, k=1) == ("high", 0.125)
    assert race(high, falling, 2.0, 1.0, k=1, patient=True) == ("high", 0.375)  # once D_low has had three evaluations
    assert race(high, [(e, 0.9) for e, _ in high], 2.0, 0.5, k=1, patient=True) == ("low", 0.125)
    assert holds_back([0.5, 0.5], [0.1, 0.2]) and holds_back([0.5] * 3, [0.1, 0.2, 0.3])
    assert not holds_back([0.5] * 3, [0.3, 0.2, 0.1])
    ten = lambda n: [1] * n + [0] * (10 - n)  # noqa: E731
    curves = {"high": race_curve([ten(5)] * 6), "low": race_curve([ten(1), ten(2), ten(3), ten(4), ten(6), ten(7)])}
    _, stop = decide(curves, RaceRule(fraction=0.5, k=1, wait=1.0), RACE_MANIFEST)
    assert (stop["reason"], stop["winner"], stop["step"]) == ("lead", "high", 1)
    _, stop = decide(curves, RaceRule(fraction=0.5, k=1, wait=1.0, patient=True), RACE_MANIFEST)
    assert (stop["reason"], stop["winner"], stop["step"]) == ("wait", "low", 5)
    # the replay of the same accuracies stops where the live race did (its noise: 10 problems, unpaired)
    acc = [(r["epoch"], r["accuracy"]) for r in curves["high"][1:]], [(r["epoch"], r["accuracy"]) for r in curves["low"][1:]]
    assert race(*acc, 2.0, 0.5, k=1, wait=1.0, patient=True, n_eval=10) == ("low", 1.25 / 2.0)
    # a race folder from before races could be patient keeps its key
    from capacity_advisor.core.files import stable_hash
    from capacity_advisor.training.race import race_key

    checked = {s: f"{s}-key" for s in ("high", "low")}
    old = {"fraction": 0.5, "k": 2, "margin": 0.05, "z": 1.96, "wait": None}
    assert race_key(checked, RaceRule(0.5)) == stable_hash({"runs": {"high": "high-key", "low": "low-key"}, "rule": old})
    assert race_key(checked, RaceRule(0.5, patient=True)) != race_key(checked, RaceRule(0.5))


# ---- the plan end to end ---------------------------------------------------------------------
def predictor_with(tmp_path: Path, gate: dict) -> Path:
    pred = Predictor.load(SHIPPED)
    pred.meta = {**pred.meta, "policy": {**pred.meta["policy"], "race": gate}}
    pred.save(tmp_path)
    return tmp_path


OPEN = {"threshold": 0.0, "headroom": None, "fraction": 0.5, "wait": None, "cap": CAP}  # opens on any probe
SHUT = {"threshold": None, "headroom": None, "fraction": 0.5, "wait": None, "cap": CAP}  # opens on none


@pytest.fixture(scope="module")
def planned(tmp_path_factory, lab_cache):
    """`advisor recommend` on lab:xs with a predictor whose gate opens on any probe."""
    from helpers import advisor_home

    root = tmp_path_factory.mktemp("planned")
    with advisor_home(lab_cache):
        pool = root / "pool.jsonl"
        assert run("lab", "pool", "--n", 200, "--out", pool).exit_code == 0
        args = ("recommend", "--model", "lab:xs", "--budget", 1, "--pool", pool, "--probe-steps", 4,
                "--probe-eval-every", 2, "--probe-eval-problems", 8, "--probe-batch", 4, "--device", "cpu")
        r = run(*args, "--predictor", predictor_with(root / "open", OPEN), "--out", root / "rec")
        assert r.exit_code == 0, r.output
        report = r.output
        r = run(*args, "--predictor", predictor_with(root / "shut", SHUT), "--out", root / "rec-shut", "--json")
        assert r.exit_code == 0, r.output
        shut = json.loads(r.stdout)
    return root, report, shut


def test_recommend_plans_the_race_where_the_gate_opens(planned):
    root, report, _ = planned
    # this race's own cost first, then the average of racing only where the gate opens
    assert ("Race D_high against D_low for 50% of your budget, then keep the leader (about 50% more training than "
            "one run)") in " ".join(report.split())
    assert "P(D_low)" in report and "--no-race trains" in report
    m = json.loads((root / "rec" / "recommendation.json").read_text())
    assert m["race"]["fraction"] == 0.5 and m["race"]["wait"] is None and m["race"]["why"].startswith("P(D_low)")
    # the pool's own contrasts read at selection, the candidates' repetition among them, go with the advice
    assert all(k in m["features"] for k in ("likelihood_gap_per_token", *REPETITION_KEYS))
    assert m["features"]["gap_trigram_repetition"] == pytest.approx(
        m["features"]["trigram_repetition_low"] - m["features"]["trigram_repetition_high"])
    # beside the mean over held-out pools (most raced nothing), what the races the gate opened cost
    held = Predictor.load(SHIPPED).meta["cv"]["source"]["methods"]["gated race"]
    held = held.get("at_shares") or held  # the races replayed as `advisor train` runs them, where the fit has it
    assert m["race"]["expected"] == {k: held[k] for k in ("regret", "overhead", "overhead_where_open")}
    assert f"({held['overhead_where_open']:.0%} of a run where it opened)" in " ".join(report.split())
    # the same race in tokens: half of the budget of the losing set, over the kept set's run
    said = re.search(r"in tokens, up to (\d+)% of a D_high run where D_high is kept \(D_low's sequences are "
                     r"([\d.]+)x D_high's here\) and (\d+)% of a D_low run where D_low is kept", " ".join(report.split()))
    assert said, report
    keep_high, ratio, keep_low = int(said[1]), float(said[2]), int(said[3])
    # (the ratio is printed to a tenth, the shares to a point)
    assert ratio > 0.05 and abs(keep_high - 50 * ratio) <= 3 and abs(keep_low - 50 / ratio) <= 2.5 / (ratio - 0.05) ** 2 + 1
    assert set(m["sets"]) | {m["strategy"]} >= {"high", "low"}
    # a lab student: the lab's held-out figures only, not the real student's (meta.transfer)
    assert "elsewhere" not in m["race"] and "never fitted" not in report


def test_a_race_planned_for_a_real_student_quotes_the_real_students_judgment(tiny_llama, tmp_path):
    """A student that is not a lab model, with a gate that opens on any probe: the headline adds what
    the shipped plan did on the real pretrained student's rows it was never fitted on (meta.transfer)."""
    pool = real_pool(tmp_path / "pool.jsonl", empty_first=False)
    args = ("recommend", "--model", tiny_llama, "--budget", 2, "--pool", pool, "--probe-steps", 4,
            "--probe-eval-problems", 4, "--max-new-tokens", 8, "--sample", 30, "--device", "cpu")
    folder = predictor_with(tmp_path / "open", OPEN)
    r = run(*args, "--predictor", folder, "--out", tmp_path / "other-gate")
    assert r.exit_code == 0, r.output
    assert "never fitted" not in r.output  # the stored judgment is of the shipped gate, not of this one
    assert "the probe trains each set" not in r.output  # 32 sequences a set against the run's 2 x 26
    pred = Predictor.load(folder)  # ... stated as this gate's own, it is quoted
    (entry,) = pred.meta["transfer"]
    pred.meta = {**pred.meta, "transfer": [{**entry, "gate": pred.meta["policy"]["race"]}]}
    pred.save(folder)
    r = run(*args, "--predictor", folder, "--out", tmp_path / "rec")
    assert r.exit_code == 0, r.output
    gated, high = entry["methods"]["gated race"], entry["methods"]["always high"]
    assert (f"judged where it was never fitted (real pretrained student: lab:smollm2-135m, {len(entry['sources'])} pool "
            f"sources, {entry['rows']} rows) it "
            f"lost {gated['regret']:.1f} points at {gated['overhead']:.0%} more training ({gated['overhead_tokens']:.0%} "
            f"more tokens) ({high['regret']:.1f} without races)") in " ".join(r.output.replace("│", " ").split())
    # (the report's panel, its borders taken out)


def test_where_the_probe_trains_more_than_the_run_the_report_says_a_race_trains_less(tiny_llama, tmp_path):
    """On a pool of 30 problems (26 to train on) at one epoch, a probe of 4 steps of 8 sequences trains
    each set on 32 sequences, more than the run's 26: a race to the end trains less than the probe.
    At two epochs (52) it does not, and nothing is said (the real-student test above: 30 problems, 2
    epochs)."""
    from capacity_advisor.advisor.recommendation.recommend import probe_outweighs_run
    from capacity_advisor.probes.recipe import REAL

    pool = real_pool(tmp_path / "pool.jsonl", n=30, empty_first=False)
    args = ("recommend", "--model", tiny_llama, "--pool", pool, "--probe-steps", 4, "--probe-batch", 8,
            "--probe-eval-problems", 4, "--max-new-tokens", 8, "--device", "cpu", "--json")
    r = run(*args, "--budget", 1, "--out", tmp_path / "one")
    assert r.exit_code == 0, r.output
    said = [x for x in json.loads(r.stdout)["confidence_reasons"] if x.startswith("the probe trains each set")]
    assert said == ["the probe trains each set on 32 sequences, 1.2x what a 1-epoch run on this pool's 26 training "
                    "problems does: on a pool this small, racing D_high against D_low to the end of the budget (advisor "
                    "train OUT/recommendation.json --out RUN --race 1) trains less than the probe and answers from both "
                    "sets' own results; --no-probe skips the probe"]
    assert probe_outweighs_run(REAL.with_(steps=25, batch_size=8), 172, 1.0).startswith("the probe trains each set on 200")
    assert probe_outweighs_run(REAL.with_(steps=25, batch_size=8), 172, 2.0) is None
    assert probe_outweighs_run(REAL, 0, 1.0) is None


def test_a_shut_gate_costs_nothing_extra(planned, lab_cache, monkeypatch):
    root, _, shut = planned
    assert shut["race"] is None
    m = json.loads((root / "rec-shut" / "recommendation.json").read_text())
    assert "race" not in m
    monkeypatch.setenv("ADVISOR_HOME", str(lab_cache))
    r = run("train", root / "rec-shut" / "recommendation.json", "--out", root / "run-shut", "--dry-run")
    assert r.exit_code == 0 and "race" not in r.output  # one run of the recommended set
    r = run("train", root / "rec-shut" / "recommendation.json", "--out", root / "run-shut", "--dry-run", "--json")
    shown = json.loads(r.stdout)
    assert r.exit_code == 0 and shown["dry_run"] is True and "capacity_advisor.training.sft" in shown["would_run"][0]
    assert not (root / "run-shut").exists()


def test_train_runs_the_planned_race_and_keeps_the_leader_and_its_best_checkpoint(planned, lab_cache, monkeypatch):
    root, _, _ = planned
    monkeypatch.setenv("ADVISOR_HOME", str(lab_cache))
    out = root / "race-run"
    r = run("train", root / "rec" / "recommendation.json", "--out", out, "--threads", 1, "--records",
            root / "records.jsonl", "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    race_file = json.loads((out / "race.json").read_text())
    winner = race_file["winner"]
    assert shown["winner"] == winner and race_file["rule"]["k"] is None and race_file["rule"]["fraction"] == 0.5
    stop = race_file["stopped"]
    assert stop["reason"] == "fraction" and stop["share"] >= 0.5
    best = {s: max((c[f"accuracy_{s}"] for c in race_file["comparisons"]), default=-1) for s in ("high", "low")}
    assert winner == ("high" if best["high"] >= best["low"] else "low")  # the leader at the stop is kept
    record = json.loads((out / "race" / winner / "record.json").read_text())
    assert record["provenance"]["race"]["winner"] == winner and record["provenance"]["race"]["stopped"] == stop
    assert record["strategy"] == winner and record["epochs"] == 1
    kept = record["best_checkpoint"]
    assert kept["folder"] == "best" and kept["accuracy"] == record["best_accuracy"]
    assert (out / "race" / winner / "best" / "model.safetensors").is_file()
    # the report names the folder to load and what it measured
    assert shown["best_checkpoint"] == {"path": str(out / "race" / winner / "best"), "step": kept["step"],
                                        "epoch": kept["epoch"], "accuracy": record["best_accuracy"]}
    assert all(isinstance(e.get("correct"), str) for e in record["evals"][1:])  # per-problem correctness kept
    assert stop["share"] < 1 and stop["evaluation"] < len(record["evals"]) - 1  # the race ended before the run
    assert not (out / "race" / ("low" if winner == "high" else "high") / "record.json").exists()
    # what the race cost, in tokens: the loser's up to its stop, beside the winner's whole run (trained in
    # segments, one evaluation a call: its count carried through every resume)
    cost = race_file["extra_tokens"]
    assert cost["winner"] == record["provenance"]["train_tokens"] > 0 and 0 < cost["loser"]
    assert cost["share"] == pytest.approx(cost["loser"] / cost["winner"]) and shown["extra_tokens"] == cost
    # --no-race trains the recommended set alone
    r = run("train", root / "rec" / "recommendation.json", "--out", root / "alone", "--no-race", "--dry-run")
    assert r.exit_code == 0 and "race of D_high" not in r.output
    # the race folder is resumed only by this race: not under another rule, not by a plain run
    before = ((out / "race.json").read_bytes(), (root / "records.jsonl").read_bytes())
    for args, words in ((("--race", 0.8), "holds something other than this race"),
                        (("--race-k", 2), "holds something other than this race"),
                        (("--no-race",), "holds a run of another manifest")):
        r = run("train", root / "rec" / "recommendation.json", "--out", out, "--threads", 1, "--records",
                root / "records.jsonl", *args)
        one_error_line(r, words)
    assert ((out / "race.json").read_bytes(), (root / "records.jsonl").read_bytes()) == before
    # a stop flag where no race runs is refused, not ignored
    r = run("train", root / "rec" / "recommendation.json", "--out", root / "alone", "--no-race", "--race-k", 3)
    one_error_line(r, "--race-k sets when a race stops, and this command runs none (--no-race trains one set)")
    assert not (root / "alone").exists()


def test_export_of_a_planned_race_writes_both_sets(planned, lab_cache, monkeypatch):
    root, _, _ = planned
    monkeypatch.setenv("ADVISOR_HOME", str(lab_cache))
    r = run("train", root / "rec" / "recommendation.json", "--export", root / "export", "--format", "trl", "--dry-run",
            "--json")
    assert r.exit_code == 0, r.output  # a dry run checks and lists, and writes nothing
    assert [Path(p).name for p in json.loads(r.stdout)["would_write"]][:3] == ["train.jsonl", "train-high.jsonl",
                                                                               "train-low.jsonl"]
    assert not (root / "export").exists()
    (root / "blocked" / "trl_sft.py").mkdir(parents=True)  # a folder where a file goes: refused before any write
    one_error_line(run("train", root / "rec" / "recommendation.json", "--export", root / "blocked", "--format", "trl"),
                   "trl_sft.py is a folder")
    assert [p.name for p in (root / "blocked").iterdir()] == ["trl_sft.py"]
    r = run("train", root / "rec" / "recommendation.json", "--export", root / "export", "--format", "trl", "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert "the race runs through `advisor train" in shown["note"]
    for s in ("high", "low"):
        assert len((root / "export" / f"train-{s}.jsonl").read_text().splitlines()) > 0


# ---- bad input: one error line, exit 2, nothing written -------------------------------------
@pytest.mark.parametrize("race_block, words", [
    ({"fraction": 0}, "race.fraction"), ({"fraction": 1.5}, "race.fraction"), ({"fraction": "half"}, "race.fraction"),
    ({"fraction": 0.5, "wait": 0.3}, "race.wait"), ({"fraction": 0.5, "speed": 2}, "unknown keys"),
    ({"fraction": 0.5, "k": 0}, "race.k"), ({"fraction": 0.5, "k": 1.5}, "race.k"),
    ({"fraction": 0.5, "k": 2, "margin": 1.5}, "race.margin"), ({"fraction": 0.5, "k": 2, "patient": 1}, "race.patient"),
    ("fast", "race: must be an object"),
    ({"fraction": 0.5, "expected": {"regret": 1.0, "overhead": 0.2, "overhead_where_open": "most"}}, "race.expected"),
    ({"fraction": 0.5, "expected": {"regret": None, "overhead": 0.2}}, "race.expected"),
])
def test_a_bad_planned_race_is_one_error_line(tmp_path, race_block, words):
    path = race_manifest(tmp_path / "rec", "lab:s")
    d = json.loads(path.read_text())
    d["race"] = race_block
    path.write_text(json.dumps(d))
    r = run("train", path, "--out", tmp_path / "out")
    assert r.exit_code == 2 and r.output.startswith("error:") and words in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("sets, words", [({}, "names no D_low"), ({"low": "train-high.jsonl"}, "the same file")])
def test_a_planned_race_of_a_missing_or_identical_set_is_one_error_line(tmp_path, sets, words):
    path = race_manifest(tmp_path / "rec", "lab:s")
    d = json.loads(path.read_text())
    d.update(race={"fraction": 0.5}, sets=sets)
    path.write_text(json.dumps(d))
    r = run("train", path, "--out", tmp_path / "out")
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()


def test_a_race_of_one_file_against_itself_is_refused(tmp_path):
    path = race_manifest(tmp_path / "rec", "lab:s")
    d = json.loads(path.read_text())
    d["sets"] = {"low": "./train-high.jsonl"}  # the same file under another spelling
    path.write_text(json.dumps(d))
    r = run("train", path, "--out", tmp_path / "out", "--race", "0.5")
    assert r.exit_code == 2 and "same file" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()
    r = run("train", path, "--out", tmp_path / "out", "--race", "0.5", "--no-race")
    assert r.exit_code == 2 and "contradict" in r.output and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_race_launched_over_two_processes_decides_as_one_in_process(tmp_path, tiny_llama):
    """Each raced run's segments launched with torchrun over 2 CPU processes (gloo): the same
    comparisons, stop and winner as the race run in this process, the winner stored once."""
    path = race_manifest(tmp_path / "rec", tiny_llama)
    common = ("--race", 1, "--threads", 1, "--max-steps", 1)
    here = run("train", path, "--out", tmp_path / "here", *common, "--records", tmp_path / "a.jsonl", "--json")
    assert here.exit_code == 0, here.output
    launched = run("train", path, "--out", tmp_path / "launched", *common, "--nproc", 2, "--records",
                   tmp_path / "b.jsonl", "--json")
    assert launched.exit_code == 0, launched.output
    a, b = (json.loads((tmp_path / d / "race.json").read_text()) for d in ("here", "launched"))
    assert a["stopped"] == b["stopped"] and a["winner"] == b["winner"]
    assert [c["mean_difference"] for c in a["comparisons"]] == [c["mean_difference"] for c in b["comparisons"]]
    stored = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(stored) == 1 and stored[0]["provenance"]["race"]["winner"] == b["winner"]
    assert stored[0]["settings"]["processes"] == 2 and (tmp_path / "launched" / "race" / b["winner"] / "best").is_dir()


def test_a_gate_offered_a_hold_keeps_d_high_where_d_low_leads_by_noise_and_the_plan_says_so():
    """Rows read on 32 problems (`n_eval`) where D_low leads by one problem at the race's stop and D_high
    wins at the end, and rows where D_low leads by ten problems and wins: offered the holds 0 and 1
    (`advisor fit --race-hold 0,1`), the gate chosen holds, keeps D_high on the first and D_low on the
    second, where the plain grid's gate keeps D_low on both. The hold travels to the planned race."""
    from dataclasses import replace

    from capacity_advisor.advisor.predictor.checks import gate_ok
    from capacity_advisor.advisor.predictor.gate import with_hold
    from capacity_advisor.advisor.recommendation.draws import race_headline
    from capacity_advisor.training.manifest_checks import race_problems

    epochs = [2.0 * k / 8 for k in range(1, 9)]

    def measured(name, low_lead, low_wins):
        high = [0.25] * 8
        low = [0.25 + low_lead] * 8 if low_wins else [0.25 + low_lead] * 6 + [0.1, 0.1]
        end_high = [0.25] * 6 + [0.5, 0.5]  # D_high wins late where D_low's lead was noise
        curves = {"high": list(zip(epochs, high if low_wins else end_high)), "low": list(zip(epochs, low))}
        r = {"source": name, "score": "sum", "student": "lab:s", "seed": 0, "repeat": 0, "budget": 2.0,
             "features": {}, "n_eval": 32, "curves": curves,
             "accuracy": {o: max(a for _, a in c) for o, c in curves.items()}}
        return {"row": r, "probs": {"high": 0.6, "low": 0.4}, "outside": False, "ratio": 0.0}

    rows = [measured("noise", 1 / 32, False)] * 6 + [measured("clear", 10 / 32, True)] * 4
    fixed = tuple(r for r in RACE_GRIDS["fixed"] if r[0] == 0.5 and r[1] is None)  # one race: to half the budget
    plain = choose_gate(rows, ALWAYS_HIGH, 1.0, races=fixed)
    held = choose_gate(rows, ALWAYS_HIGH, 1.0, races=tuple(with_hold(r, h) for r in fixed for h in (0.0, 1.0)))
    assert plain.hold == 0 and held.hold == 1.0 and held.fraction == plain.fraction == 0.5
    assert [c for _, c, _ in gated_picks(rows, ALWAYS_HIGH, replace(held, hold=0.0))] == ["low"] * 10
    assert [c for _, c, _ in gated_picks(rows, ALWAYS_HIGH, plain)] == ["high"] * 10  # so it stays shut
    assert [c for _, c, _ in gated_picks(rows, ALWAYS_HIGH, held)] == ["high"] * 6 + ["low"] * 4
    assert Gate.from_dict(held.to_dict()) == held and gate_ok(held.to_dict()) and "hold" not in plain.to_dict()
    assert "D_low kept only on a lead beyond 1 standard error of" in held.describe()
    rejects_non_numbers(Policy(0.5, 0.1, True, held), "hold")
    assert not gate_ok({**held.to_dict(), "hold": -1}) and not gate_ok({**held.to_dict(), "hold": 11})
    plan = Policy(0.5, 0.1, True, held).race_plan(0.4, {})
    assert plan["hold"] == 1.0 and "lead beyond 1 standard error of" in race_headline({**plan, "expected": None})
    assert not race_problems({**plan, "hold": "x"}) == [] and race_problems(plan) == []
