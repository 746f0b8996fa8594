"""What the predictor, the two priors and the policy answer, as typed values.

    advice = pred.advise(measured, budget, score)  # Advice: the predictor on a probe's measurements
    advice = prior_advice(n_params, budget, pred)  # Advice: the lab or the paper prior, no probe
    decision = policy.decide(pred, measured, n_params, budget, score)   # Decision: who answered, and why
    final = decision.advice_given(policy.describe(), pred.reasons(measured, budget, score))   # what recommend reports

`Advice` is one answer with its evidence: the set, the probabilities (and the ensemble's interval),
the confidence with its reasons, the range check and the nearest calibrated students where a probe
was measured, and who gave it. `Decision` is the policy's choice over a predictor's `Advice`: the
set it keeps, who answered (the predictor, the policy's always-D_high, or a fallback) and why.
Both are frozen; a changed answer is a new value (`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Advice:
    strategy: str  # the set to train on: high | low | mixed
    probabilities: dict  # option -> P(best at the budget)
    confidence: str  # high | medium | low | uncertain
    confidence_reasons: tuple = ()  # the confidence in words, most important first
    interval: dict | None = None  # option -> the ensemble's 10-90% interval (the predictor only)
    range: list | None = None  # per measured input: value, calibrated range, inside (the predictor only)
    neighbours: list | None = None  # the nearest calibrated units, nearest first (the predictor only)
    outside: bool = False  # some measured input lies outside its calibrated range
    prior: str | None = None  # "lab" or "paper" when a prior answered (no probe)
    answer: str | None = None  # what to say when it differs from the set: "uncertain" (the paper prior's hedge)
    answered_by: str = "predictor"  # the predictor, the policy's always-D_high, a fallback, or a prior
    policy: str | None = None  # the policy in words, where a policy chose
    reasons: tuple = ()  # the inputs that moved the answer most (`Predictor.reasons`)
    paper_prior: "Advice | None" = None  # the paper's finding for a student of this size, beside a measurement

    @property
    def said(self) -> str:
        """The answer in words: the set, or "uncertain" where the evidence is silent."""
        return self.answer or self.strategy

    def lower(self, *reasons: str) -> "Advice":
        """The same advice at low confidence, with `reasons` first."""
        return replace(self, confidence="low", confidence_reasons=tuple(reasons) + self.confidence_reasons)

    def as_dict(self) -> dict:
        """The paper prior's finding as the report and `--json` show it."""
        return {"prior": self.prior, "answer": self.said, "strategy": self.strategy,
                "probabilities": self.probabilities, "confidence": self.confidence,
                "confidence_reasons": list(self.confidence_reasons)}


PROBE_RACE = "the probe's race"  # Decision.answered_by where the gate takes the probe's own lead (for D_low, or D_high)
POOL_GAP = "the pool's likelihood gap"  # ... where it takes D_low by the pool's per-token likelihood gap (`Gate.gap_scout`)


@dataclass(frozen=True)
class Decision:
    strategy: str  # the set the policy keeps
    answered_by: str  # "predictor", "the policy: always D_high", PROBE_RACE, POOL_GAP, or "fallback: ..."
    why: str  # in words
    advice: Advice  # the predictor's own advice, which the policy read
    distance_ratio: float  # the nearest calibrated student's distance over the typical distance
    outside: bool  # some measured input lies outside its calibrated range
    race: dict | None = None  # where the policy's gate opens: {"fraction", "wait", "why"} of the race to run

    def advice_given(self, policy_words: str, reasons=()) -> Advice:
        """The predictor's advice as the policy gives it: its set, who answered and why first among
        the confidence reasons when that is not the predictor's own choice, and low confidence when a
        fallback answered."""
        own = self.advice
        given = replace(own, strategy=self.strategy, answered_by=self.answered_by, policy=policy_words,
                        reasons=tuple(reasons))
        if self.answered_by == "predictor" and self.strategy == own.strategy:
            return given
        line = (f"{self.answered_by}: {self.why}; the predictor alone would say D_{own.strategy} "
                f"(P = {own.probabilities[own.strategy]:.2f})")
        given = replace(given, confidence_reasons=(line,) + own.confidence_reasons)
        if self.answered_by in (PROBE_RACE, POOL_GAP):  # measured on held-out problems or the pool, not a guess
            return replace(given, confidence="medium")
        return given.lower() if self.answered_by != "predictor" else given
