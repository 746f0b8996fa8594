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
from capacity_advisor.models.errors import InputError
from capacity_advisor.probes.run import ProbeConfig, ProbeData

CHECKERS = ("auto", "lab", "math", "none")


def pick_checker(pool: Pool, checker: str = "auto") -> str:
    return choose_checker(checker, pool.has_answers, pool.tasks)


def choose_checker(checker: str, has_answers: bool, tasks: set[str]) -> str:
    """`auto`: the lab's checker for lab tasks, math for other problems with answers, else none."""
    if checker not in CHECKERS:
        raise InputError(f"--checker {checker!r} is unknown: use one of {', '.join(CHECKERS)}")
    if checker != "auto":
        return checker
    if not has_answers:
        return "none"
    from capacity_advisor.models.lab import FAMILIES

    return "lab" if tasks and tasks <= set(FAMILIES) else "math"


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


def run_probe_stage(model: str, pool_path: str, pool_opts, cfg: ProbeConfig, out: str, scores_path: str | None = None,
                    checker: str = "auto", lm=None, pool: Pool | None = None) -> dict:
    """Read the pool, score it (cached) unless scores are given, run the probe, print its summary."""
    from pathlib import Path

    from capacity_advisor.advisor.pool import read_pool
    from capacity_advisor.advisor.scoring import ScoreConfig, score_pool
    from capacity_advisor.advisor.select import load_scores
    from capacity_advisor.advisor.cli.ui import console, progress
    from capacity_advisor.models.loading import load_model
    from capacity_advisor.probes.run import run_probe

    cfg.validate()
    pool = pool or read_pool(pool_path, pool_opts)
    if lm is None:
        with console.status(f"loading {model}"):
            lm = load_model(model, device=cfg.device, dtype=cfg.dtype)
    if scores_path is None:
        with console.status("scoring the pool under the student (cached)"):
            score_pool(pool, ScoreConfig(model, device=cfg.device, dtype=cfg.dtype), Path(out) / "score", lm=lm)
        scores_path = str(Path(out) / "score" / "scores.jsonl")
    split = build_probe_data(pool, load_scores(scores_path), cfg, tokenizer=lm.tokenizer, checker=checker)
    with progress("probe", unit="steps") as bar:
        tasks = {s: bar.add_task(f"D_{s}", total=cfg.steps, rate="") for s in cfg.strategies}
        report = run_probe(model, split.data, cfg, out, lm=lm,
                           progress=lambda s, step, total: bar.update(tasks[s], completed=step))
    print_probe(report)
    return report


def print_probe(report: dict) -> None:
    from rich.table import Table

    from capacity_advisor.advisor.cli.ui import console, fmt

    curves = report["curves"]
    t = Table(title=f"Probe: {report['model']['spec']} ({report['model']['n_params']:,} params)", title_justify="left")
    t.add_column("metric")
    for s in curves:
        t.add_column(f"D_{s}: start → end", justify="right")
    for key in ("train_loss", "teacher_nll", "teacher_nll_low", "base_drift", "teacher_view", "repetition_rate",
                "copy_rate", "answer_rate", "accuracy"):
        vals = [(c[0].get(key), c[-1].get(key)) for c in curves.values()]
        if all(a is None and b is None for a, b in vals):
            continue
        t.add_row(key, *[f"{fmt(a)} → {fmt(b)}" for a, b in vals])
    console.print(t)
    c = report["cost"]
    share = c["share_of_full_run"]
    line = f"probe cost: {c['probe_tokens']:,} tokens"
    if share:
        line += " = " + ", ".join(f"{100 * v:.1f}% of a {e}-epoch full run" for e, v in share.items())
    console.print(line)
