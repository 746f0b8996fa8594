"""Per pool source: does D_low overtake D_high for the larger students, and from which epoch?

    .venv/bin/python -m experiments.source_patterns calibration/lab2/*   [--json out.json]

Table: docs/lab.md, "The recipe-2 pool-source sweep" (pass@1 of D_high / D_low per student and source).

Reads each published sweep (one pool source per folder) with `advisor lab report`'s reader and
prints one Markdown table: a row per student (smallest first), a column per source, each cell the
pass@1 of D_high / D_low at the last epoch (mean over seeds), bold where one leads by more than 2
points, and "low from E" where D_low overtakes for good from epoch E (ahead by more than 2 points
then, and never behind after). A last row counts, per source, the students where D_low ends ahead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capacity_advisor.advisor.lab.report import aggregate
from capacity_advisor.models.lab.ladder import LADDER, n_params


def patterns(folders: list[Path]) -> dict:
    out = {}
    for folder in folders:
        groups = [g for g in aggregate(folder)["groups"] if g["score"] == "sum" and g["summary"]]
        tasks = {g["task"] for g in groups}
        for g in groups:
            s = g["summary"]
            column = folder.name if len(tasks) == 1 else f"{folder.name}/{g['task']}"
            out.setdefault(column, {})[g["size"]] = {
                "n_params": g["n_params"], "task": g["task"], "high": s["acc_last_epoch_high"], "low": s["acc_last_epoch_low"],
                "epoch1_high": s["acc_epoch1_high"], "epoch1_low": s["acc_epoch1_low"],
                "low_overtakes_from_epoch": s["low_overtakes_from_epoch"],
                "repetition_low": s["repetition_mean_low"], "repetition_high": s["repetition_mean_high"]}
    return out


def cell(c: dict | None) -> str:
    if not c or c["high"] is None or c["low"] is None:
        return "—"
    hi, lo = f"{c['high']:.2f}", f"{c['low']:.2f}"
    if c["high"] > c["low"] + 0.02:
        hi = f"**{hi}**"
    elif c["low"] > c["high"] + 0.02:
        lo = f"**{lo}**"
    over = c["low_overtakes_from_epoch"]
    return f"{hi} / {lo}" + (f" (low from {round(over, 2):g})" if over else "")


def markdown(table: dict) -> str:
    sources = list(table)
    lines = ["| student | params | " + " | ".join(sources) + " |", "|---|---|" + "---|" * len(sources)]
    for size in sorted(LADDER, key=n_params):
        if not any(size in table[s] for s in sources):
            continue
        lines.append(f"| {size} | {n_params(size):,} | " + " | ".join(cell(table[s].get(size)) for s in sources) + " |")
    counts = []
    for s in sources:
        cells = [c for c in table[s].values() if c["high"] is not None and c["low"] is not None]
        counts.append(f"{sum(c['low'] > c['high'] + 0.02 for c in cells)} of {len(cells)}")
    lines.append("| D_low ahead at the end | | " + " | ".join(counts) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    table = patterns(args.folders)
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
