"""calibrate -> fit -> recommend on the smallest lab student, the priors, and the manifest feeding training."""

import json
import math
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, addition_pool, build_tiny, lab_pool, make_records, read_jsonl, real_pool, resign, run, write_jsonl

from capacity_advisor.advisor.fit import FitSettings, fit_and_save
from capacity_advisor.advisor.predictor import Predictor
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import load_manifest



PAPER = ROOT / "experiments" / "paper_students"


@pytest.fixture(scope="module")
def synthetic_predictor(tmp_path_factory):
    out = tmp_path_factory.mktemp("pred")
    fit_and_save(make_records(), out, FitSettings(n_members=4, kinds=("logistic",), features="probe", cv_members=2))  # what make_records measures
    return out


@pytest.fixture
def lab_pool_file(lab_home, tmp_path):
    return lab_pool(tmp_path / "labpool.jsonl", 120)


@pytest.mark.slow
def test_quick_calibration_writes_records_and_resumes(lab_home, tmp_path):
    r = run("lab", "calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert r.exit_code == 0, r.stderr
    records = read_jsonl(tmp_path / "cal" / "records.jsonl")
    assert [x["strategy"] for x in records] == ["high", "low", "mixed"]
    for rec in records:
        assert rec["model"]["spec"] == "lab:xs" and rec["model"]["n_params"] > 0 and "path" not in rec["model"]
        assert [e["epoch"] for e in rec["evals"]] == [0.0, 0.5, 1.0]  # the base, then two evaluations per epoch
        assert all(0 <= e["accuracy"] <= 1 for e in rec["evals"])
        assert "low_teacher_nll_drop_rel" in rec["features"] and rec["unit"]["score"] == "sum"
        # the whole probe recipe its features came from
        from capacity_advisor.probes.recipe import MEASURING
        probe = rec["settings"]["probe"]
        assert {k: probe[k] for k in ("kind", "steps", "eval_problems")} == {"kind": "lab", "steps": 4, "eval_problems": 8}
        assert set(MEASURING) <= set(probe)
        assert rec["best_accuracy"] == max(e["accuracy"] for e in rec["evals"] if e["step"] > 0)
    text = (tmp_path / "cal" / "records.jsonl").read_text()
    assert str(tmp_path) not in text and "NaN" not in text
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "cal").rglob("record.json")}
    again = run("lab", "calibrate", "--quick", "--out", tmp_path / "cal", "--json")
    assert again.exit_code == 0 and {p: p.stat().st_mtime_ns for p in stamp} == stamp  # nothing recomputed

    # one trainer: `advisor train` on a calibration run's own manifest reproduces its losses and evaluations
    unit = tmp_path / "cal" / "modchain" / "sum" / "xs-s0"
    r = run("train", unit / "high.manifest.json", "--out", tmp_path / "again", "--threads", 1, "--device", "cpu",
            "--records", tmp_path / "store.jsonl", "--json")
    assert r.exit_code == 0, r.stderr
    ours = read_jsonl(unit / "high" / "eval.jsonl")
    theirs = read_jsonl(tmp_path / "again" / "eval.jsonl")
    assert [x["step"] for x in ours] == [x["step"] for x in theirs] == [0, 2, 4]
    for a, b in zip(ours, theirs):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=1e-9) if a["train_loss"] else b["train_loss"] is None
        assert (a["accuracy"], a["repetition_rate"]) == (b["accuracy"], b["repetition_rate"])


