"""calibrate -> fit -> recommend on the smallest lab student, and the manifest feeding training."""

import json

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.predictor import Predictor, fit_and_save
from training.manifest import load_manifest

from test_predictor import make_records


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def synthetic_predictor(tmp_path_factory):
    out = tmp_path_factory.mktemp("pred")
    fit_and_save(make_records(), out)
    return out


def test_quick_calibration_writes_records_and_resumes(lab_home, tmp_path):
    r = run("calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert r.exit_code == 0, r.stderr
    records = [json.loads(x) for x in (tmp_path / "cal" / "records.jsonl").read_text().splitlines()]
    assert [x["strategy"] for x in records] == ["high", "low", "mixed"]
    for rec in records:
        assert rec["model"]["spec"] == "lab:xs" and rec["model"]["n_params"] > 0
        assert [e["epoch"] for e in rec["evals"]] == [0.5, 1.0]  # two evaluations per epoch in --quick
        assert all(0 <= e["accuracy"] <= 1 for e in rec["evals"])
        assert "low_teacher_nll_drop_rel" in rec["features"] and rec["best_accuracy"] == max(e["accuracy"] for e in rec["evals"])
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "cal").rglob("runs/*.json")}
    again = run("calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert again.exit_code == 0 and {p: p.stat().st_mtime_ns for p in stamp} == stamp  # nothing recomputed


def test_fit_cli_prints_the_table_and_saves(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in make_records()))
    r = run("fit", "--records", path, "--out", tmp_path / "pred", "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    methods = {row["method"] for row in res["cv"]}
    assert {"lightgbm", "logistic", "always high (GRAPE)", "always low (hardest)", "rule of thumb (fitted thresholds)"} <= methods
    assert Predictor.load(tmp_path / "pred").kind == res["chosen"]
    assert Predictor.load(tmp_path / "pred" / "prior").features == ("log10_params", "budget")


def test_recommend_end_to_end_on_the_smallest_lab_student(lab_home, tmp_path, synthetic_predictor):
    out = tmp_path / "rec"
    r = run("recommend", "--model", "lab:xs", "--budget", 3, "--out", out, "--predictor", synthetic_predictor,
            "--lab-n", 120, "--probe-steps", 8, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["strategy"] in ("high", "low", "mixed") and abs(sum(rep["probabilities"].values()) - 1) < 1e-6
    assert rep["strategy"] == max(rep["probabilities"], key=rep["probabilities"].get)
    assert rep["features"]["budget"] == 3.0 and "low_teacher_nll_drop_rel" in rep["features"]
    for name in ("recommendation.json", "train.jsonl", "eval.jsonl", "report.png", "probe/probe.json"):
        assert (out / name).exists(), name
    m = load_manifest(out / "recommendation.json")  # what `advisor train` reads, unchanged
    assert m.strategy == rep["strategy"] and m.training.epochs == 3 and m.model_spec == "lab:xs"
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert len(train) == 120 - 32 and len(evals) == 32 and m.eval.checker == "lab"
    assert not {t["prompt"] for t in train} & {e["prompt"] for e in evals}
    # more budget never makes the synthetic predictor less keen on low for the same student
    more = run("recommend", "--model", "lab:xs", "--budget", 10, "--out", tmp_path / "rec10", "--predictor",
               synthetic_predictor, "--lab-n", 120, "--probe-steps", 8, "--device", "cpu", "--json")
    assert json.loads(more.stdout)["probabilities"]["low"] >= rep["probabilities"]["low"] - 1e-9


def test_recommend_without_probe_is_low_confidence(lab_home, tmp_path, synthetic_predictor):
    r = run("recommend", "--model", "lab:xs", "--budget", 1, "--out", tmp_path / "rec", "--predictor",
            synthetic_predictor, "--lab-n", 120, "--no-probe", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["confidence"] == "low" and rep["predictor"] == "prior" and not (tmp_path / "rec" / "probe").exists()


def test_recommend_bad_input(lab_home, tmp_path, synthetic_predictor):
    r = run("recommend", "--model", "lab:xs", "--budget", -1, "--out", tmp_path / "a")
    assert r.exit_code == 2 and "--budget -1.0 must be a positive number" in r.stderr and not (tmp_path / "a").exists()
    bad = tmp_path / "badpred"
    bad.mkdir()
    (bad / "predictor.json").write_text("{oops")
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--out", tmp_path / "b", "--predictor", bad)
    assert r.exit_code == 2 and "damaged" in r.stderr and not (tmp_path / "b").exists()
    r = run("recommend", "--model", "lab:nope", "--budget", 2, "--out", tmp_path / "c", "--predictor", synthetic_predictor)
    assert r.exit_code == 2 and "nope" in r.stderr and not (tmp_path / "c").exists()


def test_recommend_takes_precomputed_scores(lab_home, tmp_path, synthetic_predictor):
    """Scores made elsewhere (say `advisor score --backend vllm` in its own environment) feed recommend unchanged."""
    pool = tmp_path / "pool.jsonl"
    assert run("lab", "pool", "--n", 60, "--out", pool).exit_code == 0
    r = run("score", "--model", "lab:xs", "--pool", pool, "--out", tmp_path / "s", "--max-length", 96, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    common = ["--model", "lab:xs", "--budget", 2, "--pool", pool, "--predictor", synthetic_predictor, "--no-probe",
              "--device", "cpu", "--json"]
    given = run("recommend", *common, "--scores", tmp_path / "s" / "scores.jsonl", "--out", tmp_path / "given")
    own = run("recommend", *common, "--out", tmp_path / "own")
    assert given.exit_code == own.exit_code == 0, given.stderr + own.stderr
    a, b = json.loads(given.stdout), json.loads(own.stdout)
    assert a["strategy"] == b["strategy"] and a["features"] == b["features"]
    assert not (tmp_path / "given" / "score").exists() and (tmp_path / "own" / "score").exists()
    assert (tmp_path / "given" / "train.jsonl").read_bytes() == (tmp_path / "own" / "train.jsonl").read_bytes()
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--scores", tmp_path / "s" / "scores.jsonl", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--scores needs the --pool" in r.stderr
