"""Pure text metrics on generations: repetition loops, copying the question, answers.

They live in `models/` because `training/` and `probes/` both report them; one definition keeps
their numbers comparable. The `math` checker is math-verify (a dependency), or, where it is not
importable, a normalised match of the last `\\boxed{}`; `math_checker_name()` says which one runs.

    is_repetitive("so 2+2=4 so 2+2=4 so 2+2=4 so 2+2=4")  -> True
    is_copy("C3+4*9=", "C3+4*9=C3+4*9=")                   -> True
    check_answer("...;A7", "7", checker="lab")             -> True
"""

from __future__ import annotations

import re
from statistics import mean
from typing import Sequence
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.lab.tasks import FAMILIES, check, extract_answer as lab_extract

CHECKERS = ("lab", "math", "none")
CHECKER_DEFAULT = "auto"  # the lab's checker for lab tasks, math for other problems with answers, else none
CHECKER_CHOICES = (CHECKER_DEFAULT, *CHECKERS)


def longest_loop(text: str, max_period: int = 64) -> tuple[int, int]:
    """(period, span) of the longest run in which one substring repeats back to back.

    Scans every period p ≤ `max_period`: positions where text[i] == text[i + p] form runs; a run
    of length L means a block of p characters repeated (L + p) / p times over L + p characters.
    Linear in len(text) per period, so safe on long traces.
    """
    best = (0, 0)
    n = len(text)
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(n - p):
            if text[i] == text[i + p]:
                run += 1
                if run + p > best[1]:
                    best = (p, run + p)
            else:
                run = 0
    return best


def is_repetitive(text: str, min_repeats: int = 3, min_span: int = 24, max_period: int = 64) -> bool:
    """True when some block repeats at least `min_repeats` times in a row over ≥ `min_span` characters.

    The span floor keeps short legitimate repeats ("1111", "+3+3+3") from counting; a model stuck
    in a loop produces long ones.
    """
    text = text[-4000:]  # loops run to the generation limit: the tail is where they show
    period, span = longest_loop(text, max_period)
    return period > 0 and span >= min_span and span >= min_repeats * period


def repetition_rate(texts: Sequence[str], **kw) -> float:
    return mean(is_repetitive(t, **kw) for t in texts) if texts else float("nan")


_WORDS = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks: "C3+4*9=" -> C3 + 4 * 9 =


def ngram_repetition(text: str, n: int = 3) -> float | None:
    """The share of a text's word n-grams that repeat an earlier one in the same text (words and
    punctuation marks as `_WORDS` splits them): 0 where every n-gram is new, near 1 for a loop.
    None where the text has no n-gram (fewer than n words: a bare answer repeats nothing).

    Read on the training candidates themselves, it needs no model: a worked answer that restates
    each step ("so 12 + 5 = 17 ... so 17 + 5 = 22") repeats more than one that states it once."""
    words = _WORDS.findall(text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else None


# a selection's repetition figures (`advisor.scoring.select.repetition_summary`), as summaries, probe
# contexts and the probe's features name them
REPETITION_KEYS = ("trigram_repetition_high", "trigram_repetition_low", "gap_trigram_repetition")


def set_repetition(texts: Sequence[str], n: int = 3) -> float:
    """The mean `ngram_repetition` over the texts that have an n-gram (NaN where none has one)."""
    values = [v for v in (ngram_repetition(t, n) for t in texts) if v is not None]
    return mean(values) if values else float("nan")


def is_copy(prompt: str, text: str, threshold: float = 0.5) -> bool:
    """True when at least `threshold` of the generation's characters restate the question.

    A character counts as restated when it lies inside an n-gram that also occurs in the prompt
    (n = 4..8 characters by prompt length).
    """
    prompt, text = prompt.strip(), text.strip()
    if not prompt or not text:
        return False
    n = max(4, min(8, len(prompt) // 2))
    if len(text) < n or len(prompt) < n:
        return False
    grams = {prompt[i:i + n] for i in range(len(prompt) - n + 1)}
    covered = [False] * len(text)
    for i in range(len(text) - n + 1):
        if text[i:i + n] in grams:
            for j in range(i, i + n):
                covered[j] = True
    return sum(covered) / len(text) >= threshold


def copy_rate(prompts: Sequence[str], texts: Sequence[str]) -> float:
    return mean(is_copy(p, t) for p, t in zip(prompts, texts)) if texts else float("nan")


_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*\$?([^\n$]+?)\$?\s*(?:\.|$)", re.I)
_NUMBER = re.compile(r"-?\d+(?:[.,/]\d+)*")


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i, depth = starts[-1], 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_answer(text: str, checker: str = "math") -> str | None:
    """The final answer of a generation, or None (then it counts against the answer rate)."""
    if checker == "lab":
        return lab_extract(text)
    if checker == "none":
        return None
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    said = _ANSWER_IS.findall(text)
    if said:
        return said[-1].strip()
    return None


def _normalise(ans: str) -> str:
    ans = ans.strip().strip("$ .").replace(" ", "").replace("\\!", "")
    ans = re.sub(r"\\(?:text|mathrm)\{([^}]*)\}", r"\1", ans)
    ans = ans.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if re.fullmatch(r"-?\d+(?:\.\d+)?", ans):
        ans = str(float(ans)).rstrip("0").rstrip(".") if "." in ans else str(int(ans))
    return ans


def check_answer(text: str, reference: str | None, checker: str = "math") -> bool:
    """Pass@1 check of one generation against the reference answer.

    `lab` uses the lab's exact checker; `math` uses math-verify when it is installed, else a
    normalised string match of the last `\\boxed{}` / "the answer is" against the reference.
    """
    if reference is None or checker == "none":
        return False
    if checker == "lab":
        return check(text, reference)
    got = extract_answer(text, "math")
    try:
        from math_verify import parse, verify  # optional: pip install math-verify

        gold = parse("$" + str(reference) + "$")
        return bool(verify(gold, parse(text)))
    except ImportError:
        pass
    return got is not None and _normalise(got) == _normalise(str(reference))


def math_checker_name() -> str:
    try:
        import math_verify  # noqa: F401

        return "math-verify"
    except ImportError:
        return "boxed-string-match"


def answer_rate(texts: Sequence[str], checker: str) -> float:
    return mean(extract_answer(t, checker) is not None for t in texts) if texts else float("nan")


def accuracy(texts: Sequence[str], references: Sequence[str | None], checker: str) -> float:
    return mean(check_answer(t, r, checker) for t, r in zip(texts, references)) if texts else float("nan")


def choose_checker(checker: str, has_answers: bool, tasks: set[str]) -> str:
    """`auto`: the lab's checker for lab tasks, math for other problems with answers, else none."""
    if checker not in CHECKER_CHOICES:
        raise InputError(f"--checker {checker!r} is unknown: use one of {', '.join(CHECKER_CHOICES)}")
    if checker != CHECKER_DEFAULT:
        return checker
    if not has_answers:
        return "none"

    return "lab" if tasks and tasks <= set(FAMILIES) else "math"
