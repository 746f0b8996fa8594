"""Copy what a calibration sweep measured into the repository: records and per-run evaluations,
without checkpoints, datasets, score caches or anything that names the machine it ran on.

    .venv/bin/python -m benchmarks.publish_calibration SWEEP calibration/teacher
    .venv/bin/advisor lab report calibration/teacher --out docs/lab/teacher

SWEEP is an `advisor calibrate --out` folder. DEST receives, per finished run,
`TASK/SCORE/SIZE-sSEED/STRATEGY/{record.json,eval.jsonl}` (the record made portable the way
`records.jsonl` is), the sweep's `config.json` with its settings but not its folder, and
`records.jsonl` (every finished run, for `advisor fit --records`; the runs of `--budget-runs` go
to `budget-records.jsonl`), and per unit the probe's
report as `probe/probe.json.gz` (its curves keep every held-out problem's result, which
`benchmarks/probe_cost.py` replays). The probe's training folders, datasets and checkpoints stay
behind. Rerunning replaces DEST's files with the sweep's current state.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

from capacity_advisor.advisor.lab.calibrate import collect_records
from capacity_advisor.advisor.lab.portable import portable
from capacity_advisor.advisor.lab.units import CalibrateConfig, Unit
from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import write_json, write_jsonl


def publish(sweep: Path, dest: Path) -> dict:
    cfg = CalibrateConfig.from_folder(sweep)
    runs = 0
    for rec in sorted(sweep.glob("*/*/*/*/record.json")):
        run = rec.parent
        strategy, unit_name, score, task = run.name, run.parent.name, run.parent.parent.name, run.parent.parent.parent.name
        unit = Unit.from_name(task, score, unit_name)
        if unit is None or not (run / "eval.jsonl").is_file():
            continue
        target = dest / task / score / unit_name / strategy
        target.mkdir(parents=True, exist_ok=True)
        write_json(target / "record.json", portable(json.loads(rec.read_text()), unit, cfg.teacher, cfg.temperature))
        shutil.copyfile(run / "eval.jsonl", target / "eval.jsonl")
        runs += 1
        probe = run.parent / "probe" / "probe.json"
        if probe.is_file():
            text = json.dumps(json.loads(probe.read_text()), separators=(",", ":")).encode()
            (target.parent / "probe").mkdir(exist_ok=True)
            (target.parent / "probe" / "probe.json.gz").write_bytes(gzip.compress(text, 9, mtime=0))
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items() if k != "out"}
    original = json.loads((sweep / "config.json").read_text())
    write_json(dest / "config.json", {"stage": "calibrate", "settings": settings, "versions": original.get("versions")})
    records = collect_records(cfg)
    write_jsonl(dest / "records.jsonl", records)
    if cfg.budget_runs:
        write_jsonl(dest / "budget-records.jsonl", collect_records(cfg, budget_runs=True))
    return {"runs": runs, "records": len(records), "dest": str(dest)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args()
    try:
        print(json.dumps(publish(args.sweep, args.dest)))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
