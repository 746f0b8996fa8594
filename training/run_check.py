"""What a training run refuses, refused before it starts, and what its run folder holds.

`check_run` reads the manifest (with any `--epochs` / `--max-steps`), the run folder, the data,
eval and re-ranking files and decides the batch split, device and precision; `run_sft` calls it,
and so does `advisor train --dry-run`, so a dry run refuses exactly what the run would. `run_key`
names what a run trains (a folder holding another key is refused), `checkpoints` lists the
resume points.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import file_digest, recorded_key, refuse_special, stable_hash
from capacity_advisor.models.loading import check_model_spec
from capacity_advisor.training.data import SFTDataset, read_eval_set, read_sft_rows
from capacity_advisor.training.manifest import Manifest, load_manifest
from capacity_advisor.training.trainer_settings import precision, require_peft

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
RUN_FILES = ("config.json", "eval.jsonl", "record.json", "curve.png")  # the files a run keeps in its folder


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_key(m: Manifest) -> str:
    """Identifies what a run trains: a RUN folder holding another key is another run."""
    d = m.to_dict()
    for informational in ("probabilities", "reasons", "confidence", "crossover_epoch", "features", "pool", "sets", "race"):
        d.pop(informational, None)
    d["dataset_digest"] = file_digest(m.dataset_path)
    d["eval_digest"] = file_digest(m.eval_path) if m.eval_path else None
    if m.candidates_path is not None:  # re-ranking chooses rows from it (absent otherwise, so other keys stay as they were)
        d["candidates_digest"] = file_digest(m.candidates_path)
    return stable_hash(d)


def check_run_folder(run_dir: Path, key: str) -> None:
    """A run folder is resumed only by the run that made it (same manifest, same data files)."""
    refuse_special(run_dir, RUN_FILES, "remove it, or pass a new --out")  # a FIFO would never end the read
    if recorded_key(run_dir, "run_key") not in (None, key):
        raise InputError(f"{run_dir} holds a run of another manifest or dataset; pass a new --out "
                         "(or delete that folder to start over)")


def checkpoints(run_dir: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) for every checkpoint folder, oldest first. Complete: every rank's
    files are in place (`callbacks.SAVED`, written after a barrier, or the marker written after the
    evaluation; a one-process checkpoint's rng_state.pth, which its one rank wrote before the rest)
    and the Trainer's trainer_state.json, its last file, reads back. The marker may still be missing:
    a kill during the evaluation that follows the save, after the Trainer's rotation deleted the
    checkpoint before it; the resumed run evaluates that step first
    (`callbacks.EvalCallback.on_train_begin`)."""
    from capacity_advisor.training.callbacks import MARKER, SAVED, marker_of

    out = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            mt = CHECKPOINT.match(p.name)
            if mt and p.is_dir():
                ranks_done = (p / MARKER).is_file() or (p / SAVED).is_file() or (p / "rng_state.pth").is_file()
                whole = ranks_done and marker_of(p, "trainer_state.json") is not None
                out.append((int(mt.group(1)), p, whole))
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
              dtype: str = "auto", epochs: float | None = None, max_steps: int | None = None,
              rows: list | None = None) -> Checked:
    """Everything a run refuses, refused before it starts: the manifest (with any --epochs /
    --max-steps), the run folder, the batch split over `world` processes, the device and dtype,
    the data, eval and re-ranking files, LoRA's library. `run_sft` calls it, and so does
    `advisor train --dry-run`, so a dry run refuses exactly what the run would. `rows`: the
    dataset's rows, where the caller read them already (`read_sft_rows`)."""
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    m = with_overrides(m, epochs=epochs, max_steps=max_steps)
    key = run_key(m)
    run_dir = Path(out)
    check_run_folder(run_dir, key)
    if (run_dir / "record.json").exists():
        return Checked(m, key, complete=True)
    t = m.training
    if t.batch_size % (t.grad_accum * world):
        raise InputError(f"training.batch_size {t.batch_size} must be divisible by training.grad_accum ({t.grad_accum}) "
                         f"x processes ({world}): change the batch size or the number of processes")

    check_model_spec(m.model_spec)  # its path, not its weights
    # every file the manifest names is read and checked before the device, the libraries or a model
    # are touched: a damaged set is refused at once, whichever set of a race it is
    rows = read_sft_rows(m.dataset_path) if rows is None else rows
    train_set = SFTDataset(rows, t.switch_epoch, where=str(m.dataset_path))
    eval_rows = read_eval_set(m.eval_path, m.eval.limit) if m.eval_path else []
    if m.eval.teacher and eval_rows:
        check_model_spec(m.eval.teacher)
    candidates = None
    if t.rerank:
        from capacity_advisor.training.rerank import read_candidates

        candidates = read_candidates(m.candidates_path, {str(r.get("id")) for r in rows})
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or auto")
    use_cpu = device == "cpu" or not torch.cuda.is_available()
    chosen = precision(dtype, cuda=not use_cpu)
    if t.lora:
        require_peft()
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
