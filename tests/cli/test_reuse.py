"""Reused folders and caches never give silently wrong results: a rerun with another shard size,
model, pool or setting either reuses exactly what matches or refuses in one line."""

import pytest
from helpers import doubling_pool, read_jsonl, run

def score_rows(folder):
    return read_jsonl(folder / "scores.jsonl")


def test_another_shard_size_reuses_nothing_wrong(tiny_llama, tmp_path, monkeypatch):
    pool = doubling_pool(tmp_path / "pool.jsonl", 10)
    args = ["score", "--model", tiny_llama, "--pool", pool, "--device", "cpu"]
    for order in ([20, 7], [7, 20]):
        monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / f"home-{order[0]}"))
        for size in order:
            out = tmp_path / f"out-{order[0]}-{size}"
            r = run(*args, "--shard-size", size, "--out", out)
            assert r.exit_code == 0, r.stderr
            rows = score_rows(out)
            assert len(rows) == 30 and len({(x["id"], x["k"]) for x in rows}) == 30
            assert run("select", "--pool", pool, "--scores", out / "scores.jsonl", "--out", out / "high.jsonl").exit_code == 0
    by_key = lambda rows: {(x["id"], x["k"]): x["logprob_sum"] for x in rows}  # noqa: E731
    assert by_key(score_rows(tmp_path / "out-20-7")) == pytest.approx(by_key(score_rows(tmp_path / "out-7-20")))


@pytest.mark.parametrize("change", ["model", "pool", "max_length"])
def test_a_score_cache_filled_by_another_run_is_refused(tiny_llama, tiny_qwen, tmp_path, monkeypatch, change):
    # Every run lands in the same cache folder, as a hand-copied folder or a key collision would.
    monkeypatch.setattr("capacity_advisor.core.shards.stable_hash", lambda *a, **k: "one-folder")
    pool = doubling_pool(tmp_path / "pool.jsonl", 10)
    base = {"--model": tiny_llama, "--pool": pool, "--score-length": 512}
    first = run("score", *[x for kv in base.items() for x in kv], "--device", "cpu", "--out", tmp_path / "a")
    assert first.exit_code == 0, first.stderr
    other = dict(base)
    other[{"model": "--model", "pool": "--pool", "max_length": "--score-length"}[change]] = {"model": tiny_qwen, "pool": doubling_pool(tmp_path / "pool2.jsonl", 4),
                                               "max_length": 256}[change]
    r = run("score", *[x for kv in other.items() for x in kv], "--device", "cpu", "--out", tmp_path / "b")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: cache folder ")
    assert f"different {change}" in r.stderr and not (tmp_path / "b").exists()


def gen_config(tiny_llama, tmp_path, **kw):
    from capacity_advisor.advisor.pools.generate import GenerateConfig

    common = dict(teacher=tiny_llama, problems=str(tmp_path / "p.jsonl"), n=2, temperature=1.0, max_new_tokens=6,
                  shard_size=3, device="cpu", out=str(tmp_path / "pool.jsonl"))
    return GenerateConfig(**{**common, **kw})


def write_problems(tmp_path, n=6):
    from capacity_advisor.core.files import write_jsonl

    write_jsonl(tmp_path / "p.jsonl", [{"problem": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(n)])


def test_a_generation_resumed_with_another_batch_budget_equals_an_uninterrupted_one(tiny_llama, tmp_path, monkeypatch):
    from capacity_advisor.advisor.pools.generate import generate_pool

    write_problems(tmp_path)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-a"))
    generate_pool(gen_config(tiny_llama, tmp_path, token_budget=16, out=str(tmp_path / "whole.jsonl")))
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-b"))
    generate_pool(gen_config(tiny_llama, tmp_path, out=str(tmp_path / "resumed.jsonl")), stop_after_shards=1)
    generate_pool(gen_config(tiny_llama, tmp_path, token_budget=16, out=str(tmp_path / "resumed.jsonl")))
    assert (tmp_path / "resumed.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


@pytest.mark.parametrize("change", ["teacher", "problems", "temperature"])
def test_a_generate_cache_filled_by_another_run_is_refused(tiny_llama, tiny_qwen, tmp_path, monkeypatch, change):
    from capacity_advisor.advisor.pools.generate import generate_pool
    from capacity_advisor.core.errors import InputError

    monkeypatch.setattr("capacity_advisor.core.shards.stable_hash", lambda *a, **k: "one-folder")
    write_problems(tmp_path)
    generate_pool(gen_config(tiny_llama, tmp_path))
    if change == "problems":
        write_problems(tmp_path, n=4)
    other = {"teacher": {"teacher": tiny_qwen}, "problems": {}, "temperature": {"temperature": 0.7}}[change]
    with pytest.raises(InputError, match=f"cache folder .* another run [(]different .*{change}"):
        generate_pool(gen_config(tiny_llama, tmp_path, out=str(tmp_path / "again.jsonl"), **other))
    assert not (tmp_path / "again.jsonl").exists()

