"""The probe's cost-quality curve: held-out regret against what the probe costs.

    .venv/bin/python -m experiments.probe_cost calibration/teacher calibration/scripted --kind lightgbm [--json out.json]
    .venv/bin/python -m experiments.probe_cost calibration/lab2/* --records-at 25,64 --no-table --records-out R.jsonl

Table: docs/results.md section 5 (the first command; `--records-out` replays as `advisor lab replay`).

For every setting of STEPS x EVAL_PROBLEMS that every probe of the folders covers, each unit's
features are replayed as `advisor lab replay` replays them (a prefix of the probe's curve, on the
first N of its held-out problems), the predictor's model kind is refitted leave-one-student-out,
and its mean regret is printed next to the probe's cost as a share of the full 5-epoch run it
advises on (tokens, measured). The cheapest setting within 0.5 points of the best is marked: it is
the one `advisor recommend` defaults to.

`--records-out PATH` writes every record with its features replayed at that chosen setting (or at
`--records-at STEPS,PROBLEMS`), as `advisor lab replay --probe-steps STEPS --probe-eval-problems
PROBLEMS --out PATH` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.lab.replay import load_calibration, replay, replayed
from capacity_advisor.advisor.predictor import PROBE_FEATURES, cross_validate, label_rows
from capacity_advisor.core.files import write_jsonl

STEPS = (25, 50, 100, 200)
EVAL_PROBLEMS = (32, 64, 128)


def probe_cost(probe: dict, steps: int, n_eval: int, epochs: float = 5.0) -> float:
    """Tokens of the replayed probe over the tokens of an `epochs`-epoch full run."""
    total = probe["settings"]["steps"]
    full_eval = probe["settings"]["eval_problems"]
    curves = probe["curves"]
    train = probe["cost"]["probe_train_tokens"] * steps / total
    first = next(iter(curves.values()))[0]
    ev = (first.get("eval_tokens") or 0) + sum(p.get("eval_tokens") or 0 for c in curves.values() for p in c[1:]
                                               if p["step"] <= steps)
    per_epoch = probe["cost"]["full_run_tokens_per_epoch"]
    return (train + ev * n_eval / full_eval) / (per_epoch * epochs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration", type=Path, nargs="+", help="calibration folders (a sweep's or a published one)")
    ap.add_argument("--kind", default="logistic")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--records-out", type=Path, default=None, help="write the records with features at one setting")
    ap.add_argument("--records-at", default=None, help="STEPS,PROBLEMS for --records-out (default: the chosen one)")
    ap.add_argument("--no-table", action="store_true", help="with --records-at: only write the records")
    args = ap.parse_args()
    records, probes = load_calibration(args.calibration)
    table = []
    for steps in STEPS:
        for n_eval in EVAL_PROBLEMS:
            recs = replay(records, probes, steps, n_eval)
            if recs is not None:
                costs = [probe_cost(probes[key], steps, n_eval) for key, _ in records]
                # the predictor alone (argmax): the probe's length is a question about its inputs
                cv = cross_validate(label_rows(recs), "student", args.kind, PROBE_FEATURES, n_members=args.members)
                m = cv["methods"]["predictor"]
                table.append({"steps": steps, "eval_problems": n_eval, "mean_regret_points": m["regret"],
                              "ci90": m["ci90"], "accuracy": m["decision_accuracy"], "cost_share_of_5_epochs": mean(costs)})
                print(f"steps {steps:>4}  eval {n_eval:>4}: regret {m['regret']:.2f} "
                      f"({m['ci90'][0]:.2f}-{m['ci90'][1]:.2f})  accuracy {m['decision_accuracy']:.3f}  "
                      f"cost {100 * mean(costs):.1f}% of a 5-epoch run", flush=True)
    if args.records_at and args.no_table:
        table = []
    best = min((t["mean_regret_points"] for t in table), default=None)
    pick = None
    if table:
        pick = min((t for t in table if t["mean_regret_points"] <= best + 0.5), key=lambda t: t["cost_share_of_5_epochs"])
        print(f"cheapest within 0.5 points of the best ({best:.2f}): {pick['steps']} steps, {pick['eval_problems']} "
              f"problems ({pick['mean_regret_points']:.2f} points, {100 * pick['cost_share_of_5_epochs']:.1f}% of the run)")
    if args.json:
        args.json.write_text(json.dumps({"table": table, "chosen": pick}, indent=1) + "\n")
    if args.records_out:
        steps, n_eval = ((int(x) for x in args.records_at.split(",")) if args.records_at
                         else (pick["steps"], pick["eval_problems"]))
        out = replayed(records, probes, steps, n_eval)
        write_jsonl(args.records_out, out)
        print(f"{len(out)} records with the features of a {steps}-step probe on {n_eval} problems: {args.records_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
