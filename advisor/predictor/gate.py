"""The gated race: the probe decides when to look, the race looks.

    gate = choose_gate(measured, policy, cap=0.2)     # chosen on held-out measurements of other sources
    why = gate.scouts(inputs)                         # not None: the probe already raced, D_low at no cost
    why = gate.gap_scouts(inputs, "sum")              # not None: the pool's likelihood gap says D_low, at no cost
    why = gate.opens(p_low, inputs)                   # None: train the policy's set; else why to race
    kept, overhead = gate.replay(row)                 # the race replayed on a calibration row's curves

Asked to decide, the probe ties always-high on pool sources, tasks and teachers it was not fitted
on; asked only when D_low may win, it finds most of what is lost. Where the predictor's P(D_low)
reaches `threshold`, or the probe's own contrast of accuracy gains (`gap_accuracy_gain_headroom`:
how much more D_low raised held-out accuracy than D_high in the probe, over the base's headroom)
reaches `headroom`, the advice is a race of D_high against D_low to `fraction` of the budget (with
`wait`, longer while D_low is behind and gaining faster, `training.race.gaining`; with `k`, sooner
once one set has led by more than `margin` and the noise at `k` evaluations in a row, so a clear
race costs a fraction of that share), the leader kept and trained to the end; elsewhere the
policy's set, at no extra cost. With a `scout`, the probe itself may be taken as the race (it
trained both sets and evaluated them on the same held-out problems): where D_low's accuracy gain
leads D_high's by `scout` (`gap_accuracy_gain`), D_low at no extra cost. A D_high lead in the
probe is never taken so by default, since D_low overtakes late on the lab's scripted pools; a gate
chosen with `advisor fit --high-scout` may take one (`high_scout`): where the gate would open but
D_high's accuracy gain in the probe leads D_low's by `high_scout`, D_high at no extra cost.

`threshold`, `headroom`, `scout` and the race are chosen together on held-out measurements (the predictor
fitted without each pool source, judged on it) as the lowest mean regret whose mean overhead
stays within `cap` (the share of one run's training the losing set costs); near-ties go to the
cheaper, then the more cautious gate. Races are replayed on the records' curves
(`races.race`), so their overhead is the share at which they stopped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from itertools import product
from statistics import mean
from typing import Sequence

import numpy as np

from capacity_advisor.advisor.predictor.evaluate import (
    by_value, flips, is_right, judged_on_other_repeats, near_best, regret,
)
from capacity_advisor.advisor.predictor.labels import (
    TIE_MARGIN, accuracy_lead, inputs, learning_speed, model_inputs, token_share,
)
from capacity_advisor.advisor.predictor.races import WAITS, race
from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS
from capacity_advisor.training.race import TIE_WORDS

HEADROOM_INPUT = "gap_accuracy_gain_headroom"
SCOUT_INPUT = "gap_accuracy_gain"  # the probe's lead for D_low in accuracy (held-out problems solved, as a share)
THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, math.inf)
HEADROOMS = (0.1, 0.2, 0.3, 0.5, 1.0, math.inf)
SCOUTS = (math.inf, 0.1, 0.2, 0.3)  # the leads from which `advisor fit --scout` may take the probe as the race
NO_SCOUT = (math.inf,)  # without `--scout`: the probe's lead never decides alone
# A scout of the grid is a D_low lead, or a pair (D_low lead, D_high lead): `advisor fit --high-scout`
# also offers a D_high lead of the probe from which a gate that would open takes D_high without a race
HIGH_SCOUTS = (math.inf, 0.3, 0.5)
SCOUTS_BOTH = tuple((lo, hi) for lo in SCOUTS for hi in HIGH_SCOUTS)
# ... and `advisor fit --gap-scout` an input that needs no training: the pool's likelihood gap per token
# under the base (D_high's mean log-probability per token minus D_low's), ranked by the sum, at or
# under which the gate takes D_low without a race (a scout of the grid is then a triple: D_low lead,
# D_high lead, gap). Ranked by the summed log-probability, D_high is the likeliest candidate as a
# whole, which favours the shortest; where its tokens are less likely one by one than D_low's (a bare
# answer against a fluent worked solution) D_low won on the lab's and the real student's sources
# (docs/results.md, "The candidates' own repetition, and the per-token likelihood gap")
GAP_INPUT = "likelihood_gap_per_token"
GAP_SCOUTS = (-math.inf, 0.0, -0.25, -0.5, -1.0)
TIES = (0.2, 0.3, 0.5)  # the shares at which a race of the "tie" grid may check that D_low shows anything
# (fraction, wait, k, margin, patient, tie): the races a gate may open — stopped at a share of the
# budget, or waiting for a gaining D_low (`races.race`); the grid `advisor fit` chooses from by default
RACES = (tuple((f, None, None, None, False, None) for f in (0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0))
         + tuple((f, w, None, None, False, None) for f, w in WAITS))
# ... and `--race-grid`'s others, beside those: adaptive races that stop as soon as one set clearly
# leads (at most at a share), patient ones that a D_high lead stops only once D_low is seen not
# gaining (`training.race.holds_back`), and races with a tie check, which stop for D_high at an early
# share where D_low has not been ahead and is not gaining (`training.race.levels`), on their own or
# beside a stop on a clear lead; measured held out in docs/results.md, "Cheaper races"
RACE_GRIDS = {
    "fixed": RACES,
    "adaptive": RACES + tuple((f, None, k, m, False, None) for f in (0.5, 0.75, 1.0) for k in (1, 2)
                              for m in (0.05, 0.1)),
    "patient": RACES + tuple((f, None, k, m, True, None) for f in (0.5, 1.0) for k in (1, 2) for m in (0.05, 0.1)),
    "tie": RACES + tuple((f, None, None, None, False, t) for t in TIES for f in (0.5, 0.75, 1.0) if t < f)
                 + tuple((f, None, 2, 0.05, False, t) for t in TIES[1:] for f in (0.75, 1.0)),
}
# A race of the "fast" grid is one of RACES with a shorter stop for a fast learner: (fraction, wait,
# k, margin, patient, tie, fast_gain, fast_fraction) stops at fast_fraction where the probe's faster
# set raised held-out accuracy by fast_gain or more (`labels.learning_speed`): a student that learns
# the task within the probe's few steps shows the better set early, one that does not may still be
# far from its late gains (docs/results.md, "A shorter race for a fast learner")
FAST_GAINS = (0.1, 0.15, 0.2, 0.3)
FAST_FRACTIONS = (0.2, 0.3, 0.4, 0.5)
RACE_GRIDS["fast"] = RACES + tuple((f, w, None, None, False, None, g, ff) for f, w, *_ in RACES if f >= 0.5
                                   for g in FAST_GAINS for ff in FAST_FRACTIONS if ff < f)
LEAD_MARGIN = 0.05  # an adaptive race's least lead (accuracy) where a gate names none
CAPS = (0.1, 0.15, 0.2, 0.3)  # the overhead caps the frontier reports
CAP = 0.2  # the shipped cap: mean extra training the gate may cost, as a share of one run
# what the cap counts: the losing set's training as a share of one run ("share"), or its tokens as a
# share of the kept set's run's tokens ("tokens": what a user pays; D_low's long responses make a race
# that keeps D_high dearer than its share and one that keeps D_low cheaper)
COSTS = ("share", "tokens")
NEAR = 1e-9  # regrets closer than this are ties


@dataclass(frozen=True)
class Gate:
    threshold: float = math.inf  # P(D_low) from which the race opens (inf: never by it)
    headroom: float = math.inf  # gap_accuracy_gain_headroom from which it opens (inf: never by it)
    fraction: float = 0.5  # the race stops at the first evaluation at or past this share of the budget
    wait: float | None = None  # ... or goes on up to this share while D_low is behind and gaining faster
    cap: float = CAP  # the mean overhead it was chosen under
    open_cap: float | None = None  # the mean overhead of the races it opens it was chosen under (None: none)
    k: int | None = None  # stop once one set has led at k evaluations in a row (None: only at the fraction)
    margin: float = LEAD_MARGIN  # ... by more than this accuracy difference (and the noise)
    patient: bool = False  # ... a D_high lead only once D_low is seen not gaining (`training.race.holds_back`)
    scout: float = math.inf  # the probe's lead for D_low (`accuracy_lead`) from which it decides alone (inf: never)
    tie: float | None = None  # at this share the race stops for D_high unless D_low has led or is gaining
    high_scout: float = math.inf  # the probe's lead for D_high from which an opened gate takes D_high (inf: never)
    cost: str = "share"  # what `cap` and `open_cap` count (COSTS)
    fast_gain: float = math.inf  # the probe's learning speed (`labels.learning_speed`) from which ...
    fast_fraction: float | None = None  # ... the race stops at this share instead (a plain stop; None: never)
    gap_scout: float = -math.inf  # the sum-ranked likelihood gap per token at or under which D_low without a race
    hold: float = 0.0  # a race stopped without a lead keeps D_low only on a lead beyond this many standard errors

    @property
    def never(self) -> bool:
        return math.isinf(self.threshold) and math.isinf(self.headroom)

    def scouts(self, measured: dict) -> str | None:
        """Why the probe's own lead decides for D_low without a race (words), or None."""
        h = accuracy_lead(measured)
        if math.isfinite(h) and h >= self.scout:
            return (f"the probe already raced: D_low raised held-out accuracy {h:.2f} more than D_high did (the "
                    f"gate's scout: {self.scout:g})")
        return None

    def gap_scouts(self, measured: dict, score: str | None) -> str | None:
        """Why the pool's likelihood gap per token (`gap_scout`; sets ranked by `score` "sum" only)
        decides for D_low without a race (words), or None."""
        g = gap_of(measured, score)
        if g <= self.gap_scout:
            return (f"D_high's responses are less likely per token than D_low's under the base ({GAP_INPUT} {g:.2f}, "
                    f"at or under the gate's {self.gap_scout:g}): by the summed log-probability D_high holds the "
                    "shortest candidates, not the likeliest steps")
        return None

    def scouts_high(self, measured: dict) -> str | None:
        """Why the probe's own lead for D_high decides, where this gate would open, for D_high without
        a race (words), or None."""
        h = -accuracy_lead(measured)
        if math.isfinite(h) and h >= self.high_scout:
            return (f"the probe already raced: D_high raised held-out accuracy {h:.2f} more than D_low did (the "
                    f"gate's scout for D_high: {self.high_scout:g})")
        return None

    def opens(self, p_low: float, measured: dict) -> str | None:
        """Why the race opens for these measurements (words), or None where it stays shut."""
        if isinstance(p_low, (int, float)) and math.isfinite(p_low) and p_low >= self.threshold:
            return f"P(D_low) {p_low:.2f} reaches the gate's {self.threshold:g}"
        h = measured.get(HEADROOM_INPUT)
        if isinstance(h, (int, float)) and math.isfinite(h) and h >= self.headroom:
            return (f"in the probe D_low raised held-out accuracy more than D_high ({HEADROOM_INPUT} {h:.2f} reaches "
                    f"the gate's {self.headroom:g})")
        return None

    def fast(self, measured: dict) -> float | None:
        """The probe's learning speed where it reaches the gate's `fast_gain` (the race then stops at
        `fast_fraction`), else None."""
        if self.fast_fraction is None:
            return None
        v = learning_speed(measured)
        return v if math.isfinite(v) and v >= self.fast_gain else None

    def fast_race(self) -> "Gate":
        """The race it runs for a fast learner: a plain stop at `fast_fraction`."""
        return replace(self, fraction=self.fast_fraction, wait=None, k=None, tie=None, fast_gain=math.inf,
                       fast_fraction=None)

    def race_for(self, measured: dict) -> "Gate":
        """The race this gate runs for these probe measurements (raw features): its own, or, for a fast
        learner (`fast`), `fast_race`."""
        return self if self.fast(measured) is None else self.fast_race()

    def replay(self, row: dict, at_shares: bool = False) -> tuple[str, float]:
        """(kept set, overhead) of this gate's race replayed on a row's curves (`races.with_curves`);
        `at_shares`: evaluated also at its stop shares, as `advisor train` races (`races.race`). A fast
        learner's row (`fast`) is raced to `fast_fraction`."""
        g = self.race_for(row["features"])
        c = row["curves"]
        return race(c["high"], c["low"], row["budget"], g.fraction, wait=g.wait, k=g.k, margin=g.margin,
                    patient=g.patient, n_eval=row.get("n_eval", FULL_RUN_EVAL_PROBLEMS), tie=g.tie,
                    at_shares=at_shares, hold=g.hold)

    @property
    def rule(self) -> tuple:
        """(fraction, wait, k, margin, patient, tie): the race, as RACES lists it; with a fast learner's
        stop, (..., fast_gain, fast_fraction), as RACE_GRIDS["fast"] lists it; with a hold, (...,
        fast_gain, fast_fraction, hold), as `with_hold` makes it."""
        lead = self.k is not None
        rule = (self.fraction, self.wait, self.k, self.margin if lead else None, self.patient and lead, self.tie)
        if self.hold:
            return rule + (self.fast_gain, self.fast_fraction, self.hold)
        return rule + (self.fast_gain, self.fast_fraction) if self.fast_fraction is not None else rule

    def describe(self) -> str:
        scout = (f"; takes D_low without a race where {SCOUT_INPUT} ≥ {self.scout:g} (the probe already raced)"
                 if math.isfinite(self.scout) else "")
        if math.isfinite(self.high_scout):
            scout += f"; takes D_high instead of a race where {SCOUT_INPUT} ≤ −{self.high_scout:g}"
        if math.isfinite(self.gap_scout):
            scout += f"; takes D_low without a race where {GAP_INPUT} ≤ {self.gap_scout:g} (sets ranked by the sum)"
        if self.never:
            return ("never races (on the held-out sources no gate beat the policy alone within the overhead cap)"
                    + scout)
        parts = [f"P(D_low) ≥ {self.threshold:g}" if math.isfinite(self.threshold) else None,
                 f"{HEADROOM_INPUT} ≥ {self.headroom:g}" if math.isfinite(self.headroom) else None]
        race_words = f"to {self.fraction:.0%} of the budget" + (f" (up to {self.wait:.0%} while D_low is gaining)"
                                                                 if self.wait else "")
        if self.k is not None:
            race_words = (f"until one leads by more than {self.margin:.0%} at {self.k} evaluation"
                          f"{'s' if self.k > 1 else ''} in a row"
                          + (" (D_high only once D_low is not gaining)" if self.patient else "")
                          + f", at most {race_words}")
        tie = f" (at {self.tie:.0%} {TIE_WORDS})" if self.tie is not None else ""
        if self.hold:
            tie += (f" (D_low kept only on a lead beyond {self.hold:g} standard error{'' if self.hold == 1 else 's'} of the "
                    "held-out problems)")
        if self.fast_fraction is not None:
            tie += (f" (to {self.fast_fraction:.0%} where the probe's faster set raised held-out accuracy by "
                    f"{self.fast_gain:g} or more)")
        return f"races D_high against D_low {race_words} where {' or '.join(p for p in parts if p)}{tie}{scout}"

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("threshold", "headroom"):
            d[key] = None if math.isinf(d[key]) else d[key]
        if math.isinf(d["scout"]):  # absent, so files from before read as they did
            d.pop("scout")
        if d["open_cap"] is None:  # absent, so files from before read as they did
            d.pop("open_cap")
        if d["k"] is None:  # a race that stops only at its share: no lead rule to state
            for key in ("k", "margin", "patient"):
                d.pop(key)
        if d["tie"] is None:  # absent, so files from before read as they did
            d.pop("tie")
        if math.isinf(d["high_scout"]):  # absent, so files from before read as they did
            d.pop("high_scout")
        if d["cost"] == "share":  # absent, so files from before read as they did
            d.pop("cost")
        if d["fast_fraction"] is None:  # absent, so files from before read as they did
            d.pop("fast_fraction")
            d.pop("fast_gain")
        if math.isinf(d["gap_scout"]):  # absent, so files from before read as they did
            d.pop("gap_scout")
        if not d["hold"]:  # absent, so files from before read as they did
            d.pop("hold")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Gate":
        """A gate as a predictor file states it, already checked (`checks.gate_ok`)."""
        return cls(*(math.inf if d.get(k) is None else float(d[k]) for k in ("threshold", "headroom")),
                   float(d["fraction"]), None if d.get("wait") is None else float(d["wait"]), float(d["cap"]),
                   None if d.get("open_cap") is None else float(d["open_cap"]),
                   None if d.get("k") is None else int(d["k"]), float(d.get("margin", LEAD_MARGIN)),
                   bool(d.get("patient", False)), math.inf if d.get("scout") is None else float(d["scout"]),
                   None if d.get("tie") is None else float(d["tie"]),
                   math.inf if d.get("high_scout") is None else float(d["high_scout"]), str(d.get("cost", "share")),
                   math.inf if d.get("fast_fraction") is None else float(d["fast_gain"]),
                   None if d.get("fast_fraction") is None else float(d["fast_fraction"]),
                   -math.inf if d.get("gap_scout") is None else float(d["gap_scout"]),
                   0.0 if d.get("hold") is None else float(d["hold"]))


