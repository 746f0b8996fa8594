"""Advice across data draws: which probe inputs move with the seed, and how the flip rate falls with a bigger probe.

    .venv/bin/python -m experiments.probe_noise calibration/teacher calibration/scripted calibration/lab2/* [--json out.json]
    .venv/bin/python -m experiments.probe_noise calibration/lab2/* --averaged-only      # one draw against draws averaged

Tables: docs/results.md section 4, "Advice across data draws" (the first command, with `--json`;
the second for "Draws averaged").

The seeds of one unit (pool source, ranking, student) are other pool draws and data orders of the
same student on the same source. For every predictor input (`--features`, the shipped `contrast`
set by default), the between-seed spread within a unit (the root mean within-unit variance) is
set against the spread across students (the root mean, over pool sources and rankings, of the
variance of the students' seed-averaged values): their ratio is a signal-to-noise ratio, on the
values and on their ranks among all units (what the trees read; robust to a few extreme values).
The inputs with the lowest ratio are the ones that decide advice by the draw rather than the student.

Then the probes are replayed shorter and on fewer held-out problems, as experiments.probe_cost
does (the records at 25 steps on 64 problems are the committed ones), and each setting is
cross-validated leaving one student out, as `advisor fit --cv` does for one model kind (`--kind`,
the thresholds chosen inside each fold by leaving a pool source out): regret and flip rate of the
policy and of the predictor alone, and the spread of P(D_low) across seeds. Settings every folder
holds come first; the longer probes only some folders ran (200 steps on 128 problems in the first
lab's sweeps) are replayed on those folders alone, beside the committed setting on the same folders.

Last, the shipped policy's own advice on the committed records (in-sample: it was fitted on them)
for every seed of each cell, and how many cells' seeds disagree; and the advice read from a unit's
draws averaged (what `recommend --probe-repeats` does) against each draw's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from capacity_advisor.advisor.fit import CHOOSE_BY
from capacity_advisor.advisor.lab.replay import load_calibration, replay
from capacity_advisor.advisor.predictor import (
    FEATURE_SETS, Policy, cross_validate, inputs, label_rows, read_records, seed_advice,
)
from capacity_advisor.advisor.predictor.labels import NOT_MEASURED, _num
from experiments.probe_cost import EVAL_PROBLEMS, STEPS

COMMITTED = (25, 64)  # the probe the committed records and the shipped predictor measure


def _spreads(values: dict[tuple, float]) -> tuple[float, float, int]:
    """(between-seed spread, across-student spread, units with 2+ seeds) of {(source, ranking,
    student, seed): value}: the root mean within-unit variance, and the root mean over sources and
    rankings of the variance of the students' seed means."""
    seeds, students = defaultdict(list), defaultdict(dict)
    for (source, score, student, _), v in values.items():
        seeds[(source, score, student)].append(v)
    for (source, score, student), vs in seeds.items():
        students[(source, score)][student] = float(np.mean(vs))
    within = [np.var(vs, ddof=1) for vs in seeds.values() if len(vs) >= 2]
    across = [np.var(list(m.values()), ddof=1) for m in students.values() if len(m) >= 2]
    if not within or not across:
        return float("nan"), float("nan"), len(within)
    return float(np.sqrt(np.mean(within))), float(np.sqrt(np.mean(across))), len(within)


def signal_to_noise(rows: list[dict], keys) -> list[dict]:
    """Per input: the between-seed spread within a unit, the spread across students and their
    ratio, on the values and on their ranks (the model's trees read only the order of an input,
    and a few extreme values dominate a variance). Noisiest (lowest rank ratio) first; an input no
    record measures has none."""
    units: dict[tuple, dict] = {}
    for r in rows:  # the inputs of a unit do not depend on the budget: one per repeat (seed, build)
        units.setdefault((r["source"], r["score"], r["student"], r["repeat"]), inputs(r["features"]))
    out = []
    for k in keys:
        values = {u: v for u, f in units.items() if np.isfinite(v := _num(f.get(k)))}
        noise, signal, n = _spreads(values)
        order = np.argsort(np.argsort(list(values.values()))) / max(len(values) - 1, 1)
        r_noise, r_signal, _ = _spreads(dict(zip(values, map(float, order))))
        out.append({"input": k, "seed_spread": noise, "student_spread": signal, "snr": _ratio(signal, noise),
                    "rank_snr": _ratio(r_signal, r_noise), "units": n})
    return sorted(out, key=lambda d: (np.isnan(d["rank_snr"]), d["rank_snr"]))


