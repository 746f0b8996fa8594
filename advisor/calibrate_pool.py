"""`advisor calibrate --students A,B --pool P`: calibrate on the user's own pool with small proxy students.

    advisor calibrate --students ./qwen2.5-0.5b,./qwen2.5-1.5b --pool openr1.parquet --epochs 3 --out runs/cal
    advisor calibrate --students ./qwen2.5-0.5b,./qwen2.5-1.5b --pool openr1.parquet --epochs 3 --target ./qwen2.5-7b --dry-run
    advisor fit --records calibration/records.jsonl --records runs/cal/records.jsonl --out runs/pred
    advisor recommend --model ./qwen2.5-7b --pool openr1.parquet --budget 3 --predictor runs/pred --out runs/rec

The lab sweep (`--sizes`) calibrates on the lab's own pools; this calibrates on the user's. A fixed
set of `n_eval` problems with reference answers is held out of the pool (the same for every run:
the paper's protocol); on the rest, for each proxy and seed, the student scores every candidate,
D_high / D_low / D_mixed are selected, the probe `advisor recommend` runs measures the inputs (its
recipe: the predictor's, at the proxy's kind), and a full SFT of `epochs` epochs on each set is run
from a manifest exactly as `advisor train` runs it (in process, or launched over `nproc`
processes), evaluated `evals_per_epoch` times per epoch on the held-out problems. Each run's
RunRecord, with the probe's inputs and the pool's content hash, is a line of OUT/records.jsonl
for `advisor fit --records ... --records OUT/records.jsonl`, which marks the pool as the user's
own; `advisor recommend` on the same pool then knows it was calibrated there.

One run at a time; everything resumes (scores, probes and finished runs are kept, unfinished runs
continue from their last checkpoint), and a folder made from other inputs is refused.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import finite, stable_hash, versions, write_json, write_jsonl
from capacity_advisor.models.numbers import number
from capacity_advisor.training.manifest import SETS, schedule_of

EVAL_SEED = 10_000  # the held-out problems: one draw, the same for every proxy, seed and run
MAX_STUDENTS = 16
# The dry run's GPU-hours: assumptions to set for your own cluster, not measurements.
PEAK_TFLOPS = 989.0  # one H100 SXM's dense bf16 peak (NVIDIA's datasheet)
TRAIN_MFU = 0.4  # the share of that peak training and batched forward passes reach
DECODE_MFU = 0.05  # generation, one token at a time, reaches far less
MAX_TFLOPS = 1e6  # no GPU is near a thousand times an H100
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZE_CHUNK = 64  # problems whose candidates are tokenized in one call


@dataclass
class PoolCalibrateConfig:
    students: tuple[str, ...]  # --students: the proxies (model folders or hub ids)
    pool: str  # --pool: the user's pool (any layout `advisor score` reads)
    out: str  # --out: folder (resumable); records go to OUT/records.jsonl
    epochs: float = 3.0  # --epochs: the longest budget the full runs train
    seeds: tuple[int, ...] = (0,)  # --seeds: held-out slice of the probe, mixed set and data order
    n_eval: int = 200  # --n-eval: held-out problems of the full runs' evaluations (never trained on)
    evals_per_epoch: int = 4
    teacher: str = "unknown"  # --pool-teacher: what wrote the candidates (names the pool source in the records)
    task: str | None = None  # --task: the pool source's name in the records (default: the pool's content hash)
    checker: str = "auto"
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
        if len(set(self.students)) != len(self.students):
            bad.append("--students names a model twice")
        if not (isinstance(self.epochs, (int, float)) and math.isfinite(self.epochs) and 0 < self.epochs <= 100):
            bad.append(f"--epochs {self.epochs} must be a number of epochs above 0, at most 100")
        if not self.seeds or any(s < 0 for s in self.seeds):
            bad.append("--seeds must name at least one seed, each at least 0")
        if self.n_eval < 1:
            bad.append(f"--n-eval {self.n_eval} must be at least 1")
        if not 1 <= self.evals_per_epoch <= 100:
            bad.append(f"evals per epoch {self.evals_per_epoch} must be from 1 to 100")
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


def make_plan(cfg: PoolCalibrateConfig) -> Plan:
    from capacity_advisor.advisor.pool import PoolOptions, read_pool
    from capacity_advisor.advisor.probe import load_predictor, pick_checker, predictor_plan
    from capacity_advisor.models.files import check_writable_dir, recorded_key
    from capacity_advisor.models.loading import check_model_spec, describe_config

    cfg.validate()
    for s in cfg.students:
        check_model_spec(s)
    if cfg.target:
        check_model_spec(cfg.target)
    check_writable_dir(cfg.out, "--out")
    predictor = load_predictor(cfg.predictor)
    descriptions = {spec: describe_config(spec) for spec in cfg.students}  # a proxy that is not a model stops here
    pool = read_pool(cfg.pool, PoolOptions(**cfg.pool_options))
    answered = [p.id for p in pool.problems if p.answer is not None]
    if not answered:
        raise InputError(f"--pool {cfg.pool} has no reference answers: the full runs are judged on held-out problems "
                         "with answers (name the answer field with --answer-field)")
    if cfg.n_eval > len(answered) // 4:
        raise InputError(f"--n-eval {cfg.n_eval} holds out more than a quarter of the pool's {len(answered)} problems "
                         f"with answers: lower it to at most {len(answered) // 4}, or use a larger pool")
    held = set(random.Random(EVAL_SEED).sample(sorted(answered), cfg.n_eval))
    train = replace(pool, problems=[p for p in pool.problems if p.id not in held])
    students = []
    for spec in cfg.students:
        desc = descriptions[spec]
        plan = predictor_plan(spec, predictor, cfg.recipe).for_pool(len(train)).within(
            desc.get("max_position_embeddings"))
        lr, lr_source = plan.recipe.learning_rate(spec, desc["n_params"])
        students.append({"spec": spec, "name": student_name(spec), "description": desc, "plan": plan,
                         "learning_rate": lr, "learning_rate_source": lr_source})
    fingerprint = pool.fingerprint()
    key = stable_hash({"students": [(s["name"], s["description"]["fingerprint"]) for s in students],
                       "pool": fingerprint, "settings": {k: v for k, v in asdict(cfg).items()
                                                         if k not in ("out", "device", "nproc", "launcher", "target",
                                                                      "students", "pool", "gpu_tflops", "mfu",
                                                                      "decode_mfu")}})
    if recorded_key(cfg.out, "inputs_key") not in (None, key):
        raise InputError(f"{cfg.out} holds a calibration made from other inputs (proxies, pool or settings); pass a "
                         "new --out, or delete that folder to start over")
    checker = pick_checker(pool, cfg.checker)
    target = None
    if cfg.target:
        desc = describe_config(cfg.target)
        target = {"description": desc, "plan": predictor_plan(cfg.target, predictor, cfg.recipe).for_pool(
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
                     "evaluations_per_run": math.ceil(cfg.epochs * cfg.evals_per_epoch) + 1,
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


# ---- the dry run's tokens, FLOPs and GPU-hours ----------------------------------------------------


def model_tokenizer(spec: str):
    """(the tokenizer training loads for `spec`, None), or (None, why there is none to measure with).
    Local folders only (a lab student's is its build folder), never running the folder's code."""
    import os

    from capacity_advisor.models.loading import load_tokenizer, resolve_model_path

    path = resolve_model_path(spec)
    if not os.path.isdir(path):
        return None, "a hub id: tokens are measured with a local folder's tokenizer only (pass the model's folder)"
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None, "its folder holds no tokenizer"
    return load_tokenizer(path, {"trust_remote_code": False}), None


def measure_tokens(tokenizer, train: list, held_out: list, max_length: int, score_length: int) -> dict:
    """The pool's tokens as training and scoring count them (`models.template.encode_pair`): every
    candidate of every problem in `train`, as prompt + response + EOS cut at `max_length` (a training
    sequence), and as prompt + response cut at `score_length` (a scoring pass).

    A selected set holds one response per problem, chosen by the student's scores, which a dry run
    does not have: `per_epoch` is each problem's mean over its candidates, summed over problems
    (what a set of one response per problem drawn at random holds), and `per_epoch_shortest` /
    `per_epoch_longest` (each problem's shortest / longest candidate) bound D_high, D_low and
    D_mixed alike."""
    from statistics import mean

    from capacity_advisor.models.template import prompt_ids

    eos = int(tokenizer.eos_token_id is not None)  # training appends EOS to every response
    means, prompts = [], []
    shortest = longest = scored = cut = candidates = 0
    for start in range(0, len(train), TOKENIZE_CHUNK):
        chunk = [p for p in train[start:start + TOKENIZE_CHUNK] if p.candidates]
        texts = [c.text for p in chunk for c in p.candidates]
        lengths = iter(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter(())
        for p in chunk:
            n_prompt = len(prompt_ids(tokenizer, p.prompt))
            prompts.append(n_prompt)
            seqs = []
            for _ in p.candidates:
                whole = n_prompt + next(lengths)
                seqs.append(min(whole + eos, max_length))
                scored += min(whole, score_length)
                cut += whole + eos > max_length
            candidates += len(seqs)
            means.append(mean(seqs))
            shortest += min(seqs)
            longest += max(seqs)
    return {"max_length": max_length, "score_length": score_length, "problems": len(means), "candidates": candidates,
            "sequence_mean": mean(means) if means else 0.0, "per_epoch": float(sum(means)),
            "per_epoch_shortest": shortest, "per_epoch_longest": longest,
            "truncated_share": cut / candidates if candidates else 0.0, "score_tokens": scored,
            "prompt_mean": mean(prompts) if prompts else 0.0,
            "eval_prompt_mean": mean(len(prompt_ids(tokenizer, p.prompt)) for p in held_out) if held_out else 0.0}


def gpu_hours(flops: float, tflops: float, mfu: float) -> float:
    """Hours of one GPU of peak `tflops` TFLOP/s running at the share `mfu` of it."""
    return flops / (tflops * 1e12 * mfu) / 3600


def flops_and_hours(cfg: PoolCalibrateConfig, n_params: int, trained: float, forward: float, generated: float) -> dict:
    """FLOPs and GPU-hours of tokens trained (6 N per token: forward and backward), passed forward
    without gradients (2 N) and generated (2 N, at the decode share of the peak)."""
    flops = {"train": 6 * n_params * trained, "forward": 2 * n_params * forward, "generate": 2 * n_params * generated}
    hours = {"train": gpu_hours(flops["train"], cfg.gpu_tflops, cfg.mfu),
             "forward": gpu_hours(flops["forward"], cfg.gpu_tflops, cfg.mfu),
             "generate": gpu_hours(flops["generate"], cfg.gpu_tflops, cfg.decode_mfu)}
    hours["total"] = sum(hours.values())
    return {"train_tokens": trained, "forward_tokens": forward, "generated_tokens": generated, "flops": flops,
            "gpu_hours": hours}


def evaluation_tokens(evaluations: int, problems: int, new_tokens: int, prompt_mean: float) -> tuple[float, float]:
    """(generated, forward) tokens of `evaluations` evaluations on `problems` held-out problems, each
    generation taken to run to `new_tokens` (an upper bound): its prompt's prefill, then two teacher-
    forced passes over prompt + generation (the answer's log-probability, the frozen base's drift)."""
    generations = evaluations * problems
    return generations * new_tokens, generations * (prompt_mean + 2 * (prompt_mean + new_tokens))


def gpu_cost(cfg: PoolCalibrateConfig, plan: Plan, c: dict, log) -> dict:
    """The dry run's measured tokens of every proxy and of the target's one full run, and their
    FLOPs and GPU-hours under the stated peak and MFU: the rows of `c` gain `tokens` and `compute`,
    or `tokens_missing` saying why a model's tokens could not be measured."""
    from capacity_advisor.training.callbacks import eval_schedule

    seeds, n_eval, sets = len(cfg.seeds), len(plan.eval_ids), len(SETS)
    held_out = [plan.pool.get(i) for i in plan.eval_ids]
    first = None  # (tokens, proxy name) of the first proxy measured: the target's when it has no tokenizer
    for s, row in zip(plan.students, c["students"]):
        r = s["plan"].recipe
        tok, why = model_tokenizer(s["spec"])
        if tok is None:
            row["tokens_missing"] = why
            continue
        log(f"measuring the pool's tokens with {s['name']}'s tokenizer ({plan.train.n_candidates:,} candidates)")
        t = measure_tokens(tok, plan.train.problems, held_out, r.max_length, r.score_length)
        row["tokens"] = t
        first = first or (t, s["name"])
        probe_evals = 1 + 2 * len(eval_schedule(1, r.steps, 1, r.eval_every))  # the base once, then each set's points
        gen_probe, fwd_probe = evaluation_tokens(seeds * probe_evals, r.eval_problems, r.max_new_tokens, t["prompt_mean"])
        gen_full, fwd_full = evaluation_tokens(seeds * sets * row["evaluations_per_run"], n_eval, r.max_new_tokens,
                                               t["eval_prompt_mean"])
        parts = {"scoring": t["score_tokens"],  # one forward pass per candidate, once per proxy (shared by its seeds)
                 "probe_train": seeds * 2 * r.steps * r.batch_size * t["sequence_mean"],
                 "full_runs_train": seeds * sets * cfg.epochs * t["per_epoch"],
                 "evaluation_forward": fwd_probe + fwd_full
                 + seeds * probe_evals * r.eval_problems * 2 * t["sequence_mean"],  # + the probe's 2 teacher references
                 "probe_generated": gen_probe, "full_runs_generated": gen_full}
        row["compute"] = {**flops_and_hours(cfg, row["n_params"], parts["probe_train"] + parts["full_runs_train"],
                                            parts["scoring"] + parts["evaluation_forward"],
                                            gen_probe + gen_full), "parts": parts}
    proxies = [row["compute"]["gpu_hours"]["total"] for row in c["students"] if "compute" in row]
    out = {"peak_tflops": cfg.gpu_tflops, "mfu": cfg.mfu, "decode_mfu": cfg.decode_mfu,
           "formulas": {"train": "6 * N * tokens", "forward": "2 * N * tokens", "generate": "2 * N * tokens",
                        "gpu_hours": "FLOPs / (peak TFLOP/s * 1e12 * MFU) / 3600, generation at the decode MFU"},
           "set_tokens": "each problem's mean tokens over its candidates, summed over problems: D_high, D_low and D_mixed "
                         "hold one response per problem, chosen by the student's scores, which a dry run does not have",
           "measured": "token counts under each model's own tokenizer; FLOPs and GPU-hours follow from the formulas and "
                       "the peak and MFU assumed here, not from a run on a GPU",
           "measured_proxies": len(proxies),
           "proxies_gpu_hours": sum(proxies) if len(proxies) == len(c["students"]) else None}
    if plan.target is not None:
        tg, r = c["target"], plan.target["plan"].recipe
        tok, why = model_tokenizer(cfg.target)
        t = source = None
        if tok is not None:
            log(f"measuring the pool's tokens with {tg['model']}'s tokenizer ({plan.train.n_candidates:,} candidates)")
            t, source = measure_tokens(tok, plan.train.problems, held_out, r.max_length, r.score_length), tg["model"]
        elif first is not None:
            (t, source), tg["tokens_missing"] = first, f"{why}: counted with {first[1]}'s tokenizer instead"
        else:
            tg["tokens_missing"] = why
        if t is not None:
            tg["tokens"] = {**t, "tokenizer": source}
            gen, fwd = evaluation_tokens(c["students"][0]["evaluations_per_run"], n_eval, r.max_new_tokens,
                                         t["eval_prompt_mean"])
            tg["compute"] = flops_and_hours(cfg, tg["n_params"], cfg.epochs * t["per_epoch"], fwd, gen)
            if out["proxies_gpu_hours"] is not None:
                out["share_of_one_full_run"] = out["proxies_gpu_hours"] / tg["compute"]["gpu_hours"]["total"]
    return out


def run_pool_calibration(cfg: PoolCalibrateConfig, log=print, dry_run: bool = False) -> dict:
    """Check everything, then (unless `dry_run`) run or resume every proxy's probe and full runs;
    returns the plan's cost and, when run, the records' path."""
    plan = make_plan(cfg)
    c = cost(cfg, plan, measure=dry_run, log=log)
    if dry_run:
        return {"dry_run": True, "cost": c}
    out = Path(cfg.out)
    t0 = time.time()
    write_json(out / "config.json", {"stage": "calibrate-pool", "inputs_key": plan.key, "settings": finite(asdict(cfg)),
                                     "versions": versions()})
    write_jsonl(out / "eval.jsonl", [{"prompt": plan.pool.get(i).prompt, "answer": plan.pool.get(i).answer,
                                      "task": plan.pool.get(i).task} for i in plan.eval_ids])
    for s in plan.students:
        for seed in cfg.seeds:
            log(run_unit(cfg, plan, s, seed))
    records = collect(cfg, plan)
    write_jsonl(out / "records.jsonl", records)
    return {"records": len(records), "path": str(out / "records.jsonl"), "seconds": round(time.time() - t0, 1), "cost": c}


def unit_dir(cfg: PoolCalibrateConfig, student: dict, seed: int) -> Path:
    return Path(cfg.out) / "units" / f"{student['name'].replace('/', '--')}-s{seed}"


def run_unit(cfg: PoolCalibrateConfig, plan: Plan, student: dict, seed: int) -> str:
    """Score, select, probe and train one proxy on one seed (resumable); a one-line summary."""
    from capacity_advisor.advisor.probe import probe_pool
    from capacity_advisor.models.loading import load_model

    t0 = time.time()
    folder = unit_dir(cfg, student, seed)
    p = student["plan"]
    pcfg = p.probe_config(learning_rate=student["learning_rate"], seed=seed, device=cfg.device, dtype=cfg.dtype)
    lm = load_model(student["spec"], device=cfg.device, dtype=cfg.dtype)
    stage = probe_pool(student["spec"], plan.train, pcfg, lm, folder / "score", folder / "probe", checker=plan.checker,
                       max_length=p.recipe.score_length)
    for option in SETS:
        train_option(cfg, plan, student, seed, option, stage, lm, folder)
    return f"{student['name']} seed {seed}: done [{time.time() - t0:.0f}s]"


def train_option(cfg: PoolCalibrateConfig, plan: Plan, student: dict, seed: int, option: str, stage, lm,
                 folder: Path) -> Path:
    """One full run of a proxy on one set, as `advisor train` runs its manifest (skipped when
    finished; launched over --nproc processes when asked)."""
    import io
    import os
    import shutil

    from capacity_advisor.advisor.select import SelectConfig, export, select
    from capacity_advisor.probes.recipe import full_run_manifest
    from capacity_advisor.training.sft import run_sft

    run_dir = folder / option
    if (run_dir / "record.json").exists():
        return run_dir
    r = student["plan"].recipe
    sel = select(plan.train, stage.scores, SelectConfig(strategy=option, mix=schedule_of(option)[1], seed=seed))
    export(sel, folder / "data" / f"{option}.jsonl", "trl")
    m = full_run_manifest(
        r, epochs=float(cfg.epochs), learning_rate=student["learning_rate"], seed=seed,
        eval={"path": os.path.relpath(Path(cfg.out) / "eval.jsonl", folder), "checker": plan.checker, "limit": None,
              "base_drift": True},
        training={"evals_per_epoch": cfg.evals_per_epoch, "save_total_limit": 1},
        model={**{k: v for k, v in lm.description.items() if k != "path"}, "spec": student["spec"]},
        dataset=f"data/{option}.jsonl", strategy=option, mix=schedule_of(option)[1],
        features=finite(stage.report["features"]),
        pool={"task": cfg.task or plan.fingerprint, "source": Path(cfg.pool).name, "score": "sum",
              "fingerprint": plan.fingerprint, "teacher": cfg.teacher},
        base_dir=str(folder),
    )
    manifest = folder / f"{option}.manifest.json"
    m.to_json(manifest)
    if cfg.nproc > 1:
        import torch

        from capacity_advisor.training.launch import launch_command

        cmd = launch_command(str(manifest), str(run_dir), cfg.nproc, cfg.launcher, cuda=torch.cuda.is_available(),
                             device=cfg.device, dtype=cfg.dtype)
        if subprocess.run(cmd).returncode != 0:
            raise InputError(f"the full run of {student['name']} on D_{option} (seed {seed}) failed: see its output "
                             f"above; rerun the same command to resume it")
    else:
        run_sft(m, run_dir, device=cfg.device, dtype=cfg.dtype, lm=lm, store=False, stream=io.StringIO())
    for ckpt in run_dir.glob("checkpoint-*"):  # the weights are not needed once the record is written
        shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


def collect(cfg: PoolCalibrateConfig, plan: Plan) -> list[dict]:
    """Every finished run's RunRecord, without machine paths, with the probe recipe and seed it
    was measured with (what `advisor fit` reads to tell recommend how to probe)."""
    records = []
    for s in plan.students:
        for seed in cfg.seeds:
            for option in SETS:
                path = unit_dir(cfg, s, seed) / option / "record.json"
                if not path.exists():
                    continue
                rec = json.loads(path.read_text())
                rec["model"] = {**{k: v for k, v in rec["model"].items() if k != "path"}, "spec": s["name"]}
                settings = dict(rec.get("settings") or {})
                settings.pop("device", None)
                settings["seed"] = seed
                settings["probe"] = s["plan"].recipe.as_dict()
                rec["settings"] = settings
                rec["source"] = "calibrate-pool"
                prov = dict(rec.get("provenance") or {})
                rec["provenance"] = {k: v for k, v in prov.items() if k not in ("manifest", "final_checkpoint")}
                records.append(finite(rec))
    return records
