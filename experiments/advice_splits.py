"""Which model and which inputs give advice that holds on data of a kind it was not fitted on?

    .venv/bin/python -m experiments.advice_splits calibration/records.jsonl --out runs/advice-splits.json \
        --kinds lightgbm,logistic,curve --features probe,contrast --splits student,source,task,teacher

No stored table is made from it: it compares model kinds and inputs on every split, the question
whose answer docs/results.md section 4 states for the shipped choice (`--markdown` prints its tables).

For every (model kind, input set) and every split, `predictor.cross_validate` holds out one value
of the split at a time (a student, a shape, a pool source, a task family, a teacher) and scores, on
the held-out rows only, the policy (thresholds chosen on each outer fold's training rows by an
inner leave-one-source-out, as `advisor fit` ships it), the predictor alone (argmax), the constant
rules, the fitted size rule and the noise floor. Results are kept in OUT as they land, so a
stopped run resumes; `--markdown` prints the tables of a finished OUT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from capacity_advisor.advisor.predictor import FEATURE_SETS, FITTABLE, SPLITS, cross_validate, folds, label_rows, read_records
from capacity_advisor.core.files import write_json

METHODS = ("policy", "predictor", "always high", "always low", "always mixed", "size rule", "noise floor")


def run(records: Path, out: Path, kinds, feature_sets, splits, members: int, policy_split: str) -> dict:
    done = json.loads(out.read_text()) if out.exists() else {}
    rows = label_rows(read_records(records))
    inner = policy_split if folds(rows, policy_split) else "student"
    for kind in kinds:
        for fs in feature_sets:
            for split in splits:
                key = f"{kind}|{fs}|{split}"
                if key in done or not folds(rows, split):
                    continue
                t0 = time.time()
                cv = cross_validate(rows, split, kind, FEATURE_SETS[fs], n_members=members, policy_split=inner)
                done[key] = {"kind": kind, "features": fs, "split": split, "folds": cv["folds"],
                             "policies": cv["policies"], "seconds": round(time.time() - t0, 1),
                             "methods": {m: {k: cv["methods"][m][k] for k in ("regret", "decision_accuracy", "ci90", "rows")}
                                         for m in METHODS if m in cv["methods"]}}
                write_json(out, done)
                m = done[key]["methods"]
                print(f"{key}: policy {m['policy']['regret']:.2f}, predictor {m['predictor']['regret']:.2f}, "
                      f"always high {m['always high']['regret']:.2f}, size rule {m['size rule']['regret']:.2f}, "
                      f"noise floor {m['noise floor']['regret']:.2f} [{done[key]['seconds']}s]", flush=True)
    return done


def markdown(done: dict) -> str:
    lines = []
    for split in SPLITS:
        entries = [v for v in done.values() if v["split"] == split]
        if not entries:
            continue
        base = entries[0]["methods"]
        lines.append(f"Leave one {split} out ({len(entries[0]['folds'])} folds); regret in points (decision accuracy):\n")
        lines.append("| model | inputs | policy | predictor alone |\n|---|---|---|---|")
        for v in sorted(entries, key=lambda v: v["methods"]["policy"]["regret"]):
            p, q = v["methods"]["policy"], v["methods"]["predictor"]
            lines.append(f"| {v['kind']} | {v['features']} | {p['regret']:.2f} ({100 * p['decision_accuracy']:.0f} %) | "
                         f"{q['regret']:.2f} ({100 * q['decision_accuracy']:.0f} %) |")
        lines.append("\nBaselines: " + ", ".join(
            f"{m} {base[m]['regret']:.2f} ({100 * base[m]['decision_accuracy']:.0f} %)"
            for m in METHODS[2:] if m in base and base[m]["regret"] is not None) + "\n")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kinds", default="lightgbm,logistic,curve")
    ap.add_argument("--features", default="probe,contrast")
    ap.add_argument("--splits", default=",".join(SPLITS))
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--policy-split", default="source")
    ap.add_argument("--markdown", action="store_true", help="print the tables of OUT and stop")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return 0
    kinds, feats, splits = (tuple(x for x in a.split(",") if x) for a in (args.kinds, args.features, args.splits))
    bad = [k for k in kinds if k not in FITTABLE] + [f for f in feats if f not in FEATURE_SETS] + \
        [s for s in splits if s not in SPLITS]
    if bad:
        print(f"error: unknown {', '.join(bad)}: kinds {', '.join(FITTABLE)}; inputs {', '.join(FEATURE_SETS)}; "
              f"splits {', '.join(SPLITS)}", file=sys.stderr)
        return 2
    run(args.records, args.out, kinds, feats, splits, args.members, args.policy_split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
