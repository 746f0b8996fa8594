"""The options beyond D_high / D_low, measured in the lab against them at the same budget.

    .venv/bin/python -m experiments.lab_options --calibration CAL --out lab-options --sizes xs,m,xl
    .venv/bin/python -m experiments.lab_options --calibration CAL --out lab-options --report   # tables only

Tables: docs/lab/options/results.md and docs/results.md section 7 (`--calibration runs/cal-teacher
--out runs/lab-options --sizes xs,s,m,l,xl,xxl`).

CAL is a finished `advisor lab calibrate` folder (its pools, and per unit the base student's probe
and the high / low / mixed runs). For each named student of one task and seed, every option
below is one more full run with the calibration's settings (same epochs, rate, batch, held-out
set, evaluations), through the same `advisor.calibration.run.full_run` the sweep uses:

- schedules: D_mixed with 25 % and 75 % low responses, and a curriculum (D_high, then D_low from
  epoch E);
- re-ranking: D_high (and D_low) re-chosen under the training weights at epochs 2 and 4
  (`training.rerank`), its scoring tokens counted;
- compute-responsive problems: D_high on only the problems the base student fails with `short`
  new tokens and solves with `long` (`advisor score --compute-budgets`), and on only the solved
  ones, for comparison;
- rankings: D_high and D_low chosen by the mean log-probability, the step-local score (LALP,
  window 8 tokens) and the rank-surprisal ratio, beside the summed log-probability.

Each option is judged as the predictor's labels are: its best held-out accuracy up to the budget
(epochs), against the best of D_high / D_low and against D_mixed 0.5. Everything resumes; the
table is printed and written as OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from capacity_advisor.advisor.predictor import best_up_to
from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.core.files import write_json

BUDGETS = (1, 2, 3, 5)
SCHEDULES = ("mixed@0.25", "mixed@0.75", "curriculum@2")
RANKINGS = ("mean", "local", "rsr")
RERANK_EPOCHS = [2, 4]
LOCAL_WINDOW = 8


def run_size(cal: Path, out: Path, task: str, size: str, seed: int, short: int, long: int, log) -> None:
    from dataclasses import replace

    import torch

    from capacity_advisor.advisor.calibration.run import full_run
    from capacity_advisor.advisor.calibration.unit import Run
    from capacity_advisor.advisor.scoring.compute import ComputeConfig, keep_problems, measure
    from capacity_advisor.advisor.calibration.sweep import lab_calibration, lab_unit
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig, Cell
    from capacity_advisor.advisor.pools.read import read_pool
    from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool
    from capacity_advisor.models.backends import make_backend
    from capacity_advisor.core.errors import InputError
    from capacity_advisor.core.files import write_jsonl
    from capacity_advisor.models.loading import load_model

    torch.set_num_threads(1)
    cfg = CalibrateConfig.from_folder(cal)
    cell = Cell(task, "sum", size, seed)
    base = cell.folder(cal)
    probe = base / "probe" / "probe.json"
    if not probe.exists():
        raise SystemExit(f"error: {probe} is missing: run `advisor lab calibrate` for {task} {size} seed {seed} first")
    folder = out / task / "sum" / cell.name
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    lm = load_model(f"lab:{size}", device="cpu", dtype="float32")
    spec = replace(lab_unit(cfg, cell), folder=folder)  # the unit's student, pool and held-out set; its runs go here
    pool = read_pool(spec.pool.path)
    if not (folder / "score" / "scores.jsonl").exists():
        score_pool(pool, ScoreConfig(model=f"lab:{size}", device="cpu", dtype="float32", score_length=96, token_budget=8192,
                                     local_window=LOCAL_WINDOW), out_dir=folder / "score", lm=lm)
    scores = {(str(r["id"]), int(r["k"])): r for r in read_jsonl(folder / "score" / "scores.jsonl")}
    compute_path = folder / "score" / "compute.jsonl"
    if not compute_path.exists():
        rows = measure(make_backend("hf", lm, token_budget=8192), pool, ComputeConfig(short=short, long=long), "lab")
        write_jsonl(compute_path, rows)
    features = json.loads(probe.read_text())["features"]
    from capacity_advisor.training.manifest import schedule_of

    runs = [(o, o, None, None, pool) for o in SCHEDULES if (schedule_of(o)[2] or 0) < cfg.epochs]
    rerank_epochs = [e for e in RERANK_EPOCHS if e <= cfg.epochs]
    runs += [(f"{s}+rerank", s, None, {"epochs": rerank_epochs}, pool) for s in ("high", "low") if rerank_epochs]
    for c in ("responsive", "solved"):
        try:
            runs.append((f"high+{c}", "high", None, None, keep_problems(pool, compute_path, c)))
        except InputError as e:  # a student that solves no problem with the short budget has no "solved" class
            log(f"{task} {size}-s{seed} high+{c}: skipped ({e})")
    runs += [(f"{r}-{s}", s, r, None, pool) for r in RANKINGS for s in ("high", "low")]
    for name, option, score, rerank, p in runs:
        if (folder / name / "record.json").exists():
            continue
        t1 = time.time()
        full_run(spec, lab_calibration(cfg), Run(name, option, ranking=score, rerank=rerank), lm, p, scores, features,
                 p.fingerprint())
        log(f"{task} {size}-s{seed} {name}: [{time.time() - t1:.0f}s]")
    log(f"{task} {size}-s{seed}: all options done [{time.time() - t0:.0f}s]")


def _record(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def budgets(runs: dict) -> tuple:
    horizon = min(max(e["epoch"] for e in r["evals"]) for r in runs.values())
    return tuple(b for b in BUDGETS if b <= horizon + 1e-9)


def collect(cal: Path, out: Path) -> dict:
    """Per (task, size, seed): each option's best accuracy up to every budget, and its training tokens."""
    from capacity_advisor.models.lab.ladder import LADDER

    order = {name: i for i, name in enumerate(LADDER)}
    results = {}
    for folder in sorted(out.glob("*/sum/*-s*"), key=lambda f: (f.parts[-3], order.get(f.name.rsplit("-s", 1)[0], 99), f.name)):
        task, name = folder.parts[-3], folder.name
        size, seed = name.rsplit("-s", 1)
        runs = {}
        for s in ("high", "low", "mixed"):
            rec = _record(cal / task / "sum" / name / s / "record.json")
            if rec:
                runs[s] = rec
        for d in sorted(p for p in folder.iterdir() if (p / "record.json").exists()):
            runs[d.name] = _record(d / "record.json")
        if "high" not in runs or "low" not in runs:
            continue
        compute = read_jsonl(folder / "score" / "compute.jsonl") if (folder / "score" / "compute.jsonl").exists() else []
        classes = {c: sum(r["class"] == c for r in compute) for c in ("solved", "responsive", "unsolved")}
        results[f"{task}/{name}"] = {
            "task": task, "size": size, "seed": int(seed), "problem_classes": classes,
            "n_params": (runs["high"].get("model") or {}).get("n_params"),
            "options": {o: {"accuracy": {str(b): best_up_to(r["evals"], b) for b in budgets(runs)},
                            "problems": r.get("n_train"),
                            "train_tokens": (r.get("provenance") or {}).get("train_tokens", r.get("train_tokens")),
                            "rerank_tokens": (r.get("provenance") or {}).get("rerank_tokens")}
                        for o, r in runs.items()},
        }
    return results


