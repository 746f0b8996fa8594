"""Synthetic reasoning tasks with exactly checkable answers, and the lab teacher's procedures.

Every problem is a prompt that ends with `=`; every response starts right after it and ends with
`;A<answer>` (or is just `A<answer>` for the answer-only style). Five families:

    modchain     C3+4*9-2+7=     left-to-right arithmetic mod 10; difficulty = number of operands
    addition     S457+368=       multi-digit addition with carries; difficulty = digits per operand
    listmax      M37,82,15,44=   maximum of a list of two-digit numbers; difficulty = list length
    digitsum     :48273=         sum of the digits; difficulty = number of digits
    subtraction  S73-28=         multi-digit subtraction with borrows; difficulty = digits per operand

The lab models are pretrained on the first three only (`PRETRAINED`); the last two are new to all
of them, as a user's task is.

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


# --------------------------------------------------------------------------- digitsum


def _digitsum_problem(rng: random.Random, d: int) -> Problem:
    digits = [rng.randrange(1, 10)] + [rng.randrange(10) for _ in range(d - 1)]
    text = "".join(map(str, digits))
    return Problem("digitsum", f":{text}=", str(sum(digits)), tuple(digits))


def _ds_running(p: Problem, rng: random.Random) -> str:
    vals, v = [], 0
    for x in p.data:
        v += x
        vals.append(v)
    return "|" + rng.choice(",,/").join(map(str, vals)) + f";A{p.answer}"


def _ds_explicit(p: Problem, rng: random.Random) -> str:
    steps, v = [], p.data[0]
    for x in p.data[1:]:
        steps.append(f"{v}+{x}={v + x}")
        v += x
    return "|" + rng.choice(",,/").join(steps) + f";A{p.answer}"


def _ds_pairs(p: Problem, rng: random.Random) -> str:
    """A different procedure: the digits summed two at a time, then the pair sums."""
    pairs = [sum(p.data[i:i + 2]) for i in range(0, len(p.data), 2)]
    return "|" + rng.choice(",,/").join(map(str, pairs)) + "=" + "+".join(map(str, pairs)) + f";A{p.answer}"


# --------------------------------------------------------------------------- subtraction


def _subtraction_problem(rng: random.Random, d: int) -> Problem:
    lo = 10 ** (d - 1) if d > 1 else 0
    a, b = rng.randrange(lo, 10**d), rng.randrange(lo, 10**d)
    a, b = max(a, b), min(a, b)
    return Problem("subtraction", f"S{a}-{b}=", str(a - b), (a, b))


def _sub_columns(p: Problem) -> tuple[list[str], list[str]]:
    a, b = p.data
    da, db = str(a)[::-1], str(b)[::-1]
    borrow, full, short = 0, [], []
    for i in range(len(da)):
        x, y = int(da[i]), int(db[i]) if i < len(db) else 0
        top = x - borrow
        nxt = 1 if top < y else 0
        diff = top + 10 * nxt - y
        full.append((f"{x}-{borrow}" if borrow else f"{x}") + (f"+10-{y}={diff}" if nxt else f"-{y}={diff}"))
        short.append(f"{diff}c{nxt}")
        borrow = nxt
    return full, short


def _sb_columns(p: Problem, rng: random.Random) -> str:
    full, _ = _sub_columns(p)
    return "|" + rng.choice(",,/").join(full) + f";A{p.answer}"


def _sb_digits(p: Problem, rng: random.Random) -> str:
    _, short = _sub_columns(p)
    return "|" + rng.choice(",,/").join(short) + f";A{p.answer}"


def _sb_countup(p: Problem, rng: random.Random) -> str:
    """A different procedure: count up from the smaller number to the larger one, a place at a time."""
    a, b = p.data
    steps, v, total = [], b, 0
    for place in (10 ** k for k in range(len(str(a)) - 1, -1, -1)):
        while v + place <= a:
            n = (a - v) // place * place
            steps.append(f"{v}+{n}={v + n}")
            v, total = v + n, total + n
    return "|" + rng.choice(",,/").join(steps or [f"{b}+0={a}"]) + f";A{p.answer}"


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
    # Two families no lab model was pretrained on (PRETRAINED): a new task, as a user's always is.
    # Their difficulty_range is what fits the 96 tokens a lab model trains on, not what a corpus covered.
    "digitsum": Family(
        "digitsum",
        _digitsum_problem,
        {"direct": _direct, "running": _ds_running, "pairs": _ds_pairs, "explicit": _ds_explicit},
        default_difficulty=6,
        difficulty_range=(2, 10),
    ),
    "subtraction": Family(
        "subtraction",
        _subtraction_problem,
        {"direct": _direct, "digits": _sb_digits, "countup": _sb_countup, "columns": _sb_columns},
        default_difficulty=2,
        difficulty_range=(1, 4),
    ),
}
# The families of the lab models' pretraining corpora (models.lab.ladder): the others are new to
# every lab student and teacher. Frozen: the committed weights' recipes name these.
PRETRAINED = ("modchain", "addition", "listmax")

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
        lo, hi = fam.difficulty_range
        covers = (f"its corpus covers {lo}-{hi}" if task in PRETRAINED
                  else f"no lab model was pretrained on {task}; {lo}-{hi} trains whole in 96 tokens")
        raise InputError(f"--difficulty must be from 1 to {MAX_DIFFICULTY} (a lab student reads at most 128 tokens, "
                         f"and {covers}), got {k}")
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


# The scripted teachers (no model, no temperature): `program` writes each candidate by one reasoning
# procedure drawn uniformly; `explore` writes half of them as a worked solution checked by a second,
# different procedure — longer, exploratory responses, the kind the paper finds low-likelihood
# under a student and worth learning from as it grows; `terse` answers one candidate of each problem
# with the answer alone and writes the rest as `program` does: ranked by the summed log-likelihood the
# bare answer is the likeliest whole response, so D_high holds bare answers and D_low worked solutions
# (the shape of the pools a real instruct student ranks, docs/results.md section 8).
SCRIPTED_TEACHERS = ("program", "explore", "terse")
MAX_PAIR_TOKENS = 96  # positions a lab model trains on (BOS, prompt, response, EOS): `ladder.MAX_LENGTH`
PAIR_CHARS = MAX_PAIR_TOKENS - 2  # one token per character: the longest prompt + response trained whole
EXPLORE_SHARE = 0.5  # the share of `explore`'s candidates that check their work by a second procedure


def teacher_candidates(problem: Problem, n: int = 6, seed: int = 0, teacher: str = "program") -> list[tuple[str, str]]:
    """`n` correct (procedure, response) pairs of a scripted teacher (SCRIPTED_TEACHERS): procedures
    that show reasoning, sampled uniformly, with random surface variation; exact duplicates are
    re-drawn a few times. An `explore` candidate that checks itself is `first+second`: the first
    procedure's steps, then `;` and the second's, then the answer. `terse` puts one `direct`
    (answer-only) candidate at a drawn place among `program`'s."""
    if teacher not in SCRIPTED_TEACHERS:
        raise InputError(f"unknown scripted teacher {teacher!r}: use {' or '.join(SCRIPTED_TEACHERS)}")
    fam = family(problem.task)
    names = [k for k in fam.procedures if k != "direct"]
    seedtext = f"teacher:{problem.prompt}:{seed}" if teacher == "program" else f"{teacher}:{problem.prompt}:{seed}"
    rng = random.Random(seedtext)
    bare = rng.randrange(n) if teacher == "terse" else -1  # where `terse`'s answer-only candidate goes
    out, seen = [], set()
    for i in range(n):
        if i == bare:
            text = fam.procedures["direct"](problem, rng)
            seen.add(text)
            out.append(("direct", text))
            continue
        for _attempt in range(6):
            name = rng.choice(names)
            text = fam.procedures[name](problem, rng)
            if teacher == "explore" and rng.random() < EXPLORE_SHARE:
                second = rng.choice([k for k in names if k != name])
                checked = _steps(text) + ";" + fam.procedures[second](problem, rng)
                if len(problem.prompt) + len(checked) <= PAIR_CHARS:  # else the first alone: a student trains it whole
                    text, name = checked, f"{name}+{second}"
            if text not in seen:
                break
        seen.add(text)
        out.append((name, text))
    return out


def _steps(response: str) -> str:
    """A worked response without its final answer (`|steps`)."""
    return response.rpartition(";A")[0]


def style_of(problem: Problem, response: str) -> str:
    """Which procedure wrote `response` (for reports only; selection never looks at it); a response
    checked by a second procedure (the `explore` teacher's) is `first+second`."""
    fam = family(problem.task)
    head, sep, tail = response.partition(";|")
    if sep:
        first, second = style_of(problem, f"{head};A{problem.answer}"), style_of(problem, "|" + tail)
        return f"{first}+{second}" if "other" not in (first, second) else "other"
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
