"""The lab's pool-source sweep: one `advisor calibrate` per pool source, published as each lands.

    .venv/bin/python benchmarks/sweep_sources.py --work runs/sources --publish calibration/lab2 --jobs 2
    .venv/bin/python benchmarks/sweep_sources.py --list          # the sources, in the order they run

A pool source is a task family and the teacher that wrote its candidates: the scripted teacher
(`program`: correct responses by procedures drawn uniformly) or a lab teacher model sampled at a
temperature. Each source runs the ten ladder students on two seeds, summed ranking, 5 epochs of
D_high / D_low / D_mixed (the settings below), into WORK/NAME; when a source is complete it is
published into PUBLISH/NAME by `publish_calibration.publish` (records, per-run evaluations, probe
curves; no checkpoints or machine paths). Everything resumes: rerun the same command after a stop
and finished units, runs and sources are skipped. `--only NAME,...` runs some sources.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capacity_advisor.advisor.lab.calibrate import CalibrateConfig, run_calibration  # noqa: E402
from capacity_advisor.models.errors import InputError  # noqa: E402

COMMON = CalibrateConfig(seeds=(0, 1), mean_seeds=(), epochs=5, n_train=2000, n_eval=200, candidates=8)

# In run order: the scripted sources need no teacher model, so they run while the teachers build.
# Every task family has two sources, every teacher two, every temperature two.
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


def config(name: str, work: Path, jobs: int) -> CalibrateConfig:
    return replace(COMMON, out=str(work / name), jobs=jobs, **SOURCES[name])


def wait_for_build(model: str, log) -> None:
    """If another process is pretraining `model` (its temporary folder names a live process),
    wait for it instead of building it twice."""
    from capacity_advisor.models.lab.ladder import student_dir

    final = student_dir(model)
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/sources"))
    ap.add_argument("--publish", type=Path, default=None, help="publish each finished source into PUBLISH/NAME")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated source names")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    names = [n for n in args.only.split(",") if n] or list(SOURCES)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        print(f"error: unknown source {', '.join(unknown)}: use {', '.join(SOURCES)}", file=sys.stderr)
        return 2
    if args.list:
        for n in names:
            print(json.dumps({"name": n, **{k: v for k, v in asdict(config(n, args.work, args.jobs)).items()
                                           if k in ("tasks", "teacher", "temperature", "seeds", "budget_runs")}}))
        return 0
    from publish_calibration import publish

    for name in names:
        cfg = config(name, args.work, args.jobs)
        try:
            cfg.validate()
            for model in ([cfg.teacher_model[len("lab:"):]] if cfg.teacher_model else []) + list(cfg.ladder):
                wait_for_build(model, log)
            log(f"{name}: start")
            result = run_calibration(cfg, log=lambda m, n=name: log(f"{n}: {m}"))
            log(f"{name}: {result['records']} records [{result['seconds']}s]")
            if args.publish:
                log(f"{name}: published {publish(Path(cfg.out), args.publish / name)}")
        except InputError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
