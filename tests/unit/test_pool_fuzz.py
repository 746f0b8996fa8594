"""Property test of the pool reader: every layout, every file kind, corrupted any way gives either
a clean pool or the project's own InputError with a one-line message, never another exception.

    ADVISOR_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/unit/test_pool_fuzz.py   # a long run

`make test` runs a small, fixed (derandomized) sample so the suite stays fast and repeatable.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.core.errors import InputError

EXAMPLES = int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXAMPLES or 100, derandomize=not EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

LAYOUTS = ("grouped", "flat", "messages", "sharegpt", "alpaca", "trl", "trl-chat")
KINDS = ("jsonl", "json", "json-wrapped", "parquet", "datasets")

text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20) | st.sampled_from(["", " ", "\n", "x" * 100_000, "\ud800"])
leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | text
value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8)


def deep(n: int):
    v: object = "x"
    for _ in range(n):
        v = [v]
    return v


corrupt_value = value | st.builds(deep, st.integers(100, 3000)) | st.just(deep(100_000))


def row(layout: str, pid: str, prompt: str, responses: list[str]) -> list[dict]:
    """The rows of one problem in `layout`."""
    if layout == "grouped":
        return [{"uuid": pid, "problem": prompt, "generations": responses, "correctness_math_verify": [True] * len(responses),
                 "answer": "1"}]
    out = []
    for r in responses:
        out.append({
            "flat": {"id": pid, "question": prompt, "response": r, "answer": "1", "correct": True},
            "messages": {"id": pid, "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": r}]},
            "sharegpt": {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": r}]},
            "alpaca": {"instruction": prompt, "input": "", "output": r},
            "trl": {"prompt": prompt, "completion": r},
            "trl-chat": {"prompt": [{"role": "user", "content": prompt}], "completion": [{"role": "assistant", "content": r}]},
        }[layout])
    return out


@st.composite
def pools(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    problems = draw(st.lists(st.tuples(text, st.lists(text, min_size=1, max_size=4)), min_size=1, max_size=4))
    if layout != "grouped" and draw(st.booleans()):  # flat rows without an id group by prompt: share one
        problems = [(problems[0][0], responses) for _, responses in problems]
    rows = [r for i, (prompt, responses) in enumerate(problems) for r in row(layout, f"p{i}", prompt or "q", responses)]
    for _ in range(draw(st.integers(0, 3))):  # corruptions: a wrong type, a null, a missing key, deep nesting
        r = draw(st.sampled_from(rows))
        key = draw(st.sampled_from(sorted(r) + ["extra"]))
        if draw(st.booleans()) and key in r:
            del r[key]
        else:
            r[key] = draw(corrupt_value)
        if isinstance(r.get(key), list) and r[key] and isinstance(r[key][0], dict) and draw(st.booleans()):
            r[key][0]["content" if "content" in r[key][0] else "value"] = draw(corrupt_value)
    rarely = st.integers(0, 4).map(lambda n: n == 0)
    opts = PoolOptions(all_candidates=draw(st.booleans()), strict=draw(rarely),
                       id_field=draw(st.sampled_from(["uuid", "id", "nope"])) if draw(rarely) else None)
    return layout, rows, opts, draw(st.sampled_from(KINDS))


def depth(obj) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if isinstance(v, (list, dict)):
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def write(folder, rows: list[dict], kind: str):
    """The rows as a file of `kind`; rows a columnar format cannot hold (mixed types) go to JSONL."""
    if kind in ("parquet", "datasets") and max(map(depth, rows)) > 30:
        kind = "jsonl"  # pyarrow's writer crashes the process on deeper nesting (not the reader's concern)
    if kind in ("parquet", "datasets"):
        try:
            import datasets
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist(rows)
            if kind == "parquet":
                pq.write_table(table, folder / "pool.parquet")
                return folder / "pool.parquet"
            datasets.Dataset(table).save_to_disk(str(folder / "pool_ds"))
            return folder / "pool_ds"
        except (pa.ArrowException, ValueError, TypeError, OverflowError, RecursionError):
            kind = "jsonl"
    blob = lambda obj: json.dumps(obj, ensure_ascii=True)  # noqa: E731 - ASCII escapes carry lone surrogates too
    try:
        if kind == "jsonl":
            text = "".join(blob(r) + "\n" for r in rows)
        else:
            text = blob(rows if kind == "json" else {"data": rows})
    except (ValueError, RecursionError):  # NaN is fine for json; only depth stops it
        text = "[" * 100_000 + "]" * 100_000
        kind = "json"
    path = folder / ("pool.jsonl" if kind == "jsonl" else "pool.json")
    path.write_text(text, encoding="ascii")
    return path


def check(path, opts) -> None:
    try:
        pool = read_pool(path, opts)
    except InputError as e:
        assert str(e) and "\n" not in str(e) and "\r" not in str(e), repr(str(e))
        return
    ids = [p.id for p in pool.problems]
    assert pool.problems and len(set(ids)) == len(ids)
    for p in pool.problems:
        assert isinstance(p.prompt, str) and p.prompt.strip()
        assert len(p.candidates) >= opts.min_candidates and all(isinstance(c.text, str) and c.text.strip() for c in p.candidates)
        assert len({c.k for c in p.candidates}) == len(p.candidates)
    json.dumps(pool.summary())  # the summary (with its fingerprint) goes into config.json files


@pytest.fixture
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(case=pools())
def test_any_corrupted_pool_reads_clean_or_is_one_input_error(folder, case):
    layout, rows, opts, kind = case
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    check(write(folder, rows, kind), opts)


@FUZZ
@given(case=pools(), cut=st.floats(0, 1), junk=st.binary(min_size=1, max_size=8), where=st.floats(0, 1))
def test_truncated_or_garbled_files_are_one_input_error(folder, case, cut, junk, where):
    layout, rows, opts, kind = case
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    path = write(folder, rows, kind)
    target = max(path.glob("*.arrow"), key=lambda p: p.stat().st_size) if path.is_dir() else path
    data = target.read_bytes()
    at = int(where * len(data))
    target.write_bytes((data[:at] + junk + data[at:])[: max(1, int(cut * (len(data) + len(junk))))])
    check(path, opts)
