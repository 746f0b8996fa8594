"""Advice from more than one measurement: `recommend --probe-repeats N`'s draws, and a pool the
user calibrated with their own proxies.

The draws (OUT/probe, OUT/probe-2, ...) are averaged into the inputs the advice reads
(`mean_features`), their cost summed (`combined_cost`), and each draw's own advice set beside it
(`draw_advice`, `draws_line`); `calibrated_line` is the report's line for a pool the predictor's
own sources include (`predictor.calibrated_source`), and `by_proxy_rule` turns the advice to D_low
where those proxies' own runs put D_low ahead (`predictor.proxy_rule`); `race_note` what a race of
the two sets on the student would cost instead.
"""

from __future__ import annotations

import math
import re

from capacity_advisor.advisor.predictor.proxy_rule import ProxyRule, largest_mean
from capacity_advisor.probes.run import POOL_CONTRASTS, ProbeReport


def probe_folder(draw: int) -> str:
    """OUT/probe for the first draw, OUT/probe-2, OUT/probe-3, ... for the repeats."""
    return "probe" if draw == 0 else f"probe-{draw + 1}"


def mean_features(reports: list[ProbeReport]) -> dict:
    """The draws' probe inputs averaged, each over the draws that measured it (NaN where none did)."""
    out = {}
    for k in reports[0].features:
        vals = [float(v) for v in (r.features.get(k) for r in reports)
                if isinstance(v, (int, float)) and math.isfinite(v)]
        out[k] = sum(vals) / len(vals) if vals else float("nan")
    return out


def combined_cost(reports: list[ProbeReport]) -> dict:
    """The probe cost of every draw together, against the same full run."""
    cost = dict(reports[0].cost)
    for k in ("probe_train_tokens", "probe_eval_tokens", "probe_tokens"):
        cost[k] = sum(r.cost[k] for r in reports)
    per_epoch = cost.get("full_run_tokens_per_epoch")
    cost["share_of_full_run"] = {e: cost["probe_tokens"] / (per_epoch * int(e)) for e in cost["share_of_full_run"]} \
        if per_epoch else {}
    if all(r.cost.get("probe_generated_tokens") is not None for r in reports):
        cost["probe_generated_tokens"] = sum(r.cost["probe_generated_tokens"] for r in reports)
        work = cost["probe_train_tokens"] + cost["probe_generated_tokens"]
        cost["share_trained_generated"] = {e: work / (per_epoch * int(e)) for e in cost["share_of_full_run"]} \
            if per_epoch else {}
    else:
        cost.pop("probe_generated_tokens", None)
        cost.pop("share_trained_generated", None)
    cost["draws"] = len(reports)
    return cost


def calibrated_line(predictor, own: dict) -> str:
    """'calibrated on your pool: ...' — the proxies, their sizes and budget, and what the proxy
    split measured for a student advised this way (when the predictor's tables hold it)."""
    proxies = ", ".join(f"{s} ({n:,} params)" for s, n in zip(own["students"], own["n_params"]))
    line = (f"calibrated on your pool: {len(own['students'])} proxies ({proxies}"
            + (f"; up to {own['epochs']:g} epochs" if own.get("epochs") else "") + f"), source {own['source']}; the "
            "policy's thresholds for this case were chosen on the proxy split")
    proxy = (((predictor.meta or {}).get("cv") or {}).get("proxy") or {}).get("methods", {})
    way = "policy or proxy rule" if (predictor.meta or {}).get("proxy_rule") and "policy or proxy rule" in proxy else "policy"
    mine, high = (proxy.get(m, {}).get("regret") for m in (way, "always high"))
    if isinstance(mine, (int, float)) and isinstance(high, (int, float)):
        line += (f"; on the calibration records a large student advised so lost {mine:.2f} points of accuracy on "
                 f"average (always-high {high:.2f})")
    return line


