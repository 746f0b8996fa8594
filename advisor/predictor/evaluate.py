"""How good advice is on data it was not fitted on: regret, the baselines, folds and the noise floor.

    table = cross_validate(rows, split="source", kind="lightgbm")   # every method, held out by source

Regret is the accuracy lost against the best option in hindsight, in points; a choice within the
tie margin (1 point) of the best is a right decision. The baselines, defined here once and used by
`advisor recommend` too: the constant rules (always high — GRAPE's —, always low, always mixed)
and the size rule (low iff log10(parameters) and the budget pass thresholds fitted to minimise
regret). The noise floor chooses, for each row, the option that won on the *other* seeds of the
same student, pool source, ranking and budget: what the labels' own noise allows.

Folds leave out one value of a row's `student`, `shape`, `source`, `task` or `teacher` at a time;
every row of a unit shares those values, so no unit is ever on both sides of a fold. The `proxy`
split holds out one large student (from PROXY_CUT parameters) on one pool source and fits on the
other sources without that student plus the small students of its own source: a user who
calibrated their own pool with small proxy students and asks about a large one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Sequence

import numpy as np

from capacity_advisor.core.numbers import number
from capacity_advisor.advisor.predictor.labels import TIE_MARGIN, within
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import option_order

CONSTANTS = {"always high": "high", "always low": "low", "always mixed": "mixed"}
SIZE_RULE = "size rule"  # the fitted size-and-budget rule, as every table names it
SPLITS = ("student", "shape", "source", "task", "teacher")
PROXY = "proxy"  # a large student on a pool source, fitted with that source's small students (its proxies)
CV_SPLITS = (*SPLITS, PROXY)  # what `advisor fit --cv` can hold out (proxy only when asked: it is the costliest)
PROXY_CUT = 2e5  # parameters: below it a student is a proxy, from it a target (both sides hold several lab students)


def regret(row: dict, choice: str) -> float:
    """Accuracy lost against the best option in hindsight (0..1); an option never run counts as the worst."""
    accs = row["accuracy"]
    return max(accs.values()) - accs.get(choice, min(accs.values()))


def is_right(row: dict, choice: str, tie_margin: float = TIE_MARGIN) -> bool:
    accs = row["accuracy"]
    return within(accs.get(choice, min(accs.values())), max(accs.values()), tie_margin)


@dataclass
class Rule:
    """The paper's rule of thumb made fair: low iff log10(params) ≥ t_params and budget ≥ t_budget,
    with both thresholds fitted to minimise regret (infinite: never low)."""

    t_params: float
    t_budget: float

    @classmethod
    def fit(cls, rows: Sequence[dict]) -> "Rule":
        """Thresholds tried from the most cautious (never low) down; a rule replaces the best only
        when strictly better, so ties go to the rule that says low less often."""
        P = [math.inf] + sorted({math.log10(r["n_params"]) for r in rows}, reverse=True)
        E = [math.inf] + sorted({r["budget"] for r in rows}, reverse=True)
        best = None
        for tp in P:
            for te in E:
                rule = cls(tp, te)
                reg = mean(regret(r, rule.choose(r)) for r in rows)
                if best is None or reg < best[0] - 1e-12:
                    best = (reg, rule)
        return best[1]

    @classmethod
    def from_meta(cls, meta: dict | None) -> "Rule | None":
        """The rule a predictor stores (`meta.rule_of_thumb`; null thresholds are infinite)."""
        if not isinstance(meta, dict):
            return None
        t = [meta.get("t_params"), meta.get("t_budget")]
        if not all(v is None or number(v) for v in t):
            return None
        return cls(*(math.inf if v is None else float(v) for v in t))

    def decide(self, n_params: float, budget: float) -> str:
        return "low" if (math.log10(max(1.0, n_params)) >= self.t_params and budget >= self.t_budget) else "high"

    def choose(self, row: dict) -> str:
        return self.decide(row["n_params"], row["budget"])

    def describe(self) -> str:
        if not (math.isfinite(self.t_params) and math.isfinite(self.t_budget)):
            return "size rule (always high)"
        return f"size rule (low if params ≥ 10^{self.t_params:.2f} and epochs ≥ {self.t_budget:g})"


def split_key(split: str):
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}: use {', '.join(CV_SPLITS)}")
    return lambda r: r.get(split) or "unknown"


def proxy_folds(rows: Sequence[dict], own: int | None = None, cut: float = PROXY_CUT) -> list[tuple[str, list, list]]:
    """(SOURCE|STUDENT, train, test) for every student of `cut` parameters and up on every pool
    source that also holds smaller ones: test is that student on that source; train is the other
    sources without that student, plus that source's students below the cut — all of them
    (`own` None), only the `own` largest, or none (`own` 0: the control, a source never seen)."""
    out = []
    for source in sorted({r["source"] for r in rows}):
        here = [r for r in rows if r["source"] == source]
        small = sorted({(r["n_params"], r["student"]) for r in here if (r["n_params"] or 0) < cut})
        large = sorted({r["student"] for r in here if (r["n_params"] or 0) >= cut})
        if not small or not large:
            continue
        keep = {st for _, st in (small if own is None else small[len(small) - own:] if own else [])}
        for student in large:
            train = [r for r in rows if r["student"] != student and (r["source"] != source or r["student"] in keep)]
            test = [r for r in here if r["student"] == student]
            if train and test and len({r["student"] for r in train}) >= 2:
                out.append((f"{source}|{student}", train, test))
    return out


def folds(rows: Sequence[dict], split: str) -> list[tuple[str, list[dict], list[dict]]]:
    """(held-out name, train rows, test rows) for leaving one value of `split` out at a time."""
    if split == PROXY:
        return proxy_folds(rows)
    key = split_key(split)
    names = sorted({key(r) for r in rows})
    if split == "shape":  # the balanced ladder spans every size; holding it out leaves nothing to learn from
        names = [n for n in names if n not in ("balanced", "unknown")]
    out = []
    for name in names:
        train = [r for r in rows if key(r) != name]
        test = [r for r in rows if key(r) == name]
        if train and test and len({r["student"] for r in train}) >= 2:
            out.append((name, train, test))
    return out


def cell_of(row: dict) -> tuple:
    """The (pool source, ranking, student, budget) a row measures; its other repeats share it."""
    return (row["source"], row["score"], row["student"], row["budget"])


def repeat(row: dict) -> object:
    """Which repeat of its cell a row is: its seed, and its pretraining build (`labels.repeat_of`)."""
    return row["repeat"] if "repeat" in row else row["seed"]


def _by_cell(pairs: Sequence[tuple[dict, object]]) -> list[list]:
    """The values of `pairs`, one list per cell holding two or more seeds."""
    by: dict[tuple, dict] = defaultdict(dict)
    for r, v in pairs:
        by[cell_of(r)][repeat(r)] = v
    return [list(seeds.values()) for seeds in by.values() if len(seeds) >= 2]


def flips(pairs: Sequence[tuple[dict, str]]) -> dict:
    """Over the cells with two or more seeds among (row, choice) `pairs`: how many there are
    (`flip_cells`) and the share whose seeds got different choices (`flip_rate`, None without any)."""
    cells = _by_cell(pairs)
    return {"flip_rate": float(np.mean([len(set(c)) > 1 for c in cells])) if cells else None,
            "flip_cells": len(cells)}


def seed_spread(values: Sequence[tuple[dict, float]]) -> float | None:
    """The mean over cells with two or more seeds of the range (largest minus smallest) of a
    number across the cell's seeds — for two seeds, their absolute difference; None without any."""
    cells = _by_cell([(r, v) for r, v in values if math.isfinite(v)])
    return float(np.mean([max(c) - min(c) for c in cells])) if cells else None


