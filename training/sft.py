"""Full SFT from a recommendation manifest, single process or data-parallel.

    python -m capacity_advisor.training.sft --manifest rec/recommendation.json --out runs/m-high
    torchrun --nproc_per_node 8 -m capacity_advisor.training.sft --manifest rec/recommendation.json --out runs/m-high
    accelerate launch --config_file configs/accelerate_fsdp.yaml -m capacity_advisor.training.sft --manifest ... --out ...

Runs on a CPU (fp32) or GPUs (bf16 where supported); the lab students train at ~0.05-0.3 s/step
on one CPU core. The HF `Trainer` does the optimisation; what this module adds:

- completion-only loss with the tokenization `advisor score` uses (`training.data`);
- the paper's protocol: evaluations and checkpoints `evals_per_epoch` times per epoch over the
  budget (`training.callbacks`), `save_total_limit` checkpoints kept;
- resume by default: a rerun continues from the newest complete checkpoint in RUN; a finished
  run (RUN/record.json present) is not run again;
- RUN/config.json (settings, versions, manifest) first, RUN/eval.jsonl and RUN/curve.png as it
  goes, RUN/record.json (RunRecord) last, plus one line in the records store;
- the best evaluation's checkpoint kept as RUN/best/ (the model's files, no optimizer state) beside
  the last, as practitioners keep their best epoch; the record's `best_checkpoint` says which step
  it is and its accuracy (full runs: probes and calibration runs, `store=False`, keep none).

`batch_size` in the manifest is the global batch per optimizer step, whatever the number of
processes: per-device batch = batch_size / (processes x grad_accum), so a run keeps its recipe
(and its RunRecord stays comparable) when it moves from one CPU to eight GPUs.

What a run refuses before it starts is `training.run_check`; the Trainer's settings (precision,
TrainingArguments, LoRA) are `training.trainer_settings`, the command line `training.sft_cli`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from capacity_advisor.core.files import versions, write_json
from capacity_advisor.models import loading
from capacity_advisor.models.loading import check_transformers
from capacity_advisor.models.template import check_prompts
from capacity_advisor.training import record as run_record
from capacity_advisor.training.data import CompletionCollator
from capacity_advisor.training.evaluate import Evaluator
from capacity_advisor.training.manifest import Manifest
from capacity_advisor.training.metrics import checker_name
from capacity_advisor.training.record import build_record, write_record
from capacity_advisor.training.run_check import Checked, check_run, checkpoints, env_world_size
from capacity_advisor.training.trainer_settings import training_arguments, with_lora

_LOADED: dict[tuple, object] = {}  # teachers kept in memory across the runs of one process (calibration)


def _load_cached(spec: str, dtype: str):
    key = (spec, dtype)
    if key not in _LOADED:
        _LOADED[key] = loading.load_model(spec, device="cpu", dtype=dtype)
    return _LOADED[key]


def release_memory() -> None:
    """Collect what reference cycles keep (a finished Trainer's model and optimizer state) and give
    the accelerator's cached blocks back."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def releasing(fn):
    """`fn`, then `release_memory` once it returns or raises (after its frame, which held them, is gone)."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            release_memory()
    return run


@releasing
def run_sft(manifest: str | os.PathLike | Manifest, out: str | os.PathLike, records: str | None = None,
            device: str = "auto", dtype: str = "auto", threads: int = 0, callbacks=(), stream=None,
            lm=None, store: bool = True, step0_row: dict | None = None, epochs: float | None = None,
            max_steps: int | None = None, pause_after_evals: int | None = None,
            provenance: dict | None = None, keep_best: bool | None = None, eval_progress=None) -> dict:
    """Train, evaluate, checkpoint, resume; return the RunRecord (also written to RUN/record.json).

    `lm`: the base student already in memory (a `LoadedModel`); a copy of it is trained, so
    callers that run several trainings from one base (probes, calibration) load it once.
    `store=False` keeps the record out of the records store (probe runs are not full runs).
    `step0_row`: the base model's evaluation, when another run from the same base and eval set
    already measured it (probes); it is written instead of evaluating step 0 again.
    `epochs` / `max_steps`: override the manifest's (`advisor train --epochs / --max-steps`);
    the run key, and so the run, is then another one.
    `pause_after_evals`: stop after that many evaluations in this call, leaving the run to resume
    from that checkpoint on the next call (the learning-rate schedule is the whole budget's all
    along); a paused run writes no record and returns {"paused_at_step": STEP}.
    `provenance`: more keys for the record's provenance (what this run was part of).
    `keep_best`: keep the best evaluation's checkpoint as RUN/best/ (by default a stored run does).
    `eval_progress(step, done, total)`: hears each evaluation's generation as it goes (prompts
    done of the held-out set), beside the run's own progress line.

    The trained copy, its optimizer state and the Trainer are freed before this returns: the
    Trainer holds them in reference cycles, which only a full garbage collection breaks, so
    without one a race's next segment, a probe's second set or a calibration's next run loaded
    beside the last one's weights (twice the memory on a GPU).
    """
    check_transformers()
    manifest_file = None if isinstance(manifest, Manifest) else str(Path(manifest).resolve())
    run_dir = Path(out)
    stream = stream or sys.stderr
    checked = check_run(manifest, out, env_world_size(), device, dtype, epochs=epochs, max_steps=max_steps)
    if checked.complete:
        import json

        if env_world_size() == 1 or int(os.environ.get("RANK", "0")) == 0:
            stream.write(f"{run_dir} is already complete (record.json); pass a new --out to train again\n")
        return json.loads((run_dir / "record.json").read_text(encoding="utf-8"))

    import torch
    from transformers.utils import logging as hf_logging

    from capacity_advisor.training import callbacks as cbs

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # one progress line, ours
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads:
        torch.set_num_threads(threads)
    m, world = checked.manifest, env_world_size()
    load_dtype, bf16, fp16 = checked.precision
    args = training_arguments(m.training, run_dir, checked.per_device, checked.use_cpu, bf16, fp16, world)
    _ = args.device  # sets up the process group under torchrun / accelerate launch
    is_main = args.process_index == 0
    progress = cbs.ProgressCallback(stream)
    resume = _resume_point(run_dir, is_main)
    lm, base, teacher = _models(m, args, lm, load_dtype, checked)
    settings = _settings(m, checked, world, args, lm.description, manifest_file)
    if is_main:
        write_json(run_dir / "config.json", {
            "stage": "train", "run_key": checked.key, "versions": versions(), "settings": settings,
            "manifest": m.to_dict(), "dataset": str(m.dataset_path), "eval_set": str(m.eval_path) if m.eval_path else None})
    trainer, evaluator, rerank, collator = _trainer(m, checked, args, lm, base, teacher, run_dir, resume, progress,
                                                    step0_row, pause_after_evals, callbacks,
                                                    keep_best=store if keep_best is None else keep_best,
                                                    eval_progress=eval_progress)
    _note_start(m, checked, trainer, settings, world, resume, progress)
    try:
        trainer.train(resume_from_checkpoint=str(resume[1]) if resume else None)
    except cbs.PausedBeforeTraining:  # the interrupted evaluation was this call's last one
        cbs.barrier()
        return {"paused_at_step": trainer.state.global_step}

    if trainer.state.global_step < trainer.state.max_steps:  # paused (pause_after_evals): resumed by the next call
        cbs.barrier()
        return {"paused_at_step": trainer.state.global_step}
    train_tokens = int(trainer.state.num_input_tokens_seen)  # summed over processes, carried through a resume
    record = None
    if is_main:
        provenance = {"resumed_from_step": resume[0] if resume else None, "train_tokens": train_tokens,
                      **(provenance or {})}
        record = _finish(m, checked, run_dir, trainer, evaluator, rerank, settings, provenance, lm.description,
                         progress, records, store, store if keep_best is None else keep_best)
    cbs.barrier()
    return record if record is not None else {}


def _note_start(m: Manifest, checked: Checked, trainer, settings: dict, world: int, resume, progress) -> None:
    """Into the settings, what accelerate made of the launch: FSDP shards the weights, DDP copies
    them; an accelerate config's mixed_precision applies over the precision chosen here, so the
    record states the one used. Then the run's first line."""
    load_dtype, bf16, fp16 = checked.precision
    settings["sharding"] = "fsdp" if getattr(trainer, "is_fsdp_enabled", False) else ("ddp" if world > 1 else None)
    used = str(getattr(trainer.accelerator, "mixed_precision", "no"))
    settings.update(bf16=bf16 or used == "bf16", fp16=fp16 or used == "fp16")
    t = m.training
    progress.note(f"training {m.model_spec} on {len(checked.train_set)} rows x {t.epochs} epochs: "
                  f"{world} process(es){' (FSDP)' if settings['sharding'] == 'fsdp' else ''}, batch {t.batch_size} "
                  f"(= {checked.per_device} x {world} x {t.grad_accum}), {settings['device']}, {load_dtype}"
                  f"{' + bf16' if settings['bf16'] else ''}{' + fp16' if settings['fp16'] else ''}"
                  + (f"; resuming at step {resume[0]}" if resume else ""))


