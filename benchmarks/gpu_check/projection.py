"""gpu_check's projection of `advisor recommend` on the assumed pool, from one student's measurements.

`project` reads only the fields MEASURED names (gpu_check_shapes.py): every candidate scored at the
measured response tokens/s; the sets x the recipe's steps at the measured seconds per step; and
`n_evaluations` evaluations, each generating eval_problems x max_new_tokens new tokens at the
measured rate and scoring its answers, base_drift and the held-out teacher responses at the
measured forward tokens/s. Its peak is the largest of the three measured peaks. `recipe_of` gives
back the probe recipe a result's `projection_inputs` hold.
"""

from dataclasses import asdict

from benchmarks.gpu_check.shapes import PoolAssumption


def n_evaluations(recipe, strategies: int) -> int:
    """Evaluation points of a probe: the base once (shared by the sets), then each set's schedule."""
    from capacity_advisor.training.callbacks import eval_schedule

    return 1 + strategies * len(eval_schedule(1, recipe.steps, 1, recipe.eval_every))


def project(measured: dict, recipe, pool: PoolAssumption, score_max_length: int, strategies: int) -> dict:
    """Wall time and peak memory of `advisor recommend` on `pool`, from one student's measurements."""
    sc, st, ge = measured["scoring"], measured["probe_step"], measured["generation"]
    scored = min(pool.response_tokens, score_max_length - min(pool.prompt_tokens, score_max_length - 1))
    evals = n_evaluations(recipe, strategies)
    # what each evaluation point scores (training.evaluate): the answer after each generation and
    # base_drift of each generation (prompt + generation), and both held-out teacher responses
    generated = min(pool.prompt_tokens + recipe.max_new_tokens, recipe.train_length)
    reference = min(pool.prompt_tokens + pool.response_tokens, recipe.train_length)
    eval_forward = recipe.eval_problems * (2 * generated + 2 * reference)
    seconds = {
        "scoring": pool.problems * pool.candidates * scored / sc["response_tokens_per_s"],
        "probe_training": strategies * recipe.steps * st["seconds_per_step"],
        "evaluation_generation": evals * recipe.eval_problems * recipe.max_new_tokens / ge["new_tokens_per_s"],
        "evaluation_scoring": evals * eval_forward / sc["forward_tokens_per_s"],
    }
    return {"pool": asdict(pool), "scored_tokens_per_response": scored, "sets": strategies, "steps_per_set": recipe.steps,
            "evaluations": evals, "eval_problems": recipe.eval_problems, "max_new_tokens": recipe.max_new_tokens,
            "seconds": seconds, "total_seconds": sum(seconds.values()),
            "peak_memory_mb": max(sc["peak_memory_mb"], st["peak_memory_mb"], ge["peak_memory_mb"]),
            "not_included": ["loading the model", "reading and tokenizing the pool",
                             "the checkpoint written at each evaluation", "the predictor"]}


def recipe_of(inputs: dict):
    """The probe recipe a result's projection used (its `projection_inputs`)."""
    from capacity_advisor.probes.recipe import Recipe, field_of

    return Recipe(**{field_of(k): v for k, v in inputs["recipe"].items()})
