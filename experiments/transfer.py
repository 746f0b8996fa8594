"""Advice fitted on one set of records judged on another: the shipped predictor, its policy and its
gated race (fitted on the lab only) on the real pretrained student's rows, beside always-high,
always-low, always-mixed, plain races and the noise floor.

    python -m experiments.transfer calibration/real/* --markdown
    python -m experiments.transfer runs/real/linear-scripted runs/real/place-scripted-s0 --predictor runs/pred --json
    python -m experiments.transfer calibration/real/round-scripted-s0 --rows   # and each row as the plan met it
    python -m experiments.transfer calibration/real/* --race 0.75 --race-tie 0.5 --json   # the gate, another race

FOLDERs are published calibrations (`advisor lab publish`), `advisor calibrate` folders (their
records.jsonl, or while they run, every finished run's record.json), or records files. Each
(unit, budget) row of `label_rows` is advised as `advisor recommend` would advise that student
at that budget from that probe (`Policy.decide`: the predictor where the student's measurements
lie on the calibrated data, else the declared fallback; the gate's race where it opens), and
scored three ways: regret against the best set at the budget (points), the same judged on the
row's other seeds (a pick is not scored on the noise it was made on), and for the races, which
read the held-out problems, the pick made on the even problems judged on the odd ones. Overhead
is the share of one run the losing set trains: its mean over every row, and over the rows the
method raced on (what the user whose plan is a race pays). "in tokens" counts the same extra training
in tokens, as a share of the kept set's run (the losing set's tokens an epoch, from the records'
provenance.train_tokens, over the kept set's: D_low's long solutions make a race that keeps D_high
dearer than its share, one that keeps D_low cheaper); a record without them borrows them from the
same set at another seed.

"evaluated at its shares" replays the race as `advisor train` runs it now: each raced run also
evaluates at the rule's stop shares (`RaceRule.shares`), so it stops there, not at the next
evaluation of the records' schedule (twice an epoch on the real rows). The records hold no
evaluation at those shares, so the replay decides there on the evaluations before (less than the
race will see) and charges the share itself.

"gated race, scouted" asks whether the probe already ran the race: where D_low's accuracy gain in
the probe leads D_high's by SCOUT or more (`gap_accuracy_gain`, what a gate's scout reads: `advisor
fit --scout`), it takes D_low without a race, and elsewhere plans as the gated race does. The lead is never taken for D_high, whose
early leads D_low overtakes on the lab's scripted pools ("scouted both ways" takes it, to show what
that costs). "... evaluated at its shares, D_high scouted at T" is the race as `advisor train` runs
it (at its shares) with a scout for D_high too, at a lead of T (`--high-scout`, default 0.5): where
D_high's accuracy gain in the probe leads D_low's by T or more, D_high without a race — a gate input
not shipped, measured to see what a pool where D_high wins costs without it; with `--high-scout-gain G`
only where D_high's own accuracy gain in the probe (`high_accuracy_gain`) is G or more too, so a student
that learned nothing from either set in the probe is left to the race. "... D_low where the
likelihood gap per token ≤ G" reads an input that needs no training: where, ranked by the summed
log-probability, D_low's responses are at least as likely per token under the base as D_high's
(`likelihood_gap_per_token` ≤ G; a D_high of bare answers against worked solutions), it takes D_low
without a race, and elsewhere plans as the same gate without a gap scout does, at its shares
(GAP_SCOUTS; the shipped gate's own scout is −0.25, so that row is the shipped plan, and "... without
the gap scout" is the gate before it). "... and D_low does not trail in the probe" takes D_low by the gap
only where the probe's accuracy gain for D_low is at least D_high's (GAP_LEAD; not shipped): a student
that learns from neither set is left to the gate. "... D_low kept only on a lead beyond Z standard errors"
is the plan whose races hold (`Gate.hold`, HOLD; `advisor fit --race-hold-added`): a race stopped at its
share keeps D_low only where its lead beats Z standard errors of the problems read (the shipped gate holds
at 1, so with it that row is the shipped plan); "... D_low kept on any lead (no hold)" is the same plan
with its races not holding (the gate shipped before the hold).

`--race F` (and `--race-tie T`) judge the shipped gate with its race stopped at F of the budget (and a
tie check at T: there the race stops for D_high unless D_low has led or is gaining, `training.race.levels`)
in place of the race it ships (its wait, lead stop and fast learner's stop dropped): every other part of the plan (members, thresholds, scouts, hold) stays, so the
rows say what a cheaper race costs where the gate opens. Not with `--store`, which keeps the shipped gate's
own judgment.

`--store NAME` also keeps the judgment in the judged predictor (`--predictor`, required: the shipped
one is `--predictor advisor/predictor_data`) as meta.transfer's entry NAME, with the gate it judged
(meta.policy.race): the gated race (evaluated at its shares, and at the schedule's evaluations), the
policy, always-high and always-low over all rows, and their regret per source. `advisor recommend`
quotes it beside a race that gate plans for a student that is not a lab student. The shipped
predictor's entry "real pretrained student" was stored so (docs/results.md, section 8).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.lab import published
from capacity_advisor.advisor.predictor import Policy, label_rows
from capacity_advisor.advisor.predictor.advice import POOL_GAP
from capacity_advisor.advisor.predictor import read_records as read_file
from capacity_advisor.advisor.predictor.evaluate import is_right, judged_on_other_repeats, noise_floor, regret
from capacity_advisor.advisor.predictor.gate import gap_of, judged_on_other_half
from capacity_advisor.advisor.predictor.labels import accuracy_lead, record_option, token_share, unit_of
from capacity_advisor.advisor.predictor.races import race, with_curves
from capacity_advisor.advisor.probe.plan import load_predictor
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import json_object
from capacity_advisor.core.numbers import number
from capacity_advisor.training.race import RaceRule, decide

RACES = (0.2, 0.5, 1.0)
TIE_RACES = ((0.3, 0.75),)  # (tie check, fraction) of the races with a tie check replayed on every pool
SCOUT = 0.2  # chosen on the 906 lab records: the smallest lead at which the scouted plan loses nothing there
AT_SHARES = "gated race (shipped), evaluated at its shares"  # as `advisor train` now races: it stops at its share
PAIRED = ((2, 0.05, 0.5), (2, 0.05, 1.0), (1, 0.05, 1.0))  # (k, margin, fraction) of the paired races replayed


def paired_race(rec_high: dict, rec_low: dict, budget: float, k: int, margin: float, fraction: float,
                half: int | None = 0) -> tuple[str, float] | None:
    """(kept set, share of the budget at which it stopped) of the race `advisor train` runs
    (`training.race.decide`: per-problem paired, stopping once one set has led by more than `margin`
    and 1.96 standard errors at `k` evaluations in a row, else at `fraction`), replayed on two
    records' evaluations up to `budget`, reading the even held-out problems (`half` 0; None: all);
    None where the records kept no per-problem correctness."""
    from types import SimpleNamespace


    def rows(rec):
        out = []
        for e in rec["evals"]:
            c = e.get("correct")
            if e.get("step", 1) == 0 or e["epoch"] > budget + 1e-9:
                continue
            if not isinstance(c, str) or not c:
                return None
            c = c if half is None else c[half::2]
            out.append({"step": e["step"], "epoch": e["epoch"], "accuracy": c.count("1") / len(c),
                        "per_problem": {"correct": [x == "1" for x in c]}})
        return out

    h, lo = rows(rec_high), rows(rec_low)
    if not h or not lo:
        return None
    m = SimpleNamespace(training=SimpleNamespace(max_steps=None, epochs=budget))
    _, stop = decide({"high": h, "low": lo}, RaceRule(fraction=fraction, k=k, margin=margin), m, finished=True)
    return stop["winner"], stop["share"]


def read_records(paths) -> list[dict]:
    """Every record the paths hold (see the module doc), in a fixed order."""

    out = []
    for p in map(Path, paths):
        if p.is_file():
            out += read_file(p)
        elif published.is_published(p) or (p / "records.jsonl").is_file():
            out += published.records(p)
        else:  # an `advisor calibrate` folder still running: its finished runs, each with its unit's seed
            for path in sorted(p.glob("units/*/*/record.json")):  # (units/STUDENT-sSEED/SET/record.json)
                rec = json_object(path, "delete that run's folder and run the calibration again")
                seed = re.search(r"-s(\d+)$", path.parent.parent.name)
                if seed and (rec.get("settings") or {}).get("seed") is None:
                    rec["settings"] = {**(rec.get("settings") or {}), "seed": int(seed.group(1))}
                out.append(rec)
    return out


HIGH_SCOUT = 0.5  # the D_high lead of the "D_high scouted" row (`--high-scout`)
GAP_SCOUTS = (0.0, -0.25, -0.5, -1.0)  # the likelihood gaps per token at or under which the "gap" rows take D_low


GAP_LEAD = -0.25  # the gap of the row that also asks the probe not to show D_low behind
PLAIN = f"{AT_SHARES}, without the gap scout"  # the shipped gate with its gap scout off
HOLD = 1.0  # the standard errors of the row whose race keeps D_low only on a lead beyond them (`Gate.hold`)


def hold_row(z: float) -> str:
    return f"{AT_SHARES}, D_low kept only on a lead beyond {z:g} standard error{'' if z == 1 else 's'}"


NO_HOLD = f"{AT_SHARES}, D_low kept on any lead (no hold)"  # the same plan, its races not holding


def gap_row(g: float) -> str:
    return f"{AT_SHARES}, D_low where the likelihood gap per token ≤ {g:g}"


def gap_lead_row(g: float) -> str:
    return f"{gap_row(g)} and D_low does not trail in the probe"


def gap_scouts(row: dict, g: float) -> bool:
    """Whether the pool's per-token likelihood gap (D_high's mean log-probability per token minus
    D_low's, under the base) is `g` or less on a row ranked by the sum (by the mean it is never
    negative)."""
    return gap_of(row["features"], row["score"]) <= g  # NaN (not ranked by the sum, or unmeasured): never


def with_race(gate, fraction: float, tie: float | None):
    """`gate` with its whole race replaced (`--race F --race-tie T`): stopped at `fraction` of the budget,
    with a tie check at `tie`, and none of its own wait, lead stop or fast learner's stop. InputError where
    the values are no race or the predictor has no gate that opens."""
    RaceRule(fraction=fraction, k=None, tie=tie).check()
    if gate is None:
        raise InputError("--race replaces the race of the predictor's gate, and this predictor has none (refit it with "
                         "`advisor fit`, or leave --race out)")
    if gate.never:
        raise InputError("--race replaces the race of the predictor's gate, and its gate never opens: there is no race "
                         "to replace (leave --race out)")
    return replace(gate, fraction=fraction, tie=tie, wait=None, k=None, patient=False, fast_gain=math.inf,
                   fast_fraction=None)


def judge(records: list[dict], predictor_dir: str | None = None, high_scout: float = HIGH_SCOUT, gate=None,
          high_gain: float | None = None, new_race: tuple[float, float | None] | None = None) -> dict:
    """{method: {"all": summary, "by_source": {source: summary}}, "rows": n} on the records' rows;
    `gate`: this gate in place of the predictor's (`experiments.gate_ties`); `high_gain`: the D_high
    scout's row also needs D_high's accuracy gain in the probe to reach it; `new_race` (fraction, tie): the
    predictor's gate with that race in place of its own (`with_race`), named in the result's `race`."""

    predictor = load_predictor(predictor_dir)
    if new_race is not None:
        gate = with_race(Policy.of(predictor).gate, *new_race)
    policy = Policy.of(predictor) if gate is None else replace(Policy.of(predictor), gate=gate)
    scouting = replace(policy.gate, high_scout=high_scout) if policy.gate else None  # the gate with a D_high scout
    plain = replace(policy, gate=replace(policy.gate, gap_scout=-math.inf)) if policy.gate else policy
    held = replace(policy.gate, hold=HOLD) if policy.gate else None  # the same plan; its races hold
    unheld = replace(policy.gate, hold=0.0) if policy.gate else None  # ... and not (any lead keeps D_low)
    rows = with_curves(label_rows(records), records)
    runs = {}
    for rec in records:  # each unit's runs, for the paired races

        u = unit_of(rec)
        runs.setdefault((u["source"], u["score"], u["student"], u["repeat"]), {})[record_option(rec)] = rec
    picks: dict[str, list[tuple[dict, str, float]]] = {m: [] for m in (
        "always high", "always low", "always mixed", "predictor alone", "policy", "gated race (shipped)",
        "gated race, scouted", "gated race, scouted both ways", AT_SHARES, high_row(high_scout, high_gain),
        PLAIN, *(gap_row(g) for g in GAP_SCOUTS), gap_lead_row(GAP_LEAD), hold_row(HOLD), NO_HOLD,
        *(f"race on every pool, at {f:.0%}" for f in RACES),
        *(f"race on every pool, tie check at {t:.0%}, else at {f:.0%}" for t, f in TIE_RACES))}
    opened, per_row = [], []
    for r in rows:
        d = policy.decide(predictor, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
        c = r["curves"]
        for s in ("high", "low", "mixed"):
            picks[f"always {s}"].append((r, s, 0.0))
        picks["predictor alone"].append((r, d.advice.strategy, 0.0))
        picks["policy"].append((r, d.strategy, 0.0))
        if d.race is not None:  # the gate's race as `advisor train` runs it: its share, wait, lead rule and tie check
            kept, share = policy.gate.replay(r)
            picks["gated race (shipped)"].append((r, kept, share))
            picks[AT_SHARES].append((r, *policy.gate.replay(r, at_shares=True)))
        else:
            picks["gated race (shipped)"].append((r, d.strategy, 0.0))
            picks[AT_SHARES].append((r, d.strategy, 0.0))
        lead = accuracy_lead(r["features"])  # what a gate's scout reads: D_low's accuracy gain in the probe minus D_high's
        picks["gated race, scouted"].append((r, "low", 0.0) if lead >= SCOUT - 1e-9
                                            else picks["gated race (shipped)"][-1])
        picks["gated race, scouted both ways"].append((r, "high", 0.0) if lead <= -SCOUT + 1e-9
                                                      else picks["gated race, scouted"][-1])
        gained = high_gain is None or as_float(r["features"].get("high_accuracy_gain")) >= high_gain
        picks[high_row(high_scout, high_gain)].append(
            (r, "high", 0.0) if d.race is not None and gained and scouting.scouts_high(r["features"])
            else picks[AT_SHARES][-1])
        if d.answered_by != POOL_GAP:  # the gate's own gap scout did not answer: without it, the same plan
            picks[PLAIN].append(picks[AT_SHARES][-1])
        else:
            p = plain.decide(predictor, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
            picks[PLAIN].append((r, *plain.gate.replay(r, at_shares=True)) if p.race is not None
                                else (r, p.strategy, 0.0))
        for g in GAP_SCOUTS:
            picks[gap_row(g)].append((r, "low", 0.0) if gap_scouts(r, g) else picks[PLAIN][-1])
        picks[gap_lead_row(GAP_LEAD)].append((r, "low", 0.0) if gap_scouts(r, GAP_LEAD) and lead >= 0
                                             else picks[PLAIN][-1])
        picks[hold_row(HOLD)].append((r, *held.replay(r, at_shares=True)) if d.race is not None
                                     else picks[AT_SHARES][-1])
        picks[NO_HOLD].append((r, *unheld.replay(r, at_shares=True)) if d.race is not None else picks[AT_SHARES][-1])
        opened.append(d.race is not None)
        kept, share = picks[AT_SHARES][-1][1:]
        per_row.append({"source": r["source"], "repeat": r["repeat"], "budget": r["budget"],
                        "accuracy": dict(r["accuracy"]), "label": r["label"],
                        "p_low": d.advice.probabilities.get("low"), "lead": lead, "plan": d.strategy,
                        "raced": d.race is not None, "kept": kept, "share": share, "regret": 100 * regret(r, kept)})
        for f in RACES:
            picks[f"race on every pool, at {f:.0%}"].append((r, *race(c["high"], c["low"], r["budget"], f)))
        for t, f in TIE_RACES:
            picks[f"race on every pool, tie check at {t:.0%}, else at {f:.0%}"].append(
                (r, *race(c["high"], c["low"], r["budget"], f, tie=t)))
        unit = runs.get((r["source"], r["score"], r["student"], r["repeat"]), {})
        for k, margin, f in PAIRED:
            got = paired_race(unit["high"], unit["low"], r["budget"], k, margin, f) if "high" in unit and "low" in unit \
                else None
            if got is not None:
                picks.setdefault(f"paired race on every pool, lead k {k} / {margin:.0%}, else at {f:.0%}", []).append(
                    (r, *got))
    def cost(r, kept, share):  # the losing set's tokens over the kept set's run, or None where a record lacks them
        return token_share(r.get("tokens") or {}, kept, share)  # (`label_rows` borrows another seed's count)

    floor = noise_floor(rows)
    out = {**({"race": {"fraction": gate.fraction, "tie": gate.tie}} if new_race is not None else {}),  # what replaced it
           "rows": len(rows), "gate_opened": mean(opened) if opened else None, "per_row": per_row,
           "sources": sorted({r["source"] for r in rows}), "students": sorted({str(r["student"]) for r in rows}),
           "methods": {}}
    for name, pairs in {**picks, "noise floor": [(r, c, 0.0) for r, c in floor]}.items():
        out["methods"][name] = {"all": summary(pairs, rows, cost),
                                "by_source": {s: summary([p for p in pairs if p[0]["source"] == s], rows, cost)
                                              for s in out["sources"]}}
    out["label_share"] = {s: mean(r["label"] == s for r in rows) for s in ("high", "low", "mixed")} if rows else {}
    out["winner"] = {s: {"low_ahead": mean(r["accuracy"]["low"] > r["accuracy"]["high"] + 0.01
                                           for r in rows if r["source"] == s)}
                     for s in out["sources"]}
    return out


def summary(pairs, rows, cost=None) -> dict:
    """`cost(row, kept, share)`: the row's extra training in tokens (`token_share`); None: not reported."""

    if not pairs:
        return {"rows": 0}
    tokens = [cost(*p) for p in pairs] if cost is not None else []
    return {"rows": len(pairs), "regret": 100 * mean(regret(r, c) for r, c, _ in pairs),
            "decision_accuracy": mean(is_right(r, c) for r, c, _ in pairs),
            "within_3": mean(regret(r, c) <= 0.03 + 1e-9 for r, c, _ in pairs),
            "overhead": mean(o for *_, o in pairs),
            # what the user whose plan races pays: the mean over the rows it raced on
            "raced": mean(o > 0 for *_, o in pairs),
            "overhead_where_raced": mean([o for *_, o in pairs if o > 0]) if any(o > 0 for *_, o in pairs) else None,
            # the same extra training counted in tokens (None unless every row's records hold their tokens)
            "overhead_tokens": mean(tokens) if tokens and None not in tokens else None,
            "other_seed": judged_on_other_repeats(pairs, rows)["regret"],
            "other_half": judged_on_other_half(pairs)["regret"]}


