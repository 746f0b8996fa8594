"""Probe metrics on handmade strings, and real few-step probes on a tiny model."""

import json
import math

import pytest
import torch

from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.probe.stage import build_probe_data, progress_unit
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool
from capacity_advisor.advisor.scoring.select import load_scores
from capacity_advisor.training import text_metrics as metrics
from capacity_advisor.models.loading import load_model
from capacity_advisor.models.template import encode_pair
from capacity_advisor.probes.recipe import REAL
from capacity_advisor.probes.run import EVALUATION, ProbeConfig, evaluation_name, features, run_probe, truncate
from capacity_advisor.probes.student import student_of

LOOP = "First 3+4=7. Then 7*2=14. Then 14-1=13. Then 13-1=12. Then 12-1=11. " + "Then 11-1=10. " * 8
CLEAN = "First 3+4=7. Then 7*2=14. Then 14-1=13. So the answer is \\boxed{13}."
QUESTION = "Compute (3+4)*2-1 and give the final answer."


def test_repetition_on_handmade_strings():
    assert metrics.is_repetitive(LOOP)
    assert not metrics.is_repetitive(CLEAN)
    assert not metrics.is_repetitive("1111 and +3+3+3")  # short legitimate repeats
    assert metrics.is_repetitive("A" * 40)
    assert metrics.repetition_rate([LOOP, CLEAN, CLEAN, LOOP]) == 0.5
    period, span = metrics.longest_loop("xyz" + "abcd" * 5)
    assert (period, span) == (4, 20)


def test_copy_on_handmade_strings():
    assert metrics.is_copy(QUESTION, QUESTION)
    assert metrics.is_copy(QUESTION, "Compute (3+4)*2-1 and give the final answer. Compute (3+4)*2-1")
    assert not metrics.is_copy(QUESTION, CLEAN)
    assert metrics.copy_rate([QUESTION, QUESTION], [QUESTION, CLEAN]) == 0.5


