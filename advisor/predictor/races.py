"""Races of D_high against D_low replayed on calibration records: what `advisor train --race`
would have kept and what it cost, per pool source.

    table = race_table(records)   # {method: {"all": {...}, SOURCE: {...}}}

Each (unit, budget) row of `label_rows` is raced on the first B epochs of its runs (as the labels
are read): at the first evaluation at or past F of the budget the set with the best held-out
accuracy so far is kept (D_high on ties) and trained to the end (overhead F); the adaptive race
stops earlier once one set has led by more than the margin and z standard errors on k
evaluations in a row; a race with a tie check stops for D_high at that share where D_low has not
been ahead and is not gaining. The records hold accuracies, not per-problem correctness, so the standard
error is the unpaired one of two proportions — the real race pairs per problem, which is never
less sensitive. `advisor fit` stores the table (`meta.races`) and `advisor recommend` states what
a race would cost beside its advice; `python -m experiments.frontier` prints it per source.

A race's overhead is the share of the budget at which it stopped (the loser's training), so a
race "at 20 %" of a half-epoch budget whose first evaluation comes at a quarter epoch costs 50 %.
Where the records kept each held-out problem's correctness (`correct` in their evaluations), the
race decides on one half of the problems and is judged on the other (`with_curves`): the race's
pick is then not scored on the noise it picked by.
"""

from __future__ import annotations

import math
from collections import defaultdict

from capacity_advisor.advisor.predictor.evaluate import is_right, judged_on_other_repeats, regret
from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS
from capacity_advisor.advisor.predictor.labels import label_rows, record_option, unit_of
from capacity_advisor.training.race import gaining, holds_back, keeps_low, levels

FIXED = (0.1, 0.2, 0.3, 0.5)
WAITS = ((0.3, 0.75), (0.5, 0.75), (0.5, 1.0))  # (fraction, wait) of the races that wait for a slow starter
TIE_CHECKS = ((0.3, 0.75, None), (0.5, 0.75, None), (0.5, 1.0, None), (0.5, 0.75, 2))  # (tie, fraction, k) replayed


def curves_of(records, half: int | None = None) -> dict:
    """{(source, score, student, repeat): {option: [(epoch, accuracy), ...] after step 0}}; with
    `half` (0 or 1), the accuracy on that half of the held-out problems (`half_accuracy`), for
    records whose every trained evaluation kept per-problem correctness (the others left out)."""
    out: dict = defaultdict(dict)
    for rec in records:
        u = unit_of(rec)
        key = (u["source"], u["score"], u["student"], u["repeat"])
        opt = record_option(rec)
        if opt is None:
            continue
        trained = [e for e in rec["evals"] if e.get("step", 1) > 0]
        if half is None:
            out[key][opt] = [(e["epoch"], e["accuracy"]) for e in trained if e.get("accuracy") is not None]
        elif trained and all(isinstance(e.get("correct"), str) and e["correct"] for e in trained):
            out[key][opt] = [(e["epoch"], half_accuracy(e["correct"], half)) for e in trained]
    return out


def half_accuracy(correct: str, half: int) -> float:
    """Accuracy on the even (`half` 0) or odd (1) held-out problems of a record's correctness string."""
    part = correct[half::2]
    return part.count("1") / len(part) if part else float("nan")


def with_curves(rows: list[dict], records) -> list[dict]:
    """`rows` (label_rows of `records`), each with the accuracy curves of its D_high and D_low runs
    (`curves`: what a replayed race reads) and, where those runs kept per-problem correctness,
    the race reads the even problems and `judge` holds every option's best accuracy within the
    budget on the odd ones (what the race's pick is judged on); `n_eval` then says how many
    problems that half holds (an adaptive race's noise is that of its own problems)."""
    full, select, judge = curves_of(records), curves_of(records, 0), curves_of(records, 1)
    problems = {}
    for rec in records:  # each unit's held-out problems, from the correctness its evaluations kept
        correct = next((e["correct"] for e in rec.get("evals", []) if isinstance(e.get("correct"), str)), None)
        if correct:
            u = unit_of(rec)
            problems[(u["source"], u["score"], u["student"], u["repeat"])] = len(correct)
    out = []
    for r in rows:
        key = (r["source"], r["score"], r["student"], r["repeat"])
        halves = select.get(key, {})
        row = {**r, "curves": {o: full[key][o] for o in ("high", "low")}}
        if all(o in halves for o in ("high", "low")) and all(o in judge.get(key, {}) for o in r["accuracy"]):
            row["curves"] = {o: halves[o] for o in ("high", "low")}
            row["n_eval"] = (problems[key] + 1) // 2 if key in problems else FULL_RUN_EVAL_PROBLEMS // 2
            row["judge"] = {o: max((a for e, a in judge[key][o] if e <= r["budget"] + 1e-9), default=float("nan"))
                            for o in r["accuracy"]}
        out.append(row)
    return out


_PAIRED: dict = {}  # (id(curve_h), id(curve_l), budget) -> (curve_h, curve_l, events): `paired`'s replays
_PAIRED_MAX = 20_000  # a fit pairs each held-out row's curves once: a few thousand pairs