def markdown(t: dict) -> str:
    def f(v, pct=False):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "—"
        return f"{100 * v:.0f} %" if pct else f"{v:.2f}"

    race = t.get("race")
    lines = [f"{t['rows']} rows (unit x budget), sources: {', '.join(t['sources'])}; the shipped gate opened on "
             f"{f(t['gate_opened'], True)} of them"
             + (f"; its race replaced: stopped at {race['fraction']:.0%} of the budget"
                + (f", tie check at {race['tie']:.0%}" if race.get("tie") is not None else "") if race else ""), "",
             "| method | regret | other seed | other half | within 3 points | extra training | in tokens | raced on | "
             "extra training where raced | " + " | ".join(t["sources"]) + " |", "|---" * (9 + len(t["sources"])) + "|"]
    for name, m in t["methods"].items():
        a = m["all"]
        lines.append(f"| {name} | {f(a.get('regret'))} | {f(a.get('other_seed'))} | {f(a.get('other_half'))} | "
                     f"{f(a.get('within_3'), True)} | {f(a.get('overhead'), True)} | {f(a.get('overhead_tokens'), True)} | "
                     f"{f(a.get('raced'), True)} | "
                     f"{f(a.get('overhead_where_raced'), True)} | "
                     + " | ".join(f(m["by_source"][s].get("regret")) for s in t["sources"]) + " |")
    return "\n".join(lines)


