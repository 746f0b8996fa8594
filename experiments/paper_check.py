"""The paper check: `advisor recommend --no-probe` on the paper's five students, next to what the paper found.

    .venv/bin/python -m experiments.paper_check [--markdown]

Table: docs/results.md section 1 (`--markdown`).

Each student is a folder holding only its public `config.json` (experiments/paper_students/): the
parameter count comes from the config on the meta device, no weights are read, nothing is scored.
Budgets 1 and 5 epochs. "Agree" counts the cells where the paper states a finding.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent

from capacity_advisor.advisor.cli.main import cli
from capacity_advisor.advisor.predictor.priors import _finding_at, paper_findings

STUDENTS = {"qwen2.5-1.5b": "Qwen2.5-1.5B", "qwen2.5-3b-instruct": "Qwen2.5-3B-Instruct", "qwen3-4b": "Qwen3-4B",
            "qwen2.5-math-7b": "Qwen2.5-Math-7B", "qwen3-8b": "Qwen3-8B"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    findings = {s["model"]: s for s in paper_findings()["students"]}
    rows, agree, spoken = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for folder, name in STUDENTS.items():
            for budget in (1, 5):
                out = Path(tmp) / f"{folder}-{budget}"
                r = CliRunner().invoke(cli, ["recommend", "--model", str(ROOT / "experiments" / "paper_students" / folder),
                                             "--budget", str(budget), "--no-probe", "--out", str(out), "--json"])
                if r.exit_code:
                    print(r.stderr, file=sys.stderr)
                    return 1
                rep = json.loads(r.stdout)
                paper = _finding_at(findings[name], budget) or "not stated"
                ok = None if paper == "not stated" else rep["answer"] == paper
                spoken += ok is not None
                agree += bool(ok)
                rows.append((name, rep["model"]["n_params"], budget, rep["answer"], rep["strategy"], rep["prior"],
                             rep["confidence"], paper, "—" if ok is None else ("yes" if ok else "no")))
    head = ("student", "parameters", "budget", "answer", "trains on", "prior", "confidence", "the paper", "agree")
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print(f"| {r[0]} | {r[1] / 1e9:.2f}B | {r[2]} | {r[3]} | D_{r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]} |")
    else:
        for r in rows:
            print(f"{r[0]:<22} {r[1] / 1e9:5.2f}B  budget {r[2]}  answer {r[3]:<9} ({r[5]} prior, {r[6]})  "
                  f"paper: {r[7]:<10} agree: {r[8]}")
    print(f"\n{agree}/{spoken} agree where the paper states a finding")
    return 0 if agree == spoken else 1


if __name__ == "__main__":
    sys.exit(main())
