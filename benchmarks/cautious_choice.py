"""Would a cautious choice do better? Held-out regret of "D_high unless the ensemble is sure".

    .venv/bin/python benchmarks/cautious_choice.py calibration/records.jsonl --kind lightgbm

For each split (leave one student / shape / pool source out) the predictor's ensemble is fitted on
the other folds, as `advisor fit` cross-validates it. Then three decision rules are scored on the
held-out rows: the shipped one (the option with the highest mean probability); a cautious one
(that option only when the members' 10th percentile for it lies above their 90th percentile for
D_high, else D_high); and a margin rule (that option only when its mean probability exceeds
D_high's by 0.2). Always-high is printed beside them. The rules are fixed in advance, not tuned on
these rows. This is a measurement, not what `advisor recommend` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from capacity_advisor.advisor.predictor import (
    PROBE_FEATURES,
    Predictor,
    fit_members,
    folds,
    label_rows,
    options_in,
    read_records,
    summarize,
)

SPLITS = ("student", "shape", "task")


def choices(model: Predictor, test: list[dict]) -> dict[str, list[str]]:
    p = model.member_probas(test)  # (members, rows, options)
    mean = p.mean(axis=0)
    hi = model.options.index("high")
    out = {"argmax (shipped)": [], "cautious (interval clear of D_high)": [], "margin 0.2 over D_high": []}
    for i in range(len(test)):
        best = int(mean[i].argmax())
        out["argmax (shipped)"].append(model.options[best])
        clear = best == hi or np.percentile(p[:, i, best], 10) > np.percentile(p[:, i, hi], 90)
        out["cautious (interval clear of D_high)"].append(model.options[best] if clear else "high")
        out["margin 0.2 over D_high"].append(model.options[best] if mean[i, best] - mean[i, hi] > 0.2 else "high")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--kind", default="lightgbm")
    ap.add_argument("--members", type=int, default=8, help="as `advisor fit` cross-validates")
    args = ap.parse_args()
    rows = label_rows(read_records(args.records))
    print("| held out | argmax (shipped) | cautious (interval clear of D_high) | margin 0.2 over D_high | always high |")
    print("|---|---|---|---|---|")
    for split in SPLITS:
        picks: dict[str, list] = {}
        for _, train, test in folds(rows, split):
            model = Predictor(tuple(PROBE_FEATURES), fit_members(train, args.kind, PROBE_FEATURES, args.members, 0),
                              options=options_in(rows))
            for name, cs in choices(model, test).items():
                picks.setdefault(name, []).extend(zip(test, cs))
            picks.setdefault("always high", []).extend((r, "high") for r in test)
        cells = [f"{summarize(pairs)['mean_regret_points']:.2f}" for pairs in picks.values()]
        print(f"| {split} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