def rows_markdown(t: dict) -> str:
    """Each row as the shipped plan met it (`--rows`): the best accuracy of each set within the budget,
    P(D_low), the probe's D_low lead, the plan (a set, or the gate's race), what it kept and at what
    share of the budget it stopped (races evaluated at their shares), and its regret in points."""
    lines = ["| source | seed | budget | D_high | D_low | D_mixed | best | P(D_low) | probe's D_low lead | plan | kept "
             "| stopped at | regret |", "|---" * 13 + "|"]
    for p in t["per_row"]:
        acc, stop = p["accuracy"], f"{p['share']:.0%}" if p["raced"] else "—"
        lines.append(f"| {p['source']} | {p['repeat']} | {p['budget']:g} | "
                     + " | ".join(f"{acc[o]:.3f}" if o in acc else "—" for o in ("high", "low", "mixed"))
                     + f" | {p['label']} | {p['p_low']:.2f} | {p['lead']:+.2f} | "
                     f"{'race' if p['raced'] else p['plan']} | {p['kept']} | {stop} | {p['regret']:.2f} |")
    return "\n".join(lines)


def high_row(t: float, gain: float | None = None) -> str:
    where = "" if gain is None else f" where D_high's own gain in the probe is {gain:g} or more"
    return f"{AT_SHARES}, D_high scouted at {t:g}{where}"


