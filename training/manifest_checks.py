"""The checks of a manifest's `training` block, and the value tests every manifest check uses:
each check returns the problems it found as lines naming the field to fix (none when it is sound)."""

from __future__ import annotations

import math
import re
from typing import Any

from capacity_advisor.core.numbers import number, whole
from capacity_advisor.training.ranking import RANKINGS

MAX_SEED = 2**32 - 1  # numpy's seeds stop here (the trainer seeds numpy, torch and random with it)
# What can run: no released model reads more than about a million positions, and a count beyond
# these would overflow a tensor's index or take longer than any run (each bound is far above use).
MAX_TOKENS = 1 << 20  # max_length, max_new_tokens
MAX_BATCH = 1 << 16  # sequences per optimizer step, micro-batches per step
MAX_EPOCHS = 10_000
MAX_EVAL_AT = 16  # extra evaluation shares a manifest may name (a race names at most three)
MAX_COUNT = 10 ** 9  # steps, evaluations, rows, checkpoints
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
              "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")


def training_problems(t) -> list[str]:
    """The problems of `t`, a manifest's `TrainingSpec` (this module sits below the manifest)."""
    bad = []
    if not number(t.epochs) or not 0 < t.epochs <= MAX_EPOCHS:
        bad.append(f"training.epochs: the budget must be > 0 and at most {MAX_EPOCHS:,}, got {show(t.epochs)}")
    if not number(t.learning_rate) or not 0 < t.learning_rate <= 1:
        bad.append(f"training.learning_rate: must be > 0 and at most 1, got {show(t.learning_rate)}")
    for name, most in (("batch_size", MAX_BATCH), ("grad_accum", MAX_BATCH), ("evals_per_epoch", MAX_EPOCHS)):
        bad += whole_problems(f"training.{name}", getattr(t, name), 1, most)
    if whole(t.batch_size) and whole(t.grad_accum) and t.grad_accum >= 1 and t.batch_size >= 1 and t.batch_size % t.grad_accum:
        bad.append(f"training.batch_size: {t.batch_size} must be a multiple of training.grad_accum ({t.grad_accum})")
    bad += whole_problems("training.max_length", t.max_length, 8, MAX_TOKENS)
    if not is_one_of(t.lr_scheduler, SCHEDULERS):
        bad.append(f"training.lr_scheduler: {show(t.lr_scheduler)} is unknown (use {', '.join(SCHEDULERS)})")
    if not number(t.warmup_ratio) or not 0 <= t.warmup_ratio < 1:
        bad.append(f"training.warmup_ratio: must be in [0, 1), got {show(t.warmup_ratio)}")
    for name in ("warmup_steps", "max_steps", "eval_every", "save_total_limit"):
        bad += whole_problems(f"training.{name}", getattr(t, name), 0 if name == "warmup_steps" else 1, MAX_COUNT,
                              null=True)
    if t.eval_at is not None and not (isinstance(t.eval_at, list) and len(t.eval_at) <= MAX_EVAL_AT
                                      and all(number(x) and 0 < x <= 1 for x in t.eval_at)):
        bad.append(f"training.eval_at: must be null or a list of at most {MAX_EVAL_AT} shares of the budget in (0, 1], "
                   f"e.g. [0.3, 0.75], got {show(t.eval_at)}")
    if not number(t.weight_decay) or not 0 <= t.weight_decay <= 10:
        bad.append(f"training.weight_decay: must be ≥ 0 and at most 10, got {show(t.weight_decay)}")
    if not whole(t.seed) or not 0 <= t.seed <= MAX_SEED:
        bad.append(f"training.seed: must be a whole number from 0 to {MAX_SEED} (what numpy and torch both take), "
                   f"got {show(t.seed)}")
    if not isinstance(t.gradient_checkpointing, bool):
        bad.append(f"training.gradient_checkpointing: must be true or false, got {show(t.gradient_checkpointing)}")
    if t.switch_epoch is not None:
        if not number(t.switch_epoch) or not 0 < t.switch_epoch < (t.epochs if number(t.epochs) else math.inf):
            bad.append(f"training.switch_epoch: must lie between 0 and training.epochs ({show(t.epochs)}), got {show(t.switch_epoch)}")
    if t.lora is not None:
        bad += _lora_problems(t.lora)
    if t.rerank is not None:
        bad += _rerank_problems(t)
    return bad


def whole_problems(name: str, v: Any, least: int, most: int, null: bool = False) -> list[str]:
    """The problem of a field that must be a whole number from `least` to `most` (or null, with `null`)."""
    if (v is None and null) or (whole(v) and least <= v <= most):
        return []
    return [f"{name}: must be a whole number from {least:,} to {most:,}{' or null' if null else ''}, got {show(v)}"]


def _rerank_problems(t) -> list[str]:
    r = t.rerank
    if not isinstance(r, dict):
        return [f"training.rerank: null, or an object with epochs, candidates and score, got {show(r)}"]
    bad = []
    extra = set(r) - {"epochs", "candidates", "score"}
    if extra:
        bad.append(f"training.rerank: unknown keys {key_list(extra)} (use epochs, candidates, score)")
    epochs = r.get("epochs")
    if not (isinstance(epochs, list) and epochs and all(whole(e) and e >= 1 and (not number(t.epochs) or e < t.epochs)
                                                        for e in epochs)):
        bad.append(f"training.rerank.epochs: whole epochs from 1 up to before training.epochs, got {show(epochs)}")
    if not is_line(r.get("candidates")):
        bad.append(f"training.rerank.candidates: the candidates file (one line of text), got {show(r.get('candidates'))}")
    if r.get("score", "sum") not in [k for k in RANKINGS if k != "local"]:
        bad.append(f"training.rerank.score: sum, mean or rsr, got {show(r.get('score'))}")
    if t.switch_epoch is not None:
        bad.append("training.rerank: a curriculum already switches sets at training.switch_epoch; use one or the other")
    return bad


