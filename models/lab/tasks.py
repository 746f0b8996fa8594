"""Synthetic reasoning tasks with exactly checkable answers, and the lab teacher's procedures.

Every problem is a prompt that ends with `=`; every response starts right after it and ends with
`;A<answer>` (or is just `A<answer>` for the answer-only style). Three families:

    modchain  C3+4*9-2+7=        left-to-right arithmetic mod 10; difficulty = number of operands
    addition  S457+368=          multi-digit addition with carries; difficulty = digits per operand
    listmax   M37,82,15,44=      maximum of a list of two-digit numbers; difficulty = list length

Each family has several correct *procedures* that show more or less reasoning (`direct` shows
none). The teacher samples among the reasoning procedures with random surface variation; the
pretraining corpus uses the same procedures with skewed frequencies (see `ladder.py`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from capacity_advisor.core.errors import InputError


@dataclass(frozen=True)
class Problem:
    task: str
    prompt: str
    answer: str
    data: tuple  # the family's own representation (operands, ops, …)


# --------------------------------------------------------------------------- modchain

_OPS = "+-*"


def _apply(a: int, op: str, x: int) -> int:
    return (a + x) % 10 if op == "+" else (a - x) % 10 if op == "-" else (a * x) % 10


def _raw(a: int, op: str, x: int) -> int:
    return a + x if op == "+" else a - x if op == "-" else a * x


def _modchain_problem(rng: random.Random, k: int) -> Problem:
    nums = [rng.randrange(10) for _ in range(k)]
    ops = [rng.choice(_OPS) for _ in range(k - 1)]
    text = str(nums[0]) + "".join(o + str(n) for o, n in zip(ops, nums[1:]))
    v = nums[0]
    for o, n in zip(ops, nums[1:]):
        v = _apply(v, o, n)
    return Problem("modchain", f"C{text}=", str(v), (tuple(nums), tuple(ops)))


def _modchain_values(p: Problem) -> list[int]:
    nums, ops = p.data
    vals, v = [], nums[0]
    for o, n in zip(ops, nums[1:]):
        v = _apply(v, o, n)
        vals.append(v)
    return vals


def _mc_skip(p: Problem, rng: random.Random) -> str:
    """Only every second running value: two operations per step (less reasoning shown)."""
    vals = _modchain_values(p)
    shown = vals[1::2] if len(vals) % 2 == 0 else vals[1::2] + [vals[-1]]
    sep = rng.choice(",,/")
    return "|" + sep.join(map(str, shown)) + f";A{p.answer}"


def _mc_running(p: Problem, rng: random.Random) -> str:
    """Every running value, optionally starting from the first operand."""
    vals = _modchain_values(p)
    if rng.random() < 0.5:
        vals = [p.data[0][0]] + vals
    sep = rng.choice(",,/")
    return "|" + sep.join(map(str, vals)) + f";A{p.answer}"


def _mc_explicit(p: Problem, rng: random.Random) -> str:
    """Each operation written out with its reduced result."""
    nums, ops = p.data
    steps, v = [], nums[0]
    for o, n in zip(ops, nums[1:]):
        w = _apply(v, o, n)
        steps.append(f"{v}{o}{n}={w}")
        v = w
    sep = rng.choice(",,/")
    return "|" + sep.join(steps) + f";A{p.answer}"


def _mc_full(p: Problem, rng: random.Random) -> str:
    """A different procedure: compute the exact value of each step, then reduce it mod 10."""
    nums, ops = p.data
    steps, v = [], nums[0]
    for o, n in zip(ops, nums[1:]):
        r = _raw(v, o, n)
        w = r % 10
        steps.append(f"{v}{o}{n}={r}" if r == w else f"{v}{o}{n}={r}:{w}")
        v = w
    sep = rng.choice(",,/")
    return "|" + sep.join(steps) + f";A{p.answer}"


# --------------------------------------------------------------------------- addition


def _addition_problem(rng: random.Random, d: int) -> Problem:
    lo = 10 ** (d - 1) if d > 1 else 0
    a, b = rng.randrange(lo, 10**d), rng.randrange(lo, 10**d)
    return Problem("addition", f"S{a}+{b}=", str(a + b), (a, b))


def _add_columns(p: Problem, rng: random.Random) -> tuple[list[str], list[str]]:
    a, b = p.data
    da, db = str(a)[::-1], str(b)[::-1]
    n = max(len(da), len(db))
    carry, full, short = 0, [], []
    for i in range(n):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        full.append(f"{x}+{y}+{carry}={s}" if carry else f"{x}+{y}={s}")
        carry = s // 10
        short.append(f"{s % 10}c{carry}")
    return full, short


def _ad_columns(p: Problem, rng: random.Random) -> str:
    full, _ = _add_columns(p, rng)
    return "|" + rng.choice(",,/").join(full) + f";A{p.answer}"


def _ad_digits(p: Problem, rng: random.Random) -> str:
    _, short = _add_columns(p, rng)
    return "|" + rng.choice(",,/").join(short) + f";A{p.answer}"


def _ad_places(p: Problem, rng: random.Random) -> str:
    """A different procedure: add the second number one place value at a time."""
    a, b = p.data
    steps, v = [], a
    digits = str(b)
    for i, ch in enumerate(digits):
        part = int(ch) * 10 ** (len(digits) - 1 - i)
        if part == 0 and i < len(digits) - 1:
            continue
        steps.append(f"{v}+{part}={v + part}")
        v += part
    return "|" + rng.choice(",,/").join(steps) + f";A{p.answer}"


# --------------------------------------------------------------------------- listmax


def _listmax_problem(rng: random.Random, n: int) -> Problem:
    # two-digit numbers: with single digits the answer of a long list is 9 most of the time
    xs = [rng.randrange(10, 100) for _ in range(n)]
    return Problem("listmax", "M" + ",".join(map(str, xs)) + "=", str(max(xs)), tuple(xs))


def _lm_running(p: Problem, rng: random.Random) -> str:
    m, vals = p.data[0], [p.data[0]]
    for x in p.data[1:]:
        m = max(m, x)
        vals.append(m)
    return "|" + rng.choice(",,/").join(map(str, vals)) + f";A{p.answer}"


def _lm_compare(p: Problem, rng: random.Random) -> str:
    m, steps = p.data[0], []
    for x in p.data[1:]:
        steps.append(f"{m}{'<' if m < x else '>' if m > x else '='}{x}")
        m = max(m, x)
    return "|" + rng.choice(",,/").join(steps) + f";A{p.answer}"


def _lm_sort(p: Problem, rng: random.Random) -> str:
    """A different procedure: sort, then take the last element."""
    return "|" + rng.choice(",,/").join(map(str, sorted(p.data))) + f";A{p.answer}"


def _direct(p: Problem, rng: random.Random) -> str:
    return f"A{p.answer}"


@dataclass(frozen=True)
class Family:
    name: str
    make: Callable[[random.Random, int], Problem]
    procedures: dict  # name -> fn(problem, rng) -> response; "direct" is answer-only
    default_difficulty: int
    difficulty_range: tuple[int, int]  # what the pretraining corpus covers


FAMILIES: dict[str, Family] = {
    "modchain": Family(
        "modchain",
        _modchain_problem,
        {"direct": _direct, "skip": _mc_skip, "running": _mc_running, "explicit": _mc_explicit, "full": _mc_full},
        default_difficulty=8,
        difficulty_range=(2, 8),
    ),
    "addition": Family(
        "addition",
        _addition_problem,
        {"direct": _direct, "digits": _ad_digits, "columns": _ad_columns, "places": _ad_places},
        default_difficulty=4,
        difficulty_range=(1, 4),
    ),
    "listmax": Family(
        "listmax",
        _listmax_problem,
        {"direct": _direct, "running": _lm_running, "compare": _lm_compare, "sort": _lm_sort},
        default_difficulty=8,
        difficulty_range=(2, 8),
    ),
}

# Every character any task can produce; the tokenizer is built from this (order is frozen; new
# characters are appended). `c` is the carry marker of addition's `digits` procedure.
ALPHABET = "0123456789+-*=<>|,/;:ACMSc"


def family(task: str) -> Family:
    if task not in FAMILIES:
        raise InputError(f"unknown lab task {task!r}: use one of {', '.join(FAMILIES)}")
    return FAMILIES[task]


MAX_DIFFICULTY = 32  # a problem and its worked answer must still fit a lab student's 128 positions


def make_problems(task: str, n: int, difficulty: int | None = None, seed: int = 0) -> list[Problem]:
    """`n` distinct problems of one family at one difficulty (distinct prompts where the space allows)."""
    fam = family(task)
    k = fam.default_difficulty if difficulty is None else int(difficulty)
    if not 1 <= k <= MAX_DIFFICULTY:
        raise InputError(f"--difficulty must be from 1 to {MAX_DIFFICULTY} (a lab student reads at most 128 tokens, "
                         f"and its corpus covers {fam.difficulty_range[0]}-{fam.difficulty_range[1]}), got {k}")
    rng = random.Random(f"{task}:{k}:{seed}")
    seen, out = set(), []
    for _ in range(n * 20):
        p = fam.make(rng, k)
        if p.prompt in seen:
            continue
        seen.add(p.prompt)
        out.append(p)
        if len(out) == n:
            break
    return out


def teacher_candidates(problem: Problem, n: int = 6, seed: int = 0) -> list[tuple[str, str]]:
    """`n` correct (procedure, response) pairs: procedures that show reasoning, sampled uniformly,
    with random surface variation; exact duplicates are re-drawn a few times."""
    fam = family(problem.task)
    names = [k for k in fam.procedures if k != "direct"]
    rng = random.Random(f"teacher:{problem.prompt}:{seed}")
    out, seen = [], set()
    for _ in range(n):
        for _attempt in range(6):
            name = rng.choice(names)
            text = fam.procedures[name](problem, rng)
            if text not in seen:
                break
        seen.add(text)
        out.append((name, text))
    return out


def style_of(problem: Problem, response: str) -> str:
    """Which procedure wrote `response` (for reports only; selection never looks at it)."""
    fam = family(problem.task)
    norm = response.replace("/", ",")
    for name, fn in fam.procedures.items():
        for seed in range(16):  # enough draws to cover every surface variant
            if fn(problem, random.Random(seed)).replace("/", ",") == norm:
                return name
    return "other"


_ANSWER = re.compile(r"(?:^|;)A(-?\d+)(?:$|[^0-9])")


def extract_answer(text: str) -> str | None:
    """The final answer in a response: the digits after the last `A` that starts the response or
    follows `;`. None when there is no such answer."""
    if not isinstance(text, str):
        return None
    found = _ANSWER.findall(text.strip())
    if not found:
        return None
    ans = found[-1].lstrip("0") or "0"
    return ans if not ans.startswith("-") else "-" + (ans[1:].lstrip("0") or "0")


def check(text: str, answer: str | int) -> bool:
    """True when the response's extracted answer equals the reference exactly (leading zeros aside)."""
    got = extract_answer(text)
    if got is None:
        return False
    ref = str(answer).strip()
    ref = ref.lstrip("0") or "0"
    return got == ref