def as_float(v) -> float:
    """A measured input as a float (NaN where the record lacks it or holds no finite number)."""
    return float(v) if number(v) else math.nan


# what `--store` keeps of a judgment in the predictor's meta.transfer: {stored name: the row of judge's table}
STORED = {"gated race": AT_SHARES, "gated race, at the schedule's evaluations": "gated race (shipped)",
          "policy": "policy", "always high": "always high", "always low": "always low"}
STORED_KEYS = ("rows", "regret", "overhead", "overhead_tokens", "raced", "overhead_where_raced", "other_seed",
               "other_half")


ROOT = Path(__file__).resolve().parents[1]  # the checkout: stored commands name paths from here


def shown_paths(paths) -> list[str]:
    """`paths` as the stored command names them: from the checkout's root (a path outside it by its
    name only: the command then says where the rows came from, not how to read them again)."""
    out = []
    for p in map(Path, paths):
        full = p.resolve()
        out.append(full.relative_to(ROOT).as_posix() if full.is_relative_to(ROOT) else p.name)
    return out


def stored_entry(t: dict, name: str, paths, gate) -> dict:
    """One entry of meta.transfer: what the predictor's advice, with its gate `gate` (meta.policy.race),
    did on rows it was never fitted on (`advisor recommend` quotes it beside a race that gate plans
    for a student like those): the methods of STORED over all rows, and each one's regret per pool source."""
    return {"name": name, "gate": gate, "rows": t["rows"], "students": t["students"], "sources": t["sources"],
            "command": shlex.join(["python", "-m", "experiments.transfer", *shown_paths(paths)]),
            "methods": {k: {key: t["methods"][v]["all"].get(key) for key in STORED_KEYS} for k, v in STORED.items()},
            "by_source": {s: {k: t["methods"][v]["by_source"][s].get("regret") for k, v in STORED.items()}
                          for s in t["sources"]}}