def proxy_rule_answer(predictor, own: dict, budget: float, score: str) -> tuple[str, str] | None:
    """What the proxy rule (`predictor.proxy_rule`) answers from the user's own proxies on this
    pool, and the report's line on it: the lead of D_low over D_high that the largest proxies
    measured at the calibrated budget nearest this run's. None where the predictor holds no rule or
    the proxies ran no such budget."""
    rule = ProxyRule.from_dict((predictor.meta or {}).get("proxy_rule"))
    leads = [x for x in own.get("proxy_leads") or [] if x[2] == float(score == "sum")]
    if rule is None or not leads:
        return None
    ran = sorted({x[1] for x in leads})
    at = min(ran, key=lambda b: (abs(b - budget), -b))
    keep, gap = largest_mean({x[0]: x[3] for x in leads if x[1] == at}, rule.top)
    choice = rule.choose(gap)
    names = ", ".join(s for s, n in zip(own["students"], own["n_params"]) if n in keep) or f"{len(keep)} proxies"
    line = (f"your proxies ({names}) trained on D_low led D_high by {100 * gap:+.1f} points of held-out accuracy at "
            f"{at:g} epochs; the proxy rule (D_low from a lead of {100 * rule.margin:g} points, chosen on the lab's "
            f"sources) says D_{choice}")
    return choice, line


def by_proxy_rule(cfg, predictor, calibrated: dict, advice, notes: list):
    """On a pool the user calibrated (`cfg`: recommend's settings): D_low where the proxy rule reads
    a lead of D_low in the proxies' own runs, the policy's `advice` otherwise; the rule's line joins
    `notes`."""
    from dataclasses import replace

    answer = proxy_rule_answer(predictor, calibrated, cfg.budget, cfg.score)
    if answer is None:
        return advice
    choice, line = answer
    notes.append(line)
    if choice == "low" and advice.strategy != "low":
        return replace(advice, strategy="low", answered_by="the proxy rule", confidence="medium",
                       confidence_reasons=(f"the proxy rule: D_low, where the policy said D_{advice.strategy}",)
                       + advice.confidence_reasons)
    return advice


def pool_contrasts(context: dict) -> dict:
    """What the selection measured on the pool without training (`probes.run.POOL_CONTRASTS`), from
    a probe stage's context (NaN where a context from before lacks one)."""
    return {k: context.get(k, math.nan) for k in POOL_CONTRASTS}


def draw_advice(cfg, predictor, policy, desc: dict, context: dict, reports: list[ProbeReport]) -> list[dict]:
    """What each probe draw alone would have advised (`cfg`: recommend's settings — seed, budget,
    ranking, model): its seed, the policy's set, who answered, and the predictor's probabilities
    on that draw's inputs."""
    out = []
    for r, report in enumerate(reports):
        given = {**pool_contrasts(context), **report.features}
        measured = {k: float("nan") if v is None else v for k, v in given.items()}
        d = policy.decide(predictor, measured, desc["n_params"], cfg.budget, cfg.score, student=cfg.model)
        out.append({"seed": cfg.seed + r, "strategy": d.strategy, "answered_by": d.answered_by,
                    "probabilities": d.advice.probabilities, "probe": probe_folder(r)})
    return out


def draws_line(draws: list[dict], averaged: str) -> tuple[str, bool]:
    """The confidence line on the draws, and whether they agree."""
    each = ", ".join(f"seed {d['seed']} D_{d['strategy']} (P(D_low) {d['probabilities'].get('low', float('nan')):.2f})"
                     for d in draws)
    agree = len({d["strategy"] for d in draws}) == 1
    if agree:
        return f"the {len(draws)} probe draws agree: {each}; the advice reads their averaged inputs", True
    return (f"the {len(draws)} probe draws disagree: {each}; the advice (D_{averaged}) reads their averaged inputs, "
            "and which set wins here depends on the draw"), False


RACE_FRACTION = 0.5  # the race the report prices: half the budget, as the README's example runs it


