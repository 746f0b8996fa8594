"""`advisor calibrate --students A,B --pool P`: calibrate on the user's own pool with small proxy students.

    advisor calibrate --students ./qwen2.5-0.5b,./qwen2.5-1.5b --pool openr1.parquet --epochs 3 --out runs/cal
    advisor calibrate --students ./qwen2.5-0.5b,./qwen2.5-1.5b --pool openr1.parquet --epochs 3 --target ./qwen2.5-7b --dry-run
    advisor fit --records calibration/records.jsonl --records runs/cal/records.jsonl --out runs/pred
    advisor recommend --model ./qwen2.5-7b --pool openr1.parquet --budget 3 --predictor runs/pred --out runs/rec

The lab sweep (`advisor lab calibrate`) calibrates on the lab's own pools; this calibrates on the
user's, through the same protocol (`calibration.run`). A fixed set of `n_eval` problems with
reference answers is held out of the pool (the same for every run: the paper's protocol); on the
rest, for each proxy and seed, the student scores every candidate, D_high / D_low / D_mixed are
selected, the probe `advisor recommend` runs measures the inputs (its recipe: the predictor's, at
the proxy's kind), and a full SFT of `epochs` epochs on each set is run from a manifest exactly as
`advisor train` runs it (in process, or launched over `nproc` processes), evaluated
`evals_per_epoch` times per epoch on the held-out problems. Each run's
RunRecord, with the probe's inputs and the pool's content hash, is a line of OUT/records.jsonl
for `advisor fit --records ... --records OUT/records.jsonl`, which marks the pool as the user's
own; `advisor recommend` on the same pool then knows it was calibrated there.

One run at a time; everything resumes (scores, probes and finished runs are kept, unfinished runs
continue from their last checkpoint), and a folder made from other inputs is refused.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.calibration.cost import DECODE_MFU, MAX_TFLOPS, PEAK_TFLOPS, TRAIN_MFU, gpu_cost
from capacity_advisor.advisor.calibration.run import collect, run_unit
from capacity_advisor.advisor.calibration.unit import Calibration, EVAL_SEED, Run, Unit, UnitPool
from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import pick_checker, read_pool
from capacity_advisor.advisor.probe.plan import bound_by_responses, load_predictor, predictor_plan
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    check_writable_dir, finite, folder_lock, recorded_key, stable_hash, unclaimed_files, versions, write_json,
    write_jsonl,
)
from capacity_advisor.core.numbers import number
from capacity_advisor.models.loading import check_loadable, check_model_spec, describe_config
from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS, RECIPE_FLAGS
from capacity_advisor.probes.student import student_of
from capacity_advisor.training.manifest import SETS
from capacity_advisor.training.text_metrics import CHECKER_DEFAULT

MAX_STUDENTS = 16
# The probe settings a calibration on your own pool may move (the rest follow the predictor's recipe).
OWN_RECIPE = ("steps", "batch_size", "eval_problems", "max_new_tokens")
# The settings only a calibration on your own pool takes ({setting: its flag}), named when --students is missing.
OWN_FLAGS = {"dry_run": "--dry-run", "target": "--target", "predictor": "--predictor", "teacher": "--pool-teacher",
             "task": "--task-name", "gpu_tflops": "--gpu-tflops", "mfu": "--mfu", "decode_mfu": "--decode-mfu",
             "nproc": "--nproc", "launcher": "--launcher", "evals_per_epoch": "--evals-per-epoch", "eval_at": "--eval-at",
             **{k: RECIPE_FLAGS[k][0] for k in OWN_RECIPE}}


@dataclass
class PoolCalibrateConfig:
    students: tuple[str, ...]  # --students: the proxies (model folders or hub ids)
    pool: str  # --pool: the user's pool (any layout `advisor score` reads)
    out: str  # --out: folder (resumable); records go to OUT/records.jsonl
    epochs: float = 3.0  # --epochs: the longest budget the full runs train
    seeds: tuple[int, ...] = (0,)  # --seeds: held-out slice of the probe, mixed set and data order
    n_eval: int = FULL_RUN_EVAL_PROBLEMS  # --n-eval: held-out problems of the full runs' evaluations (never trained on)
    evals_per_epoch: int = 4
    # --eval-at: more evaluation points of every full run, in epochs, beside the schedule (for example
    # 0.25,0.75: a race stopped early can then be replayed where it would stop)
    eval_at: tuple[float, ...] = ()
    teacher: str = "unknown"  # --pool-teacher: what wrote the candidates (names the pool source in the records)
    task: str | None = None  # --task: the pool source's name in the records (default: the pool's content hash)
    checker: str = CHECKER_DEFAULT
    device: str = "auto"
    dtype: str = "auto"
    nproc: int = 1  # --nproc: processes per full run (torchrun / accelerate, as `advisor train`)
    launcher: str = "torchrun"
    target: str | None = None  # --target: the large student the calibration is for (the plan's cost share)
    predictor: str | None = None  # --predictor: whose probe recipe the probes follow (default: the shipped one)
    recipe: dict = field(default_factory=dict)  # probe settings given by flags: {recipe setting: value}
    pool_options: dict = field(default_factory=dict)
    gpu_tflops: float = PEAK_TFLOPS  # --gpu-tflops: one GPU's peak TFLOP/s (the dry run's GPU-hours)
    mfu: float = TRAIN_MFU  # --mfu: share of that peak that training and forward passes reach
    decode_mfu: float = DECODE_MFU  # --decode-mfu: share of that peak that generation reaches

    def validate(self) -> None:
        bad = []
        if not self.students or len(self.students) > MAX_STUDENTS:
            bad.append(f"--students must name 1 to {MAX_STUDENTS} proxy models (comma-separated)")
        seen: dict[str, str] = {}
        for spec in self.students:
            key = same_model(spec)
            if key in seen:
                bad.append(f"--students names a model twice ({seen[key]} and {spec} are one): name each proxy once")
                break
            seen[key] = spec
        if not (isinstance(self.epochs, (int, float)) and math.isfinite(self.epochs) and 0 < self.epochs <= 100):
            bad.append(f"--epochs {self.epochs} must be a number of epochs above 0, at most 100")
        if not self.seeds or any(not 0 <= s < 2 ** 31 for s in self.seeds):
            bad.append(f"--seeds must name at least one seed, each from 0 to {2 ** 31 - 1}")
        elif len(set(self.seeds)) < len(self.seeds):
            bad.append("--seeds names a seed more than once: name each once (each seed is a unit of runs)")
        if self.checker == "none":
            bad.append("--checker none: a calibration's labels are the full runs' held-out accuracies, so it needs a "
                       "checker (auto, lab or math) and a pool with reference answers")
        if self.launcher != "torchrun" and self.nproc < 2:
            bad.append(f"--launcher {self.launcher} launches several processes: give --nproc 2 or more with it")
        if self.n_eval < 1:
            bad.append(f"--n-eval {self.n_eval} must be at least 1")
        if not 1 <= self.evals_per_epoch <= 100:
            bad.append(f"evals per epoch {self.evals_per_epoch} must be from 1 to 100")
        if len(self.eval_at) > 100 or not all(number(e) and 0 < e <= self.epochs for e in self.eval_at):
            bad.append(f"--eval-at {','.join(f'{e:g}' for e in self.eval_at[:5])}: give at most 100 points, each a "
                       f"number of epochs above 0 and at most --epochs ({self.epochs:g}), e.g. 0.25,0.75")
        if self.nproc < 1:
            bad.append(f"--nproc {self.nproc} must be at least 1")
        if not (number(self.gpu_tflops) and 0 < self.gpu_tflops <= MAX_TFLOPS):
            bad.append(f"--gpu-tflops {self.gpu_tflops} must be one GPU's peak TFLOP/s, above 0 and at most {MAX_TFLOPS:g} "
                       f"({PEAK_TFLOPS:g}: an H100 SXM's dense bf16)")
        for flag, v in (("--mfu", self.mfu), ("--decode-mfu", self.decode_mfu)):
            if not (number(v) and 0 < v <= 1):
                bad.append(f"{flag} {v} must be a share of the peak, above 0 and at most 1")
        if bad:
            raise InputError("; ".join(bad))


def same_model(spec: str) -> str:
    """What tells proxies apart: a local folder by its real path (`A`, `A/` and a link to A are one
    model, which would run every unit twice into one folder), anything else as written."""
    expanded = os.path.expanduser(spec)
    return os.path.realpath(expanded) if os.path.exists(expanded) else spec


def student_name(spec: str) -> str:
    """How a proxy is named in records and folders: a hub id as given, a folder by its name (no
    machine path is kept)."""
    p = Path(spec)
    return p.name if p.exists() else spec


@dataclass
class Plan:
    """What a calibration will run, checked before any work: the split, and per proxy its probe
    recipe, learning rate and run sizes."""

    pool: object  # the pool as read (whole)
    train: object  # the pool less the held-out problems
    eval_ids: list[str]
    checker: str
    fingerprint: str  # the whole pool's content hash: what recommend knows the pool by
    students: list[dict]  # per proxy: spec, name, description, plan (ProbePlan), learning rate
    key: str
    target: dict | None = None  # --target: its description and the plan its own full run would follow


def held_out(answered, n_eval: int) -> set[str]:
    """The ids of the full runs' held-out problems among a pool's problems with answers: one draw
    (EVAL_SEED), the same for every student, seed and run."""
    return set(random.Random(EVAL_SEED).sample(sorted(answered), n_eval))


def make_plan(cfg: PoolCalibrateConfig, run: bool = True) -> Plan:
    """The plan, every input checked; with `run` also what loading each proxy needs (a dry run plans
    from configs alone)."""
    cfg.validate()
    for s in cfg.students:
        check_model_spec(s)
    if cfg.target:
        check_model_spec(cfg.target)
    check_writable_dir(cfg.out, "--out")
    predictor = load_predictor(cfg.predictor)
    descriptions = {spec: describe_config(spec) for spec in cfg.students}  # a proxy that is not a model stops here
    if run:
        for spec in cfg.students:
            check_loadable(spec, "--students")
    pool = read_pool(cfg.pool, PoolOptions(**cfg.pool_options))
    answered = [p.id for p in pool.problems if p.answer is not None]
    if not answered:
        raise InputError(f"--pool {cfg.pool} has no reference answers: the full runs are judged on held-out problems "
                         "with answers (name the answer field with --answer-field)")
    if cfg.n_eval > len(answered) // 4:
        raise InputError(f"--n-eval {cfg.n_eval} holds out more than a quarter of the pool's {len(answered)} problems "
                         f"with answers: lower it to at most {len(answered) // 4}, or use a larger pool")
    held = held_out(answered, cfg.n_eval)
    train = replace(pool, problems=[p for p in pool.problems if p.id not in held])
    students = []
    for spec in cfg.students:
        student = student_of(spec, descriptions[spec])
        plan = predictor_plan(student, predictor, cfg.recipe).for_pool(len(train)).within(
            student.description.get("max_position_embeddings"))
        if run:  # a real proxy's evaluations bounded by the pool's own responses, as recommend bounds them
            plan = bound_by_responses(plan, train, spec)
        lr, lr_source = student.learning_rate()
        students.append({"spec": spec, "name": student_name(spec), "description": student.description, "plan": plan,
                         "learning_rate": lr, "learning_rate_source": lr_source, "student": student})
    fingerprint = pool.fingerprint()
    key = stable_hash({"students": [(s["name"], s["description"]["fingerprint"]) for s in students],
                       "pool": fingerprint, "settings": {k: v for k, v in asdict(cfg).items()
                                                         if k not in ("out", "device", "nproc", "launcher", "target",
                                                                      "students", "pool", "gpu_tflops", "mfu",
                                                                      "decode_mfu")
                                                         # set only: the folders made before it keep their key
                                                         and (k != "eval_at" or v)}})
    if recorded_key(cfg.out, "inputs_key") not in (None, key):
        raise InputError(f"{cfg.out} holds a calibration made from other inputs (proxies, pool or settings); pass a "
                         "new --out, or delete that folder to start over")
    if unclaimed_files(cfg.out):
        raise InputError(f"{cfg.out} holds files but no calibration's config.json (a published calibration, or another "
                         "command's folder): pass a new --out, so that nothing in it is replaced")
    checker = pick_checker(pool, cfg.checker)
    target = None
    if cfg.target:
        desc = describe_config(cfg.target)
        target = {"description": desc, "plan": predictor_plan(student_of(cfg.target, desc), predictor, cfg.recipe).for_pool(
            len(train)).within(desc.get("max_position_embeddings"))}
    return Plan(pool, train, [p.id for p in pool.problems if p.id in held], checker, fingerprint, students, key, target)


def cost(cfg: PoolCalibrateConfig, plan: Plan, measure: bool = False, log=None) -> dict:
    """Steps and sequences of every run, and their compute against one full run of `--target` at
    the same budget (compute taken as parameters x sequences trained: every run sees the same pool's
    sequences, so their lengths cancel). With `measure` (the dry run), also the pool's tokens under
    each model's own tokenizer and what they cost in FLOPs and GPU-hours (`gpu_cost`)."""
    problems = len(plan.train)
    rows, compute = [], 0.0
    for s in plan.students:
        r = s["plan"].recipe
        train_problems = problems - r.eval_problems  # the probe's held-out slice is not trained on
        steps_epoch = math.ceil(problems / r.train_batch)
        full_steps = math.ceil(steps_epoch * cfg.epochs)
        sequences = full_steps * r.train_batch * len(SETS) * len(cfg.seeds) + r.steps * r.batch_size * 2 * len(cfg.seeds)
        n = s["description"]["n_params"]
        compute += n * sequences
        rows.append({"student": s["name"], "n_params": n, "probe_steps": r.steps, "probe_batch": r.batch_size,
                     "full_run_steps": full_steps, "train_batch": r.train_batch, "runs": len(SETS) * len(cfg.seeds),
                     "sequences": sequences, "probe_train_problems": train_problems,
                     "evaluations_per_run": math.ceil(cfg.epochs * cfg.evals_per_epoch) + 1 + len(set(cfg.eval_at)),
                     "eval_problems": len(plan.eval_ids), "learning_rate": s["learning_rate"]})
    out = {"pool_problems": len(plan.pool), "train_problems": problems, "eval_problems": len(plan.eval_ids),
           "epochs": cfg.epochs, "seeds": list(cfg.seeds), "students": rows}
    if plan.target is not None:
        t = plan.target["description"]
        batch = plan.students[0]["plan"].recipe.train_batch
        target_sequences = math.ceil(math.ceil(problems / batch) * cfg.epochs) * batch
        out["target"] = {"model": student_name(cfg.target), "n_params": t["n_params"],
                         "full_run_sequences": target_sequences,
                         "share_of_one_full_run": compute / (t["n_params"] * target_sequences)}
    if measure:
        out["gpu"] = gpu_cost(cfg, plan, out, log or (lambda message: None))
    return out


