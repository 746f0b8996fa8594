"""`make demo`: the main job on the embedded lab, end to end, on a CPU.

    python -m capacity_advisor.advisor.cli.demo [--model lab:m] [--budget 3] [--out demo-out]

1. builds the lab student on first use (cached under $ADVISOR_HOME; the README gives the cost);
2. `advisor recommend`: takes the lab teacher's pool, scores it under the student, probes D_high
   and D_low, asks the shipped predictor, and writes recommendation.json + train.jsonl + report.png
   (into a fresh OUT/rec: the demo's own folder is rewritten on every run);
3. shows the same pool's D_high and D_low through `advisor select`, as a user's own launcher
   would consume them.
"""

from __future__ import annotations

import argparse
import sys
import time

from capacity_advisor.advisor.cli.main import main as advisor
from capacity_advisor.advisor.cli.ui import console


def step(title: str, argv: list[str]) -> None:
    console.rule(f"[bold]{title}")
    console.print("$ advisor " + " ".join(argv), style="dim")
    t = time.time()
    code = advisor(argv)
    if code:
        raise SystemExit(code)
    console.print(f"[dim]({time.time() - t:.1f}s)[/dim]")


def main() -> int:
    ap = argparse.ArgumentParser(description="capacity-advisor demo on the embedded lab")
    ap.add_argument("--model", default="lab:m")
    ap.add_argument("--budget", default="3")
    ap.add_argument("--out", default="demo-out")
    args = ap.parse_args()
    out = args.out
    import shutil

    shutil.rmtree(f"{out}/rec", ignore_errors=True)
    step("The lab's students", ["lab", "list"])
    step(f"Recommend for {args.model} at {args.budget} epochs",
         ["recommend", "--model", args.model, "--budget", args.budget, "--out", f"{out}/rec", "--device", "cpu"])
    step("The same pool's D_high, for your own launcher",
         ["select", "--pool", f"{out}/rec/pool.jsonl", "--scores", f"{out}/rec/score/scores.jsonl",
          "--strategy", "high", "--out", f"{out}/d_high.jsonl"])
    step("... and D_low",
         ["select", "--pool", f"{out}/rec/pool.jsonl", "--scores", f"{out}/rec/score/scores.jsonl",
          "--strategy", "low", "--out", f"{out}/d_low.jsonl"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