def race_note(predictor, out) -> str | None:
    """What racing D_high against D_low on this student would cost instead of trusting the advice,
    from the races the predictor's fit replayed on its own records (`meta.races`); None without them."""
    races = {r["method"]: r for r in (predictor.meta or {}).get("races") or []}
    race = next((r for r in races.values() if r.get("fraction") == RACE_FRACTION), None)
    high = races.get("always high")
    if race is None or high is None:
        return None
    return (f"a race instead: advisor train {out}/recommendation.json --out RUN --race {RACE_FRACTION:g} trains D_high and D_low "
            f"side by side for {RACE_FRACTION:.0%} of the budget and keeps the leader, {race['overhead']:.0%} more training "
            f"than one run; replayed on the {race['rows']} rows of this predictor's calibration records it lost "
            f"{race['regret']:.2f} points of accuracy on average, always-high {high['regret']:.2f}")


PLAIN = re.compile(r"[\w .,:/@+()'-]+")  # names a report prints as they are: no markup, no control characters


def plain(v, most: int) -> bool:
    """`v` is text of at most `most` characters a report prints as it is (no markup, no control
    characters, no `:name:` a console would turn into an emoji)."""
    return (isinstance(v, str) and 0 < len(v) <= most and PLAIN.fullmatch(v) is not None
            and re.search(r":[\w+-]+:", v) is None)


def plain_list(v) -> bool:
    return isinstance(v, list) and 0 < len(v) <= 1000 and all(plain(x, 200) for x in v)


def judged_elsewhere(predictor) -> dict | None:
    """The predictor's first judgment on rows it was never fitted on (meta.transfer, stored by
    `python -m experiments.transfer --store`) of the gate it ships (the entry's `gate` is its
    meta.policy.race), as {"name", "rows", "students", "sources", "regret", "overhead",
    "overhead_tokens" (None where not stated), "always_high_regret"}; None where the file states
    none, or none that reads as one (a predictor file may come from anyone: a value of another type
    or range is passed over, not trusted)."""
    meta = predictor.meta or {}
    entries = meta.get("transfer")
    policy = meta.get("policy")
    gate = policy.get("race") if isinstance(policy, dict) else None
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("gate") != gate:  # a judgment of another gate says nothing of this one
            continue
        methods = e.get("methods") if isinstance(e.get("methods"), dict) else {}
        gated, high = methods.get("gated race"), methods.get("always high")
        name, rows, students, sources = e.get("name"), e.get("rows"), e.get("students"), e.get("sources")
        if not (plain(name, 80) and isinstance(rows, int) and not isinstance(rows, bool)
                and rows > 0 and plain_list(students) and plain_list(sources) and isinstance(gated, dict) and isinstance(high, dict)):
            continue
        nums = [gated.get("regret"), gated.get("overhead"), high.get("regret")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= most
                   for v, most in zip(nums, (100, 1, 100))):  # points, a share of one run, points
            continue
        tokens = gated.get("overhead_tokens")  # the same training in tokens, where the entry states it
        tokens = float(tokens) if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and \
            0 <= tokens <= 100 else None
        return {"name": name, "rows": rows, "students": list(students), "sources": list(sources),
                "regret": float(nums[0]), "overhead": float(nums[1]), "overhead_tokens": tokens,
                "always_high_regret": float(nums[2])}
    return None


