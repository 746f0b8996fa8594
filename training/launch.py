"""The multi-process launch command for `advisor train --nproc N`: torchrun or accelerate launch.

Nothing home-made: the command is the one a user would type, built from the interpreter that runs
us (so the right virtual environment is used) and printed before it runs.

    torchrun:   python -m torch.distributed.run --standalone --nproc_per_node N -m capacity_advisor.training.sft --manifest M --out RUN
    accelerate: python -m accelerate.commands.launch --num_processes N [--config_file F] -m capacity_advisor.training.sft ...
"""

from __future__ import annotations

import shlex
import sys

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import special_kind

LAUNCHERS = ("torchrun", "accelerate")


def sft_args(manifest: str, out: str, records: str | None = None, device: str = "auto", dtype: str = "auto",
             threads: int = 0, epochs: float | None = None, max_steps: int | None = None, race_set: str | None = None,
             pause_after_evals: int | None = None, race_eval_at: list[float] | None = None) -> list[str]:
    args = ["-m", "capacity_advisor.training.sft", "--manifest", str(manifest), "--out", str(out)]
    if race_set:  # one raced set's run, launched by training.race
        args += ["--race-set", race_set] + (["--pause-after-evals", str(pause_after_evals)] if pause_after_evals else [])
        if race_eval_at:  # the race's decision points (RaceRule.shares), evaluated besides the schedule
            args += ["--race-eval-at", ",".join(repr(float(x)) for x in race_eval_at)]
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
    """The launch command; `cuda` says whether GPUs are there (an FSDP config is checked against it).
    Without GPUs both launchers start gloo processes: accelerate launch hands a multi-process or
    FSDP config to torch's elastic launcher, as torchrun does."""
    if nproc < 1:
        raise InputError(f"--nproc {nproc} must be at least 1")
    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r} is unknown: use {' or '.join(LAUNCHERS)}")
    if config_file and launcher != "accelerate":
        raise InputError("--accelerate-config goes with --launcher accelerate")
    if config_file:
        check_accelerate_config(config_file, cuda)
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


# FSDP v1 on CPU processes (gloo) refuses to broadcast rank 0's weights at wrap time: torch raises
# "FSDP parameter initialization with `sync_module_states=True` is not supported on cpu."
# cpu_ram_efficient_loading turns sync_module_states on, so both must be off there.
CPU_FSDP_OFF = ("fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading")


def check_accelerate_config(path: str, cuda: bool) -> dict:
    """The accelerate config as a mapping, read as data (YAML safe_load: no tags that build objects),
    or an InputError; on a machine without CUDA, an FSDP config that would fail at wrap time."""
    import yaml

    kind = special_kind(path)
    if kind is not None:  # a FIFO would wait for a writer, a device never end
        raise InputError(f"--accelerate-config {path} is {kind}, not a config file: pass an accelerate config file "
                         "such as configs/accelerate_fsdp.yaml")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f.read(1_000_000))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"--accelerate-config {path} cannot be read as YAML ({first}): "
                         "pass an accelerate config file such as configs/accelerate_fsdp.yaml") from None
    if not isinstance(cfg, dict):
        raise InputError(f"--accelerate-config {path} is not a mapping of settings: "
                         "pass an accelerate config file such as configs/accelerate_fsdp.yaml")
    fsdp = cfg.get("fsdp_config") if isinstance(cfg.get("fsdp_config"), dict) else {}
    if not cuda and str(cfg.get("distributed_type", "")).upper() == "FSDP":
        on = [k for k in CPU_FSDP_OFF if fsdp.get(k) is True or str(fsdp.get(k)).lower() == "true"]
        if on:
            raise InputError(f"--accelerate-config {path} sets {' and '.join(f'{k}: true' for k in on)}, which FSDP "
                             "does not support on CPU processes (no CUDA here): set them to false for a CPU run "
                             "(docs/training.md, \"FSDP on CPU\"), or run on GPUs")
    return cfg


def fsdp_on_cpu_note(config_file: str | None, cuda: bool) -> str | None:
    """What accelerate makes of an FSDP config without GPUs, said before the run starts."""
    if not config_file or cuda:
        return None
    cfg = check_accelerate_config(config_file, cuda)
    if str(cfg.get("distributed_type", "")).upper() != "FSDP":
        return None
    return ("note: accelerate runs an FSDP config on CPU processes as DDP (it shards for GPU processes only): "
            "each process holds the whole student; the record's settings say sharding \"ddp\"")


def shown(cmd: list[str]) -> str:
    """The command as a user would type it (torchrun / accelerate launch rather than python -m ...)."""
    words = list(cmd)
    if words[1:3] == ["-m", "torch.distributed.run"]:
        words = ["torchrun"] + words[3:]
    elif words[1:3] == ["-m", "accelerate.commands.launch"]:
        words = ["accelerate", "launch"] + words[3:]
    return shlex.join(words)
