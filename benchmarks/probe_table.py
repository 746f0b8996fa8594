"""Probe features per lab student size, mean over seeds, from a calibration folder.

    .venv/bin/python benchmarks/probe_table.py calibration/mean/modchain [more folders...]

Prints a Markdown table: does the teacher-NLL drop under D_low grow with capacity, and does
repetition under D_low fall with it, as the paper predicts?
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

COLUMNS = [
    ("high_teacher_nll_drop", "Δ teacher NLL, D_high"),
    ("low_teacher_nll_drop", "Δ teacher NLL, D_low"),
    ("teacher_nll_drop_ratio_low_high", "ratio low/high"),
    ("high_repetition_end", "repetition end, D_high"),
    ("low_repetition_end", "repetition end, D_low"),
    ("high_accuracy_end", "acc. end, D_high"),
    ("low_accuracy_end", "acc. end, D_low"),
    ("base_accuracy", "base acc."),
    ("likelihood_gap", "likelihood gap"),
    ("length_ratio_low_high", "length ratio low/high"),
]
ORDER = ("xs", "s", "m", "l", "xl")


def main(folders: list[str]) -> None:
    for folder in folders:
        probes = sorted(Path(folder, "probes").glob("*/probe.json"))
        by_size: dict[str, list[dict]] = {}
        for p in probes:
            size = p.parent.name.rsplit("-s", 1)[0]
            by_size.setdefault(size, []).append(json.loads(p.read_text()))
        print(f"\n{folder} ({len(probes)} probes; Δ = start − end, positive = moved toward the teacher)\n")
        print("| size | params | " + " | ".join(c for _, c in COLUMNS) + " |")
        print("|---" * (len(COLUMNS) + 2) + "|")
        for size in sorted(by_size, key=lambda s: ORDER.index(s) if s in ORDER else 99):
            reps = by_size[size]
            vals = [mean(r["features"][k] for r in reps) for k, _ in COLUMNS]
            print(f"| {size} | {reps[0]['model']['n_params']:,} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["calibration/mean/modchain"])
