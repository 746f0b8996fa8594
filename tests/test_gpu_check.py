"""benchmarks/gpu_check.py's student part and projection, run end to end with --quick on a CPU."""

import importlib.util
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--quick --hf-only` run shared by the checks. The LoRA student's first probe attempt is
    made to run out of memory, so the gradient-checkpointing retry runs as well."""
    import torch

    gpu_check = load_script()
    real = gpu_check._probe_trainer

    def first_lora_attempt_fails(lm, student, recipe, device, steps, checkpointing, *rest):
        if student.lora_r and not checkpointing:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")
        return real(lm, student, recipe, device, steps, checkpointing, *rest)

    gpu_check._probe_trainer = first_lora_attempt_fails
    out = tmp_path_factory.mktemp("gpu-check") / "r.json"
    res = gpu_check.main(["--quick", "--hf-only", "--out", str(out)])
    return gpu_check, res, out


def test_quick_measures_every_field(quick):
    gpu_check, res, out = quick
    assert res["quick"] is True and set(res["students"]) == set(gpu_check.STUDENTS)
    for name, m in res["students"].items():
        for section, fields in gpu_check.MEASURED.items():
            for field in fields:
                v = m[section][field]
                assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (name, section, field, v)
        for v in (*m["projection"]["seconds"].values(), m["projection"]["total_seconds"], m["projection"]["peak_memory_mb"]):
            assert math.isfinite(v) and v > 0
        # the probe's real batch at the (shrunk) recipe length: every sequence fills max_length
        step = m["probe_step"]
        assert step["tokens_per_step"] == step["batch_size"] * step["max_length"]
    written = json.loads(out.read_text())
    assert written["students"] == res["students"] and written["projection_inputs"] == res["projection_inputs"]
    md = out.with_suffix(".md").read_text()
    assert md == gpu_check.table(res)
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
    recipe = res["projection_inputs"]["recipe"]
    for k in ("steps", "batch_size", "eval_every", "eval_problems", "warmup_steps"):
        assert recipe[k] == getattr(REAL, k)
    assert (recipe["max_length"], recipe["max_new_tokens"]) == (gpu_check.QUICK_LENGTHS["max_length"],
                                                                 gpu_check.QUICK_LENGTHS["max_new_tokens"])
    assert small["projection"]["evaluations"] == 3 and small["projection"]["sets"] == 2


def test_projection_is_computed_from_the_measurements(quick):
    from capacity_advisor.probes.recipe import REAL

    gpu_check, res, _ = quick
    inputs = res["projection_inputs"]
    recipe, pool = gpu_check.recipe_of(inputs), gpu_check.PoolAssumption(**inputs["pool_assumed"])
    for m in res["students"].values():
        again = gpu_check.project(m, recipe, pool, inputs["score_max_length"], inputs["sets"])
        assert again == m["projection"]
        assert again["total_seconds"] == pytest.approx(sum(again["seconds"].values()))
        assert again["peak_memory_mb"] == max(m[s]["peak_memory_mb"] for s in ("scoring", "probe_step", "generation"))
        bigger = gpu_check.project(m, recipe, replace(pool, problems=pool.problems * 3), inputs["score_max_length"],
                                   inputs["sets"])
        assert bigger["seconds"]["scoring"] == pytest.approx(3 * again["seconds"]["scoring"])
        assert {k: v for k, v in bigger["seconds"].items() if k != "scoring"} == \
            {k: v for k, v in again["seconds"].items() if k != "scoring"}
        faster = {**m, "probe_step": {**m["probe_step"], "seconds_per_step": m["probe_step"]["seconds_per_step"] / 2}}
        halved = gpu_check.project(faster, recipe, pool, inputs["score_max_length"], inputs["sets"])
        assert halved["seconds"]["probe_training"] == pytest.approx(again["seconds"]["probe_training"] / 2)
        # at the real recipe and the documented pool: every candidate scored up to recommend's max_length
        full = gpu_check.project(m, REAL, gpu_check.PoolAssumption(), REAL.score_length, 2)
        assert full["scored_tokens_per_response"] == REAL.score_length - gpu_check.PoolAssumption().prompt_tokens
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
    md = gpu_check.table(failed)
    assert "| Qwen2.5-7B (--quick shape) | — | out of memory: CUDA out of memory |" in md
    assert "| Qwen2.5-1.5B (--quick shape), " in md


def test_without_cuda_and_without_quick_one_error_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    r = subprocess.run([sys.executable, str(SCRIPT), "--hf-only"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpu_check: error: ") and r.stderr.count("\n") == 1
    assert "CUDA" in r.stderr and "--quick" in r.stderr
