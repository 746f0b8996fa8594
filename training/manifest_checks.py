"""The checks of a manifest's `training` block, and the value tests every manifest check uses:
each check returns the problems it found as lines naming the field to fix (none when it is sound)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capacity_advisor.training.manifest import TrainingSpec

MAX_SEED = 2**32 - 1  # numpy's seeds stop here (the trainer seeds numpy, torch and random with it)
# What can run: no released model reads more than about a million positions, and a count beyond
# these would overflow a tensor's index or take longer than any run (each bound is far above use).
MAX_TOKENS = 1 << 20  # max_length, max_new_tokens
MAX_BATCH = 1 << 16  # sequences per optimizer step, micro-batches per step
MAX_EPOCHS = 10_000
MAX_COUNT = 10 ** 9  # steps, evaluations, rows, checkpoints
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
              "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")


def training_problems(t: TrainingSpec) -> list[str]:
    bad = []
    if not _num(t.epochs) or not 0 < t.epochs <= MAX_EPOCHS:
        bad.append(f"training.epochs: the budget must be > 0 and at most {MAX_EPOCHS:,}, got {_show(t.epochs)}")
    if not _num(t.learning_rate) or not 0 < t.learning_rate <= 1:
        bad.append(f"training.learning_rate: must be > 0 and at most 1, got {_show(t.learning_rate)}")
    for name, most in (("batch_size", MAX_BATCH), ("grad_accum", MAX_BATCH), ("evals_per_epoch", MAX_EPOCHS)):
        bad += whole_problems(f"training.{name}", getattr(t, name), 1, most)
    if _int(t.batch_size) and _int(t.grad_accum) and t.grad_accum >= 1 and t.batch_size >= 1 and t.batch_size % t.grad_accum:
        bad.append(f"training.batch_size: {t.batch_size} must be a multiple of training.grad_accum ({t.grad_accum})")
    bad += whole_problems("training.max_length", t.max_length, 8, MAX_TOKENS)
    if not _one_of(t.lr_scheduler, SCHEDULERS):
        bad.append(f"training.lr_scheduler: {_show(t.lr_scheduler)} is unknown (use {', '.join(SCHEDULERS)})")
    if not _num(t.warmup_ratio) or not 0 <= t.warmup_ratio < 1:
        bad.append(f"training.warmup_ratio: must be in [0, 1), got {_show(t.warmup_ratio)}")
    for name in ("warmup_steps", "max_steps", "eval_every", "save_total_limit"):
        bad += whole_problems(f"training.{name}", getattr(t, name), 0 if name == "warmup_steps" else 1, MAX_COUNT,
                              null=True)
    if not _num(t.weight_decay) or not 0 <= t.weight_decay <= 10:
        bad.append(f"training.weight_decay: must be ≥ 0 and at most 10, got {_show(t.weight_decay)}")
    if not _int(t.seed) or not 0 <= t.seed <= MAX_SEED:
        bad.append(f"training.seed: must be a whole number from 0 to {MAX_SEED} (what numpy and torch both take), "
                   f"got {_show(t.seed)}")
    if not isinstance(t.gradient_checkpointing, bool):
        bad.append(f"training.gradient_checkpointing: must be true or false, got {_show(t.gradient_checkpointing)}")
    if t.switch_epoch is not None:
        if not _num(t.switch_epoch) or not 0 < t.switch_epoch < (t.epochs if _num(t.epochs) else math.inf):
            bad.append(f"training.switch_epoch: must lie between 0 and training.epochs ({_show(t.epochs)}), got {_show(t.switch_epoch)}")
    if t.lora is not None:
        bad += _lora_problems(t.lora)
    if t.rerank is not None:
        bad += _rerank_problems(t)
    return bad


def whole_problems(name: str, v: Any, least: int, most: int, null: bool = False) -> list[str]:
    """The problem of a field that must be a whole number from `least` to `most` (or null, with `null`)."""
    if (v is None and null) or (_int(v) and least <= v <= most):
        return []
    return [f"{name}: must be a whole number from {least:,} to {most:,}{' or null' if null else ''}, got {_show(v)}"]


def _rerank_problems(t: TrainingSpec) -> list[str]:
    from capacity_advisor.models.ranking import RANKINGS

    r = t.rerank
    if not isinstance(r, dict):
        return [f"training.rerank: null, or an object with epochs, candidates and score, got {_show(r)}"]
    bad = []
    extra = set(r) - {"epochs", "candidates", "score"}
    if extra:
        bad.append(f"training.rerank: unknown keys {_keys(extra)} (use epochs, candidates, score)")
    epochs = r.get("epochs")
    if not (isinstance(epochs, list) and epochs and all(_int(e) and e >= 1 and (not _num(t.epochs) or e < t.epochs)
                                                        for e in epochs)):
        bad.append(f"training.rerank.epochs: whole epochs from 1 up to before training.epochs, got {_show(epochs)}")
    if not _line(r.get("candidates")):
        bad.append(f"training.rerank.candidates: the candidates file (one line of text), got {_show(r.get('candidates'))}")
    if r.get("score", "sum") not in [k for k in RANKINGS if k != "local"]:
        bad.append(f"training.rerank.score: sum, mean or rsr, got {_show(r.get('score'))}")
    if t.switch_epoch is not None:
        bad.append("training.rerank: a curriculum already switches sets at training.switch_epoch; use one or the other")
    return bad


def _lora_problems(lora: Any) -> list[str]:
    if not isinstance(lora, dict) or not _int(lora.get("r")) or not 1 <= lora["r"] <= MAX_BATCH:
        return [f"training.lora: null for full SFT, or an object with an integer r from 1 to {MAX_BATCH:,}, got {_show(lora)}"]
    bad = []
    extra = set(lora) - {"r", "alpha", "dropout", "target_modules"}
    if extra:
        bad.append(f"training.lora: unknown keys {_keys(extra)} (use r, alpha, dropout, target_modules)")
    if "alpha" in lora and (not _num(lora["alpha"]) or not 0 < lora["alpha"] <= 1e6):
        bad.append(f"training.lora.alpha: must be a number > 0 and at most 1e6, got {_show(lora['alpha'])}")
    if "dropout" in lora and (not _num(lora["dropout"]) or not 0 <= lora["dropout"] < 1):
        bad.append(f"training.lora.dropout: must be in [0, 1), got {_show(lora['dropout'])}")
    modules = lora.get("target_modules", "all-linear")
    if not (_line(modules) or (isinstance(modules, list) and modules and all(_line(m) for m in modules))):
        bad.append(f"training.lora.target_modules: must be a module name, a list of them or \"all-linear\", got {_show(modules)}")
    return bad


def _num(v: Any) -> bool:
    """A real, finite JSON number (not a bool, which JSON keeps apart but Python counts as an int)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond any float
        return False


def _int(v: Any) -> bool:
    return _num(v) and isinstance(v, int)


def _one_of(v: Any, choices: tuple[str, ...]) -> bool:
    return isinstance(v, str) and v in choices


def _line(v: Any) -> bool:
    """Text fit to be a path or model id: non-empty, one line, no control characters (which could
    also smuggle lines into the YAML and shell snippets built from it)."""
    return isinstance(v, str) and bool(v) and not _CONTROL.search(v)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _show(v: Any, width: int = 60) -> str:
    """A value as it can be quoted in one short error line, whatever its size or content."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):
        text = f"<{type(v).__name__}>"
    return text if len(text) <= width else text[:width] + f"… ({len(text):,} characters)"


def _keys(keys) -> str:
    return ", ".join(_show(k, 30) for k in sorted(keys)[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
