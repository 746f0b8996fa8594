"""`advisor lab publish SWEEP DEST`: what a calibration sweep measured, as the repository keeps it.

    advisor lab publish runs/cal-teacher calibration/teacher
    advisor lab report calibration/teacher --out docs/lab/teacher

SWEEP is an `advisor lab calibrate --out` folder, or an `advisor calibrate --out` folder
(`advisor.lab.publish_proxies`: a calibration on a pool of one's own, the real student's among them). DEST receives the layout of `advisor.lab.published`:
the sweep's settings without its folder; every finished run's record, made portable the way the
sweep's records.jsonl is (the runs of --budget-runs apart); every finished run's evaluations; and
every unit's probe report, whose curves keep each held-out problem's result (what `advisor lab
replay` replays). Checkpoints, datasets, score caches and the probe's training folders stay
behind, and nothing names the machine the sweep ran on. Publishing again replaces DEST's files
with the sweep's current state.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from capacity_advisor.advisor.calibration.sweep import collect_records
from capacity_advisor.advisor.lab.published import (BUDGET_RECORDS, EVALS, PROBES, RECORDS, is_published, path_order,
                                                    write_rows)
from capacity_advisor.advisor.lab.publish_proxies import is_pool_calibration, publish_pool
from capacity_advisor.advisor.calibration.grid import CalibrateConfig, Cell
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    check_writable_dir, json_object, refuse_overwrite, special_kind, unclaimed_files, write_json,
)
from capacity_advisor.core.jsonl import read_jsonl_input


def finished_runs(sweep: Path) -> list[tuple[str, Path]]:
    """(TASK/RANKING/UNIT/RUN, its folder) of every run with a record and evaluations, in path order.
    A run of a unit that has its record but whose record or evaluations cannot be read as files (a
    FIFO, a folder, a device, gone) is one InputError naming it: a publication never leaves a run out."""
    out = []
    for rec in sweep.glob("*/*/*/*/record.json"):
        run = rec.parent
        name = run.relative_to(sweep).as_posix()
        task, score, unit, _ = name.split("/")
        if Cell.from_name(task, score, unit) is None:
            continue
        for file in ("record.json", "eval.jsonl"):
            kind = special_kind(run / file) or (None if (run / file).exists() else "missing")
            if kind is not None:
                raise InputError(f"run {name} of {sweep}: its {file} is {kind}{_RUN_AGAIN}")
        out.append((name, run))
    return sorted(out, key=lambda r: path_order(r[0]))


def check_publish(sweep: Path, dest: Path) -> CalibrateConfig:
    """The sweep's settings, once SWEEP is a sweep with finished runs and DEST a folder outside it
    that can be written; else one InputError, before anything is written."""
    if is_published(sweep):
        raise InputError(f"{sweep} is a published calibration already: publish takes the sweep's own folder "
                         "(`advisor lab calibrate --out`); copy a published folder as it is")
    cfg = CalibrateConfig.from_folder(sweep)
    check_writable_dir(dest, "DEST")
    refuse_overwrite([sweep], [dest], "DEST")
    if (dest / "config.json").is_file():  # publishing again replaces the same sweep's files, no other's
        theirs = CalibrateConfig.from_folder(dest)
        if replace(theirs, out=cfg.out, jobs=cfg.jobs) != cfg:
            raise InputError(f"DEST {dest} holds the publication of a sweep of other settings: pass a new DEST")
    elif unclaimed_files(dest):
        raise InputError(f"DEST {dest} holds files but no published sweep's config.json: pass a new or empty DEST")
    if not finished_runs(sweep):
        raise InputError(f"{sweep} holds no finished runs (RUN/record.json and RUN/eval.jsonl): let "
                         f"`advisor lab calibrate --out {sweep}` finish a unit first")
    return cfg


def publish(sweep: str | Path, dest: str | Path) -> dict:
    """Write DEST from SWEEP (see the module doc); what was written. Everything is read first, so a
    damaged file of the sweep leaves DEST as it was."""
    sweep, dest = Path(sweep), Path(dest)
    if is_pool_calibration(sweep):  # an `advisor calibrate` folder: its own layout
        return publish_pool(sweep, dest)
    cfg = check_publish(sweep, dest)
    runs = finished_runs(sweep)
    units = sorted({name.rpartition("/")[0] for name, _ in runs}, key=path_order)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items() if k != "out"}
    kinds = {RECORDS: collect_records(cfg),
             BUDGET_RECORDS: collect_records(cfg, budget_runs=True) if cfg.budget_runs else None,
             EVALS: [{"run": name, "evals": read_jsonl_input(run / "eval.jsonl", damaged=_RUN_AGAIN)} for name, run in runs],
             PROBES: [{"unit": unit, "probe": _json_object(sweep / unit / "probe" / "probe.json")} for unit in units
                      if (sweep / unit / "probe" / "probe.json").is_file()]}
    original = _json_object(sweep / "config.json")
    write_json(dest / "config.json", {"stage": "calibrate", "settings": settings, "versions": original.get("versions")})
    for kind, rows in kinds.items():
        if rows is not None:
            write_rows(dest / kind, rows)
        else:  # a kind this sweep has none of: a file of an earlier publication would be read as its
            (dest / kind).unlink(missing_ok=True)
    return {"runs": len(runs), "records": len(kinds[RECORDS]), "dest": str(dest)}


_RUN_AGAIN = "; the sweep's file is damaged: delete its run (or unit) folder and run the sweep again"


def _json_object(path: Path) -> dict:
    """A JSON object the sweep wrote (a probe report, its config.json), or one InputError."""
    return json_object(path, _RUN_AGAIN.removeprefix("; "))
