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
sets; `--no-race` trains the recommended set alone.

Every check the run makes (manifest, run folder, batch split, device, data files) is made before
the launch command is printed, and `--dry-run` makes exactly those, so what it accepts, the run accepts.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import click

from capacity_advisor.core.errors import InputError
from capacity_advisor.advisor.cli.options import field_option, json_option, take
from capacity_advisor.training.launch import LAUNCHERS
from capacity_advisor.training.race import RaceRule
from capacity_advisor.training.record import best_checkpoint
from capacity_advisor.training.run_manifest import RunRequest, run_manifest
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
@click.option("--no-race", is_flag=True,
              help="Train the recommended set alone, even where the manifest plans a race (its `race`).")
@json_option
@click.pass_context
def train(ctx, manifest, dry_run, export_dir, formats, fraction, k, margin, no_race, as_json, **kw):
    """Full SFT on the recommended data: the paper's protocol, checkpoints, resume, a RunRecord."""
    try:
        req = take(RunRequest, kw, manifest=manifest)
        if fraction is not None and no_race:
            raise InputError("--race and --no-race contradict each other: give one")
        planned = None if (no_race or fraction is not None or export_dir) else planned_race(req.manifest)
        stops = {name: value for name, value in (("k", k), ("margin", margin))
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
        if stops and fraction is None and planned is None:
            shown = " and ".join("--race-k" if n == "k" else "--race-margin" for n in stops)
            why = ("--no-race trains one set" if no_race else "--export trains nothing" if export_dir
                   else "this manifest plans no race; --race F starts one")
            raise InputError(f"{shown} {'set' if len(stops) > 1 else 'sets'} when a race stops, and this command runs "
                             f"none ({why}): drop {'them' if len(stops) > 1 else 'it'}")
        if planned is not None and stops:
            if planned.k is None and "k" not in stops:
                raise InputError("--race-margin sets what counts as a lead, and the planned race stops on none: "
                                 "give --race-k N too (stop once one set leads N evaluations in a row)")
            planned = replace(planned, **stops)  # a planned race, stopped early on a lead as asked
        if fraction is not None:
            _race(req, RaceRule(fraction=fraction, k=k, margin=margin), export_dir, dry_run, as_json)
        elif export_dir:
            _export(req, export_dir, formats, as_json, dry_run)
        elif planned is not None:
            _race(req, planned, None, dry_run, as_json, planned=True)
        else:
            _train(req, dry_run, as_json)
    except InputError as e:  # also when called outside the advisor group (tests, other CLIs)
        click.echo(f"error: {e}", err=True)
        ctx.exit(2)


def planned_race(manifest: str) -> RaceRule | None:
    """The race a manifest plans (`race`: the recommendation's gate opened), as the rule that runs it."""
    from capacity_advisor.training.manifest import load_manifest

    race = load_manifest(manifest).race
    return None if race is None else RaceRule(fraction=float(race["fraction"]), k=None, wait=race.get("wait"))


def shown_best(best: dict | None) -> str | None:
    """The best checkpoint as one line of a report: the folder to load, and what it measured."""
    if not best:
        return None
    where = best["path"] or "(its checkpoint was not kept)"
    return f"{where} (step {best['step']}, epoch {best['epoch']:.2f}, accuracy {best['accuracy']:.3g})"


def _export(req: RunRequest, export_dir: str, formats: str, as_json: bool, dry_run: bool = False) -> None:
    """`--export DIR`: the data and the launchers' configs with the manifest's settings, no training."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table, quiet_libraries
    from capacity_advisor.training.export import FORMATS, export
    from capacity_advisor.training.manifest import load_manifest
    from capacity_advisor.training.run_check import with_overrides

    quiet_libraries()
    chosen = FORMATS if formats == "all" else tuple(f.strip() for f in formats.split(",") if f.strip())
    m = with_overrides(load_manifest(req.manifest), epochs=req.epochs, max_steps=req.max_steps)
    written = export(m, export_dir, chosen, manifest_path=req.manifest, dry_run=dry_run)
    if dry_run:
        if as_json:
            emit_json({"would_write": [str(p) for p in written]})
        else:
            click.echo(f"export checked; it would write {len(written)} files in {export_dir}: "
                       + ", ".join(p.name for p in written), err=True)
        return
    note = None
    if m.race is not None:
        note = (f"the recommendation plans a race of D_high against D_low (train-high.jsonl, train-low.jsonl here); "
                f"these configs train D_{m.strategy} alone; the race runs through `advisor train {req.manifest} "
                "--out RUN`")
    if as_json:
        emit_json({"written": [str(p) for p in written], **({"note": note} if note else {})})
    else:
        console.print(kv_table("Export", {p.name: str(p) for p in written}))
        if note:
            click.echo(f"note: {note}", err=True)


def _train(req: RunRequest, dry_run: bool, as_json: bool) -> None:
    """One run of the manifest (`training.run_manifest`: in process, or launched over --nproc)."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table, quiet_libraries
    from capacity_advisor.training.manifest import load_manifest
    from capacity_advisor.training.run_check import with_overrides

    quiet_libraries()
    if not req.out:
        raise InputError("--out is required (the run folder), unless --export is given")
    m = with_overrides(load_manifest(req.manifest), epochs=req.epochs, max_steps=req.max_steps)
    said: list[str] = []
    record = run_manifest(req, dry_run, say=lambda line: (said.append(line), click.echo(line, err=True)))
    if record is None:  # a dry run: every check passed
        if as_json:
            emit_json({"dry_run": True, "out": req.out, "would_run": said})
        return
    summary = {"record": str(Path(req.out) / "record.json"), "curve": str(Path(req.out) / "curve.png"),
               "best_accuracy": record.get("best_accuracy"), "final_accuracy": record.get("final_accuracy"),
               "evaluations": len(record.get("evals", [])), "seconds": record["provenance"]["seconds"],
               "final_checkpoint": record["provenance"]["final_checkpoint"],
               "best_checkpoint": best_checkpoint(Path(req.out), record)}
    if as_json:
        emit_json(summary)
    else:
        console.print(kv_table(f"Run: {m.model_spec} on {m.strategy} data, {m.training.epochs:g} epochs",
                               {**summary, "best_checkpoint": shown_best(summary["best_checkpoint"])}))


def _race(req: RunRequest, rule: RaceRule, export_dir: str | None, dry_run: bool, as_json: bool,
          planned: bool = False) -> None:
    """`--race F`, or the race the manifest plans (`planned`): training.race, every input checked
    first (the same checks with --dry-run)."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table, quiet_libraries
    from capacity_advisor.core.files import check_writable_dir
    from capacity_advisor.training.race import check_race, run_race

    quiet_libraries()
    if export_dir:
        raise InputError("--race trains; it does not combine with --export")
    what = "the manifest plans a race, which" if planned else "--race"
    if not req.out:
        raise InputError(f"--out is required ({what} writes race.json, race/high and race/low there)")
    if req.nproc < 1:
        raise InputError(f"--nproc {req.nproc} must be at least 1")
    check_writable_dir(req.out, "--out")
    check_race(req.manifest, req.out, rule, req.device, req.dtype, req.epochs, req.max_steps, world=req.nproc)
    launch = None
    if req.nproc > 1 or req.accelerate_config:  # each run's segments launched over the processes
        import torch

        from capacity_advisor.training.launch import launch_command

        launch = {"nproc": req.nproc, "launcher": req.launcher, "accelerate_config": req.accelerate_config}
        launch_command(req.manifest, req.out, req.nproc, req.launcher, req.accelerate_config,
                       cuda=torch.cuda.is_available())  # the launcher and its config refused now, not mid-race
    if dry_run:
        stop = (f", or when one set leads by more than {rule.margin:g} (and its noise) at {rule.k} evaluations in a row"
                if rule.k is not None else "")
        wait = f" (up to {rule.wait:.0%} while D_low is behind and gaining)" if rule.wait else ""
        click.echo(f"race of D_high against D_low in {req.out}: stop at {rule.fraction:.0%} of the budget{wait}{stop}"
                   + (f"; each run launched over {req.nproc} processes ({req.launcher})" if launch else "")
                   + ("; planned by the recommendation (--no-race trains the recommended set alone)" if planned else ""),
                   err=True)
        if as_json:
            emit_json({"dry_run": True, "out": req.out, "race": asdict(rule), "planned": planned,
                       "launch": launch})
        return
    summary = run_race(req.manifest, req.out, rule, records=req.records, device=req.device, dtype=req.dtype,
                       threads=req.threads, epochs=req.epochs, max_steps=req.max_steps, launch=launch)
    shown = {"winner": summary["winner"], "stopped": summary["stopped"]["reason"],
             "stopped_at_step": summary["stopped"]["step"], "share_of_budget": summary["stopped"]["share"],
             "record": summary["record"], "race": summary["race_file"],
             "best_accuracy": summary["best_accuracy"], "final_accuracy": summary["final_accuracy"],
             "best_checkpoint": summary.get("best_checkpoint")}
    if as_json:
        emit_json(shown)
    else:
        console.print(kv_table("Race: D_high against D_low", {**shown, "best_checkpoint": shown_best(shown["best_checkpoint"])}))
