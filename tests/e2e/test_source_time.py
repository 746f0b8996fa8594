"""experiments.source_time: a source's time at 2 jobs from run_profile's lines, as profiled and
with the scoring measures thinned (the ratio of the nearest compared student)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT


def _run(model: str, wall: float, scoring: float, every: int = 1, options=("high",)) -> dict:
    return {"model": model, "options": list(options), "measure_every": every, "wall_s": wall,
            "parts_s": {"scoring": scoring, "training": wall - scoring}}


def test_a_source_is_projected_from_the_profiled_parts_and_the_measured_ratio(tmp_path):
    profile = tmp_path / "profile.jsonl"
    lines = [{"runs": [{**_run("lab:xs", 10.0, 6.0), "option": "high"}]} for _ in range(3)]  # older lines: one option each
    lines.append({"runs": [_run("lab:xxl", 300.0, 90.0, options=("high", "low", "mixed"))]})
    profile.write_text("".join(json.dumps(x) + "\n" for x in lines))
    thinned = tmp_path / "thin.jsonl"
    thinned.write_text(json.dumps({"runs": [_run("lab:m", 100.0, 40.0), _run("lab:m", 70.0, 10.0, every=4)],
                                   "same_accuracies": True}) + "\n")
    out = subprocess.run([sys.executable, "-m", "experiments.source_time", str(profile), str(thinned), "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout)
    rows = {r["student"]: r for r in got["students"]}
    assert rows["xs"]["seconds"] == 30.0 and rows["xs"]["ratio_from"] == "m" and rows["xs"]["scoring_ratio"] == 4.0
    assert rows["xs"]["thinned_seconds"] == pytest.approx(30 - 18 + 18 / 4)
    assert rows["xxl"]["thinned_seconds"] == pytest.approx(300 - 90 + 90 / 4)
    assert got["minutes"] == round((30 + 300) * 2 / 2 / 60, 1)
    assert got["thinned_minutes"] == round((16.5 + 232.5) * 2 / 2 / 60, 1)
    assert got["compared"]["m"] == {"wall": round(100 / 70, 2), "scoring": 4.0, "same_accuracies": True}
    bad = subprocess.run([sys.executable, "-m", "experiments.source_time", str(thinned), str(profile)],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
