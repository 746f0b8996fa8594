"""What `advisor recommend` answers, as one typed value, and the files written from it.

`Recommendation` is read by the CLI's report, the manifest writer (`write_manifest`, the
`recommendation.json` that `advisor train` consumes unchanged), the advice-only writer and the
figure (`advisor.recommendation.figure`); `as_dict()` is the `--json` output. It is frozen: `recommend`
builds it from the advice (`advisor.predictor.advice.Advice`) and adds what it wrote with
`dataclasses.replace`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from capacity_advisor.advisor.predictor import CONSTANTS, Rule, SIZE_RULE
from capacity_advisor.advisor.predictor.labels import BUDGETS, model_inputs
from capacity_advisor.advisor.recommendation.schedule import Schedule
from capacity_advisor.core.files import finite, write_json
from capacity_advisor.probes.recipe import full_run_manifest
from capacity_advisor.probes.run import ProbeReport
from capacity_advisor.training.manifest import SETS
from capacity_advisor.training.manifest_checks import RACE_KEYS

BUDGET_GRID = tuple(x / 4 for x in range(2, 41))  # 0.5 .. 10 epochs, for the crossover


def crossover(curve: dict) -> float | None:
    """The first budget of BUDGET_GRID at which D_low is more likely the best than D_high."""
    return next((b for b, lo, hi in zip(BUDGET_GRID, curve["low"], curve["high"]) if lo > hi + 1e-9), None)


def baselines(predictor, n_params: float, budget: float) -> tuple[dict, str | None]:
    """What the calibration's baselines choose for this student and budget ({name: choice}, named
    as `advisor fit` names them), and the rule of thumb's thresholds in words."""
    out = dict(CONSTANTS)
    rule = Rule.from_meta((predictor.meta or {}).get("rule_of_thumb"))
    if rule is None:
        return out, None
    out[SIZE_RULE] = rule.decide(max(1.0, n_params), budget)
    words = (f"low from 10^{rule.t_params:.2f} parameters and {rule.t_budget:g} epochs"
             if math.isfinite(rule.t_params) and math.isfinite(rule.t_budget) else "always high")
    return out, words


def reason_text(r: dict) -> str:
    val = r["value"]
    val = "n/a" if val is None or (isinstance(val, float) and math.isnan(val)) else f"{val:.3g}"
    return f"{r['feature']} = {val} (moves P(D_{r['toward'].replace('not ', '')}) by {r['weight']:+.2f})"


@dataclass(frozen=True)
class Recommendation:
    schedule: Schedule  # what to train on within the budget
    answer: str  # the option, or "uncertain" where the evidence is silent (the schedule is then the hedge)
    probabilities: dict  # option -> P(best at the budget)
    confidence: str  # high | medium | low
    confidence_reasons: list[str]
    predictor: str  # what answered: the predictor's kind, or "lab prior" / "paper prior"
    model: dict  # the student's description
    budget: float  # epochs of the full run
    score: str  # the ranking: sum | mean | rsr | local
    settings: dict  # every setting recommend chose: {name: {"value", "source"}}
    curve: dict  # option -> P(best) over BUDGET_GRID
    baselines: dict = field(default_factory=dict)  # baseline name -> its choice
    rule_of_thumb: str | None = None  # the fitted rule's thresholds in words
    measurements: dict = field(default_factory=dict)  # the probe's features and the selection's gap and length ratio
    interval: dict | None = None  # option -> the ensemble's 10-90% interval
    range: list | None = None  # per input: value and calibrated range
    neighbours: list | None = None  # the nearest calibrated students
    reasons: list[str] = field(default_factory=list)  # the inputs that moved the answer most
    prior: str | None = None  # "lab" or "paper" when a prior answered
    paper_prior: dict | None = None  # the paper's finding for students of this size, beside a measurement
    probe: ProbeReport | None = None  # the probe report (curves, features, cost)
    selection: dict | None = None  # the selected set's summary
    train_rows: int = 0
    eval_rows: int = 0
    checker: str = "none"  # the eval set's answer checker
    pool: dict | None = None  # the pool's summary (None: advice only, nothing read)
    answered_by: str = "predictor"  # the predictor, its fallback (always D_high / the paper's findings), or a prior
    policy: str | None = None  # the shipped policy in words: when the predictor answers and when the fallback does
    options: tuple = SETS  # what the predictor chooses among (its calibrated options)
    notes: list[str] = field(default_factory=list)  # what the user should know about the outputs
    draws: list | None = None  # --probe-repeats: each probe draw's own advice (seed, strategy, probabilities)
    calibrated_on: dict | None = None  # the user's own calibrated pool source this pool belongs to, and its proxies
    race: dict | None = None  # the race the policy's gate opened (draws.race_plan): `advisor train` runs it
    seconds: float = 0.0

    @property
    def strategy(self) -> str:
        return self.schedule.option

    @property
    def inputs(self) -> dict:
        """The columns the predictor read (or would read) at this budget and ranking."""
        return model_inputs(self.measurements, self.budget, self.score)

    @property
    def calibrated_budget(self) -> str:
        """The calibration budget nearest this run's, as the neighbours' outcomes are keyed ("3")."""
        return f"{min(BUDGETS, key=lambda b: abs(b - self.budget)):g}"

    @property
    def crossover_epoch(self) -> float | None:
        return crossover(self.curve)

    @property
    def probe_cost(self) -> dict | None:
        return self.probe.cost if self.probe else None

    @property
    def probe_share(self) -> float | None:
        """The probe's tokens as a share of the full run's over the budget."""
        cost = self.probe_cost or {}
        per_epoch = cost.get("full_run_tokens_per_epoch")
        return cost["probe_tokens"] / (per_epoch * self.budget) if per_epoch else None

    def value(self, setting: str):
        return self.settings[setting]["value"]

    def as_dict(self) -> dict:
        """The `--json` output."""
        return {
            "strategy": self.strategy, "answer": self.answer, "mix": self.schedule.mix,
            "switch_epoch": self.schedule.switch_epoch, "probabilities": self.probabilities, "interval": self.interval,
            "crossover_epoch": self.crossover_epoch, "confidence": self.confidence,
            "confidence_reasons": self.confidence_reasons, "range": self.range, "neighbours": self.neighbours,
            "reasons": self.reasons, "paper_prior": self.paper_prior, "prior": self.prior, "predictor": self.predictor,
            "answered_by": self.answered_by, "policy": self.policy, "options": list(self.options),
            "baselines": self.baselines, "model": self.model, "budget": self.budget, "features": self.inputs,
            "settings": self.settings, "selection": self.selection, "train_rows": self.train_rows,
            "eval_rows": self.eval_rows, "probe_cost": self.probe_cost, "seconds": self.seconds, "notes": self.notes,
            "race": self.race,
            **({"pool": self.pool} if self.pool is not None else {}),
            **({"calibrated_on": self.calibrated_on} if self.calibrated_on else {}),
            **({"draws": self.draws, "draws_agree": len({d["strategy"] for d in self.draws}) == 1}
               if self.draws else {}),
        }


