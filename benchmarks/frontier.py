"""The cost-quality frontier of the ways to advise on a pool the predictor never saw.

    .venv/bin/python benchmarks/frontier.py calibration/records.jsonl --proxy runs/proxy.json [--json out.json] [--markdown]

Per pool source and over all of them: mean regret (accuracy points against the best set at the
budget), decision accuracy and mean overhead (training beyond the one full run the user launches,
as a share of it) of

- the constants (always high / low / mixed), overhead 0;
- fixed races: D_high and D_low trained side by side; at the first evaluation at or past F of the
  budget the set with the best held-out accuracy so far is kept (D_high on ties) and trained to
  the end — overhead F (the loser's training);
- the adaptive race `advisor train --race` runs (k evaluations in a row led by more than the
  margin and z standard errors, at most F of the budget): replayed on accuracies, so the standard
  error is the unpaired one of two proportions on the records' held-out problems (the real race
  pairs per problem, which is never less sensitive) — overhead the share at which it stopped;
- with `--proxy` (the JSON of `advisor fit --cv proxy`): the policy calibrated on the source's own
  small students, overall only, its overhead the proxies' training against the target's one run
  (3 sets each, compute as parameters x sequences: every run trains the same pool for the same
  budget), for all proxies and for the largest only.

Everything is replayed from the committed records (the races from the first B epochs of each
5-epoch run, as the labels are), so the races' schedules are the truncated ones of the labels
(docs/results.md, "Labels against what the user launches").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from capacity_advisor.advisor.predictor import (
    PROXY_CUT, is_right, label_rows, read_records, record_option, regret, unit_of,
)

FIXED = (0.1, 0.2, 0.3, 0.5)


def curves_of(records) -> dict:
    """{(source, score, student, seed): {option: [(epoch, accuracy), ...] after step 0}}."""
    out: dict = defaultdict(dict)
    for rec in records:
        u = unit_of(rec)
        key = (u["source"], u["score"], u["student"], u["seed"])
        opt = record_option(rec)
        if opt is None:
            continue
        out[key][opt] = [(e["epoch"], e["accuracy"]) for e in rec["evals"] if e.get("step", 1) > 0
                         and e.get("accuracy") is not None]
    return out


def race(curve_h, curve_l, budget: float, fraction: float, k: int | None = None, margin: float = 0.05,
         z: float = 1.96, n_eval: int = 200) -> tuple[str, float]:
    """(kept set, share of the budget at which the race stopped) of one replayed race."""
    h = [(e, a) for e, a in curve_h if e <= budget + 1e-9]
    lo = [(e, a) for e, a in curve_l if e <= budget + 1e-9]
    best = {"high": -1.0, "low": -1.0}
    streak, prev = 0, None
    for (e, ah), (_, al) in zip(h, lo):
        best["high"], best["low"] = max(best["high"], ah), max(best["low"], al)
        share = min(1.0, e / budget)
        if k is not None:
            se = math.sqrt(max(ah * (1 - ah), 0) / n_eval + max(al * (1 - al), 0) / n_eval)
            lead = ("high" if ah > al else "low") if abs(ah - al) > max(z * se, margin) else None
            streak = (streak + 1 if lead == prev else 1) if lead else 0
            prev = lead
            if lead and streak >= k:
                return lead, share
        if share >= fraction - 1e-9:
            return ("high" if best["high"] >= best["low"] else "low"), share
    return ("high" if best["high"] >= best["low"] else "low"), 1.0


def summarize(pairs) -> dict:
    """pairs: (row, choice, overhead) -> mean regret (points), decision accuracy, mean overhead."""
    if not pairs:
        return {"rows": 0}
    return {"rows": len(pairs), "regret": 100 * sum(regret(r, c) for r, c, _ in pairs) / len(pairs),
            "decision_accuracy": sum(is_right(r, c) for r, c, _ in pairs) / len(pairs),
            "overhead": sum(o for _, _, o in pairs) / len(pairs)}


def frontier(records, n_eval: int = 200) -> dict:
    rows = label_rows(records)
    curves = curves_of(records)
    methods: dict[str, list] = defaultdict(list)
    for r in rows:
        c = curves[(r["source"], r["score"], r["student"], r["seed"])]
        b = r["features"]["budget"]
        for name, choice in (("always high", "high"), ("always low", "low"), ("always mixed", "mixed")):
            methods[name].append((r, choice, 0.0))
        for f in FIXED:
            kept, share = race(c["high"], c["low"], b, f, n_eval=n_eval)
            methods[f"race, fixed at {f:.0%} of the budget"].append((r, kept, f))
        kept, share = race(c["high"], c["low"], b, 0.5, k=2, n_eval=n_eval)
        methods["race, adaptive (k 2, margin 5 points, at most 50 %)"].append((r, kept, share))
    sources = sorted({r["source"] for r in rows})
    table = {}
    for name, pairs in methods.items():
        table[name] = {"all": summarize(pairs),
                       **{s: summarize([p for p in pairs if p[0]["source"] == s]) for s in sources}}
    return {"sources": sources, "methods": table, "rows": len(rows)}


def proxy_overhead(records) -> dict:
    """Mean over the large students (from PROXY_CUT) of the proxies' training against their one
    run: 3 sets per proxy, parameters x sequences (the same pool and budget for every run)."""
    sizes = {}
    for rec in records:
        sizes[unit_of(rec)["student"]] = rec["model"]["n_params"]
    small = sorted(n for n in sizes.values() if n < PROXY_CUT)
    large = [n for n in sizes.values() if n >= PROXY_CUT]
    return {"all proxies": sum(3 * sum(small) / n for n in large) / len(large),
            "largest proxy only": sum(3 * small[-1] / n for n in large) / len(large)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--proxy", type=Path, default=None, help="the --json output of `advisor fit --cv proxy`")
    ap.add_argument("--n-eval", type=int, default=200, help="held-out problems of the records' evaluations")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    records = read_records(args.records)
    result = frontier(records, args.n_eval)
    if args.proxy:
        cv = json.loads(args.proxy.read_text())["cv"]["proxy"]
        over = proxy_overhead(records)
        result["proxy"] = {"policy, own proxies": {**cv["policy"], "overhead": over["all proxies"]},
                           "predictor alone, own proxies": {**cv["predictor"], "overhead": over["all proxies"]},
                           "policy, largest proxy only": {**cv["largest proxy only"], "overhead": over["largest proxy only"]},
                           "policy without own proxies": {**cv["without own proxies"], "overhead": 0.0}}
    srcs = result["sources"]
    print(f"{result['rows']} (unit, budget) rows over {len(srcs)} pool sources\n")
    print("| method | mean overhead | regret (points) | decision accuracy | " + " | ".join(f"regret on {s}" for s in srcs) + " |")
    print("|---|---|---|---|" + "---|" * len(srcs))
    for name, t in result["methods"].items():
        a = t["all"]
        print(f"| {name} | {a['overhead']:.0%} | {a['regret']:.2f} | {a['decision_accuracy']:.0%} | "
              + " | ".join(f"{t[s]['regret']:.2f}" for s in srcs) + " |")
    for name, t in (result.get("proxy") or {}).items():
        print(f"| {name} (the proxy split: large students only) | {t['overhead']:.0%} | {t['regret']:.2f} | "
              f"{t['decision_accuracy']:.0%} | " + " | ".join("—" for _ in srcs) + " |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