@lru_cache(maxsize=None)
def grid(races: tuple = RACES, scouts: tuple = NO_SCOUT) -> tuple[Gate, ...]:
    """Every gate: each pair of thresholds and each scout (a D_low lead, a pair of D_low and D_high
    leads, or a triple with a likelihood gap per token) with each race of `races`."""
    triples = [as_scout(sc) for sc in scouts]
    return tuple(Gate(t, h, f, w, k=k, margin=LEAD_MARGIN if m is None else m, patient=p, scout=lo, tie=ti,
                      high_scout=hi, gap_scout=gap, **fast_of(rest))
                 for t, h, (f, w, k, m, p, ti, *rest), (lo, hi, gap) in product(THRESHOLDS, HEADROOMS, races, triples))


def as_scout(sc) -> tuple[float, float, float]:
    """A scout of the grid as (D_low lead, D_high lead, likelihood gap): a lead alone or a pair of
    leads never decide by the gap."""
    t = sc if isinstance(sc, tuple) else (sc,)
    return t + (math.inf, -math.inf)[len(t) - 1:]


def fast_of(rest) -> dict:
    """A race entry's fast learner's stop (its 7th and 8th items; none where the 8th is None) and its
    hold (a 9th, `with_hold`), as Gate's fields."""
    fast = {"fast_gain": float(rest[0]), "fast_fraction": float(rest[1])} if rest and rest[1] is not None else {}
    return {**fast, "hold": float(rest[2])} if len(rest) > 2 else fast


