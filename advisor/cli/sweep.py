"""`advisor lab calibrate` and the pipeline around the lab's sweep: `sweep` (one calibration per
pool source), `publish` and `replay` (the committed calibration and the predictor's records),
`stash` and `restore` (what took long, carried in the repository), `report` (what a sweep shows).
Registered in the `advisor lab` group by cli/lab.py.

    advisor lab calibrate --out runs/cal --jobs 2
    advisor lab report calibration/teacher
    advisor lab sweep --work runs/sources --publish calibration/lab2 --jobs 2
    advisor lab publish runs/cal-teacher calibration/teacher
    advisor lab replay calibration/teacher calibration/scripted ... --out calibration/records.jsonl
    advisor lab stash --sources NAME        advisor lab restore --sources NAME

`advisor calibrate` (your pool, your proxies: cli/proxies.py) takes other flags than the lab sweep;
given here, each is refused in one line naming that verb (`options.TwinCommand`).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from capacity_advisor.advisor.calibration.grid import CalibrateConfig
from capacity_advisor.advisor.calibration.sweep import lab_sweep
from capacity_advisor.advisor.cli.options import (
    TwinCommand, field_option, floats, given_on_command_line, ints, json_option, names, take,
)
from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table, quiet_libraries
from capacity_advisor.advisor.lab.publish import publish
from capacity_advisor.advisor.lab.replay import ReplayJob, replay_records
from capacity_advisor.advisor.lab.report import write_report
from capacity_advisor.advisor.lab.sources import listed, run_sources, source_names, stash_work
from capacity_advisor.advisor.lab.stash import restore_sources
from capacity_advisor.probes.recipe import MAX_SETTING, flag

WORK = "runs/sources"  # where the sweep's sources run, one folder each
STASH_DIR = "calibration/in-progress"  # where a source in progress is stashed


def own_pool_flags(flags: list[str]) -> str:
    """The line that refuses `advisor calibrate`'s flags given to the lab sweep."""
    return (f"{', '.join(flags)} {'belong' if len(flags) > 1 else 'belongs'} to `advisor calibrate` (your pool, "
            "your proxy students): `advisor lab calibrate` is the lab sweep, on the lab's teacher pools and students")


@click.command("calibrate", cls=TwinCommand, twin=("calibrate",), refusal=own_pool_flags)
@field_option(CalibrateConfig, "out", "--out", "-o", type=click.Path(file_okay=False))
@field_option(CalibrateConfig, "sizes", help="Comma-separated ladder students (default: the whole ladder).")
@field_option(CalibrateConfig, "seeds", help="Pool draws and data orders, ranked by summed log-prob.")
@field_option(CalibrateConfig, "builds",
              help="Each student's pretraining builds: 0 is the ladder's own, B pretrains lab:NAME+bB from seed B (e.g. 1,2).")
@field_option(CalibrateConfig, "mean_seeds", help="Seeds that also run the mean-ranked (GRAPE) arm; empty for none.")
@field_option(CalibrateConfig, "tasks")
@field_option(CalibrateConfig, "epochs", help="The longest budget.")
@field_option(CalibrateConfig, "n_train", help="Problems per teacher pool.")
@field_option(CalibrateConfig, "n_eval", help="Held-out problems of the full runs' evaluations.")
@field_option(CalibrateConfig, "candidates", help="Teacher samples per problem.")
@field_option(CalibrateConfig, "probe_steps", help="The longest probe; shorter ones are replayed from its prefix.")
@field_option(CalibrateConfig, "jobs", help="Units in parallel, one torch thread each.")
@field_option(CalibrateConfig, "measure_every",
              help="The full runs' scoring measures (answer log-likelihood, teacher NLL, base drift, teacher view) at every "
                   "Nth evaluation and at whole epochs; accuracy at every one. 1: all of them at every evaluation.")