def _resume_point(run_dir: Path, is_main: bool):
    """The newest complete checkpoint (step, path), or None; rank 0 removes what a kill half-wrote."""
    from capacity_advisor.training import callbacks as cbs

    resume = None
    if is_main:
        ckpts = checkpoints(run_dir)
        # the newest complete checkpoint whose evaluation is in eval.jsonl (read_curve puts back a row
        # its marker holds): one whose row is lost resumes from the one before, redoing that evaluation;
        # one a kill left unmarked (during its evaluation) is evaluated first (EvalCallback.on_train_begin)
        evaluated = {r.get("step") for r in cbs.read_curve(run_dir / "eval.jsonl")}
        # (unmarked, with the run's earlier rows in place: a run whose eval.jsonl is lost starts over)
        complete = [c for c in ckpts if c[2] and (c[0] in evaluated or (cbs.marker_of(c[1]) is None and 0 in evaluated))]
        resume = (complete[-1][0], complete[-1][1]) if complete else None
        for step, path, ok in ckpts:
            if not ok or not resume or step > resume[0]:
                shutil.rmtree(path, ignore_errors=True)  # half-written by a killed run, or to be redone
        if resume:
            cbs.truncate_eval_rows(run_dir / "eval.jsonl", resume[0])
        elif (run_dir / "eval.jsonl").exists():
            (run_dir / "eval.jsonl").unlink()  # no checkpoint survives: start clean
    resume = cbs.gather_to_main(resume)[0]
    cbs.barrier()
    return resume


