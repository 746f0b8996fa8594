"""`advisor train MANIFEST --out RUN` as one library call: every input checked before anything runs,
then the run in this process, or launched over `nproc` processes (torchrun or accelerate launch)
with the command said first.

    from capacity_advisor.training.run_manifest import RunRequest, run_manifest
    record = run_manifest(RunRequest("rec/recommendation.json", "runs/m-high", nproc=2))

A dry run checks the same, says the command and trains nothing (it returns None).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_dir, check_writable_file, folder_lock, refuse_overwrite
from capacity_advisor.training import sft
from capacity_advisor.training.launch import fsdp_on_cpu_note, launch_command, sft_args, shown
from capacity_advisor.training.manifest import load_manifest
from capacity_advisor.training.run_check import check_run


@dataclass(frozen=True)
class RunRequest:
    manifest: str  # the manifest's file
    out: str  # the run folder (a rerun resumes)
    records: str | None = None  # the records store (None: the default one)
    nproc: int = 1  # processes; > 1 launches data-parallel
    launcher: str = "torchrun"  # torchrun or accelerate
    accelerate_config: str | None = None  # an accelerate config file (with launcher accelerate)
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0  # torch CPU threads per process (0: torch's default)
    epochs: float | None = None  # overrides the manifest's budget
    max_steps: int | None = None  # overrides training.max_steps


def run_manifest(req: RunRequest, dry_run: bool = False, say: Callable[[str], None] = lambda s: None, *,
                 lm=None, store: bool = True, stream=None, step0_row: dict | None = None) -> dict | None:
    """The run's RunRecord (None for a dry run); `say` hears the launch command and any note
    about it, before the run starts. Everything refused is refused before `say` is called.

    A run in this process (one process, no accelerate config) also takes `lm`, the base student
    already loaded (a copy is trained: calibration trains several runs from one base), `store`
    (False keeps the record out of the records store), `stream` (where the trainer's progress
    lines go) and `step0_row` (the base's evaluation another run of the same base and eval set
    made), as `training.sft.run_sft` does; a launched run stores its record as `advisor train` does."""
    m = load_manifest(req.manifest)
    check_writable_dir(req.out, "--out")
    if req.records:
        check_writable_file(req.records, "--records")
    refuse_overwrite([req.manifest, m.dataset_path, m.eval_path, m.candidates_path], [req.out, req.records],
                     "--out / --records")
    if req.nproc < 1:
        raise InputError(f"--nproc {req.nproc} must be at least 1")
    check_run(m, req.out, world=req.nproc, device=req.device, dtype=req.dtype, epochs=req.epochs, max_steps=req.max_steps)
    run = dict(records=req.records, device=req.device, dtype=req.dtype, threads=req.threads, epochs=req.epochs,
               max_steps=req.max_steps)
    if req.nproc > 1 or req.accelerate_config:
        import torch

        cuda = torch.cuda.is_available()
        cmd = launch_command(req.manifest, req.out, req.nproc, req.launcher, req.accelerate_config, cuda=cuda, **run)
        say(shown(cmd))
        note = fsdp_on_cpu_note(req.accelerate_config, cuda)
        if note:
            say(note)
        if dry_run:
            return None
        with folder_lock(req.out):  # held by this process while the launched ones write there
            rc = subprocess.run(cmd).returncode
        if rc:
            raise InputError(f"training exited with status {rc} (see the messages above); rerun the same command to resume")
        return json.loads((Path(req.out) / "record.json").read_text(encoding="utf-8"))
    if dry_run:  # a run in this process says no command: a mistake found while it loads stays the only line
        say(shown([sys.executable] + sft_args(req.manifest, req.out, **run)))
        return None

    with folder_lock(req.out):
        return sft.run_sft(req.manifest, req.out, lm=lm, store=store, stream=stream, step0_row=step0_row, **run)