def with_hold(race: tuple, hold: float) -> tuple:
    """A race entry of RACE_GRIDS whose stop without a lead keeps D_low only on a lead beyond `hold`
    standard errors (`advisor fit --race-hold`): (..., fast_gain, fast_fraction, hold); unchanged at 0."""
    if not hold:
        return race
    head, fast = race[:6], race[6:8] or (math.inf, None)
    return (*head, *fast, float(hold))


def gap_of(measured: dict, score: str | None) -> float:
    """The pool's likelihood gap per token (`GAP_INPUT`) where the sets were ranked by the sum (by the
    mean it is never negative), else NaN."""
    v = measured.get(GAP_INPUT)
    return float(v) if score == "sum" and isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def headroom_of(row: dict) -> float:
    v = inputs(model_inputs(row["features"], row["budget"], row["score"])).get(HEADROOM_INPUT)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def gated_picks(measured: Sequence[dict], policy, gate: Gate, at_shares: bool = False) -> list[tuple[dict, str, float]]:
    """(row, kept set, overhead) for each held-out measurement (`policy.held_out`'s): D_low where the
    probe's lead decides (`Gate.scouts`), the gate's race where it opens (`at_shares`: evaluated also
    at its stop shares, `Gate.replay`) — D_high at no cost instead where the probe's lead for D_high
    decides (`Gate.scouts_high`) —, the policy's set at no cost elsewhere."""
    out = []
    for m in measured:
        r = m["row"]
        if gate.scouts(r["features"]) or gate.gap_scouts(r["features"], r["score"]):
            out.append((r, "low", 0.0))
        elif gate.opens(m["probs"].get("low", math.nan), {HEADROOM_INPUT: headroom_of(r)}):
            out.append((r, "high", 0.0) if gate.scouts_high(r["features"]) else (r, *gate.replay(r, at_shares)))
        else:
            out.append((r, policy.choose(m["probs"], m["outside"], m["ratio"]) or "high", 0.0))
    return out


