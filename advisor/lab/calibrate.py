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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import read_jsonl, versions, write_json, write_jsonl
from capacity_advisor.advisor.lab.portable import portable
from capacity_advisor.probes.recipe import LAB
from capacity_advisor.training.manifest import SETS, schedule_of

EVAL_SEED = 10_000  # the held-out problems are the same for every pool seed


@dataclass
class CalibrateConfig:
    out: str = "calibration"  # --out: folder (resumable); records go to OUT/records.jsonl
    sizes: tuple[str, ...] = ()  # --sizes: ladder names (empty: the whole ladder)
    seeds: tuple[int, ...] = (0, 1, 2)  # --seeds: pool draw, data order
    mean_seeds: tuple[int, ...] = (0,)  # --mean-seeds: seeds that also run the mean-ranked arm
    tasks: tuple[str, ...] = ("modchain", "addition")  # --tasks
    epochs: int = 5  # --epochs: the longest budget
    n_train: int = 3000  # --n-train: problems per pool
    n_eval: int = 200  # --n-eval: held-out problems for the full runs' evaluations
    candidates: int = 8  # --candidates: teacher samples per problem
    evals_per_epoch: int = 4
    batch: int = LAB.train_batch  # sequences per optimizer step of the full runs
    probe_steps: int = 2 * LAB.steps  # --probe-steps: the longest probe (shorter ones, the recipe's among them, are its prefixes)
    probe_batch: int = LAB.batch_size
    probe_eval_every: int = LAB.eval_every
    probe_eval_problems: int = LAB.eval_problems
    max_new_tokens: int = LAB.max_new_tokens
    jobs: int = 1  # --jobs: units in parallel (one torch thread each)
    teacher: str = "lab:teacher"  # --teacher: the lab model that samples the pools, or "program" (the scripted teacher)
    temperature: float = 1.0  # --temperature: the teacher's sampling temperature
    budget_runs: tuple[float, ...] = ()  # --budget-runs: also train each set as a run of just these epochs (seed 0)
    schedules: tuple[str, ...] = ()  # --schedules: options beyond D_high / D_low / D_mixed, e.g. mixed@0.25,curriculum@2
    quick: bool = False  # --quick: tiny settings for tests

    def validate(self) -> None:
        from capacity_advisor.models.lab import FAMILIES, LADDER

        bad = []
        unknown = [s for s in self.sizes if s not in LADDER]
        if unknown:
            bad.append(f"--sizes {','.join(unknown)}: use names from {', '.join(LADDER)}")
        unknown = [t for t in self.tasks if t not in FAMILIES]
        if unknown or not self.tasks:
            bad.append(f"--tasks {','.join(unknown) or '(none)'}: use names from {', '.join(FAMILIES)}")
        if not self.seeds:
            bad.append("--seeds must name at least one seed")
        if self.probe_steps < 1:
            bad.append(f"--probe-steps {self.probe_steps} must be at least 1")
        if self.epochs < 1 or self.n_train < self.probe_eval_problems + self.probe_batch or self.n_eval < 1:
            bad.append(f"--epochs {self.epochs}, --n-train {self.n_train}, --n-eval {self.n_eval}: need epochs >= 1, "
                       f"n-eval >= 1 and n-train >= {self.probe_eval_problems + self.probe_batch}")
        if not 2 <= self.candidates <= 16:
            bad.append(f"--candidates {self.candidates} must be between 2 and 16")
        if self.jobs < 1:
            bad.append(f"--jobs {self.jobs} must be at least 1")
        for option in self.schedules:
            try:
                strategy, _, switch = schedule_of(option)
            except InputError as e:
                bad.append(f"--schedules: {e}")
                continue
            if switch is not None and switch >= self.epochs:
                bad.append(f"--schedules {option}: the switch must come before the last epoch ({self.epochs})")
        if self.teacher != "program" and not self.teacher.startswith("lab:"):
            bad.append(f"--teacher {self.teacher!r}: name a lab model (lab:teacher) or 'program' for the scripted teacher")
        if not 0 < self.temperature <= 2:
            bad.append(f"--temperature {self.temperature} must be in (0, 2]")
        if any(not 0 < b < self.epochs for b in self.budget_runs):
            bad.append(f"--budget-runs {','.join(map(str, self.budget_runs))}: each must lie between 0 and --epochs ({self.epochs})")
        if bad:
            raise InputError("; ".join(bad))

    @property
    def options(self) -> tuple[str, ...]:
        """Every schedule a unit trains: the three sets, then the extra schedules."""
        return tuple(dict.fromkeys((*SETS, *self.schedules)))

    @property
    def ladder(self) -> tuple[str, ...]:
        from capacity_advisor.models.lab import LADDER

        return self.sizes or tuple(LADDER)

    @classmethod
    def quick_settings(cls, out: str) -> "CalibrateConfig":
        return cls(out=out, sizes=("xs",), seeds=(0,), mean_seeds=(), tasks=("modchain",), epochs=1, n_train=64,
                   n_eval=8, candidates=4, evals_per_epoch=2, batch=16, probe_steps=4, probe_batch=4,
                   probe_eval_every=2, probe_eval_problems=8, max_new_tokens=24, teacher="program", quick=True)

    @classmethod
    def from_folder(cls, out: str | Path) -> "CalibrateConfig":
        """The settings a sweep folder was run with (its config.json), with `out` that folder."""
        path = Path(out) / "config.json"
        if not path.is_file():
            raise InputError(f"{out} has no config.json: name a folder written by `advisor calibrate --out`")
        settings = json.loads(path.read_text())["settings"]
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k in cls.__dataclass_fields__}
        return cls(**{**kw, "out": str(out)})

    @property
    def source(self) -> str:
        """The pool source this sweep samples from: the teacher, and its temperature for a model."""
        return "program" if self.teacher == "program" else f"{self.teacher}@T{self.temperature:g}"

    @property
    def teacher_model(self) -> str | None:
        """The teacher whose view the evaluations report (none for the scripted teacher)."""
        return None if self.teacher == "program" else self.teacher