@pytest.mark.slow
def test_fit_cli_prints_the_tables_and_saves(tmp_path):
    path = tmp_path / "records.jsonl"
    write_jsonl(path, make_records())
    r = run("fit", "--records", path, "--out", tmp_path / "pred", "--members", 4, "--cv-members", 2, "--features", "probe", "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    methods = set(res["cv"]["student"])
    assert {"policy", "predictor", "always high", "always low", "always mixed", "size rule", "noise floor"} <= methods
    assert set(res["kinds"]) == {"logistic", "lightgbm", "ridge", "curve"} and res["chosen"] in res["kinds"]
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
    assert probe_of(said) == {"steps": 6, "eval_problems": 16}  # only what they state: no kind is invented
    from capacity_advisor.probes.recipe import LAB, MEASURING
    whole = {"kind": "lab", **{k: LAB.as_dict()[k] for k in MEASURING}, "steps": 6, "eval_problems": 16}
    stated = [{**r, "settings": {"probe": whole}} for r in recs]
    assert probe_of(stated) == whole
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


    raw = json.loads((tmp_path / "p6" / "predictor.json").read_text())  # a crafted file must not hang the run
    raw["meta"]["probe"] = {"steps": 10**9, "eval_problems": 16}  # (save() refuses it, so it is written by hand)
    (tmp_path / "pbig").mkdir()
    (tmp_path / "pbig" / "predictor.json").write_text(json.dumps(resign(raw)))
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
    assert rep["settings"]["score_length"]["source"] == "lab default"
    for name in ("recommendation.json", "train.jsonl", "eval.jsonl", "report.png", "probe/probe.json"):
        assert (out / name).exists(), name
    m = load_manifest(out / "recommendation.json")  # what `advisor train` reads, unchanged
    assert m.strategy == rep["strategy"] and m.training.epochs == 3 and m.model_spec == "lab:xs"
    assert str(tmp_path) not in (out / "recommendation.json").read_text()
    train = read_jsonl(out / "train.jsonl")
    evals = read_jsonl(out / "eval.jsonl")
    assert len(train) == 120 - 32 and len(evals) == 32 and m.eval.checker == "lab"
    assert not {t["prompt"] for t in train} & {e["prompt"] for e in evals}
    # the manifest names both D_high and D_low (`advisor train --race`), each without the held-out problems
    from capacity_advisor.training.race import set_files

    for name, file in set_files(m).items():
        rows = read_jsonl(out / file)
        assert len(rows) == len(train) and not {t["prompt"] for t in rows} & {e["prompt"] for e in evals}, name
    assert sorted(m.sets) == sorted({"high", "low"} - {m.strategy})
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
    pool = lab_pool(tmp_path / "pool.jsonl", 200)
    r = run("score", "--model", "lab:xs", "--pool", pool, "--out", tmp_path / "s", "--score-length", 96, "--device", "cpu")
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
    pool = real_pool(tmp_path / "pool.jsonl", empty_first=False)
    r = run("recommend", "--model", tiny_llama, "--budget", 2, "--pool", pool, "--out", tmp_path / "rec",
            "--predictor", synthetic_predictor, "--probe-steps", 4, "--probe-eval-problems", 4, "--max-new-tokens", 8,
            "--sample", 30, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    s = rep["settings"]
    assert s["score_length"] == {"value": 4096, "source": "default for real students"}
    assert s["train_length"]["value"] == 2048 and s["max_new_tokens"]["source"] == "--max-new-tokens"
    assert s["learning_rate"]["source"] == "size default" and rep["pool"]["sampled"] == 30
    assert rep["train_rows"] == 30 - 4 and rep["paper_prior"] is None  # 10^8 parameters and up only
    m = load_manifest(tmp_path / "rec" / "recommendation.json")
    # the full run trains at the recipe's training length, as calibration's full runs do
    assert m.eval.checker == "math" and m.training.max_length == 2048


@pytest.mark.slow
def test_calibration_covers_extra_schedules_and_the_predictor_chooses_among_them(lab_home, tmp_path):
    """mixed@0.25 is trained as a share of a quarter of the problems on their low response, labelled,
    and becomes one of the predictor's options."""
    from dataclasses import replace

    from capacity_advisor.advisor.calibration.sweep import run_calibration
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig
    from capacity_advisor.advisor.predictor import fit_predictor, label_rows

    cfg = replace(CalibrateConfig.quick_settings(str(tmp_path / "cal")), schedules=("mixed@0.25",))
    run_calibration(cfg, log=lambda m: None)
    records = read_jsonl(tmp_path / "cal" / "records.jsonl")
    assert [(r["strategy"], r["mix"]) for r in records] == [("high", 0.0), ("low", 0.0), ("mixed", 0.5), ("mixed", 0.25)]
    train = read_jsonl(tmp_path / "cal" / "modchain" / "sum" / "xs-s0" / "data" / "mixed@0.25.jsonl")
    assert len(train) == 64
    rows = label_rows(records)
    assert set(rows[0]["accuracy"]) == {"high", "low", "mixed", "mixed@0.25"}
    pred = fit_predictor(rows * 2, "logistic", ("budget", "likelihood_gap_per_token"), n_members=2)
    assert pred.options == ("high", "mixed@0.25", "mixed", "low")
    with pytest.raises(Exception, match="names no schedule"):
        replace(cfg, schedules=("mixed@2",)).validate()


def test_recommend_writes_the_schedule_the_predictor_chose(lab_pool_file, tmp_path):
    """A predictor fitted on records where a quarter-mix always wins recommends it, and the manifest carries it."""
    from capacity_advisor.advisor.fit import FitSettings, fit_and_save

    records = make_records()
    for rec in [r for r in records if r["strategy"] == "high"]:
        better = {**rec, "strategy": "mixed", "mix": 0.25,
                  "evals": [{**e, "accuracy": min(1.0, e["accuracy"] + 0.2) if e["step"] else e["accuracy"]} for e in rec["evals"]]}
        records.append(better)
    fit_and_save(records, tmp_path / "pred", FitSettings(n_members=2, kinds=("logistic",), features="probe", cv_members=2))
    pred = Predictor.load(tmp_path / "pred")  # the synthetic records lie far from a real probe: trust the predictor anyway
    pred.meta["policy"] = {"max_distance": None, "margin": 0.0, "use_range": False}
    pred.save(tmp_path / "pred")
    r = run("recommend", "--model", "lab:xs", "--budget", 3, "--pool", lab_pool_file, "--predictor", tmp_path / "pred",
            "--probe-steps", 4, "--probe-eval-problems", 16, "--out", tmp_path / "rec", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["strategy"] == "mixed@0.25" and rep["mix"] == 0.25 and set(rep["probabilities"]) >= {"mixed@0.25", "high"}
    m = load_manifest(tmp_path / "rec" / "recommendation.json")
    assert (m.strategy, m.mix) == ("mixed", 0.25)


# ---- one probe recipe ------------------------------------------------------------------------

SMALL = dict(steps=4, eval_every=2, eval_problems=4, batch_size=4)  # a recipe small enough to probe in seconds


@pytest.fixture
def small_lab_pool(lab_home, tmp_path):
    return lab_pool(tmp_path / "small.jsonl", 24)


def recipe_predictor(synthetic_predictor, folder, **recipe):
    """The synthetic predictor, stating that its inputs were measured with the lab recipe changed by `recipe`."""
    from capacity_advisor.probes.recipe import LAB

    pred = Predictor.load(synthetic_predictor)
    pred.meta = {**pred.meta, "recipe": LAB.with_(**recipe).as_dict()}
    pred.save(folder)
    return folder


def measured_with(probe_json) -> dict:
    from capacity_advisor.probes.recipe import MEASURING

    settings = json.loads(Path(probe_json).read_text())["settings"]
    return {k: settings[k] for k in MEASURING}


def test_probe_and_recommend_measure_a_lab_student_with_the_predictors_recipe(small_lab_pool, tmp_path,
                                                                              synthetic_predictor):
    from capacity_advisor.probes.recipe import LAB, MEASURING

    pred = recipe_predictor(synthetic_predictor, tmp_path / "pred", **SMALL)
    common = ["--model", "lab:xs", "--pool", small_lab_pool, "--predictor", pred, "--device", "cpu", "--json"]
    p = run("probe", *common, "--out", tmp_path / "probe")
    r = run("recommend", *common, "--budget", 2, "--out", tmp_path / "rec")
    assert p.exit_code == r.exit_code == 0, p.stderr + r.stderr
    want = {k: LAB.with_(**SMALL).as_dict()[k] for k in MEASURING}
    assert measured_with(tmp_path / "probe" / "probe.json") == measured_with(tmp_path / "rec" / "probe" / "probe.json") == want
    by_probe = json.loads((tmp_path / "probe" / "probe.json").read_text())["features"]
    by_recommend = json.loads((tmp_path / "rec" / "probe" / "probe.json").read_text())["features"]
    assert by_probe == by_recommend and "gap_teacher_nll_drop_rel" in by_probe
    rep = json.loads(r.stdout)
    assert rep["settings"]["probe_steps"] == {"value": 4, "source": "the predictor (its inputs were measured so)"}
    assert rep["settings"]["max_new_tokens"]["value"] == LAB.max_new_tokens
    assert not any("measured otherwise" in x for x in rep["confidence_reasons"])
    assert json.loads(p.stdout)["chosen"]["probe_steps"]["source"] == "the predictor (its inputs were measured so)"


@pytest.mark.slow
def test_advisor_probe_measures_a_lab_student_as_the_shipped_predictor_states(lab_home, tmp_path):
    from importlib import resources

    from capacity_advisor.probes.recipe import LAB, MEASURING, read_recipe

    meta = json.loads((resources.files("capacity_advisor.advisor") / "predictor_data" / "predictor.json").read_text())["meta"]
    if meta.get("recipe"):
        want = read_recipe(meta["recipe"])
    else:  # a file from before meta.recipe states only the probe's steps and held-out problems
        want = LAB.with_(**meta.get("probe", {}))
    pool = lab_pool(tmp_path / "pool.jsonl", 2 * (want.eval_problems + want.batch_size))
    r = run("probe", "--model", "lab:xs", "--pool", pool, "--out", tmp_path / "probe", "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    assert measured_with(tmp_path / "probe" / "probe.json") == {k: want.as_dict()[k] for k in MEASURING}


def test_a_flag_that_measures_otherwise_is_said_and_lowers_confidence(small_lab_pool, tmp_path, synthetic_predictor):
    pred = recipe_predictor(synthetic_predictor, tmp_path / "pred", **SMALL)
    r = run("recommend", "--model", "lab:xs", "--pool", small_lab_pool, "--predictor", pred, "--device", "cpu",
            "--budget", 2, "--probe-steps", 6, "--out", tmp_path / "rec", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["confidence"] == "low"
    first = rep["confidence_reasons"][0]
    assert first.startswith("the probe measured otherwise than the predictor's inputs were measured")
    assert "probe_steps 6 (--probe-steps) where they had 4" in first
    assert first in load_manifest(tmp_path / "rec" / "recommendation.json").reasons


@pytest.mark.parametrize("recipe,fragment", [
    ({"kind": "lab", "steps": "many"}, "meta.recipe.steps must be a whole number"),
    ({"kind": "tpu"}, "'kind' lab or real"),
    ([1, 2], "must be an object"),
])
def test_a_crafted_meta_recipe_is_one_error_line(lab_home, tmp_path, synthetic_predictor, recipe, fragment):

    raw = json.loads((synthetic_predictor / "predictor.json").read_text())
    raw["meta"] = {**raw.get("meta", {}), "recipe": recipe}  # save() refuses it, so craft the file by hand
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "predictor.json").write_text(json.dumps(resign(raw)))
    for verb in (["recommend", "--budget", 2], ["probe", "--pool", tmp_path / "nopool.jsonl"]):
        r = run(*verb, "--model", "lab:xs", "--predictor", tmp_path / "pred", "--out", tmp_path / "out")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and fragment in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()


def test_the_out_folder_is_checked_before_a_lab_student_is_pretrained(tmp_path, synthetic_predictor):
    out = tmp_path / "rec"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"stage": "recommend", "inputs_key": "made-from-something-else"}))
    r = run("recommend", "--model", "lab:s", "--budget", 2, "--out", out, "--predictor", synthetic_predictor, "--no-probe")
    assert r.exit_code == 2 and "other inputs" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "advisor-home" / "lab").exists()  # lab:s was not pretrained


