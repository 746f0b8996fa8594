"""Advice without a probe (`advisor recommend --no-probe`): from the parameter count and the budget.

    advice = prior_advice(n_params=1.54e9, budget=5, predictor=shipped)

Two priors, chosen by size:

- **the lab prior** (students below 10^8 parameters): a logistic model of log10(parameters) and
  the budget, fitted on the calibration records by `advisor fit` and stored in the predictor. It
  speaks only for the lab's sizes; anything beyond its calibrated range is said to be so.
- **the paper prior** (10^8 parameters and up): the published findings of arXiv 2608.13721 for its
  five students, kept as explicit records with their provenance in `predictor_data/paper_findings.json`
  — not a fit. A student is answered by the paper's students of its size: Qwen2.5-1.5B and
  Qwen2.5-3B-Instruct (D_high at every budget up to 5 epochs), Qwen2.5-Math-7B and Qwen3-8B
  (D_high within the first epoch, D_low once trained 2-5 epochs). Between the 3B and the 7B
  students, where the paper's Qwen3-4B result is not stated, the answer is "uncertain"; outside
  1.5B-8.2B, or past 5 epochs, the nearest finding is given with low confidence, said in words.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Sequence

import numpy as np

from capacity_advisor.advisor.predictor.advice import Advice
from capacity_advisor.core.errors import InputError

LAB_PRIOR_FEATURES = ("log10_params", "budget", "log10_params_x_budget")
PAPER_FROM = 1e8  # students at least this large are answered by the paper's findings


def _prior_features(n_params: float, budget: float) -> dict:
    lp = math.log10(max(1.0, n_params))
    return {"log10_params": lp, "budget": float(budget), "log10_params_x_budget": lp * float(budget)}


def fit_lab_prior(rows: Sequence[dict]) -> dict:
    """A logistic model of size and budget on the calibration rows, with its parameter range."""
    from capacity_advisor.advisor.predictor.members import fit_member

    prior_rows = [{**r, "features": _prior_features(r["n_params"], r["budget"])} for r in rows]
    return {"features": list(LAB_PRIOR_FEATURES), "member": fit_member(prior_rows, "logistic", LAB_PRIOR_FEATURES),
            "params_range": [min(r["n_params"] for r in rows), max(r["n_params"] for r in rows)]}


def lab_prior_advice(prior: dict, n_params: float, budget: float, options: Sequence[str] | None = None) -> Advice:
    """The lab prior's answer over `options` (the predictor's; default high, low, mixed)."""
    from capacity_advisor.advisor.predictor.members import member_proba
    from capacity_advisor.training.manifest import SETS

    options = tuple(options or SETS)
    check_lab_prior(prior, options)
    f = _prior_features(n_params, budget)
    p = member_proba(prior["member"], np.array([[f[k] for k in LAB_PRIOR_FEATURES]]), options)[0]
    if not np.isfinite(p).all():
        raise InputError("the predictor's lab prior gives no probabilities here (its numbers overflow); "
                         "refit it with `advisor fit`")
    probs = {s: float(v) for s, v in zip(options, p)}
    lo, hi = prior.get("params_range") or [float("nan"), float("nan")]
    inside = lo <= n_params <= hi
    reasons = ["lab prior: fitted on the calibration students' outcomes by parameter count and budget alone"]
    if not inside:
        reasons.append(f"{n_params:,.0f} parameters is outside the calibrated lab range ({lo:,.0f} to {hi:,.0f})")
    return Advice(prior="lab", answered_by="lab prior", strategy=max(probs, key=probs.get), probabilities=probs,
                  confidence="low", confidence_reasons=tuple(reasons + ["no probe: nothing was measured on this student"]))


def check_lab_prior(prior, options: Sequence[str] | None = None) -> None:
    """InputError unless `prior` (a predictor's meta["lab_prior"]) is a well-formed lab prior."""
    from capacity_advisor.advisor.predictor.members import check_member
    from capacity_advisor.training.manifest import SETS

    if not isinstance(prior, dict) or list(prior.get("features") or []) != list(LAB_PRIOR_FEATURES):
        raise InputError("the predictor holds no lab prior, which advice without a probe needs for students under "
                         f"{PAPER_FROM:.0e} parameters; refit it with `advisor fit`, or leave --no-probe out")
    check_member(prior.get("member"), len(LAB_PRIOR_FEATURES),
                 lambda why: InputError(f"the predictor's lab prior is damaged ({why}); refit it with `advisor fit`"),
                 tuple(options or SETS))


def paper_findings() -> dict:
    path = resources.files("capacity_advisor.advisor") / "predictor_data" / "paper_findings.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _finding_at(student: dict, budget: float) -> str | None:
    """The paper's answer for one of its students at a budget, or None where it says nothing."""
    for span in student["findings"]:
        if span["from_epoch"] - 1e-9 <= budget <= span["to_epoch"] + 1e-9:
            return span["better"]
    return None


def paper_prior_advice(n_params: float, budget: float) -> Advice:
    """What the paper's students of this size found at this budget (see the module doc)."""
    data = paper_findings()
    students = sorted(data["students"], key=lambda s: s["n_params"])
    small = [s for s in students if s["findings"] and all(f["better"] == "high" for f in s["findings"])]
    large = [s for s in students if any(f["better"] == "low" for f in s["findings"])]
    small_top, large_low = max(s["n_params"] for s in small), min(s["n_params"] for s in large)
    lo, hi = students[0]["n_params"], students[-1]["n_params"]
    cite = data["source"]
    reasons, confidence = [], "medium"
    if n_params <= small_top * 1.15:
        answer = "high"
        reasons.append(f"the paper's students of up to {small_top / 1e9:.1f}B parameters "
                       f"({', '.join(s['model'] for s in small)}) did best on D_high at every budget up to 5 epochs")
    elif n_params < large_low * 0.9:
        answer = "uncertain"
        reasons.append(f"between the paper's {small_top / 1e9:.1f}B students (D_high throughout) and its "
                       f"{large_low / 1e9:.1f}B+ students (D_low after 2-5 epochs); the paper does not say where its "
                       "Qwen3-4B student falls")
    else:
        first = {_finding_at(s, budget) for s in large}
        answer = first.pop() if len(first) == 1 and None not in first else "uncertain"
        if answer == "uncertain":
            reasons.append(f"the paper's {', '.join(s['model'] for s in large)} students led with D_high in the first "
                           "epoch and with D_low from epoch 2; between the two it does not say")
        else:
            reasons.append(f"the paper's {', '.join(s['model'] for s in large)} students: D_{answer} at {budget:g} epochs")
    if n_params < lo or n_params > hi * 1.15:
        confidence = "low"
        reasons.append(f"{n_params / 1e9:.2f}B parameters is outside the paper's students ({lo / 1e9:.2f}B to "
                       f"{hi / 1e9:.2f}B): the nearest finding is extrapolated")
    if budget > 5:
        confidence = "low"
        reasons.append(f"{budget:g} epochs is past the paper's 5-epoch runs")
    if answer == "uncertain":
        confidence = "uncertain"
    reasons.append("no probe: nothing was measured on this student; the finding is the paper's, on its pool "
                   f"({data['setting']['pool']}) and teachers")
    probs = {"high": 1.0, "low": 0.0, "mixed": 0.0} if answer == "high" else \
        {"high": 0.0, "low": 1.0, "mixed": 0.0} if answer == "low" else {"high": 1 / 3, "low": 1 / 3, "mixed": 1 / 3}
    return Advice(prior="paper", answered_by="paper prior", answer=answer if answer == "uncertain" else None,
                  strategy=answer if answer != "uncertain" else "mixed",  # a hedge when the paper is silent: half the problems on each response
                  probabilities=probs, confidence=confidence, confidence_reasons=tuple(reasons + [f"source: {cite}"]))


def prior_advice(n_params: float, budget: float, predictor=None) -> Advice:
    """The lab prior below 10^8 parameters (needs the predictor), the paper prior from there up."""
    if n_params >= PAPER_FROM:
        return paper_prior_advice(n_params, budget)
    if predictor is None:
        raise InputError("the lab prior needs a predictor folder written by `advisor fit`")
    return lab_prior_advice(predictor.meta.get("lab_prior"), n_params, budget, predictor.options)