def choose_gate(measured: Sequence[dict], policy, cap: float = CAP, *more: Sequence[dict],
                open_cap: float | None = None, races: tuple = RACES, scouts: tuple = NO_SCOUT,
                cost: str = "share") -> Gate:
    """The gate of `grid(races)` with the lowest mean regret on `measured` whose mean overhead is within
    `cap`; near-ties to the cheaper, then the more cautious (higher thresholds). With `more` sets
    of held-out measurements (other splits: a task or a teacher left out beside a source), the
    lowest of the worst regret over the sets, each set's overhead within the cap. With `open_cap`,
    also the races it opens cost at most that share of one run on average (what a user whose gate
    opens pays), in every set. `scouts`: the contrasts from which the probe's own D_low lead may
    decide (NO_SCOUT: never). `cost`: what the caps count (COSTS: a share of one run, or tokens). The
    gate that never opens costs nothing, so a choice always exists."""
    return best_gate(measured, policy, cap, *more, open_cap=open_cap, races=races, scouts=scouts, cost=cost)[0]


def race_cost(row: dict, kept: str, share: float, cost: str = "share") -> float:
    """A race's extra training on a row as `cost` counts it: its share of one run, or in tokens
    (`labels.token_share` from the row's `tokens`; its share where the records do not say)."""
    if cost == "share" or share <= 0:
        return share
    t = token_share(row.get("tokens") or {}, kept, share)
    return share if t is None else t