# ---- a real-architecture student with a short context ---------------------------------------------


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("ctx48"), "llama", seed=3, context=48)


def strict_json(path):
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def test_a_short_context_caps_the_probe_and_the_report_says_so(short_context_model, tmp_path, synthetic_predictor):
    pool = real_pool(tmp_path / "pool.jsonl")
    r = run("recommend", "--model", short_context_model, "--budget", 2, "--pool", pool, "--predictor", synthetic_predictor,
            "--probe-steps", 2, "--probe-eval-every", 2, "--probe-eval-problems", 4, "--sample", 30, "--device", "cpu",
            "--out", tmp_path / "rec")
    assert r.exit_code == 0, r.stderr
    chosen = json.loads((tmp_path / "rec" / "config.json").read_text())["chosen"]
    capped = "default for real students, capped at the model's context (48 positions)"
    assert chosen["max_new_tokens"] == {"value": 36, "source": capped}
    assert chosen["train_length"] == {"value": 48, "source": capped}
    assert chosen["score_length"] == {"value": 48, "source": capped}
    probe = strict_json(tmp_path / "rec" / "probe" / "probe.json")  # no NaN literals, though some metrics do not apply
    assert probe["settings"]["max_new_tokens"] == 36 and probe["settings"]["max_length"] == 48
    manifest = strict_json(tmp_path / "rec" / "recommendation.json")
    assert manifest["eval"]["max_new_tokens"] == 36 and manifest["training"]["max_length"] == 48
    assert any(v is None for v in manifest["features"].values())
    assert load_manifest(tmp_path / "rec" / "recommendation.json").training.max_length == 48  # `advisor train` reads it

    # the report, as a log file gets it: plain lines, no bars, table rows whole, the pool as read, the notes
    lines = r.stderr.splitlines()
    assert any(line.startswith("probe D_high: 2/2 steps") for line in lines)
    assert not any("probe D_high" in line and "━" in line for line in lines)
    assert any("max_new_tokens" in line and capped in line for line in lines)  # not cut at 80 columns
    assert any("fields" in line and "prompt = problem" in line and "responses = generations" in line for line in lines)
    assert any("skipped candidates" in line and "1" in line for line in lines)
    assert "of the 2-epoch full run" in r.stderr
    text = " ".join(r.stderr.split())  # long lines wrap at the table width
    note = text[text.index("note: train.jsonl"):]
    assert "holds the 30 problems" in note and "not the pool's 40" in note and "advisor select" in note


