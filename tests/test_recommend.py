"""calibrate -> fit -> recommend on the smallest lab student, the priors, and the manifest feeding training."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_advisor.advisor.cli.main import cli
from capacity_advisor.advisor.fit import fit_and_save
from capacity_advisor.advisor.predictor import Predictor
from capacity_advisor.training.manifest import load_manifest

from test_predictor import make_records


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


PAPER = Path(__file__).resolve().parent.parent / "benchmarks" / "paper_students"


@pytest.fixture(scope="module")
def synthetic_predictor(tmp_path_factory):
    out = tmp_path_factory.mktemp("pred")
    fit_and_save(make_records(), out, n_members=4, kinds=("logistic",))
    return out


@pytest.fixture
def lab_pool_file(lab_home, tmp_path):
    pool = tmp_path / "labpool.jsonl"
    assert run("lab", "pool", "--n", 120, "--out", pool).exit_code == 0
    return pool


@pytest.mark.slow
def test_quick_calibration_writes_records_and_resumes(lab_home, tmp_path):
    r = run("calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert r.exit_code == 0, r.stderr
    records = [json.loads(x) for x in (tmp_path / "cal" / "records.jsonl").read_text().splitlines()]
    assert [x["strategy"] for x in records] == ["high", "low", "mixed"]
    for rec in records:
        assert rec["model"]["spec"] == "lab:xs" and rec["model"]["n_params"] > 0 and "path" not in rec["model"]
        assert [e["epoch"] for e in rec["evals"]] == [0.0, 0.5, 1.0]  # the base, then two evaluations per epoch
        assert all(0 <= e["accuracy"] <= 1 for e in rec["evals"])
        assert "low_teacher_nll_drop_rel" in rec["features"] and rec["unit"]["score"] == "sum"
        assert rec["settings"]["probe"] == {"steps": 4, "eval_problems": 8}  # the probe its features came from
        assert rec["best_accuracy"] == max(e["accuracy"] for e in rec["evals"] if e["step"] > 0)
    text = (tmp_path / "cal" / "records.jsonl").read_text()
    assert str(tmp_path) not in text and "NaN" not in text
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "cal").rglob("record.json")}
    again = run("calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert again.exit_code == 0 and {p: p.stat().st_mtime_ns for p in stamp} == stamp  # nothing recomputed

    # one trainer: `advisor train` on a calibration run's own manifest reproduces its losses and evaluations
    unit = tmp_path / "cal" / "modchain" / "sum" / "xs-s0"
    r = run("train", unit / "high.manifest.json", "--out", tmp_path / "again", "--threads", 1, "--device", "cpu",
            "--records", tmp_path / "store.jsonl", "--json")
    assert r.exit_code == 0, r.stderr
    ours = [json.loads(x) for x in (unit / "high" / "eval.jsonl").read_text().splitlines()]
    theirs = [json.loads(x) for x in (tmp_path / "again" / "eval.jsonl").read_text().splitlines()]
    assert [x["step"] for x in ours] == [x["step"] for x in theirs] == [0, 2, 4]
    for a, b in zip(ours, theirs):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=1e-9) if a["train_loss"] else b["train_loss"] is None
        assert (a["accuracy"], a["repetition_rate"]) == (b["accuracy"], b["repetition_rate"])


def test_fit_cli_prints_the_tables_and_saves(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in make_records()))
    r = run("fit", "--records", path, "--out", tmp_path / "pred", "--members", 4, "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    methods = set(res["cv"]["student"]["methods"])
    assert {"lightgbm", "logistic", "always high (GRAPE)", "always low", "always mixed",
            "rule of thumb (fitted thresholds)"} <= methods
    pred = Predictor.load(tmp_path / "pred")
    assert pred.kind == res["chosen"] and len(pred.members) == 4
    assert pred.meta["lab_prior"]["features"] == ["log10_params", "budget", "log10_params_x_budget"]
    r = run("fit", "--records", path, "--out", tmp_path / "p2", "--kinds", "forest")
    assert r.exit_code == 2 and "--kinds" in r.stderr


def test_the_predictor_says_how_its_inputs_were_probed_and_recommend_probes_so(lab_pool_file, tmp_path,
                                                                              synthetic_predictor):
    from capacity_advisor.advisor.fit import probe_of
    from capacity_advisor.advisor.predictor import Predictor

    recs = make_records()
    assert probe_of(recs) is None  # records that do not say
    said = [{**r, "settings": {**(r.get("settings") or {}), "probe": {"steps": 6, "eval_problems": 16}}} for r in recs]
    assert probe_of(said) == {"steps": 6, "eval_problems": 16}
    assert probe_of(said[:-1] + [{**said[-1], "settings": {"probe": {"steps": 7, "eval_problems": 16}}}]) is None

    pred = Predictor.load(synthetic_predictor)
    pred.meta = {**pred.meta, "probe": {"steps": 6, "eval_problems": 16}}
    pred.save(tmp_path / "p6")
    common = ["--model", "lab:xs", "--pool", lab_pool_file, "--device", "cpu", "--json", "--budget", 2]
    r = run("recommend", "--predictor", tmp_path / "p6", "--out", tmp_path / "rec", *common)
    assert r.exit_code == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    assert settings["probe_steps"] == {"value": 6, "source": "the predictor (its inputs were measured so)"}
    assert settings["probe_eval_problems"]["value"] == 16
    probe = json.loads((tmp_path / "rec" / "probe" / "probe.json").read_text())
    assert max(p["step"] for p in probe["curves"]["high"]) == 6

    pred.meta = {**pred.meta, "probe": {"steps": 10**9, "eval_problems": 16}}  # a crafted file must not hang the run
    pred.save(tmp_path / "pbig")
    r = run("recommend", "--predictor", tmp_path / "pbig", "--out", tmp_path / "rec2", *common)
    assert r.exit_code == 2 and "meta.probe" in r.stderr and not (tmp_path / "rec2").exists()


@pytest.mark.slow
def test_recommend_end_to_end_on_the_smallest_lab_student(lab_pool_file, tmp_path, synthetic_predictor):
    out = tmp_path / "rec"
    common = ["--model", "lab:xs", "--pool", lab_pool_file, "--predictor", synthetic_predictor, "--probe-steps", 8,
              "--probe-eval-problems", 32, "--device", "cpu", "--json"]
    r = run("recommend", "--budget", 3, "--out", out, *common)
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["strategy"] in ("high", "low", "mixed") and abs(sum(rep["probabilities"].values()) - 1) < 1e-6
    assert rep["strategy"] == max(rep["probabilities"], key=rep["probabilities"].get)
    assert rep["features"]["budget"] == 3.0 and "low_teacher_nll_drop_rel" in rep["features"]
    assert rep["confidence"] in ("high", "medium", "low") and rep["confidence_reasons"]
    assert set(rep["interval"]) == {"high", "low", "mixed"} and rep["range"] and rep["neighbours"]
    assert rep["settings"]["probe_steps"] == {"value": 8, "source": "--probe-steps"}
    assert rep["settings"]["max_length"]["source"] == "lab default"
    for name in ("recommendation.json", "train.jsonl", "eval.jsonl", "report.png", "probe/probe.json"):
        assert (out / name).exists(), name
    m = load_manifest(out / "recommendation.json")  # what `advisor train` reads, unchanged
    assert m.strategy == rep["strategy"] and m.training.epochs == 3 and m.model_spec == "lab:xs"
    assert str(tmp_path) not in (out / "recommendation.json").read_text()
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert len(train) == 120 - 32 and len(evals) == 32 and m.eval.checker == "lab"
    assert not {t["prompt"] for t in train} & {e["prompt"] for e in evals}
    # more budget never makes the synthetic predictor less keen on low for the same student
    more = run("recommend", "--budget", 10, "--out", tmp_path / "rec10", *common)
    assert json.loads(more.stdout)["probabilities"]["low"] >= rep["probabilities"]["low"] - 1e-9
    # the same folder with another student is refused, not silently reused
    again = run("recommend", "--budget", 3, "--out", out, *[("lab:s" if a == "lab:xs" else a) for a in common])
    assert again.exit_code == 2 and "other inputs" in again.stderr


def test_recommend_without_probe_uses_the_lab_prior(lab_pool_file, tmp_path, synthetic_predictor):
    r = run("recommend", "--model", "lab:xs", "--budget", 1, "--out", tmp_path / "rec", "--predictor",
            synthetic_predictor, "--pool", lab_pool_file, "--no-probe", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["confidence"] == "low" and rep["predictor"] == "lab prior" and not (tmp_path / "rec" / "probe").exists()
    assert (tmp_path / "rec" / "train.jsonl").exists()


@pytest.mark.parametrize("student,budget,answer", [
    ("qwen2.5-1.5b", 1, "high"), ("qwen2.5-1.5b", 5, "high"),
    ("qwen2.5-3b-instruct", 1, "high"), ("qwen2.5-3b-instruct", 5, "high"),
    ("qwen2.5-math-7b", 1, "high"), ("qwen2.5-math-7b", 5, "low"),
    ("qwen3-8b", 1, "high"), ("qwen3-8b", 5, "low"),
    ("qwen3-4b", 5, "uncertain"),
])
def test_a_config_only_folder_gets_the_papers_findings_without_weights(tmp_path, synthetic_predictor, student, budget,
                                                                      answer):
    folder = tmp_path / student
    folder.mkdir()
    shutil.copy(PAPER / student / "config.json", folder / "config.json")  # no weights, no tokenizer
    r = run("recommend", "--model", folder, "--budget", budget, "--no-probe", "--out", tmp_path / "rec",
            "--predictor", synthetic_predictor, "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["prior"] == "paper" and rep["answer"] == answer and rep["model"]["n_params"] > 1e9
    assert any("2608.13721" in x for x in rep["confidence_reasons"])
    saved = json.loads((tmp_path / "rec" / "recommendation.json").read_text())
    assert saved["advice_only"] is True and saved["dataset"] is None and sorted(p.name for p in folder.iterdir()) == ["config.json"]


def test_a_real_student_needs_a_pool_to_be_probed(tmp_path, synthetic_predictor):
    folder = tmp_path / "s"
    folder.mkdir()
    shutil.copy(PAPER / "qwen2.5-1.5b" / "config.json", folder / "config.json")
    r = run("recommend", "--model", folder, "--budget", 2, "--out", tmp_path / "rec", "--predictor", synthetic_predictor)
    assert r.exit_code == 2 and "--pool is needed" in r.stderr and not (tmp_path / "rec").exists()


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
    assert run("lab", "pool", "--n", 200, "--out", pool).exit_code == 0
    r = run("score", "--model", "lab:xs", "--pool", pool, "--out", tmp_path / "s", "--max-length", 96, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    common = ["--model", "lab:xs", "--budget", 2, "--pool", pool, "--predictor", synthetic_predictor, "--no-probe",
              "--device", "cpu", "--json"]
    given = run("recommend", *common, "--scores", tmp_path / "s" / "scores.jsonl", "--out", tmp_path / "given")
    own = run("recommend", *common, "--out", tmp_path / "own")
    assert given.exit_code == own.exit_code == 0, given.stderr + own.stderr
    a, b = json.loads(given.stdout), json.loads(own.stdout)
    assert a["strategy"] == b["strategy"] and a["features"] == b["features"] and a["predictor"] == "lab prior"
    assert not (tmp_path / "given" / "score").exists() and (tmp_path / "own" / "score").exists()
    assert (tmp_path / "given" / "train.jsonl").read_bytes() == (tmp_path / "own" / "train.jsonl").read_bytes()
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--scores", tmp_path / "s" / "scores.jsonl", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--scores needs the --pool" in r.stderr


def test_recommend_on_a_real_model_folder_reports_where_each_setting_came_from(tiny_llama, tmp_path, synthetic_predictor):
    """A student that is not a lab model: its pool is required, its defaults are the real-student ones."""
    import random

    rng = random.Random(0)
    rows = []
    for i in range(40):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"id": f"q{i}", "problem": f"what is {a} + {b}?", "answer": str(a + b),
                     "generations": [f"The answer is \\\\boxed{{{a + b}}}.",
                                     f"Let us think. {a} + {b} = {a + b}. The answer is \\\\boxed{{{a + b}}}."]})
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run("recommend", "--model", tiny_llama, "--budget", 2, "--pool", pool, "--out", tmp_path / "rec",
            "--predictor", synthetic_predictor, "--probe-steps", 4, "--probe-eval-problems", 4, "--max-new-tokens", 8,
            "--sample", 30, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    s = rep["settings"]
    assert s["max_length"] == {"value": 4096, "source": "default for real students"}
    assert s["probe_max_length"]["value"] == 2048 and s["max_new_tokens"]["source"] == "--max-new-tokens"
    assert s["learning_rate"]["source"] == "size default" and rep["pool"]["sampled"] == 30
    assert rep["train_rows"] == 30 - 4 and rep["paper_prior"] is None  # 10^8 parameters and up only
    m = load_manifest(tmp_path / "rec" / "recommendation.json")
    assert m.eval.checker == "math" and m.training.max_length == 4096


@pytest.mark.slow
def test_calibration_covers_extra_schedules_and_the_predictor_chooses_among_them(lab_home, tmp_path):
    """mixed@0.25 is trained as a share of a quarter of the problems on their low response, labelled,
    and becomes one of the predictor's options."""
    from dataclasses import replace

    from capacity_advisor.advisor.lab.calibrate import CalibrateConfig, run_calibration
    from capacity_advisor.advisor.predictor import fit_predictor, label_rows

    cfg = replace(CalibrateConfig.quick_settings(str(tmp_path / "cal")), schedules=("mixed@0.25",))
    run_calibration(cfg, log=lambda m: None)
    records = [json.loads(x) for x in (tmp_path / "cal" / "records.jsonl").read_text().splitlines()]
    assert [(r["strategy"], r["mix"]) for r in records] == [("high", 0.0), ("low", 0.0), ("mixed", 0.5), ("mixed", 0.25)]
    train = [json.loads(x) for x in (tmp_path / "cal" / "modchain" / "sum" / "xs-s0" / "data" / "mixed@0.25.jsonl")
             .read_text().splitlines()]
    assert len(train) == 64
    rows = label_rows(records)
    assert set(rows[0]["accuracy"]) == {"high", "low", "mixed", "mixed@0.25"}
    pred = fit_predictor(rows * 2, "logistic", ("budget", "likelihood_gap_per_token"), n_members=2)
    assert pred.options == ("high", "mixed@0.25", "mixed", "low")
    with pytest.raises(Exception, match="names no schedule"):
        replace(cfg, schedules=("mixed@2",)).validate()


def test_recommend_writes_the_schedule_the_predictor_chose(lab_pool_file, tmp_path):
    """A predictor fitted on records where a quarter-mix always wins recommends it, and the manifest carries it."""
    from capacity_advisor.advisor.fit import fit_and_save

    records = make_records()
    for rec in [r for r in records if r["strategy"] == "high"]:
        better = {**rec, "strategy": "mixed", "mix": 0.25,
                  "evals": [{**e, "accuracy": min(1.0, e["accuracy"] + 0.2) if e["step"] else e["accuracy"]} for e in rec["evals"]]}
        records.append(better)
    fit_and_save(records, tmp_path / "pred", n_members=2, kinds=("logistic",))
    r = run("recommend", "--model", "lab:xs", "--budget", 3, "--pool", lab_pool_file, "--predictor", tmp_path / "pred",
            "--probe-steps", 4, "--probe-eval-problems", 16, "--out", tmp_path / "rec", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["strategy"] == "mixed@0.25" and rep["mix"] == 0.25 and set(rep["probabilities"]) >= {"mixed@0.25", "high"}
    m = load_manifest(tmp_path / "rec" / "recommendation.json")
    assert (m.strategy, m.mix) == ("mixed", 0.25)
