"""`recommend --probe-repeats N`: N probes from the draws seed .. seed+N-1 (held-out slice, mixed
set, data order), their inputs averaged for the advice, each draw's own advice shown beside it, the
cost of all of them stated, and confidence never "high" when the draws disagree."""

import json
import math
from pathlib import Path

import pytest
from helpers import lab_pool, run

SMALL = ["--probe-steps", 4, "--probe-eval-every", 2, "--probe-eval-problems", 4, "--probe-batch", 4]


@pytest.fixture
def pool(lab_home, tmp_path):
    return lab_pool(tmp_path / "pool.jsonl", 24)


def test_two_draws_are_probed_averaged_and_shown(pool, tmp_path):
    out = tmp_path / "rec"
    r = run("recommend", "--model", "lab:xs", "--pool", pool, "--budget", 2, "--seed", 3, "--probe-repeats", 2, *SMALL,
            "--out", out, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    first, second = (json.loads((out / d / "probe.json").read_text()) for d in ("probe", "probe-2"))
    assert (first["settings"]["seed"], second["settings"]["seed"]) == (3, 4)
    # another held-out slice: the two draws evaluate other problems
    assert first["curves"]["high"][0] != second["curves"]["high"][0] or first["features"] != second["features"]
    for k, v in rep["features"].items():
        if k in first["features"]:
            vals = [x for x in (first["features"][k], second["features"][k]) if x is not None]
            assert (v is None and not vals) or v == pytest.approx(sum(vals) / len(vals)), k
    assert [d["seed"] for d in rep["draws"]] == [3, 4] and [d["probe"] for d in rep["draws"]] == ["probe", "probe-2"]
    assert rep["draws_agree"] == (rep["draws"][0]["strategy"] == rep["draws"][1]["strategy"])
    assert any("probe draws agree" in x or "probe draws disagree" in x for x in rep["confidence_reasons"])
    if not rep["draws_agree"]:
        assert rep["confidence"] == "low"
    # the cost of both probes, against the same full run
    cost = rep["probe_cost"]
    assert cost["draws"] == 2
    assert cost["probe_tokens"] == first["cost"]["probe_tokens"] + second["cost"]["probe_tokens"]
    # the manifest reads the averaged inputs
    manifest = json.loads((out / "recommendation.json").read_text())
    assert manifest["features"]["gap_drift_rel"] == pytest.approx(rep["features"]["gap_drift_rel"])
    # the table in the report
    r = run("recommend", "--model", "lab:xs", "--pool", pool, "--budget", 2, "--seed", 3, "--probe-repeats", 2, *SMALL,
            "--out", out, "--device", "cpu")
    assert r.exit_code == 0 and "Probe draws" in r.output and "probe-2" in r.output


def test_draws_that_disagree_lower_confidence_and_say_so(pool, tmp_path, monkeypatch):
    """Which set wins on a draw is the predictor's business; that disagreement lowers the
    confidence and is said is recommend's, checked here with the draws' answers set."""
    import capacity_advisor.advisor.recommendation.recommend as rec_mod
    from capacity_advisor.advisor.recommendation.draws import probe_folder

    def split_draws(cfg, predictor, policy, desc, context, reports):
        return [{"seed": cfg.seed + r, "strategy": s, "answered_by": "predictor", "probe": probe_folder(r),
                 "probabilities": {"high": 0.9 if s == "high" else 0.1, "mixed": 0.0, "low": 0.1 if s == "high" else 0.9}}
                for r, s in enumerate(("high", "low"))]

    monkeypatch.setattr(rec_mod, "draw_advice", split_draws)
    r = run("recommend", "--model", "lab:xs", "--pool", pool, "--budget", 2, "--probe-repeats", 2, *SMALL,
            "--out", tmp_path / "rec", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["draws_agree"] is False and rep["confidence"] == "low"
    line = next(x for x in rep["confidence_reasons"] if "probe draws disagree" in x)
    assert "seed 0 D_high (P(D_low) 0.10)" in line and "seed 1 D_low (P(D_low) 0.90)" in line


def test_draws_line_and_mean_features():
    from types import SimpleNamespace

    from capacity_advisor.advisor.recommendation.draws import draws_line, mean_features

    same = [{"seed": 0, "strategy": "high", "probabilities": {"low": 0.2}},
            {"seed": 1, "strategy": "high", "probabilities": {"low": 0.3}}]
    line, agree = draws_line(same, "high")
    assert agree and line.startswith("the 2 probe draws agree")
    _, agree = draws_line([same[0], {**same[1], "strategy": "low"}], "high")
    assert not agree
    got = mean_features([SimpleNamespace(features={"a": 1.0, "b": None, "c": float("nan")}),  # probe reports' features
                         SimpleNamespace(features={"a": 3.0, "b": 2.0, "c": None})])
    assert got["a"] == 2.0 and got["b"] == 2.0 and math.isnan(got["c"])


@pytest.mark.parametrize("args, words", [
    (["--probe-repeats", 0], "--probe-repeats 0 must be from 1 to 8"),
    (["--probe-repeats", 9], "--probe-repeats 9 must be from 1 to 8"),
    (["--probe-repeats", 2, "--no-probe"], "--no-probe runs none"),
])
def test_bad_repeats_are_one_error_line_before_any_work(args, words, tmp_path):
    out = tmp_path / "rec"
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--out", out, *args)
    assert r.exit_code == 2 and words in r.output and r.output.count("error:") == 1
    assert not out.exists()


def test_one_draw_keeps_the_folder_key_of_before(tmp_path):
    """--probe-repeats 1 (the default) leaves the inputs key as it was, so older folders resume."""
    from dataclasses import asdict

    from capacity_advisor.advisor.recommendation.recommend import RecommendConfig, inputs_key
    from capacity_advisor.core.files import stable_hash

    cfg = RecommendConfig(model="lab:xs", budget=2, out=str(tmp_path))
    d = asdict(cfg)
    for k in ("out", "predictor", "device", "probe_repeats"):
        d.pop(k)
    assert inputs_key(cfg, {"m": 1}, {"r": 1}) == stable_hash({"config": d, "model": {"m": 1}, "recipe": {"r": 1}})
    assert inputs_key(RecommendConfig(model="lab:xs", budget=2, out=str(tmp_path), probe_repeats=2), {"m": 1}, {"r": 1}) \
        != inputs_key(cfg, {"m": 1}, {"r": 1})
    assert Path(cfg.out).exists()
