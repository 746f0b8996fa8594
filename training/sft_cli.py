"""The command line of one training run: the options `advisor train` shares with
`python -m capacity_advisor.training.sft` (`run_options`), and that command itself (`main`, run by
`python -m capacity_advisor.training.sft` and by this module's own `__main__`; torchrun and accelerate launch start it in every process).
"""

from __future__ import annotations

import os
import sys

import click

from capacity_advisor.core.errors import InputError
from capacity_advisor.models.loading import DEVICES, DTYPES
from capacity_advisor.training import sft
from capacity_advisor.training.manifest import load_manifest
from capacity_advisor.training.race import race_manifests
from capacity_advisor.training.run_check import with_overrides


def run_options(f):
    """The options of one training run, shared by `advisor train` and `python -m capacity_advisor.training.sft`
    (the command torchrun and accelerate launch start in every process)."""
    for option in reversed([
        click.option("--records", default=None,
                     help="Records store to append the RunRecord to (default: $ADVISOR_HOME/records.jsonl)."),
        click.option("--device", default="auto", type=click.Choice(DEVICES), show_default=True),
        click.option("--dtype", default="auto", type=click.Choice(DTYPES), show_default=True,
                     help="auto: fp32 on CPU, bf16 (else fp16 mixed precision) on GPU."),
        click.option("--threads", default=0, show_default=True, type=click.IntRange(0, 4096), help="Torch CPU threads per process (0: torch's default)."),
        click.option("--epochs", default=None, type=float,
                     help="Override the manifest's epoch budget (training.epochs); the run is then another run."),
        click.option("--max-steps", default=None, type=int,
                     help="Override training.max_steps: stop after this many optimizer steps."),
    ]):
        f = option(f)
    return f


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--manifest", required=True, help="recommendation.json (the manifest written by `advisor recommend`).")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Run folder (checkpoints, eval.jsonl, record.json); a rerun resumes.")
@run_options
# a segment of a race launched over several processes (training.race): the run of one raced set,
# paused after N evaluations, kept out of the store until it has won, its best checkpoint kept
@click.option("--race-set", type=click.Choice(["high", "low"]), default=None, hidden=True)
@click.option("--pause-after-evals", type=click.IntRange(1, None), default=None, hidden=True)
@click.option("--race-eval-at", default=None, hidden=True)
def main(manifest, out, records, device, dtype, threads, epochs, max_steps, race_set, pause_after_evals, race_eval_at):
    """Full SFT from a manifest; the same command under torchrun / accelerate launch runs data-parallel."""
    from capacity_advisor.training.callbacks import end_process_group

    try:
        if race_eval_at and race_set is None:
            raise InputError("--race-eval-at goes with --race-set (training.race passes both)")
        if race_set is not None:
            at = race_shares(race_eval_at)
            raced = race_manifests(with_overrides(load_manifest(manifest), epochs=epochs, max_steps=max_steps), at)
            sft.run_sft(raced[race_set], out, device=device, dtype=dtype, threads=threads, store=False,
                        keep_best=True, pause_after_evals=pause_after_evals)
        else:
            sft.run_sft(manifest, out, records=records, device=device, dtype=dtype, threads=threads, epochs=epochs,
                        max_steps=max_steps)
    except InputError as err:
        if int(os.environ.get("RANK", "0")) == 0:
            click.echo(f"error: {err}", err=True)
        sys.exit(2)
    # every rank has passed the run's last barrier: the group goes before the interpreter does (a
    # failed run exits at once instead, since a peer may never reach another collective)
    end_process_group()


def race_shares(text: str | None) -> list[float] | None:
    """The shares of --race-eval-at (comma-separated; training.race passes them), checked."""
    if not text:
        return None
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        shares = []
    if not shares or not all(0 < x <= 1 for x in shares):
        raise InputError(f"--race-eval-at {text[:80]!r} must be shares of the budget in (0, 1], comma-separated")
    return shares


if __name__ == "__main__":
    main()
