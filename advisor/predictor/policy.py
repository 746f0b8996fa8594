"""The decision policy `advisor recommend` ships: the predictor, and a declared fallback when the
student's measurements lie off the calibrated data.

    policy = Policy(max_distance=1.0, margin=0.1)
    decision = policy.decide(predictor, measured, n_params=1.5e9, budget=3, score="sum")   # who answered, and what

The predictor answers when the student is on the data: every measured input inside its calibrated
range (with 10 % slack) when `use_range`, and the nearest calibrated student of another name no
farther than `max_distance` times the 95th-percentile distance among calibrated students. It must
also be sure enough: a choice other than D_high stands only if its probability beats D_high's by
`margin`. Otherwise the fallback answers: always D_high below 10^8 parameters (GRAPE's rule, the
safe choice for small students in the paper and the lab), the paper's findings for students of
that size from 10^8 up.

The thresholds are chosen by cross-validation on the records, holding out whole groups (a pool
source by default, the split on which advice must hold for a user's own pool); their quality is
measured by nested cross-validation (`cross_validate`): the thresholds of each outer fold are
chosen on its training rows only.

A policy may carry a gate (`gate.Gate`): where the measurements say D_low may win, the advice is a
race of D_high against D_low rather than a set (`Decision.race`). The gate is chosen on the same
held-out measurements as the thresholds, under an overhead cap, and measured the same nested way
(`cross_validate`'s "gated race"). Where the gate's `scout` is reached, the probe's own lead for
D_low is the answer (`Decision.answered_by` PROBE_RACE), with no race; where the gate would race
and its `high_scout` is reached, the probe's lead for D_high is, the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import product
from statistics import mean
from typing import Sequence

import numpy as np

from capacity_advisor.advisor.predictor.advice import POOL_GAP, PROBE_RACE, Advice, Decision
from capacity_advisor.advisor.predictor.checks import policy_thresholds
from capacity_advisor.advisor.predictor.ensemble import Predictor, distances, fit_predictor
from capacity_advisor.advisor.predictor.gate import (
    CAP, CAPS, NO_SCOUT, RACES, Gate, best_gate, choose_gate, gated_methods, gated_picks,
)
from capacity_advisor.advisor.predictor.evaluate import (
    PROXY, PROXY_CUT, TIE_MARGIN, baseline_picks, by_value, cell_of, flips, folds, noise_floor, proxy_folds, regret, repeat,
    seed_spread, summarize,
)
from capacity_advisor.advisor.predictor.labels import inputs, model_inputs
from capacity_advisor.advisor.predictor.priors import PAPER_FROM, paper_prior_advice
from capacity_advisor.advisor.predictor.proxy_rule import choose_rule, either, rule_picks
from capacity_advisor.core.errors import InputError

DISTANCES = (0.5, 0.75, 1.0, 1.5, 2.0, math.inf)
WITHOUT_PROXIES = "without own proxies"  # proxy split: the large student fitted without its source's small students
LARGEST_PROXY = "largest proxy only"  # ... with only the largest of them
PROXY_RULE = "proxy rule"  # ... advised from its source's proxies' own outcomes, no probe read (proxy_rule)
EITHER = "policy or proxy rule"  # D_low where the proxy rule says so, else the policy's choice
EITHER_PREDICTOR = "predictor or proxy rule"  # ... else the predictor's most probable set
CHOOSE_BY = ("source",)  # the splits whose held-out regret chooses the policy when none is given (several: the worse)
MARGINS = (0.0, 0.1, 0.2, 0.3, 0.5, 2.0)  # 2.0: the predictor never overrides D_high
FALLBACK_WORDS = "the fallback (D_high below 10^8 parameters, the paper's findings from 10^8)"


@dataclass(frozen=True)
class Policy:
    max_distance: float = math.inf  # in units of the predictor's typical distance
    margin: float = 0.0
    use_range: bool = False
    gate: Gate | None = None  # where it opens, the advice is a race of D_high against D_low

    def on_data(self, outside: bool, ratio: float) -> bool:
        return not (self.use_range and outside) and not (ratio > self.max_distance)

    @property
    def never_overrides(self) -> bool:
        """A margin no probability gap can pass: D_high whatever the probe measures."""
        return self.margin >= 1.0

    def choose(self, probs: dict, outside: bool, ratio: float) -> str | None:
        """The option under these thresholds, or None when the fallback answers."""
        if not self.on_data(outside, ratio):
            return None
        choice = max(probs, key=probs.get)
        if choice != "high" and probs[choice] - probs.get("high", 0.0) < self.margin:
            return "high"
        return choice

    def decide(self, predictor: Predictor, measured: dict, n_params: float, budget: float, score: str,
               student: str | None = None) -> Decision:
        """What the policy answers for one student at one budget (sets ranked by `score`), and who
        answered. Distances leave out the calibration units of `student` itself, as when the
        thresholds were chosen."""
        advice = predictor.advise(measured, budget, score, student=student)
        ratio = distance_ratio(predictor, advice)
        pick = self.choose(advice.probabilities, advice.outside, ratio)
        base = {"advice": advice, "distance_ratio": ratio, "outside": advice.outside,
                "race": self.race_plan(advice.probabilities.get("low", math.nan), inputs(measured), measured)}
        scouted = self.gate.scouts(measured) if self.gate is not None else None
        if scouted is not None:  # the probe already raced the two sets on held-out problems
            return Decision("low", PROBE_RACE, scouted, **{**base, "race": None})
        scouted = self.gate.gap_scouts(measured, score) if self.gate is not None else None
        if scouted is not None:  # the pool itself: D_high's tokens less likely one by one than D_low's
            return Decision("low", POOL_GAP, scouted, **{**base, "race": None})
        scouted = self.gate.scouts_high(measured) if base["race"] is not None else None
        if scouted is not None:  # the gate opened, and the probe's race already shows D_high well ahead
            return Decision("high", PROBE_RACE, scouted, **{**base, "race": None})
        if pick is not None and self.never_overrides:
            return Decision("high", "the policy: always D_high",
                            "on the held-out splits its thresholds were chosen by (meta.policy.chosen_by), the "
                            "predictor did no better than always-high, so the policy keeps D_high whatever the probe "
                            "measures", **base)
        if pick is not None:
            why = "the predictor" if pick == advice.strategy else \
                f"the predictor, held to D_high (D_{advice.strategy} was not {self.margin:g} more probable)"
            return Decision(pick, "predictor", why, **base)
        strategy, who = fallback(n_params, budget)
        reasons = []
        if self.use_range and advice.outside:
            reasons.append("some measurements lie outside the calibrated range")
        if ratio > self.max_distance:
            reasons.append(f"the nearest calibrated student is {ratio:.2f}x the typical distance away "
                           f"(the policy trusts the predictor up to {self.max_distance:g}x)")
        return Decision(strategy, who, "; ".join(reasons) or "off the calibrated data", **base)

    def race_plan(self, p_low: float, measured: dict, features: dict | None = None) -> dict | None:
        """{"fraction", "wait", "why"} of the race the gate opens for these measurements (and its lead
        rule, "k", "margin" and "patient", where the gate's race stops on a clear lead, and "tie",
        where it checks that D_low shows anything, and "hold", where D_low needs a lead beyond noise), or None. `features`: the probe's raw measurements,
        from which a gate with a fast learner's stop (`Gate.fast`) shortens the race."""
        why = self.gate.opens(p_low, measured) if self.gate is not None else None
        if why is None:
            return None
        speed = self.gate.fast(features) if features is not None else None
        gate = self.gate if speed is None else self.gate.fast_race()
        if speed is not None:
            why += (f"; the probe's faster set raised held-out accuracy by {speed:.2f} (the gate's fast learner: "
                    f"{self.gate.fast_gain:g}), so the race stops at {gate.fraction:.0%}")
        lead = {} if gate.k is None else {"k": gate.k, "margin": gate.margin, "patient": gate.patient}
        tie = {} if gate.tie is None else {"tie": gate.tie}
        hold = {"hold": gate.hold} if gate.hold else {}
        return {"fraction": gate.fraction, "wait": gate.wait, **lead, **tie, **hold, "why": why}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["max_distance"] = None if math.isinf(self.max_distance) else self.max_distance
        d.pop("gate")
        if self.gate is not None:  # absent without a gate, so files from before read as they did
            d["race"] = self.gate.to_dict()
        return d

    @classmethod
    def of(cls, predictor: Predictor, own_source: bool = False) -> "Policy":
        """The policy a predictor file states (`meta.policy`; for a student advised on one of the
        user's own calibrated pool sources, `meta.policy_own` where the file has one); without one
        the predictor always answers."""
        meta = predictor.meta or {}
        raw = meta.get("policy_own") if own_source and meta.get("policy_own") is not None else meta.get("policy")
        return cls() if raw is None else cls.from_dict(raw)

    def describe(self) -> str:
        parts = [f"the predictor answers when its nearest calibrated student is within {self.max_distance:g}x the "
                 "typical distance" if math.isfinite(self.max_distance) else "the predictor answers wherever the student lies"]
        if self.use_range:
            parts.append("and every measured input lies inside the calibrated range")
        if self.never_overrides:
            return ("D_high wherever the predictor would answer (on the held-out splits its thresholds were chosen "
                    f"by, it did no better than always-high); off the calibrated data {FALLBACK_WORDS}")
        elif self.margin > 0:
            parts.append(f"and a set other than D_high is {self.margin:g} more probable than D_high")
        words = " ".join(parts) + f"; otherwise {FALLBACK_WORDS}"
        return words + (f"; and it {self.gate.describe()}" if self.gate is not None else "")

    @classmethod
    def from_dict(cls, raw) -> "Policy":
        """A policy read from a predictor file (user input), checked (`checks.policy_thresholds`)."""
        d, m, r = policy_thresholds(raw)
        gate = Gate.from_dict(raw["race"]) if raw.get("race") is not None else None
        return cls(math.inf if d is None else float(d), float(m), r, gate)