def _gate_arrays(measured: Sequence[dict], policy, races: tuple = RACES, cost: str = "share") -> dict:
    """What comparing the gates on one set of measurements needs, as arrays: P(D_low), the
    headroom input, the policy's regret where the gate stays shut, and each race's regret and extra
    training (as `cost` counts it)."""
    rows = [m["row"] for m in measured]
    raced = {}
    for f, w, k, m, p, ti, *rest in races:
        g = Gate(fraction=f, wait=w, k=k, margin=LEAD_MARGIN if m is None else m, patient=p, tie=ti, **fast_of(rest))
        once = {}  # a row measured on several bootstrap draws (`advisor fit --gate-draws`) is raced once
        kept = [once[id(r)] if id(r) in once else once.setdefault(id(r), g.replay(r)) for r in rows]
        raced[(f, w, k, m, p, ti, *rest)] = (np.array([regret(r, k) for r, (k, _) in zip(rows, kept)]),
                                      np.array([race_cost(r, k, s, cost) for r, (k, s) in zip(rows, kept)]))
    return {"p_low": np.array([m["probs"].get("low", math.nan) for m in measured], dtype=float),
            "head": np.array([headroom_of(r) for r in rows], dtype=float),
            "shut": np.array([regret(r, policy.choose(m["probs"], m["outside"], m["ratio"]) or "high")
                              for r, m in zip(rows, measured)]),
            "low": np.array([regret(r, "low") for r in rows]),
            "high": np.array([regret(r, "high") for r in rows]),
            "lead": np.array([accuracy_lead(r["features"]) for r in rows], dtype=float),
            "gap": np.array([gap_of(r["features"], r["score"]) for r in rows], dtype=float),
            "raced": raced}


