"""`advisor lab publish SWEEP DEST`: what a calibration sweep measured, as the repository keeps it.

    advisor lab publish runs/cal-teacher calibration/teacher
    advisor lab report calibration/teacher --out docs/lab/teacher

SWEEP is an `advisor calibrate --out` folder. DEST receives the layout of `advisor.lab.published`:
the sweep's settings without its folder; every finished run's record, made portable the way the
sweep's records.jsonl is (the runs of --budget-runs apart); every finished run's evaluations; and
every unit's probe report, whose curves keep each held-out problem's result (what `advisor lab
replay` replays). Checkpoints, datasets, score caches and the probe's training folders stay
behind, and nothing names the machine the sweep ran on. Publishing again replaces DEST's files
with the sweep's current state.
"""

from __future__ import annotations

import json
from pathlib import Path

from capacity_advisor.advisor.lab.calibrate import collect_records
from capacity_advisor.advisor.lab.published import BUDGET_RECORDS, EVALS, PROBES, RECORDS, path_order, write_rows
from capacity_advisor.advisor.lab.units import CalibrateConfig, Unit
from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import check_writable_dir, refuse_overwrite, write_json
from capacity_advisor.models.jsonl import read_jsonl


def finished_runs(sweep: Path) -> list[tuple[str, Path]]:
    """(TASK/RANKING/UNIT/RUN, its folder) of every run with a record and evaluations, in path order."""
    out = []
    for rec in sweep.glob("*/*/*/*/record.json"):
        run = rec.parent
        name = run.relative_to(sweep).as_posix()
        task, score, unit, _ = name.split("/")
        if Unit.from_name(task, score, unit) is not None and (run / "eval.jsonl").is_file():
            out.append((name, run))
    return sorted(out, key=lambda r: path_order(r[0]))


def check_publish(sweep: Path, dest: Path) -> CalibrateConfig:
    """The sweep's settings, once SWEEP is a sweep with finished runs and DEST a folder outside it
    that can be written; else one InputError, before anything is written."""
    cfg = CalibrateConfig.from_folder(sweep)
    check_writable_dir(dest, "DEST")
    refuse_overwrite([sweep], [dest], "DEST")
    if not finished_runs(sweep):
        raise InputError(f"{sweep} holds no finished runs (RUN/record.json and RUN/eval.jsonl): let "
                         f"`advisor calibrate --out {sweep}` finish a unit first")
    return cfg


def publish(sweep: str | Path, dest: str | Path) -> dict:
    """Write DEST from SWEEP (see the module doc); what was written."""
    sweep, dest = Path(sweep), Path(dest)
    cfg = check_publish(sweep, dest)
    runs = finished_runs(sweep)
    units = sorted({name.rpartition("/")[0] for name, _ in runs}, key=path_order)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items() if k != "out"}
    original = json.loads((sweep / "config.json").read_text(encoding="utf-8"))
    write_json(dest / "config.json", {"stage": "calibrate", "settings": settings, "versions": original.get("versions")})
    records = write_rows(dest / RECORDS, collect_records(cfg))
    if cfg.budget_runs:
        write_rows(dest / BUDGET_RECORDS, collect_records(cfg, budget_runs=True))
    write_rows(dest / EVALS, ({"run": name, "evals": read_jsonl(run / "eval.jsonl")} for name, run in runs))
    reports = ((unit, sweep / unit / "probe" / "probe.json") for unit in units)
    write_rows(dest / PROBES, ({"unit": unit, "probe": json.loads(path.read_text(encoding="utf-8"))}
                               for unit, path in reports if path.is_file()))
    return {"runs": len(runs), "records": records, "dest": str(dest)}
