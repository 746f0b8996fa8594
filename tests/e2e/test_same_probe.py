"""The probe a user gets is the probe the predictor was fitted on: `advisor recommend` on the folder
of a lab build, with a calibration pool, measures the inputs calibration's own probe measured for
that student on that pool (the same recipe, learning rate, scoring length, held-out slice and data
order), and the shipped predictor states the recipe its records share."""

import json

import pytest
from helpers import run

from capacity_advisor.probes.recipe import LAB, REAL, fitted_recipe
from capacity_advisor.probes.student import student_of


def test_a_lab_build_folder_is_probed_with_the_lab_recipe_and_its_own_rate(lab_home, tmp_path):
    from capacity_advisor.models.lab.ladder import LADDER, student_path

    folder = str(student_path("xs"))
    assert student_of(folder).build == {"name": "xs", "lr": LADDER["xs"].lr}
    assert student_of(folder).recipe is LAB and student_of("lab:xs").recipe is LAB
    rate = lambda spec, n_params: student_of(spec, {"n_params": n_params}).learning_rate()  # noqa: E731
    assert rate(folder, 3840) == (LADDER["xs"].lr * 0.5, pytest.approx(rate(folder, 1)[1]))
    assert rate(folder, 1)[0] == rate("lab:xs", 1)[0]
    # any other folder, a hub id, and folders whose build.json is damaged or not a lab build's
    assert student_of(str(tmp_path)).recipe is REAL and student_of("Qwen/Qwen2.5-0.5B").recipe is REAL
    for text in ("{", "[]", json.dumps({"recipe": {"student": {"name": "x", "lr": "1e-3"}}}),
                 json.dumps({"recipe": {"student": {"name": "x", "lr": float("inf")}}}), "x" * (2 << 20)):
        (tmp_path / "build.json").write_text(text)
        assert student_of(str(tmp_path)).build is None and student_of(str(tmp_path)).recipe is REAL


def test_the_shipped_predictor_states_the_recipe_its_records_share():
    from capacity_advisor.advisor.probe.plan import load_predictor

    fitted = fitted_recipe(load_predictor(None).meta)
    assert fitted is not None and fitted.recipe.kind == "lab"
    # the records' probes differ only in their generation length (48 tokens in recipe 1, 72 in 2)
    assert "max_new_tokens" not in fitted.stated
    for k in ("steps", "batch_size", "eval_every", "eval_problems", "train_length", "warmup_steps"):
        assert k in fitted.stated and getattr(fitted.recipe, k) == getattr(LAB, k), k


@pytest.mark.slow
def test_recommend_on_a_lab_folder_reproduces_calibrations_probe_inputs(lab_home, tmp_path):
    from capacity_advisor.advisor.calibration.sweep import run_calibration
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig
    from capacity_advisor.models.lab.ladder import student_path

    cfg = CalibrateConfig.quick_settings(str(tmp_path / "cal"))
    run_calibration(cfg, log=lambda m: None)
    unit = tmp_path / "cal" / "modchain" / "sum" / "xs-s0"
    calibrated = json.loads((unit / "probe" / "probe.json").read_text())
    pool = next((tmp_path / "cal").glob("modchain/pools/*s0.jsonl"), None) or next((tmp_path / "cal").rglob("s0.jsonl"))
    r = run("recommend", "--model", student_path("xs"), "--pool", pool, "--budget", 1, "--seed", 0,
            "--probe-steps", cfg.probe_steps, "--probe-batch", cfg.probe_batch, "--probe-eval-every", cfg.probe_eval_every,
            "--probe-eval-problems", cfg.probe_eval_problems, "--max-new-tokens", cfg.max_new_tokens,
            "--out", tmp_path / "rec", "--device", "cpu", "--dtype", "float32", "--json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["settings"]["learning_rate"]["value"] == calibrated["settings"]["learning_rate"]
    assert rep["settings"]["score_length"]["value"] == LAB.score_length
    probed = json.loads((tmp_path / "rec" / "probe" / "probe.json").read_text())
    assert probed["context"]["eval_problems"] == calibrated["context"]["eval_problems"]
    mine, theirs = probed["features"], calibrated["features"]
    assert set(mine) == set(theirs)
    for k, v in theirs.items():
        if v is None:
            assert mine[k] is None, k
        else:
            assert mine[k] == pytest.approx(v, abs=1e-6), k
