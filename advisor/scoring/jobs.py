"""`advisor score` and `advisor select` as one library call each: from the files a user names to the
files they get, every input checked before any work.

The steps themselves live with their data (`score`, `compute`, `select`); these
functions only read the inputs, call them in order and write the outputs, so the CLI does no
library work of its own. Work reports through callbacks: `say(message)` for a stage,
`start(description, total, done, unit)` / `advance(n)` for counted work, `on_pool(pool)` once the
pool is scored (the work has succeeded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.pools.read import pick_checker, read_pool
from capacity_advisor.advisor.scoring import compute as compute_mod, score as scoring, select as sel_mod
from capacity_advisor.advisor.scoring.compute import ComputeConfig, PROBLEM_FILTERS, answered, keep_problems
from capacity_advisor.advisor.scoring.select import FORMATS
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    advisor_home, check_writable_dir, check_writable_file, refuse_overwrite, versions, write_json, write_jsonl,
)
from capacity_advisor.models.backends import backend_from
from capacity_advisor.training.text_metrics import CHECKER_DEFAULT


def _quiet(*args, **kw) -> None:
    return None


@dataclass(frozen=True)
class ScoreJob:
    """`advisor score`'s files and its compute measurement, each flag's default and help stated
    here once (the scoring settings are `scoring.ScoreConfig`'s)."""

    pool: str = field(metadata={"help": "Pool file or datasets folder."})
    out: str = field(metadata={"help": "Output folder (scores.jsonl, config.json)."})
    compute_budgets: str | None = field(default=None, metadata={"help": (
        "SHORT,LONG new tokens: also measure which problems the student solves only with the long budget "
        "(OUT/compute.jsonl, for select --problems).")})
    compute_samples: int = field(default=ComputeConfig.samples, metadata={"help": "Attempts per budget (1: greedy)."})
    checker: str = CHECKER_DEFAULT  # the answer checker of the compute measurement (cli.options.checker_option)

    def compute(self, seed: int) -> ComputeConfig | None:
        """The compute measurement asked for (checked), or None."""
        return ComputeConfig.parse(self.compute_budgets, self.compute_samples, seed) if self.compute_budgets else None


def score_file(job: ScoreJob, pool_options, cfg, say: Callable = _quiet, start: Callable = _quiet,
               advance: Callable = _quiet, on_pool: Callable = _quiet) -> dict:
    """Score every candidate of the pool under the student (`score.score_pool`, cached and
    resumable) into OUT/scores.jsonl; with `job.compute_budgets`, also measure which problems the
    student solves only with the long budget (OUT/compute.jsonl). Returns the scoring summary
    with the pool's and the compute measurement's."""
    cfg.validate()
    compute, checker, out = job.compute(cfg.seed), job.checker, job.out
    check_writable_dir(out, "--out")
    refuse_overwrite([job.pool], [out, Path(out) / "scores.jsonl", Path(out) / "compute.jsonl",
                                  Path(out) / "config.json"], "--out")
    check_writable_dir(advisor_home(), "ADVISOR_HOME (the score cache)")
    pool = read_pool(job.pool, pool_options)
    if compute is not None:
        answered(pool)
        pick_checker(pool, checker)
    say(f"loading {cfg.model}")
    lm = scoring.load_for(cfg)

    def begin(total: int, done: int) -> None:  # inputs, model and cache are all usable by now
        start("scoring", total, done, "candidates")

    summary = scoring.score_pool(pool, cfg, out, lm=lm, on_start=begin, advance=advance)
    on_pool(pool)  # once scored: a mistake found in a shard (--skip-tokens too large) stays the only line
    summary["pool"] = pool.summary()
    if compute is not None and "waiting_for" not in summary:
        summary["compute"] = measure_compute(pool, lm, cfg, compute, checker, Path(out), start, advance)
    return summary


def measure_compute(pool, lm, cfg, compute, checker: str, out: Path, start: Callable, advance: Callable) -> dict:
    """Each problem attempted with the short and the long budget (`compute.measure`); OUT/compute.jsonl."""
    gen = backend_from(cfg.backend, lm, cfg)
    start("short and long attempts", 2 * len(pool), 0, "problems")
    rows = compute_mod.measure(gen, pool, compute, pick_checker(pool, checker), progress=advance)
    write_jsonl(out / "compute.jsonl", rows)
    return {"classes": {c: sum(r["class"] == c for r in rows) for c in compute_mod.CLASSES},
            "short": compute.short, "long": compute.long, "written": str(out / "compute.jsonl")}


@dataclass(frozen=True)
class SelectJob:
    """`advisor select`'s files, format and problem filter, each flag's default and help stated
    here once (the selection's settings are `select.SelectConfig`'s)."""

    pool: str = field(metadata={"help": "The pool that was scored."})
    scores: str = field(metadata={"help": "scores.jsonl written by `advisor score`."})
    out: str = field(metadata={"help": "Dataset file to write."})
    format: str = field(default=FORMATS[0], metadata={"help": (
        "trl: prompt/completion JSONL; messages: chat JSONL; alpaca: one JSON array.")})
    problems: str = field(default=PROBLEM_FILTERS[0], metadata={"help": (
        "Keep one class of problems (needs `score --compute-budgets`): responsive = solved only with the long budget.")})
    compute: str | None = field(default=None, metadata={"help": "compute.jsonl (default: beside --scores)."})
    candidates: str | None = field(default=None, metadata={"help": (
        "Also write every candidate of the selected problems here, for training.rerank.")})


def select_file(job: SelectJob, pool_options, cfg) -> dict:
    """D_high / D_low / D_mixed / curriculum of a scored pool (`select.select`), exported to OUT in
    `job.format`, with OUT's .config.json beside it; `job.problems` keeps one compute class (from
    `job.compute`, default beside the scores); `job.candidates` also gets every candidate of the
    selected problems (for training.rerank). Returns the selection's summary."""
    cfg.validate()
    pool_path, scores_path, out, fmt, problems = job.pool, job.scores, job.out, job.format, job.problems
    compute_path, candidates_path = job.compute, job.candidates
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    if problems not in PROBLEM_FILTERS:
        raise InputError(f"--problems {problems!r} is unknown: use one of {', '.join(PROBLEM_FILTERS)}")
    check_writable_file(out, "--out")
    if candidates_path:
        check_writable_file(candidates_path, "--candidates")
    compute_file = compute_path or Path(scores_path).with_name("compute.jsonl")
    refuse_overwrite([pool_path, scores_path, compute_file],
                     [out, candidates_path, Path(out).with_name(Path(out).stem + ".config.json")], "--out")
    pool = read_pool(pool_path, pool_options)
    if problems != "all":
        pool = keep_problems(pool, compute_file, problems)
    selection = sel_mod.select(pool, sel_mod.load_scores(scores_path), cfg)
    n = sel_mod.export(selection, out, fmt)
    if candidates_path:
        ids = {r["id"] for r in selection.rows}
        write_jsonl(candidates_path, ({"id": p.id, "prompt": p.prompt, "responses": [c.text for c in p.candidates]}
                                      for p in pool.problems if p.id in ids))
    summary = {**selection.summary, "format": fmt, "written": str(out), "rows_written": n, "problems_kept": problems}
    write_json(Path(out).with_name(Path(out).stem + ".config.json"), {
        "stage": "select", "versions": versions(), "settings": sel_mod.config_dict(cfg), "format": fmt,
        "pool": pool.summary(), "scores": str(scores_path), "summary": summary,
    })
    return summary