def store(t: dict, name: str, paths, predictor_dir: str | None) -> Path:
    """Keep `t` as meta.transfer's entry `name` in the predictor judged (replacing one of that name)."""
    from capacity_advisor.advisor.predictor import Predictor
    from capacity_advisor.advisor.probe.plan import predictor_root

    folder = Path(str(predictor_root(predictor_dir)))
    pred = Predictor.load(folder)
    meta = pred.meta or {}
    entry = stored_entry(t, name, paths, (meta.get("policy") or {}).get("race"))
    entries = [e for e in meta.get("transfer") or [] if isinstance(e, dict)]
    at = next((i for i, e in enumerate(entries) if e.get("name") == name), None)  # replaced where it stood
    entries = entries[:at] + [entry] + entries[at + 1:] if at is not None else entries + [entry]
    pred.meta = {**meta, "transfer": entries}
    return pred.save(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.transfer", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--predictor", default=None, help="a folder of `advisor fit` (default: the shipped predictor)")
    ap.add_argument("--high-scout", type=float, default=HIGH_SCOUT,
                    help="the probe's D_high lead from which the \"D_high scouted\" row takes D_high without a race")
    ap.add_argument("--high-scout-gain", type=float, default=None, metavar="G",
                    help="the \"D_high scouted\" row takes D_high only where D_high's own accuracy gain in the probe is "
                         "G or more too (e.g. 0.05)")
    ap.add_argument("--race", type=float, default=None, metavar="F",
                    help="judge the shipped gate with its race stopped at F of the budget (0 < F ≤ 1) in place of its own")
    ap.add_argument("--race-tie", type=float, default=None, metavar="T",
                    help="with --race: a tie check at T of the budget (0 < T < F), where the race stops for D_high "
                         "unless D_low has led or is gaining")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--rows", action="store_true",
                    help="also print each row as the shipped plan met it: P(D_low), the probe's lead, the plan, what it "
                         "kept, where it stopped, its regret")
    ap.add_argument("--store", metavar="NAME", default=None,
                    help="also keep the judgment in the judged predictor's meta.transfer under NAME (e.g. \"real "
                         "pretrained student\"), which `advisor recommend` quotes beside a planned race")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.high_scout) and args.high_scout > 0):
        print(f"error: --high-scout {args.high_scout} must be a lead in accuracy above 0, e.g. 0.5", file=sys.stderr)
        return 2
    if args.high_scout_gain is not None and not (math.isfinite(args.high_scout_gain) and -1 <= args.high_scout_gain <= 1):
        print(f"error: --high-scout-gain {args.high_scout_gain} must be an accuracy gain from -1 to 1, e.g. 0.05",
              file=sys.stderr)
        return 2
    if args.race_tie is not None and args.race is None:
        print("error: --race-tie T needs --race F (the share the race stops at without a tie), e.g. --race 0.75 "
              "--race-tie 0.5", file=sys.stderr)
        return 2
    if args.race is not None:
        if args.store is not None:
            print("error: --store keeps the shipped gate's own judgment; drop --race / --race-tie to store it",
                  file=sys.stderr)
            return 2
        try:  # the values before any record is read; the gate they replace in `judge` (`with_race`)
            RaceRule(fraction=args.race, k=None, tie=args.race_tie).check()
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.store is not None:
        from capacity_advisor.advisor.probe.plan import predictor_root
        from capacity_advisor.advisor.recommendation.draws import plain

        if not plain(args.store.strip(), 80):
            print("error: --store NAME must be a short name (1 to 80 letters, digits, spaces and .,:/@+()'-), e.g. "
                  "\"real pretrained student\"", file=sys.stderr)
            return 2
        if args.predictor is None:
            print("error: --store writes into a predictor folder: name it with --predictor (the shipped one: "
                  "--predictor advisor/predictor_data)", file=sys.stderr)
            return 2
        folder = Path(str(predictor_root(args.predictor)))
        if not (folder / "predictor.json").is_file():
            print(f"error: --store: no predictor at {folder} (predictor.json missing): run `advisor fit` or name "
                  "another folder with --predictor", file=sys.stderr)
            return 2
        if not os.access(folder / "predictor.json", os.W_OK) or not os.access(folder, os.W_OK):
            print(f"error: --store: {folder / 'predictor.json'} cannot be written; name a predictor folder you own "
                  "with --predictor", file=sys.stderr)
            return 2
    try:
        t = judge(read_records(args.paths), args.predictor, args.high_scout, high_gain=args.high_scout_gain,
                  new_race=None if args.race is None else (args.race, args.race_tie))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.store is not None:
        if not t["rows"]:
            print("error: --store: the paths hold no rows to judge the predictor on; name published calibrations",
                  file=sys.stderr)
            return 2
        print(f"stored as meta.transfer[{args.store.strip()!r}] in {store(t, args.store.strip(), args.paths, args.predictor)}",
              file=sys.stderr)
    print(json.dumps(t, indent=1) if args.json else markdown(t) + ("\n\n" + rows_markdown(t) if args.rows else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
