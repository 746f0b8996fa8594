"""The checks a predictor file passes before any of it is used: a strict JSON parse, and the
fields outside the members (the unit table, `meta`) checked for type, shape and range.

The parse is `models.numbers.strict_loads`. The members are checked by their kind (`members.check_member`). A crafted file gives one
InputError, never a crash, a hang or a huge allocation.
"""

from __future__ import annotations

from typing import Sequence

from capacity_advisor.core.numbers import number, whole
from capacity_advisor.advisor.predictor.gate import COSTS
from capacity_advisor.advisor.predictor.members import check_member
from capacity_advisor.advisor.predictor.priors import LAB_PRIOR_FEATURES
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import SETS


def unit_ok(u, n_z: int) -> bool:
    if not (isinstance(u, dict) and isinstance(u.get("z"), list) and len(u["z"]) == n_z
            and all(v is None or number(v) for v in u["z"])):
        return False
    if not all(isinstance(u.get(key), str) for key in ("unit", "student", "task", "score")):
        return False
    for key in ("source", "teacher"):
        if u.get(key) is not None and not isinstance(u[key], str):
            return False
    for key in ("seed", "n_params"):
        if u.get(key) is not None and not whole(u[key]):
            return False
    outcomes = u.get("outcomes", {})
    return isinstance(outcomes, dict) and all(
        isinstance(b, str) and isinstance(o, dict) and isinstance(o.get("label"), str)
        and all(k == "label" or v is None or number(v) for k, v in o.items()) for b, o in outcomes.items())