Log = Callable[[str], None]


@dataclass(frozen=True)
class Unit:
    """One student on one pool under one ranking: a probe and a full run per strategy."""

    task: str
    score: str
    size: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.size}-s{self.seed}"

    def folder(self, out: Path) -> Path:
        return out / self.task / self.score / self.name


def units(cfg: CalibrateConfig) -> list[Unit]:
    """Every unit: the summed-ranking arm first, and in each arm the most expensive (largest
    students) first, so that parallel jobs finish together."""
    from capacity_advisor.models.lab import n_params

    out = [Unit(t, "sum", s, seed) for t in cfg.tasks for s in cfg.ladder for seed in cfg.seeds]
    out += [Unit(t, "mean", s, seed) for t in cfg.tasks for s in cfg.ladder for seed in cfg.mean_seeds]
    return sorted(out, key=lambda u: (u.score != "sum", u.seed, -n_params(u.size), u.task))


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
            top_p=1.0, max_new_tokens=LAB.max_new_tokens, device="cpu", dtype="float32", checker="lab", shard_size=500,
            token_budget=32768, seed=s))
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
    lm = load_model(f"lab:{unit.size}", device="cpu", dtype="float32")
    pool = read_pool(pool_path)
    scores = _scores(lm, pool, folder / "scores.jsonl")
    lr = lab_learning_rate(unit.size)
    pcfg = ProbeConfig.from_recipe(
        probe_recipe(cfg), learning_rate=lr, seed=unit.seed, device="cpu", dtype="float32", teacher=cfg.teacher_model, per_problem=True)
    if not (folder / "probe" / "probe.json").exists():
        split = build_probe_data(pool, scores, pcfg, tokenizer=lm.tokenizer, checker="lab", score=unit.score)
        run_probe(f"lab:{unit.size}", split.data, pcfg, folder / "probe", lm=lm)
    probe = json.loads((folder / "probe" / "probe.json").read_text())
    for option in cfg.options:
        train_option(cfg, unit, option, lm, pool, pool_path, scores, eval_path, probe["features"], folder)
    if unit.seed == min(cfg.seeds):
        for budget in cfg.budget_runs:
            for option in SETS:
                train_option(cfg, unit, option, lm, pool, pool_path, scores, eval_path, probe["features"], folder,
                             name=budget_run_name(option, budget), epochs=budget)
    return f"{unit.task} {unit.score} {unit.name}: done [{time.time() - t0:.0f}s]"


def budget_run_name(option: str, budget: float) -> str:
    """The folder of a set's run of just `budget` epochs (its own schedule, as the manifest of
    `advisor recommend --budget B` trains it)."""
    return f"{option}-e{budget:g}"


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
              "teacher": cfg.teacher_model, "base_drift": True, "view_limit": 64},
        training={"batch_size": cfg.batch, "evals_per_epoch": cfg.evals_per_epoch, "save_total_limit": 1,
                  "switch_epoch": switch, "rerank": rerank},
        model={**lm.description, "spec": f"lab:{unit.size}"}, dataset=f"data/{name}.jsonl", strategy=strategy,
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

    from capacity_advisor.models.lab import student_path

    cfg.validate()
    out = Path(cfg.out)
    write_json(out / "config.json", {"stage": "calibrate", "settings": asdict(cfg), "versions": versions()})
    t_all = time.time()
    for name in ([cfg.teacher[len("lab:"):]] if cfg.teacher_model else []) + list(cfg.ladder):
        student_path(name)
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


def run_names(cfg: CalibrateConfig, unit: Unit) -> list[str]:
    """The run folders a unit holds when finished: one per option, and its budget runs."""
    extra = [budget_run_name(o, b) for b in cfg.budget_runs for o in SETS] if unit.seed == min(cfg.seeds) else []
    return [*cfg.options, *extra]


def collect_records(cfg: CalibrateConfig, budget_runs: bool = False) -> list[dict]:
    """The RunRecords of every finished run, in a fixed order, with machine paths removed; with
    `budget_runs`, those of the runs of shorter budgets instead (kept apart: they label nothing)."""
    out = Path(cfg.out)
    records = []
    for u in sorted(units(cfg), key=lambda u: (u.task, u.score, cfg.ladder.index(u.size), u.seed)):
        names = [n for n in run_names(cfg, u) if (n in cfg.options) != budget_runs]
        for strategy in names:
            path = u.folder(out) / strategy / "record.json"
            if path.exists():
                rec = portable(json.loads(path.read_text()), u, cfg.teacher, cfg.temperature)
                # the probe its features were measured with, so `advisor fit` can tell recommend
                rec["settings"].setdefault("probe", probe_recipe(cfg).as_dict())
                records.append(rec)
    return records
