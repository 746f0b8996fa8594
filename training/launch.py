"""The multi-process launch command for `advisor train --nproc N`: torchrun or accelerate launch.

Nothing home-made: the command is the one a user would type, built from the interpreter that runs
us (so the right virtual environment is used) and printed before it runs.

    torchrun:   python -m torch.distributed.run --standalone --nproc_per_node N -m capacity_advisor.training.sft --manifest M --out RUN
    accelerate: python -m accelerate.commands.launch --num_processes N [--config_file F] -m capacity_advisor.training.sft ...
"""

from __future__ import annotations

import shlex
import sys

from capacity_advisor.models.errors import InputError

LAUNCHERS = ("torchrun", "accelerate")


def sft_args(manifest: str, out: str, records: str | None = None, device: str = "auto", dtype: str = "auto",
             threads: int = 0, epochs: float | None = None, max_steps: int | None = None) -> list[str]:
    args = ["-m", "capacity_advisor.training.sft", "--manifest", str(manifest), "--out", str(out)]
    if records:
        args += ["--records", str(records)]
    if device != "auto":
        args += ["--device", device]
    if dtype != "auto":
        args += ["--dtype", dtype]
    if threads:
        args += ["--threads", str(threads)]
    if epochs is not None:
        args += ["--epochs", repr(float(epochs))]
    if max_steps is not None:
        args += ["--max-steps", str(max_steps)]
    return args


def launch_command(manifest: str, out: str, nproc: int, launcher: str = "torchrun", config_file: str | None = None,
                   cuda: bool = True, **sft_kw) -> list[str]:
    """The launch command; `cuda` says whether GPUs are there (accelerate needs them for > 1 process)."""
    if nproc < 1:
        raise InputError(f"--nproc {nproc} must be at least 1")
    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r} is unknown: use {' or '.join(LAUNCHERS)}")
    if config_file and launcher != "accelerate":
        raise InputError("--accelerate-config goes with --launcher accelerate")
    if launcher == "accelerate" and nproc > 1 and not cuda:
        # accelerate runs several CPU processes only through mpirun; torchrun does it with gloo
        raise InputError("accelerate launch needs GPUs for --nproc > 1 (its multi-CPU mode goes through MPI): "
                         "use --launcher torchrun on CPUs")
    py = sys.executable
    if launcher == "torchrun":
        # --standalone: a free local rendezvous port, so two runs on one machine do not collide
        head = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    else:
        head = [py, "-m", "accelerate.commands.launch", "--num_processes", str(nproc)]
        if config_file:
            head += ["--config_file", str(config_file)]
        elif nproc > 1:
            head += ["--multi_gpu"]
    return head + sft_args(manifest, out, **sft_kw)


def shown(cmd: list[str]) -> str:
    """The command as a user would type it (torchrun / accelerate launch rather than python -m ...)."""
    words = list(cmd)
    if words[1:3] == ["-m", "torch.distributed.run"]:
        words = ["torchrun"] + words[3:]
    elif words[1:3] == ["-m", "accelerate.commands.launch"]:
        words = ["accelerate", "launch"] + words[3:]
    return shlex.join(words)