def check_meta(meta, options: Sequence[str] = SETS) -> str | None:
    """What is wrong with a predictor's `meta` (the fields any code reads), or None."""
    from capacity_advisor.probes.recipe import check_recipe

    if not isinstance(meta, dict):
        return "not an object"

    def pair(v) -> bool:
        return isinstance(v, list) and len(v) == 2 and all(number(x) and x > 0 for x in v) and v[0] <= v[1]

    rule = meta.get("rule_of_thumb")
    if rule is not None and not (isinstance(rule, dict) and all(rule.get(k) is None or number(rule.get(k))
                                                                for k in ("t_params", "t_budget"))):
        return "rule_of_thumb"
    if meta.get("params_range") is not None and not pair(meta["params_range"]):
        return "params_range"
    prior = meta.get("lab_prior")
    if prior is not None:
        if not (isinstance(prior, dict) and prior.get("features") == list(LAB_PRIOR_FEATURES)
                and pair(prior.get("params_range"))):
            return "lab_prior"
        try:
            check_member(prior.get("member"), len(LAB_PRIOR_FEATURES), lambda why: InputError(why), options)
        except InputError:
            return "lab_prior.member"
    probe = meta.get("probe")
    if probe is not None and not (isinstance(probe, dict) and all(
            whole(probe.get(k), 1, 100_000)
            for k in ("steps", "eval_problems"))):
        return "probe"
    if meta.get("recipe") is not None:
        try:
            check_recipe(meta["recipe"])
        except InputError as e:
            return f"recipe: {e}"
    for key in ("cv", "labels", "policy"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return key
    for key in ("policy", "policy_own"):
        if meta.get(key) is not None:
            if not isinstance(meta[key], dict):
                return key
            try:
                policy_thresholds(meta[key])
            except InputError:
                return key
    wrong = calibration_fields(meta)
    if wrong:
        return wrong
    if meta.get("labels") is not None and not all(isinstance(k, str) and whole(v)
                                                  for k, v in meta["labels"].items()):
        return "labels"
    for key in ("records", "rows", "ties"):
        if meta.get(key) is not None and not whole(meta[key]):
            return key
    if meta.get("students") is not None and not (isinstance(meta["students"], list)
                                                 and all(isinstance(s, str) for s in meta["students"])):
        return "students"
    for key in ("feature_set", "chosen_by", "note"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            return key
    if meta.get("tie_margin") is not None and not number(meta["tie_margin"]):
        return "tie_margin"
    return None


def policy_thresholds(raw) -> tuple:
    """(max_distance or None, margin, use_range) of a predictor file's `meta.policy`, checked."""
    if not isinstance(raw, dict):
        raise InputError("the predictor's meta.policy must be an object")
    d, m, r = raw.get("max_distance"), raw.get("margin"), raw.get("use_range", False)
    ok = (d is None or (number(d) and 0 <= d < 1e6)) and number(m) and 0 <= m <= 2 and isinstance(r, bool)
    if not ok or not gate_ok(raw.get("race")):
        raise InputError("the predictor's meta.policy holds thresholds out of range; refit it with `advisor fit`")
    return d, m, r


def gate_ok(g) -> bool:
    """A policy's gate (`meta.policy.race`): absent, or its thresholds (null: never by that one), the
    race's fraction and wait as shares of the budget, its lead rule (k evaluations in a row, a
    margin in accuracy, whether a D_high lead waits on a gaining D_low; absent where it stops only
    at its share), its scouts for D_low and for D_high (absent or null: the probe's lead never
    decides), its tie check (absent or null: none; else a share of the budget below the fraction),
    and the overhead caps it was chosen under (over all pools, and where it opens) with what they
    count (`cost`: absent or "share", a share of one run; "tokens"), a fast learner's stop (absent,
    or both `fast_gain`, a learning speed, and `fast_fraction`, a share of the budget), and its hold
    (absent: 0; standard errors from 0 to 10)."""
    if g is None:
        return True
    keys = {"threshold", "headroom", "fraction", "wait", "cap"}
    optional = {"open_cap", "k", "margin", "patient", "scout", "tie", "high_scout", "cost", "fast_gain", "fast_fraction",
                "gap_scout", "hold"}
    if not (isinstance(g, dict) and keys <= set(g) <= keys | optional):
        return False
    f, w, o, tie = g["fraction"], g["wait"], g.get("open_cap"), g.get("tie")
    lead, margin = g.get("k"), g.get("margin", 0.05)
    levels = ("threshold", "headroom", "scout", "high_scout", "gap_scout")
    return (all(g.get(k) is None or (number(g[k]) and -1e6 < g[k] < 1e6) for k in levels)
            and number(f) and 0 < f <= 1 and (w is None or (number(w) and f < w <= 1))
            and number(g["cap"]) and 0 <= g["cap"] <= 100 and (o is None or (number(o) and 0 <= o <= 100))
            and (lead is None or whole(lead, 1, 100)) and number(margin) and 0 <= margin < 1
            and isinstance(g.get("patient", False), bool)
            and (tie is None or (number(tie) and number(f) and 0 < tie < f))
            and g.get("cost", "share") in COSTS
            and number(g.get("hold", 0.0)) and 0 <= g.get("hold", 0.0) <= 10
            and ("fast_gain" in g) == ("fast_fraction" in g)
            and (g.get("fast_fraction") is None or (number(g["fast_fraction"]) and number(g["fast_gain"])
                                                    and 0 < g["fast_fraction"] <= 1 and -1e6 < g["fast_gain"] < 1e6)))


def proxy_leads_ok(leads) -> bool:
    """An own source's `proxy_leads` (absent, or [[n_params, budget, ranking_sum, lead], ...])."""
    return leads is None or (isinstance(leads, list) and len(leads) <= 100_000 and all(
        isinstance(x, list) and len(x) == 4 and whole(x[0]) and all(number(v) for v in x[1:])
        and 0 < x[1] <= 1e6 and x[2] in (0.0, 1.0) and -1 <= x[3] <= 1 for x in leads))


def calibration_fields(meta: dict) -> str | None:
    """Which of the fields `advisor fit` writes about the records' origin (the user's own
    sources, the replayed races, the record files) is malformed, or None."""
    own = meta.get("own_sources")
    if own is not None and not (isinstance(own, dict) and len(own) <= 10_000 and all(
            isinstance(k, str) and isinstance(v, dict)
            and all(isinstance(v.get(f), list) and len(v[f]) <= 100_000 for f in ("students", "n_params", "fingerprints"))
            and all(isinstance(x, str) for x in v["students"] + v["fingerprints"])
            and all(whole(x) for x in v["n_params"])
            and len(v["students"]) == len(v["n_params"])
            and (v.get("epochs") is None or (number(v["epochs"]) and 0 <= v["epochs"] <= 1e6))
            and proxy_leads_ok(v.get("proxy_leads")) for k, v in own.items())):
        return "own_sources"
    rule = meta.get("proxy_rule")
    if rule is not None:
        from capacity_advisor.advisor.predictor.proxy_rule import ProxyRule

        if ProxyRule.from_dict(rule) is None:
            return "proxy_rule"
    races = meta.get("races")
    if races is not None and not (isinstance(races, list) and len(races) <= 100 and all(
            isinstance(r, dict) and isinstance(r.get("method"), str)
            and (r.get("fraction") is None or (number(r["fraction"]) and 0 < r["fraction"] <= 1))
            and all(number(r.get(k)) and 0 <= r[k] <= 1e6 for k in ("regret", "decision_accuracy", "overhead"))
            for r in races)):
        return "races"
    files = meta.get("record_files")
    if files is not None and not (isinstance(files, list) and all(
            isinstance(f, dict) and isinstance(f.get("file"), str) and isinstance(f.get("sources"), list)
            for f in files)):
        return "record_files"
    return None
