"""The probe's cost-quality curve: held-out regret against what the probe costs.

    .venv/bin/python -m experiments.probe_cost calibration/teacher calibration/scripted --kind lightgbm [--json out.json]
    .venv/bin/python -m experiments.probe_cost calibration/lab2/* --records-at 25,64 --no-table --records-out R.jsonl

Table: docs/results.md section 5 (the first command; `--records-out` replays as `advisor lab replay`).

Calibration probes run `probe_steps` (200 in the first lab's sweeps, 50 in the pool-source sweep) steps with a fixed warm-up and a constant rate after
it, so a probe of 25, 50 or 100 steps is exactly the prefix of that curve; and they keep every
held-out problem's result, so an evaluation on fewer problems is replayed from the first N of
them (the teacher-NLL and drift columns stay at the full slice: they are cheap scoring passes).
For every (steps, eval problems) setting this recomputes each unit's features, refits the
predictor's model kind leave-one-student-out, and prints its mean regret next to the probe's
cost as a share of the full 5-epoch run it advises on (tokens, measured). The cheapest setting
within 0.5 points of the best is marked: it is the one `advisor recommend` defaults to.

`--records-out PATH` writes every record with its features replayed at that chosen setting (or at
`--records-at STEPS,PROBLEMS`): the records the shipped predictor is fitted on, so that its inputs
are measured as `advisor recommend`'s default probe measures them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from statistics import mean


from capacity_advisor.advisor.lab.units import Unit
from capacity_advisor.advisor.predictor import PROBE_FEATURES, cross_validate, label_rows, read_records
from capacity_advisor.models.files import finite, write_jsonl
from capacity_advisor.probes.recipe import MEASURING
from capacity_advisor.probes.run import features, truncate

STEPS = (25, 50, 100, 200)
EVAL_PROBLEMS = (32, 64, 128)


def replay_curves(curves: dict, steps: int, n_eval: int) -> dict:
    """The curves a probe of `steps` steps evaluated on the first `n_eval` held-out problems would have measured."""
    out = {}
    for s, c in truncate(curves, steps).items():
        rows = []
        for p in c:
            p = dict(p)
            per = p.get("per_problem") or {}
            if per.get("correct") is not None:
                p["accuracy"] = mean(per["correct"][:n_eval])
            if per.get("answered") is not None:
                p["answer_rate"] = mean(per["answered"][:n_eval])
            if per.get("repetitive") is not None:
                p["repetition_rate"] = mean(per["repetitive"][:n_eval])
            if per.get("answer_logprob"):
                p["answer_logprob"] = mean(per["answer_logprob"][:n_eval])
            rows.append(p)
        out[s] = rows
    return out


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


def load_calibration(folders) -> tuple[list[tuple[tuple, dict]], dict[tuple, dict]]:
    """([(unit key, record)], {unit key: its probe}) from calibration folders; the key is the
    folder, task, ranking, student, seed and build."""
    records, probes = [], {}
    for folder in map(Path, folders):
        for rec in read_records(folder / "records.jsonl"):
            u = rec["unit"]
            key = (str(folder), u["task"], u["score"], u["size"], u["seed"], u.get("build", 0))
            records.append((key, rec))
            if key in probes:
                continue
            unit = Unit(u["task"], u["score"], u["size"], u["seed"], u.get("build", 0))
            path = unit.folder(folder) / "probe" / "probe.json"
            # a sweep folder holds probe.json; a published one (benchmarks/publish_calibration.py) its gzip
            probes[key] = json.loads(path.read_text() if path.exists() else gzip.decompress(
                path.with_suffix(".json.gz").read_bytes()))
    return records, probes


def replay(records, probes, steps: int, n_eval: int) -> list[dict] | None:
    """Every record with the features a probe of `steps` steps on `n_eval` problems would have
    measured; None where some probe ran fewer steps or kept fewer problems."""
    out = []
    for key, rec in records:
        probe = probes[key]
        if steps > probe["settings"]["steps"] or n_eval > probe["settings"]["eval_problems"]:
            return None
        out.append({**rec, "features": features(replay_curves(probe["curves"], steps, n_eval), probe["context"])})
    return out


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
        out = []
        for key, rec in records:
            probe = probes[key]
            # the recipe the replayed features stand for: the probe's own settings, shortened
            recipe = {"kind": "lab", **{k: probe["settings"][k] for k in MEASURING if k in probe["settings"]},
                      "steps": steps, "eval_problems": n_eval}
            recipe["eval_every"] = min(recipe.get("eval_every", steps), steps)
            settings = {**rec.get("settings", {}), "probe": recipe,
                        "probe_replayed_from": (rec.get("settings") or {}).get("probe")}
            out.append(finite({**rec, "settings": settings,
                        "features": features(replay_curves(probe["curves"], steps, n_eval), probe["context"])}))
        write_jsonl(args.records_out, out)
        print(f"{len(out)} records with the features of a {steps}-step probe on {n_eval} problems: {args.records_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
