"""Do labels read from the first B epochs of a 5-epoch run match runs of B epochs?

    .venv/bin/python -m experiments.budget_labels calibration/lab2/modchain-program calibration/lab2/modchain-teacher-xl-t1

Table: docs/results.md section 4, "Labels against what the user launches" (the first command).

The predictor's label for a budget B < 5 is the best set by its best checkpoint within the first B
epochs of a 5-epoch cosine run. `advisor recommend --budget B` writes a manifest that trains B
epochs on its own cosine schedule, which decays sooner. Sweeps run with `--budget-runs` train each
set of the first seed as such runs too (the budget records); this compares, per unit and
budget, the two labels: how often they agree, how far each set's accuracy moves, and the regret a
user of a B-epoch run pays when the label of the truncated 5-epoch run is followed instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.lab.published import records
from capacity_advisor.advisor.predictor import label_rows, regret


def compare(folders: list[Path], tie_margin: float = 0.01) -> dict:
    full, short = [], defaultdict(list)
    for folder in folders:
        full += records(folder)
        for rec in records(folder, budget=True):
            short[float(rec["settings"]["training"]["epochs"])].append(rec)
    by_full = {(r["unit"], r["budget"]): r for r in label_rows(full, tie_margin=tie_margin)}
    pairs = []
    for budget, recs in sorted(short.items()):
        for r in label_rows(recs, budgets=(budget,), tie_margin=tie_margin):
            f = by_full.get((r["unit"], budget))
            if f is not None:
                pairs.append((budget, f, r))
    out = {"rows": len(pairs), "by_budget": {}}
    for budget in sorted({b for b, _, _ in pairs}):
        sub = [(f, r) for b, f, r in pairs if b == budget]
        out["by_budget"][f"{budget:g}"] = {
            "rows": len(sub),
            "labels_agree": mean(f["label"] == r["label"] for f, r in sub),
            # regret on the B-epoch runs of following the truncated run's label, in points
            "regret_of_truncated_label": 100 * mean(regret(r, f["label"]) for f, r in sub),
            "mean_abs_accuracy_shift": {s: 100 * mean(abs(f["accuracy"][s] - r["accuracy"][s]) for f, r in sub)
                                        for s in sub[0][1]["accuracy"]},
            "mean_accuracy_shift": {s: 100 * mean(r["accuracy"][s] - f["accuracy"][s] for f, r in sub)
                                    for s in sub[0][1]["accuracy"]},
            "labels": [{"unit": r["unit"], "truncated": f["label"], "own_schedule": r["label"]} for f, r in sub],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out = compare(args.folders)
    print("| budget | rows | labels agree | regret of the truncated label (points) | accuracy shift B-epoch − truncated, points (high / low / mixed) |")
    print("|---|---|---|---|---|")
    for b, t in out["by_budget"].items():
        shift = " / ".join(f"{t['mean_accuracy_shift'].get(s, float('nan')):+.1f}" for s in ("high", "low", "mixed"))
        print(f"| {b} | {t['rows']} | {100 * t['labels_agree']:.0f} % | {t['regret_of_truncated_label']:.2f} | {shift} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
