"""Stored numbers: the scores of a tiny model built with a fixed seed, on a fixed pool, against the
values committed in tests/data/tiny_scores.json. A change to scoring, templates or the tokenizer
path that moves any score shows here, even when every other test still passes.

To store new numbers after a deliberate change: ADVISOR_STORE_NUMBERS=1 pytest tests/stored/test_stored_numbers.py
"""

from pathlib import Path

import pytest
from helpers import read_jsonl, stored_numbers, write_jsonl

from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool

STORED = Path(__file__).parents[1] / "data" / "tiny_scores.json"
FIELDS = ("n_tokens", "n_scored", "logprob_sum", "logprob_mean", "rank_mean", "truncated")
POOL = [
    {"id": "p0", "problem": "what is 12 + 35?", "answer": "47",
     "generations": ["47.", "First add the tens, then the units: 47.", "Let us think step by step. \\boxed{47}"]},
    {"id": "p1", "problem": "The quick brown fox jumps over the lazy dog. Count the words.", "answer": "9",
     "generations": ["9", "<think> reasoning </think> so the final answer is \\boxed{9}"]},
    {"id": "p2", "problem": "Question: what is 0123456789 reversed?", "answer": "9876543210",
     "generations": ["9876543210", "Let us think step by step. First 9, then 8. Answer: 9876543210."]},
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_scores_match_the_stored_numbers(tmp_path, arch):
    from helpers import build_tiny

    model = build_tiny(tmp_path / arch, arch, seed=7)
    write_jsonl(tmp_path / "pool.jsonl", POOL)
    score_pool(read_pool(tmp_path / "pool.jsonl"), ScoreConfig(model, device="cpu", dtype="float32", score_length=32),
               tmp_path / "s")
    rows = read_jsonl(tmp_path / "s" / "scores.jsonl")
    got = {f"{r['id']}/{r['k']}": {k: r[k] for k in FIELDS} for r in rows}
    want = stored_numbers(STORED, arch, got)
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        for field, value in row.items():
            if isinstance(value, float):
                assert got[key][field] == pytest.approx(value, rel=1e-4, abs=1e-4), (key, field)
            else:
                assert got[key][field] == value, (key, field)