def _models(m: Manifest, args, lm, load_dtype: str, checked: Checked):
    """The student to train (a copy when one is handed in), the frozen base for the drift measure
    and the teacher for the teacher-loss measure, all where the student trains."""
    import copy

    e = m.eval
    if lm is None:
        with args.main_process_first(desc="load model"):  # a lab student is built once, by rank 0
            lm = loading.load_model(m.model_spec, device="cpu", dtype=load_dtype)
        base = copy.deepcopy(lm) if e.base_drift else None
    else:
        base = lm if e.base_drift else None
        lm = copy.copy(lm)
        lm.model = copy.deepcopy(lm.model)
    check_prompts(lm.tokenizer, [r["prompt"] for r in checked.rows] + [r["prompt"] for r in checked.eval_rows])
    teacher = None
    if e.teacher and checked.eval_rows:
        with args.main_process_first(desc="load teacher"):
            teacher = _load_cached(e.teacher, load_dtype)
    if m.training.lora:
        lm.model = with_lora(lm.model, m.training.lora, m.training.seed)
    for judge in (base, teacher):  # the models that score generations sit where the student trains
        if judge is not None and str(judge.device) != str(args.device):
            judge.model.to(args.device)
            judge.device = args.device
    return lm, base, teacher


def _settings(m: Manifest, checked: Checked, world: int, args, description: dict, manifest_file) -> dict:
    load_dtype, bf16, fp16 = checked.precision
    return {
        "training": m.to_dict()["training"], "eval": m.to_dict()["eval"],
        "checker_used": checker_name(m.eval.checker),
        "processes": world, "per_device_batch": checked.per_device, "device": str(args.device),
        "weights_dtype": load_dtype, "bf16": bf16, "fp16": fp16, "template": "chat" if description.get("chat_template") else "plain",
        "manifest": manifest_file, "model_fingerprint_matches_manifest":
            (m.model.get("fingerprint") == description.get("fingerprint")) if m.model.get("fingerprint") else None,
        "versions": versions(),
    }