def check_given(cfg: PoolCalibrateConfig, given: frozenset = frozenset(), dry_run: bool = False) -> None:
    """What `advisor calibrate` needs whatever else was given: both --students and --pool (the
    settings `given` that go with them named when --students is missing), and the GPU-hours'
    settings only with `dry_run`. `given`: the settings the user gave by name (the flags' fields)."""
    if not cfg.students or not cfg.pool:
        own = [flag for k, flag in OWN_FLAGS.items() if k in given]
        raise InputError((f"{', '.join(own)} go with --students: " if own and not cfg.students else "")
                         + "calibrating on your own pool needs both --students (your proxies) and --pool "
                           "(the lab sweep is `advisor lab calibrate`)")
    gpu = [OWN_FLAGS[k] for k in ("gpu_tflops", "mfu", "decode_mfu") if k in given]
    if gpu and not dry_run:
        raise InputError(f"{', '.join(gpu)} {'go' if len(gpu) > 1 else 'goes'} with --dry-run (the plan's GPU-hours)")


def run_pool_calibration(cfg: PoolCalibrateConfig, log: Callable[[str], None] = lambda message: None,
                         dry_run: bool = False, given: frozenset = frozenset()) -> dict:
    """Check everything (`check_given`, then the plan), then (unless `dry_run`) run or resume every
    proxy's probe and full runs through the calibration protocol, one writer in OUT
    (`core.files.folder_lock`); returns the plan's cost and, when run, the records' path. `log`
    hears each line of progress."""
    check_given(cfg, given, dry_run)
    with contextlib.nullcontext() if dry_run else folder_lock(cfg.out):
        return _run_pool_calibration(cfg, log, dry_run)


