"""Every pool layout and file type reads to the same problems; bad pools fail with one clear line."""

import json

import pytest
from helpers import write_jsonl

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.core.errors import InputError

PROBLEMS = [
    {"id": "p0", "prompt": "What is 2+3?", "responses": ["5", "2+3=5, so 5", "First 2, then add 3: 5"], "answer": "5"},
    {"id": "p1", "prompt": "What is 4*2?", "responses": ["8", "4*2 = 4+4 = 8"], "answer": "8"},
    {"id": "p2", "prompt": "Name a prime.", "responses": ["7", "2 is prime", "11", "13"], "answer": None},
]


def _jsonl(path, rows):
    write_jsonl(path, rows)
    return path


def grouped_rows():
    return [{"uuid": p["id"], "problem": p["prompt"], "generations": p["responses"],
             "correctness_math_verify": [True] * len(p["responses"]), "answer": p["answer"]} for p in PROBLEMS]


def flat_rows(kind):
    rows = []
    for p in PROBLEMS:
        for r in p["responses"]:
            if kind == "flat":
                rows.append({"id": p["id"], "question": p["prompt"], "response": r, "answer": p["answer"]})
            elif kind == "messages":
                rows.append({"id": p["id"], "messages": [{"role": "system", "content": "be brief"},
                                                         {"role": "user", "content": p["prompt"]},
                                                         {"role": "assistant", "content": r}]})
            elif kind == "sharegpt":
                rows.append({"conversations": [{"from": "human", "value": p["prompt"]}, {"from": "gpt", "value": r}]})
            elif kind == "alpaca":
                rows.append({"instruction": p["prompt"], "input": "", "output": r})
            elif kind == "trl":
                rows.append({"prompt": p["prompt"], "completion": r})
            elif kind == "trl-chat":
                rows.append({"prompt": [{"role": "user", "content": p["prompt"]}],
                             "completion": [{"role": "assistant", "content": r}]})
    return rows


def as_tuples(pool):
    return [(p.prompt, [c.text for c in p.candidates]) for p in pool.problems]


EXPECTED = [(p["prompt"], p["responses"]) for p in PROBLEMS]


@pytest.mark.parametrize("kind", ["flat", "messages", "sharegpt", "alpaca", "trl", "trl-chat"])
def test_flat_layouts(tmp_path, kind):
    path = tmp_path / ("pool.json" if kind == "alpaca" else "pool.jsonl")
    if kind == "alpaca":
        path.write_text(json.dumps(flat_rows(kind)))
    else:
        _jsonl(path, flat_rows(kind))
    pool = read_pool(path)
    assert pool.layout == {"flat": "flat", "trl-chat": "trl"}.get(kind, kind)
    assert as_tuples(pool) == EXPECTED
    if kind in ("flat", "messages"):
        assert [p.id for p in pool.problems] == ["p0", "p1", "p2"]
    else:  # no id field: grouped by prompt, id = first row number
        assert [p.id for p in pool.problems] == ["0", "3", "5"]


def test_grouped_jsonl_parquet_and_datasets_folder_agree(tmp_path):
    import datasets

    rows = grouped_rows()
    jl = read_pool(_jsonl(tmp_path / "pool.jsonl", rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "pool.parquet"))
    ds.save_to_disk(str(tmp_path / "pool_ds"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "pool_dd"))
    for other in ("pool.parquet", "pool_ds", "pool_dd"):
        pool = read_pool(tmp_path / other)
        assert as_tuples(pool) == as_tuples(jl) == EXPECTED
        assert pool.fingerprint() == jl.fingerprint()
    assert jl.layout == "grouped" and [p.id for p in jl.problems] == ["p0", "p1", "p2"]
    assert jl.get("p0").answer == "5" and jl.has_answers


def test_correct_only_by_default(tmp_path):
    rows = grouped_rows()
    rows[0]["correctness_math_verify"] = [True, False, True]
    pool = read_pool(_jsonl(tmp_path / "p.jsonl", rows))
    assert [c.k for c in pool.get("p0").candidates] == [0, 2]  # k keeps the file's own index
    assert pool.skipped_candidates["marked incorrect"] == 1
    pool = read_pool(tmp_path / "p.jsonl", PoolOptions(all_candidates=True))
    assert [c.k for c in pool.get("p0").candidates] == [0, 1, 2]


