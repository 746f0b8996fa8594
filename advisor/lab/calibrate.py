"""`advisor calibrate`: measured runs on the embedded lab — the predictor's training data.

    advisor calibrate --out calibration --jobs 2          # the full sweep (about two hours on 2 CPU cores)
    advisor calibrate --out /tmp/cal --quick              # a minute or two: one tiny student, one seed, one epoch

Per task family and seed, the lab teacher (`lab:teacher`, a model) samples `candidates` responses
per problem at temperature 1; the task's exact checker keeps the correct ones (`advisor generate`'s
code path). Then per student (and per ranking: `sum`, the paper's, on every seed; `mean`,
GRAPE's, on `mean_seeds`):

1. every candidate is scored under the base student and D_high / D_low / D_mixed are selected;
2. a probe — the same `probes.run.run_probe` that `advisor recommend` runs, `probe_steps` long so
   that shorter probes can be replayed from its prefix — measures the features;
3. full SFT runs on D_high, D_low and D_mixed (mix 0.5), through `training.sft.run_sft` from a
   manifest exactly as `advisor train` runs it, `epochs` long, evaluated `evals_per_epoch` times
   per epoch on a fixed held-out set (pass@1, repetition, teacher view, teacher NLL, ...).

Each full run's RunRecord, with the probe's features attached, is one line of OUT/records.jsonl.
Everything resumes: pools, scores, probes and runs are skipped when complete and continued from
their last checkpoint when not, so a killed sweep goes on where it stopped. `jobs` units run in
parallel processes of one torch thread each.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from capacity_advisor.models.files import read_jsonl, versions, write_json, write_jsonl
from capacity_advisor.advisor.lab.pool import ON_CPU
from capacity_advisor.advisor.lab.portable import portable
from capacity_advisor.advisor.lab.units import CalibrateConfig, Unit, budget_run_name, run_names, units
from capacity_advisor.probes.recipe import LAB
from capacity_advisor.training.manifest import SETS, schedule_of

EVAL_SEED = 10_000  # the held-out problems are the same for every pool seed

Log = Callable[[str], None]


# ---- pools from the teacher --------------------------------------------------------------------


def _problems(task: str, n: int, seed: int, exclude: set[str] = frozenset()) -> list:
    from capacity_advisor.models.lab import make_problems

    return [p for p in make_problems(task, n + len(exclude), seed=seed) if p.prompt not in exclude][:n]


def teacher_pool(cfg: CalibrateConfig, task: str, seed: int, log: Log) -> tuple[Path, Path]:
    """(pool file, eval-set file) of one task and seed, sampled from the lab teacher (cached)."""
    from capacity_advisor.advisor.generate import GenerateConfig, generate_pool

    folder = Path(cfg.out) / task / "pools"
    pool_path, eval_path = folder / f"s{seed}.jsonl", folder / "eval.jsonl"
    evals = _problems(task, cfg.n_eval, EVAL_SEED)
    todo = [(pool_path, _problems(task, cfg.n_train, seed, {p.prompt for p in evals}), seed)]
    if not eval_path.exists():
        todo.append((folder / "eval-pool.jsonl", evals, EVAL_SEED))
    for path, probs, s in todo:
        if path.exists():
            continue
        t0 = time.time()
        if cfg.teacher == "program":
            from capacity_advisor.models.lab import pool_rows

            write_jsonl(path, pool_rows(task, candidates=min(8, max(4, cfg.candidates)), seed=s, problems=probs))
            continue
        problems_file = folder / f"{path.stem}.problems.jsonl"
        write_jsonl(problems_file, [{"id": f"{task}-{s}-{i}", "problem": p.prompt, "answer": p.answer, "task": task}
                                    for i, p in enumerate(probs)])
        summary = generate_pool(GenerateConfig(
            teacher=cfg.teacher, problems=str(problems_file), out=str(path), n=cfg.candidates, temperature=cfg.temperature,
            top_p=1.0, max_new_tokens=LAB.max_new_tokens, shard_size=500, seed=s, **ON_CPU))
        log(f"{task} pool s{s}: {summary['generations']} teacher samples, {summary['correct']} correct, "
            f"{summary['problems_with_two_correct']} problems rankable [{time.time() - t0:.0f}s]")
    if not eval_path.exists():
        rows = read_jsonl(folder / "eval-pool.jsonl")
        # two correct teacher samples per held-out problem: the teacher NLL references
        write_jsonl(eval_path, [{"prompt": r["problem"], "answer": r["answer"], "task": task,
                                 "references": {"teacher": [g for g, ok in zip(r["generations"], r["correctness"]) if ok][:2]}}
                                for r in rows])
    return pool_path, eval_path


# ---- one unit ----------------------------------------------------------------------------------


def probe_recipe(cfg: CalibrateConfig):
    """The recipe a sweep's probes are run with: the lab's, at the sweep's length and slice."""
    return LAB.with_(steps=cfg.probe_steps, batch_size=cfg.probe_batch, eval_every=min(cfg.probe_eval_every, cfg.probe_steps),
                     eval_problems=cfg.probe_eval_problems, max_new_tokens=cfg.max_new_tokens)