def _run_pool_calibration(cfg: PoolCalibrateConfig, log: Callable[[str], None], dry_run: bool) -> dict:
    plan = make_plan(cfg, run=not dry_run)
    for p in [s["plan"] for s in plan.students] + ([plan.target["plan"]] if plan.target else []):
        if p.build_note:
            log(f"note: {p.build_note}")
    c = cost(cfg, plan, measure=dry_run, log=log)
    if dry_run:
        return {"dry_run": True, "cost": c}
    out = Path(cfg.out)
    t0 = time.time()
    write_json(out / "config.json", {"stage": "calibrate-pool", "inputs_key": plan.key, "settings": finite(asdict(cfg)),
                                     "versions": versions()})
    write_jsonl(out / "eval.jsonl", [{"prompt": plan.pool.get(i).prompt, "answer": plan.pool.get(i).answer,
                                      "task": plan.pool.get(i).task} for i in plan.eval_ids])
    cal = Calibration("calibrate-pool", float(cfg.epochs), cfg.evals_per_epoch, cfg.device, cfg.dtype, cfg.nproc,
                      cfg.launcher, eval_at=tuple(sorted({e / cfg.epochs for e in cfg.eval_at})))
    units = pool_units(cfg, plan)
    for unit in units:
        log(run_unit(unit, cal))
    records = collect(units, cal.source)
    write_jsonl(out / "records.jsonl", records)
    return {"records": len(records), "path": str(out / "records.jsonl"), "seconds": round(time.time() - t0, 1), "cost": c}


def pool_units(cfg: PoolCalibrateConfig, plan: Plan) -> list[Unit]:
    """Each proxy at each seed on the pool less its held-out problems, ranked by the summed
    log-probability, with the learning rate and recipe the plan chose for it."""
    pool = UnitPool(Path(cfg.pool), Path(cfg.out) / "eval.jsonl", plan.checker, cfg.task or plan.fingerprint, cfg.teacher,
                    problems=plan.train, fingerprint=plan.fingerprint)
    return [Unit(student=s["student"], name=s["name"], recipe=s["plan"].recipe, pool=pool, seed=seed, ranking="sum",
                 folder=Path(cfg.out) / "units" / f"{s['name'].replace('/', '--')}-s{seed}",
                 runs=tuple(Run(o, o) for o in SETS), label=f"{s['name']} seed {seed}")
            for s in plan.students for seed in cfg.seeds]