def _lora_problems(lora: Any) -> list[str]:
    if not isinstance(lora, dict) or not whole(lora.get("r")) or not 1 <= lora["r"] <= MAX_BATCH:
        return [f"training.lora: null for full SFT, or an object with an integer r from 1 to {MAX_BATCH:,}, got {show(lora)}"]
    bad = []
    extra = set(lora) - {"r", "alpha", "dropout", "target_modules"}
    if extra:
        bad.append(f"training.lora: unknown keys {key_list(extra)} (use r, alpha, dropout, target_modules)")
    if "alpha" in lora and (not number(lora["alpha"]) or not 0 < lora["alpha"] <= 1e6):
        bad.append(f"training.lora.alpha: must be a number > 0 and at most 1e6, got {show(lora['alpha'])}")
    if "dropout" in lora and (not number(lora["dropout"]) or not 0 <= lora["dropout"] < 1):
        bad.append(f"training.lora.dropout: must be in [0, 1), got {show(lora['dropout'])}")
    modules = lora.get("target_modules", "all-linear")
    if not (is_line(modules) or (isinstance(modules, list) and modules and all(is_line(m) for m in modules))):
        bad.append(f"training.lora.target_modules: must be a module name, a list of them or \"all-linear\", got {show(modules)}")
    return bad


def is_one_of(v: Any, choices: tuple[str, ...]) -> bool:
    return isinstance(v, str) and v in choices


def is_line(v: Any) -> bool:
    """Text fit to be a path or model id: non-empty, one line, no control characters (which could
    also smuggle lines into the YAML and shell snippets built from it)."""
    return isinstance(v, str) and bool(v) and not _CONTROL.search(v)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def show(v: Any, width: int = 60) -> str:
    """A value as it can be quoted in one short error line, whatever its size or content."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):
        text = f"<{type(v).__name__}>"
    return text if len(text) <= width else text[:width] + f"… ({len(text):,} characters)"


def key_list(keys) -> str:
    return ", ".join(show(k, 30) for k in sorted(keys)[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")


RACE_KEYS = ("fraction", "wait", "k", "margin", "patient", "tie", "hold", "why", "expected")
EXPECTED_KEYS = {"regret", "overhead", "overhead_where_open"}  # the last absent from older manifests


def race_problems(race: Any) -> list[str]:
    """The problems of a manifest's `race` (the race a recommendation plans: {"fraction": share of
    the budget in (0, 1], "wait": null or a larger share up to 1, "k": absent, null or the
    evaluations in a row a clear lead stops it at, "margin": that lead's least accuracy difference
    in [0, 1), "patient": whether a D_high lead waits on a gaining D_low, "tie": absent, null or a
    share below the fraction at which it stops for D_high unless D_low has led or is gaining, "why": text, "expected":
    {"regret", "overhead", "overhead_where_open"} or null}); that it names two different sets is the manifest's check."""
    if race is None:
        return []
    if not isinstance(race, dict):
        return [f"race: must be an object ({', '.join(RACE_KEYS)}) or null, got {show(race)}"]
    bad = []
    unknown = set(race) - set(RACE_KEYS)
    if unknown:
        bad.append(f"race: unknown keys {key_list(unknown)} (known: {', '.join(RACE_KEYS)})")
    f, w = race.get("fraction"), race.get("wait")
    if not number(f) or not 0 < f <= 1:  # whole numbers pass `number`: 1 is a whole budget
        bad.append(f"race.fraction: must be a share of the budget in (0, 1], e.g. 0.5, got {show(f)}")
    elif w is not None and (not number(w) or not f < w <= 1):
        bad.append(f"race.wait: must be null or a share of the budget above race.fraction ({show(f)}), at most 1, "
                   f"got {show(w)}")
    k, margin = race.get("k"), race.get("margin")
    if k is not None and not whole(k, 1, 100):
        bad.append(f"race.k: must be null or a whole number of evaluations from 1 to 100, got {show(k)}")
    if margin is not None and not (number(margin) and 0 <= margin < 1):
        bad.append(f"race.margin: must be an accuracy difference in [0, 1), e.g. 0.05, got {show(margin)}")
    if not isinstance(race.get("patient", False), bool):
        bad.append(f"race.patient: must be true or false, got {show(race['patient'])}")
    tie = race.get("tie")
    if tie is not None and not (number(tie) and number(f) and 0 < tie < f):
        bad.append(f"race.tie: must be null or a share of the budget above 0 and below race.fraction ({show(f)}), "
                   f"got {show(tie)}")
    hold = race.get("hold")
    if hold is not None and not (number(hold) and 0 <= hold <= 10):
        bad.append(f"race.hold: must be null or a number of standard errors from 0 to 10, e.g. 1, got {show(hold)}")
    if race.get("why") is not None and not (is_line(race["why"]) and len(race["why"]) <= 2000):
        bad.append(f"race.why: must be one line of text, got {show(race['why'])}")
    expected = race.get("expected")
    if expected is not None and not (isinstance(expected, dict) and set(expected) <= EXPECTED_KEYS
                                     and all((v is None and k == "overhead_where_open") or (number(v) and 0 <= v <= 100)
                                             for k, v in expected.items())):
        bad.append(f"race.expected: must be null or {{\"regret\": points, \"overhead\": share, "
                   f"\"overhead_where_open\": share or null}}, got {show(expected)}")
    return bad