def noise_floor(rows: Sequence[dict]) -> list[tuple[dict, str]]:
    """(row, the option that won most often on the other repeats — seeds and pretraining builds —
    of its student, source, ranking and budget) for every row that has other repeats."""
    by = defaultdict(list)
    for r in rows:
        by[cell_of(r)].append(r)
    out = []
    for group in by.values():
        for r in group:
            others = Counter(o["label"] for o in group if o is not r and repeat(o) != repeat(r))
            if others:
                top = max(others.values())
                out.append((r, min((o for o, n in others.items() if n == top), key=option_order)))
    return out


NEAR_BEST = 0.03  # "within 3 points of the best": TuneAhead's (arXiv 2606.17660) share of good-enough decisions


def near_best(pairs) -> float:
    """The share of (row, choice, ...) pairs whose choice is within NEAR_BEST of the row's best option."""
    return float(np.mean([regret(p[0], p[1]) <= NEAR_BEST + 1e-9 for p in pairs]))


def summarize(pairs: Sequence[tuple[dict, str]], tie_margin: float = TIE_MARGIN, seed: int = 0) -> dict:
    """Rows, mean regret (points) with a 90 % bootstrap interval over units, decision accuracy
    (share of rows within the tie margin of the best option), the share within 3 points of the
    best (`within_3_points`), the flip rate across seeds (`flips`), and the same per ranking arm."""
    if not pairs:
        return {"rows": 0, "regret": None, "decision_accuracy": None, "ci90": [None, None], "arms": {},
                **flips(pairs)}
    regrets = np.array([100 * regret(r, s) for r, s in pairs])
    groups = np.array([r["group"] for r, _ in pairs])
    out = {"rows": len(pairs), "regret": float(regrets.mean()),
           "decision_accuracy": float(np.mean([is_right(r, s, tie_margin) for r, s in pairs])),
           "within_3_points": near_best(pairs),
           "ci90": _group_bootstrap(regrets, groups, seed), **flips(pairs), "arms": {}}
    for arm in sorted({r["score"] for r, _ in pairs}):
        sub = [(r, s) for r, s in pairs if r["score"] == arm]
        out["arms"][arm] = {"rows": len(sub), "regret": float(np.mean([100 * regret(r, s) for r, s in sub])),
                            "decision_accuracy": float(np.mean([is_right(r, s, tie_margin) for r, s in sub])),
                            **flips(sub)}
    return out