@field_option(CalibrateConfig, "teacher",
              help="The lab model that samples the pools (lab:teacher, lab:teacher-xl), or a scripted teacher: 'program' (one reasoning procedure per response), 'explore' (half its responses checked by a second procedure) or 'terse' (one response of each problem the answer alone).")
@field_option(CalibrateConfig, "temperature", help="The teacher model's sampling temperature.")
@field_option(CalibrateConfig, "budget_runs", help="Also train each set of the first seed as runs of just these epochs, e.g. 1,2.")
@field_option(CalibrateConfig, "schedules", help="Options beyond D_high / D_low / D_mixed, e.g. mixed@0.25,mixed@0.75,curriculum@2.")
@field_option(CalibrateConfig, "quick",
              help="Tiny settings (one small student, one seed, one epoch, the scripted teacher) for tests; the flags "
                   "given beside it replace theirs.")
@json_option
@click.pass_context
def calibrate(ctx, as_json, **kw):
    """The lab sweep: teacher pools, probes and full high/low/mixed runs — RunRecords for `advisor fit`."""
    quiet_libraries()
    for name, parse in (("sizes", names), ("seeds", ints), ("builds", ints), ("mean_seeds", ints), ("tasks", names),
                        ("budget_runs", floats), ("schedules", names)):
        kw[name] = parse(kw[name], f"--{name.replace('_', '-')}")
    result = lab_sweep(take(CalibrateConfig, kw), given_on_command_line(ctx),
                       log=lambda m: console.print(m, highlight=False))
    if as_json:
        emit_json(result)
    else:
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s)")


@click.command()
@click.option("--sizes", default=None, help="Comma-separated lab model names, each optionally NAME+bB "
              "(default: teacher,teacher-xl, unless --sources is given).")
@click.option("--sources", default=None, help="Comma-separated sources of `advisor lab sweep` (or 'all') whose "
              "finished units to stash as STASH_DIR/NAME.tar.gz.")
