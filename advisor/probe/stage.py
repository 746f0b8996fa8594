"""The probe stage from the advisor's side: the held-out split, the sets, and the run.

    advisor probe --model lab:s --pool pool.jsonl --out runs/probe

A held-out slice of `eval_problems` problems (drawn with the seed) never enters probe training:
its prompts are generated from, its references checked, and its high and low responses form the
teacher set. The rest give D_high / D_low / D_mixed by the student's own scores. The probe's
settings come from its plan (`probe.plan`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import Pool, pick_checker, read_pool
from capacity_advisor.advisor.probe.plan import bound_by_responses, load_predictor, predictor_plan
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool
from capacity_advisor.advisor.scoring.select import SelectConfig, load_scores, select
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import folder_lock, refuse_overwrite
from capacity_advisor.core.numbers import whole
from capacity_advisor.models import loading
from capacity_advisor.models.template import prompt_ids
from capacity_advisor.probes.recipe import REAL, flag
from capacity_advisor.probes.run import EVALUATION, ProbeConfig, ProbeData, ProbeReport, run_probe
from capacity_advisor.probes.student import Student, student_of
from capacity_advisor.training import text_metrics as metrics
from capacity_advisor.training.manifest import DEFAULT_MIX
from capacity_advisor.training.ranking import DEFAULT_RANKING

# ---- the held-out split and the sets --------------------------------------------------------



@dataclass
class Split:
    data: ProbeData
    train_ids: list[str]
    eval_ids: list[str]
    selection_summary: dict


def build_probe_data(pool: Pool, scores: dict, cfg: ProbeConfig, tokenizer=None, checker: str = metrics.CHECKER_DEFAULT,
                     mix: float = DEFAULT_MIX, score: str = DEFAULT_RANKING) -> Split:
    r = cfg.recipe
    if len(pool) < r.eval_problems + r.batch_size:
        raise InputError(
            f"the pool has {len(pool)} rankable problems; a probe needs {flag('eval_problems')} "
            f"({r.eval_problems}) held out plus at least {flag('batch_size')} ({r.batch_size}) to train on: "
            "use a larger pool or smaller settings"
        )
    high = select(pool, scores, SelectConfig("high", score=score))
    low = select(pool, scores, SelectConfig("low", score=score))
    mixed = select(pool, scores, SelectConfig("mixed", mix=mix, seed=cfg.seed, score=score))
    ids = [p.id for p in pool.problems]
    held = set(random.Random(cfg.seed).sample(ids, r.eval_problems))
    eval_ids = [i for i in ids if i in held]
    train_ids = [i for i in ids if i not in held]

    def pairs(sel, keep):
        return [(r["prompt"], r["response"]) for r in sel.rows if r["id"] in keep]

    keep = set(train_ids)
    check = pick_checker(pool, checker)
    context = {
        "problems": len(pool),
        "train_problems": len(train_ids),
        "eval_problems": len(eval_ids),
        "score": score,
        "likelihood_gap": high.summary["likelihood_gap"],
        "likelihood_gap_per_token": high.summary["likelihood_gap_per_token"],
        "length_ratio_low_high": high.summary["length_ratio_low_high"],
        **{k: high.summary[k] for k in metrics.REPETITION_KEYS},
        "mean_tokens_high": high.summary["mean_tokens_high"],
        "mean_tokens_low": high.summary["mean_tokens_low"],
    }
    if tokenizer is not None:
        prompt_tokens = mean(len(prompt_ids(tokenizer, p.prompt)) for p in pool.problems)
        resp = (context["mean_tokens_high"] + context["mean_tokens_low"]) / 2
        # one epoch of the full SFT over the pool's problems less the held-out ones (recommend's train.jsonl),
        # at the mean of the two sets' lengths
        context["full_run_tokens_per_epoch"] = max(1, len(pool) - len(eval_ids)) * (prompt_tokens + resp)
        context["prompt_tokens_mean"] = prompt_tokens
    data = ProbeData(
        train={"high": pairs(high, keep), "low": pairs(low, keep), "mixed": pairs(mixed, keep)},
        eval_prompts=[pool.get(i).prompt for i in eval_ids],
        eval_answers=[pool.get(i).answer for i in eval_ids],
        teacher_high=pairs(high, held),
        teacher_low=pairs(low, held),
        checker=check,
        context=context,
    )
    return Split(data, train_ids, eval_ids, high.summary)


# ---- scores, then the probe -----------------------------------------------------------------

LOCAL_WINDOW = 32  # tokens of context each step is scored with under --score local
SCORING = "scoring"  # what `probe_pool`'s progress names the scoring by (its other names are the probed sets)


def progress_label(name: str, prefix: str = "probe ") -> str:
    """How a progress display names one of `probe_pool`'s counts: the scoring, or a probed set."""
    return "scoring candidates" if _scoring(name) else f"{prefix}D_{name}"


