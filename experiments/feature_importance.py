"""Which probe measurements carry the label: permutation importance, one student (or source) held out.

    .venv/bin/python -m experiments.feature_importance calibration/records.jsonl [--features probe+teacher] [--split source]

Tables: docs/results.md section 4 (`--features contrast --split source`) and section 6 (the command
above with `--features probe+teacher --markdown`, on the 200-step records and on calibration/records.jsonl).

For each held-out student (or pool source, task, teacher: `--split`) the predictor's model kind is fitted on the others; then one input at
a time is shuffled among the held-out rows and the increase in mean regret (accuracy points) is
the input's importance. Repeated shuffles are averaged. With `probe+teacher` the teacher-view
movements (the lab teacher's NLL of the student's generations) compete with the other inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from capacity_advisor.advisor.predictor import FEATURE_SETS, label_rows, permutation_importance, read_records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--features", default="probe+teacher", choices=sorted(FEATURE_SETS))
    ap.add_argument("--kind", default="logistic")
    ap.add_argument("--score", default=None, help="Only rows of one ranking arm (sum or mean).")
    ap.add_argument("--split", default="student", choices=("student", "shape", "source", "task", "teacher"))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = label_rows(read_records(args.records))
    if args.score:
        rows = [r for r in rows if r["score"] == args.score]
    table = permutation_importance(rows, args.kind, FEATURE_SETS[args.features], split=args.split)
    if args.markdown:
        print("| input | regret increase when shuffled (points) |\n|---|---|")
        for t in table:
            print(f"| {t['feature']} | {t['regret_increase_points']:+.2f} |")
    else:
        for t in table:
            print(f"{t['feature']:<34} {t['regret_increase_points']:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