def by_value(pairs: Sequence[tuple[dict, str]], key: str, tie_margin: float = TIE_MARGIN) -> dict:
    """Rows, mean regret (points) and decision accuracy per value of the rows' `key` (a pool
    source, a task), in sorted order."""
    out = {}
    for value in sorted({str(r[key]) for r, _ in pairs}):
        sub = [(r, s) for r, s in pairs if str(r[key]) == value]
        out[value] = {"rows": len(sub), "regret": float(np.mean([100 * regret(r, s) for r, s in sub])),
                      "decision_accuracy": float(np.mean([is_right(r, s, tie_margin) for r, s in sub]))}
    return out


def _group_bootstrap(values: np.ndarray, groups: np.ndarray, seed: int, n: int = 1000) -> list[float]:
    """90% interval of the mean, resampling whole groups (a unit's budgets move together)."""
    names = np.unique(groups)
    idx = {g: np.nonzero(groups == g)[0] for g in names}
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n):
        take = np.concatenate([idx[g] for g in rng.choice(names, size=len(names), replace=True)])
        means.append(values[take].mean())
    return [float(np.percentile(means, 5)), float(np.percentile(means, 95))]


def baseline_picks(train: Sequence[dict], test: Sequence[dict]) -> dict[str, list[tuple[dict, str]]]:
    """The constant rules and the size rule fitted on `train`, applied to `test`."""
    rule = Rule.fit(train)
    picks = {name: [(r, s) for r in test] for name, s in CONSTANTS.items()}
    picks[SIZE_RULE] = [(r, rule.choose(r)) for r in test]
    return picks


def judged_on_other_repeats(pairs: Sequence[tuple], rows: Sequence[dict]) -> dict:
    """The stricter judgment: each (row, choice, ...) scored on the other repeats (seeds, builds) of
    its cell rather than on its own, so a race's pick is not scored on the training noise it picked
    by. Mean regret (points) and decision accuracy over the rows that have other repeats."""
    by: dict = {}
    for r in rows:
        by.setdefault(cell_of(r), []).append(r)
    regrets, right = [], []
    for r, c, *_ in pairs:
        others = [o for o in by.get(cell_of(r), []) if repeat(o) != repeat(r)]
        if others:
            regrets.append(mean(regret(o, c) for o in others))
            right.append(mean(is_right(o, c) for o in others))
    return {"rows": len(regrets), "regret": 100 * mean(regrets) if regrets else None,
            "decision_accuracy": mean(right) if right else None}
