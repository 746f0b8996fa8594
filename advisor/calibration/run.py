"""The calibration protocol, written once: a unit (`calibration.unit.Unit`) is scored, probed and
trained on each set, and its runs' RunRecords are collected for `advisor fit`.

`run_unit` scores every candidate under the student and probes it through
`probe.stage.probe_pool` (the path `advisor probe` and `advisor recommend` take), then selects each
run's set and trains it from a manifest (`probes.recipe.full_run_manifest`) through
`training.run_manifest`, the call behind `advisor train`: in this process from the loaded student,
or launched over `nproc` processes. A run's checkpoints go once its record is written; a finished
probe or run is kept, an unfinished run continues from its last checkpoint. `collect` makes the
finished runs' records portable.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path
from typing import Iterable

from capacity_advisor.advisor.calibration.unit import Calibration, Run, Unit
from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.advisor.probe.stage import probe_pool
from capacity_advisor.advisor.scoring.select import SelectConfig, export, select
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import finite, json_object, write_jsonl
from capacity_advisor.models import loading
from capacity_advisor.probes.recipe import full_run_manifest
from capacity_advisor.probes.run import ProbeConfig
from capacity_advisor.training.manifest import schedule_of
from capacity_advisor.training.run_manifest import RunRequest, run_manifest

# what to do about a damaged file of a unit (its probe report, a run's record): the unit runs again when it is gone
RERUN_UNIT = "delete that run's folder (or the unit's probe/ folder) and run the same command again to redo it"


def run_unit(unit: Unit, cal: Calibration, lm=None) -> str:
    """Score, probe and train one unit (resumable); a one-line summary. `lm`: the student already loaded."""
    t0 = time.time()
    lm = lm or loading.load_model(unit.student.spec, device=cal.device, dtype=cal.dtype)
    problems, fingerprint = unit.pool.read()
    scores, features = measure(unit, cal, lm, problems)
    for run in unit.runs:
        full_run(unit, cal, run, lm, problems, scores, features, fingerprint)
    return f"{unit.label}: done [{time.time() - t0:.0f}s]"


def measure(unit: Unit, cal: Calibration, lm, problems: Pool) -> tuple[dict, dict]:
    """The unit's scores and its probe's features, through `probe_pool`; a probe already finished
    (its probe.json) is read, not run again."""
    cfg = ProbeConfig(unit.recipe, learning_rate=unit.learning_rate, seed=unit.seed, device=cal.device, dtype=cal.dtype,
                      **cal.probe)
    report = unit.folder / "probe" / "probe.json"
    stage = probe_pool(unit.student, problems, cfg, lm, unit.folder / "score", unit.folder / "probe",
                       checker=unit.pool.checker, score=unit.ranking, score_length=unit.recipe.score_length,
                       run=not report.is_file(), **cal.scoring)
    features = json_object(report, RERUN_UNIT).get("features")
    if not isinstance(features, dict):
        raise InputError(f"{report} holds no probe features: {RERUN_UNIT}")
    return stage.scores, features


def full_run(unit: Unit, cal: Calibration, run: Run, lm, problems: Pool, scores: dict, features: dict,
             fingerprint: str) -> Path:
    """One full run of the unit's student on `problems`, from its manifest as `advisor train` runs it
    (skipped when finished); returns the run folder."""
    run_dir = unit.folder / run.name
    if (run_dir / "record.json").exists():
        return run_dir
    strategy, mix, switch = schedule_of(run.option)
    ranking = run.ranking or unit.ranking
    sel = select(problems, scores, SelectConfig(strategy=strategy, mix=mix, seed=unit.seed, score=ranking))
    dataset = f"data/{run.name}.jsonl"
    export(sel, unit.folder / dataset, "trl")
    rerank = None
    if run.rerank:
        ids = {r["id"] for r in sel.rows}
        write_jsonl(unit.folder / "data" / f"{run.name}.candidates.jsonl",
                    ({"id": p.id, "prompt": p.prompt, "responses": [c.text for c in p.candidates]}
                     for p in problems.problems if p.id in ids))
        rerank = {**run.rerank, "candidates": f"data/{run.name}.candidates.jsonl", "score": ranking}
    model = lm.description if cal.model_path else {k: v for k, v in lm.description.items() if k != "path"}
    m = full_run_manifest(
        unit.recipe, epochs=run.epochs or cal.epochs, learning_rate=unit.learning_rate, seed=unit.seed,
        eval={"path": os.path.relpath(unit.pool.eval_path, unit.folder), "checker": unit.pool.checker, "limit": None,
              "base_drift": True, **cal.eval},
        training={"evals_per_epoch": cal.evals_per_epoch, "save_total_limit": 1, "switch_epoch": switch,
                  "rerank": rerank, **({"eval_at": list(cal.eval_at)} if cal.eval_at else {})},
        model={**model, "spec": unit.student.spec}, dataset=dataset, strategy=strategy,
        mix=mix if strategy == "mixed" else 0.0, features=features, pool=unit.pool.about(ranking, fingerprint),
        base_dir=str(unit.folder))
    train(m.to_json(unit.folder / f"{run.name}.manifest.json"), run_dir, unit, cal, run, lm)
    for ckpt in run_dir.glob("checkpoint-*"):  # the weights are not needed once the record is written
        shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


def train(manifest: Path, run_dir: Path, unit: Unit, cal: Calibration, run: Run, lm) -> None:
    """`advisor train MANIFEST --out RUN`: in this process from the loaded student, its record kept
    out of the records store; or launched over `cal.nproc` processes."""
    req = RunRequest(str(manifest), str(run_dir), nproc=cal.nproc, launcher=cal.launcher, device=cal.device,
                     dtype=cal.dtype)
    if cal.nproc == 1:
        run_manifest(req, lm=lm, store=False, stream=io.StringIO(), step0_row=base_row(unit, run))
        return
    try:
        run_manifest(req)
    except InputError as e:  # the launched run's own messages are above it: say which run it was
        raise InputError(f"the full run of {unit.name} on D_{run.option} (seed {unit.seed}): {e}") from None


def base_row(unit: Unit, run: Run) -> dict | None:
    """The base student's evaluation (step 0) an earlier run of the unit made (`callbacks.base_row_of`):
    every run of a unit starts from the same base and is judged on the same held-out problems."""
    from capacity_advisor.training.callbacks import base_row_of

    earlier = []
    for other in unit.runs:
        if other.name == run.name:
            break
        earlier.append(unit.folder / other.name)
    return base_row_of(earlier)


def collect(units: Iterable[Unit], source: str) -> list[dict]:
    """The RunRecord of every finished run of `units`, in their order, made portable."""
    records = []
    for unit in units:
        for run in unit.runs:
            path = unit.folder / run.name / "record.json"
            if path.exists():
                records.append(portable(json_object(path, RERUN_UNIT), unit, source))
    return records


def portable(record: dict, unit: Unit, source: str) -> dict:
    """A record that says what ran without saying where: no machine path, the student by its name;
    the seed and the probe recipe its features were measured with in its settings (what `advisor
    fit` reads to tell recommend how to probe); what describes only that run in `provenance`; and
    the unit it belongs to where the caller names one."""
    r = dict(record)
    r["model"] = {**{k: v for k, v in r["model"].items() if k != "path"}, "spec": unit.name}
    r["source"] = source
    settings = dict(r.get("settings") or {})
    provenance = dict(r.pop("provenance", None) or {})
    settings.pop("device", None)
    settings["seed"] = unit.seed
    settings.setdefault("probe", unit.recipe.as_dict())
    r["settings"] = settings
    r["provenance"] = {k: v for k, v in provenance.items() if k not in ("manifest", "final_checkpoint")}
    if unit.record is not None:
        r["unit"] = unit.record
    return finite(r)  # JSON has no NaN: null instead, so any JSON reader takes the records
