"""The scoring benchmark's accuracy measure: bf16 scores against fp32 scores of the same pairs.

`compare` gives |Δ| per pair of the mean and summed log-probs, their Spearman rank correlation
(`spearman`, average ranks for ties) and how often the high / low pick of a problem (a run of
`group` consecutive pairs) changes, by index and, given the candidates' texts, by text.
"""

from __future__ import annotations

import numpy as np


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    return float(np.corrcoef(ra, rb)[0, 1])


def compare(ref: list[dict], test: list[dict], group: int, texts: list | None = None) -> dict:
    """bf16 (`test`) against fp32 (`ref`) scores of the same pairs.

    Problems are consecutive runs of `group` pairs. A pick "flips" when the candidate chosen by
    argmax (high) or argmin (low) differs between the two; with `texts`, only a change to a
    candidate with a different text counts (identical duplicate candidates are interchangeable).
    """
    d_mean = np.array([abs(r["logprob_mean"] - t["logprob_mean"]) for r, t in zip(ref, test)])
    d_sum = np.array([abs(r["logprob_sum"] - t["logprob_sum"]) for r, t in zip(ref, test)])
    out = {
        "pairs": len(ref), "group": group, "problems": len(ref) // group,
        "max_abs_diff_logprob_mean": float(d_mean.max()), "mean_abs_diff_logprob_mean": float(d_mean.mean()),
        "max_abs_diff_logprob_sum": float(d_sum.max()), "mean_abs_diff_logprob_sum": float(d_sum.mean()),
        "spearman_logprob_mean": spearman([r["logprob_mean"] for r in ref], [t["logprob_mean"] for t in test]),
        "spearman_logprob_sum": spearman([r["logprob_sum"] for r in ref], [t["logprob_sum"] for t in test]),
    }
    n_prob = len(ref) // group
    for key in ("logprob_mean", "logprob_sum"):
        flips = {"high": 0, "low": 0, "high_index": 0, "low_index": 0}
        for p in range(n_prob):
            sl = slice(p * group, (p + 1) * group)
            a = np.array([r[key] for r in ref[sl]])
            b = np.array([t[key] for t in test[sl]])
            tx = texts[sl] if texts is not None else list(range(group))
            for pick, fn in (("high", np.argmax), ("low", np.argmin)):
                i, j = int(fn(a)), int(fn(b))
                flips[pick + "_index"] += i != j
                flips[pick] += tx[i] != tx[j]
        out[f"flip_rate_{key}"] = {k: v / n_prob for k, v in flips.items()}
    return out