def race_plan(predictor, race: dict | None, real_student: bool = False, token_ratio: float | None = None) -> dict | None:
    """The race the policy's gate opened ({"fraction", "wait", "why"}, `Decision.race`) with what the
    gated race was measured to cost and lose leaving each pool source out (`expected`: regret in
    points, mean overhead and, where the predictor states it, the mean overhead of the races it
    opened, from meta.cv.source.methods["gated race"]) and always-high's regret on the same rows;
    for a student that is not a lab student (`real_student`), also what the same plan did on a real
    student's rows the predictor was never fitted on, where it states that (`elsewhere`,
    `judged_elsewhere`). `token_ratio` (D_low's tokens an epoch over D_high's): what the race trains
    beyond the kept set's run counted in tokens, as a share of that run (`extra_tokens`: its
    longest stop share times the losing set's tokens over the kept one's, where D_high is kept and
    where D_low is). None where the gate stayed shut."""
    if race is None:
        return None
    methods = (((predictor.meta or {}).get("cv") or {}).get("source") or {}).get("methods") or {}
    gated, high = methods.get("gated race") or {}, methods.get("always high") or {}
    # the replay of the race as `advisor train` runs it (evaluated at its stop shares), where the fit has it
    shares = gated.get("at_shares") if isinstance(gated.get("at_shares"), dict) else {}
    at_shares = all(isinstance(shares.get(k), (int, float)) for k in ("regret", "overhead"))
    gated = shares if at_shares else gated
    measured = all(isinstance(gated.get(k), (int, float)) for k in ("regret", "overhead"))
    where_open = gated.get("overhead_where_open")
    expected = {"regret": gated["regret"], "overhead": gated["overhead"],
                "overhead_where_open": where_open if isinstance(where_open, (int, float)) else None} if measured else None
    replayed = ("each race evaluated at its stop shares" if at_shares
                else "each race stopped at the schedule's next evaluation")
    elsewhere = judged_elsewhere(predictor) if real_student else None
    most = max(v for v in (race.get("fraction"), race.get("wait"), race.get("tie")) if isinstance(v, (int, float)))
    tokens = {"ratio": token_ratio, "keep_high": most * token_ratio, "keep_low": most / token_ratio} \
        if isinstance(token_ratio, (int, float)) and math.isfinite(token_ratio) and token_ratio > 0 else None
    return {**race, "expected": expected, **({"elsewhere": elsewhere} if elsewhere else {}),
            **({"extra_tokens": tokens} if tokens else {}),
            "always_high_regret": high.get("regret") if measured else None,
            "measured_on": f"the predictor's held-out table, one pool source left out at a time (meta.cv.source; "
                           f"{replayed})"}


def race_headline(plan: dict) -> str:
    """The report's first line for a planned race: this race's own cost, then what racing only where
    the gate opens cost and lost on average over held-out pool sources (most of them raced nothing)."""
    f, w, k = plan["fraction"], plan.get("wait"), plan.get("k")
    if k is not None:
        line = (f"Race D_high against D_low until one leads by more than {plan.get('margin', 0.05):.0%} and the noise at "
                f"{k} evaluation{'s' if k > 1 else ''} in a row"
                + (" (D_high only once D_low is not gaining)" if plan.get("patient") else "") + ", at most "
                + ("to the end of your budget" if f >= 1 else f"to {f:.0%} of it")
                + ", then keep the leader (up to " + ("a second full run" if f >= 1 else f"{f:.0%} more training") + ")")
    elif f >= 1:
        line = "Race D_high against D_low: train both to the end of your budget and keep the better (a second full run)"
    else:
        line = (f"Race D_high against D_low for {f:.0%} of your budget"
                + (f" ({w:.0%} while D_low is behind and gaining)" if w else "")
                + f", then keep the leader (about {f:.0%}" + (f" to {w:.0%}" if w else "") + " more training than one run)")
    if plan.get("tie") is not None:
        line += (f"; at {plan['tie']:.0%} of the budget it stops for D_high unless D_low has led or is gaining "
                 f"(about {plan['tie']:.0%} more training then)")
    if plan.get("hold"):
        line += (f"; D_low is kept only on a lead beyond {plan['hold']:g} standard error{'' if plan['hold'] == 1 else 's'} "
                 "of the held-out problems")
    e = plan.get("expected")
    if e:
        opened = e.get("overhead_where_open")
        line += (f"; racing only where the gate opens cost {e['overhead']:.0%} more training on average over held-out "
                 + (f"pool sources ({opened:.0%} of a run where it opened)" if opened is not None else "pool sources")
                 + f", expected loss {e['regret']:.1f} points ({plan['always_high_regret']:.1f} without races)")
    w = plan.get("elsewhere")
    if w:
        line += (f"; judged where it was never fitted ({w['name']}: {', '.join(w['students'][:3])}, "
                 f"{len(w['sources'])} pool source{'s' if len(w['sources']) != 1 else ''}, {w['rows']} rows) it lost "
                 f"{w['regret']:.1f} points at {w['overhead']:.0%} more training"
                 + (f" ({w['overhead_tokens']:.0%} more tokens)" if w.get("overhead_tokens") is not None else "")
                 + f" ({w['always_high_regret']:.1f} without races)")
    return line