def test_field_overrides(tmp_path):
    rows = [{"qid": i, "text": f"q{i}", "samples": ["a", "bb"], "gold": "a"} for i in range(3)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(InputError, match="--prompt-field"):
        read_pool(path)
    pool = read_pool(path, PoolOptions(prompt_field="text", responses_field="samples", id_field="qid", answer_field="gold"))
    assert [p.id for p in pool.problems] == ["0", "1", "2"] and pool.get("1").answer == "a"
    with pytest.raises(InputError, match="--prompt-field 'nope' is not a field"):
        read_pool(path, PoolOptions(prompt_field="nope"))


def test_one_candidate_problems_are_skipped_and_reported(tmp_path):
    rows = grouped_rows() + [{"uuid": "lonely", "problem": "q", "generations": ["only one"], "answer": "1"}]
    pool = read_pool(_jsonl(tmp_path / "p.jsonl", rows))
    assert len(pool) == 3 and pool.skipped_problems["fewer than 2 usable candidates"] == 1
    assert pool.skipped_examples["fewer than 2 usable candidates"] == ["lonely"]
    with pytest.raises(InputError, match="lonely.*--strict"):
        read_pool(tmp_path / "p.jsonl", PoolOptions(strict=True))


@pytest.mark.parametrize("text,match", [
    ('{"problem": "a", "generations": ["x", "y"]}\n{"problem": "b", generations}\n', "line 2: not valid JSON"),
    ('{"problem": "a", "generations": ["x", "y"]}\n{"generations": ["x", "y"]}\n', "row 2: missing field 'problem'"),
    ('{"problem": "a", "generations": "x"}\n', "must be a list"),
    ('{"problem": "a", "generations": ["x", "y"], "correctness": [true]}\n', "as long as"),
    ('{"problem": "a", "generations": ["only"]}\n', "no problem has 2 usable candidates"),
    ('{"problem": "a", "generations": ["x", "  "]}\n', "no problem has 2 usable candidates"),
    ('{"problem": "a", "generations": ["x", 3]}\n', "candidate 1 must be a string"),
    ('{"foo": 1}\n', "cannot tell the pool layout"),
    ('', "is empty"),
])
def test_bad_pools(tmp_path, text, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        read_pool(path)


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_pool(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(InputError, match="unknown file type"):
        read_pool(tmp_path / "x.csv")


@pytest.mark.parametrize("layout", ["flat", "grouped"])
def test_rows_without_an_id_never_take_another_problems_id(tmp_path, layout):
    # Row 3's number is "2", which row 1 already uses as its real id.
    if layout == "flat":
        rows = [{"id": "2", "question": "A", "response": r} for r in ("a1", "a2")] + \
               [{"id": None, "question": "B", "response": r} for r in ("b1", "b2")]
    else:
        rows = [{"id": "2", "problem": "A", "generations": ["a1", "a2"]}, {"id": "1", "problem": "C", "generations": ["c1", "c2"]},
                {"id": None, "problem": "B", "generations": ["b1", "b2"]}]
    pool = read_pool(_jsonl(tmp_path / "p.jsonl", rows))
    ids = [p.id for p in pool.problems]
    assert len(set(ids)) == len(ids) == len(rows) // (2 if layout == "flat" else 1)
    assert [c.text for c in pool.get("2").candidates] == ["a1", "a2"]
    assert sorted(c.text for p in pool.problems for c in p.candidates) == sorted(
        c for r in rows for c in ([r["response"]] if layout == "flat" else r["generations"]))


def test_selection_from_a_pool_with_missing_ids_takes_each_problem_once(tmp_path):
    from capacity_advisor.advisor.scoring.select import SelectConfig, select

    rows = [{"id": "2", "question": "A", "response": r} for r in ("a1", "a2")] + \
           [{"id": None, "question": "B", "response": r} for r in ("b1", "b2")]
    pool = read_pool(_jsonl(tmp_path / "p.jsonl", rows))
    scores = {(p.id, c.k): {"id": p.id, "k": c.k, "n_tokens": 2, "logprob_sum": -float(c.k), "logprob_mean": -float(c.k),
                            "truncated": False} for p in pool.problems for c in p.candidates}
    out = select(pool, scores, SelectConfig("high")).rows
    assert sorted(r["response"] for r in out) == ["a1", "b1"]


def test_problems_without_an_id_never_take_another_problems_id(tmp_path):
    from capacity_advisor.advisor.pools.generate import GenerateConfig, read_problems

    _jsonl(tmp_path / "p.jsonl", [{"id": "2", "problem": "A"}, {"id": None, "problem": "B"}, {"problem": "C"}])
    problems, _ = read_problems(GenerateConfig(teacher="unused", problems=str(tmp_path / "p.jsonl"), out="pool.jsonl"))
    assert [p.problem for p in problems] == ["A", "B", "C"] and len({p.id for p in problems}) == 3


@pytest.mark.parametrize("field", ["problem", "answer", "id"])
def test_problems_with_half_a_surrogate_pair_are_one_input_error(tmp_path, field):
    from capacity_advisor.advisor.pools.generate import GenerateConfig, read_problems

    row = {"id": "1", "problem": "1+1?", "answer": "2"}
    row[field] = "half a pair: \ud800"
    _jsonl(tmp_path / "p.jsonl", [row])
    with pytest.raises(InputError, match=f"row 1: {field} holds an unpaired surrogate"):
        read_problems(GenerateConfig(teacher="unused", problems=str(tmp_path / "p.jsonl"), out="pool.jsonl"))


@pytest.mark.parametrize("name,text", [
    ("deep.jsonl", '{"problem": "a", "generations": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("deep-field.jsonl", json.dumps({"id": "x", "problem": "a", "generations": ["x", "y"], "answer": 0})
     .replace("0}", "[" * 900 + "]" * 900 + "}") + "\n"),
    ("bad-utf8.jsonl", b'{"problem": "a", "generations": ["x", "\xff\xfe"]}\n'),
    ("huge-int.jsonl", '{"problem": "a", "generations": ["x", "y"], "answer": ' + "9" * 5000 + "}\n"),
    ("surrogate.jsonl", '{"problem": "a", "generations": ["x", "half a pair: \\ud800"]}\n'),
])
def test_hostile_files_are_one_input_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        json.dumps(read_pool(path).summary()).encode("utf-8")  # a clean result must be fit to write out
    except InputError as e:
        assert "\n" not in str(e)


def test_summary_is_the_same_wherever_the_pool_lies(tmp_path):
    # recommendation.json copies the summary: it must not change with the --out folder of a generated pool
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = read_pool(_jsonl(tmp_path / "a" / "pool.jsonl", grouped_rows()))
    b = read_pool(_jsonl(tmp_path / "b" / "pool.jsonl", grouped_rows()))
    assert a.summary() == b.summary() and a.summary()["source"] == "pool.jsonl"
    assert a.source == str(tmp_path / "a" / "pool.jsonl")  # the path itself stays available for provenance