def paired(curve_h, curve_l, budget: float) -> tuple:
    """The two runs' evaluations within the budget paired by epoch, as (share of the budget, D_high's
    accuracy, D_low's): one a race kept (evaluated also at its shares) beside a plain run of the other
    set pairs on the evaluations both made. `advisor fit` replays every race of its grid on the same
    rows fold after fold, so the pairing is kept per pair of curves: the entry holds the curves
    themselves, so their ids cannot be reused while it lives, and it is used only for those objects."""
    key = (id(curve_h), id(curve_l), budget)
    hit = _PAIRED.get(key)
    if hit is not None and hit[0] is curve_h and hit[1] is curve_l:
        return hit[2]
    lo = {round(e, 9): a for e, a in curve_l if e <= budget + 1e-9}
    events = tuple((min(1.0, e / budget), ah, lo[round(e, 9)]) for e, ah in curve_h
                   if e <= budget + 1e-9 and round(e, 9) in lo)
    if len(_PAIRED) >= _PAIRED_MAX:
        _PAIRED.clear()
    _PAIRED[key] = (curve_h, curve_l, events)
    return events


def race(curve_h, curve_l, budget: float, fraction: float, k: int | None = None, margin: float = 0.05,
         z: float = 1.96, n_eval: int = FULL_RUN_EVAL_PROBLEMS, wait: float | None = None,
         patient: bool = False, tie: float | None = None, at_shares: bool = False, hold: float = 0.0) -> tuple[str, float]:
    """(kept set, share of the budget at which the race stopped) of one replayed race. With `wait`,
    a race due to stop goes on, up to that share, while D_low is behind and gaining faster than
    D_high (`training.race.gaining`, as `advisor train` races); with `patient`, a D_high lead stops
    it only where `training.race.holds_back` lets it; with `tie`, at the first evaluation at or past
    that share it stops for D_high unless D_low has been ahead or is gaining (`training.race.levels`);
    with `hold`, a race stopped without a lead keeps D_low only on a lead beyond that many standard
    errors over `n_eval` problems (`training.race.keeps_low`).

    `at_shares`: the race as `advisor train` now runs it, evaluating also at its tie check, fraction
    and wait (`RaceRule.shares`): it may stop at those shares exactly. The records hold no evaluation
    there, so the replay decides at such a share on the evaluations before it (less than the race
    will see) and charges the share itself."""
    events = paired(curve_h, curve_l, budget)
    if at_shares and events:
        events = list(events)
        on_grid = [s for s, _, _ in events]
        for d in (tie, fraction, wait):
            if d is not None and d < 1 and not any(abs(d - s) < 1e-9 for s in on_grid):
                events.append((d, None, None))  # an evaluation the records lack: nothing new is seen there
        events.sort(key=lambda x: (x[0], x[1] is None))
    seen = {"high": [], "low": []}
    streak, prev, checked = 0, None, tie is None
    for share, ah, al in events:
        if ah is not None:
            seen["high"].append(ah)
            seen["low"].append(al)
        if k is not None and ah is not None:
            se = math.sqrt(max(ah * (1 - ah), 0) / n_eval + max(al * (1 - al), 0) / n_eval)
            lead = ("high" if ah > al else "low") if abs(ah - al) > max(z * se, margin) else None
            streak = (streak + 1 if lead == prev else 1) if lead else 0
            prev = lead
            if lead and streak >= k and not (patient and lead == "high" and holds_back(seen["high"], seen["low"])):
                return lead, share
        if not checked and share >= tie - 1e-9:
            checked = True
            if levels(seen["high"], seen["low"]):
                return "high", share
        if share >= fraction - 1e-9:
            if wait is not None and share < wait - 1e-9 and gaining(seen["high"], seen["low"]):
                continue
            return leader(seen, hold, n_eval), share
    return leader(seen, hold, n_eval), 1.0


def leader(seen: dict, hold: float = 0.0, n_eval: int = FULL_RUN_EVAL_PROBLEMS) -> str:
    """The set with the best accuracy so far (D_high on ties; with `hold`, D_low only on a lead beyond
    that many standard errors over `n_eval` problems, `training.race.keeps_low`)."""
    best_h, best_l = max(seen["high"], default=-1.0), max(seen["low"], default=-1.0)
    return "low" if keeps_low(best_h, best_l, n_eval, hold) else "high"


def summarize_races(pairs, rows=None) -> dict:
    """pairs: (row, choice, overhead) -> rows, mean regret (points), decision accuracy, mean overhead;
    with `rows` (the label rows), also the regret judged on each row's other seeds (`other_seed`)."""
    if not pairs:
        return {"rows": 0}
    out = {"rows": len(pairs), "regret": 100 * sum(regret(r, c) for r, c, _ in pairs) / len(pairs),
           "decision_accuracy": sum(is_right(r, c) for r, c, _ in pairs) / len(pairs),
           "overhead": sum(o for _, _, o in pairs) / len(pairs)}
    if rows is not None:
        out["other_seed"] = judged_on_other_repeats(pairs, rows)["regret"]
    return out


