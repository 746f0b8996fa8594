"""Pools of real tasks for the real pretrained student: problems from DeepMind's mathematics_dataset
generators, candidates from a scripted teacher (several natural-language styles), from a
neural teacher (a fine-tuned SmolLM2-135M-Instruct sampled at temperature 1), from a
mixed-language teacher (the same worked steps in English, French or German; `place` and `round`) and
from a program teacher (`pycode`, `arith`: the solution as a short Python program and what it prints,
from one printed expression to a program that reduces it a step a line and asserts a second way).

    python -m experiments.real_pools problems --out calibration/real/problems.jsonl
    python -m experiments.real_pools scripted calibration/real/problems.jsonl --split pool --out calibration/real/pools
    python -m experiments.real_pools mixlang calibration/real/problems.jsonl --out calibration/real/pools
    python -m experiments.real_pools pycode calibration/real/problems.jsonl --out calibration/real/pools
    python -m experiments.real_pools teacher-data calibration/real/problems.jsonl --out runs/real-teacher/data.jsonl
    python -m experiments.real_pools teacher-run calibration/real/problems.jsonl --out runs/real-teacher   # + manifest

Tasks (the generators' easiest third of their difficulty range, integer answers):
- `linear`: algebra__linear_1d, "Solve 19 = -8*r - 5 for r." A solution is a short chain of
  steps (collect terms, divide); written out, it is the computation a 135M model cannot do at once.
- `place`: numbers__place_value, "What is the tens digit of 60976?" The answer is read off the
  number; a worked solution lists the places, which a terse answer leaves implicit.
- `arith`: arithmetic__add_sub_multiple, "Calculate -11 - -5 - (-3 - 3)." A chain of signed
  additions and subtractions with brackets; a worked solution reduces it one operation at a time.
  Its rows come after the other two tasks' in the problems file, so adding it left theirs as they were.
- `poly`: polynomials__evaluate of degree at most 2, "Let w(o) = 10*o - 95. Calculate w(11)." A worked
  solution substitutes the value and adds the terms one at a time; added after `arith`, the same way.
- `round`: numbers__round_number of whole numbers to a power of ten, "Round -1244 to the nearest ten."
  A worked solution reads the digit below the rounding place and rounds up or down (the exploring one
  checks it by the distances to the two nearest multiples); the wrong candidate rounds the other way.
  Halves the generator rounds otherwise than away from zero are left out. Added after `poly`.

The problem file holds three disjoint splits per task: `pool` (the calibration pools), `teacher`
(the neural teacher's fine-tuning data, never in a pool) and `spare`. The scripted teacher writes
per problem four correct candidates, one per style (`answer`, `equations`, `prose`, `explore`: from
a bare answer to a long worked solution that checks itself), each phrased one of several ways,
and one wrong candidate (a slip a solver makes), which the pool's correctness marks; every answer
ends in `\\boxed{}`, which the math checker reads. The neural teacher's pools are made by the
project's own verbs (docs/results.md, "A real pretrained student"): `advisor train` on the
teacher data (`teacher-run` writes it, its held-out check and the manifest), then `advisor
generate` from its checkpoint at step 60 (0.4 of the epoch, 960 rows: on one CPU core a step takes
45 s, and the teacher already solved 0.42 of its check problems there; the run was stopped once that
checkpoint and its evaluation were written), then `neural-pool`:

    advisor train runs/real-teacher/manifest.json --out runs/real-teacher/run --device cpu   # stopped after step 60
    python -m experiments.real_pools neural-problems calibration/real/problems.jsonl --task place --out runs/place-problems.jsonl
    advisor generate --teacher runs/real-teacher/run/checkpoint-60 --problems runs/place-problems.jsonl --n 8 --limit 330 \
        --temperature 1.0 --top-p 1.0 --max-new-tokens 272 --device cpu --out runs/place-generated.jsonl
    python -m experiments.real_pools neural-pool runs/place-generated.jsonl --out calibration/real/pools/place-neural.jsonl

The generators name their variables in an order that follows Python's string hashing, so
`problems` runs itself again under PYTHONHASHSEED=0 unless the interpreter already has it, and two
runs write the same file. The committed file predates that: its `linear` rows were drawn under an
unpinned hash and a new run draws the same questions with other letters (its `place` and `arith`
rows, which name no variable, come out identical); it is the one the pools were made from (the
`arith` rows were appended to it).

mathematics_dataset 1.0.1 imports a function sympy has since moved
(`sympy.solvers.diophantine.base_solution_linear`); `_generators` puts it back where the package
looks before importing it. Install it beside the project with `pip install mathematics_dataset==1.0.1`.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

TASKS = {"linear": "algebra__linear_1d", "place": "numbers__place_value", "arith": "arithmetic__add_sub_multiple",
         "poly": "polynomials__evaluate", "round": "numbers__round_number"}
NEURAL_TASKS = ("linear", "place")  # the tasks the neural teacher is fine-tuned and checked on
SPLITS = {"pool": 300, "teacher": 600, "spare": 200}  # problems per task in each split
SEED = 2026
STYLES = ("answer", "equations", "prose", "explore")
SPARE_FOR_POOLS = 150  # spare problems a neural pool may use beyond the pool split (the rest check the teacher)
TEACHER_STYLES = 2  # styles per problem in the neural teacher's fine-tuning data


def _generators():
    """The mathematics_dataset modules by name, at the easiest third of each one's entropy range."""
    import importlib

    try:
        diophantine = importlib.import_module("sympy.solvers.diophantine")
        if not hasattr(diophantine, "base_solution_linear"):
            diophantine.base_solution_linear = importlib.import_module(
                "sympy.solvers.diophantine.diophantine").base_solution_linear
        from mathematics_dataset.modules import modules
    except ImportError as e:
        raise SystemExit(f"error: the problems come from mathematics_dataset ({e}): pip install mathematics_dataset==1.0.1")

    def easiest(entropy):
        low, high = entropy
        return low, low + (high - low) / 3

    flat = {}

    def walk(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}__")
            else:
                flat[prefix + key] = value

    walk(modules.train(easiest))
    return flat