def _trainer(m: Manifest, checked: Checked, args, lm, base, teacher, run_dir: Path, resume, progress,
             step0_row, pause_after_evals, callbacks, keep_best: bool, eval_progress=None):
    """The HF Trainer with the protocol's callbacks (evaluations, curriculum, re-ranking, pause)."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback as HFProgress

    from capacity_advisor.training import callbacks as cbs

    t, e, tok = m.training, m.eval, lm.tokenizer
    measure = Evaluator(checked.eval_rows, e.checker, e.max_new_tokens, e.temperature, max_length=t.max_length,
                        base=base, teacher=teacher, token_budget=e.token_budget, per_problem=e.per_problem,
                        view_limit=e.view_limit)
    evaluator = cbs.EvalCallback(run_dir, measure, t.evals_per_epoch, t.grad_accum, t.seed, tok, m.model_spec,
                                 eval_every=t.eval_every, elapsed_before=cbs.resumed_elapsed(run_dir, resume),
                                 log=progress.note, step0_row=step0_row, measure_every=e.measure_every,
                                 keep_best=keep_best, on_generated=_both(progress.evaluating, eval_progress),
                                 eval_at=t.eval_at or (), epochs=None if t.max_steps else t.epochs)
    extra = [cbs.PauseCallback(evaluator, pause_after_evals)] if pause_after_evals else []
    rerank = None
    if t.rerank:
        from capacity_advisor.training.rerank import RerankCallback

        rerank = RerankCallback(run_dir, checked.train_set, checked.candidates, t.rerank["epochs"], m.strategy, m.mix,
                                t.rerank.get("score", "sum"), t.seed, tok, t.max_length, m.model_spec)
        extra.append(rerank)
    collator = CompletionCollator(tok, t.max_length)
    trainer = Trainer(model=lm.model, args=args, data_collator=collator, train_dataset=checked.train_set,
                      processing_class=tok,
                      callbacks=[evaluator, cbs.CurriculumCallback(checked.train_set), *extra, progress, *callbacks])
    for noisy in (PrinterCallback, HFProgress):
        trainer.remove_callback(noisy)
    evaluator.trainer = trainer
    if rerank is not None:
        rerank.trainer = trainer
    return trainer, evaluator, rerank, collator


def _both(first, second):
    """One callback that calls `first`, then `second` where there is one."""
    if second is None:
        return first

    def both(*a):
        first(*a)
        second(*a)

    return both


def _finish(m: Manifest, checked: Checked, run_dir: Path, trainer, evaluator, rerank, settings: dict,
            provenance: dict, description: dict, progress, records: str | None, store: bool, keep: bool) -> dict:
    """On rank 0: the RunRecord, its curve, RUN/record.json and, with `store`, the line in the
    records store (`records`, else the default one)."""
    from capacity_advisor.training import callbacks as cbs

    rows_done = cbs.read_curve(run_dir / "eval.jsonl")
    last = checkpoints(run_dir)
    settings.update({"steps_per_epoch": evaluator.steps_per_epoch, "max_steps": trainer.state.max_steps,
                     "eval_steps": evaluator.schedule})
    provenance = {"seconds": round(evaluator.elapsed(), 3), "resumed_from_step": provenance.pop("resumed_from_step"),
                  "final_checkpoint": str(last[-1][1]) if last else None, "manifest": settings.pop("manifest"),
                  "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **provenance}
    if rerank is not None:
        from capacity_advisor.training.rerank import describe

        provenance["rerank_tokens"] = rerank.tokens  # scoring spent in this process (0 when read back on a resume)
        settings["rerank"] = describe(run_dir / "rerank")
    n_train = len(checked.train_set)
    best = keep_best(run_dir, rows_done) if keep else None
    record = build_record(run_id=checked.key, description=description, manifest=m, n_train=n_train,
                          eval_rows=rows_done, settings=settings, provenance=provenance, best=best)
    run_record.plot_curve(rows_done, run_dir / "curve.png", f"{m.model_spec} · {m.strategy} · {n_train} rows · {m.training.epochs} epochs")
    if store:
        where = write_record(run_dir, record, records)
        progress.note(f"done: best accuracy {_fmt(record['best_accuracy'])}, final "
                      f"{_fmt(record['final_accuracy'])}; {run_dir / 'record.json'} (appended to {where})")
    else:
        write_json(run_dir / "record.json", record)
    return record


# A checkpoint's training state, which a kept model does not need.
TRAINING_STATE = ("optimizer.*", "scheduler.*", "scaler.*", "rng_state*", "trainer_state.json", "training_args.bin")


def keep_best(run_dir: Path, rows: list[dict]) -> dict | None:
    """Copy the best trained evaluation's checkpoint (`callbacks.best_row`) to RUN/best/, its
    model files only, written beside and renamed into place; {"step", "epoch", "accuracy", "folder"}
    ("folder" None where that checkpoint is gone), or None where no evaluation measured accuracy."""
    from capacity_advisor.training.callbacks import MARKER, best_row

    best = best_row(rows)
    if best is None:
        return None
    out = {"step": best["step"], "epoch": best["epoch"], "accuracy": best["accuracy"], "folder": None}
    ckpt, dest = run_dir / f"checkpoint-{best['step']}", run_dir / "best"
    if (dest / MARKER).is_file() and _marker_step(dest / MARKER) == best["step"]:
        return {**out, "folder": "best"}  # kept already (a rerun after a kill in _finish)
    if not (ckpt / MARKER).is_file():
        return out
    tmp = run_dir / "best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp, ignore=shutil.ignore_patterns(*TRAINING_STATE), symlinks=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return {**out, "folder": "best"}


def _marker_step(path: Path):
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.3f}"


if __name__ == "__main__":  # `python -m capacity_advisor.training.sft`: the command lives in sft_cli, above this module
    import runpy

    runpy.run_module("capacity_advisor.training.sft_cli", run_name="__main__", alter_sys=True)
