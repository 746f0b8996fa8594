"""The predictor's held-out tables as Markdown, from the predictor folder `advisor fit` wrote.

    .venv/bin/python benchmarks/cv_tables.py advisor/predictor_data

One table per split (leave one student / shape / task out): per method, accuracy (a choice within
the tie margin of the best counts as right), mean regret in accuracy points with its bootstrap 90 %
interval over held-out groups, and the regret per ranking arm. The numbers are the ones `advisor
fit` measured and stored in the predictor (`meta.cv`), not recomputed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capacity_advisor.advisor.predictor import Predictor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictor", type=Path)
    args = ap.parse_args()
    p = Predictor.load(args.predictor)
    meta = p.meta
    print(f"Fitted on {meta['records']} records: {meta['rows']} (student, pool, seed, ranking, budget) rows, "
          f"labels {meta['labels']}, near-ties {meta['ties']}; chosen kind: {p.kind} ({len(p.members)} members).\n")
    names = {"student": "student", "shape": "shape (deep-narrow or shallow-wide students held out)", "task": "pool source"}
    for split, cv in meta["cv"].items():
        methods = cv["methods"]
        arms = sorted({k[4:] for row in methods.values() for k in row if k.startswith("arm_")})
        print(f"Leave one {names.get(split, split)} out ({', '.join(map(str, cv['folds']))}):\n")
        head = ["method", "accuracy", "mean regret (points)", "90 % interval", *[f"regret, {a} arm" for a in arms]]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for name, row in sorted(methods.items(), key=lambda kv: kv[1]["mean_regret_points"]):
            mark = f"**{name}** (shipped kind)" if name == p.kind else name
            cells = [mark, f"{row['accuracy']:.3f}", f"{row['mean_regret_points']:.2f}",
                     f"{row['ci90'][0]:.2f}–{row['ci90'][1]:.2f}"]
            cells += [f"{row[f'arm_{a}']['mean_regret_points']:.2f}" if f"arm_{a}" in row else "—" for a in arms]
            print("| " + " | ".join(cells) + " |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