def test_answers_on_handmade_strings():
    assert metrics.extract_answer(CLEAN) == "13"
    assert metrics.extract_answer("so the final answer is 42.") == "42"
    assert metrics.extract_answer("First 3+4=7. Then 7*2=14.") is None  # missing final answer
    assert metrics.extract_answer("\\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert metrics.check_answer(CLEAN, "13") and not metrics.check_answer(CLEAN, "14")
    assert metrics.answer_rate([CLEAN, LOOP], "math") == 0.5
    assert metrics.accuracy([CLEAN, LOOP], ["13", "13"], "math") == 0.5
    assert metrics.check_answer("|3,7,4;A4", "4", "lab") and not metrics.check_answer("|3,7,4", "4", "lab")


def _pool(tmp_path, n=24):
    from helpers import addition_pool

    path = addition_pool(tmp_path / "pool.jsonl", n, lambda a, b, i: [
        f"The answer is {a + b}.", f"Let us think step by step. {a} + {b} = {a + b}. The answer is {a + b}.",
        f"{a} plus {b} makes {a + b}, so the answer is {a + b}."])
    return read_pool(path)


RECIPE = dict(steps=8, batch_size=4, eval_every=4, eval_problems=6, max_new_tokens=12, warmup_steps=2)


def probe_config(**recipe) -> ProbeConfig:
    """A probe of the real students' recipe changed by RECIPE and then by `recipe`."""
    return ProbeConfig(REAL.with_(**{**RECIPE, **recipe}), learning_rate=3e-3, device="cpu")


def _data(tiny_llama, tmp_path, cfg):
    pool = _pool(tmp_path)
    lm = load_model(tiny_llama, device="cpu")
    score_pool(pool, ScoreConfig(tiny_llama, device="cpu"), tmp_path / "s", lm=lm)
    return lm, build_probe_data(pool, load_scores(tmp_path / "s" / "scores.jsonl"), cfg, tokenizer=lm.tokenizer).data


def test_probe_report_numbers(tiny_llama, tmp_path):
    cfg = probe_config(steps=16)
    lm, data = _data(tiny_llama, tmp_path, cfg)
    assert data.checker == "math" and len(data.train["high"]) == 18 and len(data.eval_prompts) == 6
    heard = []
    report = run_probe(student_of(tiny_llama), data, cfg, tmp_path / "probe", lm=lm,
                       progress=lambda name, done, total: heard.append((name, done, total)))
    # progress tells each held-out evaluation's generation as it goes (a real model's takes minutes),
    # from 0 to all 6 problems, besides the training steps; the base is evaluated once, for both sets
    ends = [n for n, done, total in heard if done == total == 6 and EVALUATION in n]
    assert ends == [evaluation_name("high", st) for st in (0, 4, 8, 12, 16)] + [
        evaluation_name("low", st) for st in (4, 8, 12, 16)]
    assert all((n, 0, 6) in heard for n in ends)
    assert ("high", 16, 16) in heard and ("low", 16, 16) in heard
    assert [progress_unit(n) for n in ("high", ends[0], "scoring")] == ["steps", "problems", "candidates"]
    saved = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert saved["curves"].keys() == {"high", "low"} and (tmp_path / "probe" / "probe.png").stat().st_size > 1000
    for curve in report.curves.values():
        assert [p["step"] for p in curve] == [0, 4, 8, 12, 16]
        losses = [p["train_loss"] for p in curve[1:]]
        assert losses[-1] < losses[0]  # the pool's responses are learnable: the loss falls
    # teacher_nll at step 0 is the base model's mean per-token NLL of the held-out teacher responses
    refs = data.teacher_high + data.teacher_low
    direct = []
    for p, r in refs:
        e = encode_pair(lm.tokenizer, p, r, 2048)
        ids = torch.tensor([e.input_ids])
        with torch.no_grad():
            logp = lm.model(ids).logits.float().log_softmax(-1)[0]
        direct.append(-logp[e.n_prompt - 1:-1].gather(1, ids[0, e.n_prompt:, None]).mean().item())
    start = report.curves["high"][0]
    assert start["teacher_nll"] == pytest.approx(sum(direct) / len(direct), abs=1e-4)
    assert start == report.curves["low"][0]  # same base, same point
    f = report.features
    end = report.curves["high"][-1]["teacher_nll"]
    assert f["high_teacher_nll_drop_rel"] == pytest.approx((start["teacher_nll"] - end) / start["teacher_nll"])
    assert f["high_teacher_nll_drop_rel"] > 0  # training on teacher responses moves the student toward them
    assert math.isfinite(f["gap_teacher_nll_drop_rel"]) and "log10_params" not in f and "n_params" not in f
    assert f["high_train_loss_drop_rel"] > 0 and math.isfinite(f["likelihood_gap_per_token"])
    # the candidates' own repetition, read at selection without training, is kept among the features
    assert all(f[k] == data.context[k] and math.isfinite(f[k]) for k in metrics.REPETITION_KEYS)
    assert f["gap_trigram_repetition"] == pytest.approx(f["trigram_repetition_low"] - f["trigram_repetition_high"])
    # base drift at step 0 is the base model's own NLL of its generations; it rises as training moves away
    assert start["base_drift"] > 0 and math.isfinite(f["high_drift_rel"])
    assert start["answer_logprob"] < 0 and math.isfinite(f["high_answer_logprob_gain"])
    assert report.cost["probe_train_tokens"] > 0 and report.cost["share_of_full_run"]["5"] > 0
    # a shorter probe is the prefix of a longer one: its features come from the truncated curves
    short = truncate(report.curves, 8)
    assert [p["step"] for p in short["low"]] == [0, 4, 8]
    # a set with nothing to read (bare answers have no word trigrams) is stored as null and replays as NaN
    bare = {**data.context, "trigram_repetition_high": None, "gap_trigram_repetition": None}
    again = features(report.curves, json.loads(json.dumps(bare)))
    assert math.isnan(again["trigram_repetition_high"]) and math.isnan(again["gap_trigram_repetition"])
    assert again["trigram_repetition_low"] == f["trigram_repetition_low"]


class _Killed(Exception):
    pass


@pytest.mark.slow
def test_killed_probe_resumes_to_the_same_report(tiny_llama, tmp_path):
    cfg = probe_config()
    lm, data = _data(tiny_llama, tmp_path, cfg)
    whole = run_probe(student_of(tiny_llama), data, cfg, tmp_path / "whole", lm=lm)

    def kill(strategy, step, total):
        if strategy == "low" and step == 6:  # after the checkpoint at step 4
            raise _Killed

    with pytest.raises(_Killed):
        run_probe(student_of(tiny_llama), data, cfg, tmp_path / "resumed", lm=lm, progress=kill)
    assert (tmp_path / "resumed" / "high" / "record.json").exists()
    assert (tmp_path / "resumed" / "low" / "checkpoint-4").is_dir()
    assert not (tmp_path / "resumed" / "probe.json").exists()
    resumed = run_probe(student_of(tiny_llama), data, cfg, tmp_path / "resumed", lm=lm)
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN-safe equality
    assert same(resumed.curves, whole.curves)
    assert same(resumed.features, whole.features)


def test_probe_folder_of_another_model_is_refused(tiny_llama, tiny_qwen, tmp_path):
    from capacity_advisor.core.errors import InputError

    cfg = probe_config(steps=4)
    lm, data = _data(tiny_llama, tmp_path, cfg)
    run_probe(student_of(tiny_llama), data, cfg, tmp_path / "p", lm=lm)
    other = load_model(tiny_qwen, device="cpu")
    with pytest.raises(InputError, match="another manifest"):
        run_probe(student_of(tiny_qwen), data, cfg, tmp_path / "p", lm=other)


def test_probe_cli_bad_settings(tiny_llama, tmp_path):
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    _pool(tmp_path)
    pool = tmp_path / "pool.jsonl"
    r = CliRunner().invoke(cli, ["probe", "--model", tiny_llama, "--pool", str(pool), "--out", str(tmp_path / "o"),
                                 "--probe-steps", "0"])
    assert r.exit_code == 2 and "--probe-steps 0 must be at least 1" in r.stderr and not (tmp_path / "o").exists()
    # messages name the flag every verb shares; the name `advisor probe` took before is refused with it
    r = CliRunner().invoke(cli, ["probe", "--model", tiny_llama, "--pool", str(pool), "--out", str(tmp_path / "o"),
                                 "--probe-eval-problems", "30", "--device", "cpu"])
    assert r.exit_code == 2 and "a probe needs --probe-eval-problems (30) held out" in r.stderr
    r = CliRunner().invoke(cli, ["probe", "--model", tiny_llama, "--pool", str(pool), "--out", str(tmp_path / "o"),
                                 "--eval-problems", "30", "--device", "cpu"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "use --probe-eval-problems" in r.stderr


def test_probe_with_scores_of_another_pool_says_what_to_do(tiny_llama, tmp_path):
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    _pool(tmp_path)
    scored = tmp_path / "pool.jsonl"
    other = tmp_path / "other.jsonl"
    other.write_text(scored.read_text().replace('"id": "q', '"id": "r'))
    r = CliRunner().invoke(cli, ["score", "--model", tiny_llama, "--pool", str(scored), "--out", str(tmp_path / "s"),
                                 "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    r = CliRunner().invoke(cli, ["probe", "--model", tiny_llama, "--pool", str(other), "--scores",
                                 str(tmp_path / "s" / "scores.jsonl"), "--probe-eval-problems", "4", "--out", str(tmp_path / "o"),
                                 "--device", "cpu"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: --scores "), r.stderr
    assert "does not cover 24 of the pool's 24 problems" in r.stderr and "then select" not in r.stderr
    assert "`advisor score`" in r.stderr and "drop --scores" in r.stderr and not (tmp_path / "o").exists()


def test_probe_caps_new_tokens_and_length_at_the_models_context(tmp_path):
    from capacity_advisor.advisor.probe.plan import plan_probe
    from capacity_advisor.probes.recipe import LAB, Fitted

    plan = plan_probe(student_of(str(tmp_path))).within(512)
    assert plan.recipe.max_new_tokens == 384 and plan.recipe.train_length == 512 and plan.recipe.score_length == 512
    assert plan.settings()["max_new_tokens"]["source"] == "default for real students, capped at the model's context (512 positions)"
    assert plan.within(None).recipe == plan.recipe and plan_probe(student_of(str(tmp_path))).recipe == REAL
    # a lab-fitted predictor: a real student takes its steps and held-out problems, and its own kind's lengths
    fitted = plan_probe(student_of("x/y"), Fitted(LAB.with_(steps=6), ("steps", "max_new_tokens")))
    assert fitted.recipe.steps == 6 and fitted.recipe.max_new_tokens == REAL.max_new_tokens
    notes, departs = fitted.notes()
    assert not departs and "measured on lab students" in notes[0] and "max_new_tokens 2,048" in notes[0]
    assert plan_probe(student_of("x/y"), given={"max_new_tokens": 100}).within(64).settings()["max_new_tokens"] == {
        "value": 48, "source": "--max-new-tokens, capped at the model's context (64 positions)"}


def test_a_real_students_new_tokens_are_bounded_by_the_pools_responses(tiny_llama, tmp_path):
    """1.5 x the 99th-percentile response (with its EOS), rounded up to 16, at least 64; the source
    says so; a flag, a lab student and a bound above the recipe's leave the plan as it was."""
    from capacity_advisor.advisor.probe.plan import bound_by_responses, plan_probe, response_lengths
    from capacity_advisor.models.loading import load_tokenizer
    from capacity_advisor.probes.recipe import LAB
    from helpers import doubling_pool

    plan = plan_probe(student_of(tiny_llama))
    assert plan.for_responses([10] * 99 + [200]).recipe.max_new_tokens == 304  # p99 = 200: 1.5 x 201 = 301.5 -> 304
    bounded = plan.for_responses([10] * 200)
    assert bounded.recipe.max_new_tokens == 64  # 1.5 x 11 = 16.5, below the floor
    assert bounded.settings()["max_new_tokens"]["source"].startswith("bounded by the pool's responses: 1.5 x their "
                                                                      "99th percentile (10 tokens), from 2,048")
    assert plan.for_responses([5000]).recipe == plan.recipe  # above the recipe's own bound
    assert plan_probe(student_of(tiny_llama), given={"max_new_tokens": 900}).for_responses([10]).recipe.max_new_tokens == 900
    assert plan_probe(student_of("lab:s")).for_responses([10]).recipe == LAB
    pool = read_pool(doubling_pool(tmp_path / "pool.jsonl", 12))
    tok = load_tokenizer(tiny_llama)
    lengths = response_lengths(pool, tok)
    assert len(lengths) == 36 and min(lengths) >= 2  # the three right candidates of 12 problems, each with its EOS
    assert bound_by_responses(plan, pool, tiny_llama).recipe.max_new_tokens == 64