# ---- the typed steps ---------------------------------------------------------------------------


def test_a_schedule_is_parsed_once_and_kept_within_the_budget():
    from capacity_advisor.advisor.recommendation.schedule import Schedule

    s = Schedule.parse("curriculum@2")
    assert (s.strategy, s.mix, s.switch_epoch) == ("curriculum", 0.0, 2.0)
    assert s.within(3) == (s, None) and s.select_flags() == "--strategy curriculum --switch-epoch 2"
    high, why = s.within(1.5)
    assert high.strategy == "high" and "switches after the 1.5-epoch budget" in why
    assert Schedule.parse("mixed@0.25").mix == 0.25 and Schedule.parse("mixed").mix == 0.5


def test_the_baselines_are_the_calibrations_own(synthetic_predictor):
    from capacity_advisor.advisor.predictor import CONSTANTS, SIZE_RULE as RULE_OF_THUMB, Rule
    from capacity_advisor.advisor.recommendation.result import baselines

    pred = Predictor.load(synthetic_predictor)
    rule = Rule.from_meta(pred.meta["rule_of_thumb"])
    for n, budget in ((1e4, 1), (1e7, 5)):
        rules, words = baselines(pred, n, budget)
        assert {k: v for k, v in rules.items() if k != RULE_OF_THUMB} == CONSTANTS
        assert rules[RULE_OF_THUMB] == rule.choose({"n_params": n, "budget": budget})
    pred.meta = {**pred.meta, "rule_of_thumb": ["not", "a", "rule"]}  # a crafted file: no rule, no crash
    assert RULE_OF_THUMB not in baselines(pred, 1e4, 1)[0]


