"""`advisor lab sweep`: the lab's pool-source sweep, one `advisor lab calibrate` per pool source.

    advisor lab sweep --list                                   # the sources, in the order they run
    advisor lab sweep --work runs/sources --publish calibration/lab2 --jobs 2

A pool source is a task family and the teacher that wrote its candidates: the scripted teacher
(`program`: correct responses by procedures drawn uniformly) or a lab teacher model sampled at a
temperature. Each source runs the ten ladder students on two seeds, summed ranking, 5 epochs of
D_high / D_low / D_mixed (COMMON below), into WORK/NAME; when a source is complete it is
published into PUBLISH/NAME (`advisor lab publish`). Everything resumes: run the same command
after a stop and finished units, runs and sources are skipped. `--sources NAME,...` runs some.

Two more entries (`...-builds`) are not new pool sources: they rerun the students `m`, `l`, `xl`
and `xxl` pretrained from two other seeds (`lab:NAME+b1`, `+b2`) on the pools of a source already
swept (the same pool draws: copied from WORK/<that source>/ when there, else sampled again, which
gives the same pools), so that the spread of a student's pattern over its pretraining builds is
measured beside the spread over seeds. Their students are pretrained `--jobs` at a time first.

A source takes hours and a later start may be on a fresh machine: `advisor lab stash` and
`advisor lab restore` (advisor.lab.stash) carry what a source in progress has finished.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.calibration.grid import CalibrateConfig
from capacity_advisor.advisor.calibration.sweep import check_sweep_folder, run_calibration
from capacity_advisor.advisor.lab.publish import publish
from capacity_advisor.advisor.lab.stash import restore_sources, stash
from capacity_advisor.advisor.lab.student import lab_names
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_dir, refuse_overwrite
from capacity_advisor.models.lab import committed
from capacity_advisor.models.lab.ladder import folder_of

COMMON = CalibrateConfig(seeds=(0, 1), mean_seeds=(), epochs=5, n_train=2000, n_eval=200, candidates=8)

# In run order: the scripted sources need no teacher model, so they run while the teachers build.
# Of these eight, every task family has two sources, every teacher two, every temperature two.
SOURCES: dict[str, dict] = {
    "modchain-program": dict(tasks=("modchain",), teacher="program", budget_runs=(1.0, 2.0)),
    "listmax-program": dict(tasks=("listmax",), teacher="program"),
    "modchain-teacher-xl-t1": dict(tasks=("modchain",), teacher="lab:teacher-xl", temperature=1.0, budget_runs=(1.0, 2.0)),
    "addition-teacher-t1": dict(tasks=("addition",), teacher="lab:teacher", temperature=1.0),
    "listmax-teacher-t0.7": dict(tasks=("listmax",), teacher="lab:teacher", temperature=0.7),
    "addition-teacher-xl-t0.7": dict(tasks=("addition",), teacher="lab:teacher-xl", temperature=0.7),
    "modchain-teacher-t1": dict(tasks=("modchain",), teacher="lab:teacher", temperature=1.0),
    "listmax-teacher-xl-t1": dict(tasks=("listmax",), teacher="lab:teacher-xl", temperature=1.0),
}
BUILD_SIZES = ("m", "l", "xl", "xxl")
# Other pretraining builds of four balanced students, on the pools of a scripted and a neural source.
SOURCES.update({
    f"{name}-builds": {**{k: v for k, v in SOURCES[name].items() if k != "budget_runs"}, "sizes": BUILD_SIZES,
                       "builds": (1, 2), "pools_from": name}
    for name in ("modchain-program", "modchain-teacher-xl-t1")
})
# The two families no lab model was pretrained on and the exploring scripted teacher (models.lab.tasks):
# new tasks and a new teacher kind for the held-out-task and held-out-teacher splits.
SOURCES.update({
    "digitsum-program": dict(tasks=("digitsum",), teacher="program"),
    "subtraction-explore": dict(tasks=("subtraction",), teacher="explore"),
    "digitsum-explore": dict(tasks=("digitsum",), teacher="explore"),
    "subtraction-program": dict(tasks=("subtraction",), teacher="program"),
    "listmax-explore": dict(tasks=("listmax",), teacher="explore"),
})
# The exploring teacher on the two pretrained families it had not met: pools where the gates the held-out
# source split cannot tell apart may differ (docs/results.md, "Pooling the held-out fits' bootstrap draws").
SOURCES.update({
    "modchain-explore": dict(tasks=("modchain",), teacher="explore"),
    "addition-explore": dict(tasks=("addition",), teacher="explore"),
})
# The terse teacher (a bare answer among worked solutions, so D_high is the bare answers under the sum
# ranking, as on the real student's pools) on a pretrained family and a new one: sources run after the
# gap scout's threshold was picked, to judge it where it was not chosen.
SOURCES.update({
    "subtraction-terse": dict(tasks=("subtraction",), teacher="terse"),
    "modchain-terse": dict(tasks=("modchain",), teacher="terse"),
})
# ... and on two more families, run after the gap scout shipped: sources none of the fits has seen, to
# judge the shipped predictor, the gap scout's variants and the refit on every committed source.
SOURCES.update({
    "listmax-terse": dict(tasks=("listmax",), teacher="terse"),
    "digitsum-terse": dict(tasks=("digitsum",), teacher="terse"),
})
LISTED = ("tasks", "teacher", "temperature", "seeds", "budget_runs", "sizes", "builds")  # what --list shows

Log = Callable[[str], None]


def source_names(text: str | None) -> list[str]:
    """The sources `--sources` names (comma-separated), every one when empty or `all`; InputError for
    a name that is none."""
    names = [n.strip() for n in (text or "").split(",") if n.strip() and n.strip() != "all"] or list(SOURCES)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise InputError(f"--sources: unknown source {', '.join(unknown)[:200]}; use names from {', '.join(SOURCES)}")
    return names


def config(name: str, work: Path, jobs: int) -> CalibrateConfig:
    return replace(COMMON, out=str(work / name), jobs=jobs, **{k: v for k, v in SOURCES[name].items() if k != "pools_from"})


def copy_pools(name: str, work: Path, log: Log) -> None:
    """Copy the pools of the source a `-builds` entry reruns, when that source's folder has them
    and this one has none yet (sampling them again would give the same pools, only slower)."""
    src = SOURCES[name].get("pools_from")
    if not src:
        return
    for task in SOURCES[name]["tasks"]:
        have, want = work / src / task / "pools", work / name / task / "pools"
        if have.is_dir() and not want.exists():
            shutil.copytree(have, want)
            log(f"{name}: copied the pools of {src}/{task}")


def wait_for_build(model: str, log: Log) -> None:
    """If another process is pretraining `model` (its temporary folder names a live process),
    wait for it instead of building it twice."""
    final = folder_of(model)
    said = False
    while not (final / "build.json").exists():
        live = []
        for tmp in final.parent.glob(f".{final.name}.tmp-*"):
            pid = tmp.name.rpartition("-")[2]
            try:
                os.kill(int(pid), 0)
                live.append(pid)
            except (ValueError, ProcessLookupError, PermissionError):
                continue
        if not live:
            return
        if not said:
            log(f"waiting for {model}, being built by process {live[0]}")
            said = True
        time.sleep(30)


def run_sources(names: list[str], work: Path, jobs: int, publish_to: Path | None = None,
                restore_from: Path | None = None, log: Log = lambda message: None) -> list[dict]:
    """Run (or resume) each source in turn, publishing each into PUBLISH/NAME as it completes.
    Every source's settings, the publish folder and the stashes to restore are checked, and the
    stashes unpacked, before the first source starts."""
    configs = {name: config(name, work, jobs) for name in names}
    for cfg in configs.values():
        cfg.validate()
    if publish_to is not None:
        check_writable_dir(publish_to, "--publish")
        for name, cfg in configs.items():  # publishing into a sweep's own folder would fail after its hours of work
            refuse_overwrite([cfg.out], [publish_to / name], "--publish")
    for cfg in configs.values():  # a work folder of other settings, before the first source starts
        check_sweep_folder(cfg, "--work")
    if restore_from is not None:
        for name in restore_sources(restore_from, work, names):
            log(f"{name}: restored the finished units stashed in {restore_from}")
    done = []
    for name, cfg in configs.items():
        copy_pools(name, work, log)
        for model in cfg.models:
            wait_for_build(model, log)
        log(f"{name}: start")
        try:
            result = run_calibration(cfg, log=lambda m, n=name: log(f"{n}: {m}"))
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
        log(f"{name}: {result['records']} records [{result['seconds']}s]")
        if publish_to is not None:
            log(f"{name}: published {publish(Path(cfg.out), publish_to / name)}")
        done.append({"source": name, **result})
    return done


def listed(names: list[str], work: Path, jobs: int) -> list[dict]:
    """`advisor lab sweep --list`: each source's name and the settings that tell it apart (`LISTED`),
    in run order."""
    return [{"name": n, **{k: v for k, v in asdict(config(n, work, jobs)).items() if k in LISTED}} for n in names]


def stash_work(sizes: str | None, sources: str | None, work: Path, stash_dir: Path,
               say: Log = lambda message: None) -> list[dict]:
    """`advisor lab stash`: keep in the repository what took long. The lab models `sizes` names
    (default: the teachers, unless `sources` are named): each finished build, else its latest
    pretraining checkpoint (`models.lab.committed.stash`); and the finished units of each source of
    `sources` in WORK, as STASH_DIR/NAME.tar.gz (`lab.stash.stash`). A row per model and source."""
    models = lab_names(sizes or "teacher,teacher-xl", teacher=True) if sizes or not sources else []
    names = source_names(sources) if sources else []
    if names:
        if not work.is_dir():
            raise InputError(f"--work {work} is not a folder: name the folder `advisor lab sweep --work` ran in")
        check_writable_dir(stash_dir, "--stash-dir")
        for name in names:  # a source's folder made with other settings would be stashed as this source
            if (work / name / "config.json").is_file():
                check_sweep_folder(config(name, work, 1), "--work")
    rows = []
    for name in models:
        final = folder_of(name)
        kept = committed.stash(final)
        rows.append({"name": name, "folder": final.name, "kept": kept})
        say(f"{name}: " + (f"kept the {kept} as {committed.kept_at(final.name, kept)}" if kept
                           else "nothing to keep (neither built nor started here)"))
    for name in names:
        if not (work / name / "config.json").is_file():
            say(f"{name}: nothing to stash ({work / name} is not a sweep's folder)")
            continue
        rows.append(stash(work, config(name, work, 1), name, stash_dir))
        say(f"{name}: {rows[-1]['units_done']} of {rows[-1]['units']} units stashed in {stash_dir}/{name}.tar.gz")
    return rows
