"""How a response is ranked among a problem's candidates, by the student's own scores.

One rule for `advisor select` and for re-ranking during training (`training.rerank`): each
candidate's score row (`advisor score`'s layout) gives a value under a ranking, higher = the
D_high end, and each problem's highest and lowest candidates are its high and low responses.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

SCORE_FIELDS = {"mean": "logprob_mean", "sum": "logprob_sum", "rsr": "rank_mean", "local": "logprob_local"}
RANKINGS = tuple(SCORE_FIELDS)
DEFAULT_RANKING = "sum"  # the paper's: summed log-probability of the response


def score_value(row: dict, score: str) -> float:
    """How natural a response is to the student under a ranking (higher = the D_high end).

    sum: its log-likelihood (the paper's π(y|x)); mean: per token (GRAPE's); rsr: minus the
    rank-surprisal ratio of arXiv 2601.14249 (mean token rank over mean token NLL under the
    student; the paper finds a low ratio marks the most suitable trajectories, so they rank high);
    local: the step-local average log-probability of arXiv 2510.03988 (`models.local`).
    """
    if score == "rsr":
        nll = -row["logprob_mean"]
        return -row["rank_mean"] / nll if nll > 0 else float("-inf")
    return row[SCORE_FIELDS[score]]


def extremes(values: Mapping[int, float]) -> tuple[int, int]:
    """(argmax, argmin) over candidate index -> score; ties go to the lower index."""
    ks = sorted(values)
    hi = max(ks, key=lambda k: (values[k], -k))
    lo = min(ks, key=lambda k: (values[k], k))
    return hi, lo


def low_share(ids: Sequence[str], mix: float, seed: int) -> set[str]:
    """The problems a mixed set gives their low response: a share `mix` of `ids`, drawn with `seed`
    (the same draw for `advisor select` and for re-ranking during training)."""
    n = round(mix * len(ids))
    return set(random.Random(seed).sample(list(ids), n)) if n else set()