def scored_gates(measured: Sequence[dict], policy, *more: Sequence[dict], races: tuple = RACES,
                 scouts: tuple = NO_SCOUT, cost: str = "share"):
    """Every gate of `grid(races, scouts)` with its mean regret (a share; with `more`, the worst over
    the sets), mean overhead (the worst over the sets) and the mean overhead of the races it opens
    (the worst over the sets), as (gate, regret, overhead, where open). Every race of `races` is
    replayed once per row and the gates compared as arrays. `cost`: what the overheads count (COSTS)."""
    sets = [_gate_arrays(m, policy, races, cost) for m in (measured, *more) if m]
    with np.errstate(invalid="ignore"):  # a NaN input never opens the gate
        for g in grid(races, scouts):
            regs, overs, opened_costs = [], [], []
            for a in sets:
                scouted = (a["lead"] >= g.scout) | (a["gap"] <= g.gap_scout)
                would = ((a["p_low"] >= g.threshold) | (a["head"] >= g.headroom)) & ~scouted
                high = would & (-a["lead"] >= g.high_scout)  # the probe's D_high lead decides instead of a race
                opened = would & ~high
                reg_r, share = a["raced"][g.rule]
                regs.append(float(np.where(scouted, a["low"], np.where(high, a["high"],
                                                                       np.where(opened, reg_r, a["shut"]))).mean()))
                overs.append(float(np.where(opened, share, 0.0).mean()))
                opened_costs.append(float(share[opened].mean()) if opened.any() else 0.0)
            yield g, max(regs), max(overs), max(opened_costs)