def lab_learning_rate(size: str) -> float:
    """The lab's SFT rate (probes and full runs alike): the probe recipe's rule."""
    from capacity_advisor.models.lab import n_params

    return LAB.learning_rate(f"lab:{size}", n_params(size))[0]


def run_unit(cfg: CalibrateConfig, unit: Unit, pool_path: Path, eval_path: Path) -> str:
    """Score, select, probe and train one unit (resumable); returns a one-line summary."""
    import torch

    from capacity_advisor.advisor.pool import read_pool
    from capacity_advisor.advisor.probe import build_probe_data
    from capacity_advisor.models.loading import load_model
    from capacity_advisor.probes.run import ProbeConfig, run_probe

    torch.set_num_threads(1)
    folder = unit.folder(Path(cfg.out))
    t0 = time.time()
    lm = load_model(unit.model, device="cpu", dtype="float32")
    pool = read_pool(pool_path)
    scores = _scores(lm, pool, folder / "scores.jsonl")
    lr = lab_learning_rate(unit.size)
    pcfg = ProbeConfig.from_recipe(
        probe_recipe(cfg), learning_rate=lr, seed=unit.seed, device="cpu", dtype="float32", teacher=cfg.teacher_model, per_problem=True)
    if not (folder / "probe" / "probe.json").exists():
        split = build_probe_data(pool, scores, pcfg, tokenizer=lm.tokenizer, checker="lab", score=unit.score)
        run_probe(unit.model, split.data, pcfg, folder / "probe", lm=lm)
    probe = json.loads((folder / "probe" / "probe.json").read_text())
    for option in cfg.options:
        train_option(cfg, unit, option, lm, pool, pool_path, scores, eval_path, probe["features"], folder)
    if unit.seed == min(cfg.seeds):
        for budget in cfg.budget_runs:
            for option in SETS:
                train_option(cfg, unit, option, lm, pool, pool_path, scores, eval_path, probe["features"], folder,
                             name=budget_run_name(option, budget), epochs=budget)
    return f"{unit.task} {unit.score} {unit.name}: done [{time.time() - t0:.0f}s]"


def train_option(cfg: CalibrateConfig, unit: Unit, option: str, lm, pool, pool_path: Path, scores: dict, eval_path: Path,
                 features: dict, folder: Path, name: str | None = None, score: str | None = None,
                 rerank: dict | None = None, epochs: float | None = None) -> Path:
    """One full run of the unit's student on one option, as `advisor train` would run its manifest
    (skipped when finished); `name` the run folder, `score` another ranking, `rerank` a
    training.rerank spec, `epochs` another length than the sweep's. Returns the run folder."""
    import io
    import shutil

    from capacity_advisor.advisor.select import SelectConfig, export, select
    from capacity_advisor.probes.recipe import full_run_manifest
    from capacity_advisor.training.sft import run_sft

    name = name or option
    run_dir = folder / name
    if (run_dir / "record.json").exists():
        return run_dir
    strategy, mix, switch = schedule_of(option)
    sel = select(pool, scores, SelectConfig(strategy=strategy, mix=mix, seed=unit.seed, score=score or unit.score))
    export(sel, folder / "data" / f"{name}.jsonl", "trl")
    if rerank:
        ids = {r["id"] for r in sel.rows}
        write_jsonl(folder / "data" / f"{name}.candidates.jsonl",
                    ({"id": p.id, "prompt": p.prompt, "responses": [c.text for c in p.candidates]}
                     for p in pool.problems if p.id in ids))
        rerank = {**rerank, "candidates": f"data/{name}.candidates.jsonl", "score": score or unit.score}
    m = full_run_manifest(
        LAB.with_(max_new_tokens=cfg.max_new_tokens), epochs=epochs or cfg.epochs,
        learning_rate=lab_learning_rate(unit.size), seed=unit.seed,
        eval={"path": os.path.relpath(eval_path, folder), "checker": "lab", "limit": None,
              "teacher": cfg.teacher_model, "base_drift": True, "view_limit": 64, "measure_every": cfg.measure_every},
        training={"batch_size": cfg.batch, "evals_per_epoch": cfg.evals_per_epoch, "save_total_limit": 1,
                  "switch_epoch": switch, "rerank": rerank},
        model={**lm.description, "spec": unit.model}, dataset=f"data/{name}.jsonl", strategy=strategy,
        mix=mix if strategy == "mixed" else 0.0,
        features=features,
        pool={"task": unit.task, "source": pool_path.name, "score": score or unit.score,
              "fingerprint": pool.fingerprint(), "teacher": cfg.teacher, "temperature": cfg.temperature},
        base_dir=str(folder),
    )
    m.to_json(folder / f"{name}.manifest.json")
    run_sft(m, run_dir, device="cpu", dtype="float32", lm=lm, store=False, stream=io.StringIO())
    for ckpt in run_dir.glob("checkpoint-*"):  # the weights are not needed once the record is written
        shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