def calibrated_source(predictor: Predictor, fingerprint: str | None) -> dict | None:
    """{"source", "students", "n_params", "epochs", "proxy_leads"} of the user's own calibrated pool
    source whose pools include this one (the same content hash), or None."""
    for source, o in ((predictor.meta or {}).get("own_sources") or {}).items():
        if fingerprint and fingerprint in o.get("fingerprints", ()):
            return {"source": source, "students": list(o["students"]), "n_params": list(o["n_params"]),
                    "epochs": o.get("epochs"), "proxy_leads": [list(x) for x in o.get("proxy_leads") or []]}
    return None


def fallback(n_params: float | None, budget: float) -> tuple[str, str]:
    """(strategy, who answered) when the predictor does not: D_high below 10^8 parameters, the
    paper's findings from there up (their hedge, D_mixed, where the paper is silent)."""
    if n_params is not None and n_params >= PAPER_FROM:
        return paper_prior_advice(n_params, budget).strategy, "fallback: the paper's findings"
    return "high", "fallback: always D_high"


def distance_ratio(predictor: Predictor, advice: Advice) -> float:
    near = advice.neighbours or []
    td = predictor.typical_distance
    if not near or not (isinstance(td, float) and math.isfinite(td) and td > 0):
        return 0.0
    return float(near[0]["distance"]) / td


