"""The predictor's held-out tables as Markdown, from the predictor folder `advisor fit` wrote.

    .venv/bin/python -m experiments.cv_tables advisor/predictor_data
    .venv/bin/python -m experiments.cv_tables runs/wide --sources lab2:digitsum/explore,linear/scripted

Tables: docs/results.md section 4, the shipped predictor's held-out tables (the command above).

One table per split (leave one student / shape / pool source / task / teacher out): per method —
the policy `advisor recommend` ships, the predictor alone (its argmax), the constant rules, the
fitted size rule and the noise floor — the mean regret in accuracy points with its bootstrap 90 %
interval over units, the decision accuracy (a choice within 1 point of the best set), and the
regret per ranking arm; and, where the table measured them, the flip rate (the share of
(student, source, ranking, budget) cells whose seeds got different advice; 0 by construction for
the constant rules and the size rule) and the spread of P(D_low) across a cell's seeds. Then the
gated race per split (`gated_table`). With `--sources`, only the gated race and always-high held out
per split on the rows of those pool sources, per source and pooled (each source weighted by its
rows): what a fit does on given sources, to set beside `experiments.transfer` of another fit on
the same ones. The numbers are the ones `advisor fit` measured and stored in
the predictor (`meta.cv`), not recomputed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capacity_advisor.advisor.predictor import Predictor

NAMES = {"student": "student", "shape": "shape (deep-narrow or shallow-wide students held out)", "source": "pool source",
         "task": "task family", "teacher": "teacher"}
ORDER = ("policy", "predictor", "always high", "always low", "always mixed", "size rule", "noise floor")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictor", type=Path)
    ap.add_argument("--sources", help="comma-separated pool sources: the gated race held out on their rows only")
    args = ap.parse_args()
    p = Predictor.load(args.predictor)
    meta = p.meta
    if args.sources:
        return sources_table(meta["cv"], [s for s in args.sources.split(",") if s])
    pol = meta.get("policy") or {}
    print(f"Fitted on {meta['records']} records: {meta['rows']} (unit, budget) rows, labels {meta['labels']}, "
          f"near-ties {meta['ties']}; kind {p.kind} ({len(p.members)} members, inputs `{meta.get('feature_set')}`); "
          f"policy: the predictor answers within {pol.get('max_distance')}x the typical distance, margin "
          f"{pol.get('margin')}, range check {'on' if pol.get('use_range') else 'off'} ({pol.get('chosen_by')}).\n")
    for split, cv in meta["cv"].items():
        methods = cv["methods"]
        arms = sorted({a for row in methods.values() for a in row.get("arms", {})})
        print(f"Leave one {NAMES.get(split, split)} out ({len(cv['folds'])} folds: {', '.join(map(str, cv['folds']))}):\n")
        seeds = any("flip_rate" in row for row in methods.values())  # tables stored before have no flip rate
        head = ["method", "regret (points)", "90 % interval", "decision accuracy",
                *(["flip rate", "P(D_low) spread"] if seeds else []), *[f"regret, {a} arm" for a in arms]]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for name in [m for m in ORDER if m in methods]:
            row = methods[name]
            if row["regret"] is None:
                continue
            mark = f"**{name}** (shipped)" if name == "policy" else name
            cells = [mark, f"{row['regret']:.2f}", f"{row['ci90'][0]:.2f}–{row['ci90'][1]:.2f}",
                     f"{100 * row['decision_accuracy']:.0f} %"]
            if seeds:
                cells += [_pct(row.get("flip_rate")), "—" if row.get("p_low_spread") is None else f"{row['p_low_spread']:.3f}"]
            cells += [f"{row['arms'][a]['regret']:.2f}" if a in row.get("arms", {}) else "—" for a in arms]
            print("| " + " | ".join(cells) + " |")
        print()
    gated_table(meta["cv"])
    return 0


def gated_table(cv: dict) -> None:
    """The gated race per split: regret at mean overhead (and in tokens, where the fit counted them),
    judged on other seeds and on the other half of the problems (beside always-high judged the same
    way on the same rows), where it opened, what it cost there, the share within 3 points, the training saved against racing every pool, and the
    pool sources it lost more on than always-high."""
    rows = [(split, t["methods"]) for split, t in cv.items() if (t["methods"].get("gated race") or {}).get("regret")
            is not None]
    if not rows:
        return
    print("The gated race, held out per split (regret in points at mean extra training; always-high beside it):\n")
    tokens = all(m["gated race"].get("overhead_tokens") is not None for _, m in rows)  # fits since the count
    head = ["held out", "gated race", *(["in tokens (where open)"] if tokens else []), "always high",
            "other seed (always high)", "other half (always high; rows)",
            "opened", "extra training where open", "within 3 points", "saved against racing every pool",
            "sources above always-high"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for split, m in rows:
        g, high = m["gated race"], m.get("always high") or {}
        above = [s for s, v in (g.get("by_source") or {}).items()
                 if v["regret"] > ((high.get("by_source") or {}).get(s) or {}).get("regret", float("inf")) + 1e-9]
        cells = [NAMES.get(split, split), f"{g['regret']:.2f} at {100 * g['overhead']:.0f} %",
                 *([f"{_pct(g['overhead_tokens'])} ({_pct(g.get('overhead_tokens_where_open'))})"] if tokens else []),
                 f"{high['regret']:.2f}" if "regret" in high else "—",
                 _judged(g, high, "other_seed"), _judged(g, high, "other_half", rows=True),
                 _pct(g.get("opened")), _pct(g.get("overhead_where_open")), _pct(g.get("within_3_points")),
                 _pct(g.get("compute_saved")), ", ".join(above) or "none"]
        print("| " + " | ".join(cells) + " |")
    unknown = {NAMES.get(split, split): m["gated race"]["tokens_unknown"] for split, m in rows
               if tokens and m["gated race"].get("tokens_unknown")}
    if unknown:  # raced rows whose records lack their tokens count at their share (`gate.in_tokens`)
        print("\n(in tokens, raced rows whose records lack their count, taken at their share: "
              + ", ".join(f"{k} {v}" for k, v in unknown.items()) + ")")
    print()
    shares = [(split, m["gated race"]["at_shares"]) for split, m in rows if m["gated race"].get("at_shares")]
    if shares:  # the same gates' races evaluated also at their stop shares, as `advisor train` races
        print("The same gated race with each race evaluated at its stop shares (regret at mean extra training):\n")
        head = ["held out", "gated race", "other seed", "other half", "extra training where open", "within 3 points"]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for split, a in shares:
            other = lambda k: "—" if a.get(k) is None else f"{a[k]:.2f}"  # noqa: E731
            print(f"| {NAMES.get(split, split)} | {a['regret']:.2f} at {100 * a['overhead']:.0f} % | {other('other_seed')} | "
                  f"{other('other_half')} | {_pct(a.get('overhead_where_open'))} | {_pct(a.get('within_3_points'))} |")
        print()


def sources_table(cv: dict, sources: list[str]) -> int:
    """Per split, the gated race and always-high held out on the rows of `sources`: per source, and
    pooled (weighted by rows); a split whose table lacks one of them (the shape split holds only the
    lab's students) is named and passed over. 2 where a source is in no split's table."""
    found = {s for t in cv.values() for s in ((t["methods"].get("gated race") or {}).get("by_source") or {})}
    unknown = [s for s in sources if s not in found]
    if unknown:
        print(f"error: {', '.join(unknown)} in no held-out table of this predictor (its sources: "
              f"{', '.join(sorted(found))})", file=sys.stderr)
        return 2
    for split, t in cv.items():
        g = (t["methods"].get("gated race") or {}).get("by_source") or {}
        high = (t["methods"].get("always high") or {}).get("by_source") or {}
        if not g:
            continue
        missing = [s for s in sources if s not in g]
        if missing:
            print(f"(held out by {NAMES.get(split, split)}: no rows of {', '.join(missing)})\n")
            continue
        n = sum(g[s]["rows"] for s in sources)
        pooled = lambda v, k: sum(v[s][k] * v[s]["rows"] for s in sources) / n  # noqa: E731
        print(f"Held out by {NAMES.get(split, split)} ({n} rows of {len(sources)} sources):\n")
        print("| source | rows | gated race | always high |\n|---|---|---|---|")
        for s in sources:
            print(f"| {s} | {g[s]['rows']} | {g[s]['regret']:.2f} at {100 * g[s]['overhead']:.0f} % | "
                  f"{high[s]['regret']:.2f} |")
        print(f"| **pooled** | {n} | **{pooled(g, 'regret'):.2f} at {100 * pooled(g, 'overhead'):.0f} %** | "
              f"{pooled(high, 'regret'):.2f} |\n")
    return 0


def _judged(gated: dict, high: dict, key: str, rows: bool = False) -> str:
    """The gated race's regret under a stricter judgment, always-high's beside it (and the rows judged)."""
    g, h = gated.get(key) or {}, high.get(key) or {}
    if g.get("regret") is None:
        return "—"
    if h.get("regret") is None:
        return f"{g['regret']:.2f}" + (f" ({g['rows']} rows)" if rows else "")
    return f"{g['regret']:.2f} ({h['regret']:.2f}" + (f"; {g['rows']})" if rows else ")")


def _pct(share) -> str:
    return "—" if share is None else f"{100 * share:.1f} %"


if __name__ == "__main__":
    sys.exit(main())