def _scoring(name: str) -> bool:
    return name == SCORING or name.startswith(SCORING + " ")


def progress_unit(name: str) -> str:
    """What one of `probe_pool`'s counts counts: candidates scored, problems generated in an
    evaluation (`probes.run.evaluation_name`), or training steps."""
    if _scoring(name):
        return "candidates"
    return "problems" if EVALUATION in name else "steps"


def given_scores(path: str, pool: Pool, score: str = DEFAULT_RANKING, skip_tokens: int | None = None) -> dict:
    """Scores a user hands over (`--scores`), read and checked against the pool and the settings
    asked for (`skip_tokens`; None: any) before any work."""
    scores = load_scores(path)
    made = scores_skip_tokens(path, scores)
    if skip_tokens is not None and made is not None and made != skip_tokens:
        raise InputError(f"--scores {path} were made with --skip-tokens {made}, not {skip_tokens}: pass "
                         f"--skip-tokens {made}, or score the pool again with --skip-tokens {skip_tokens}")
    missing = [p.id for p in pool.problems if any((p.id, c.k) not in scores for c in p.candidates)]
    if missing:
        raise InputError(f"--scores {path} does not cover {len(missing)} of the pool's {len(pool)} problems (first: "
                         f"{missing[0]!r}): they are scores of another pool, or of this one read with other field or "
                         "filter flags; score this pool under this model with `advisor score` (the same pool flags) "
                         "and pass those, or drop --scores to score it now")
    if score != "sum":
        select(pool, scores, SelectConfig("high", score=score))  # the ranking's own fields are there
    return scores


def scores_skip_tokens(path: str, scores: dict) -> int | None:
    """The --skip-tokens a scores file was made with: its config.json says so, else its rows do
    (n_tokens - n_scored, the same in every row long enough); None when neither tells."""
    import json
    from pathlib import Path

    try:
        recorded = json.loads((Path(path).parent / "config.json").read_text(encoding="utf-8"))["settings"]["skip_tokens"]
        if whole(recorded):
            return recorded
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    gaps = {r["n_tokens"] - r["n_scored"] for r in scores.values()
            if isinstance(r.get("n_scored"), int) and r["n_scored"] > 0 and isinstance(r.get("n_tokens"), int)}
    return gaps.pop() if len(gaps) == 1 else None


@dataclass
class ProbeStage:
    scores: dict  # (problem id, k) -> score row
    split: Split
    report: ProbeReport | None  # None when the probe was not run


def probe_pool(student: Student, pool: Pool, cfg: ProbeConfig, lm, score_dir, probe_dir, scores: dict | None = None,
               checker: str = metrics.CHECKER_DEFAULT, score: str = DEFAULT_RANKING, mix: float = DEFAULT_MIX,
               score_length: int = REAL.score_length,
               backend: str = "hf", run: bool = True, say=None, progress=None, skip_tokens: int = 0,
               token_budget: int | None = None, shard_size: int = ScoreConfig.shard_size) -> ProbeStage:
    """Score the pool under the student (cached; unless `scores` are given), split it, and probe.

    The one path from a pool to probe measurements, for `advisor probe`, `advisor recommend` and
    both calibrations. `say(message)` reports the stage; `progress(strategy, step, total)` the
    probe's steps, and `progress(SCORING, done, total)` the candidates scored; `token_budget` and `shard_size` are the scoring's (`ScoreConfig`).
    """
    say = say or (lambda message: None)
    cfg.validate()
    if scores is None:
        say(f"scoring {pool.n_candidates:,} candidates under the student (cached)")
        counted = [0, 0]  # done, total

        def on_start(total: int, done: int) -> None:
            counted[:] = [done, total]
            progress(SCORING, done, total)

        def advance(n: int) -> None:
            counted[0] += n
            progress(SCORING, *counted)

        score_pool(pool, ScoreConfig(student.spec, device=cfg.device, dtype=cfg.dtype, backend=backend, score_length=score_length,
                                     token_budget=token_budget, shard_size=shard_size, skip_tokens=skip_tokens,
                                     local_window=LOCAL_WINDOW if score == "local" else 0),
                   score_dir, lm=lm if backend == "hf" else None,
                   on_start=on_start if progress else None, advance=advance if progress else None)
        scores = load_scores(Path(score_dir) / "scores.jsonl")
    split = build_probe_data(pool, scores, cfg, tokenizer=lm.tokenizer, checker=checker, mix=mix, score=score)
    report = None
    if run:
        say(f"probing {', '.join(f'D_{s}' for s in cfg.strategies)}")
        report = run_probe(student, split.data, cfg, probe_dir, lm=lm, progress=progress)
    return ProbeStage(scores, split, report)