def _ratio(signal: float, noise: float) -> float:
    return signal / noise if noise > 0 else float("nan")


def print_snr(table: list[dict], title: str) -> None:
    print(f"\n{title}\n")
    print("| input | spread across seeds | spread across students | signal-to-noise | on ranks | units with 2+ seeds |")
    print("|---|---|---|---|---|---|")
    for d in table:
        if not d["units"]:
            print(f"| `{d['input']}` | not measured | | | | 0 |")
            continue
        print(f"| `{d['input']}` | {d['seed_spread']:.4g} | {d['student_spread']:.4g} | {d['snr']:.2f} "
              f"| {d['rank_snr']:.2f} | {d['units']} |")


def flip_row(recs: list[dict], kind: str, feats, members: int, steps: int, n_eval: int) -> dict:
    """One replayed setting, leave one student out: regret and flips of the policy and the predictor."""
    methods = cross_validate(label_rows(recs), "student", kind, feats, n_members=members,
                             policy_split=CHOOSE_BY)["methods"]
    row = {"steps": steps, "eval_problems": n_eval, "records": len(recs),
           "cells": methods["predictor"]["flip_cells"], "p_low_spread": methods["predictor"]["p_low_spread"],
           "label_flip_rate": methods["noise floor"]["flip_rate"]}
    for m in ("policy", "predictor"):
        row[m] = {k: methods[m][k] for k in ("regret", "decision_accuracy", "flip_rate")}
    print(f"| {steps} | {n_eval} | {len(recs)} | {row['policy']['regret']:.2f} | {100 * row['policy']['flip_rate']:.1f} % "
          f"| {row['predictor']['regret']:.2f} | {100 * row['predictor']['flip_rate']:.1f} % | {row['p_low_spread']:.3f} "
          f"| {row['cells']} |", flush=True)
    return row


FLIP_HEAD = ("| steps | problems | records | policy regret | policy flip rate | predictor regret | predictor flip rate "
             "| P(D_low) spread | cells with 2+ seeds |\n|---|---|---|---|---|---|---|---|---|")


def flip_tables(folders: list[Path], kind: str, feats, members: int) -> dict:
    records, probes = load_calibration(folders)
    print(f"\nFlip rate leaving one student out, every folder ({', '.join(map(str, folders))}), kind {kind}:\n")
    print(FLIP_HEAD)
    every = [flip_row(recs, kind, feats, members, s, n) for s in STEPS for n in EVAL_PROBLEMS
             if (recs := replay(records, probes, s, n)) is not None]
    longest = max(STEPS), max(EVAL_PROBLEMS)
    keep = [f for f in folders if all(p["settings"]["steps"] >= longest[0] and p["settings"]["eval_problems"] >= longest[1]
                                      for key, p in probes.items() if key[0] == str(f))]
    _label_line(every)
    out = {"every_folder": every, "longer_probes": [], "longer_probe_folders": list(map(str, keep))}
    if keep and len(keep) < len(folders):
        records = [(key, rec) for key, rec in records if Path(key[0]) in keep]
        print(f"\nThe same, on the folders that ran {longest[0]} steps on {longest[1]} problems "
              f"({', '.join(map(str, keep))}):\n")
        print(FLIP_HEAD)
        out["longer_probes"] = [flip_row(replay(records, probes, s, n), kind, feats, members, s, n)
                                for s in STEPS for n in EVAL_PROBLEMS]
        _label_line(out["longer_probes"])
    return out


def _label_line(table: list[dict]) -> None:
    if table:  # the labels come from the full runs: the same whatever the probe
        print(f"\nthe labels themselves (the best set in hindsight) differ between seeds in "
              f"{100 * table[0]['label_flip_rate']:.1f} % of these cells (the noise floor's flip rate)")


def shipped_advice(records_path: Path) -> dict:
    from capacity_advisor.advisor.probe.plan import load_predictor

    pred = load_predictor(None)
    got = seed_advice(pred, Policy.of(pred), label_rows(read_records(records_path)))
    flipped = [c for c in got["cells"] if not c["agree"]]
    print(f"\nThe shipped policy on the committed records (in-sample): {len(flipped)} of {got['flip_cells']} cells with "
          f"2+ seeds get different advice per seed (flip rate {100 * got['flip_rate']:.1f} %); P(D_low) spread "
          f"{got['p_low_spread']:.3f}")
    for c in flipped:
        source, score, student, budget = c["cell"]
        print(f"  {student} on {source} ({score}) at {budget:g} epochs: " + ", ".join(
            f"seed {s}: D_{a} (P(D_low) {c['p_low'][s]:.2f})" for s, a in sorted(c["advice"].items())))
    return {"flip_rate": got["flip_rate"], "flip_cells": got["flip_cells"], "p_low_spread": got["p_low_spread"],
            "flipped": [{"cell": list(c["cell"]), "advice": c["advice"], "p_low": c["p_low"]} for c in flipped]}