def best_gate(measured: Sequence[dict], policy, cap: float = CAP, *more: Sequence[dict],
              open_cap: float | None = None, races: tuple = RACES, scouts: tuple = NO_SCOUT,
              cost: str = "share") -> tuple[Gate, float]:
    """`choose_gate`'s gate and its mean regret (points; with `more`, the worst over the sets), from
    `scored_gates`."""
    best = None
    for g, reg, over, opened_cost in scored_gates(measured, policy, *more, races=races, scouts=scouts, cost=cost):
        if over > cap + 1e-9 or (open_cap is not None and opened_cost > open_cap + 1e-9):
            continue
        key = (reg, over, -g.threshold, -g.headroom, -g.scout, -g.high_scout, -g.fast_gain, g.gap_scout)
        if best is None or reg < best[0][0] - NEAR or (abs(reg - best[0][0]) <= NEAR and key[1:] < best[0][1:]):
            best = (key, g)
    return replace(best[1], cap=cap, open_cap=open_cap, cost=cost), 100 * best[0][0]


def judged_on_other_half(pairs: Sequence[tuple]) -> dict:
    """The honest judgment where the records kept per-problem correctness: each pick scored on the
    held-out problems its race did not read (`races.with_curves`'s `judge`)."""
    judged = [(r, c) for r, c, *_ in pairs if "judge" in r]
    if not judged:
        return {"rows": 0, "regret": None, "decision_accuracy": None}
    as_row = [({"accuracy": r["judge"]}, c) for r, c in judged]
    return {"rows": len(judged), "regret": 100 * mean(regret(r, c) for r, c in as_row),
            "decision_accuracy": mean(is_right(r, c) for r, c in as_row)}


def in_tokens(pairs: Sequence[tuple[dict, str, float]]) -> dict:
    """The same extra training counted in tokens (`race_cost`, as a cap in tokens counts it): over
    every row and over the rows raced on; a raced row whose records do not say their tokens counts at
    its share, and `tokens_unknown` says how many did."""
    raced = [(o, token_share(r.get("tokens") or {}, c, o)) for r, c, o in pairs if o > 0]
    unknown = sum(t is None for _, t in raced)
    costs = [o if t is None else t for o, t in raced]  # as `race_cost` counts them
    return {"overhead_tokens": sum(costs) / len(pairs) if pairs else None,
            "overhead_tokens_where_open": mean(costs) if costs else None,
            **({"tokens_unknown": unknown} if unknown else {})}