@click.option("--work", default=WORK, show_default=True, type=click.Path(file_okay=False), help="The sweep's folder.")
@click.option("--stash-dir", default=STASH_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Folder of the sources' stashes.")
@json_option
def stash(sizes, sources, work, stash_dir, as_json):
    """Keep in the repository what took long: lab builds (models/lab/weights: each finished build, else
    its latest pretraining checkpoint) and the finished units of the sweep's sources, so a fresh clone
    uses or resumes them instead of starting over."""
    rows = stash_work(sizes, sources, Path(work), Path(stash_dir), say=console.print)
    if as_json:
        emit_json(rows)


@click.command()
@click.option("--sources", default=None, help="Comma-separated sources of `advisor lab sweep` (default: every one).")
@click.option("--work", default=WORK, show_default=True, type=click.Path(file_okay=False), help="The sweep's folder.")
@click.option("--stash-dir", default=STASH_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Folder of the sources' stashes (NAME.tar.gz).")
@json_option
def restore(sources, work, stash_dir, as_json):
    """Unpack the stashed sources into the sweep's folder (each one not there yet), so the sweep skips
    their finished units."""
    done = restore_sources(Path(stash_dir), Path(work), source_names(sources))
    if as_json:
        emit_json({"restored": done, "work": work})
    else:
        console.print(f"restored into {work}: {', '.join(done) or 'nothing (no stash, or the source is already there)'}")


@click.command()
@click.argument("calibration", type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, type=click.Path(file_okay=False),
              help="Folder for results.json, results.md and curves-TASK-RANKING.png (default: CALIBRATION/report).")
@json_option
def report(calibration, out, as_json):
    """What a calibration sweep shows, per student: D_high vs D_low by epoch, teacher view, repetition."""
    out = out or str(Path(calibration) / "report")
    results = write_report(calibration, out)
    if as_json:
        emit_json([{k: g[k] for k in ("task", "score", "size", "n_params", "shape", "summary")} for g in results["groups"]])
        return
    t = Table(title=f"Lab report ({out})", title_justify="left")
    for col in ("task", "ranking", "student", "params", "acc ep1 high/low", "acc last ep high/low", "D_low overtakes",
                "teacher view moved high/low", "repetition high/low"):
        t.add_column(col)
    for g in results["groups"]:
        s = g["summary"]
        if not s:
            continue
        t.add_row(g["task"], g["score"], g["size"], f"{g['n_params']:,}",
                  f"{_two(s['acc_epoch1_high'])} / {_two(s['acc_epoch1_low'])}",
                  f"{_two(s['acc_last_epoch_high'])} / {_two(s['acc_last_epoch_low'])}",
                  f"{s['low_overtakes_from_epoch']:g}" if s["low_overtakes_from_epoch"] else "never",
                  f"{_fmt(s['teacher_view_drop_high'])} / {_fmt(s['teacher_view_drop_low'])}",
                  f"{_two(s['repetition_mean_high'])} / {_two(s['repetition_mean_low'])}")
    console.print(t)


@click.command()
@click.option("--sources", default=None, help="Comma-separated sources to run (default: every one, in order; --list shows them).")
@click.option("--work", default=WORK, show_default=True, type=click.Path(file_okay=False),
              help="Folder of the sources' sweeps, one per source (resumable).")
@click.option("--jobs", default=2, show_default=True, type=click.IntRange(1, 1024), help="Units in parallel.")
@click.option("--publish", "publish_to", default=None, type=click.Path(file_okay=False),
              help="Publish each source into PUBLISH/NAME as it completes.")
@click.option("--restore", "restore_from", default=None, type=click.Path(file_okay=False),
              help="First unpack DIR/NAME.tar.gz (advisor lab stash) for each source not in WORK yet.")
@click.option("--list", "list_only", is_flag=True, help="Show the sources and their settings, in run order, and stop.")
@json_option
def sweep(sources, work, jobs, publish_to, restore_from, list_only, as_json):
    """The lab's pool-source sweep: one calibration per pool source, each published as it completes."""
    names_ = source_names(sources)
    if list_only:
        rows = listed(names_, Path(work), jobs)
        if as_json:
            emit_json(rows)
        else:
            for row in rows:
                click.echo(" ".join(f"{k}={v}" for k, v in row.items()))
        return

    def log(msg: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)

    done = run_sources(names_, Path(work), jobs, publish_to and Path(publish_to), restore_from and Path(restore_from), log)
    if as_json:
        emit_json(done)


@click.command("publish")
@click.argument("sweep_folder", metavar="SWEEP", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@json_option
def publish_cmd(sweep_folder, dest, as_json):
    """Keep what a calibration sweep measured, as the repository does: records, evaluations, probe
    reports, one compressed file each (no checkpoints, datasets or machine paths)."""
    done = publish(sweep_folder, dest)
    if as_json:
        emit_json(done)
    else:
        console.print(kv_table("Published", done))


@click.command("replay")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="The replayed records (JSONL).")
@field_option(ReplayJob, "steps", flag("steps"), type=click.IntRange(1, MAX_SETTING),
              help="Steps of the probe whose features to replay (a prefix of every probe that ran).")
@field_option(ReplayJob, "eval_problems", flag("eval_problems"), type=click.IntRange(1, MAX_SETTING),
              help="Held-out problems of that probe (the first N of each probe's).")
@json_option
def replay(as_json, **kw):
    """The folders' records, in order, with the features a shorter probe would have measured (what
    `advisor fit` takes: calibration/records.jsonl is this over the committed sources)."""
    done = replay_records(take(ReplayJob, kw, folders=tuple(kw.pop("folders"))))
    if as_json:
        emit_json(done)
    else:
        console.print(f"{done['records']} records with the features of a {done['steps']}-step probe on "
                      f"{done['eval_problems']} problems: {done['out']}")


def _fmt(v) -> str:
    return "—" if v is None else f"{v:+.2f}"


def _two(v) -> str:
    return "—" if v is None else f"{v:.2f}"
