"""Is a student's pattern a pattern? D_high / D_low per student size over pretraining builds and seeds.

    .venv/bin/python -m experiments.build_spread calibration/lab2/modchain-program calibration/lab2/modchain-program-builds
    .venv/bin/python -m experiments.build_spread FOLDER ... --json out.json
    .venv/bin/python -m experiments.build_spread calibration/lab2/* --compact     # every source, every student

Tables: docs/lab/by-epoch.md (the last command) and the two tables of docs/lab.md, "Students from
other pretraining builds" (the first command, and the same for the 4x teacher's modchain pools).

Each FOLDER is a published sweep (its records); folders of one pool source are read
together, so a source's own sweep (build 0, the ladder's students) and its `-builds` sweep
(`lab:NAME+b1`, `+b2`: the same students pretrained from other seeds, on the same pools) give
every size its builds side by side. For each pool source, student size and epoch (1, 3 and 5),
the table prints the pass@1 of D_high and D_low (the evaluation at that epoch), as the mean over
every build and seed with its range, the per-build means, and how many of the builds see D_low
ahead by more than 2 points. The spread over builds is the range of the per-build means; the
spread over seeds, the mean range across one build's seeds — set side by side, they tell whether
a student's pattern belongs to its size or to one build.

`--compact` prints one table per source with a row per student (every student, built once or
more): D_high / D_low at epochs 1, 3 and 5 and the two spreads at each, "—" where a student has one
build (or one seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.lab.published import is_published, records
from capacity_advisor.advisor.predictor import record_option, unit_of
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.lab.ladder import LADDER

EPOCHS = (1.0, 3.0, 5.0)
LEAD = 0.02  # a set "leads" when ahead by more than this (the lab tables' 2 points)


def at_epoch(evals: list[dict], epoch: float) -> float | None:
    """Accuracy of the evaluation at `epoch` (the last one at or before it)."""
    before = [e for e in evals if e.get("accuracy") is not None and e["epoch"] <= epoch + 1e-9]
    return before[-1]["accuracy"] if before else None


def collect(folders: list[Path]) -> dict:
    """{(source, size): {(build, seed): {option: {epoch: accuracy}}}} from the folders' records."""
    out: dict = defaultdict(dict)
    for folder in folders:
        for rec in records(folder):
            option = record_option(rec)
            if option not in ("high", "low") or (rec.get("unit") or {}).get("score", "sum") != "sum":
                continue
            u = unit_of(rec)
            size = u["student"][len("lab:"):]
            evals = sorted(rec["evals"], key=lambda e: e["epoch"])
            out[(u["source"], size)].setdefault((u["build"], u["seed"]), {})[option] = {
                e: at_epoch(evals, e) for e in EPOCHS}
    return out


def spread(runs: dict) -> dict:
    """Per epoch: D_high / D_low over every repeat, per build, and the two spreads (see the module doc)."""
    out = {}
    builds = sorted({b for b, _ in runs})
    for epoch in EPOCHS:
        cells = {k: (v["high"][epoch], v["low"][epoch]) for k, v in runs.items()
                 if "high" in v and "low" in v and v["high"][epoch] is not None and v["low"][epoch] is not None}
        if not cells:
            continue
        per_build = {}
        for b in builds:
            mine = [hl for (bb, _), hl in cells.items() if bb == b]
            if mine:
                per_build[b] = {"high": mean(h for h, _ in mine), "low": mean(lo for _, lo in mine), "seeds": len(mine),
                                "seed_range_high": max(h for h, _ in mine) - min(h for h, _ in mine),
                                "seed_range_low": max(lo for _, lo in mine) - min(lo for _, lo in mine)}
        highs, lows = [h for h, _ in cells.values()], [lo for _, lo in cells.values()]
        out[f"{epoch:g}"] = {
            "high": mean(highs), "low": mean(lows), "high_range": [min(highs), max(highs)], "low_range": [min(lows), max(lows)],
            "repeats": len(cells), "builds": per_build,
            "builds_low_ahead": sum(p["low"] > p["high"] + LEAD for p in per_build.values()),
            "builds_high_ahead": sum(p["high"] > p["low"] + LEAD for p in per_build.values()),
            "build_spread": {k: max(p[k] for p in per_build.values()) - min(p[k] for p in per_build.values())
                             for k in ("high", "low")},
            "seed_spread": {k: mean(p[f"seed_range_{k}"] for p in per_build.values()) for k in ("high", "low")},
        }
    return out