def test_the_figure_is_readable_and_every_panel_has_a_legend(synthetic_predictor):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from capacity_advisor.advisor.recommendation.result import BUDGET_GRID, Recommendation
    from capacity_advisor.advisor.recommendation.figure import DPI, build_figure
    from capacity_advisor.advisor.recommendation.schedule import Schedule
    from capacity_advisor.probes.run import ProbeReport

    pred = Predictor.load(synthetic_predictor)
    measured = {k: pred.range[k]["mean"] for k in pred.features if k in pred.range}
    feature = next(k for k in measured if k not in ("budget", "ranking_sum"))
    point = lambda step, v: {"step": step, "answer_logprob": v}  # noqa: E731
    rec = Recommendation(schedule=Schedule.parse("high"), answer="high", probabilities={"high": 0.6, "low": 0.3, "mixed": 0.1},
                         confidence="medium", confidence_reasons=[], predictor="logistic",
                         model={"spec": "lab:xs", "n_params": 4000}, budget=2.0, score="sum", settings={},
                         curve={s: [p] * len(BUDGET_GRID) for s, p in (("high", 0.6), ("low", 0.3), ("mixed", 0.1))},
                         measurements=measured, reasons=[f"{feature} = 0.1 (moves P(D_high) by +0.10)"],
                         probe=ProbeReport(version=2, model={}, teacher=None, settings={}, checker="none", context={},
                                           curves={"high": [point(0, -2.0), point(4, -1.5)],
                                                   "low": [point(0, -2.0), point(4, -1.8)]},
                                           features={}, cost={}, seconds=0.0, versions={}))
    fig = build_figure(rec, pred)
    try:
        assert DPI >= 100 and len(fig.axes) == 3
        sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]
        assert sizes and min(sizes) >= 10
        assert all(ax.get_legend() is not None for ax in fig.axes)
    finally:
        plt.close(fig)


