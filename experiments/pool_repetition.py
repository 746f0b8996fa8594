"""Does the candidates' own repetition tell where D_low wins? Read without training the student.

For each published calibration folder of a pool the user could hand the tool (the real student's,
calibration/real/SOURCE-sSEED), the pool is scored under the folder's student (the cache answers a
pool scored before), D_high and D_low are selected as its units selected them (the check: the
selection's likelihood gap per token equals the one its records measured), and each set's mean
word-trigram repetition (`training.text_metrics.ngram_repetition`) is set beside what the folder's
full runs found: D_low's accuracy lead over D_high at each budget (points, on the held-out problems)
and how many (unit, budget) rows D_low won outright.

    python -m experiments.pool_repetition calibration/real/*-s0 calibration/real/linear-scripted --json

One row per pool source (its folders' seeds together); `rank_correlation` is Spearman's, over the
sources, between D_low's mean lead and each of the pool's contrasts: the repetition gap (D_low's
minus D_high's), the length ratio and the likelihood gap per token. Scoring a
300-problem pool under a 135M student takes a few minutes on 2 CPU cores; each pool is scored
once, whatever folders share it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from statistics import mean

from scipy.stats import spearmanr

from capacity_advisor.advisor.calibration.proxies import held_out
from capacity_advisor.advisor.lab import published
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.predictor.labels import label_rows
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool
from capacity_advisor.advisor.scoring.select import SelectConfig, load_scores, select
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import json_object
from capacity_advisor.training.text_metrics import REPETITION_KEYS

POOLS = Path("calibration/real/pools")
# the pool's contrasts under the base whose rank correlation with D_low's lead is reported
CONTRASTS = ("gap_trigram_repetition", "length_ratio_low_high", "likelihood_gap_per_token")


def folder_records(path: Path) -> list[dict]:
    if published.is_published(path) or (path / "records.jsonl").is_file():
        return published.records(path)
    raise InputError(f"{path} is not a calibration folder (no records): give calibration/real/SOURCE folders")


def pool_of(path: Path) -> tuple[Path, str, int]:
    """(pool file, student, held-out problems) of a calibration folder, from its config.json."""
    s = json_object(path / "config.json", "is it a calibration folder?").get("settings") or {}
    pool, students = s.get("pool"), s.get("students") or []
    if not isinstance(pool, str) or len(students) != 1:
        raise InputError(f"{path}/config.json names no pool or not one student: is it a folder of `advisor calibrate --pool`?")
    return POOLS / Path(pool).name, students[0], int(s.get("n_eval") or 0)


def measure_pool(pool_file: Path, student: str, n_eval: int, scores_dir: Path, ranking: str = "sum") -> dict:
    """The selection's summary under the student on the pool's training problems (those its folders'
    units trained on: less the `n_eval` held out as `advisor calibrate --pool` holds them out): each
    set's repetition, the likelihood gap and the length ratio."""
    pool = read_pool(pool_file)
    held = held_out([p.id for p in pool.problems if p.answer is not None], n_eval)
    pool = replace(pool, problems=[p for p in pool.problems if p.id not in held])
    out = scores_dir / pool_file.stem
    if not (out / "scores.jsonl").is_file():
        score_pool(pool, ScoreConfig(student, device="cpu", dtype="float32"), out)
    s = select(pool, load_scores(out / "scores.jsonl"), SelectConfig("high", score=ranking)).summary
    return {k: s[k] for k in (*REPETITION_KEYS, "likelihood_gap_per_token", "length_ratio_low_high")}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (NaN with fewer than 3 pairs or a constant side)."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return math.nan
    return float(spearmanr(xs, ys).statistic)


def table(paths: list[Path], scores_dir: Path) -> dict:
    by_pool: dict[tuple, list[dict]] = defaultdict(list)
    for p in paths:
        by_pool[pool_of(p)] += folder_records(p)
    out = []
    for (pool_file, student, n_eval), records in sorted(by_pool.items(), key=lambda kv: str(kv[0][0])):
        rows = label_rows(records)
        if not rows:
            continue
        m = measure_pool(pool_file, student, n_eval, scores_dir)
        measured = [r["features"].get("likelihood_gap_per_token") for r in rows]
        leads = [100 * (r["accuracy"]["low"] - r["accuracy"]["high"]) for r in rows]
        out.append({"source": rows[0]["source"], "pool": pool_file.name, "rows": len(rows), **m,
                    "records_likelihood_gap_per_token": mean(v for v in measured if isinstance(v, (int, float))),
                    "low_lead": mean(leads), "low_wins": sum(r["label"] == "low" for r in rows),
                    "high_wins": sum(r["label"] == "high" for r in rows)})
    return {"sources": out, "rank_correlation": correlations(out)}


def correlations(sources: list[dict]) -> dict:
    """Each contrast's rank correlation with D_low's lead, over the sources where it is a number."""
    out = {}
    for k in CONTRASTS:
        pairs = [(r[k], r["low_lead"]) for r in sources if math.isfinite(r[k])]
        out[k] = spearman([x for x, _ in pairs], [y for _, y in pairs])
    return out


def markdown(t: dict) -> str:
    def f(v, digits=2):
        return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"

    lines = ["| source | rows | trigram repetition, D_high | D_low | gap (low − high) | length ratio (low / high) | "
             "likelihood gap / token (selected here / its records) | D_low's lead (points) | rows D_low / D_high won |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in t["sources"]:
        lines.append(f"| {r['source']} | {r['rows']} | {f(r['trigram_repetition_high'])} | {f(r['trigram_repetition_low'])} | "
                     f"{f(r['gap_trigram_repetition'])} | {f(r['length_ratio_low_high'])} | "
                     f"{f(r['likelihood_gap_per_token'], 3)} / {f(r['records_likelihood_gap_per_token'], 3)} | "
                     f"{r['low_lead']:+.1f} | {r['low_wins']} / {r['high_wins']} |")
    lines.append("\nSpearman's rank correlation with D_low's lead over the sources: " + ", ".join(
        f"{k} {f(v)}" for k, v in t["rank_correlation"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.pool_repetition", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="published calibration folders (calibration/real/SOURCE-sSEED)")
    ap.add_argument("--scores", type=Path, default=Path("runs/pool-repetition"),
                    help="where each pool's scores are kept (and read again on a later call)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        t = table(args.paths, args.scores)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(t, indent=1) if args.json else markdown(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
