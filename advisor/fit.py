"""`advisor fit`: from RunRecords to the predictor folder `advisor recommend` reads.

    fit_and_save(read_records("calibration/records.jsonl"), "advisor/predictor_data")

Cross-validates every model kind by holding out students, shapes and tasks (with the constant
rules and the fitted rule of thumb beside them), keeps the kind with the lower leave-one-student-out
regret, fits its ensemble on every row, adds the lab prior for `--no-probe`, and saves one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from capacity_advisor.advisor.predictor import (
    FEATURE_SETS, KINDS, SPLITS, Rule, cross_validate, fit_predictor, folds, label_rows, options_in,
)
from capacity_advisor.advisor.priors import fit_lab_prior
from capacity_advisor.models.errors import InputError


def probe_of(records: Sequence[dict]) -> dict | None:
    """The probe (steps, held-out problems) every record's features were measured with, when they
    all say the same; `advisor recommend` then probes that way by default."""
    seen = set()
    for rec in records:
        p = (rec.get("settings") or {}).get("probe") if isinstance(rec.get("settings"), dict) else None
        ok = isinstance(p, dict) and all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] >= 1
                                         for k in ("steps", "eval_problems"))
        seen.add((p["steps"], p["eval_problems"]) if ok else None)
    if len(seen) != 1 or None in seen:
        return None
    steps, n = seen.pop()
    return {"steps": steps, "eval_problems": n}


def fit_and_save(records: Sequence[dict], out: str | Path, tie_margin: float = 0.01, features: str = "probe",
                 kinds: Sequence[str] = KINDS, n_members: int = 24, seed: int = 0, jobs: int = 1,
                 note: str | None = None) -> dict:
    """Cross-validate every kind (held-out students, shapes, tasks), keep the one with the lower
    leave-one-student-out regret, fit its ensemble on everything and save it with the lab prior."""
    if features not in FEATURE_SETS:
        raise InputError(f"--features {features!r} is unknown: use {', '.join(FEATURE_SETS)}")
    feats = FEATURE_SETS[features]
    rows = label_rows(records, tie_margin=tie_margin)
    if not rows:
        raise InputError("the records hold no (student, pool) with both a high and a low run: nothing to learn from")
    cv = {split: cross_validate(rows, split, kinds, feats, tie_margin=tie_margin, seed=seed, jobs=jobs)
          for split in SPLITS if folds(rows, split)}
    chosen = min(kinds, key=lambda k: cv["student"]["methods"][k]["mean_regret_points"])
    pred = fit_predictor(rows, chosen, feats, n_members, seed, jobs)
    pred.meta = {
        "cv": cv, "chosen_by": "leave-one-student-out mean regret", "feature_set": features,
        "rows": len(rows), "records": len(records), "students": sorted({r["student"] for r in rows}),
        "labels": {s: sum(r["label"] == s for r in rows) for s in options_in(rows)}, "ties": sum(r["tie"] for r in rows),
        "tie_margin": tie_margin, "rule_of_thumb": vars(Rule.fit(rows)),
        "lab_prior": fit_lab_prior(rows),
        "params_range": [min(r["n_params"] for r in rows), max(r["n_params"] for r in rows)],
        **({"probe": probe} if (probe := probe_of(records)) else {}),
        **({"note": note} if note else {}),
    }
    pred.save(out)
    return {"cv": cv, "chosen": chosen, "rows": len(rows), "labels": pred.meta["labels"], "ties": pred.meta["ties"],
            "rule_of_thumb": pred.meta["rule_of_thumb"], "out": str(out)}