def test_recommend_reports_the_fallback_off_the_data_and_the_predictor_on_it(lab_pool_file, synthetic_predictor, tmp_path):
    """The same student and pool, two policies: one that trusts the predictor nowhere (a distance
    limit of zero), one that trusts it everywhere. The report says which of the two answered."""
    pred = Predictor.load(synthetic_predictor)
    answers = {}
    for name, policy in (("off", {"max_distance": 0.0, "margin": 0.0, "use_range": False}),
                         ("on", {"max_distance": None, "margin": 0.0, "use_range": False})):
        pred.meta = {**pred.meta, "policy": policy}
        pred.save(tmp_path / f"pred-{name}")
        r = run("recommend", "--model", "lab:xs", "--budget", 3, "--pool", lab_pool_file, "--predictor",
                tmp_path / f"pred-{name}", "--probe-steps", 4, "--probe-eval-problems", 16, "--out", tmp_path / name,
                "--device", "cpu", "--json")
        assert r.exit_code == 0, r.stderr
        answers[name] = json.loads(r.stdout)
    off, on = answers["off"], answers["on"]
    assert off["answered_by"] == "fallback: always D_high" and off["strategy"] == "high" and off["confidence"] == "low"
    assert any(line.startswith("fallback: always D_high") for line in off["confidence_reasons"])
    assert on["answered_by"] == "predictor" and on["strategy"] == max(on["probabilities"], key=on["probabilities"].get)
    assert "otherwise the fallback" in off["policy"]
    text = run("recommend", "--model", "lab:xs", "--budget", 3, "--pool", lab_pool_file, "--predictor",
               tmp_path / "pred-off", "--probe-steps", 4, "--probe-eval-problems", 16, "--out", tmp_path / "off",
               "--device", "cpu")
    assert text.exit_code == 0 and "answered by: fallback: always D_high" in text.stderr  # the report goes to stderr
    assert sorted(off["options"]) == ["high", "low", "mixed"]  # no schedules calibrated: the report says so plainly
    assert "chooses among: D_high, D_mixed, D_low only" in text.stderr