def recommendation(advice, curve: dict, predictor, desc: dict, settings: dict, budget: float, score: str,
                   **measured) -> Recommendation:
    """The Recommendation of an `Advice` at this budget and ranking, before the outputs are written
    (`measured`: the probe's measurements, draws, calibrated source and report, where a probe ran)."""
    schedule, why = Schedule.parse(advice.strategy).within(budget)
    rules, rule_words = baselines(predictor, desc["n_params"], budget)
    return Recommendation(
        schedule=schedule, answer=advice.answer or schedule.option,
        probabilities=advice.probabilities, confidence=advice.confidence,
        confidence_reasons=list(advice.confidence_reasons) + ([why] if why else []),
        predictor=f"{advice.prior} prior" if advice.prior else predictor.kind, model=desc, budget=budget,
        score=score, settings=settings, curve=curve, baselines=rules, rule_of_thumb=rule_words,
        interval=advice.interval, range=advice.range, neighbours=advice.neighbours,
        reasons=[reason_text(r) for r in advice.reasons], prior=advice.prior,
        paper_prior=advice.paper_prior.as_dict() if advice.paper_prior else None,
        answered_by=advice.answered_by, policy=advice.policy, options=tuple(predictor.options), **measured)


def write_manifest(rec: Recommendation, out: Path, recipe, spec: str, teacher: str | None, seed: int,
                   sets: dict | None = None) -> None:
    """OUT/recommendation.json: the training manifest of the recommended set (`advisor train`) under
    the probe's `recipe` (`probes.recipe.full_run_manifest`: as calibration's full runs are built);
    `sets` names the data files of D_high / D_low besides it (`advisor train --race`), and `race` the
    race the policy's gate opened, which `advisor train` then runs without a flag."""
    manifest = full_run_manifest(
        recipe, epochs=float(rec.budget), learning_rate=rec.value("learning_rate"), seed=seed,
        eval={"path": "eval.jsonl" if rec.eval_rows else None, "checker": rec.checker if rec.eval_rows else "none",
              "teacher": teacher},
        training={"switch_epoch": rec.schedule.switch_epoch},
        model={**{k: x for k, x in rec.model.items() if k != "path"}, "spec": spec},
        dataset="train.jsonl",
        strategy=rec.schedule.strategy,
        mix=rec.schedule.mix,
        probabilities=rec.probabilities,
        crossover_epoch=rec.crossover_epoch,
        confidence=rec.confidence,
        reasons=rec.reasons + rec.confidence_reasons,
        features=finite(rec.inputs),  # strict JSON: a measurement that does not apply is null
        pool=finite(rec.pool),
        sets=dict(sets or {}),
        race=None if rec.race is None else {k: rec.race.get(k) for k in RACE_KEYS if k in rec.race},
    )
    manifest.to_json(out / "recommendation.json")


def write_advice(rec: Recommendation, out: Path) -> None:
    """OUT/recommendation.json without a dataset: advice from the parameter count and budget."""
    write_json(out / "recommendation.json", finite({
        "version": 1, "advice_only": True, "strategy": rec.strategy, "answer": rec.answer,
        "probabilities": rec.probabilities, "crossover_epoch": rec.crossover_epoch, "confidence": rec.confidence,
        "confidence_reasons": rec.confidence_reasons, "prior": rec.prior, "model": rec.model, "budget": rec.budget,
        "dataset": None, "next": "rerun with --pool to get the selected dataset and a training manifest"}))
