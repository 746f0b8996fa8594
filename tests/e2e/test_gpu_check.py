"""benchmarks.gpu_check's student part, projection, roofline and GPU-hours, run with --quick on a CPU
(the end-to-end `advisor recommend` part runs in tests/e2e/test_gpu_check_bare.py, from a bare checkout)."""

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import ROOT

import benchmarks.gpu_check.run as gpu_check
from benchmarks.gpu_check import args as gpu_args
from benchmarks.gpu_check import projection, report, shapes
from benchmarks.gpu_check import roofline as gpu_roofline
from benchmarks.gpu_check.hours import hours

COMMAND = [sys.executable, "-m", "benchmarks.gpu_check"]  # run from ROOT


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--quick --hf-only --e2e none` run shared by the checks. The LoRA student's first attempt
    at each training step (probe and full run) is made to run out of memory, so the
    gradient-checkpointing retry runs as well."""
    import torch

    real = gpu_check.train_steps

    def first_lora_attempt_fails(model, tokenizer, t, *rest):
        if t.lora and not t.gradient_checkpointing:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")
        return real(model, tokenizer, t, *rest)

    out = tmp_path_factory.mktemp("gpu-check") / "r.json"
    with pytest.MonkeyPatch.context() as mp:  # the module is shared with the other tests: patched for this run only
        mp.setattr(gpu_check, "train_steps", first_lora_attempt_fails)
        res = gpu_check.main(["--quick", "--hf-only", "--e2e", "none", "--out", str(out)])
    return gpu_check, res, out


def test_quick_measures_every_field(quick):
    gpu_check, res, out = quick
    assert res["quick"] is True and set(res["students"]) == set(shapes.STUDENTS)
    for name, m in res["students"].items():
        for section, fields in shapes.MEASURED.items():
            for field in fields:
                v = m[section][field]
                assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (name, section, field, v)
        for v in (*m["projection"]["seconds"].values(), m["projection"]["total_seconds"], m["projection"]["peak_memory_mb"]):
            assert math.isfinite(v) and v > 0
        # the real batches at the (shrunk) recipe length: every sequence fills max_length
        for key in ("probe_step", "full_run_step"):
            step = m[key]
            assert step["tokens_per_step"] == step["batch_size"] * step["max_length"]
        for key in ("scoring", "probe_step", "full_run_step", "generation"):
            roof = m[key]["roofline"]
            assert roof["tflops"] > 0 and roof["share_of_matmul_ceiling"] > 0 and roof["share_of_assumed_peak"] > 0
        assert m["scoring"]["naive"]["response_tokens_per_s"] > 0 and m["scoring"]["hf_over_naive"] > 0
    assert res["matmul_ceiling"]["tflops"] > 0 and not res.get("errors") and not res.get("skipped")
    assert set(res["parts"]) == {*shapes.STUDENTS, "agreement"} and "recommend" not in res
    assert res["optional_packages"].keys() == {"lightgbm", "datasets", "math_verify", "trl", "vllm", "matplotlib", "pyarrow"}
    written = json.loads(out.read_text())
    assert written["students"] == res["students"] and written["projection_inputs"] == res["projection_inputs"]
    md = out.with_suffix(".md").read_text()
    assert md == report.table(res)
    assert all(f"| {m['label']} (--quick shape), " in md for m in res["students"].values())


def test_probe_modes_and_settings_follow_the_project(quick):
    from capacity_advisor.probes.recipe import REAL

    gpu_check, res, _ = quick
    small, large = res["students"]["qwen2.5-1.5b"], res["students"]["qwen2.5-7b"]
    assert small["probe_step"]["mode"] == "full fine-tuning"
    assert small["probe_step"]["trainable_params"] == small["params"]
    assert large["probe_step"]["mode"] == "LoRA r=16" and 0 < large["probe_step"]["trainable_params"] < large["params"]
    assert small["shape"]["tie_word_embeddings"] is True and large["shape"]["tie_word_embeddings"] is False
    # the LoRA student "ran out of memory" as configured and was measured with gradient checkpointing
    assert large["probe_step"]["out_of_memory_as_configured"] is True and large["probe_step"]["gradient_checkpointing"] is True
    assert small["probe_step"]["out_of_memory_as_configured"] is False and small["probe_step"]["gradient_checkpointing"] is False
    # the full run recommend's manifest describes: its batch, a cosine schedule, full fine-tuning / LoRA as probed
    for m in (small, large):
        full, probe = m["full_run_step"], m["probe_step"]
        assert full["batch_size"] == REAL.train_batch and full["max_length"] == probe["max_length"]
        assert full["lr_scheduler"] == "cosine" and probe["lr_scheduler"] == "constant_with_warmup"
        assert full["mode"] == probe["mode"] and full["learning_rate"] == probe["learning_rate"]
    assert small["full_run_step"]["trainable_params"] == small["params"]
    assert large["full_run_step"]["out_of_memory_as_configured"] is True and large["full_run_step"]["gradient_checkpointing"] is True
    recipe = res["projection_inputs"]["recipe"]
    for k in ("steps", "batch_size", "eval_every", "eval_problems", "warmup_steps"):
        assert recipe[k] == getattr(REAL, k)
    assert (recipe["max_length"], recipe["max_new_tokens"]) == (shapes.QUICK_LENGTHS["max_length"],
                                                                 shapes.QUICK_LENGTHS["max_new_tokens"])
    assert small["projection"]["evaluations"] == 3 and small["projection"]["sets"] == 2


def test_projection_is_computed_from_the_measurements(quick):
    from capacity_advisor.probes.recipe import REAL

    gpu_check, res, _ = quick
    inputs = res["projection_inputs"]
    recipe, pool = projection.recipe_of(inputs), shapes.PoolAssumption(**inputs["pool_assumed"])
    for m in res["students"].values():
        again = projection.project(m, recipe, pool, inputs["score_max_length"], inputs["sets"])
        assert again == m["projection"]
        assert again["total_seconds"] == pytest.approx(sum(again["seconds"].values()))
        assert again["peak_memory_mb"] == max(m[s]["peak_memory_mb"] for s in ("scoring", "probe_step", "generation"))
        bigger = projection.project(m, recipe, replace(pool, problems=pool.problems * 3), inputs["score_max_length"],
                                   inputs["sets"])
        assert bigger["seconds"]["scoring"] == pytest.approx(3 * again["seconds"]["scoring"])
        assert {k: v for k, v in bigger["seconds"].items() if k != "scoring"} == \
            {k: v for k, v in again["seconds"].items() if k != "scoring"}
        faster = {**m, "probe_step": {**m["probe_step"], "seconds_per_step": m["probe_step"]["seconds_per_step"] / 2}}
        halved = projection.project(faster, recipe, pool, inputs["score_max_length"], inputs["sets"])
        assert halved["seconds"]["probe_training"] == pytest.approx(again["seconds"]["probe_training"] / 2)
        # at the real recipe and the documented pool: every candidate scored up to recommend's max_length
        full = projection.project(m, REAL, shapes.PoolAssumption(), REAL.score_length, 2)
        assert full["scored_tokens_per_response"] == REAL.score_length - shapes.PoolAssumption().prompt_tokens
        assert full["seconds"]["scoring"] == pytest.approx(
            12_000 * 4 * full["scored_tokens_per_response"] / m["scoring"]["response_tokens_per_s"])
        assert full["seconds"]["probe_training"] == pytest.approx(2 * REAL.steps * m["probe_step"]["seconds_per_step"])
        assert full["seconds"]["evaluation_generation"] == pytest.approx(
            3 * REAL.eval_problems * REAL.max_new_tokens / m["generation"]["new_tokens_per_s"])


def test_a_student_that_does_not_fit_is_a_row_of_the_table(quick):
    gpu_check, res, _ = quick
    m = res["students"]["qwen2.5-7b"]
    failed = {**res, "students": {**res["students"], "qwen2.5-7b": {"label": m["label"], "shape": m["shape"],
                                                                     "error": "out of memory: CUDA out of memory"}}}
    md = report.table(failed)
    assert "| Qwen2.5-7B (--quick shape) | — | out of memory: CUDA out of memory |" in md
    assert "| Qwen2.5-1.5B (--quick shape), " in md


def test_without_cuda_and_without_quick_one_error_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    r = subprocess.run([*COMMAND, "--hf-only"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpu_check: error: ") and r.stderr.count("\n") == 1
    assert "CUDA" in r.stderr and "--quick" in r.stderr


def test_gpu_hours_follow_from_the_measurements(quick):
    from capacity_advisor.advisor.calibration.cost import PEAK_TFLOPS
    from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS

    gpu_check, res, _ = quick
    inputs = res["projection_inputs"]
    recipe, pool = projection.recipe_of(inputs), shapes.PoolAssumption(**inputs["pool_assumed"])
    assert recipe.train_batch == inputs["recipe"]["train_batch"]
    for m in res["students"].values():
        h = m["hours"]
        assert hours(m, recipe, pool, inputs["score_max_length"], inputs["sets"]) == h
        g, run, cal = h["gpu_hours"], h["full_run"], h["calibration_run"]
        assert g["probe"] == pytest.approx(m["projection"]["total_seconds"] / 3600)
        # one 3-epoch run on the pool less the probe's held-out problems, in full-run batches
        assert run["steps"] == math.ceil(math.ceil((pool.problems - recipe.eval_problems) / recipe.train_batch) * 3)
        assert run["train_seconds"] == pytest.approx(run["steps"] * m["full_run_step"]["seconds_per_step"])
        assert run["evaluations"] == 3 * 4 + 1
        assert cal["steps"] == math.ceil(math.ceil((pool.problems - FULL_RUN_EVAL_PROBLEMS) / recipe.train_batch) * 3)
        assert g["calibration_proxy"] == pytest.approx((m["projection"]["total_seconds"] + 3 * cal["seconds"]) / 3600)
        # a race at half the budget: the loser stops at the 6th of 12 evaluations
        loser = h["race_loser"]
        assert loser["evaluations"] == 7 and loser["steps"] == math.ceil(run["steps"] / 2)
        assert g["race_total"] == pytest.approx(g["full_run"] + g["race_extra"])
        mfu = h["dry_run"]["measured_mfu"]
        st = m["full_run_step"]
        assert mfu["train"] == pytest.approx(6 * m["params"] * st["tokens_per_step"] / st["seconds_per_step"] / (PEAK_TFLOPS * 1e12))
        slower = {**m, "full_run_step": {**st, "seconds_per_step": 2 * st["seconds_per_step"]}}
        again = hours(slower, recipe, pool, inputs["score_max_length"], inputs["sets"])
        assert again["full_run"]["train_seconds"] == pytest.approx(2 * run["train_seconds"])
        assert again["gpu_hours"]["probe"] == g["probe"]


def test_roofline_counts_the_shape():
    roofline = vars(gpu_roofline)
    shape = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000)
    per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 160  # q, k, v (2 KV heads of 16), o, the MLP
    f = roofline["forward_flops"](shape, 10, 4)
    assert f == 2 * 2 * per_layer * 10 + 2 * 64 * 1000 * 4 + 2 * 2 * 64 * 10 * 11
    assert roofline["train_step_flops"](shape, 3, 10, lora=False) == 3 * 3 * roofline["forward_flops"](shape, 10, 10)
    assert roofline["train_step_flops"](shape, 3, 10, lora=True) == 2 * 3 * roofline["forward_flops"](shape, 10, 10)
    assert roofline["decode_flops"](shape, 5) == 2 * 2 * per_layer + 2 * 64 * 1000 + 2 * 4 * 64 * 5
    s = roofline["share"](5e13, 100.0, 1000.0)
    assert s == {"tflops": 50.0, "share_of_matmul_ceiling": 0.5, "share_of_assumed_peak": 0.05}
    ceiling = roofline["matmul_ceiling"]("cpu", "float32", quick=True)
    assert ceiling["tflops"] > 0 and ceiling["n"] == 256


def test_a_part_that_does_not_fit_the_budget_is_skipped(tmp_path):
    out = tmp_path / "r.json"
    res = gpu_check.main(["--quick", "--hf-only", "--budget-s", "0.001", "--out", str(out)])
    assert set(res["skipped"]) == {*shapes.STUDENTS, "recommend", "agreement"}
    assert res["students"] == {} and "agreement" not in res
    assert json.loads(out.read_text())["skipped"] == res["skipped"]
    assert "Not measured: agreement: not started at" in out.with_suffix(".md").read_text()


def test_a_failed_measurement_keeps_what_finished(tmp_path, monkeypatch):
    """A part that fails is recorded and the run goes on; the files hold every measurement that ended."""

    def fails(*a, **kw):
        raise RuntimeError("generation broke (raised by the test)")

    monkeypatch.setattr(gpu_check, "measure_generation", fails)
    out = tmp_path / "r.json"
    res = gpu_check.main(["--quick", "--hf-only", "--students", "qwen2.5-1.5b", "--e2e", "none", "--out", str(out)])
    written = json.loads(out.read_text())
    m = written["students"]["qwen2.5-1.5b"]
    assert written["errors"] == {"qwen2.5-1.5b": "RuntimeError: generation broke (raised by the test)"}
    assert m["scoring"]["response_tokens_per_s"] > 0 and m["probe_step"]["seconds_per_step"] > 0
    assert "generation" not in m and "projection" not in m and "agreement" in written
    md = out.with_suffix(".md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Qwen2.5-1.5B"))
    assert row.count("| — ") == 3  # generation, full-run step, projection
    assert "Not measured: qwen2.5-1.5b: RuntimeError" in md and res["errors"] == written["errors"]


@pytest.mark.parametrize("argv, words", [
    (["--students", "qwen2.5-7b", "--e2e", "qwen2.5-1.5b"], ["--e2e qwen2.5-1.5b", "measured students"]),
    (["--budget-s", "0"], ["--budget-s 0", "positive"]),
    (["--eval-gen-tokens", "0"], ["--eval-gen-tokens 0", "at least 1"]),
])
def test_bad_flags_are_one_error_line(argv, words):
    r = subprocess.run([*COMMAND, "--quick", "--hf-only", *argv], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("gpu_check: error: ") and all(w in r.stderr for w in words)


def test_an_out_that_cannot_be_written_is_one_error_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = subprocess.run([*COMMAND, "--quick", "--hf-only", "--out", str(blocker / "r.json")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith("gpu_check: error: --out ") and r.stderr.count("\n") == 1


def test_the_end_to_end_student_follows_the_students_measured():
    for argv, e2e in (([], "qwen2.5-1.5b"), (["--students", "none"], None), (["--students", "qwen2.5-7b"], None),
                      (["--e2e", "none"], None), (["--e2e", "qwen2.5-7b"], "qwen2.5-7b")):
        args = gpu_args.parse_args(["--quick", "--hf-only", *argv], "gpu_check")
        gpu_args.check_args(args)
        assert args.e2e == e2e, argv
