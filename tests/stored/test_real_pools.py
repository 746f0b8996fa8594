"""The real student's committed problems and pools (experiments/real_pools.py), read without
mathematics_dataset: the splits are disjoint, every pool row's correctness is what the math checker
says of it, and the neural teacher's run folder is checked on problems no pool holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.training.manifest import load_manifest
from capacity_advisor.training.text_metrics import check_answer
from experiments import real_pools

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "calibration" / "real" / "problems.jsonl"
POOLS = sorted((ROOT / "calibration" / "real" / "pools").glob("*.jsonl"))


@pytest.fixture(scope="module")
def problems():
    return read_jsonl(PROBLEMS)


def test_the_splits_are_disjoint_and_the_pools_hold_only_pool_problems(problems):
    by_split: dict[str, set] = {}
    for r in problems:
        by_split.setdefault(r["split"], set()).add(r["problem"])
    assert set(by_split) == set(real_pools.SPLITS)
    assert not (by_split["pool"] & by_split["teacher"]) and not (by_split["pool"] & by_split["spare"])
    assert POOLS, "no committed real pools"
    for path in POOLS:
        rows = read_jsonl(path)
        assert rows and {r["problem"] for r in rows} <= by_split["pool"] | by_split["spare"], path.name
        for r in rows[:40]:  # the pool's own marks are the checker's verdicts
            assert [check_answer(t, r["answer"], "math") for t in r["generations"]] == r["correctness"]


def test_the_teacher_run_folder_trains_on_its_split_and_checks_on_problems_no_pool_holds(problems, tmp_path):
    assert real_pools.main(["teacher-run", str(PROBLEMS), "--out", str(tmp_path)]) == 0
    data, held = read_jsonl(tmp_path / "data.jsonl"), read_jsonl(tmp_path / "eval.jsonl")
    teacher = {r["problem"] for r in problems if r["split"] == "teacher" and r["task"] in real_pools.NEURAL_TASKS}
    assert len(data) == real_pools.SPLITS["teacher"] * len(real_pools.NEURAL_TASKS) * real_pools.TEACHER_STYLES
    assert {r["prompt"] for r in data} == teacher
    assert all(check_answer(r["completion"], next(p["answer"] for p in problems if p["problem"] == r["prompt"]), "math")
               for r in data[:50])
    assert len(held) == real_pools.TEACHER_CHECK * len(real_pools.NEURAL_TASKS)
    pooled = {r["problem"] for path in POOLS for r in read_jsonl(path)}
    usable = {r["problem"] for r in problems if r["split"] == "spare"
              and int(r["id"].rsplit("-", 1)[1]) < real_pools.SPARE_FOR_POOLS}
    assert not ({r["prompt"] for r in held} & (pooled | usable | teacher))
    m = load_manifest(tmp_path / "manifest.json")
    assert m.model_spec == "lab:smollm2-135m" and m.dataset_path.is_file() and m.eval_path.is_file()
    assert json.loads((tmp_path / "manifest.json").read_text()) == real_pools.teacher_manifest()


def test_every_arith_problem_reduces_step_by_step_to_its_answer_and_the_slip_is_the_one_wrong_candidate(problems):
    rows = [r for r in problems if r["task"] == "arith"]
    assert len(rows) == sum(real_pools.SPLITS.values())
    for r in rows:
        p = real_pools.parse("arith", r["problem"])
        assert p is not None and p["x"] == int(r["answer"]), r["problem"]
        assert sum(real_pools.flat_terms(p["e"])) == p["x"]  # the exploring style's second procedure agrees
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "arith-scripted.jsonl")
    for r in pool:
        assert sorted(r["styles"]) == sorted([*real_pools.STYLES, "wrong"])
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]


def test_every_poly_problem_is_its_terms_summed_and_the_sign_slip_is_the_one_wrong_candidate(problems):
    rows = [r for r in problems if r["task"] == "poly"]
    assert len(rows) == sum(real_pools.SPLITS.values())
    for r in rows:
        p = real_pools.parse("poly", r["problem"])
        assert p is not None and p["value"] == int(r["answer"]), r["problem"]
        assert max(k for _, k in p["terms"]) <= real_pools.POLY_DEGREE
    assert real_pools.parse("poly", "Let y(c) = -c**3 + c**2 + 5*c - 3. Calculate y(0).") is None  # a cubic
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "poly-scripted.jsonl")
    assert len(pool) == real_pools.SPLITS["pool"]
    for r in pool:
        assert sorted(set(r["styles"]) - {"wrong"}) == sorted(real_pools.STYLES) and r["styles"].count("wrong") <= 1
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]
        explore = r["generations"][r["styles"].index("explore")]
        assert "That matches." in explore  # the second procedure (nested powers) agrees with the terms' sum
    assert sum("wrong" in r["styles"] for r in pool) >= 0.9 * len(pool)


def test_the_mixed_language_pool_holds_the_same_worked_steps_in_every_language(problems):
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "place-mixlang.jsonl")
    assert len(pool) == real_pools.SPLITS["pool"]
    answers = {r["problem"]: r["answer"] for r in problems}
    for r in pool:
        assert sorted(set(r["styles"]) - {"wrong"}) == sorted(real_pools.MIXLANG_STYLES) and r["styles"].count("wrong") <= 1
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]
        assert r["answer"] == answers[r["problem"]]
        p = real_pools.parse("place", r["problem"])
        listed = [p["n"][len(p["n"]) - 1 - i] for i in range(p["k"] + 1)]
        for text, style in zip(r["generations"], r["styles"]):
            if style != "wrong":  # every language lists the same digits, from the right, to the asked place
                assert re.findall(r"(?<![\d{])\d(?![\d}])", text) == [*listed, r["answer"]], text  # ... and the answer
    assert sum("wrong" in r["styles"] for r in pool) >= 0.9 * len(pool)
    # written again from the problems, the pool is the committed one
    assert real_pools.scripted_pool(problems, "place", teacher="mixlang") == pool


def test_every_round_problem_rounds_to_its_answer_and_the_wrong_candidate_rounds_the_other_way(problems):
    rows = [r for r in problems if r["task"] == "round"]
    assert len(rows) == sum(real_pools.SPLITS.values())
    for r in rows:
        p = real_pools.parse("round", r["problem"])
        assert p is not None and p["x"] == int(r["answer"]) and p["other"] != p["x"], r["problem"]
        assert abs(p["x"]) % p["step"] == 0 and abs(abs(p["n"]) - abs(p["x"])) <= p["step"] // 2
    assert real_pools.parse("round", "What is 405.36 rounded to the nearest 100?") is None  # a decimal number
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "round-scripted.jsonl")
    assert len(pool) == real_pools.SPLITS["pool"]
    for r in pool:
        assert sorted(r["styles"]) == sorted([*real_pools.STYLES, "wrong"])
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]
        wrong = r["generations"][r["styles"].index("wrong")]
        assert f"\\boxed{{{real_pools.parse('round', r['problem'])['other']}}}" in wrong
        assert "which matches." in r["generations"][r["styles"].index("explore")]  # the distances agree
    assert real_pools.scripted_pool(problems, "round") == pool  # written again, the committed pool


def test_the_mixed_language_rounding_pool_reads_the_same_digit_in_every_language(problems):
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "round-mixlang.jsonl")
    assert len(pool) == real_pools.SPLITS["pool"]
    for r in pool:
        assert sorted(r["styles"]) == sorted([*real_pools.MIXLANG_STYLES, "wrong"])
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]
        p = real_pools.parse("round", r["problem"])
        digit = str(p["rest"] * 10 // p["step"])
        for text, style in zip(r["generations"], r["styles"]):
            result = p["other"] if style == "wrong" else p["x"]
            assert f" {digit}" in text and f"\\boxed{{{result}}}" in text, text  # the digit read, the result boxed
    assert real_pools.scripted_pool(problems, "round", teacher="mixlang") == pool


def test_the_program_teachers_programs_compute_what_they_print(problems):
    """arith-pycode: each correct candidate is a Python program whose every line keeps the expression's
    value, whose check of the signed terms holds, and which prints the boxed answer; the one wrong
    candidate's program changes the value at a step (the sign slip) and prints that."""
    pool = read_jsonl(ROOT / "calibration" / "real" / "pools" / "arith-pycode.jsonl")
    answers = {r["problem"]: r["answer"] for r in problems if r["split"] == "pool"}
    assert len(pool) == real_pools.SPLITS["pool"] and {r["problem"] for r in pool} <= set(answers)
    lengths = {s: [] for s in real_pools.PYCODE_STYLES}

    def value(expr: str) -> int:
        assert re.fullmatch(r"[-\d\s+()]+", expr), expr  # digits, signs and brackets only
        return int(eval(expr, {"__builtins__": {}}, {}))

    for r in pool:
        assert sorted(r["styles"]) == sorted([*real_pools.PYCODE_STYLES, "wrong"])
        assert [s == "wrong" for s in r["styles"]] == [not ok for ok in r["correctness"]]
        for text, ok, style in zip(r["generations"], r["correctness"], r["styles"]):
            boxed = re.search(r"\\boxed\{(-?\d+)\}", text)[1]
            assert check_answer(text, r["answer"], "math") == ok and (boxed == r["answer"]) == ok
            if style == "print":
                m = re.search(r"^(?:print\((.*)\)|>>> (.*))$", text, re.M)
                assert value(m[1] or m[2]) == int(r["answer"])
                lengths[style].append(len(text))
                continue
            assigned = [value(m[1]) for m in re.finditer(r"^(?!terms )\w+ = ([^#\n]+?)\s*(?:#.*)?$", text, re.M)]
            printed = int(re.search(r"^print\(\w+\)  # (-?\d+)$", text, re.M)[1])
            assert printed == int(boxed) and assigned[-1] == printed
            if ok:
                lengths[style].append(len(text))
                assert set(assigned) == {int(r["answer"])}, text  # every rewrite keeps the value
                if style == "checked":
                    terms = re.search(r"^terms = \[([^\]]*)\]", text, re.M)[1]
                    assert sum(int(t) for t in terms.split(",")) == int(r["answer"])
            else:
                assert assigned[0] == int(r["answer"]) != printed  # the slip changes the value at a step
    mean = {s: sum(v) / len(v) for s, v in lengths.items()}
    assert mean["print"] < mean["lines"] < mean["comments"] < mean["checked"]  # from terse to self-checking