def summarize_gated(pairs: Sequence[tuple[dict, str, float]], rows: Sequence[dict],
                    tie_margin: float = TIE_MARGIN) -> dict:
    """What `meta.cv.SPLIT.methods["gated race"]` holds: regret (points), decision accuracy, mean
    overhead, the share of rows where it opened and the mean overhead of those races alone (what a
    user whose gate opens pays), both also in tokens (`in_tokens`), flip rate across seeds, the two stricter judgments, and per pool source its regret
    and overhead."""
    if not pairs:
        return {"rows": 0, "regret": None, "decision_accuracy": None, "overhead": None}
    raced = [o for *_, o in pairs if o > 0]
    out = {"rows": len(pairs), "regret": 100 * mean(regret(r, c) for r, c, _ in pairs),
           "decision_accuracy": mean(is_right(r, c, tie_margin) for r, c, _ in pairs),
           "within_3_points": near_best(pairs),
           "overhead": mean(o for *_, o in pairs), "opened": len(raced) / len(pairs),
           "overhead_where_open": mean(raced) if raced else None, **in_tokens(pairs),
           **flips([(r, c) for r, c, _ in pairs]),
           "other_seed": judged_on_other_repeats(pairs, rows), "other_half": judged_on_other_half(pairs),
           "by_source": {}}
    for s in sorted({r["source"] for r, *_ in pairs}):
        sub = [p for p in pairs if p[0]["source"] == s]
        out["by_source"][s] = {"rows": len(sub), "regret": 100 * mean(regret(r, c) for r, c, _ in sub),
                               "overhead": mean(o for *_, o in sub)}
    return out


def gated_methods(gated: dict, picks: dict, rows: Sequence[dict], tie_margin: float,
                  everywhere: Sequence[tuple[dict, str, float, float]] = (), at_shares: Sequence[tuple] = ()) -> dict:
    """The held-out tables' entries of the gated race: at the shipped cap (`gated race`, with its
    regret, overhead, regret on other seeds and worst source against always-high at every cap of
    CAPS under `caps`; with `at_shares`, the shipped cap's picks with each race evaluated also at its
    stop shares (`Gate.replay`), under `at_shares`; with `everywhere`, the same race run on every held-out pool — its regret,
    overhead and share within 3 points — and the training the gate saves against it), and for the
    policy, the predictor and always-high the same stricter judgments (other seeds, other half) and the regret
    per pool source, to compare."""
    high = by_value(picks["always high"], "source", tie_margin)
    caps = {}
    for cap, p in gated.items():
        t = summarize_gated(p, rows, tie_margin)
        caps[f"{cap:.0%}"] = {**{k: t[k] for k in ("regret", "overhead", "decision_accuracy")},
                              "other_seed": t["other_seed"]["regret"],  # the worst source's loss beside always-high
                              "worst_source_over_high": max(v["regret"] - high[s]["regret"] for s, v in t["by_source"].items())}
    out = {"gated race": {**summarize_gated(gated[CAP], rows, tie_margin), "cap": CAP, "caps": caps}}
    if at_shares:  # the same gates' races evaluated also at their stop shares, as `advisor train` races
        t = summarize_gated(at_shares, rows, tie_margin)
        out["gated race"]["at_shares"] = {**{k: t[k] for k in ("regret", "overhead", "opened", "overhead_where_open",
                                                                "within_3_points")},
                                          **{k: t[k] for k in ("overhead_tokens", "overhead_tokens_where_open") if k in t},
                                          **{k: t[k]["regret"] for k in ("other_half", "other_seed")}}
    if everywhere:  # (row, kept, overhead racing it, the gated race's overhead on it), folds whose gate opens at all
        every = {"rows": len(everywhere), "regret": 100 * mean(regret(r, c) for r, c, *_ in everywhere),
                 "overhead": mean(o for _, _, o, _ in everywhere), "within_3_points": near_best(everywhere)}
        out["gated race"]["race_every_pool"] = every
        gated_cost = mean(g for *_, g in everywhere)  # on the same rows
        out["gated race"]["compute_saved"] = 1 - gated_cost / every["overhead"] if every["overhead"] > 0 else None
    for m in ("policy", "predictor", "always high"):  # judged as strictly (other seed, other half), over every fold's rows
        out[m] = {"other_seed": judged_on_other_repeats(picks[m], rows), "other_half": judged_on_other_half(picks[m]),
                  "by_source": by_value(picks[m], "source", tie_margin)}
    return out