def table(result: dict) -> str:
    lines = []
    for source, sizes in result.items():
        lines += [f"{source}:", "",
                  "| student | epoch | D_high (range) | D_low (range) | per build, high / low | builds with D_low ahead "
                  "| spread over builds (high / low) | spread over seeds (high / low) |",
                  "|---|---|---|---|---|---|---|---|"]
        for size, by_epoch in sizes.items():
            for epoch, c in by_epoch.items():
                builds = ", ".join(f"b{b} {p['high']:.2f} / {p['low']:.2f}" for b, p in sorted(c["builds"].items()))
                lines.append(
                    f"| {size} | {epoch} | {c['high']:.2f} ({c['high_range'][0]:.2f}–{c['high_range'][1]:.2f}) | "
                    f"{c['low']:.2f} ({c['low_range'][0]:.2f}–{c['low_range'][1]:.2f}) | {builds} | "
                    f"{c['builds_low_ahead']} of {len(c['builds'])} | {c['build_spread']['high']:.2f} / "
                    f"{c['build_spread']['low']:.2f} | {c['seed_spread']['high']:.2f} / {c['seed_spread']['low']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def _pair(c: dict | None, key: str | None = None) -> str:
    if c is None:
        return "—"
    if key is None:
        return f"{c['high']:.2f} / {c['low']:.2f}"
    if key == "build_spread" and len(c["builds"]) < 2:
        return "—"
    if key == "seed_spread" and all(p["seeds"] < 2 for p in c["builds"].values()):
        return "—"
    return f"{c[key]['high']:.2f} / {c[key]['low']:.2f}"


def compact_table(result: dict) -> str:
    """One table per source, a row per student: D_high / D_low at each epoch, then the spreads."""
    lines = []
    epochs = [f"{e:g}" for e in EPOCHS]
    for source, sizes in result.items():
        lines += [f"{source}:", "",
                  "| student | builds × seeds | " + " | ".join(f"epoch {e}: high / low" for e in epochs)
                  + " | spread over seeds (high / low), epochs " + ", ".join(epochs)
                  + " | spread over builds (high / low), epochs " + ", ".join(epochs) + " |",
                  "|---|---|" + "---|" * (len(epochs) + 2)]
        for size, by_epoch in sizes.items():
            last = by_epoch[max(by_epoch, key=float)] if by_epoch else None
            shape = (f"{len(last['builds'])} × {max(p['seeds'] for p in last['builds'].values())}" if last else "—")
            cells = [_pair(by_epoch.get(e)) for e in epochs]
            seeds = "; ".join(_pair(by_epoch.get(e), "seed_spread") for e in epochs)
            builds = "; ".join(_pair(by_epoch.get(e), "build_spread") for e in epochs)
            lines.append(f"| {size} | {shape} | " + " | ".join(cells) + f" | {seeds} | {builds} |")
        lines.append("")
    return "\n".join(lines)


def build_spread(folders: list[Path], sizes: list[str] | None = None) -> dict:
    runs = collect(folders)
    order = {name: i for i, name in enumerate(LADDER)}
    result: dict = defaultdict(dict)
    for (source, size), by in sorted(runs.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        if not sizes or size in sizes:
            result[source][size] = spread(by)
    return dict(result)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--sizes", default="", help="comma-separated students (default: every size with more than one build)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--compact", action="store_true", help="every student, one row each, one table per source")
    args = ap.parse_args()
    missing = [str(f) for f in args.folders if not (is_published(f) or (f / "records.jsonl").is_file())]
    if missing:
        print(f"error: {', '.join(missing)}: no records; name folders published by `advisor lab publish`", file=sys.stderr)
        return 2
    sizes = [s for s in args.sizes.split(",") if s]
    try:
        result = build_spread(args.folders, sizes)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not sizes and not args.compact:  # every size the folders hold in more than one build
        result = {src: {size: c for size, c in by.items()
                        if any(len(e["builds"]) > 1 for e in c.values())} for src, by in result.items()}
        result = {src: by for src, by in result.items() if by}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(compact_table(result) if args.compact else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
