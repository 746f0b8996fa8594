"""The probe stage from the advisor's side: turn a pool and its scores into ProbeData, run it.

    advisor probe --model lab:s --pool pool.jsonl --out runs/probe --steps 100

A held-out slice of `eval_problems` problems (drawn with the seed) never enters probe training:
its prompts are generated from, its references checked, and its high and low responses form the
teacher set. The rest give D_high / D_low / D_mixed by the student's own scores.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from statistics import mean

from capacity_advisor.advisor.pool import Pool
from capacity_advisor.advisor.select import SelectConfig, select
from capacity_advisor.models import metrics
from capacity_advisor.models.errors import InputError
from capacity_advisor.probes.run import ProbeConfig, ProbeData

def pick_checker(pool: Pool, checker: str = "auto") -> str:
    return metrics.choose_checker(checker, pool.has_answers, pool.tasks)


@dataclass
class Split:
    data: ProbeData
    train_ids: list[str]
    eval_ids: list[str]
    selection_summary: dict


def build_probe_data(pool: Pool, scores: dict, cfg: ProbeConfig, tokenizer=None, checker: str = "auto",
                     mix: float = 0.5, score: str = "sum") -> Split:
    if len(pool) < cfg.eval_problems + cfg.batch_size:
        raise InputError(
            f"the pool has {len(pool)} rankable problems; a probe needs --eval-problems ({cfg.eval_problems}) "
            f"held out plus at least --batch-size ({cfg.batch_size}) to train on: use a larger pool or smaller settings"
        )
    high = select(pool, scores, SelectConfig("high", score=score))
    low = select(pool, scores, SelectConfig("low", score=score))
    mixed = select(pool, scores, SelectConfig("mixed", mix=mix, seed=cfg.seed, score=score))
    ids = [p.id for p in pool.problems]
    held = set(random.Random(cfg.seed).sample(ids, cfg.eval_problems))
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
        "mean_tokens_high": high.summary["mean_tokens_high"],
        "mean_tokens_low": high.summary["mean_tokens_low"],
    }
    if tokenizer is not None:
        from capacity_advisor.models.template import prompt_ids

        prompt_tokens = mean(len(prompt_ids(tokenizer, p.prompt)) for p in pool.problems)
        resp = (context["mean_tokens_high"] + context["mean_tokens_low"]) / 2
        # one epoch of the full SFT over every problem of the pool, at the mean of the two sets' lengths
        context["full_run_tokens_per_epoch"] = len(pool) * (prompt_tokens + resp)
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


LOCAL_WINDOW = 32  # tokens of context each step is scored with under --score local


@dataclass
class ProbeStage:
    scores: dict  # (problem id, k) -> score row
    split: Split
    report: dict | None  # None when the probe was not run


def probe_pool(model: str, pool: Pool, cfg: ProbeConfig, lm, score_dir, probe_dir, scores_path: str | None = None,
               checker: str = "auto", score: str = "sum", mix: float = 0.5, max_length: int = 4096,
               backend: str = "hf", run: bool = True, say=None, progress=None, skip_tokens: int = 0) -> ProbeStage:
    """Score the pool under the student (cached; or read `scores_path`), split it, and probe.

    The one path from a pool to probe measurements, for `advisor probe` and `advisor recommend`.
    `say(message)` reports the stage; `progress(strategy, step, total)` the probe's steps.
    """
    from pathlib import Path

    from capacity_advisor.advisor.scoring import ScoreConfig, score_pool
    from capacity_advisor.advisor.select import load_scores
    from capacity_advisor.probes.run import run_probe

    say = say or (lambda message: None)
    cfg.validate()
    if scores_path is None:
        say(f"scoring {pool.n_candidates:,} candidates under the student (cached)")
        score_pool(pool, ScoreConfig(model, device=cfg.device, dtype=cfg.dtype, backend=backend, max_length=max_length,
                                     skip_tokens=skip_tokens, local_window=LOCAL_WINDOW if score == "local" else 0),
                   score_dir, lm=lm if backend == "hf" else None)
        scores_path = str(Path(score_dir) / "scores.jsonl")
    scores = load_scores(scores_path)
    split = build_probe_data(pool, scores, cfg, tokenizer=lm.tokenizer, checker=checker, mix=mix, score=score)
    report = None
    if run:
        say(f"probing {', '.join(f'D_{s}' for s in cfg.strategies)}")
        report = run_probe(model, split.data, cfg, probe_dir, lm=lm, progress=progress)
    return ProbeStage(scores, split, report)
