"""Build D_high / D_low / D_mixed / curriculum from a pool and its scores, and export them.

    sel = select(pool, load_scores("out/scores.jsonl"), SelectConfig(strategy="high"))
    export(sel, "train.jsonl", "trl")

`high` takes each problem's highest-scoring candidate, `low` its lowest (ties go to the lower
candidate index, so the choice is deterministic). `mixed` gives a fraction `mix` of the problems
(drawn with `seed`) their low response and the rest their high one, so it is the same size as the
others. `curriculum` is the high set followed by the low set; each row carries its `phase`, and
the trainer switches at `switch_epoch`. The score is the summed log-probability of the response
(the paper's π(y|x), its Eq. 4-5) unless `score="mean"` (per token, GRAPE's convention).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Mapping, Sequence

from capacity_advisor.core.numbers import number, whole
from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import atomic_path, refuse_overwrite, write_jsonl
from capacity_advisor.core.jsonl import read_jsonl_input
from capacity_advisor.training.ranking import (  # noqa: F401  (re-exported)
    DEFAULT_RANKING, RANKINGS, SCORE_FIELDS, extremes, low_share, score_value,
)
from capacity_advisor.training.manifest import DEFAULT_MIX, STRATEGIES
from capacity_advisor.training.text_metrics import REPETITION_KEYS, set_repetition

FORMATS = ("trl", "messages", "alpaca")
REQUIRED_SCORE_FIELDS = ("id", "k", "n_tokens", "logprob_sum", "logprob_mean", "truncated")


@dataclass
class SelectConfig:
    strategy: str = "high"  # --strategy: high | low | mixed | curriculum
    mix: float = DEFAULT_MIX  # --mix: share of problems that take their low response (mixed)
    score: str = DEFAULT_RANKING  # --score: sum (the paper's log-likelihood) | mean (per token, GRAPE's)
    seed: int = 0  # --seed: which problems are "low" in a mixed set
    switch_epoch: int = 1  # --switch-epoch: curriculum epoch at which training moves to the low set

    def validate(self) -> None:
        problems = []
        if self.strategy not in STRATEGIES:
            problems.append(f"--strategy {self.strategy!r} is unknown: use one of {', '.join(STRATEGIES)}")
        if not 0.0 <= self.mix <= 1.0:
            problems.append(f"--mix {self.mix} is outside [0, 1]: it is the share of problems given their low response")
        if self.score not in SCORE_FIELDS:
            problems.append(f"--score {self.score!r} is unknown: use {', '.join(RANKINGS)}")
        if self.switch_epoch < 1:  # training.switch_epoch must lie in (0, epochs); this flag counts whole epochs
            problems.append(f"--switch-epoch {self.switch_epoch} must be at least 1: the epoch at which a curriculum "
                            "moves from the high to the low set")
        if problems:
            raise InputError("; ".join(problems))


@dataclass
class Selection:
    strategy: str
    rows: list[dict]  # id, k, prompt, response, phase, score, n_tokens
    summary: dict
    inputs: list = field(default_factory=list)  # the files it was made from (pool, scores): no export may replace them


class Scores(dict):
    """(problem id, k) -> score row, remembering the file it was read from (`source`)."""

    source: str | None = None


def load_scores(path: str | Path) -> Scores:
    rows = read_jsonl_input(path, f"scores file {path} does not exist: run `advisor score` first",
                            ": the scores file is damaged; rerun `advisor score` (it resumes from its cache)")
    out = Scores()
    out.source = str(path)
    for n, r in enumerate(rows, 1):
        missing = [f for f in REQUIRED_SCORE_FIELDS if f not in r]
        if missing:
            raise InputError(f"{path} line {n}: missing {', '.join(missing)}; is this a file written by `advisor score`?")
        wrong = [f for f, ok in (("id", isinstance(r["id"], str) or whole(r["id"])), ("k", whole(r["k"])), ("n_tokens", whole(r["n_tokens"])),
                                 ("logprob_sum", number(r["logprob_sum"])), ("logprob_mean", number(r["logprob_mean"])),
                                 ("truncated", isinstance(r["truncated"], bool))) if not ok]
        if wrong:
            raise InputError(f"{path} line {n}: {', '.join(wrong)} of the wrong type or not finite; is this a file written "
                             "by `advisor score`?")
        out[(str(r["id"]), r["k"])] = r
    return out


def select(pool: Pool, scores: Mapping[tuple[str, int], dict], cfg: SelectConfig) -> Selection:
    cfg.validate()
    chosen: list[tuple[str, dict, dict]] = []  # problem id, high row, low row
    missing: list[str] = []
    for prob in pool.problems:
        rows = {c.k: scores.get((prob.id, c.k)) for c in prob.candidates}
        if any(r is None for r in rows.values()):
            missing.append(prob.id)
            continue
        _check_ranking_fields(cfg.score, prob.id, rows)
        hi, lo = extremes({k: score_value(r, cfg.score) for k, r in rows.items()})
        chosen.append((prob.id, rows[hi], rows[lo]))
    if missing:
        raise InputError(
            f"scores do not cover {len(missing)} of {len(pool)} problems (first: {missing[0]!r}): "
            "score this pool with the same field and filter flags, then select"
        )
    low_ids = low_share([pid for pid, _, _ in chosen], cfg.mix, cfg.seed) if cfg.strategy == "mixed" else set()

    def text_of(pid: str, r: dict) -> str:
        return next(c.text for c in pool.get(pid).candidates if c.k == r["k"])

    def row(pid: str, r: dict, phase: str) -> dict:
        prob = pool.get(pid)
        text = text_of(pid, r)
        return {"id": pid, "k": r["k"], "prompt": prob.prompt, "response": text, "phase": phase,
                "score": score_value(r, cfg.score), "n_tokens": r["n_tokens"], "answer": prob.answer}

    if cfg.strategy == "high":
        out = [row(pid, h, "high") for pid, h, _ in chosen]
    elif cfg.strategy == "low":
        out = [row(pid, lo, "low") for pid, _, lo in chosen]
    elif cfg.strategy == "mixed":
        out = [row(pid, lo, "low") if pid in low_ids else row(pid, h, "high") for pid, h, lo in chosen]
    else:
        out = [row(pid, h, "high") for pid, h, _ in chosen] + [row(pid, lo, "low") for pid, _, lo in chosen]
    inputs = [pool.source, getattr(scores, "source", None)]
    texts = {"high": [text_of(pid, h) for pid, h, _ in chosen], "low": [text_of(pid, lo) for pid, _, lo in chosen]}
    return Selection(cfg.strategy, out, _summary(chosen, out, cfg, texts), [i for i in inputs if i])


# What each ranking reads beyond the fields every score row has, and how to get it when it is missing.
_RANKING_NEEDS = {
    "rsr": (("rank_mean", "logprob_mean"), "token ranks: rescore the pool with this version of `advisor score`"),
    "local": (("logprob_local",), "step-local scores: score the pool with `advisor score --local-window 32`"),
}


def _check_ranking_fields(score: str, pid: str, rows: Mapping[int, dict]) -> None:
    """One InputError when a score row lacks, or holds a non-number in, a field the ranking reads
    (a hand-edited or foreign scores file), instead of a TypeError inside the ranking."""
    if score not in _RANKING_NEEDS:
        return
    names, how = _RANKING_NEEDS[score]
    for k, r in rows.items():
        for name in names:
            v = r.get(name)
            if v is None:
                raise InputError(f"--score {score} needs {how} (problem {pid!r} candidate {k} has no {name})")
            if not number(v):
                raise InputError(f"--score {score}: problem {pid!r} candidate {k} has {name} {_shown(v)}, not a number; "
                                 "is this a file written by `advisor score`?")


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "…"


def cues(rows: Sequence[dict], top: int = 5) -> list[tuple[str, float]]:
    """The most common response starts (first two tokens) among score rows, with their shares."""
    from collections import Counter

    starts = Counter(r["first_tokens"] for r in rows if isinstance(r.get("first_tokens"), str))
    n = sum(starts.values())
    return [(text, count / n) for text, count in starts.most_common(top)] if n else []


def _summary(chosen: Sequence[tuple[str, dict, dict]], rows: list[dict], cfg: SelectConfig,
             texts: Mapping[str, Sequence[str]]) -> dict:
    """What the selection holds; `texts`: each problem's high and low response (`texts["high"]`,
    `texts["low"]`), whose own repetition is read without a model."""
    hi_scores = [score_value(h, cfg.score) for _, h, _ in chosen]
    lo_scores = [score_value(lo, cfg.score) for _, _, lo in chosen]
    hi_len = mean(h["n_tokens"] for _, h, _ in chosen)
    lo_len = mean(lo["n_tokens"] for _, _, lo in chosen)
    return {
        "strategy": cfg.strategy,
        "score": cfg.score,
        "mix": cfg.mix if cfg.strategy == "mixed" else None,
        "switch_epoch": cfg.switch_epoch if cfg.strategy == "curriculum" else None,
        "problems": len(chosen),
        "rows": len(rows),
        "rows_from_low": sum(r["phase"] == "low" for r in rows),
        "mean_score_high": mean(hi_scores),
        "mean_score_low": mean(lo_scores),
        "likelihood_gap": mean(h - lo for h, lo in zip(hi_scores, lo_scores)),
        # per token whatever ranked the candidates, so it means the same for 40- and 4,000-token responses
        "likelihood_gap_per_token": mean(h["logprob_mean"] - lo["logprob_mean"] for _, h, lo in chosen),
        "mean_tokens_high": hi_len,
        "mean_tokens_low": lo_len,
        "length_ratio_low_high": lo_len / hi_len if hi_len else float("nan"),
        "same_candidate": sum(h["k"] == lo["k"] for _, h, lo in chosen),
        # the candidates' own word-trigram repetition (`text_metrics.ngram_repetition`): needs no training
        **repetition_summary(texts["high"], texts["low"]),
        # a cue at the start of a response moves its likelihood without changing its reasoning
        "start_cues_high": cues([h for _, h, _ in chosen]),
        "start_cues_low": cues([lo for _, _, lo in chosen]),
        "mean_score_selected": mean(r["score"] for r in rows),
    }


REPETITION_SAMPLE = 512  # problems whose responses the repetition is read on (evenly spaced): bounded on any pool


def repetition_summary(high: Sequence[str], low: Sequence[str]) -> dict:
    """Each set's mean word-trigram repetition and D_low's minus D_high's (REPETITION_KEYS), read on
    at most REPETITION_SAMPLE problems, evenly spaced, so a pool of long traces costs no more than
    a small one."""
    step = max(1, -(-len(high) // REPETITION_SAMPLE))
    h, lo = set_repetition(high[::step]), set_repetition(low[::step])
    return dict(zip(REPETITION_KEYS, (h, lo, lo - h)))


def export_rows(sel: Selection, fmt: str) -> list[dict]:
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    out = []
    for r in sel.rows:
        meta = {"id": r["id"], "k": r["k"]}
        if sel.strategy == "curriculum":
            meta["phase"] = r["phase"]
        if fmt == "trl":
            out.append({"prompt": r["prompt"], "completion": r["response"], **meta})
        elif fmt == "messages":
            out.append({"messages": [{"role": "user", "content": r["prompt"]},
                                     {"role": "assistant", "content": r["response"]}], **meta})
        else:
            out.append({"instruction": r["prompt"], "input": "", "output": r["response"], **meta})
    return out


def export(sel: Selection, path: str | Path, fmt: str = "trl") -> int:
    """Write the selection; Alpaca is one JSON array, the others JSON lines. Atomic. Refused when
    `path` is one of the files the selection was made from (the pool, the scores)."""
    refuse_overwrite(sel.inputs, [path], "--out")
    rows = export_rows(sel, fmt)
    if fmt == "alpaca":
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return len(rows)
    return write_jsonl(path, rows)


def config_dict(cfg: SelectConfig) -> dict:
    return asdict(cfg)
