"""`advisor fit`: from RunRecords to the predictor folder `advisor recommend` reads.

    fit_and_save(read_records("calibration/records.jsonl"), "advisor/predictor_data")

Chooses the model kind by the *policy's* held-out regret leaving one pool source out (`choose_by`:
the split on which advice must hold for a user's own pool; nested, so each outer fold's policy
thresholds are chosen on its training rows only), measures the chosen kind on every split of
`cv` beside the constant rules, the size rule and the noise floor, chooses the policy's
thresholds on all the records the same way, fits the ensemble on every row and saves one file
with the lab prior for `--no-probe`, the probe recipe its inputs were measured with and the policy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from capacity_advisor.advisor.predictor import (
    FEATURE_SETS, FITTABLE, SPLITS, Rule, cross_validate, fit_predictor, folds, label_rows, options_in, select_policy,
)
from capacity_advisor.advisor.predictor.priors import fit_lab_prior
from capacity_advisor.models.errors import InputError

CV_METHODS = ("policy", "predictor", "always high", "always low", "always mixed", "size rule", "noise floor")


def probe_of(records: Sequence[dict]) -> dict | None:
    """The probe recipe every record's features were measured with, when they all say the same;
    `advisor recommend` then probes that way by default. Records that name only steps and
    held-out problems are lab probes of the lab recipe otherwise."""
    from capacity_advisor.probes.recipe import LAB, MEASURING

    seen = set()
    for rec in records:
        p = (rec.get("settings") or {}).get("probe") if isinstance(rec.get("settings"), dict) else None
        ok = isinstance(p, dict) and all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] >= 1
                                         for k in ("steps", "eval_problems"))
        if not ok:
            seen.add(None)
            continue
        full = {**LAB.as_dict(), **{k: p[k] for k in ("kind", *MEASURING) if k in p}}
        seen.add(tuple(sorted(full.items())))
    if len(seen) != 1 or None in seen:
        return None
    return dict(seen.pop())


def check_settings(tie_margin: float, n_members: int, seed: int, jobs: int, kinds: Sequence[str],
                   cv: Sequence[str], choose_by: str) -> None:
    bad = []
    if not (isinstance(tie_margin, (int, float)) and math.isfinite(tie_margin) and 0 <= tie_margin < 1):
        bad.append(f"--tie-margin {tie_margin} must be a number from 0 to 1")
    if not 1 <= n_members <= 256:
        bad.append(f"--members {n_members} must be from 1 to 256")
    if seed < 0:
        bad.append(f"--seed {seed} must be at least 0")
    if jobs < 1:
        bad.append(f"--jobs {jobs} must be at least 1")
    unknown = [k for k in kinds if k not in FITTABLE]
    if unknown or not kinds:
        bad.append(f"--kinds {','.join(kinds) or '(none)'}: use {', '.join(FITTABLE)}")
    unknown = [s for s in (*cv, choose_by) if s not in SPLITS]
    if unknown:
        bad.append(f"--cv {','.join(unknown)}: use {', '.join(SPLITS)}")
    if bad:
        raise InputError("; ".join(bad))


def fit_and_save(records: Sequence[dict], out: str | Path, tie_margin: float = 0.01, features: str = "probe",
                 kinds: Sequence[str] = ("lightgbm",), n_members: int = 24, seed: int = 0, jobs: int = 1,
                 note: str | None = None, cv: Sequence[str] = SPLITS, choose_by: str = "source",
                 cv_members: int = 8, log=None) -> dict:
    """Choose the kind, measure it on every split of `cv`, choose the policy, fit and save."""
    if features not in FEATURE_SETS:
        raise InputError(f"--features {features!r} is unknown: use {', '.join(FEATURE_SETS)}")
    check_settings(tie_margin, n_members, seed, jobs, kinds, cv, choose_by)
    say = log or (lambda msg: None)
    feats = FEATURE_SETS[features]
    rows = label_rows(records, tie_margin=tie_margin)
    if not rows:
        raise InputError("the records hold no (student, pool) with both a high and a low run: nothing to learn from")
    if len({r["student"] for r in rows}) < 2:
        raise InputError("the records hold one student only: a predictor needs at least two to be measured on "
                         "students it was not fitted on")
    split = choose_by if folds(rows, choose_by) else "student"
    tables: dict[str, dict] = {}
    if len(kinds) > 1:
        for kind in kinds:
            say(f"cross-validating {kind}, one {split} held out at a time")
            tables[kind] = cross_validate(rows, split, kind, feats, cv_members, tie_margin, seed, jobs)
        chosen = min(kinds, key=lambda k: tables[k]["methods"]["policy"]["regret"])
    else:
        chosen = kinds[0]
    cv_tables = {}
    for s in cv:
        if not folds(rows, s):
            continue
        if s == split and chosen in tables:
            cv_tables[s] = tables[chosen]
            continue
        say(f"cross-validating {chosen}, one {s} held out at a time")
        cv_tables[s] = cross_validate(rows, s, chosen, feats, cv_members, tie_margin, seed, jobs,
                                      policy_split=split if folds(rows, split) else s)
    say(f"choosing the policy's thresholds, one {split} held out at a time")
    policy = select_policy(rows, split, chosen, feats, cv_members, seed, jobs)
    say(f"fitting {n_members} {chosen} members on {len(rows)} rows")
    pred = fit_predictor(rows, chosen, feats, n_members, seed, jobs)
    recipe = probe_of(records)
    pred.meta = {
        "cv": cv_tables, "kinds": {k: t["methods"]["policy"] for k, t in tables.items()},
        "chosen_by": f"the policy's leave-one-{split}-out regret", "feature_set": features,
        "policy": {**policy.to_dict(), "chosen_by": f"leave-one-{split}-out regret"},
        "rows": len(rows), "records": len(records), "students": sorted({r["student"] for r in rows}),
        "sources": sorted({r["source"] for r in rows}),
        "labels": {s: sum(r["label"] == s for r in rows) for s in options_in(rows)}, "ties": sum(r["tie"] for r in rows),
        "tie_margin": tie_margin, "rule_of_thumb": vars(Rule.fit(rows)),
        "lab_prior": fit_lab_prior(rows),
        "params_range": [min(r["n_params"] for r in rows), max(r["n_params"] for r in rows)],
        **({"recipe": recipe, "probe": {"steps": recipe["steps"], "eval_problems": recipe["eval_problems"]}}
           if recipe else {}),
        **({"note": note} if note else {}),
    }
    pred.save(out)
    return {"cv": compact(cv_tables), "chosen": chosen, "kinds": pred.meta["kinds"], "policy": pred.meta["policy"],
            "rows": len(rows), "labels": pred.meta["labels"], "ties": pred.meta["ties"],
            "rule_of_thumb": pred.meta["rule_of_thumb"], "out": str(out)}


def compact(cv_tables: dict) -> dict:
    """{split: {method: {"regret": points, "decision_accuracy": share, "rows": n}}}"""
    return {split: {m: {k: t["methods"][m][k] for k in ("regret", "decision_accuracy", "rows")}
                    for m in CV_METHODS if m in t["methods"]}
            for split, t in cv_tables.items()}
