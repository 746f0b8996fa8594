"""Pure metrics on a checkpoint's generations: repetition loops, answer rate, pass@1.

    from capacity_advisor.training.metrics import extract_final_answer, generation_metrics
    extract_final_answer("... so the answer is \\boxed{\\frac{1}{2}}") -> "\\frac{1}{2}"
    generation_metrics(["|3,7;A7"], ["7"], checker="lab")           -> {"accuracy": 1.0, ...}

The loop detector and the answer checkers are the ones in `training.text_metrics`, shared with
the probes room, so a probe's repetition rate and a full run's are the same number by construction
(the predictor compares them). This module adds the per-checkpoint summary the RunRecord stores.
"""

from __future__ import annotations

from statistics import mean
from typing import Sequence

from capacity_advisor.training.text_metrics import check_answer, extract_answer, math_checker_name, repetition_rate


def extract_final_answer(text: str, checker: str = "math") -> str | None:
    """The generation's final answer: the lab's `;A<n>` for lab tasks; for math the last
    `\\boxed{}` (nested braces kept), else the text after "the answer is"; None when absent."""
    return extract_answer(text, checker)


def checker_name(checker: str) -> str:
    """What actually checked the answers, for eval.jsonl: lab, math-verify, boxed-string-match or none."""
    return math_checker_name() if checker == "math" else checker


def generation_metrics(texts: Sequence[str], answers: Sequence[str | None], checker: str) -> dict:
    """accuracy (pass@1; None when the checker is none or no reference exists), repetition_rate,
    answer_rate (None with checker none), mean_chars."""
    if not texts:
        return {"accuracy": None, "repetition_rate": None, "answer_rate": None, "mean_chars": None}
    has_refs = checker != "none" and any(a is not None for a in answers)
    return {
        "accuracy": float(mean(check_answer(t, a, checker) for t, a in zip(texts, answers))) if has_refs else None,
        "repetition_rate": float(repetition_rate(texts)),
        "answer_rate": float(mean(extract_answer(t, checker) is not None for t in texts)) if checker != "none" else None,
        "mean_chars": float(mean(len(t) for t in texts)),
    }
