"""`advisor lab publish CAL DEST` of an `advisor calibrate` folder: a calibration on a pool of one's
own (the real pretrained student's truth among them) kept in the repository as a lab sweep is.

    advisor calibrate --students lab:smollm2-135m --pool calibration/real/pools/linear-scripted.jsonl ... --out runs/real/linear-scripted
    advisor lab publish runs/real/linear-scripted calibration/real/linear-scripted
    advisor lab replay calibration/real/linear-scripted --out runs/real-records.jsonl

DEST gets the layout of `advisor.lab.published`: config.json (the calibration's settings without
its folder and devices, its stage `calibrate-pool`), records.jsonl.xz (CAL/records.jsonl, already
portable), evals.jsonl.xz (every finished run, named TASK/RANKING/UNIT/RUN) and probes.jsonl.xz
(every unit's probe report, named TASK/RANKING/UNIT), where TASK is the calibration's task name
and UNIT its unit folder (`STUDENT-sSEED`). Publishing again replaces DEST's files.
"""

from __future__ import annotations

from pathlib import Path

from capacity_advisor.advisor.lab.published import (BUDGET_RECORDS, EVALS, PROBES, RECORDS, is_published, path_order,
                                                    unit_path, write_rows)
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_dir, json_object, refuse_overwrite, unclaimed_files, write_json
from capacity_advisor.core.jsonl import read_jsonl_input

STAGE = "calibrate-pool"
# settings that say where or how fast it ran, not what was measured
LOCAL = ("out", "device", "nproc", "launcher", "gpu_tflops", "mfu", "decode_mfu")
_AGAIN = "the calibration's file is damaged: delete that run's (or unit's) folder and run `advisor calibrate` again"


def is_pool_calibration(folder: Path) -> bool:
    """Whether `folder` is an `advisor calibrate` folder (its config.json says so)."""
    path = folder / "config.json"
    if not path.is_file():
        return False
    return json_object(path, _AGAIN).get("stage") == STAGE and not is_published(folder)


def check(cal: Path, dest: Path) -> tuple[dict, list[dict]]:
    """(the calibration's config.json, its records) once DEST can take them; else one InputError
    before anything is written."""
    saved = json_object(cal / "config.json", _AGAIN)
    settings = saved.get("settings")
    if not isinstance(settings, dict) or not isinstance(settings.get("students"), list):
        raise InputError(f"{cal / 'config.json'} holds no calibration settings: name a folder of `advisor calibrate --out`")
    check_writable_dir(dest, "DEST")
    refuse_overwrite([cal], [dest], "DEST")
    if (dest / "config.json").is_file():  # publishing again replaces the same calibration's files, no other's
        theirs = json_object(dest / "config.json", "pass a new DEST")
        if theirs.get("stage") != STAGE or theirs.get("inputs_key") != saved.get("inputs_key"):
            raise InputError(f"DEST {dest} holds the publication of another calibration: pass a new DEST")
    elif unclaimed_files(dest):
        raise InputError(f"DEST {dest} holds files but no published calibration's config.json: pass a new or empty DEST")
    path = cal / "records.jsonl"
    if not path.is_file():
        raise InputError(f"{cal} has no records.jsonl yet: let `advisor calibrate --out {cal}` finish (it writes the "
                         "records once every unit is done), then publish")
    records = read_jsonl_input(path, damaged=f"; run `advisor calibrate --out {cal}` again to rewrite it")
    if not records:
        raise InputError(f"{path} holds no records")
    return saved, records


def portable_settings(settings: dict) -> dict:
    """The settings without where they ran, and with no machine path: the pool, the proxies, the
    target and the predictor by their names (as the records name the proxies)."""
    def student_name(spec: str) -> str:  # as `advisor calibrate` names a proxy in its records
        return Path(spec).name if Path(spec).exists() else spec

    out = {k: v for k, v in settings.items() if k not in LOCAL}
    for key in ("pool", "target", "predictor"):
        if isinstance(out.get(key), str):
            out[key] = Path(out[key]).name
    out["students"] = [student_name(s) if isinstance(s, str) else s for s in out.get("students") or []]
    return out


def publish_pool(cal: str | Path, dest: str | Path) -> dict:
    """Write DEST from the `advisor calibrate` folder CAL (see the module doc); what was written.
    Everything is read first, so a damaged file leaves DEST as it was."""
    cal, dest = Path(cal), Path(dest)
    saved, records = check(cal, dest)
    runs, units = [], {}
    for rec in records:
        pool, settings = rec.get("pool") or {}, rec.get("settings") or {}
        unit = unit_path(str(pool.get("task")), str(pool.get("score", "sum")), str((rec.get("model") or {}).get("spec")),
                         settings.get("seed", 0))
        folder = cal / "units" / unit.rsplit("/", 1)[1]
        run = f"{unit}/{rec.get('strategy')}"  # the runs of a calibration are named by their set
        evals = folder / run.rsplit("/", 1)[1] / "eval.jsonl"
        if not evals.is_file():
            raise InputError(f"{evals} is missing for a record of {cal / 'records.jsonl'}: {_AGAIN}")
        runs.append({"run": run, "evals": read_jsonl_input(evals, damaged="; " + _AGAIN)})
        probe = folder / "probe" / "probe.json"
        if unit not in units and probe.is_file():
            units[unit] = json_object(probe, _AGAIN)
    runs.sort(key=lambda r: path_order(r["run"]))
    settings = portable_settings(saved.get("settings") or {})
    write_json(dest / "config.json", {"stage": STAGE, "inputs_key": saved.get("inputs_key"), "settings": settings,
                                      "versions": saved.get("versions")})
    write_rows(dest / RECORDS, records)
    write_rows(dest / EVALS, runs)
    write_rows(dest / PROBES, [{"unit": u, "probe": units[u]} for u in sorted(units, key=path_order)])
    (dest / BUDGET_RECORDS).unlink(missing_ok=True)
    return {"runs": len(runs), "records": len(records), "dest": str(dest)}
