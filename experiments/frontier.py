"""The cost-quality frontier of the ways to advise on a pool the predictor never saw.

    .venv/bin/python -m experiments.frontier calibration/records.jsonl [--predictor advisor/predictor_data] \
        [--proxy runs/proxy.json] [--json out.json]

Tables: docs/results.md section 4, "The gated race" and "The frontier: what each way out costs"
(the frontier, per source, and the race chosen leaving each pool source out).

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
  budget), for all proxies and for the largest only;
- the race chosen without seeing the source it is judged on: per source, the race of
  `races.race_grid` (fixed fractions; adaptive k, margin and cap) with the lowest regret on the
  other sources among those within an overhead cap (30, 40, 50 %), judged on that source;
- from the predictor's held-out table leaving each pool source out (`--predictor`, its
  meta.cv.source): the policy, the predictor alone, the gated race at every cap of `gate.CAPS`
  and the noise floor — the frontier table: regret judged on each row's own accuracies and on its
  other seeds (the race reads one seed's curves; the truth is the other seeds'), decision
  accuracy, mean overhead, and the worst source against always-high; then the gated race per source.

Everything is replayed from the committed records (the races from the first B epochs of each
5-epoch run, as the labels are), so the races' schedules are the truncated ones of the labels
(docs/results.md, "Labels against what the user launches").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capacity_advisor.advisor.predictor import PROXY_CUT, Predictor, read_records, unit_of
from capacity_advisor.advisor.predictor.races import race_table, races_left_out

CAPS = (0.3, 0.4, 0.5)  # the overhead caps the left-out choice of a race is measured at


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


def print_proxy_by_source(cv: dict) -> None:
    """Every method of the proxy split, regret per pool source (`by_source` of `advisor fit --cv proxy`)."""
    sources = sorted({s for t in cv.values() for s in t.get("by_source") or {}})
    if not sources:
        return
    print("\nThe proxy split by pool source (regret, points; large students only):\n")
    print("| method | all | " + " | ".join(sources) + " |")
    print("|---|---|" + "---|" * len(sources))
    for name, t in cv.items():
        per = t.get("by_source") or {}
        print(f"| {name} | {t['regret']:.2f} | " + " | ".join(f"{per[s]['regret']:.2f}" if s in per else "—"
                                                             for s in sources) + " |")


def frontier_rows(result: dict, cv: dict, proxy: dict | None) -> list[tuple]:
    """(method, overhead, regret, regret on other seeds, decision accuracy, worst source − always-high)
    for the frontier table: the replayed races on every row, the held-out table's methods."""
    races, srcs = result["methods"], result["sources"]
    high = races["always high"]
    out = []
    for name, t in races.items():
        a = t["all"]
        worst = max(t[s]["regret"] - high[s]["regret"] for s in srcs)
        out.append((name + (" (no choice held out)" if name.startswith("race") else ""), a["overhead"], a["regret"],
                    a.get("other_seed"), a["decision_accuracy"], worst))
    m = cv["methods"]
    for name in ("policy", "predictor"):
        if name in m:
            per = m[name].get("by_source") or {}
            worst = max((per[s]["regret"] - high[s]["regret"] for s in per if s in high), default=None)
            out.append((f"{name} (held out by source)", 0.0, m[name]["regret"], (m[name].get("other_seed") or {}).get("regret"),
                        m[name]["decision_accuracy"], worst))
    for cap, c in ((m.get("gated race") or {}).get("caps") or {}).items():
        out.append((f"gated race, cap {cap} (held out by source)", c["overhead"], c["regret"], c["other_seed"],
                    c["decision_accuracy"], c["worst_source_over_high"]))
    if proxy and "proxy rule, own proxies" in proxy:
        p = proxy["proxy rule, own proxies"]
        out.append(("proxy rule (the proxy split: large students only)", p.get("overhead", float("nan")), p["regret"],
                    None, p["decision_accuracy"], None))
    if "noise floor" in m:
        out.append(("noise floor (the other seeds' label)", 0.0, m["noise floor"]["regret"], None,
                    m["noise floor"]["decision_accuracy"], None))
    return out


