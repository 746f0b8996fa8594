"""Compute-responsive problems: which problems the student solves only when it may reason longer.

    advisor score --model M --pool P --out runs/score --compute-budgets 256,2048
    advisor select --pool P --scores runs/score/scores.jsonl --problems responsive --strategy high --out d.jsonl

For every problem of a pool with a reference answer, the student generates `samples` completions
with at most `short` new tokens and `samples` with at most `long` (greedy when `samples` is 1),
and each is checked against the reference. A problem is

- `solved`: some short completion is right (a little reasoning is enough);
- `responsive`: no short completion is right, some long one is (more reasoning flips it);
- `unsolved`: no completion is right.

CRDS (the related work this follows) finds the responsive problems the most useful to train on.
`select --problems` keeps one class before choosing each problem's response, so it composes with
D_high / D_low / D_mixed. The measurement is written beside the scores as `compute.jsonl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.jsonl import read_jsonl_input
from capacity_advisor.training.text_metrics import check_answer

CLASSES = ("solved", "responsive", "unsolved")
MAX_NEW_TOKENS = 1 << 20  # no model generates more in one completion
MAX_SAMPLES = 1024
PROBLEM_FILTERS = ("all", *CLASSES)


@dataclass
class ComputeConfig:
    short: int = 256  # --compute-budgets SHORT,LONG: new tokens of the short and the long attempt
    long: int = 2048
    samples: int = 1  # attempts per budget (1: greedy)
    temperature: float = 0.7  # when samples > 1
    seed: int = 0

    def validate(self) -> None:
        if not 1 <= self.short < self.long <= MAX_NEW_TOKENS:
            raise InputError(f"--compute-budgets {self.short},{self.long}: give SHORT,LONG with 1 <= SHORT < LONG <= "
                             f"{MAX_NEW_TOKENS:,} new tokens")
        if not 1 <= self.samples <= MAX_SAMPLES:
            raise InputError(f"--compute-samples {self.samples} must be from 1 to {MAX_SAMPLES:,}")

    @classmethod
    def parse(cls, text: str, samples: int = 1, seed: int = 0) -> "ComputeConfig":
        try:
            short, long = (int(x) for x in text.split(","))
        except ValueError:
            raise InputError(f"--compute-budgets {text!r}: give two numbers of new tokens, SHORT,LONG (e.g. 256,2048)") from None
        cfg = cls(short=short, long=long, samples=samples, seed=seed)
        cfg.validate()
        return cfg


def classify(short_right: int, long_right: int) -> str:
    return "solved" if short_right else "responsive" if long_right else "unsolved"


def measure(backend, pool: Pool, cfg: ComputeConfig, checker: str, progress=None) -> list[dict]:
    """One row per problem with an answer: right answers at each budget, and its class."""
    cfg.validate()
    problems = answered(pool)
    temperature = 0.0 if cfg.samples == 1 else cfg.temperature
    right = {}
    for budget in (cfg.short, cfg.long):
        outs = backend.generate([p.prompt for p in problems], max_new_tokens=budget, temperature=temperature,
                                n=cfg.samples, seed=cfg.seed, progress=progress)
        right[budget] = [sum(check_answer(t, p.answer, checker) for t in texts) for p, texts in zip(problems, outs)]
    return [{"id": p.id, "short_right": s, "long_right": lg, "samples": cfg.samples, "short": cfg.short, "long": cfg.long,
             "class": classify(s, lg)} for p, s, lg in zip(problems, right[cfg.short], right[cfg.long])]


def answered(pool: Pool) -> list:
    """The problems with a reference answer; InputError when there are none (checked before any scoring)."""
    problems = [p for p in pool.problems if p.answer not in (None, "")]
    if not problems:
        raise InputError("--compute-budgets needs reference answers in the pool: name the answer field "
                         "(--answer-field) or leave --compute-budgets out")
    return problems


def keep_problems(pool: Pool, path: str | Path, which: str) -> Pool:
    """The pool restricted to one class of problems (`all` keeps every problem)."""
    if which not in PROBLEM_FILTERS:
        raise InputError(f"--problems {which!r} is unknown: use {', '.join(PROBLEM_FILTERS)}")
    if which == "all":
        return pool
    p = Path(path)
    rows = read_jsonl_input(p, f"--problems {which} needs {p}: score the pool with --compute-budgets SHORT,LONG first",
                            "; rescore with --compute-budgets")
    classes = {str(r.get("id")): r.get("class") for r in rows}
    if any(c not in CLASSES for c in classes.values()):
        raise InputError(f"{p} is not a compute file written by `advisor score --compute-budgets`")
    kept = [q for q in pool.problems if classes.get(q.id) == which]
    if not kept:
        counts = {c: sum(v == c for v in classes.values()) for c in CLASSES}
        raise InputError(f"no {which} problems in this pool ({counts}); pick another --problems class")
    return Pool(kept, pool.source, pool.layout, pool.fields, pool.n_rows, pool.skipped_candidates, pool.skipped_problems,
                pool.skipped_examples)
