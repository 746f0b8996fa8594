"""What a gate that races wherever the student lies off the calibrated data could buy, held out.

    python -m experiments.off_data calibration/records.jsonl --markdown
    python -m experiments.off_data calibration/records.jsonl calibration/lab2/digitsum-explore --json

For each split (a pool source, a task or a teacher held out), the rows of each held-out fold are
checked against the calibrated range of the other folds' rows (`Predictor.range_check`, the
range test the policy's `use_range` reads: an input outside [min, max] widened by a tenth of the
width on each side). The table states how many held-out rows lie off the data, always-high's
regret on them and on the rest, and what racing exactly those rows (D_high against D_low to 50 %
of the budget, D_high elsewhere) would lose and cost: an upper bound on what opening the race on
"off the data" alone adds to always-high, before any other input of the gate.
"""

from __future__ import annotations

import argparse
import json
from statistics import mean

from capacity_advisor.advisor.fit import FEATURE_SETS
from capacity_advisor.advisor.predictor.ensemble import fit_predictor
from capacity_advisor.advisor.predictor.evaluate import folds, regret
from capacity_advisor.advisor.predictor.labels import label_rows
from capacity_advisor.advisor.predictor.races import race, with_curves
from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS
from experiments.transfer import read_records

SPLITS = ("source", "task", "teacher")
FRACTION = 0.5  # the race opened off the data stops at this share of the budget


def off_data(rows: list[dict], split: str, features: tuple[str, ...]) -> list[dict]:
    """Per held-out row of `split`: its fold, whether any input lies outside the range of the
    other folds' rows, and always-high's and the race's regret (points) and the race's cost."""
    out = []
    for name, train, test in folds(rows, split):
        pred = fit_predictor(train, "logistic", features, 1, 0)  # only its calibrated range is read
        for r in test:
            c = r["curves"]
            kept, share = race(c["high"], c["low"], r["budget"], FRACTION, n_eval=r.get("n_eval", FULL_RUN_EVAL_PROBLEMS))
            out.append({"fold": name, "off": any(x["inside"] is False for x in pred.range_check(r["features"])),
                        "high": 100 * regret(r, "high"), "race": 100 * regret(r, kept), "share": share})
    return out


def summary(cells: list[dict]) -> dict:
    off = [c for c in cells if c["off"]]
    on = [c for c in cells if not c["off"]]
    raced = [c["race"] if c["off"] else c["high"] for c in cells]
    return {"rows": len(cells), "off_share": len(off) / len(cells),
            "always_high": mean(c["high"] for c in cells),
            "always_high_off": mean(c["high"] for c in off) if off else None,
            "always_high_on": mean(c["high"] for c in on) if on else None,
            "race_off": mean(raced), "overhead": sum(c["share"] for c in off) / len(cells),
            "by_fold": {f: {"rows": len(sub), "off_share": sum(c["off"] for c in sub) / len(sub),
                            "always_high": mean(c["high"] for c in sub)}
                        for f in sorted({c["fold"] for c in cells}) for sub in [[c for c in cells if c["fold"] == f]]}}


def markdown(table: dict) -> str:
    f = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| held out | rows | off the data | always high | always high, off rows | always high, the rest "
             "| race off rows (else high) | extra training |", "|---|---|---|---|---|---|---|---|"]
    for split, t in table.items():
        lines.append(f"| {split} | {t['rows']} | {t['off_share']:.0%} | {f(t['always_high'])} | {f(t['always_high_off'])} "
                     f"| {f(t['always_high_on'])} | {f(t['race_off'])} | {t['overhead']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="records files or published calibration folders")
    ap.add_argument("--features", default="contrast", choices=sorted(FEATURE_SETS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    records = read_records(args.paths)
    rows = with_curves(label_rows(records), records)
    table = {s: summary(off_data(rows, s, FEATURE_SETS[args.features])) for s in SPLITS if folds(rows, s)}
    if args.markdown:
        print(markdown(table))
    if args.json or not args.markdown:
        print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