def markdown(results: dict) -> str:
    lines = []
    for res in results.values():
        opts = res["options"]
        bs = list(opts["high"]["accuracy"])
        head = ["option", *[f"{b} ep" for b in bs], *[f"Δ vs best(high,low) @{b}" for b in bs], "problems",
                "tokens (train + rerank scoring)"]
        lines += [(f"\n**{res['task']}, lab:{res['size']}** ({res['n_params']:,} parameters, seed {res['seed']}; "
                  f"problem classes under the base student: {res['problem_classes']})\n"),
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        best = {b: max(opts["high"]["accuracy"][b], opts["low"]["accuracy"][b]) for b in bs}
        for o, v in opts.items():
            acc = [v["accuracy"][b] for b in bs]
            delta = [v["accuracy"][b] - best[b] for b in bs]
            tokens, extra = v["train_tokens"], v["rerank_tokens"] or 0
            # a run resumed after a kill counts only the tokens of its last process: not shown
            spent = "— (resumed)" if tokens is None else f"{tokens:,}" + (f" + {extra:,}" if extra else "")
            lines.append("| " + " | ".join([o, *[f"{a:.3f}" for a in acc], *[f"{d:+.3f}" for d in delta],
                                            str(v["problems"]), spent]) + " |")
    return "\n".join(lines) + "\n"


def summary(results: dict) -> str:
    """Per option, over every budget: mean gain over best(high, low) per student and overall, over
    mixed 0.5, and how many (student, budget) cells it beats best(high, low) in by more than 1 point."""
    rows: dict[str, list[tuple[str, float, float]]] = {}
    sizes = []
    for res in results.values():
        opts, size = res["options"], res["size"]
        sizes.append(size)
        for b in opts["high"]["accuracy"]:
            best = max(opts["high"]["accuracy"][b], opts["low"]["accuracy"][b])
            mixed = opts.get("mixed", {}).get("accuracy", {}).get(b)
            for o, v in opts.items():
                a = v["accuracy"][b]
                rows.setdefault(o, []).append((size, a - best, a - mixed if mixed is not None else float("nan")))
    head = ["option", *[f"{s}" for s in sizes], "all: Δ vs best(high,low)", "all: Δ vs mixed 0.5",
            "cells won by > 1 pt", "cells"]
    lines = ["Mean Δ in pass@1 points over budgets 1, 2, 3 and 5 epochs; per student, against best(high, low):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o, v in sorted(rows.items(), key=lambda kv: -sum(d for _, d, _ in kv[1]) / len(kv[1])):
        per = []
        for size in sizes:
            d = [x for s, x, _ in v if s == size]
            per.append(f"{100 * sum(d) / len(d):+.1f}" if d else "—")
        n = len(v)
        lines.append(f"| {o} | " + " | ".join(per) + f" | {100 * sum(d for _, d, _ in v) / n:+.2f} | "
                     f"{100 * sum(m for _, _, m in v) / n:+.2f} | {sum(d > 0.01 for _, d, _ in v)} | {n} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", type=Path, required=True, help="a finished `advisor lab calibrate` folder")
    ap.add_argument("--out", type=Path, default=Path("lab-options"))
    ap.add_argument("--task", default="modchain")
    ap.add_argument("--sizes", default="xs,m,xl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compute-budgets", default="10,48", help="SHORT,LONG new tokens for the responsive split")
    ap.add_argument("--report", action="store_true", help="only collect and print the tables")
    args = ap.parse_args()
    short, long = (int(x) for x in args.compute_budgets.split(","))
    if not args.report:
        for size in args.sizes.split(","):
            run_size(args.calibration, args.out, args.task, size, args.seed, short, long, lambda s: print(s, flush=True))
    results = collect(args.calibration, args.out)
    write_json(args.out / "results.json", results)
    text = summary(results) + markdown(results)
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