def _scores(lm, pool, path: Path) -> dict:
    """Every candidate scored under the base student (cached in the unit folder)."""
    from capacity_advisor.models.backends import make_backend

    if not path.exists():
        items = [(p.id, c.k, p.prompt, c.text) for p in pool.problems for c in p.candidates]
        rows = make_backend("hf", lm, token_budget=8192).score([(pr, tx) for _, _, pr, tx in items], max_length=LAB.score_length)
        write_jsonl(path, [{"id": i, "k": k, **r} for (i, k, _, _), r in zip(items, rows)])
    return {(str(r["id"]), int(r["k"])): r for r in read_jsonl(path)}


# ---- the sweep ---------------------------------------------------------------------------------


def run_calibration(cfg: CalibrateConfig, log: Log = print) -> dict:
    """Run or resume the sweep; rebuild OUT/records.jsonl from every finished run."""
    from joblib import Parallel, delayed

    cfg.validate()
    out = Path(cfg.out)
    write_json(out / "config.json", {"stage": "calibrate", "settings": asdict(cfg), "versions": versions()})
    t_all = time.time()
    build_models(cfg.models, cfg.jobs, log)
    pools = {(t, s): teacher_pool(cfg, t, s, log) for t in cfg.tasks for s in sorted(set(cfg.seeds) | set(cfg.mean_seeds))}
    todo = [u for u in units(cfg) if not all((u.folder(out) / s / "record.json").exists() for s in run_names(cfg, u))]
    log(f"{len(todo)} of {len(units(cfg))} units to run, {cfg.jobs} at a time")
    jobs = Parallel(n_jobs=cfg.jobs, backend="loky", return_as="generator_unordered") if cfg.jobs > 1 else None
    calls = [delayed(run_unit)(cfg, u, *pools[(u.task, u.seed)]) for u in todo]
    for line in (jobs(calls) if jobs else (f(*a, **k) for f, a, k in calls)):
        log(line)
    records = collect_records(cfg)
    write_jsonl(out / "records.jsonl", records)
    if cfg.budget_runs:
        write_jsonl(out / "budget-records.jsonl", collect_records(cfg, budget_runs=True))
    return {"records": len(records), "path": str(out / "records.jsonl"), "seconds": round(time.time() - t_all, 1)}


def build_models(names: list[str], jobs: int, log: Log) -> None:
    """Pretrain the lab models `names` that are not built yet, `jobs` at a time, largest first."""
    from joblib import Parallel, delayed

    from capacity_advisor.models.lab.ladder import folder_of, n_params, parse_name, student_path

    todo = sorted((n for n in names if not (folder_of(n) / "build.json").exists()), key=lambda n: -n_params(parse_name(n).name))
    if not todo:
        return
    t0 = time.time()
    log(f"pretraining {len(todo)} lab models ({', '.join(todo)}), {min(jobs, len(todo))} at a time")
    if jobs > 1 and len(todo) > 1:
        Parallel(n_jobs=min(jobs, len(todo)), backend="loky")(delayed(student_path)(n) for n in todo)
    else:
        for n in todo:
            student_path(n)
    log(f"pretrained {len(todo)} lab models [{time.time() - t0:.0f}s]")


def collect_records(cfg: CalibrateConfig, budget_runs: bool = False) -> list[dict]:
    """The RunRecords of every finished run, in a fixed order, with machine paths removed; with
    `budget_runs`, those of the runs of shorter budgets instead (kept apart: they label nothing)."""
    out = Path(cfg.out)
    records = []
    for u in sorted(units(cfg), key=lambda u: (u.task, u.score, cfg.ladder.index(u.size), u.build, u.seed)):
        names = [n for n in run_names(cfg, u) if (n in cfg.options) != budget_runs]
        for strategy in names:
            path = u.folder(out) / strategy / "record.json"
            if path.exists():
                rec = portable(json.loads(path.read_text()), u, cfg.teacher, cfg.temperature)
                # the probe its features were measured with, so `advisor fit` can tell recommend
                rec["settings"].setdefault("probe", probe_recipe(cfg).as_dict())
                records.append(rec)
    return records
