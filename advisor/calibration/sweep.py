"""`advisor lab calibrate`: measured runs on the embedded lab — the predictor's training data.

    advisor lab calibrate --out runs/cal --jobs 2             # the full sweep (about two hours on 2 CPU cores)
    advisor lab calibrate --out /tmp/cal --quick              # a minute or two: one tiny student, one seed, one epoch

Per task family and seed, the lab teacher (`lab:teacher`, a model) samples `candidates` responses
per problem at temperature 1; the task's exact checker keeps the correct ones (`advisor generate`'s
code path). Then per student (and per ranking: `sum`, the paper's, on every seed; `mean`,
GRAPE's, on `mean_seeds`), the calibration protocol (`calibration.run`) runs the unit:

1. every candidate is scored under the base student and D_high / D_low / D_mixed are selected;
2. a probe — the one `advisor recommend` runs, `probe_steps` long so that shorter probes can be
   replayed from its prefix — measures the features;
3. full SFT runs on D_high, D_low and D_mixed (mix 0.5), from a manifest exactly as `advisor
   train` runs it, `epochs` long, evaluated `evals_per_epoch` times per epoch on a fixed held-out
   set (pass@1, repetition, teacher view, teacher NLL, ...).

Each full run's RunRecord, with the probe's features attached, is one line of OUT/records.jsonl.
Everything resumes: pools, scores, probes and runs are skipped when complete and continued from
their last checkpoint when not, so a killed sweep goes on where it stopped. `jobs` units run in
parallel processes of one torch thread each.
"""

from __future__ import annotations

import json
import time
from dataclasses import MISSING, asdict, fields, replace
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.calibration.grid import CalibrateConfig, Cell, cells, run_names, unit_runs
from capacity_advisor.advisor.calibration.run import collect, run_unit
from capacity_advisor.advisor.calibration.unit import Calibration, EVAL_SEED, Run, Unit, UnitPool
from capacity_advisor.advisor.lab.student import ON_CPU
from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
from capacity_advisor.advisor.pools.lab import pool_rows
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    check_writable_dir, folder_lock, json_object, unclaimed_files, versions, write_json, write_jsonl,
)
from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.models.lab.ladder import RECIPE_VERSION, folder_of, n_params, parse_name, student_path
from capacity_advisor.models.lab.tasks import make_problems
from capacity_advisor.probes.recipe import LAB
from capacity_advisor.probes.student import student_of

Log = Callable[[str], None]


# ---- pools from the teacher --------------------------------------------------------------------


def _problems(task: str, n: int, seed: int, exclude: set[str] = frozenset()) -> list:
    return [p for p in make_problems(task, n + len(exclude), seed=seed) if p.prompt not in exclude][:n]


def teacher_pool(cfg: CalibrateConfig, task: str, seed: int, log: Log) -> tuple[Path, Path]:
    """(pool file, eval-set file) of one task and seed, sampled from the lab teacher (cached)."""
    pool_path, eval_path = pool_paths(cfg, task, seed)
    folder = pool_path.parent
    evals = _problems(task, cfg.n_eval, EVAL_SEED)
    todo = [(pool_path, _problems(task, cfg.n_train, seed, {p.prompt for p in evals}), seed)]
    if not eval_path.exists():
        todo.append((folder / "eval-pool.jsonl", evals, EVAL_SEED))
    for path, probs, s in todo:
        if path.exists():
            continue
        t0 = time.time()
        if cfg.scripted:
            write_jsonl(path, pool_rows(task, candidates=min(8, max(4, cfg.candidates)), seed=s, problems=probs,
                                        teacher=cfg.teacher))
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
    """The recipe a sweep's students are run with: the lab's, at the sweep's probe length and slice,
    and the sweep's full-run batch."""
    return LAB.with_(steps=cfg.probe_steps, batch_size=cfg.probe_batch, eval_every=min(cfg.probe_eval_every, cfg.probe_steps),
                     eval_problems=cfg.probe_eval_problems, max_new_tokens=cfg.max_new_tokens, train_batch=cfg.batch)


def pool_paths(cfg: CalibrateConfig, task: str, seed: int) -> tuple[Path, Path]:
    """(pool file, eval-set file) of one task and seed: where `teacher_pool` writes them."""
    folder = Path(cfg.out) / task / "pools"
    return folder / f"s{seed}.jsonl", folder / "eval.jsonl"


# A pool's candidates scored as one stream of 8,192-token batches: what every sweep's scores were
# measured with, so a unit's likelihood gaps do not move with the cache's shards.
SCORING = {"token_budget": 8192, "shard_size": 1 << 30}


def lab_calibration(cfg: CalibrateConfig) -> Calibration:
    """How the sweep's units run: on the CPU in float32, the probes keeping every held-out problem's
    result (so shorter probes can be replayed), the evaluations with the teacher's view."""
    return Calibration("calibrate", cfg.epochs, cfg.evals_per_epoch, device="cpu", dtype="float32",
                       probe={"teacher": cfg.teacher_model, "per_problem": True},
                       eval={"teacher": cfg.teacher_model, "view_limit": 64, "measure_every": cfg.measure_every},
                       model_path=True, scoring=SCORING)


def lab_unit(cfg: CalibrateConfig, cell: Cell) -> Unit:
    """The unit of a cell of the sweep, as the calibration protocol runs it: the ladder student on the
    teacher's pool."""
    pool_path, eval_path = pool_paths(cfg, cell.task, cell.seed)
    record = {"task": cell.task, "score": cell.score, "size": cell.size, "seed": cell.seed, "teacher": cfg.teacher,
              "temperature": cfg.temperature, "lab": RECIPE_VERSION, **({"build": cell.build} if cell.build else {})}
    return Unit(student=student_of(cell.model), name=cell.model, recipe=probe_recipe(cfg),
                pool=UnitPool(pool_path, eval_path, "lab", cell.task, cfg.teacher, cfg.temperature), seed=cell.seed,
                ranking=cell.score, folder=cell.folder(Path(cfg.out)),
                runs=tuple(Run(*r) for r in unit_runs(cfg, cell)), label=f"{cell.task} {cell.score} {cell.name}", record=record)


