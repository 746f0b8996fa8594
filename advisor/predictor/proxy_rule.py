"""The proxy rule: advise a large student on a pool from what that pool's small proxies found.

    rule = choose_rule(rows)                        # top and margin, chosen on the rows' sources
    gap = proxy_gap(proxies, budget=3, ranking_sum=1.0, top=rule.top)
    rule.choose(gap)                                # "low" when the proxies' D_low led by more than the margin

The fitted predictor reads a student's probe; the proxy rule reads no probe at all: it is the
evidence a user's own proxy runs give directly — how much better D_low did than D_high (the best
held-out accuracy within the budget, as the labels count it) for the largest `top` proxies on the
same pool, averaged over their seeds — and it answers D_low when that lead exceeds `margin`, D_high
otherwise. It is DataDecide's idea (arXiv 2504.11393: rank data by small-scale runs) applied to
D_high against D_low. It cannot see a crossover that happens above the proxies' size; the fitted
predictor, which does read the large student's probe, sometimes can: `either` takes D_low when
either of them does.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from statistics import mean
from typing import Sequence

from capacity_advisor.advisor.predictor.evaluate import PROXY_CUT, regret
from capacity_advisor.core.numbers import number, whole
from capacity_advisor.advisor.predictor.labels import ranking_sum as ranking_sum_of

TOPS = (1, 2, 3, None)  # the largest 1, 2, 3 proxies, or all of them
MARGINS = (0.0, 0.02, 0.05, 0.1)  # D_low's least mean lead over D_high (accuracy, 0..1)


@dataclass(frozen=True)
class ProxyRule:
    top: int | None = 2  # the largest `top` proxies by parameters (None: all)
    margin: float = 0.05  # D_low when the proxies' mean lead of D_low over D_high exceeds it

    def choose(self, gap: float | None) -> str:
        return "low" if gap is not None and gap > self.margin else "high"

    def to_dict(self) -> dict:
        return {"top": self.top, "margin": self.margin}

    @classmethod
    def from_dict(cls, raw) -> "ProxyRule | None":
        """A rule read from a predictor file (user input): None unless well formed."""
        if not isinstance(raw, dict):
            return None
        top, margin = raw.get("top"), raw.get("margin")
        if top is not None and not whole(top, 1, 64):
            return None
        if not (number(margin) and 0 <= margin < 1):
            return None
        return cls(top, float(margin))


def lead(row: dict) -> float:
    """D_low's best held-out accuracy within the row's budget minus D_high's."""
    acc = row["accuracy"]
    return acc.get("low", 0.0) - acc.get("high", 0.0)


def proxy_gap(proxies: Sequence[dict], budget: float, ranking_sum: float, top: int | None) -> float | None:
    """The mean lead of D_low over D_high of the largest `top` proxies at this budget and ranking
    (each proxy's seeds averaged first), or None where no proxy was run there."""
    here = [r for r in proxies if r["budget"] == budget and ranking_sum_of(r["score"]) == ranking_sum]
    per_size = {n: mean(lead(r) for r in here if r["n_params"] == n) for n in {r["n_params"] for r in here}}
    return largest_mean(per_size, top)[1]


def largest_mean(per_size: dict, top: int | None) -> tuple[list, float | None]:
    """(the largest `top` sizes of {n_params: lead}, their mean lead; None without any)."""
    sizes = sorted(per_size)
    keep = sizes if top is None else sizes[-top:]
    return keep, (mean(per_size[n] for n in keep) if keep else None)


def gaps_by_source(rows: Sequence[dict], cut: float = PROXY_CUT) -> dict:
    """{source: the rows of its students below `cut`}: every source's proxies."""
    out: dict = {}
    for r in rows:
        if (r["n_params"] or 0) < cut:
            out.setdefault(r["source"], []).append(r)
    return out


def rule_picks(rows: Sequence[dict], test: Sequence[dict], rule: ProxyRule, cut: float = PROXY_CUT) -> list[tuple[dict, str]]:
    """(row, the rule's choice) for every `test` row, from the proxies of its source in `rows`."""
    proxies = gaps_by_source(rows, cut)
    return [(r, rule.choose(proxy_gap(proxies.get(r["source"], ()), r["budget"],
                                      ranking_sum_of(r["score"]), rule.top))) for r in test]


# Half a point of regret, the size of the label noise floor (docs/results.md §4): a rule that is
# better by less than that on the training sources is not told apart from a more cautious one.
# (At 0.05 points, the 48 runs of other pretraining builds on one scripted source made the rule
# chosen elsewhere fire at margin 0 and lose to always-high on four held-out sources.)
NEAR_TIE = 0.005


def choose_rule(rows: Sequence[dict], cut: float = PROXY_CUT) -> ProxyRule:
    """The (top, margin) with the lowest regret on the large students of every source in `rows`
    that holds proxies, each advised from its own source's proxies; rules within `NEAR_TIE` of the
    best are ties, and a tie goes to the more cautious rule (the larger margin, then fewer proxies
    read)."""
    large = [r for r in rows if (r["n_params"] or 0) >= cut]
    proxies, gaps = gaps_by_source(rows, cut), {}

    def gap(r: dict, top: int | None) -> float | None:  # one per source, budget, ranking and top: not per margin
        key = (r["source"], r["budget"], ranking_sum_of(r["score"]), top)
        if key not in gaps:
            gaps[key] = proxy_gap(proxies.get(r["source"], ()), r["budget"], key[2], top)
        return gaps[key]

    scored = []
    for top, margin in product(TOPS, MARGINS):
        rule = ProxyRule(top, margin)
        picks = [(r, rule.choose(gap(r, top))) for r in large]
        scored.append((mean(regret(r, c) for r, c in picks) if picks else 0.0, rule))
    best = min(s for s, _ in scored)
    near = [r for s, r in scored if s <= best + NEAR_TIE]
    return max(near, key=lambda r: (r.margin, -(r.top or 99)))


def either(policy_choice: str, rule_choice: str) -> str:
    """D_low where the proxy rule says so, else the policy's choice."""
    return "low" if rule_choice == "low" else policy_choice
