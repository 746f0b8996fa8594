"""Where a calibration unit's run time goes: training steps, evaluation generation, evaluation
scoring, checkpoints — measured side by side in one process.

    .venv/bin/python -m experiments.run_profile UNIT_FOLDER [--options high,low,mixed] [--epochs 5] [--compare] [--json]
    .venv/bin/python -m experiments.run_profile UNIT_FOLDER --options high,low,mixed --epochs 5 --measure-every 4

Tables: docs/lab.md, "Where a source's time goes" (its lines are docs/lab/run-profile.jsonl and
docs/lab/run-profile-measure4.jsonl, read by experiments.source_time).

UNIT_FOLDER is a unit of an `advisor lab calibrate --out` sweep folder (it holds OPTION.manifest.json,
data/OPTION.jsonl and the pools the manifest names), e.g.
runs/sources/modchain-teacher-xl-t1/modchain/sum/xxl-s0. Its runs of `--options` are trained
again into a temporary folder from their manifests, one after another in one process, exactly as
calibration runs a unit (one torch thread, the student loaded once, the teacher kept in memory),
for `--epochs` epochs each (their evaluations at the same points per epoch), with timers around:

- `generation`: `Evaluator.generate` (the student's greedy completions of the held-out prompts);
- `scoring`: `Evaluator.measure` (answer log-likelihood, teacher NLL, and the base student's and
  the teacher's NLL of the generations), split by the model that scores: `student` (answer
  log-likelihood and the NLL of the held-out teacher responses), `base` (base drift) and
  `teacher` (teacher view);
- `checkpoints`: the trainer's checkpoint saves (one per evaluation);
- `training`: the rest (optimizer steps, data loading, logging).

Each part is printed as seconds and as its share of the wall time; the shares are what matter
(the machine is shared), and they are measured in one run. `--compare` trains the runs twice in
one process, first without the evaluator's cache of the fixed models' scores (every generation
scored again by the base student and the teacher at every evaluation), then with it, and prints
the ratios of the wall times, of the scoring parts and of the evaluations' forward tokens, and
whether every evaluation's accuracy agrees. `--measure-every N` trains the runs twice in one
process, first as their manifests say (the scoring measures at every evaluation), then with
`eval.measure_every` N (those measures at every Nth evaluation, step 0, whole epochs and the last
one), and prints the same ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def timed(owner, name: str, spent: dict, label: str):
    """Time every call of owner.name into spent[label] (calls nested in another timed call count once)."""
    original = getattr(owner, name)
    depth = {"n": 0}

    def wrapper(*a, **k):
        depth["n"] += 1
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            depth["n"] -= 1
            if depth["n"] == 0:
                spent[label] += time.perf_counter() - t0
                spent[f"{label}_calls"] += 1

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def scorers(spent: dict):
    """Time the HF backend's scoring calls into spent["scoring_<whose>"]: the student's, the base
    student's or the teacher's, told apart by the evaluator that is measuring."""
    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.training.evaluate import Evaluator

    now: dict = {}
    measure, score_encoded = Evaluator.measure, HFBackend.score_encoded

    def measuring(self, *a, **k):
        now["ev"] = self
        return measure(self, *a, **k)

    def scoring(self, *a, **k):
        ev = now.get("ev")
        whose = "base" if ev is not None and self.lm is ev.base else "teacher" if ev is not None and self.lm is ev.teacher \
            else "student"
        t0 = time.perf_counter()
        try:
            return score_encoded(self, *a, **k)
        finally:
            spent[f"scoring_{whose}"] += time.perf_counter() - t0

    Evaluator.measure, HFBackend.score_encoded = measuring, scoring
    try:
        yield
    finally:
        Evaluator.measure, HFBackend.score_encoded = measure, score_encoded


def profile(unit: Path, options: list[str], epochs: float, cache: bool = True, measure_every: int | None = None) -> dict:
    """Train the unit's runs of `options` one after another in this process (the student loaded
    once, as calibration does), timing the parts of the module doc over all of them."""
    import torch
    from transformers import Trainer

    from capacity_advisor.models.loading import load_model
    from capacity_advisor.training import evaluate
    from capacity_advisor.training.evaluate import Evaluator
    from capacity_advisor.training.manifest import load_manifest
    from capacity_advisor.training.sft import run_sft

    torch.set_num_threads(1)
    manifests = {o: load_manifest(unit / f"{o}.manifest.json") for o in options}
    for m in manifests.values():
        if measure_every is not None:
            m.eval.measure_every = measure_every
    spec = manifests[options[0]].model["spec"]
    lm = load_model(spec, device="cpu", dtype="float32")
    spent: dict = defaultdict(float)
    init = Evaluator.__init__

    def evaluator(self, *a, **k):
        init(self, *a, **k)
        self.cache_views = cache

    evaluate.FIXED_SCORES.clear()
    Evaluator.__init__ = evaluator
    accuracies, eval_tokens, steps, evals, wall = {}, 0, 0, 0, 0.0
    try:
        with tempfile.TemporaryDirectory() as tmp, scorers(spent), timed(Evaluator, "generate", spent, "generation"), \
                timed(Evaluator, "measure", spent, "scoring"), timed(Trainer, "_save_checkpoint", spent, "checkpoints"):
            for option, manifest in manifests.items():
                out = Path(tmp) / option
                t0 = time.perf_counter()
                record = run_sft(manifest, out, device="cpu", dtype="float32", lm=lm, store=False, stream=io.StringIO(),
                                 epochs=epochs)
                wall += time.perf_counter() - t0
                rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
                accuracies[option] = [e.get("accuracy") for e in rows]
                eval_tokens += sum(e.get("eval_tokens") or 0 for e in rows)
                steps, evals = steps + record["settings"]["max_steps"], evals + len(record["evals"])
                shutil.rmtree(out, ignore_errors=True)
    finally:
        Evaluator.__init__ = init
    parts = {k: spent[k] for k in ("generation", "scoring", "checkpoints")}
    parts["training"] = wall - sum(parts.values())
    parts.update({f"scoring_{w}": spent[f"scoring_{w}"] for w in ("student", "base", "teacher")})
    return {"unit": unit.name, "options": options, "model": spec, "epochs": epochs, "cache": cache,
            "measure_every": next(iter(manifests.values())).eval.measure_every,
            "accuracies": accuracies, "eval_tokens": eval_tokens, "steps": steps, "evals": evals, "wall_s": round(wall, 1),
            "parts_s": {k: round(v, 1) for k, v in parts.items()},
            "shares": {k: round(v / wall, 3) for k, v in parts.items()},
            "calls": {k: int(spent[f"{k}_calls"]) for k in ("generation", "scoring", "checkpoints")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("unit", type=Path)
    ap.add_argument("--options", default="high", help="comma-separated runs of the unit, trained in this order in one process")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--compare", action="store_true", help="the run without, then with, the cache of the fixed models' scores")
    ap.add_argument("--measure-every", type=int, default=None,
                    help="the runs as their manifests say, then with eval.measure_every N (the scoring measures thinned)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    options = [o for o in args.options.split(",") if o]
    missing = [o for o in options if not (args.unit / f"{o}.manifest.json").is_file()]
    if missing or not options:
        print(f"error: {args.unit} has no {', '.join(missing) or '(none)'}.manifest.json: name a unit folder of an "
              "`advisor lab calibrate` sweep and runs it holds (high, low, mixed, ...)", file=sys.stderr)
        return 2
    if args.measure_every is not None and (args.measure_every < 1 or args.compare):
        print("error: --measure-every takes a whole number from 1, and not with --compare (one comparison per call)",
              file=sys.stderr)
        return 2
    runs = [profile(args.unit, options, args.epochs, cache=False)] if args.compare else []
    runs.append(profile(args.unit, options, args.epochs))
    if args.measure_every is not None:
        runs.append(profile(args.unit, options, args.epochs, measure_every=args.measure_every))
    out = {"runs": runs}
    if args.compare or args.measure_every is not None:
        before, after = runs
        out["ratios"] = {"wall": round(before["wall_s"] / after["wall_s"], 3),
                         "scoring": round(before["parts_s"]["scoring"] / max(after["parts_s"]["scoring"], 1e-9), 3),
                         "eval_tokens": round(before["eval_tokens"] / max(after["eval_tokens"], 1), 3)}
        out["same_accuracies"] = before["accuracies"] == after["accuracies"]
    if args.json:
        print(json.dumps(out))
        return 0
    for res in runs:
        print(f"{res['model']} {'+'.join(res['options'])}, {res['epochs']:g} epoch(s), cache of the fixed models' scores "
              f"{'on' if res['cache'] else 'off'}, scoring measures every {res['measure_every']} evaluation(s): "
              f"{res['steps']} steps, {res['evals']} evaluations, {res['wall_s']} s")
        for k, v in res["parts_s"].items():
            name = "  " + k[len("scoring_"):] if k.startswith("scoring_") else k
            print(f"  {name:<12} {v:8.1f} s  {100 * res['shares'][k]:5.1f} %")
    if args.compare or args.measure_every is not None:
        r = out["ratios"]
        what = "without / with the cache" if args.compare else f"every evaluation / every {args.measure_every}"
        print(f"{what}: wall {r['wall']:.2f}x, scoring {r['scoring']:.2f}x, forward tokens of the "
              f"evaluations {r['eval_tokens']:.2f}x; accuracies at every evaluation "
              f"{'the same' if out['same_accuracies'] else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
