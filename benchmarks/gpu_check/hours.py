"""gpu_check's GPU-hours: what a probe, a race and a calibration cost on the assumed pool, priced at
one student's measured rates instead of an assumed MFU.

`hours` reads the fields MEASURED names (gpu_check_shapes.py) and the projection of `advisor
recommend` (gpu_check_projection.project), and prices, on one GPU:

- probe: `advisor recommend` as projected (every candidate scored, 2 sets x the recipe's steps, the
  probe's evaluations);
- full_run: one run of `epochs` epochs on one set as `advisor train` runs recommend's manifest: the
  pool less the probe's held-out problems, in steps of the full-run batch at the measured seconds
  per full-run step (every sequence at the training length, as the assumed responses are longer),
  and ceil(epochs x evals_per_epoch) + 1 evaluations of the probe's held-out problems;
- race: `advisor train --race FRACTION`: both sets trained until the first evaluation at or past
  that share of the budget, the winner on to the end; `race_extra` is the loser's part, the most a
  race adds to one run (a lead can stop it sooner);
- calibration: one proxy of this shape on the user's own pool, one seed, as `advisor calibrate`
  runs it: the pool scored, the probe, and a full run on each of the 3 sets, evaluated on
  FULL_RUN_EVAL_PROBLEMS held-out problems.

An evaluation generates max_new_tokens per problem at the measured rate (every generation taken
to the cap) and scores each generation twice (its answer, the base's drift) at the measured
forward rate. `dry_run` gives the same calibration under `advisor calibrate --dry-run`'s formulas
and assumptions (advisor/calibration/cost.py), and the MFU that would make those formulas match
the measured rates: the `--mfu` and `--decode-mfu` to pass.
"""

import math
from types import SimpleNamespace

EPOCHS = 3.0
RACE_FRACTION = 0.5


def _eval_seconds(m: dict, recipe, prompt_tokens: int, problems: int) -> float:
    """One evaluation on `problems` held-out problems: generation to the cap, two scoring passes."""
    generated = min(prompt_tokens + recipe.max_new_tokens, recipe.train_length)
    return (problems * recipe.max_new_tokens / m["generation"]["new_tokens_per_s"]
            + problems * 2 * generated / m["scoring"]["forward_tokens_per_s"])


def _run(m: dict, recipe, pool, held_out: int, eval_problems: int, evals_per_epoch: int, share: float = 1.0) -> dict:
    """Seconds of one full run (or its first `share` of the budget, to the evaluation that ends it)."""
    steps = math.ceil(math.ceil((pool.problems - held_out) / recipe.train_batch) * EPOCHS)
    points = math.ceil(EPOCHS * evals_per_epoch)
    reached = math.ceil(share * points)  # the first evaluation at or past `share`
    train = min(steps, math.ceil(steps * reached / points)) * m["full_run_step"]["seconds_per_step"]
    evaluation = (reached + 1) * _eval_seconds(m, recipe, pool.prompt_tokens, eval_problems)
    return {"steps": min(steps, math.ceil(steps * reached / points)), "evaluations": reached + 1,
            "train_seconds": train, "evaluation_seconds": evaluation, "seconds": train + evaluation}


def hours(m: dict, recipe, pool, score_max_length: int, strategies: int) -> dict:
    """GPU-hours of the probe, one full run, a race and a calibration proxy at `m`'s rates."""
    from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS
    from capacity_advisor.training.manifest import SETS, TrainingSpec

    from benchmarks.gpu_check.projection import project

    per_epoch = TrainingSpec.evals_per_epoch
    probe = project(m, recipe, pool, score_max_length, strategies)
    full = _run(m, recipe, pool, recipe.eval_problems, recipe.eval_problems, per_epoch)
    loser = _run(m, recipe, pool, recipe.eval_problems, recipe.eval_problems, per_epoch, RACE_FRACTION)
    proxy_run = _run(m, recipe, pool, FULL_RUN_EVAL_PROBLEMS, FULL_RUN_EVAL_PROBLEMS, per_epoch)
    calibration = probe["total_seconds"] + len(SETS) * proxy_run["seconds"]
    seconds = {"probe": probe["total_seconds"], "full_run": full["seconds"], "race_extra": loser["seconds"],
               "race_total": full["seconds"] + loser["seconds"], "calibration_proxy": calibration}
    return {"epochs": EPOCHS, "race_fraction": RACE_FRACTION, "evals_per_epoch": per_epoch, "seeds": 1,
            "calibration_sets": len(SETS), "calibration_eval_problems": FULL_RUN_EVAL_PROBLEMS,
            "full_run": full, "race_loser": loser, "calibration_run": proxy_run,
            "gpu_hours": {k: v / 3600 for k, v in seconds.items()},
            "dry_run": dry_run(m, recipe, pool, score_max_length, probe, proxy_run, len(SETS), FULL_RUN_EVAL_PROBLEMS)}


def dry_run(m: dict, recipe, pool, score_max_length: int, probe: dict, run: dict, sets: int, run_eval: int) -> dict:
    """The calibration proxy under the dry run's formulas and assumed MFU, on the same token counts,
    and the MFU that the measured rates give under those formulas."""
    from capacity_advisor.advisor.calibration.cost import DECODE_MFU, PEAK_TFLOPS, TRAIN_MFU, flops_and_hours

    n = m["params"]
    L = recipe.train_length
    trained = (probe["sets"] * probe["steps_per_set"] * recipe.batch_size + sets * run["steps"] * recipe.train_batch) * L
    eval_points = probe["evaluations"] + sets * run["evaluations"]
    eval_rows = probe["evaluations"] * probe["eval_problems"] + sets * run["evaluations"] * run_eval
    generated_len = min(pool.prompt_tokens + recipe.max_new_tokens, L)
    forward = pool.problems * pool.candidates * min(pool.prompt_tokens + pool.response_tokens, score_max_length) \
        + eval_rows * 2 * generated_len
    generated = eval_rows * recipe.max_new_tokens
    assumed = flops_and_hours(SimpleNamespace(gpu_tflops=PEAK_TFLOPS, mfu=TRAIN_MFU, decode_mfu=DECODE_MFU),
                              n, trained, forward, generated)
    peak = PEAK_TFLOPS * 1e12
    st, sc, ge = m["full_run_step"], m["scoring"], m["generation"]
    return {"peak_tflops": PEAK_TFLOPS, "assumed_mfu": TRAIN_MFU, "assumed_decode_mfu": DECODE_MFU,
            "evaluation_points": eval_points, "tokens": {"train": trained, "forward": forward, "generated": generated},
            "assumed_gpu_hours": assumed["gpu_hours"]["total"],
            "measured_mfu": {"train": 6 * n * st["tokens_per_step"] / st["seconds_per_step"] / peak,
                             "forward": 2 * n * sc["forward_tokens_per_s"] / peak,
                             "decode": 2 * n * ge["new_tokens_per_s"] / peak}}
