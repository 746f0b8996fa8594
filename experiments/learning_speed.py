"""Does a fast learner show the better set early? Races replayed on every pool, grouped by the
probe's learning speed (`labels.learning_speed`: the larger of D_high's and D_low's held-out accuracy
gains in the probe): for each group, always-high's regret and each race's regret at its mean extra
training (`races.race`, stopped at the schedule's evaluations, as the records were evaluated).

    python -m experiments.learning_speed calibration/records.jsonl
    python -m experiments.learning_speed calibration/real/* --markdown

PATHS are record files or published calibrations (as `experiments.transfer` reads them). The gate's
fast learner's stop (`advisor fit --race-grid fast`, `gate.Gate.fast_gain`) rests on this pattern;
docs/results.md, "A shorter race for a fast learner".
"""

from __future__ import annotations

import argparse
import math
from statistics import mean

from capacity_advisor.advisor.predictor import label_rows
from capacity_advisor.advisor.predictor.evaluate import regret
from capacity_advisor.advisor.predictor.labels import learning_speed
from capacity_advisor.advisor.predictor.races import race, with_curves

BANDS = ((-math.inf, 0.05), (0.05, 0.15), (0.15, 0.3), (0.3, math.inf))  # learning speed, [low, high)
FRACTIONS = (0.2, 0.35, 0.5, 0.75, 1.0)


def by_speed(rows: list[dict], bands=BANDS, fractions=FRACTIONS) -> list[dict]:
    """One entry per band of learning speed that holds rows: its rows, pool sources, always-high's
    regret (points) and, per race share, (regret in points, mean extra training as a share of a run)."""
    out = []
    for lo, hi in bands:
        group = [r for r in rows if lo <= learning_speed(r["features"]) < hi]
        if not group:
            continue
        races = {}
        for f in fractions:
            picks = [race(r["curves"]["high"], r["curves"]["low"], r["budget"], f) for r in group]
            races[f] = (100 * mean(regret(r, k) for r, (k, _) in zip(group, picks)), mean(s for _, s in picks))
        out.append({"band": (lo, hi), "rows": len(group), "sources": len({r["source"] for r in group}),
                    "always_high": 100 * mean(regret(r, "high") for r in group), "races": races})
    return out


def markdown(table: list[dict]) -> str:
    fr = list(table[0]["races"]) if table else list(FRACTIONS)
    lines = ["| learning speed | rows | sources | always high | " + " | ".join(f"race to {f:.0%}" for f in fr) + " |",
             "|---" * (4 + len(fr)) + "|"]
    for t in table:
        lo, hi = t["band"]
        band = f"< {hi:g}" if math.isinf(lo) else f"≥ {lo:g}" if math.isinf(hi) else f"{lo:g} – {hi:g}"
        lines.append(f"| {band} | {t['rows']} | {t['sources']} | {t['always_high']:.2f} | "
                     + " | ".join(f"{reg:.2f} at {s:.0%}" for reg, s in t["races"].values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from experiments.transfer import read_records

    ap = argparse.ArgumentParser(prog="python -m experiments.learning_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--markdown", action="store_true", help="(the default output; kept for symmetry with transfer)")
    args = ap.parse_args(argv)
    records = read_records(args.paths)
    rows = with_curves(label_rows(records), records)
    print(f"{len(rows)} rows (unit x budget)\n")
    print(markdown(by_speed(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