def test_recommend_refuses_an_out_folder_that_is_its_pool(lab_home, tmp_path):
    """`recommend -p DIR -o DIR` would write over (or into) the pool it reads: one error line, nothing written."""
    folder = tmp_path / "pooldir"
    lab_pool(folder / "pool.jsonl", 20)
    before = sorted(p.name for p in folder.iterdir())
    r = run("recommend", "--model", "lab:xs", "--budget", 3, "--pool", folder / "pool.jsonl", "--out",
            folder / "pool.jsonl", "--device", "cpu")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), r.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


def test_fit_on_one_student_is_one_error_line(tmp_path):
    path = tmp_path / "records.jsonl"
    write_jsonl(path, [r for r in make_records() if r["model"]["spec"] == "lab:s0"])
    r = run("fit", "--records", path, "--out", tmp_path / "pred")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "one student" in r.stderr, r.stderr
    assert not (tmp_path / "pred").exists()


def test_fit_on_records_that_measure_none_of_the_inputs_is_one_error_line(tmp_path):
    path = tmp_path / "records.jsonl"  # make_records measures probe-level inputs only, no contrast
    write_jsonl(path, make_records())
    r = run("fit", "--records", path, "--out", tmp_path / "pred", "--features", "contrast")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--features contrast" in r.stderr, r.stderr
    assert not (tmp_path / "pred").exists()
    assert run("fit", "--records", path, "--out", tmp_path / "pred", "--features", "probe", "--kinds", "logistic",
               "--members", 2, "--cv-members", 2, "--cv", "student").exit_code == 0


def test_fit_settings_that_do_not_fit_together_are_one_error_line(tmp_path):
    """`--open-cap` is a share of one run, at most 1; counted in tokens (`--cost tokens`) a race may cost
    more than a run's tokens, so up to 10 is taken there; past either, one error line before any record
    is read, and no folder."""
    path = tmp_path / "records.jsonl"
    write_jsonl(path, make_records())
    for extra, words in ((("--open-cap", 1.5), "at most 1"), (("--open-cap", 12, "--cost", "tokens"), "at most 10"),
                         (("--gap-scout-at", 0.5), "from -10 to 0"),
                         (("--gap-scout", "--gap-scout-at", -0.25), "give one of them"),
                         (("--gap-scout-added",), "give --gap-scout-at G too"),
                         (("--race-hold", "0,1", "--race-hold-added", 1), "give one of them"),
                         (("--race-hold-added", 11), "--race-hold-added"),
                         (("--race-tie-added", 1.5), "--race-tie-added"), (("--race-tie-added", "nan"), "--race-tie-added")):
        r = run("fit", "--records", path, "--out", tmp_path / "pred", *extra)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
        assert not (tmp_path / "pred").exists()
    from capacity_advisor.advisor.fit import FitSettings

    FitSettings(open_cap=1.5, cost="tokens").check()  # taken in tokens
    for bad in (math.nan, math.inf, -1.0, 11.0, True, "1"):  # what the flag's own type lets no value through to
        with pytest.raises(InputError, match="--race-hold-added"):
            FitSettings(race_hold_added=bad).check()
    FitSettings(race_hold_added=0.0).check()
    FitSettings(race_hold_added=10).check()
    for bad in (math.nan, 0.0, 1.0, -0.5, True, "0.5"):
        with pytest.raises(InputError, match="--race-tie-added"):
            FitSettings(race_tie_added=bad).check()
    FitSettings(race_tie_added=0.5).check()


