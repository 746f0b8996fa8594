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
  goes, RUN/record.json (RunRecord) last, plus one line in the records store.

`batch_size` in the manifest is the global batch per optimizer step, whatever the number of
processes: per-device batch = batch_size / (processes x grad_accum), so a run keeps its recipe
(and its RunRecord stays comparable) when it moves from one CPU to eight GPUs.

The Trainer's settings (precision, TrainingArguments, LoRA) are `training.trainer_settings`, the
command line `training.sft_cli`; their names are importable from here too.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import file_digest, stable_hash, versions, write_json
from capacity_advisor.training.manifest import Manifest, load_manifest
from capacity_advisor.training.trainer_settings import with_lora, require_peft, precision, training_arguments

__all__ = ["CHECKPOINT", "Checked", "check_run", "checkpoints", "env_world_size", "precision", "run_key",
           "run_sft", "training_arguments", "with_overrides"]

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_key(m: Manifest) -> str:
    """Identifies what a run trains: a RUN folder holding another key is another run."""
    d = m.to_dict()
    for informational in ("probabilities", "reasons", "confidence", "crossover_epoch", "features", "pool", "sets"):
        d.pop(informational, None)
    d["dataset_digest"] = file_digest(m.dataset_path)
    d["eval_digest"] = file_digest(m.eval_path) if m.eval_path else None
    if m.candidates_path is not None:  # re-ranking chooses rows from it (absent otherwise, so other keys stay as they were)
        d["candidates_digest"] = file_digest(m.candidates_path)
    return stable_hash(d)


def _check_run_folder(run_dir: Path, key: str) -> None:
    """A run folder is resumed only by the run that made it (same manifest, same data files)."""
    from capacity_advisor.models.files import recorded_key

    if recorded_key(run_dir, "run_key") not in (None, key):
        raise InputError(f"{run_dir} holds a run of another manifest or dataset; pass a new --out "
                         "(or delete that folder to start over)")


def checkpoints(run_dir: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) for every checkpoint folder, oldest first."""
    from capacity_advisor.training.callbacks import MARKER

    out = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            mt = CHECKPOINT.match(p.name)
            if mt and p.is_dir():
                out.append((int(mt.group(1)), p, (p / MARKER).exists() and (p / "trainer_state.json").exists()))
    return sorted(out)


@dataclass
class Checked:
    """What `check_run` read and decided: the run's inputs, ready for training."""

    manifest: Manifest
    key: str
    complete: bool  # RUN/record.json exists: nothing to do
    rows: list = field(default_factory=list)
    train_set: object = None
    eval_rows: list = field(default_factory=list)
    candidates: list | None = None
    per_device: int = 0
    use_cpu: bool = True
    precision: tuple = ("float32", False, False)


def check_run(manifest: str | os.PathLike | Manifest, out: str | os.PathLike, world: int = 1, device: str = "auto",
              dtype: str = "auto", epochs: float | None = None, max_steps: int | None = None) -> Checked:
    """Everything a run refuses, refused before it starts: the manifest (with any --epochs /
    --max-steps), the run folder, the batch split over `world` processes, the device and dtype,
    the data, eval and re-ranking files, LoRA's library. `run_sft` calls it, and so does
    `advisor train --dry-run`, so a dry run refuses exactly what the run would."""
    import torch

    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    m = with_overrides(m, epochs=epochs, max_steps=max_steps)
    key = run_key(m)
    run_dir = Path(out)
    _check_run_folder(run_dir, key)
    if (run_dir / "record.json").exists():
        return Checked(m, key, complete=True)
    t = m.training
    if t.batch_size % (t.grad_accum * world):
        raise InputError(f"training.batch_size {t.batch_size} must be divisible by training.grad_accum ({t.grad_accum}) "
                         f"x processes ({world}): change the batch size or the number of processes")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or auto")
    use_cpu = device == "cpu" or not torch.cuda.is_available()
    chosen = precision(dtype, cuda=not use_cpu)
    if t.lora:
        require_peft()
    from capacity_advisor.models.loading import check_model_spec
    from capacity_advisor.training.data import SFTDataset, read_eval_set, read_sft_rows

    check_model_spec(m.model_spec)
    rows = read_sft_rows(m.dataset_path)
    train_set = SFTDataset(rows, t.switch_epoch, where=str(m.dataset_path))
    eval_rows = read_eval_set(m.eval_path, m.eval.limit) if m.eval_path else []
    if m.eval.teacher and eval_rows:
        check_model_spec(m.eval.teacher)
    candidates = None
    if t.rerank:
        from capacity_advisor.training.rerank import read_candidates

        candidates = read_candidates(m.candidates_path, {str(r.get("id")) for r in rows})
    return Checked(m, key, False, rows, train_set, eval_rows, candidates, t.batch_size // (t.grad_accum * world),
                   use_cpu, chosen)