def seed_advice(predictor: Predictor, policy: Policy, rows: Sequence[dict]) -> dict:
    """What `policy` answers for each seed of every cell of `rows` (one pool source, ranking,
    student and budget) that holds two or more seeds: per cell its seeds' advice and P(D_low) and
    whether they agree, and over the cells the flip rate (`flips`). Distances leave out each row's
    own student, as `decide` does."""
    pairs, p_low = [], []
    for r in rows:
        d = policy.decide(predictor, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
        pairs.append((r, d.strategy))
        p_low.append((r, float(d.advice.probabilities.get("low", float("nan")))))
    cells: dict[tuple, dict] = {}
    for (r, s), (_, p) in zip(pairs, p_low):
        c = cells.setdefault(cell_of(r), {"cell": cell_of(r), "advice": {}, "p_low": {}})
        c["advice"][repeat(r)], c["p_low"][repeat(r)] = s, p
    out = [{**c, "agree": len(set(c["advice"].values())) == 1} for c in cells.values() if len(c["advice"]) >= 2]
    return {"cells": out, **flips(pairs), "p_low_spread": seed_spread(p_low)}


# ---- held-out measurements ----------------------------------------------------------------------


def held_out(train: Sequence[dict], test: Sequence[dict], kind: str, features: Sequence[str], n_members: int,
             seed: int, jobs: int = 1) -> list[dict]:
    """For every test row, what a predictor fitted on `train` says: probabilities, whether an input
    is outside the calibrated range, and the distance ratio to the nearest calibrated student."""
    pred = fit_predictor(train, kind, features, n_members, seed, jobs)
    probs = pred.predict_proba(test)
    out = []
    Z, students = pred.unit_matrix()
    td = pred.typical_distance
    for r, p in zip(test, probs):
        nearest = distances(Z[students != str(r["student"])], pred._z(r["features"])).min(initial=np.inf)
        ratio = nearest / td if math.isfinite(td) and td > 0 else 0.0
        outside = any(c["inside"] is False for c in pred.range_check(r["features"]))
        out.append({"row": r, "probs": dict(zip(pred.options, map(float, p))), "ratio": ratio, "outside": outside})
    return out


def _policy_regret(measured: Sequence[dict], policy: Policy) -> float:
    """Held-out regret of the policy's choices; where a measurement carries the proxy rule's
    choice (the proxy split), of the policy and the rule together (`either`), as recommend answers."""
    return mean(regret(m["row"], either(policy.choose(m["probs"], m["outside"], m["ratio"]) or "high",
                                        m.get("rule", "high"))) for m in measured)


def with_rule(train: Sequence[dict], test: Sequence[dict], measured: list[dict]) -> list[dict]:
    """`measured` (held_out's, in `test`'s order), each with the proxy rule's choice for its row,
    the rule chosen on `train` and reading `train`'s proxies of the row's source."""
    picks = rule_picks(train, test, choose_rule(train))
    return [{**m, "rule": c} for m, (_, c) in zip(measured, picks)]


GRID = tuple(Policy(d, m, r) for d, m, r in product(DISTANCES, MARGINS, (False, True)))
# Where the rows hold one value of the split the thresholds are chosen by (one pool source, say),
# nothing measures whether the predictor carries over to another: D_high whatever the probe says.
UNTRIED = Policy(margin=max(MARGINS))


def choose_policy(measured: Sequence[dict], *more: Sequence[dict]) -> Policy:
    """The thresholds with the lowest regret on held-out measurements — with several sets of them
    (one per split), the lowest of the worst over the sets —; near-ties (within 0.05 points) go to
    the more cautious policy (the predictor trusted less far, held to a larger margin)."""
    scored = [(max(_policy_regret(m, p) for m in (measured, *more)), p) for p in GRID]
    best = min(s for s, _ in scored)
    near = [p for s, p in scored if s <= best + 5e-4]
    return min(near, key=lambda p: (p.max_distance, -p.margin, not p.use_range))


def fold_measurements(rows: Sequence[dict], split: str, kind: str, features: Sequence[str], n_members: int,
                      seed: int, jobs: int = 1, draws: int = 1) -> list[dict]:
    """Every row held out once per `split` fold, as `held_out` measures it; with `draws` > 1, once per
    bootstrap draw (seeds `seed`, `seed` + 1, …), pooled: a choice made on them is made over the
    draws' noise in P(D_low), not on one draw of it. Each measurement says its draw (`draw`: 0, 1, …)."""
    out = []
    for d in range(draws):
        for _, train, test in folds(rows, split):
            measured = [{**m, "draw": d} for m in held_out(train, test, kind, features, n_members, seed + d, jobs)]
            out += with_rule(train, test, measured) if split == PROXY else measured
    return out


def select_policy(rows: Sequence[dict], split: str | Sequence[str], kinds: str | Sequence[str],
                  features: Sequence[str], n_members: int = 8, seed: int = 0, jobs: int = 1,
                  draws: int = 1, races: tuple = RACES, scouts: tuple = NO_SCOUT,
                  cost: str = "share") -> tuple[str, Policy, dict]:
    """(kind, thresholds, {kind: its held-out regret in points}) chosen together by leaving one
    `split` value out at a time on `rows` — with several splits, by the worse of their regrets —:
    for each kind the best thresholds, then the kind whose best thresholds lose least (ties to the
    first kind named). Where `rows` hold one value of a split, nothing measures the predictor
    across it: UNTRIED. `draws`: the held-out measurements pooled over that many bootstrap draws
    (`fold_measurements`). Where the rows carry their runs' curves, the kind is chosen by its gated
    regret with `races`, `scouts` and `cost` as `measured_policy` says."""
    return measured_policy(rows, split, kinds, features, n_members, seed, jobs, races, scouts, draws, cost)[:3]


def measured_policy(rows: Sequence[dict], split: str | Sequence[str], kinds: str | Sequence[str],
                    features: Sequence[str], n_members: int = 8, seed: int = 0, jobs: int = 1,
                    races: tuple = RACES, scouts: tuple = NO_SCOUT, draws: int = 1,
                    cost: str = "share") -> tuple[str, Policy, dict, list[dict]]:
    """`select_policy`'s choice, and the chosen kind's held-out measurements, one list per split
    (none where nothing was measured), from which a gate is chosen (`with_gate`: with several
    splits, for the worst of them). Where the rows carry their runs' curves, the kind is the one
    whose policy with its best gate (within the shipped cap, gate.CAP; its race one of `races`)
    loses least over the splits: the gated race is what ships. `draws`: each split's measurements
    pooled over that many bootstrap draws (`fold_measurements`). `cost`: what the cap counts (`gate.COSTS`)."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    splits = (split,) if isinstance(split, str) else tuple(split)
    if not all(folds(rows, s) for s in splits):
        return kinds[0], UNTRIED, {k: float("nan") for k in kinds}, []
    gated = all("curves" in r for r in rows)
    best, scores = None, {}
    for kind in kinds:
        measured = [fold_measurements(rows, s, kind, features, n_members, seed, jobs, draws) for s in splits]
        policy = choose_policy(*measured)
        scores[kind] = 100 * max(_policy_regret(m, policy) for m in measured)
        key = (best_gate(measured[0], policy, CAP, *measured[1:], races=races, scouts=scouts, cost=cost)[1]
               if gated else scores[kind])
        if best is None or key < best[3] - 1e-9:
            best = (kind, policy, measured, key)
    return best[0], best[1], scores, best[2]


def with_gate(policy: Policy, measured: Sequence, cap: float = CAP, open_cap: float | None = None,
              races: tuple = RACES, scouts: tuple = NO_SCOUT, cost: str = "share",
              added: dict | None = None) -> Policy:
    """`policy` with the gate chosen on its held-out `measured` under `cap` — one set of
    measurements, or one per split (`measured_policy`'s): then the gate whose worst regret over
    the splits is lowest, each split's overhead within the cap, counted as `cost` says —; unchanged where the rows carry
    no curves to replay a race on (`races.with_curves`) or nothing was measured. `added`: Gate fields
    set on the gate so chosen, which was chosen without them (`advisor fit --gap-scout-added`: the gap
    scout, `Gate.gap_scout`; `--race-hold-added`: its race's hold, `Gate.hold`; `--race-tie-added`: a tie
    check, `Gate.tie`, kept only where the chosen race stops after it and has none of its own)."""
    from dataclasses import replace

    sets = [list(m) for m in measured] if measured and isinstance(measured[0], (list, tuple)) else [list(measured)]
    sets = [m for m in sets if m]
    if not sets or not all("curves" in m["row"] for ms in sets for m in ms):
        return policy
    gate = choose_gate(sets[0], policy, cap, *sets[1:], open_cap=open_cap, races=races, scouts=scouts, cost=cost)
    if added:  # (choose_gate always finds one: the gate that never opens costs nothing)
        tie = added.get("tie")
        if tie is not None and (gate.tie is not None or gate.fraction <= tie):  # a race that stops by then, or checks
            added = {k: v for k, v in added.items() if k != "tie"}
        gate = replace(gate, **added)
    return replace(policy, gate=gate)


def cross_validate(rows: Sequence[dict], split: str = "student", kind: str | Sequence[str] = "lightgbm",
                   features: Sequence[str] | None = None, n_members: int = 8, tie_margin: float = TIE_MARGIN,
                   seed: int = 0, jobs: int = 1, policy_split: str | Sequence[str] | None = None,
                   open_cap: float | None = None, races: tuple = RACES, scouts: tuple = NO_SCOUT,
                   draws: int = 1, cost: str = "share", added: dict | None = None) -> dict:
    """Every method held out by `split`: the policy — its model kind (one of `kind`, when several)
    and thresholds chosen on each outer fold's training rows only, by an inner leave-one-
    `policy_split`-out (default the same split; several: the worse of them; UNTRIED where those
    rows hold one value of one of them) —,
    the predictor alone (that kind's argmax), the constant rules, the size rule, and the noise floor;
    each with its flip rate across seeds, and for the policy and the predictor the spread of
    P(D_low) across a cell's seeds (`p_low_spread`, the mean range). Where the rows carry their
    runs' curves (`races.with_curves`), also the gated race (`gated_methods`), its races held to
    `open_cap` of a run on average where it opens, when given, each gate's race one of `races` (and its
    scout one of `scouts`; the caps counted as `cost` says). `draws`: the inner measurements each fold's choices are made on pooled over
    that many bootstrap draws; the outer fold's advice is one draw's (`seed`), as a fitted predictor's.
    `added`: Gate fields set on each fold's gate after it is chosen (`with_gate`)."""
    from capacity_advisor.advisor.predictor.labels import PROBE_FEATURES

    features = tuple(features or PROBE_FEATURES)
    # a student advised on a source its proxies calibrated: thresholds chosen on that case too
    inner_split = PROXY if split == PROXY else policy_split or split
    fs = folds(rows, split)
    if not fs:
        raise InputError(f"records cover too few students/{split}s to hold one out (need at least 2 students"
                         + (f"; the proxy split needs sources with students on both sides of {PROXY_CUT:.0e} "
                            "parameters" if split == PROXY else "") + ")")
    picks: dict[str, list] = {"policy": [], "predictor": []}
    chosen, p_low, gated, everywhere, at_shares = {}, [], {}, [], []
    for name, train, test in fs:
        fold_kind, policy, _, inner = measured_policy(train, inner_split, kind, features, n_members, seed, jobs,
                                                      races, scouts, draws, cost)
        chosen[name] = {"kind": fold_kind, **policy.to_dict()}
        outer = held_out(train, test, fold_kind, features, n_members, seed, jobs)
        if split != PROXY and all("curves" in r for r in rows):
            for cap in CAPS:
                gate = with_gate(policy, inner, cap, open_cap, races, scouts, cost, added).gate
                gated.setdefault(cap, []).extend(gated_picks(outer, policy, gate) if gate else [])
                if cap == CAP and gate is not None:
                    at_shares.extend(gated_picks(outer, policy, gate, at_shares=True))
                    chosen[name]["race"] = gate.to_dict()
                    if not gate.never:  # its race, on every pool (a gate that never opens has none)
                        everywhere.extend((m["row"], *gate.replay(m["row"]), o)
                                          for m, (*_, o) in zip(outer, gated[cap][-len(outer):]))
        for m in outer:
            picks["policy"].append((m["row"], policy.choose(m["probs"], m["outside"], m["ratio"]) or "high"))
            picks["predictor"].append((m["row"], max(m["probs"], key=m["probs"].get)))
            p_low.append((m["row"], m["probs"].get("low", float("nan"))))
        for method, pairs in baseline_picks(train, test).items():
            picks.setdefault(method, []).extend(pairs)
        if split == PROXY:  # the source's own proxies read directly, the rule chosen on the other sources
            rule = choose_rule(train)
            chosen[name]["proxy_rule"] = rule.to_dict()
            by_rule = rule_picks(train, test, rule)
            picks.setdefault(PROXY_RULE, []).extend(by_rule)
            for method, base in ((EITHER, "policy"), (EITHER_PREDICTOR, "predictor")):
                picks.setdefault(method, []).extend(
                    (r, either(c, rc)) for (r, c), (_, rc) in zip(picks[base][-len(test):], by_rule))
    if split == PROXY:  # the same large students advised with fewer of their source's proxies
        for method, own, inner in ((WITHOUT_PROXIES, 0, policy_split or CHOOSE_BY), (LARGEST_PROXY, 1, PROXY)):
            for _, train, test in proxy_folds(rows, own):
                fold_kind, policy, _ = select_policy(train, inner, kind, features, n_members, seed, jobs, draws)
                picks.setdefault(method, []).extend(
                    (m["row"], policy.choose(m["probs"], m["outside"], m["ratio"]) or "high")
                    for m in held_out(train, test, fold_kind, features, n_members, seed, jobs))
    tested = {id(r) for r, _ in picks["policy"]}
    picks["noise floor"] = [(r, c) for r, c in noise_floor(rows) if id(r) in tested]
    methods = {m: summarize(p, tie_margin, seed) for m, p in picks.items()}
    if split == PROXY:  # a few large students per source: where the proxies help and where not
        for m, p in picks.items():
            methods[m]["by_source"] = by_value(p, "source", tie_margin)
    # the policy reads the predictor's probabilities: one spread of P(D_low) across seeds for both
    for m in ("policy", "predictor"):
        methods[m]["p_low_spread"] = seed_spread(p_low)
    if gated.get(CAP):
        for m, extra in gated_methods(gated, picks, rows, tie_margin, everywhere, at_shares).items():
            methods.setdefault(m, {}).update(extra)
    return {"split": split, "folds": [f[0] for f in fs], "kind": kind, "policies": chosen, "methods": methods}



def permutation_importance(rows: Sequence[dict], kind: str, features: Sequence[str], split: str = "student",
                           n_members: int = 8, seed: int = 0, repeats: int = 3) -> list[dict]:
    """Held-out regret increase (points) when one input is shuffled among the held-out rows."""
    rng = np.random.default_rng(seed)
    models = [(fit_predictor(train, kind, features, n_members, seed), test) for _, train, test in folds(rows, split)]
    base = mean(regret(r, s) for m, test in models for r, s in zip(test, m.predict(test)))
    out = []
    for key in features:
        deltas = []
        for _ in range(repeats):
            total = []
            for m, test in models:
                full = [model_inputs(r["features"], r["budget"], r["score"]) for r in test]
                vals = [f.get(key) for f in full]
                perm = rng.permutation(len(vals))
                shuffled = [{**f, key: vals[perm[i]]} for i, f in enumerate(full)]
                total += [regret(r, s) for r, s in zip(test, m.predict(shuffled))]
            deltas.append(mean(total) - base)
        out.append({"feature": key, "regret_increase_points": 100 * float(np.mean(deltas))})
    return sorted(out, key=lambda d: -d["regret_increase_points"])
