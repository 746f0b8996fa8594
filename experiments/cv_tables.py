"""The predictor's held-out tables as Markdown, from the predictor folder `advisor fit` wrote.

    .venv/bin/python -m experiments.cv_tables advisor/predictor_data

Tables: docs/results.md section 4, the shipped predictor's held-out tables (the command above).

One table per split (leave one student / shape / pool source / task / teacher out): per method —
the policy `advisor recommend` ships, the predictor alone (its argmax), the constant rules, the
fitted size rule and the noise floor — the mean regret in accuracy points with its bootstrap 90 %
interval over units, the decision accuracy (a choice within 1 point of the best set), and the
regret per ranking arm; and, where the table measured them, the flip rate (the share of
(student, source, ranking, budget) cells whose seeds got different advice; 0 by construction for
the constant rules and the size rule) and the spread of P(D_low) across a cell's seeds. The numbers are the ones `advisor fit` measured and stored in the
predictor (`meta.cv`), not recomputed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capacity_advisor.advisor.predictor import Predictor

NAMES = {"student": "student", "shape": "shape (deep-narrow or shallow-wide students held out)", "source": "pool source",
         "task": "task family", "teacher": "teacher"}
ORDER = ("policy", "predictor", "always high", "always low", "always mixed", "size rule", "noise floor")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictor", type=Path)
    args = ap.parse_args()
    p = Predictor.load(args.predictor)
    meta = p.meta
    pol = meta.get("policy") or {}
    print(f"Fitted on {meta['records']} records: {meta['rows']} (unit, budget) rows, labels {meta['labels']}, "
          f"near-ties {meta['ties']}; kind {p.kind} ({len(p.members)} members, inputs `{meta.get('feature_set')}`); "
          f"policy: the predictor answers within {pol.get('max_distance')}x the typical distance, margin "
          f"{pol.get('margin')}, range check {'on' if pol.get('use_range') else 'off'} ({pol.get('chosen_by')}).\n")
    for split, cv in meta["cv"].items():
        methods = cv["methods"]
        arms = sorted({a for row in methods.values() for a in row.get("arms", {})})
        print(f"Leave one {NAMES.get(split, split)} out ({len(cv['folds'])} folds: {', '.join(map(str, cv['folds']))}):\n")
        seeds = any("flip_rate" in row for row in methods.values())  # tables stored before have no flip rate
        head = ["method", "regret (points)", "90 % interval", "decision accuracy",
                *(["flip rate", "P(D_low) spread"] if seeds else []), *[f"regret, {a} arm" for a in arms]]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for name in [m for m in ORDER if m in methods]:
            row = methods[name]
            if row["regret"] is None:
                continue
            mark = f"**{name}** (shipped)" if name == "policy" else name
            cells = [mark, f"{row['regret']:.2f}", f"{row['ci90'][0]:.2f}–{row['ci90'][1]:.2f}",
                     f"{100 * row['decision_accuracy']:.0f} %"]
            if seeds:
                cells += [_pct(row.get("flip_rate")), "—" if row.get("p_low_spread") is None else f"{row['p_low_spread']:.3f}"]
            cells += [f"{row['arms'][a]['regret']:.2f}" if a in row.get("arms", {}) else "—" for a in arms]
            print("| " + " | ".join(cells) + " |")
        print()
    return 0


def _pct(share) -> str:
    return "—" if share is None else f"{100 * share:.1f} %"


if __name__ == "__main__":
    sys.exit(main())