def averaged_draws(records_path: Path, kind: str, feats, members: int) -> dict:
    """Every seed of a unit reads the inputs averaged over the unit's seeds (as `recommend
    --probe-repeats` averages its draws), each keeping its own label; held-out regret leaving one
    student out, beside the same fit on each seed's own inputs. The averaged inputs are the same
    for every seed of a cell, so their flip rate is 0 by construction; what is measured is whether
    advice read from the average loses or gains regret. (The committed draws are the seeds of a
    unit: another pool draw as well as another held-out slice and data order.)"""
    import math

    rows = label_rows(read_records(records_path))
    groups = defaultdict(list)
    for r in rows:
        groups[(r["source"], r["score"], r["student"], r["budget"])].append(r)
    averaged = []
    for r in rows:
        peers = groups[(r["source"], r["score"], r["student"], r["budget"])]
        f = {}
        for k, v in r["features"].items():
            vals = [float(x) for p in peers if isinstance(x := p["features"].get(k), (int, float)) and math.isfinite(x)]
            f[k] = sum(vals) / len(vals) if vals else v
        averaged.append({**r, "features": f})
    out = {}
    print(f"\nOne draw against the unit's draws averaged (leave one student out, kind {kind}):\n")
    print("| inputs | policy regret | policy decision accuracy | policy flip rate | predictor regret | predictor flip rate |")
    print("|---|---|---|---|---|---|")
    for name, rs in (("each seed's own", rows), ("averaged over the unit's seeds", averaged)):
        m = cross_validate(rs, "student", kind, feats, n_members=members, policy_split=CHOOSE_BY)["methods"]
        out[name] = {k: {x: m[k][x] for x in ("regret", "decision_accuracy", "flip_rate")} for k in ("policy", "predictor")}
        print(f"| {name} | {m['policy']['regret']:.2f} | {100 * m['policy']['decision_accuracy']:.0f} % "
              f"| {100 * m['policy']['flip_rate']:.1f} % | {m['predictor']['regret']:.2f} "
              f"| {100 * m['predictor']['flip_rate']:.1f} % |", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration", type=Path, nargs="+", help="calibration folders (published ones)")
    ap.add_argument("--records", type=Path, default=Path("calibration/records.jsonl"), help="the committed records")
    ap.add_argument("--features", default="contrast", choices=tuple(FEATURE_SETS))
    ap.add_argument("--kind", default="lightgbm")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--averaged-only", action="store_true",
                    help="only the comparison of one draw against the unit's draws averaged")
    args = ap.parse_args()
    feats = FEATURE_SETS[args.features]
    measured = [k for k in feats if k not in NOT_MEASURED]
    if args.averaged_only:
        result = {"averaged": averaged_draws(args.records, args.kind, feats, args.members)}
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        return 0
    result = {"snr": {}}
    result["snr"]["committed"] = signal_to_noise(label_rows(read_records(args.records)), measured)
    print_snr(result["snr"]["committed"], f"Inputs ({args.features}) of the committed records ({args.records}, "
              f"{COMMITTED[0]} steps on {COMMITTED[1]} problems), noisiest first:")
    records, probes = load_calibration(args.calibration)
    longest = max(STEPS), max(EVAL_PROBLEMS)
    long_recs = [(k, r) for k, r in records if probes[k]["settings"]["steps"] >= longest[0]
                 and probes[k]["settings"]["eval_problems"] >= longest[1]]
    if long_recs:
        for steps, n_eval in (COMMITTED, longest):
            name = f"{steps}x{n_eval}"
            result["snr"][name] = signal_to_noise(label_rows(replay(long_recs, probes, steps, n_eval)), measured)
            print_snr(result["snr"][name], f"The same inputs on the records whose probes ran {longest[0]} steps on "
                      f"{longest[1]} problems ({len(long_recs)} records), replayed at {steps} steps on {n_eval} problems:")
    result["flips"] = flip_tables(list(args.calibration), args.kind, feats, args.members)
    result["shipped"] = shipped_advice(args.records)
    result["averaged"] = averaged_draws(args.records, args.kind, feats, args.members)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
