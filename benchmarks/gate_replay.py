"""Gate replay benchmark: what `advisor fit` spends comparing its gates, with the races' pairing of two
curves kept (`races.paired`, as the fit runs) against pairing them again at every replay (as it did).

    .venv/bin/python -m benchmarks.gate_replay            # the 906 committed lab records, ~1 minute on one CPU core
    .venv/bin/python -m benchmarks.gate_replay --json

The fit chooses its gate fold after fold on overlapping rows: each call of `gate._gate_arrays`
replays every race of the grid on every row. Both contenders run the same calls on the same rows in
one process, interleaved over rounds (a shared machine is noisy), and the best round of each is
kept; the figure that matters is the ratio. Both must give the same arrays.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def rows_of_records():
    from capacity_advisor.advisor.predictor import label_rows, read_records
    from capacity_advisor.advisor.predictor.races import with_curves

    records = read_records(ROOT / "calibration" / "records.jsonl")
    return with_curves(label_rows(records), records)


def measured(rows):
    """Held-out-like measurements for `_gate_arrays`: each row with a fixed P(D_low) (what the gate's
    thresholds read; its value does not change the replays timed here)."""
    return [{"row": r, "probs": {"high": 0.6, "low": 0.4}, "ratio": 0.0, "outside": False} for r in rows]


def one_round(ms, policy, folds: int, keep: bool) -> tuple[float, list]:
    from capacity_advisor.advisor.predictor import races
    from capacity_advisor.advisor.predictor.gate import _gate_arrays

    races._PAIRED.clear()
    kept_at = races._PAIRED_MAX
    races._PAIRED_MAX = kept_at if keep else 0  # 0: cleared before each entry, so every replay pairs again
    out = []
    try:
        t = time.perf_counter()
        for i in range(folds):  # each "fold" leaves one share of the rows out, as a held-out choice does
            out.append(_gate_arrays([m for j, m in enumerate(ms) if j % folds != i], policy))
        took = time.perf_counter() - t
    finally:
        races._PAIRED_MAX = kept_at
        races._PAIRED.clear()
    return took, out


def same(a: list, b: list) -> bool:
    for x, y in zip(a, b):
        for key in ("p_low", "head", "shut", "low", "high", "lead"):
            if not np.array_equal(x[key], y[key], equal_nan=True):
                return False
        for rule, (reg, share) in x["raced"].items():
            if not (np.array_equal(reg, y["raced"][rule][0]) and np.array_equal(share, y["raced"][rule][1])):
                return False
    return len(a) == len(b)


def main(argv=None) -> int:
    from capacity_advisor.advisor.predictor.policy import Policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--folds", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = rows_of_records()
    ms = measured(rows)
    policy = Policy()
    best = {"kept": float("inf"), "paired again": float("inf")}
    agree = True
    for _ in range(args.rounds):
        t_keep, a = one_round(ms, policy, args.folds, keep=True)
        t_again, b = one_round(ms, policy, args.folds, keep=False)
        best["kept"], best["paired again"] = min(best["kept"], t_keep), min(best["paired again"], t_again)
        agree = agree and same(a, b)
    result = {"rows": len(rows), "folds": args.folds, "rounds": args.rounds,
              "seconds": {k: round(v, 3) for k, v in best.items()},
              "speedup": round(best["paired again"] / best["kept"], 2), "same_arrays": agree}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{len(rows)} rows, {args.folds} folds, best of {args.rounds} rounds: pairing kept {best['kept']:.2f} s, "
              f"paired again {best['paired again']:.2f} s: {result['speedup']:.2f}x; same arrays: {agree}")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
