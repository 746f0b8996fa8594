"""`advisor train`: full SFT from a recommendation manifest (registered with `cli.add_command(train)`).

    advisor train rec/recommendation.json --out runs/m-high                 # one process (CPU or GPU)
    advisor train rec/recommendation.json --out runs/m-high --nproc 8       # torchrun, DDP
    advisor train rec/recommendation.json --out runs/m-high --nproc 8 --launcher accelerate \\
        --accelerate-config configs/accelerate_fsdp.yaml                       # FSDP for large students
    advisor train rec/recommendation.json --export out/ --format all         # data + TRL/LLaMA-Factory/axolotl configs
    advisor train rec/recommendation.json --out runs/try --max-steps 20     # a short try of the same recipe
    advisor train rec/recommendation.json --out runs/race --race 0.5        # race D_high against D_low, keep the leader
    advisor train rec/recommendation.json --out runs/m-high --no-race       # the recommended set alone, though a race is planned

A manifest whose recommendation planned a race (its `race`: the policy's gate opened) is raced as
planned without a flag: D_high against D_low to the planned share of the budget, the leader kept
and trained to the end (no early stop on a lead). `--race F` races any manifest that names both
sets; `--no-race` trains the recommended set alone. What to do is decided by the library
(`advisor.train.train_manifest`); this module parses the flags and prints what it returns.
"""

from __future__ import annotations

import click

from capacity_advisor.advisor.cli import report
from capacity_advisor.advisor.cli.options import Finite, field_option, json_option, take
from capacity_advisor.advisor.cli.ui import emit_json, quiet_libraries
from capacity_advisor.advisor.train import train_manifest
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.launch import LAUNCHERS
from capacity_advisor.training.race import RaceRule
from capacity_advisor.training.run_manifest import RunRequest
from capacity_advisor.training.sft_cli import run_options


@click.command()
@click.argument("manifest", type=click.Path(dir_okay=False))
@field_option(RunRequest, "out", "--out", "-o", type=click.Path(file_okay=False),
              help="Run folder: checkpoints, eval.jsonl, curve.png, record.json. A rerun resumes.")
@field_option(RunRequest, "nproc",
              help="Processes (GPUs, or CPU processes with torchrun); > 1 launches data-parallel.")
@field_option(RunRequest, "launcher", type=click.Choice(LAUNCHERS), help="Multi-process launcher for --nproc > 1.")
@field_option(RunRequest, "accelerate_config", type=click.Path(dir_okay=False, exists=True),
              help="accelerate config file, e.g. configs/accelerate_fsdp.yaml (with --launcher accelerate).")
@run_options
@click.option("--dry-run", is_flag=True, help="Validate the manifest and print the launch command without running it.")
@click.option("--export", "export_dir", default=None, type=click.Path(file_okay=False),
              help="Write the dataset and TRL / LLaMA-Factory / axolotl config snippets here instead of training.")
@click.option("--format", "formats", default="all", show_default=True, help="Export formats: trl,llamafactory,axolotl or all.")
@field_option(RaceRule, "fraction", "--race", type=float, metavar="F",
              help="Race D_high against D_low (OUT/race/high, OUT/race/low), stop when one leads or at F of the "
                   "budget (0 < F <= 1), and continue the leader to the end; OUT/race.json says what happened.")
@field_option(RaceRule, "k", "--race-k", help="--race: evaluations in a row one set must lead (provisional).")
@field_option(RaceRule, "margin", "--race-margin",
              help="--race: least mean paired accuracy difference that counts as a lead (0.05 = 5 points; provisional).")
@click.option("--race-patient", "patient", is_flag=True,
              help="--race: a D_high lead stops the race only once D_low has had three evaluations and is not gaining "
                   "(a slow starter is not ruled out early); a D_low lead stops it at once.")
@field_option(RaceRule, "tie", "--race-tie", metavar="T",
              help="--race: at the first evaluation at or past T of the budget (below F), stop for D_high unless D_low "
                   "has led at some evaluation or is gaining on it (a D_low that shows nothing early costs no more).")
@field_option(RaceRule, "hold", "--race-hold", type=Finite(0, 10), metavar="Z",
              help="--race: where the race stops without a lead, keep D_low only if its best accuracy leads D_high's by "
                   "more than Z standard errors over the held-out problems (0: any lead; D_high costs nothing to keep).")
@click.option("--no-race", is_flag=True,
              help="Train the recommended set alone, even where the manifest plans a race (its `race`).")
@json_option
@click.pass_context
def train(ctx, manifest, dry_run, export_dir, formats, fraction, k, margin, patient, tie, hold, no_race, as_json, **kw):
    """Full SFT on the recommended data: the paper's protocol, checkpoints, resume, a RunRecord."""
    try:
        stops = {name: value for name, value in (("k", k), ("margin", margin), ("patient", patient), ("tie", tie),
                                                             ("hold", hold))
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
        quiet_libraries()
        result = train_manifest(take(RunRequest, kw, manifest=manifest), race=fraction, no_race=no_race, stops=stops,
                                export_dir=export_dir, formats=formats, dry_run=dry_run, k=k, margin=margin,
                                say=lambda line: click.echo(line, err=True))
    except InputError as e:  # also when called outside the advisor group (tests, other CLIs)
        click.echo(f"error: {e}", err=True)
        ctx.exit(2)
    if as_json:
        emit_json(result.summary)
    else:
        report.trained(result)
