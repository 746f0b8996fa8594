"""`advisor train` as one library call: what to do with a recommendation manifest, decided once, and
done.

    train_manifest(RunRequest("rec/recommendation.json", "runs/m-high"))             # the planned race, else one run
    train_manifest(RunRequest("rec/recommendation.json", "runs/race"), race=0.5)     # race D_high against D_low
    train_manifest(RunRequest("rec/recommendation.json", ""), export_dir="out/")     # the launchers' configs

The decision (`plan_training`): `--race F` races D_high against D_low to a share F of the budget;
`--export DIR` writes the data and the TRL / LLaMA-Factory / axolotl configs and trains nothing; a
manifest whose recommendation planned a race (its `race`: the policy's gate opened) is raced as
planned; otherwise the recommended set is trained, in this process or launched over `nproc`
processes (`training.run_manifest`). `--no-race` trains the recommended set alone though a race is
planned. `--race-k` / `--race-margin` set when a race stops, so they go with a race; given with a
planned race, they stop it early on a lead.

Every check a run makes (manifest, run folder, batch split, device, data files) is made before its
launch command is said, and a dry run makes exactly those, so what it accepts, the run accepts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_dir
from capacity_advisor.training.export import FORMATS, export
from capacity_advisor.training.launch import launch_command
from capacity_advisor.training.manifest import load_manifest
from capacity_advisor.training.race import TIE_WORDS, RaceRule, check_race, run_race
from capacity_advisor.training.record import best_checkpoint
from capacity_advisor.training.run_check import with_overrides
from capacity_advisor.training.run_manifest import RunRequest, run_manifest

RACE_STOPS = {"k": "--race-k", "margin": "--race-margin", "patient": "--race-patient",
              "tie": "--race-tie", "hold": "--race-hold"}  # when a race stops
LEAD_STOPS = ("k", "margin", "patient")  # ... those that say what counts as a lead


@dataclass(frozen=True)
class Training:
    """What `advisor train` was asked to do, decided: `action` is "race", "export" or "run"; a race's
    rule, and whether the manifest planned it."""

    action: str
    rule: RaceRule | None = None
    planned: bool = False


@dataclass(frozen=True)
class Trained:
    """What `advisor train` did, or with `dry_run` would do: `summary` (its --json output), and what
    a person is shown: a table (`title`, `rows`; no title: none) and a line after it (`message`)."""

    action: str
    summary: dict
    title: str | None = None
    rows: dict = field(default_factory=dict)
    message: str | None = None


def _quiet(line: str) -> None:
    return None


def planned_race(manifest: str) -> RaceRule | None:
    """The race a manifest plans (`race`: the recommendation's gate opened), as the rule that runs it:
    it stops on a clear lead only where the plan names `k` (the gate's race is an adaptive one)."""
    race = load_manifest(manifest).race
    if race is None:
        return None
    k, margin, tie, hold = race.get("k"), race.get("margin"), race.get("tie"), race.get("hold")
    return RaceRule(fraction=float(race["fraction"]), k=None if k is None else int(k),
                    margin=RaceRule.margin if margin is None else float(margin), wait=race.get("wait"),
                    patient=bool(race.get("patient", False)), tie=None if tie is None else float(tie),
                    hold=0.0 if hold is None else float(hold))


def plan_training(manifest: str, race: float | None = None, no_race: bool = False, stops: dict | None = None,
                  export_dir: str | None = None, k: int | None = RaceRule.k,
                  margin: float = RaceRule.margin) -> Training:
    """What to do with `manifest`: `race` (--race F) races with `k` and `margin`; `stops` are the race
    settings the user gave ({"k" | "margin" | "patient" | "tie": value}), refused where no race runs."""
    stops = dict(stops or {})
    if race is not None and no_race:
        raise InputError("--race and --no-race contradict each other: give one")
    planned = None if (no_race or race is not None or export_dir) else planned_race(manifest)
    if stops and race is None and planned is None:
        shown = " and ".join(RACE_STOPS[n] for n in stops)
        why = ("--no-race trains one set" if no_race else "--export trains nothing" if export_dir
               else "this manifest plans no race; --race F starts one")
        raise InputError(f"{shown} {'set' if len(stops) > 1 else 'sets'} when a race stops, and this command runs "
                         f"none ({why}): drop {'them' if len(stops) > 1 else 'it'}")
    if planned is not None and stops:
        lead = [n for n in stops if n in LEAD_STOPS]
        if planned.k is None and lead and "k" not in stops:
            shown = " and ".join(RACE_STOPS[n] for n in lead)
            raise InputError(f"{shown} {'set' if len(lead) > 1 else 'sets'} what counts as a lead, and the planned "
                             "race stops on none: give --race-k N too (stop once one set leads N evaluations in a row)")
        planned = replace(planned, **stops)  # a planned race, stopped early on a lead as asked
    if race is not None:
        return Training("race", RaceRule(fraction=race, k=k, margin=margin, patient=bool(stops.get("patient", False)),
                                         tie=stops.get("tie"), hold=float(stops.get("hold", 0.0))))
    if export_dir:
        return Training("export")
    if planned is not None:
        return Training("race", planned, planned=True)
    return Training("run")


def train_manifest(req: RunRequest, race: float | None = None, no_race: bool = False, stops: dict | None = None,
                   export_dir: str | None = None, formats: str = "all", dry_run: bool = False,
                   k: int | None = RaceRule.k, margin: float = RaceRule.margin, say: Callable[[str], None] = _quiet
                   ) -> Trained:
    """`advisor train`: decided (`plan_training`), then the race, the export or the run; `say` hears
    each launch command, and a race's plan on a dry run."""
    training = plan_training(req.manifest, race, no_race, stops, export_dir, k, margin)
    if training.action == "race":
        if export_dir:
            raise InputError("--race trains; it does not combine with --export")
        return train_race(req, training.rule, dry_run, training.planned, say)
    if training.action == "export":
        return export_manifest(req, export_dir, formats, dry_run)
    return train_run(req, dry_run, say)


def export_manifest(req: RunRequest, export_dir: str, formats: str = "all", dry_run: bool = False) -> Trained:
    """`--export DIR`: the data and the launchers' configs with the manifest's settings, no training."""
    chosen = FORMATS if formats == "all" else tuple(f.strip() for f in formats.split(",") if f.strip())
    m = with_overrides(load_manifest(req.manifest), epochs=req.epochs, max_steps=req.max_steps)
    written = export(m, export_dir, chosen, manifest_path=req.manifest, dry_run=dry_run)
    if dry_run:
        return Trained("export", {"would_write": [str(p) for p in written]},
                       message=f"export checked; it would write {len(written)} files in {export_dir}: "
                               + ", ".join(p.name for p in written))
    note = None
    if m.race is not None:
        note = (f"the recommendation plans a race of D_high against D_low (train-high.jsonl, train-low.jsonl here); "
                f"these configs train D_{m.strategy} alone; the race runs through `advisor train {req.manifest} "
                "--out RUN`")
    return Trained("export", {"written": [str(p) for p in written], **({"note": note} if note else {})},
                   title="Export", rows={p.name: str(p) for p in written}, message=note and f"note: {note}")


def train_run(req: RunRequest, dry_run: bool = False, say: Callable[[str], None] = _quiet) -> Trained:
    """One run of the manifest (`training.run_manifest`: in process, or launched over --nproc)."""
    if not req.out:
        raise InputError("--out is required (the run folder), unless --export is given")
    m = with_overrides(load_manifest(req.manifest), epochs=req.epochs, max_steps=req.max_steps)
    said: list[str] = []
    record = run_manifest(req, dry_run, say=lambda line: (said.append(line), say(line)))
    if record is None:  # a dry run: every check passed
        return Trained("run", {"dry_run": True, "out": req.out, "would_run": said})
    summary = {"record": str(Path(req.out) / "record.json"), "curve": str(Path(req.out) / "curve.png"),
               "best_accuracy": record.get("best_accuracy"), "final_accuracy": record.get("final_accuracy"),
               "evaluations": len(record.get("evals", [])), "seconds": record["provenance"]["seconds"],
               "final_checkpoint": record["provenance"]["final_checkpoint"],
               "best_checkpoint": best_checkpoint(Path(req.out), record)}
    return Trained("run", summary, title=f"Run: {m.model_spec} on {m.strategy} data, {m.training.epochs:g} epochs",
                   rows=summary)


def train_race(req: RunRequest, rule: RaceRule, dry_run: bool = False, planned: bool = False,
               say: Callable[[str], None] = _quiet) -> Trained:
    """`--race F`, or the race the manifest plans (`planned`): training.race, every input checked
    first (the same checks with a dry run, which says the race it would run)."""
    what = "the manifest plans a race, which" if planned else "--race"
    if not req.out:
        raise InputError(f"--out is required ({what} writes race.json, race/high and race/low there)")
    if req.nproc < 1:
        raise InputError(f"--nproc {req.nproc} must be at least 1")
    check_writable_dir(req.out, "--out")
    _, runs, *_ = check_race(req.manifest, req.out, rule, req.device, req.dtype, req.epochs, req.max_steps,
                             world=req.nproc)
    evaluated_at = runs["high"].training.eval_at or []
    launch = None
    if req.nproc > 1 or req.accelerate_config:  # each run's segments launched over the processes
        import torch

        launch = {"nproc": req.nproc, "launcher": req.launcher, "accelerate_config": req.accelerate_config}
        launch_command(req.manifest, req.out, req.nproc, req.launcher, req.accelerate_config,
                       cuda=torch.cuda.is_available())  # the launcher and its config refused now, not mid-race
    if dry_run:
        stop = (f", or when one set leads by more than {rule.margin:g} (and its noise) at {rule.k} evaluations in a row"
                + (" (D_high only once D_low is not gaining)" if rule.patient else "") if rule.k is not None else "")
        wait = f" (up to {rule.wait:.0%} while D_low is behind and gaining)" if rule.wait else ""
        tie = f"; at {rule.tie:.0%} of the budget {TIE_WORDS}" if rule.tie is not None else ""
        tie += f"; D_low kept only on a lead beyond {rule.hold:g} standard errors" if rule.hold else ""
        shares = ", ".join(f"{x:.0%}" for x in evaluated_at)
        evaluated = f"; both runs also evaluated at {shares} of the budget, so it stops there" if shares else ""
        say(f"race of D_high against D_low in {req.out}: stop at {rule.fraction:.0%} of the budget{wait}{stop}{tie}"
            + evaluated
            + (f"; each run launched over {req.nproc} processes ({req.launcher})" if launch else "")
            + ("; planned by the recommendation (--no-race trains the recommended set alone)" if planned else ""))
        return Trained("race", {"dry_run": True, "out": req.out, "race": asdict(rule), "evaluated_at": evaluated_at,
                                "planned": planned,
                                "launch": launch})
    summary = run_race(req.manifest, req.out, rule, records=req.records, device=req.device, dtype=req.dtype,
                       threads=req.threads, epochs=req.epochs, max_steps=req.max_steps, launch=launch)
    shown = {"winner": summary["winner"], "stopped": summary["stopped"]["reason"],
             "stopped_at_step": summary["stopped"]["step"], "share_of_budget": summary["stopped"]["share"],
             "record": summary["record"], "race": summary["race_file"],
             "best_accuracy": summary["best_accuracy"], "final_accuracy": summary["final_accuracy"],
             "best_checkpoint": summary.get("best_checkpoint"), "extra_tokens": summary.get("extra_tokens")}
    return Trained("race", shown, title="Race: D_high against D_low", rows=shown)