def with_overrides(m: Manifest, epochs: float | None = None, max_steps: int | None = None) -> Manifest:
    """The manifest with `advisor train --epochs / --max-steps` applied, checked as a whole again
    (a curriculum's switch or a re-ranking epoch must still fall inside the new budget)."""
    if epochs is None and max_steps is None:
        return m
    from dataclasses import replace

    training = replace(m.training, **({"epochs": epochs} if epochs is not None else {}),
                       **({"max_steps": max_steps} if max_steps is not None else {}))
    given = " and ".join(f"--{n.replace('_', '-')} {v}" for n, v in (("epochs", epochs), ("max_steps", max_steps))
                         if v is not None)
    return replace(m, training=training).validate(where=f"{given} on manifest")


_LOADED: dict[tuple, object] = {}  # teachers kept in memory across the runs of one process (calibration)


def _load_cached(spec: str, dtype: str):
    from capacity_advisor.models.loading import load_model

    key = (spec, dtype)
    if key not in _LOADED:
        _LOADED[key] = load_model(spec, device="cpu", dtype=dtype)
    return _LOADED[key]


def run_sft(manifest: str | os.PathLike | Manifest, out: str | os.PathLike, records: str | None = None,
            device: str = "auto", dtype: str = "auto", threads: int = 0, callbacks=(), stream=None,
            lm=None, store: bool = True, step0_row: dict | None = None, epochs: float | None = None,
            max_steps: int | None = None, pause_after_evals: int | None = None,
            provenance: dict | None = None) -> dict:
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
    """
    from capacity_advisor.models.loading import check_transformers

    check_transformers()
    manifest_file = None if isinstance(manifest, Manifest) else str(Path(manifest).resolve())
    run_dir = Path(out)
    stream = stream or sys.stderr
    checked = check_run(manifest, out, env_world_size(), device, dtype, epochs=epochs, max_steps=max_steps)
    m, key = checked.manifest, checked.key
    done = run_dir / "record.json"
    if checked.complete:
        import json

        if env_world_size() == 1 or int(os.environ.get("RANK", "0")) == 0:
            stream.write(f"{run_dir} is already complete (record.json); pass a new --out to train again\n")
        return json.loads(done.read_text(encoding="utf-8"))

    import torch
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback as HFProgress
    from transformers.utils import logging as hf_logging

    from capacity_advisor.training import callbacks as cbs
    from capacity_advisor.training.data import CompletionCollator
    from capacity_advisor.training.evaluate import Evaluator
    from capacity_advisor.training.metrics import checker_name
    from capacity_advisor.models.template import check_prompts
    from capacity_advisor.training.record import build_record, plot_curve, write_record

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # one progress line, ours
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads:
        torch.set_num_threads(threads)
    t, e = m.training, m.eval
    world = env_world_size()
    per_device, use_cpu = checked.per_device, checked.use_cpu
    load_dtype, bf16, fp16 = checked.precision
    rows, train_set, eval_rows = checked.rows, checked.train_set, checked.eval_rows

    args = training_arguments(t, run_dir, per_device, use_cpu, bf16, fp16, world)
    _ = args.device  # sets up the process group under torchrun / accelerate launch
    is_main = args.process_index == 0
    progress = cbs.ProgressCallback(stream)

    # ---- the run folder: resume point ------------------------------------------------------
    config_path = run_dir / "config.json"
    ckpts = cbs.gather_to_main(checkpoints(run_dir) if is_main else None)[0]
    complete = [c for c in ckpts if c[2]]
    resume = complete[-1] if complete else None
    if is_main:
        for step, path, ok in ckpts:
            if not ok or (resume and step > resume[0]):
                shutil.rmtree(path, ignore_errors=True)  # half-written by a killed run
        if resume:
            cbs.truncate_eval_rows(run_dir / "eval.jsonl", resume[0])
        elif (run_dir / "eval.jsonl").exists():
            (run_dir / "eval.jsonl").unlink()  # no checkpoint survives: start clean
    cbs.barrier()
    resume_marker = cbs.marker_of(resume[1]) if resume else None

    # ---- model ----------------------------------------------------------------------------
    import copy

    from capacity_advisor.models.loading import load_model

    if lm is None:
        with args.main_process_first(desc="load model"):  # a lab student is built once, by rank 0
            lm = load_model(m.model_spec, device="cpu", dtype=load_dtype)
        base = copy.deepcopy(lm) if e.base_drift else None
    else:
        base = lm if e.base_drift else None
        lm = copy.copy(lm)
        lm.model = copy.deepcopy(lm.model)
    model, tok = lm.model, lm.tokenizer
    description = lm.description
    check_prompts(tok, [r["prompt"] for r in rows] + [r["prompt"] for r in eval_rows])  # before any training step
    teacher = None
    if e.teacher and eval_rows:
        with args.main_process_first(desc="load teacher"):
            teacher = _load_cached(e.teacher, load_dtype)
    if t.lora:
        model = with_lora(model, t.lora, t.seed)

    settings = {
        "training": m.to_dict()["training"], "eval": m.to_dict()["eval"],
        "checker_used": checker_name(e.checker),
        "processes": world, "per_device_batch": per_device, "device": str(args.device),
        "weights_dtype": load_dtype, "bf16": bf16, "fp16": fp16, "template": "chat" if description.get("chat_template") else "plain",
        "manifest": manifest_file, "model_fingerprint_matches_manifest":
            (m.model.get("fingerprint") == description.get("fingerprint")) if m.model.get("fingerprint") else None,
        "versions": versions(),
    }
    if is_main:
        write_json(config_path, {"stage": "train", "run_key": key, "versions": versions(), "settings": settings,
                                 "manifest": m.to_dict(), "dataset": str(m.dataset_path),
                                 "eval_set": str(m.eval_path) if m.eval_path else None})

    for judge in (base, teacher):  # the models that score generations sit where the student trains
        if judge is not None and str(judge.device) != str(args.device):
            judge.model.to(args.device)
            judge.device = args.device
    measure = Evaluator(eval_rows, e.checker, e.max_new_tokens, e.temperature, max_length=t.max_length,
                        base=base, teacher=teacher, token_budget=e.token_budget, per_problem=e.per_problem,
                        view_limit=e.view_limit)
    evaluator = cbs.EvalCallback(run_dir, measure, t.evals_per_epoch, t.grad_accum, t.seed, tok, m.model_spec,
                                 eval_every=t.eval_every, elapsed_before=(resume_marker or {}).get("elapsed", 0.0),
                                 log=progress.note, step0_row=step0_row)
    extra = [cbs.PauseCallback(evaluator, pause_after_evals)] if pause_after_evals else []
    rerank = None
    if t.rerank:
        from capacity_advisor.training.rerank import RerankCallback

        rerank = RerankCallback(run_dir, train_set, checked.candidates, t.rerank["epochs"], m.strategy, m.mix,
                                t.rerank.get("score", "sum"), t.seed, tok, t.max_length, m.model_spec)
        extra.append(rerank)
    collator = CompletionCollator(tok, t.max_length)
    trainer = Trainer(model=model, args=args, data_collator=collator,
                      train_dataset=train_set, processing_class=tok,
                      callbacks=[evaluator, cbs.CurriculumCallback(train_set), *extra, progress, *callbacks])
    for noisy in (PrinterCallback, HFProgress):
        trainer.remove_callback(noisy)
    # what accelerate made of the launch: FSDP shards the weights, DDP copies them; an accelerate
    # config's mixed_precision applies over the precision chosen here, so the record states the one used
    settings["sharding"] = "fsdp" if getattr(trainer, "is_fsdp_enabled", False) else ("ddp" if world > 1 else None)
    used = str(getattr(trainer.accelerator, "mixed_precision", "no"))
    settings.update(bf16=bf16 or used == "bf16", fp16=fp16 or used == "fp16")
    evaluator.trainer = trainer
    if rerank is not None:
        rerank.trainer = trainer
    progress.note(f"training {m.model_spec} on {len(train_set)} rows x {t.epochs} epochs: "
                  f"{world} process(es){' (FSDP)' if settings['sharding'] == 'fsdp' else ''}, batch {t.batch_size} (= {per_device} x {world} x {t.grad_accum}), "
                  f"{settings['device']}, {load_dtype}{' + bf16' if settings['bf16'] else ''}{' + fp16' if settings['fp16'] else ''}"
                  + (f"; resuming at step {resume[0]}" if resume else ""))
    trainer.train(resume_from_checkpoint=str(resume[1]) if resume else None)

    if trainer.state.global_step < trainer.state.max_steps:  # paused (pause_after_evals): resumed by the next call
        cbs.barrier()
        return {"paused_at_step": trainer.state.global_step}

    # ---- the record -------------------------------------------------------------------------
    record = None
    train_tokens = sum(cbs.gather_to_main(collator.tokens))
    if is_main:
        rows_done = cbs.read_curve(run_dir / "eval.jsonl")
        last = checkpoints(run_dir)
        settings.update({"steps_per_epoch": evaluator.steps_per_epoch, "max_steps": trainer.state.max_steps,
                         "eval_steps": evaluator.schedule})
        provenance = {"seconds": round(evaluator.elapsed(), 3), "resumed_from_step": resume[0] if resume else None,
                      "final_checkpoint": str(last[-1][1]) if last else None, "manifest": settings.pop("manifest"),
                      "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      # a resumed run saw only part of the tokens in this process
                      "train_tokens": train_tokens if not resume else None, **(provenance or {})}
        if rerank is not None:
            from capacity_advisor.training.rerank import describe

            provenance["rerank_tokens"] = rerank.tokens  # scoring spent in this process (0 when read back on a resume)
            settings["rerank"] = describe(run_dir / "rerank")
        record = build_record(run_id=key, description=description, manifest=m, n_train=len(train_set),
                              eval_rows=rows_done, settings=settings, provenance=provenance)
        plot_curve(rows_done, run_dir / "curve.png",
                   f"{m.model_spec} · {m.strategy} · {len(train_set)} rows · {t.epochs} epochs")
        if store:
            where = write_record(run_dir, record, records)
            progress.note(f"done: best accuracy {_fmt(record['best_accuracy'])}, final "
                          f"{_fmt(record['final_accuracy'])}; {run_dir / 'record.json'} (appended to {where})")
        else:
            write_json(run_dir / "record.json", record)
    cbs.barrier()
    return record if record is not None else {}


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.3f}"


if __name__ == "__main__":  # `python -m capacity_advisor.training.sft`: the command lives in sft_cli, above this module
    import runpy

    runpy.run_module("capacity_advisor.training.sft_cli", run_name="__main__", alter_sys=True)