def sweep_unit(cfg: CalibrateConfig, cell: Cell) -> str:
    """One cell's unit through the protocol (`calibration.run.run_unit`), in a process of one torch
    thread (the sweep runs several at once); a one-line summary."""
    import torch

    torch.set_num_threads(1)
    return run_unit(lab_unit(cfg, cell), lab_calibration(cfg))


# ---- the sweep ---------------------------------------------------------------------------------


def lab_sweep(cfg: CalibrateConfig, given: frozenset = frozenset(), log: Log = lambda message: None) -> dict:
    """`advisor lab calibrate`: with `cfg.quick`, the tiny settings in place of the defaults, the
    settings `given` by the user (by name) kept; checked; then the sweep (`run_calibration`)."""
    if cfg.quick:  # a flag given beside --quick still counts, and is checked
        cfg = replace(CalibrateConfig.quick_settings(cfg.out), **{f.name: getattr(cfg, f.name)
                                                                  for f in fields(CalibrateConfig) if f.name in given})
    cfg.validate()
    check_writable_dir(cfg.out, "--out")
    return run_calibration(cfg, log)


def run_calibration(cfg: CalibrateConfig, log: Log = lambda message: None) -> dict:
    """Run or resume the sweep; rebuild OUT/records.jsonl from every finished run. A second sweep into
    OUT while this one runs is refused (`core.files.folder_lock`)."""
    cfg.validate()
    out = Path(cfg.out)
    check_sweep_folder(cfg)
    with folder_lock(out):  # one sweep at a time in OUT
        return _run_calibration(cfg, out, log)


def _run_calibration(cfg: CalibrateConfig, out: Path, log: Log) -> dict:
    from joblib import Parallel, delayed

    write_json(out / "config.json", {"stage": "calibrate", "settings": asdict(cfg), "versions": versions()})
    t_all = time.time()
    build_models(cfg.models, cfg.jobs, log)
    for t in cfg.tasks:
        for s in sorted(set(cfg.seeds) | set(cfg.mean_seeds)):
            teacher_pool(cfg, t, s, log)
    todo = [c for c in cells(cfg) if not all((c.folder(out) / s / "record.json").exists() for s in run_names(cfg, c))]
    log(f"{len(todo)} of {len(cells(cfg))} units to run, {cfg.jobs} at a time")
    jobs = Parallel(n_jobs=cfg.jobs, backend="loky", return_as="generator_unordered") if cfg.jobs > 1 else None
    calls = [delayed(sweep_unit)(cfg, c) for c in todo]
    for line in (jobs(calls) if jobs else (f(*a, **k) for f, a, k in calls)):
        log(line)
    records = collect_records(cfg)
    write_jsonl(out / "records.jsonl", records)
    if cfg.budget_runs:
        write_jsonl(out / "budget-records.jsonl", collect_records(cfg, budget_runs=True))
    return {"records": len(records), "path": str(out / "records.jsonl"), "seconds": round(time.time() - t_all, 1)}


RESUMED_AS_IS = ("out", "jobs")  # settings a sweep may be resumed with changed: where it is, how many units at once


def check_sweep_folder(cfg: CalibrateConfig, flag: str = "--out") -> None:
    """OUT is resumed only by the sweep that made it: its config.json must hold this sweep's settings
    (a setting it lacks, from an older version, counts as that setting's default); a folder another
    command made, or one holding files but no config.json (a published or committed calibration
    folder), is refused, so that its records.jsonl is never replaced."""
    out = Path(cfg.out)
    if unclaimed_files(out):
        raise InputError(f"{out} holds files but no sweep's config.json (a published calibration, or another "
                         f"command's folder): pass a new {flag}, so that nothing in it is replaced")
    if not (out / "config.json").exists():
        return
    theirs = json_object(out / "config.json", f"pass a new {flag}, or delete that folder to start over")
    if theirs.get("stage") != "calibrate" or not isinstance(theirs.get("settings"), dict) or "inputs_key" in theirs:
        raise InputError(f"{out} holds another command's output (not an `advisor lab calibrate` sweep): pass a new {flag}")
    mine = json.loads(json.dumps(asdict(cfg)))
    defaults = {f.name: json.loads(json.dumps(None if f.default is MISSING else f.default))
                for f in fields(CalibrateConfig)}
    changed = [k for k, v in mine.items() if k not in RESUMED_AS_IS and theirs["settings"].get(k, defaults[k]) != v]
    if changed:
        shown = ", ".join(f"--{k.replace('_', '-')} {theirs['settings'].get(k, defaults[k])!r} there, {mine[k]!r} now"
                          for k in changed[:3])
        raise InputError(f"{out} holds a sweep of other settings ({shown}): rerun with its settings to resume it, "
                         f"or pass a new {flag}")


def build_models(names: list[str], jobs: int, log: Log) -> None:
    """Pretrain the lab models `names` that are not built yet, `jobs` at a time, largest first."""
    from joblib import Parallel, delayed

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
    def runs_kept(unit: Unit) -> Unit:
        return replace(unit, runs=tuple(r for r in unit.runs if (r.name in cfg.options) != budget_runs))

    order = sorted(cells(cfg), key=lambda c: (c.task, c.score, cfg.ladder.index(c.size), c.build, c.seed))
    return collect((runs_kept(lab_unit(cfg, c)) for c in order), lab_calibration(cfg).source)