def make_problems(seed: int = SEED) -> list[dict]:
    """Every split of every task: distinct questions with integer answers, in a seeded order."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    gens = _generators()
    rows, seen = [], set()
    for task, module in TASKS.items():
        want = sum(SPLITS.values())
        got: list[dict] = []
        while len(got) < want:
            p = gens[module]()
            question, answer = str(p.question).strip(), str(p.answer).strip()
            parsed = parse(task, question) if re.fullmatch(r"-?\d+", answer) else None
            if question in seen or parsed is None or (task == "round" and parsed["x"] != int(answer)):
                continue  # (`round`: a half the generator rounds otherwise than away from zero is left out)
            seen.add(question)
            got.append({"problem": question, "answer": answer, "task": task})
        start = 0
        for split, n in SPLITS.items():
            for i, r in enumerate(got[start:start + n]):
                rows.append({"id": f"{task}-{split}-{i}", **r, "split": split})
            start += n
    return rows


# ---- the scripted teacher ------------------------------------------------------------------------

LINEAR = re.compile(r"Solve (?P<eq>.+=.+) for (?P<v>[a-z])\.")
ARITH = re.compile(r"(?:(?:What is|Calculate|Evaluate|Work out)\s+)?(?P<e>[-\d\s+()]+?)\s*[?.]?")
PLACE = re.compile(r"What is the (?P<place>[a-z ]+) digit of (?P<n>\d+)\?")
POLY = re.compile(r"Let (?P<f>[a-z])\((?P<v>[a-z])\) = (?P<e>[-+*\d\sa-z]+)\. "
                  r"(?:What is (?P=f)\((?P<x1>-?\d+)\)\?|(?:Give|Determine|Calculate) (?P=f)\((?P<x2>-?\d+)\)\.)")
POLY_TERM = re.compile(r"(?P<sign>[+-]?)(?P<c>\d+)?(?:(?(c)\*)(?P<v>[a-z])(?:\*\*(?P<k>\d+))?)?")
POLY_DEGREE = 2  # the highest power a `poly` problem may hold: the generators' cubics are left out
PLACES = ("units", "tens", "hundreds", "thousands", "ten thousands", "hundred thousands", "millions")
ROUND = re.compile(r"(?:Round (?P<n1>-?\d+) to the nearest (?P<m1>[a-z0-9 ]+)\.|"
                   r"What is (?P<n2>-?\d+) rounded to the nearest (?P<m2>[a-z0-9 ]+)\?)")
ROUND_WORDS = {"ten": 10, "one hundred": 100, "one thousand": 1000, "ten thousand": 10_000,
               "one hundred thousand": 100_000, "one million": 1_000_000}


def parse(task: str, question: str) -> dict | None:
    """What a solution needs of a question: for `linear`, the two sides and the variable with
    a*v + b = 0 (integers); for `place`, the number and the place. None for a question of another form."""
    if task == "linear":
        m = LINEAR.fullmatch(question)
        if not m:
            return None
        left, right = (side.strip() for side in m["eq"].split("=", 1))
        a, b = _linear(f"({left}) - ({right})", m["v"])
        if a is None or a == 0 or Fraction(-b, a).denominator != 1:
            return None
        return {"left": left, "right": right, "v": m["v"], "a": a, "b": b, "x": -b // a}
    if task == "poly":
        return _poly(question)
    if task == "round":
        return _round(question)
    if task == "arith":
        m = ARITH.fullmatch(question)
        if not m or not re.search(r"\d", m["e"]):
            return None
        try:
            steps = arith_steps(m["e"])
        except (ValueError, SyntaxError):
            return None
        return {"e": " ".join(m["e"].split()), "steps": steps, "x": steps[-1][1]}
    m = PLACE.fullmatch(question)
    if not m or m["place"] not in PLACES or PLACES.index(m["place"]) >= len(m["n"]):
        return None
    return {"n": m["n"], "place": m["place"], "k": PLACES.index(m["place"])}


def _round(question: str) -> dict | None:
    """For `round`: the whole number, the power of ten it is rounded to, the kept part and the rest
    (of its magnitude), and the result, halves away from zero; None for a decimal number or another
    form."""
    m = ROUND.fullmatch(question)
    if not m:
        return None
    n, unit = int(m["n1"] or m["n2"]), (m["m1"] or m["m2"]).strip()
    step = int(unit) if unit.isdigit() else ROUND_WORDS.get(unit)
    if not step or step < 10 or str(step).rstrip("0") != "1":
        return None
    mag, sign = abs(n), -1 if n < 0 else 1
    kept, rest = mag - mag % step, mag % step
    up = 2 * rest >= step
    x = sign * (kept + step if up else kept)
    return {"n": n, "unit": unit, "step": step, "kept": kept, "rest": rest, "up": up, "x": x,
            "other": sign * (kept if up else kept + step)}


def _poly(question: str) -> dict | None:
    """For `poly`: the function's name, variable and value, and its terms as (coefficient, power) in
    the order written; None for another form, a power above POLY_DEGREE, or terms whose sum is
    not what the expression evaluates to."""
    m = POLY.fullmatch(question)
    if not m:
        return None
    v, e = m["v"], "".join(m["e"].split())
    x = int(m["x1"] if m["x1"] is not None else m["x2"])
    terms = []
    for raw in re.findall(r"[+-]?[^+-]+", e):
        t = POLY_TERM.fullmatch(raw)
        if not t or (t["v"] is not None and t["v"] != v) or (t["c"] is None and t["v"] is None):
            return None
        k = 0 if t["v"] is None else int(t["k"] or 1)
        c = int(t["c"] or 1) * (-1 if t["sign"] == "-" else 1)
        if k > POLY_DEGREE:
            return None
        terms.append((c, k))
    if not terms:
        return None
    text = re.sub(rf"\b{v}\b", f"({x})", e)
    if not re.fullmatch(r"[\d+\-*()]+", text):
        return None
    value = int(eval(text, {"__builtins__": {}}, {}))  # digits, signs, * and ** only, checked above
    if sum(c * x ** k for c, k in terms) != value:
        return None
    return {"f": m["f"], "v": v, "e": m["e"], "x": x, "terms": terms, "value": value}


def _linear(expr: str, v: str) -> tuple[int | None, int]:
    """(a, b) with expr == a*v + b, from evaluating the expression at v = 0 and v = 1."""
    def at(x: int) -> Fraction:
        text = re.sub(rf"\b{v}\b", f"({x})", expr)
        if not re.fullmatch(r"[\d\s+\-*/()]+", text) or "**" in text:
            raise ValueError(text)
        return Fraction(eval(text, {"__builtins__": {}}, {}))  # digits and operators only, checked above

    try:
        b, one = at(0), at(1)
    except (ValueError, SyntaxError, ZeroDivisionError):
        return None, 0
    a = one - b
    if a.denominator != 1 or b.denominator != 1:
        return None, 0
    return int(a), int(b)


ATOM = r"-?\d+"
PAIR = re.compile(rf"(?P<a>{ATOM})\s*(?P<op>[+-])\s*(?P<b>{ATOM})")


def arith_steps(expr: str, slip: bool = False) -> list[tuple[str, int]]:
    """The expression reduced one operation at a time, innermost brackets first and left to right:
    [(the expression after the step, its value)], the last value the answer. `slip` reads every
    `- -n` as `- n` (the wrong candidate's sign slip)."""
    if not re.fullmatch(r"[-\d\s+()]+", expr):
        raise ValueError(expr)
    e = " ".join(expr.split())
    value = int(eval(e, {"__builtins__": {}}, {}))  # digits, signs and brackets only, checked above
    out = []
    for _ in range(64):
        e = re.sub(r"\((-?\d+)\)", r"\1", e)  # a bracket around one number is that number
        inner = re.search(r"\(([^()]*)\)", e)
        span = inner.span(1) if inner else (0, len(e))
        m = PAIR.search(e, *span)
        if not m:
            break
        a, b = int(m["a"]), int(m["b"])
        r = a + b if m["op"] == "+" else (a + b if slip and b < 0 else a - b)
        e = e[:m.start()] + str(r) + e[m.end():]
        e = re.sub(r"\((-?\d+)\)", r"\1", e)
        out.append((e, r))
    if not re.fullmatch(ATOM, e):
        raise ValueError(expr)
    if not slip and int(e) != value:
        raise ValueError(expr)
    return out or [(e, int(e))]


def flat_terms(expr: str) -> list[int]:
    """The expression's numbers with the signs its brackets and minus signs give them: a second
    procedure the exploring style checks the reduction by (their sum is the value)."""
    stack, pending, out = [1], 1, []
    for tok in re.findall(r"\d+|[-+()]", expr):
        if tok == "-":
            pending = -pending
        elif tok == "(":
            stack.append(stack[-1] * pending)
            pending = 1
        elif tok == ")":
            stack.pop()
        elif tok != "+":
            out.append(stack[-1] * pending * int(tok))
            pending = 1
    return out


def arith_solution(p: dict, style: str, rng: random.Random, slip: bool = False) -> str:
    """A solution of `style`; `slip` reduces with the sign slip (the wrong candidate)."""
    steps = arith_steps(p["e"], slip) if slip else p["steps"]
    x = steps[-1][1]
    box = f"\\boxed{{{x}}}"
    if style == "answer":
        return rng.choice([f"{p['e']} = {x}\n{box}", f"The answer is {box}.", f"{box}"])
    if style == "equations":
        return "\n".join([p["e"], *(f"= {e}" for e, _ in steps), box])
    if style == "prose":
        lead = rng.choice(["Working from the innermost brackets outwards", "One operation at a time",
                           "Reducing it step by step"])
        return (f"{lead}: " + ", then ".join(e for e, _ in steps) + f". So the answer is {box}.")
    start = rng.choice(["Let me work through this carefully.", "I'll take it one operation at a time.",
                        "Let's reduce the expression step by step."])
    lines = [start, f"The expression is {p['e']}."]
    for i, (e, _) in enumerate(steps, 1):
        lines.append(f"Step {i}: it becomes {e}.")
    terms = flat_terms(p["e"])
    pos, neg = sum(t for t in terms if t > 0), sum(t for t in terms if t < 0)
    lines.append("Let me check it another way: opening every bracket, the terms are "
                 + ", ".join(f"{t:+d}" for t in terms) + f". The positive ones add to {pos}, the negative "
                 f"ones to {neg}, and {pos} + {neg} = {pos + neg}. "
                 + ("That matches." if pos + neg == x else "That does not match; I'll keep the first result."))
    lines.append(f"The answer is {box}.")
    return "\n".join(lines)


def _term_text(c: int, k: int, v: str, at: str | None = None) -> str:
    """A term as written (`3*t**2`), or with the value in place of the variable (`3*(-2)**2`)."""
    base = v if at is None else (f"({at})" if at.startswith("-") else at)
    if k == 0:
        return str(abs(c))
    power = base if k == 1 else f"{base}**{k}"
    return power if abs(c) == 1 and at is None else f"{abs(c)}*{power}"


def poly_solution(p: dict, style: str, rng: random.Random, slip: bool = False) -> str:
    """A solution of `style`; `slip` gets the sign of the last term wrong (the wrong candidate)."""
    f, v, x = p["f"], p["v"], p["x"]
    terms = list(p["terms"])
    if slip:
        c, k = terms[-1]
        terms[-1] = (-c, k)
    vals = [c * x ** k for c, k in terms]
    y = sum(vals)
    call, box = f"{f}({x})", f"\\boxed{{{y}}}"
    signed = lambda i, text: (("-" if terms[i][0] < 0 else "") + text) if i == 0 else (
        (" - " if terms[i][0] < 0 else " + ") + text)
    put = "".join(signed(i, _term_text(c, k, v, str(x))) for i, (c, k) in enumerate(terms))
    parts = str(vals[0]) + "".join((" - " if val < 0 else " + ") + str(abs(val)) for val in vals[1:])  # the terms' values
    if style == "answer":
        return rng.choice([f"{call} = {y}\n{box}", f"The answer is {box}.", f"{box}"])
    if style == "equations":
        lines = [f"{call} = {put}"] + ([f"= {parts}"] if len(terms) > 1 else []) + [f"= {y}", box]
        return "\n".join(lines)
    if style == "prose":
        lead = rng.choice([f"Substitute {v} = {x}", f"Put {x} in place of {v}", f"Replace {v} by {x}"])
        each = ", ".join(f"{'-' if c < 0 else ''}{_term_text(c, k, v, str(x))} = {val}" for (c, k), val in zip(terms, vals) if k)
        return (f"{lead}: {call} = {put}" + (f", where {each}" if each else "") + f". Adding up: {parts} = {y}. "
                f"So the answer is {box}.")
    start = rng.choice(["Let me evaluate this step by step.", "Let's work it out term by term.",
                        "I'll substitute and add the terms one at a time."])
    lines = [start, f"The function is {f}({v}) = {p['e']}, and I need {call}.", f"Substituting {v} = {x}: {call} = {put}."]
    total = 0
    for i, ((c, k), val) in enumerate(zip(terms, vals), 1):
        if k:
            lines.append(f"Term {i}: {'-' if c < 0 else ''}{_term_text(c, k, v, str(x))}"
                         + (f" = {'-' if c < 0 else ''}{abs(c)}*{x ** k}" if k > 1 and abs(c) != 1 else "")
                         + f" = {val}.")
        else:
            lines.append(f"Term {i}: the constant {val}.")
        total += val
        if i > 1:
            lines.append(f"Running total: {total - val} + ({val}) = {total}.")
    # a second procedure: Horner's rule, from the highest power down
    coef = {k: 0 for k in range(max(k for _, k in terms) + 1)}
    for c, k in terms:
        coef[k] += c
    acc, steps = 0, []
    for k in sorted(coef, reverse=True):
        acc = acc * x + coef[k]
        steps.append(str(acc))
    lines.append(f"Let me check it another way, nesting the powers: " + " -> ".join(steps) + ". "
                 + ("That matches." if acc == y else "That does not match; I'll keep the first result."))
    lines.append(f"The answer is {box}.")
    return "\n".join(lines)


def round_solution(p: dict, style: str, rng: random.Random, wrong: bool = False) -> str:
    """A solution of `style`; `wrong` rounds the other way (the wrong candidate)."""
    n, step, kept, rest = p["n"], p["step"], p["kept"], p["rest"]
    up = p["up"] != wrong
    x = p["other"] if wrong else p["x"]
    box = f"\\boxed{{{x}}}"
    digit = rest * 10 // step  # the first digit below the rounding place
    if style == "answer":
        return rng.choice([f"{n} rounds to {x}.\n{box}", f"The answer is {box}.", f"{box}"])
    if style == "equations":
        return f"{n} = {'-' if n < 0 else ''}({kept} + {rest})\n{rest} {'>=' if up else '<'} {step // 2}\n{n} -> {x}\n{box}"
    way = "up" if up else "down"
    if style == "prose":
        lead = rng.choice([f"To the nearest {step}", f"Rounding {n} to the nearest {step}", f"Keeping {n} to the nearest {step}"])
        return (f"{lead}: the digit after the {step}s place is {digit}, which is {'5 or more' if up else 'less than 5'}, "
                f"so it rounds {way}{' in size' if n < 0 else ''} to {x}. So the answer is {box}.")
    start = rng.choice(["Let me work through the rounding carefully.", "Let's round it step by step.",
                        "I'll look at the digits around the rounding place."])
    size = abs(n)
    near = (kept, kept + step)
    return (f"{start}\nThe number is {n}" + (f", so I round its size, {size}, and keep the minus sign" if n < 0 else "")
            + f".\nThe two nearest multiples of {step} are {near[0]} and {near[1]}.\n"
            f"The part below the {step}s place is {rest}; half of {step} is {step // 2}.\n"
            f"The first digit of that part is {digit}, so {rest} is {'at least' if up else 'below'} half, and I round {way}.\n"
            f"Let me check by distances: {size} is {size - near[0]} from {near[0]} and {near[1] - size} from {near[1]}; "
            f"the {'second' if up else 'first'} is {'no farther' if up else 'nearer'}"
            + (", which matches." if (size - near[0] >= near[1] - size) == up else ", which does not match; I'll keep the first result.")
            + f"\nThe answer is {box}.")


def _value(side: str, v: str, x: int) -> int:
    return int(Fraction(eval(re.sub(rf"\b{v}\b", f"({x})", side), {"__builtins__": {}}, {})))


def linear_solution(p: dict, style: str, rng: random.Random, x: int | None = None) -> str:
    """A solution of `style`; `x` other than the root makes the one wrong candidate (a sign slip)."""
    v, a, b = p["v"], p["a"], p["b"]
    x = p["x"] if x is None else x
    c = a * x  # a*v = c
    box = f"\\boxed{{{x}}}"
    if style == "answer":
        return rng.choice([f"{v} = {x}\n{box}", f"The answer is {box}.", f"{box}"])
    if style == "equations":
        return rng.choice([f"{p['left']} = {p['right']}\n{a}*{v} = {c}\n{v} = {c}/{a} = {x}\n{box}",
                           f"{a}*{v} = {c}\n{v} = {x}\n{box}"])
    if style == "prose":
        first = rng.choice(["Move the terms with {v} to one side and the numbers to the other",
                            "Collect the {v} terms on the left and the constants on the right",
                            "Bring every {v} term to the left and every number to the right"]).format(v=v)
        return (f"{first}: {a}*{v} = {c}. Divide both sides by {a}: {v} = {c}/{a} = {x}. "
                f"So the answer is {box}.")
    start = rng.choice(["Let me solve this step by step.", "Let's work through it carefully.",
                        "I'll solve it one step at a time."])
    left, right = _value(p["left"], v, x), _value(p["right"], v, x)
    check = (f"Check: with {v} = {x}, the left side is {left} and the right side is {right}. "
             + ("They are equal, so the solution is right." if left == right else "Hmm, they differ; I'll keep it anyway."))
    return (f"{start}\nThe equation is {p['left']} = {p['right']}.\n"
            f"Subtracting the right side from the left gives {a}*{v} + {b} = 0 (collecting terms).\n"
            f"So {a}*{v} = {c}. Let me make sure of the sign: {b} moved across the equals sign becomes {-b}. "
            f"Yes, {a}*{v} = {c}.\nDividing both sides by {a}: {v} = {c}/{a} = {x}.\n{check}\n"
            f"The answer is {box}.")


def place_solution(p: dict, style: str, rng: random.Random, k: int | None = None) -> str:
    """A solution of `style`; `k` other than the place reads a neighbouring digit (the wrong candidate)."""
    n, place = p["n"], p["place"]
    k = p["k"] if k is None else k
    d = n[len(n) - 1 - k]
    box = f"\\boxed{{{d}}}"
    if style == "answer":
        return rng.choice([f"The {place} digit is {box}.", f"{box}", f"{d}\n{box}"])
    if style == "equations":
        return f"{n}: {place} digit = {d}\n{box}"
    digits = [(PLACES[i], n[len(n) - 1 - i]) for i in range(len(n))]
    listed = ", ".join(f"{digit} is the {name} digit" for name, digit in digits[:k + 1])
    if style == "prose":
        head = rng.choice([f"Reading {n} from the right", f"From the right of {n}", f"Counting the digits of {n} from the right"])
        return f"{head}: {listed}. The {place} digit is {d}, so the answer is {box}."
    start = rng.choice(["Let me think about the place values.", "Let's look at each place in turn.",
                        "I'll write out the place of every digit."])
    expansion = " + ".join(f"{digit}*{10 ** i}" if i else digit for i, (_, digit) in reversed(list(enumerate(digits))))
    every = ", ".join(f"{name} {digit}" for name, digit in digits)
    return (f"{start}\nThe number is {n}. Reading from the right, the places are: {every}.\n"
            f"As a sum, {n} = {expansion}.\nThe {place} place is place number {k + 1} from the right, and it "
            f"holds {d}.\nLet me double-check by counting again: " + ", ".join(x for _, x in digits[:k + 1])
            + f". The last of these is {d}.\nThe answer is {box}.")


# ---- the mixed-language teacher ------------------------------------------------------------------
# A teacher whose worked solutions all carry the same reasoning, written in English or, as a model
# that mixes languages writes them, in French or German (DeepSeek-R1-Zero mixes languages in its
# reasoning, arXiv 2501.12948). Under an English-first student the foreign ones are the
# low-likelihood candidates, but they hold no more steps than the English ones (a little longer in characters):
# the pool asks whether the advice tells a low-likelihood set that differs only in form from one that
# reasons more. No candidate is a bare answer (the scripted teacher's `answer` style), so both sets
# hold the same worked steps.

MIXLANG_TASKS = ("place", "round")
MIXLANG_STYLES = ("prose", "steps", "french", "german")
PLACES_FR = ("unités", "dizaines", "centaines", "milliers", "dizaines de milliers", "centaines de milliers", "millions")
PLACES_DE = ("Einer", "Zehner", "Hunderter", "Tausender", "Zehntausender", "Hunderttausender", "Millionen")


def place_mixlang_solution(p: dict, style: str, rng: random.Random, k: int | None = None) -> str:
    """A worked solution in `style`: the digits listed from the right up to the asked place, then the
    answer; `k` other than the place reads another digit (the wrong candidate)."""
    n = p["n"]
    k = p["k"] if k is None else k
    d = n[len(n) - 1 - k]
    box = f"\\boxed{{{d}}}"
    digits = [n[len(n) - 1 - i] for i in range(k + 1)]
    asked = p["k"]  # the conclusion names the asked place, whichever digit it reads
    if style == "prose":
        return place_solution(p, "prose", rng, k)
    if style == "steps":
        head = rng.choice([f"Digits of {n} from the right:", f"{n}, digit by digit from the right:",
                           f"The places of {n}, from the right:"])
        rows = [f"{PLACES[i]}: {x}" for i, x in enumerate(digits)]
        return "\n".join([head, *rows, f"The {PLACES[asked]} digit is {d}.", box])
    if style == "french":
        head = rng.choice([f"En lisant {n} de droite à gauche", f"De droite à gauche dans {n}",
                           f"En comptant les chiffres de {n} depuis la droite"])
        listed = ", ".join(f"{x} est le chiffre des {PLACES_FR[i]}" for i, x in enumerate(digits))
        return f"{head} : {listed}. Le chiffre des {PLACES_FR[asked]} est {d}, donc la réponse est {box}."
    head = rng.choice([f"Wir lesen {n} von rechts", f"Von rechts gelesen in {n}",
                       f"Wir zählen die Ziffern von {n} von rechts"])
    listed = ", ".join(f"{x} steht an der {PLACES_DE[i]}stelle" for i, x in enumerate(digits))
    return f"{head}: {listed}. An der {PLACES_DE[asked]}stelle steht {d}, also lautet die Antwort {box}."


def round_mixlang_solution(p: dict, style: str, rng: random.Random, wrong: bool = False) -> str:
    """A worked rounding in `style`: the digit below the rounding place, which way it sends the number,
    the result; `wrong` rounds the other way (the wrong candidate)."""
    n, step = p["n"], p["step"]
    up = p["up"] != wrong
    x = p["other"] if wrong else p["x"]
    box = f"\\boxed{{{x}}}"
    digit = p["rest"] * 10 // step
    if style == "prose":
        return round_solution(p, "prose", rng, wrong)
    if style == "steps":
        head = rng.choice([f"{n} to the nearest {step}:", f"Rounding {n} to the nearest {step}:",
                           f"The nearest {step} to {n}:"])
        return "\n".join([head, f"digit after the {step}s place: {digit}",
                          f"{digit} {'>= 5: round up' if up else '< 5: round down'}{' in size' if n < 0 else ''}",
                          f"result: {x}", box])
    if style == "french":
        head = rng.choice([f"Pour arrondir {n} à {step} près", f"En arrondissant {n} au multiple de {step} le plus proche",
                           f"Arrondi de {n} à {step} près"])
        return (f"{head} : le chiffre après la position des {step} est {digit}, "
                f"{'donc on arrondit au-dessus' if up else 'donc on arrondit en dessous'}"
                f"{' en valeur absolue' if n < 0 else ''}, ce qui donne {x}. La réponse est donc {box}.")
    head = rng.choice([f"Um {n} auf {step} zu runden", f"Wir runden {n} auf {step}", f"Gerundet auf {step}"])
    return (f"{head}: die Ziffer nach der {step}er-Stelle ist {digit}, "
            f"{'also wird aufgerundet' if up else 'also wird abgerundet'}{' (dem Betrag nach)' if n < 0 else ''}, "
            f"das ergibt {x}. Die Antwort ist also {box}.")


PYCODE_TASKS = ("arith",)
PYCODE_STYLES = ("print", "lines", "comments", "checked")  # from one printed expression to a program that checks itself


def arith_pycode_solution(p: dict, style: str, rng: random.Random, slip: bool = False) -> str:
    """The program teacher: a solution written as a short Python program and what it prints, then the
    boxed answer. `print` evaluates the expression at once; `lines` rewrites it one reduction per line;
    `comments` does the same with a comment on each step; `checked` also recomputes it from the signed
    terms and asserts the two agree. `slip` reduces with the sign slip (the wrong candidate)."""
    steps = arith_steps(p["e"], slip) if slip else p["steps"]
    x = steps[-1][1]
    box = f"\\boxed{{{x}}}"
    name = rng.choice(["x", "value", "result", "total"])
    if style == "print":
        return rng.choice([f"print({p['e']})\n# {x}\n{box}", f">>> {p['e']}\n{x}\n{box}"])
    lines = [f"{name} = {p['e']}"]
    for i, (e, _) in enumerate(steps, 1):
        note = f"  # step {i}: one operation, innermost brackets first" if style != "lines" else ""
        lines.append(f"{name} = {e}{note}")
    if style == "checked":
        terms = flat_terms(p["e"])
        lines += [f"terms = [{', '.join(str(t) for t in terms)}]  # every bracket opened, signs carried in",
                  f"assert sum(terms) == {name}" + ("" if sum(terms) == x else "  # fails: keep the step-by-step value")]
    lines.append(f"print({name})  # {x}")
    head = {"lines": "", "comments": rng.choice(["Reducing it in Python, one step per line:\n",
                                                 "As a program that does one operation at a time:\n"]),
            "checked": rng.choice(["Let me write it as a program and check it a second way:\n",
                                   "A program that reduces it step by step, then checks the sum of the terms:\n"])}[style]
    return f"{head}```python\n" + "\n".join(lines) + f"\n```\nIt prints {x}.\n{box}"


def pycode_candidates(row: dict, rng: random.Random) -> tuple[list[str], list[bool], list[str]]:
    """(candidates, correctness, styles): the program teacher's four styles shuffled, and one wrong
    candidate (the sign slip, or an off-by-one in the last step where there is no `- -n`)."""
    if row["task"] not in PYCODE_TASKS:
        raise ValueError(f"the program teacher writes {', '.join(PYCODE_TASKS)} only, not {row['task']}")
    p = parse(row["task"], row["problem"])
    out = [(arith_pycode_solution(p, s, rng), True, s) for s in PYCODE_STYLES]
    out.append((arith_wrong(p, arith_pycode_solution, rng.choice(("lines", "comments")), rng), False, "wrong"))
    return _shuffled(out, rng)


def arith_wrong(p: dict, solve, style: str, rng: random.Random) -> str:
    """An `arith` teacher's wrong candidate in `style` (`solve`: the teacher's solution writer): the
    sign slip, or, where there is no `- -n` to slip on, an off-by-one in the last step."""
    if arith_steps(p["e"], slip=True)[-1][1] == p["x"]:
        return solve({**p, "steps": [*p["steps"][:-1], (str(p["x"] + 1), p["x"] + 1)]}, style, rng)
    return solve(p, style, rng, slip=True)


POOL_TEACHERS = {"scripted": "scripted", "mixlang": "mixed-language", "pycode": "program"}  # the verbs that write pools
TEACHER_TASKS = {"scripted": tuple(TASKS), "mixlang": MIXLANG_TASKS, "pycode": PYCODE_TASKS}


def place_slip(p: dict) -> int | None:
    """The place a wrong `place` candidate reads: the next one up where its digit differs from the asked
    one's, else the first from the right that differs; None where every digit is the same."""
    n, k = p["n"], p["k"]
    if k + 1 < len(n) and n[-2 - k] != n[-1 - k]:
        return k + 1
    return next((j for j in range(len(n)) if n[-1 - j] != n[-1 - k]), None)


def mixlang_candidates(row: dict, rng: random.Random) -> tuple[list[str], list[bool], list[str]]:
    """(candidates, correctness, styles): the four styles in a shuffled order, and one wrong candidate
    (another digit read: the next place up where it differs, else the first from the right that
    differs; in English or in one of the other languages)."""
    if row["task"] not in MIXLANG_TASKS:
        raise ValueError(f"the mixed-language teacher writes {', '.join(MIXLANG_TASKS)} only, not {row['task']}")
    p = parse(row["task"], row["problem"])
    if row["task"] == "round":
        out = [(round_mixlang_solution(p, s, rng), True, s) for s in MIXLANG_STYLES]
        out.append((round_mixlang_solution(p, rng.choice(MIXLANG_STYLES), rng, wrong=True), False, "wrong"))
        return _shuffled(out, rng)
    out = [(place_mixlang_solution(p, s, rng), True, s) for s in MIXLANG_STYLES]
    wrong = place_slip(p)
    if wrong is not None:
        out.append((place_mixlang_solution(p, rng.choice(MIXLANG_STYLES), rng, wrong), False, "wrong"))
    return _shuffled(out, rng)


def scripted_candidates(row: dict, rng: random.Random) -> tuple[list[str], list[bool], list[str]]:
    """(candidates, correctness, styles): the four styles in a shuffled order, and one wrong candidate."""
    p = parse(row["task"], row["problem"])
    if row["task"] == "poly":
        out = [(poly_solution(p, s, rng), True, s) for s in STYLES]
        if p["terms"][-1][0] * p["x"] ** p["terms"][-1][1]:  # a last term of value 0 has no sign to slip
            out.append((poly_solution(p, rng.choice(("equations", "prose")), rng, slip=True), False, "wrong"))
        return _shuffled(out, rng)
    if row["task"] == "round":
        out = [(round_solution(p, s, rng), True, s) for s in STYLES]
        out.append((round_solution(p, rng.choice(("equations", "prose")), rng, wrong=True), False, "wrong"))
        return _shuffled(out, rng)
    if row["task"] == "arith":
        out = [(arith_solution(p, s, rng), True, s) for s in STYLES]
        out.append((arith_wrong(p, arith_solution, rng.choice(("equations", "prose")), rng), False, "wrong"))
        return _shuffled(out, rng)
    solve = linear_solution if row["task"] == "linear" else place_solution
    out = [(solve(p, s, rng), True, s) for s in STYLES]
    if row["task"] == "linear":
        wrong = -p["x"] if p["x"] != 0 else 1
    else:
        wrong = place_slip(p)
    if wrong is not None:
        out.append((solve(p, rng.choice(("equations", "prose")), rng, wrong), False, "wrong"))
    return _shuffled(out, rng)


def _shuffled(out: list[tuple[str, bool, str]], rng: random.Random) -> tuple[list[str], list[bool], list[str]]:
    """(candidates, correctness, styles) of (text, correct, style) triples, in an order `rng` shuffles."""
    rng.shuffle(out)
    return [t for t, _, _ in out], [ok for _, ok, _ in out], [s for _, _, s in out]


def scripted_pool(rows: list[dict], task: str, seed: int = SEED, teacher: str = "scripted") -> list[dict]:
    """The pool split of `task` with the candidates of `teacher` (`scripted`, `mixlang` or `pycode`)."""
    from capacity_advisor.training.text_metrics import check_answer

    write = {"scripted": scripted_candidates, "mixlang": mixlang_candidates, "pycode": pycode_candidates}[teacher]
    rng = random.Random(f"{seed}-{task}" if teacher == "scripted" else f"{seed}-{task}-{teacher}")
    out = []
    for r in rows:
        if r["task"] != task or r["split"] != "pool":
            continue
        texts, ok, styles = write(r, rng)
        for t, good in zip(texts, ok):  # the teacher's promise, checked rather than assumed
            assert check_answer(t, r["answer"], "math") == good, (r["problem"], t)
        out.append({"id": r["id"], "task": task, "problem": r["problem"], "answer": r["answer"],
                    "generations": texts, "correctness": ok, "styles": styles})
    return out


def teacher_data(rows: list[dict], seed: int = SEED) -> list[dict]:
    """TRL prompt/completion rows for the neural teacher: two correct styles, drawn at random, of
    every problem of the `teacher` split, both tasks, shuffled."""
    rng = random.Random(f"{seed}-teacher")
    out = []
    for r in rows:
        if r["split"] != "teacher" or r["task"] not in NEURAL_TASKS:
            continue
        texts, ok, _ = scripted_candidates(r, rng)
        good = [t for t, right in zip(texts, ok) if right]
        out += [{"id": f"{r['id']}-{i}", "prompt": r["problem"], "completion": t}
                for i, t in enumerate(rng.sample(good, TEACHER_STYLES))]
    rng.shuffle(out)
    return out


TEACHER_CHECK = 32  # per task: the last spare problems, never in a pool, check the neural teacher as it trains


def teacher_check(rows: list[dict]) -> list[dict]:
    """The neural teacher's held-out problems: the last TEACHER_CHECK spare problems of each task."""
    first = SPLITS["spare"] - TEACHER_CHECK
    return [{"prompt": r["problem"], "answer": r["answer"], "task": r["task"]} for r in rows
            if r["split"] == "spare" and r["task"] in NEURAL_TASKS and int(r["id"].rsplit("-", 1)[1]) >= first]


def teacher_manifest() -> dict:
    """The neural teacher's fine-tuning: the real student, one epoch of its data (two scripted styles
    per problem), judged by the math checker on `teacher_check` five times. Each evaluation is a
    checkpoint: on one CPU core the epoch takes hours, and a killed run resumes from the last one."""
    return {"model": {"spec": "lab:smollm2-135m"}, "dataset": "data.jsonl", "strategy": "high",
            "eval": {"path": "eval.jsonl", "checker": "math", "max_new_tokens": 160, "limit": None},
            "training": {"epochs": 1, "learning_rate": 0.0002, "batch_size": 16, "max_length": 384,
                         "evals_per_epoch": 5, "seed": 0, "save_total_limit": 1}}


def neural_pool(generated: list[dict], size: int = SPLITS["pool"]) -> list[dict]:
    """The first `size` problems (in the problems' order) on which the teacher wrote two correct
    candidates or more: a problem needs two to be ranked. Its wrong and unfinished samples stay in
    the row, marked so, as a pool from a real teacher holds them."""
    keep = [r for r in generated if sum(bool(c) for c in r.get("correctness") or []) >= 2]
    return keep[:size]


def main(argv: list[str] | None = None) -> int:
    from capacity_advisor.core.jsonl import read_jsonl
    from capacity_advisor.core.files import write_jsonl

    ap = argparse.ArgumentParser(prog="python -m experiments.real_pools", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("problems", help="the problems of every task and split, from mathematics_dataset")
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=SEED)
    for teacher, words in POOL_TEACHERS.items():
        b = sub.add_parser(teacher, help=f"the {words} teacher's pool of each of its tasks (the pool split)")
        b.add_argument("problems")
        b.add_argument("--out", required=True, help=f"folder: TASK-{teacher}.jsonl per task")
    c = sub.add_parser("teacher-data", help="the neural teacher's fine-tuning rows (the teacher split)")
    c.add_argument("problems")
    c.add_argument("--out", required=True)
    t = sub.add_parser("teacher-run", help="a folder to fine-tune the neural teacher in: data.jsonl, eval.jsonl, manifest.json")
    t.add_argument("problems")
    t.add_argument("--out", required=True)
    d = sub.add_parser("neural-problems", help="the pool split and the first spare problems of one task, a problems file for advisor generate")
    d.add_argument("problems")
    d.add_argument("--task", required=True, choices=sorted(TASKS))
    d.add_argument("--out", required=True)
    e = sub.add_parser("neural-pool", help="the neural teacher's pool: problems with two correct samples or more")
    e.add_argument("generated", help="what `advisor generate` wrote")
    e.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "problems" and os.environ.get("PYTHONHASHSEED") != "0":  # the variables' letters follow str hashing
        cmd = [sys.executable, "-m", "experiments.real_pools", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(cmd, env={**os.environ, "PYTHONHASHSEED": "0"}).returncode
    if args.cmd == "problems":
        n = write_jsonl(args.out, make_problems(args.seed))
        print(f"wrote {n} problems to {args.out}")
    elif args.cmd in POOL_TEACHERS:
        rows = read_jsonl(args.problems)
        for task in TEACHER_TASKS[args.cmd]:
            path = Path(args.out) / f"{task}-{args.cmd}.jsonl"
            n = write_jsonl(path, scripted_pool(rows, task, teacher=args.cmd))
            print(f"wrote {n} problems to {path}")
    elif args.cmd == "teacher-data":
        n = write_jsonl(args.out, teacher_data(read_jsonl(args.problems)))
        print(f"wrote {n} rows to {args.out}")
    elif args.cmd == "teacher-run":
        import json

        rows = read_jsonl(args.problems)
        folder = Path(args.out)
        n = write_jsonl(folder / "data.jsonl", teacher_data(rows))
        k = write_jsonl(folder / "eval.jsonl", teacher_check(rows))
        (folder / "manifest.json").write_text(json.dumps(teacher_manifest(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {n} training rows, {k} held-out problems and manifest.json to {folder}")
    elif args.cmd == "neural-pool":
        rows = neural_pool(read_jsonl(args.generated))
        n = write_jsonl(args.out, rows)
        print(f"wrote {n} problems to {args.out}")
    else:
        rows = [{"id": r["id"], "problem": r["problem"], "answer": r["answer"], "task": r["task"]}
                for r in read_jsonl(args.problems) if r["task"] == args.task and r["split"] in ("pool", "spare")
                and int(r["id"].rsplit("-", 1)[1]) < SPARE_FOR_POOLS + (SPLITS["pool"] if r["split"] == "pool" else 0)]
        n = write_jsonl(args.out, rows)
        print(f"wrote {n} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
