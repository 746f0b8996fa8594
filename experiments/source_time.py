"""A pool source's time at 2 jobs, as profiled, and with the full runs' scoring measures thinned.

    .venv/bin/python -m experiments.source_time docs/lab/run-profile.jsonl docs/lab/run-profile-measure4.jsonl

Table: docs/lab.md, "Where a source's time goes" (the minutes of a source, profiled and thinned).

PROFILE is `python -m experiments.run_profile --json` output, one line per call, the unit's runs timed by
part with the manifests' own `eval.measure_every` (docs/lab.md, "Where a source's time goes":
every student of one source, one seed). THINNED holds `run_profile.py --measure-every N --json`
lines: the same runs trained twice in one process, as the manifests say and with the scoring
measures at every Nth evaluation. From each of those the ratio of the scoring part (the full
protocol's seconds over the thinned one's) is read; a student of PROFILE with no comparison of its
own takes the ratio of the compared student nearest in parameters. The thinned seconds of a
student are its profiled seconds with the scoring part divided by that ratio; everything else
(training, generation, checkpoints) is kept, as the comparisons measure it unchanged.

A source is the students × `--seeds` (2) seeds, their three runs each, at `--jobs` (2) at a time:
the sum over units divided by the jobs (the units are long and many, so the sweep's largest-first
order keeps the jobs busy to the end). Probes and the teacher's pools are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from capacity_advisor.models.lab.ladder import n_params


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def profiled(rows: list[dict]) -> dict[str, dict]:
    """{size: {"seconds": s, "scoring": s}} of one unit's three runs (a size profiled on fewer runs
    is scaled to three)."""
    seconds, scoring, runs = defaultdict(float), defaultdict(float), defaultdict(int)
    for line in rows:
        for res in line["runs"]:
            size = res["model"].removeprefix("lab:")
            seconds[size] += res["wall_s"]
            scoring[size] += res["parts_s"]["scoring"]
            runs[size] += len(res.get("options") or [res["option"]])  # older lines name one option
    return {s: {"seconds": seconds[s] * 3 / runs[s], "scoring": scoring[s] * 3 / runs[s]} for s in seconds}


def ratios(rows: list[dict]) -> dict[str, dict]:
    """{size: the scoring and wall ratios of a thinning comparison, and its measure_every}."""
    out = {}
    for line in rows:
        full, thin = line["runs"][0], line["runs"][-1]
        if len(line["runs"]) != 2 or not thin.get("measure_every", 1) > full.get("measure_every", 1):
            raise ValueError("a line without a --measure-every comparison (two runs, the second thinned)")
        size = full["model"].removeprefix("lab:")
        out[size] = {"scoring": full["parts_s"]["scoring"] / max(thin["parts_s"]["scoring"], 1e-9),
                     "wall": full["wall_s"] / thin["wall_s"], "every": thin["measure_every"],
                     "same_accuracies": line.get("same_accuracies")}
    return out


def project(profile: dict[str, dict], measured: dict[str, dict], seeds: int, jobs: int) -> dict:
    rows = []
    for size, p in sorted(profile.items(), key=lambda kv: n_params(kv[0])):
        near = size if size in measured else min(measured, key=lambda m: abs(n_params(m) - n_params(size)))
        r = measured[near]["scoring"]
        thinned = p["seconds"] - p["scoring"] + p["scoring"] / r
        rows.append({"student": size, "seconds": round(p["seconds"], 1), "scoring_share": round(p["scoring"] / p["seconds"], 3),
                     "ratio_from": near, "scoring_ratio": round(r, 2), "thinned_seconds": round(thinned, 1)})
    full = sum(r["seconds"] for r in rows) * seeds / jobs
    thin = sum(r["thinned_seconds"] for r in rows) * seeds / jobs
    return {"students": rows, "minutes": round(full / 60, 1), "thinned_minutes": round(thin / 60, 1),
            "measure_every": sorted({m["every"] for m in measured.values()}), "seeds": seeds, "jobs": jobs,
            "compared": {k: {"wall": round(v["wall"], 2), "scoring": round(v["scoring"], 2),
                             "same_accuracies": v["same_accuracies"]} for k, v in measured.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("thinned", type=Path)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        profile, measured = profiled(read_lines(args.profile)), ratios(read_lines(args.thinned))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"error: {args.profile} / {args.thinned}: not run_profile.py --json output ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    if not profile or not measured or args.seeds < 1 or args.jobs < 1:
        print("error: need profiled runs, at least one --measure-every comparison, and --seeds, --jobs of 1 or more",
              file=sys.stderr)
        return 2
    out = project(profile, measured, args.seeds, args.jobs)
    if args.json:
        print(json.dumps(out))
        return 0
    every = "/".join(map(str, out["measure_every"]))
    print(f"| student | three runs, s | scoring share | scoring ratio (from) | measure_every {every}, s |")
    print("|---|---|---|---|---|")
    for r in out["students"]:
        print(f"| {r['student']} | {r['seconds']:.0f} | {100 * r['scoring_share']:.0f} % | {r['scoring_ratio']:.2f}x "
              f"({r['ratio_from']}) | {r['thinned_seconds']:.0f} |")
    print(f"\na source of {out['seeds']} seeds at {out['jobs']} jobs: {out['minutes']} min as profiled, "
          f"{out['thinned_minutes']} min with measure_every {every}")
    for k, v in out["compared"].items():
        print(f"compared in one process, {k}: wall {v['wall']:.2f}x, scoring {v['scoring']:.2f}x, "
              f"accuracies {'the same' if v['same_accuracies'] else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