def print_frontier(result: dict, cv: dict, proxy: dict | None) -> None:
    f = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    print("\nThe frontier: regret (points) judged on each row's own accuracies and on its other seeds, decision "
          "accuracy, mean overhead, and the worst pool source's regret above always-high's:\n")
    print("| method | mean overhead | regret | regret, other seeds | decision accuracy | worst source − always-high |")
    print("|---|---|---|---|---|---|")
    for name, over, reg, other, acc, worst in frontier_rows(result, cv, proxy):
        print(f"| {name} | {f(over, '.0%')} | {reg:.2f} | {f(other, '.2f')} | {f(acc, '.0%')} | {f(worst, '+.2f')} |")
    g = cv["methods"].get("gated race")
    if g:
        high = cv["methods"]["always high"].get("by_source") or {}
        print(f"\nThe gated race (cap {g['cap']:.0%}) per pool source, held out by source, beside always-high:\n")
        print("| pool source | gated race regret | overhead | always-high regret |")
        print("|---|---|---|---|")
        for s, v in g["by_source"].items():
            print(f"| {s} | {v['regret']:.2f} | {v['overhead']:.0%} | {f((high.get(s) or {}).get('regret'), '.2f')} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--predictor", type=Path, default=Path(__file__).resolve().parents[1] / "advisor" / "predictor_data",
                    help="the predictor whose held-out table (meta.cv.source) gives the policy and the gated race")
    ap.add_argument("--proxy", type=Path, default=None, help="the --json output of `advisor fit --cv proxy`")
    ap.add_argument("--n-eval", type=int, default=200, help="held-out problems of the records' evaluations")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    records = read_records(args.records)
    result = race_table(records, args.n_eval)
    if args.proxy:
        cv = json.loads(args.proxy.read_text())["cv"]["proxy"]
        over = proxy_overhead(records)
        result["proxy"] = {"policy, own proxies": {**cv["policy"], "overhead": over["all proxies"]},
                           "predictor alone, own proxies": {**cv["predictor"], "overhead": over["all proxies"]},
                           "policy, largest proxy only": {**cv["largest proxy only"], "overhead": over["largest proxy only"]},
                           "policy without own proxies": {**cv["without own proxies"], "overhead": 0.0},
                           **{f"{m}, own proxies": {**cv[m], "overhead": over["all proxies"]}
                              for m in ("proxy rule", "policy or proxy rule", "predictor or proxy rule") if m in cv}}
    srcs = result["sources"]
    print(f"{result['rows']} (unit, budget) rows over {len(srcs)} pool sources\n")
    print("| method | mean overhead | regret (points) | decision accuracy | " + " | ".join(f"regret on {s}" for s in srcs) + " |")
    print("|---|---|---|---|" + "---|" * len(srcs))
    for name, t in result["methods"].items():
        a = t["all"]
        print(f"| {name} | {a['overhead']:.0%} | {a['regret']:.2f} | {a['decision_accuracy']:.0%} | "
              + " | ".join(f"{t[s]['regret']:.2f}" for s in srcs) + " |")
    for name, t in (result.get("proxy") or {}).items():
        per = t.get("by_source") or {}  # measured by `advisor fit --cv proxy` from this release on
        print(f"| {name} (the proxy split: large students only) | {t['overhead']:.0%} | {t['regret']:.2f} | "
              f"{t['decision_accuracy']:.0%} | " + " | ".join(f"{per[s]['regret']:.2f}" if s in per else "—"
                                                           for s in srcs) + " |")
    if args.proxy:
        print_proxy_by_source(json.loads(args.proxy.read_text())["cv"]["proxy"])
    result["left_out"] = {f"{cap:.0%}": races_left_out(records, cap, args.n_eval) for cap in CAPS}
    print("\nThe race chosen leaving each pool source out (lowest regret on the other sources within the overhead cap):\n")
    print("| overhead cap | held-out regret (points) | decision accuracy | mean overhead | " + " | ".join(srcs) + " |")
    print("|---|---|---|---|" + "---|" * len(srcs))
    for cap, lo in result["left_out"].items():
        a = lo["all"]
        print(f"| {cap} | {a['regret']:.2f} | {a['decision_accuracy']:.0%} | {a['overhead']:.0%} | "
              + " | ".join(f"{lo['folds'][s]['test']['regret']:.2f} ({lo['folds'][s]['race']})" for s in srcs) + " |")
    cv = ((Predictor.load(args.predictor).meta or {}).get("cv") or {}).get("source")
    if cv:
        print_frontier(result, cv, result.get("proxy"))
        result["held_out_by_source"] = cv["methods"]
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