def race_table(records, n_eval: int = FULL_RUN_EVAL_PROBLEMS) -> dict:
    rows = label_rows(records)
    curves = curves_of(records)
    methods: dict[str, list] = defaultdict(list)
    for r in rows:
        c = curves[(r["source"], r["score"], r["student"], r["repeat"])]
        b = r["budget"]
        for name, choice in (("always high", "high"), ("always low", "low"), ("always mixed", "mixed")):
            methods[name].append((r, choice, 0.0))
        for f in FIXED:
            kept, share = race(c["high"], c["low"], b, f, n_eval=n_eval)
            methods[f"race, fixed at {f:.0%} of the budget"].append((r, kept, share))
        kept, share = race(c["high"], c["low"], b, 0.5, k=2, n_eval=n_eval)
        methods["race, adaptive (k 2, margin 5 points, at most 50 %)"].append((r, kept, share))
        for f, w in WAITS:  # a stop that waits while D_low is behind and gaining (training.race.gaining)
            kept, share = race(c["high"], c["low"], b, f, n_eval=n_eval, wait=w)
            methods[f"race, at {f:.0%} waiting up to {w:.0%} for a gaining D_low"].append((r, kept, share))
        for t, f, k in TIE_CHECKS:  # a stop for D_high where D_low shows nothing by the check (training.race.levels)
            kept, share = race(c["high"], c["low"], b, f, k=k, n_eval=n_eval, tie=t)
            lead = " or on a lead (k 2, margin 5 points)" if k else ""
            methods[f"race, tie check at {t:.0%}, else at {f:.0%}{lead}"].append((r, kept, share))
    sources = sorted({r["source"] for r in rows})
    table = {}
    for name, pairs in methods.items():
        table[name] = {"all": summarize_races(pairs, rows),
                       **{s: summarize_races([p for p in pairs if p[0]["source"] == s]) for s in sources}}
    return {"sources": sources, "methods": table, "rows": len(rows)}


def race_summary(records) -> list[dict]:
    """What `meta.races` stores: per replayed method over all sources, its regret, decision
    accuracy and overhead, and the budget share a fixed race stops at (None: adaptive or none)."""
    table = race_table(records)["methods"]
    out = []
    for name, t in table.items():
        fraction = next((f for f in FIXED if name == f"race, fixed at {f:.0%} of the budget"), None)
        out.append({"method": name, "fraction": fraction, **{k: t["all"][k] for k in
                                                           ("rows", "regret", "decision_accuracy", "overhead")}})
    return out


def race_grid() -> dict[str, dict]:
    """The races a left-out choice picks from: fixed at F of the budget, and adaptive (k
    evaluations in a row led by more than the margin, at most F)."""
    grid = {f"fixed at {f:.0%}": {"fraction": f} for f in (0.1, 0.2, 0.3, 0.4, 0.5)}
    for cap in (0.3, 0.5):
        for k in (1, 2, 3):
            for margin in (0.02, 0.05, 0.1):
                grid[f"adaptive k {k}, margin {margin:.0%}, at most {cap:.0%}"] = {"fraction": cap, "k": k, "margin": margin}
    return grid


def race_picks(records, n_eval: int = FULL_RUN_EVAL_PROBLEMS) -> tuple[list[dict], dict[str, list]]:
    """The label rows and, per race of `race_grid`, its (row, kept set, overhead) on every row."""
    rows = label_rows(records)
    curves = curves_of(records)
    picks: dict[str, list] = {}
    for name, cfg in race_grid().items():
        out = []
        for r in rows:
            c = curves[(r["source"], r["score"], r["student"], r["repeat"])]
            kept, share = race(c["high"], c["low"], r["budget"], cfg["fraction"], k=cfg.get("k"),
                               margin=cfg.get("margin", 0.05), n_eval=n_eval)
            out.append((r, kept, share))
        picks[name] = out
    return rows, picks


def races_left_out(records, max_overhead: float = 0.3, n_eval: int = FULL_RUN_EVAL_PROBLEMS) -> dict:
    """The race chosen without seeing the pool source it is judged on: for each source, the race
    of `race_grid` with the lowest mean regret on the other sources among those whose mean
    overhead there is at most `max_overhead` (the lowest overhead if none is), judged on that
    source's rows. {"folds": {source: {"race", "train", "test"}}, "all": the held-out rows pooled}."""
    rows, picks = race_picks(records, n_eval)
    folds, pooled = {}, []
    for s in sorted({r["source"] for r in rows}):
        train = {n: summarize_races([p for p in ps if p[0]["source"] != s]) for n, ps in picks.items()}
        allowed = [n for n in train if train[n]["overhead"] <= max_overhead + 1e-9]
        name = (min(allowed, key=lambda n: (train[n]["regret"], train[n]["overhead"])) if allowed
                else min(train, key=lambda n: train[n]["overhead"]))
        test = [p for p in picks[name] if p[0]["source"] == s]
        pooled += test
        folds[s] = {"race": name, "train": train[name], "test": summarize_races(test)}
    return {"folds": folds, "all": summarize_races(pooled), "max_overhead": max_overhead}