# ---- `advisor probe` ---------------------------------------------------------------------------


@dataclass
class ProbeJob:
    """What `advisor probe` is asked; each field is the flag of the same name."""

    model: str
    pool: str
    out: str
    scores: str | None = None  # scores.jsonl of this pool under this model (else scored now, cached)
    predictor: str | None = None  # whose recipe to measure with (None: the shipped predictor's)
    recipe: dict = field(default_factory=dict)  # recipe settings given by flags ({setting: value})
    learning_rate: float | None = None  # None: the recipe's rule
    strategies: tuple[str, ...] = ("high", "low")
    lora_r: int = 0
    teacher: str | None = None
    checker: str = metrics.CHECKER_DEFAULT
    score: str = DEFAULT_RANKING
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    pool_options: dict = field(default_factory=dict)


def probe_job(job: ProbeJob, say=None, progress=None) -> dict:
    """`advisor probe`: every input checked before any work (flags, model, pool, scores, predictor,
    the probe's fit in the pool), then the student loaded and probed. Returns the probe report
    with `chosen` (each setting and its source) and `notes` (where it measured otherwise than
    the predictor's inputs). One writer in OUT at a time (`core.files.folder_lock`)."""
    with folder_lock(job.out):

        say = say or (lambda message: None)
        run = dict(learning_rate=job.learning_rate, strategies=tuple(job.strategies), lora_r=job.lora_r, seed=job.seed,
                   device=job.device, dtype=job.dtype, teacher=job.teacher)
        student = student_of(job.model)
        plan = predictor_plan(student, load_predictor(job.predictor), job.recipe)
        plan.probe_config(**run).validate()
        loading.check_model_spec(job.model)

        refuse_overwrite([job.pool, job.scores, job.predictor], [job.out], "--out")
        pool = read_pool(job.pool, PoolOptions(**job.pool_options))
        plan = bound_by_responses(plan.for_pool(len(pool)), pool, job.model, job.seed)
        scores = given_scores(job.scores, pool, job.score) if job.scores else None
        say(f"loading {job.model}")
        lm = loading.load_model(job.model, device=job.device, dtype=job.dtype)
        student = student.described(lm.description)
        plan = plan.within(lm.description.get("max_position_embeddings"))
        rate = (job.learning_rate, "--learning-rate") if job.learning_rate else student.learning_rate()
        cfg = plan.probe_config(**{**run, "learning_rate": rate[0]})
        stage = probe_pool(student, pool, cfg, lm, Path(job.out) / "score", job.out, scores=scores, checker=job.checker,
                           score=job.score, score_length=plan.recipe.score_length, say=say, progress=progress)
        notes, _ = plan.notes()
        if plan.fitted is not None and (job.learning_rate or job.lora_r):
            notes.append("the probe measured otherwise than the predictor's inputs were measured: "
                         + "; ".join(x for x in (f"--learning-rate {job.learning_rate:g}" if job.learning_rate else "",
                                                 f"--lora-r {job.lora_r}" if job.lora_r else "") if x)
                         + " (the predictor's were measured at the recipe's rate, with full fine-tuning)")
        chosen = {**plan.settings(), "learning_rate": {"value": rate[0], "source": rate[1]}}
        return {**stage.report.as_dict(), "chosen": chosen, "notes": notes}