def test_fit_with_the_gap_scout_fixed_keeps_it_in_every_gate(tmp_path):
    """`--gap-scout-at G` is not chosen: the saved gate takes D_low from the pool at G. With
    `--gap-scout-added` the gate is the one a fit without the scout chooses, the scout set on it, in
    the fit and in every held-out fold; `--race-hold-added Z` sets a hold on those gates the same way."""
    path = tmp_path / "records.jsonl"
    write_jsonl(path, make_records())
    saved = {}
    for name, extra in (("plain", ()), ("at", ("--gap-scout-at", -0.25)),
                        ("added", ("--gap-scout-at", -0.25, "--gap-scout-added")),
                        ("held", ("--gap-scout-at", -0.25, "--gap-scout-added", "--race-hold-added", 1)),
                        ("hold only", ("--race-hold-added", 1)),
                        ("tie", ("--race-hold-added", 1, "--race-tie-added", 0.2)),
                        ("tie late", ("--race-hold-added", 1, "--race-tie-added", 0.5))):
        r = run("fit", "--records", path, "--out", tmp_path / name, "--features", "probe", "--kinds", "logistic",
                "--members", 2, "--cv-members", 2, "--cv", "student", *extra)
        assert r.exit_code == 0, r.stderr
        saved[name] = json.loads((tmp_path / name / "predictor.json").read_text())["meta"]
    assert "gap_scout" not in saved["plain"]["policy"]["race"]
    assert saved["at"]["policy"]["race"]["gap_scout"] == -0.25
    assert saved["added"]["policy"]["race"] == {**saved["plain"]["policy"]["race"], "gap_scout": -0.25}
    folds = saved["added"]["cv"]["student"]["policies"]
    assert folds and all(f["race"] == {**saved["plain"]["cv"]["student"]["policies"][k]["race"], "gap_scout": -0.25}
                         for k, f in folds.items())
    # `--race-hold-added Z`: the same gates again, each race holding D_low to a lead beyond Z standard errors
    # (beside the gap scout, or alone on the gates a plain fit chooses)
    for name, base in (("held", saved["added"]), ("hold only", saved["plain"])):
        assert saved[name]["policy"]["race"] == {**base["policy"]["race"], "hold": 1.0}
        held = saved[name]["cv"]["student"]["policies"]
        assert held.keys() == base["cv"]["student"]["policies"].keys() and held
        assert all(f["race"] == {**base["cv"]["student"]["policies"][k]["race"], "hold": 1.0} for k, f in held.items())
    # `--race-tie-added T`: a tie check at T on those gates, where their race stops after T and has none of its
    # own; a gate whose race stops by T keeps none (these gates race to 30 %: a check at 20 %, none at 50 %)
    def tied(race: dict, t: float) -> dict:
        return {**race, "tie": t} if race.get("tie") is None and race["fraction"] > t else race

    base = {k: f["race"] for k, f in saved["hold only"]["cv"]["student"]["policies"].items()}
    seen = set()
    for name, t in (("tie", 0.2), ("tie late", 0.5)):
        assert saved[name]["policy"]["race"] == tied(saved["hold only"]["policy"]["race"], t)
        gates = {k: f["race"] for k, f in saved[name]["cv"]["student"]["policies"].items()}
        assert gates.keys() == base.keys() and all(gates[k] == tied(base[k], t) for k in gates)
        seen |= {(name, "tie" in g) for g in [*gates.values(), saved[name]["policy"]["race"]]}
    assert ("tie", True) in seen and ("tie late", False) in seen  # both branches met
