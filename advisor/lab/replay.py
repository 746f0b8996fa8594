"""`advisor lab replay`: a sweep's records with the features a shorter probe would have measured.

    advisor lab replay calibration/teacher calibration/scripted calibration/lab2/modchain-program ... \
        --out calibration/records.jsonl

Calibration probes run longer than the default probe (200 steps in the first lab's sweeps, 50 in
the pool-source sweep) with a fixed warm-up and a constant rate after it, so a probe of fewer
steps is exactly a prefix of that curve; and they keep every held-out problem's result, so an
evaluation on fewer problems is replayed from the first N of them (the teacher-NLL and drift
columns stay at the full slice: they are cheap scoring passes). The replay writes every record of
the folders, in the order given, with the features of a probe of `--probe-steps` steps on
`--probe-eval-problems` problems (the default probe's by default), its `settings.probe` that
probe and `settings.probe_replayed_from` the one that ran. calibration/records.jsonl, the shipped
predictor's training set, is the replay of the committed sources at the default probe.
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.lab import published
from capacity_advisor.advisor.calibration.grid import Cell
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_file, finite, refuse_overwrite, write_jsonl
from capacity_advisor.probes.recipe import DEFAULT_EVAL_PROBLEMS, DEFAULT_STEPS, MEASURING
from capacity_advisor.probes.run import features, truncate

Key = tuple  # (folder, task, ranking, student, seed, build): one unit of one folder


def replay_curves(curves: dict, steps: int, n_eval: int) -> dict:
    """The curves a probe of `steps` steps evaluated on the first `n_eval` held-out problems would have measured."""
    out = {}
    for s, c in truncate(curves, steps).items():
        rows = []
        for p in c:
            p = dict(p)
            per = p.get("per_problem") or {}
            if per.get("correct") is not None:
                p["accuracy"] = mean(per["correct"][:n_eval])
            if per.get("answered") is not None:
                p["answer_rate"] = mean(per["answered"][:n_eval])
            if per.get("repetitive") is not None:
                p["repetition_rate"] = mean(per["repetitive"][:n_eval])
            if per.get("answer_logprob"):
                p["answer_logprob"] = mean(per["answer_logprob"][:n_eval])
            rows.append(p)
        out[s] = rows
    return out


def load_calibration(folders) -> tuple[list[tuple[Key, dict]], dict[Key, dict]]:
    """([(unit key, record)], {unit key: its probe report}) from calibration folders, published or
    a sweep's, in the order given; InputError for a record that names no unit or whose unit has no
    probe report."""
    records, probes = [], {}
    for folder in map(Path, folders):
        reports = published.probes(folder)
        for rec in published.records(folder):
            u = rec.get("unit")
            if u is None and (own := pool_unit(rec)) is not None:  # a calibration on a pool of one's own
                key = (str(folder), *own)
                records.append((key, rec))
                if key not in probes:
                    probe = reports.get(published.unit_path(*own))
                    if probe is None:
                        raise InputError(f"{folder}: unit {published.unit_path(*own)} has records but no probe report: publish "
                                         "the calibration again, or let it finish")
                    probes[key] = probe
                continue
            if not isinstance(u, dict):
                raise InputError(f"{folder}: a record names no calibration unit (run {rec.get('run_id')!r}): name "
                                 "folders of `advisor lab calibrate`, `advisor calibrate` or `advisor lab publish`")
            lacking = [k for k in ("task", "score", "size", "seed") if k not in u]
            if lacking:
                raise InputError(f"{folder}: a record's unit (run {rec.get('run_id')!r}) lacks {', '.join(lacking)}: "
                                 "publish the sweep again (`advisor lab publish`), or name the sweep's own folder")
            cell = Cell(u["task"], u["score"], u["size"], u["seed"], u.get("build", 0))
            key = (str(folder), cell.task, cell.score, cell.size, cell.seed, cell.build)
            records.append((key, rec))
            if key not in probes:
                probe = reports.get(f"{cell.task}/{cell.score}/{cell.name}")
                if probe is None:
                    raise InputError(f"{folder}: unit {cell.task}/{cell.score}/{cell.name} has records but no probe "
                                     "report: publish the sweep again, or let its probe finish")
                probes[key] = probe
    return records, probes


def pool_unit(rec: dict) -> tuple | None:
    """(task, ranking, student, seed) of a record of `advisor calibrate` (it names its pool, student
    and seed, not a lab unit); None where it does not."""
    pool, model, settings = rec.get("pool"), rec.get("model"), rec.get("settings")
    if not (isinstance(pool, dict) and isinstance(model, dict) and isinstance(settings, dict)):
        return None
    task, spec, seed = pool.get("task"), model.get("spec"), settings.get("seed")
    if not (isinstance(task, str) and isinstance(spec, str) and isinstance(seed, int)):
        return None
    return task, str(pool.get("score", "sum")), spec, seed


def replay(records, probes, steps: int, n_eval: int) -> list[dict] | None:
    """Every record with the features a probe of `steps` steps on `n_eval` problems would have
    measured; None where some probe ran fewer steps or kept fewer problems."""
    out = []
    for key, rec in records:
        probe = probes[key]
        if steps > probe["settings"]["steps"] or n_eval > probe["settings"]["eval_problems"]:
            return None
        out.append({**rec, "features": features(replay_curves(probe["curves"], steps, n_eval), probe["context"])})
    return out


def replayed(records, probes, steps: int, n_eval: int) -> list[dict]:
    """The records as the predictor is fitted on them: features replayed, and `settings.probe` the
    recipe they stand for (the probe's own settings, shortened), the probe that ran beside it."""
    out = []
    for key, rec in records:
        probe = probes[key]
        kind = ((rec.get("settings") or {}).get("probe") or {}).get("kind", "lab")  # a real student's stays real
        recipe = {"kind": kind, **{k: probe["settings"][k] for k in MEASURING if k in probe["settings"]},
                  "steps": steps, "eval_problems": n_eval}
        recipe["eval_every"] = min(recipe.get("eval_every", steps), steps)
        settings = {**rec.get("settings", {}), "probe": recipe,
                    "probe_replayed_from": (rec.get("settings") or {}).get("probe")}
        out.append(finite({**rec, "settings": settings,
                           "features": features(replay_curves(probe["curves"], steps, n_eval), probe["context"])}))
    return out


@dataclass(frozen=True)
class ReplayJob:
    """What `advisor lab replay` reads and writes."""

    folders: tuple[str, ...]
    out: str
    steps: int = DEFAULT_STEPS
    eval_problems: int = DEFAULT_EVAL_PROBLEMS

    def check(self) -> tuple[list, dict]:
        """The records and probes to replay, once every input holds what the replay needs and --out
        can be written; else one InputError, before anything is written."""
        if not self.folders:
            raise InputError("name at least one calibration folder (published by `advisor lab publish`, or a sweep's)")
        for f in self.folders:
            if not Path(f).is_dir():
                raise InputError(f"{f} is not a folder: name calibration folders (e.g. calibration/lab2/NAME)")
        check_writable_file(self.out, "--out")
        seen: dict[str, str] = {}
        for f in self.folders:  # one folder named twice (or by two names) would replay its records twice
            real = os.path.realpath(f)
            if real in seen:
                raise InputError(f"{f} is named twice (as {seen[real]} too): name each calibration folder once")
            seen[real] = f
        refuse_overwrite(self.folders, [self.out], "--out")
        records, probes = load_calibration(self.folders)
        if not records:
            raise InputError(f"{', '.join(self.folders)[:200]} hold no records to replay")
        for key, probe in probes.items():
            ran = probe.get("settings") or {}
            if not (self.steps <= ran.get("steps", 0) and self.eval_problems <= ran.get("eval_problems", 0)):
                raise InputError(f"{key[0]}: the probe of {'/'.join(map(str, key[1:4]))} seed {key[4]} ran "
                                 f"{ran.get('steps')} steps on {ran.get('eval_problems')} problems, fewer than "
                                 f"--probe-steps {self.steps} on --probe-eval-problems {self.eval_problems}: "
                                 "replay a shorter probe, or leave that folder out")
        return records, probes


def replay_records(job: ReplayJob) -> dict:
    """Write the replayed records of `job` (see the module doc); what was written."""
    records, probes = job.check()
    n = write_jsonl(job.out, replayed(records, probes, job.steps, job.eval_problems))
    return {"records": n, "out": str(job.out), "steps": job.steps, "eval_problems": job.eval_problems,
            "folders": list(job.folders)}
