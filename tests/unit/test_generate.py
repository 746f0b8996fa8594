"""`advisor generate`: a teacher's candidates per problem, checked, written as a pool the other verbs read."""

import json

import pytest
from click.testing import CliRunner
from helpers import read_jsonl

import fake_vllm
from capacity_advisor.advisor.pools import generate as gen_mod
from capacity_advisor.advisor.cli.main import cli
from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.core.files import write_jsonl


def lab_problems(path, n=10):
    from capacity_advisor.advisor.pools.lab import pool_rows

    rows = [{k: r[k] for k in ("id", "task", "problem", "answer")} for r in pool_rows("modchain", n=n, seed=3)]
    write_jsonl(path, rows)
    return rows


def test_lab_teacher_pool_reads_back_and_is_checked(lab_home, tmp_path):
    from capacity_advisor.models.lab.tasks import check

    problems = lab_problems(tmp_path / "problems.jsonl")
    cfg = GenerateConfig(teacher="lab:xs", problems=str(tmp_path / "problems.jsonl"), out=str(tmp_path / "pool.jsonl"),
                         n=3, temperature=1.0, max_new_tokens=40, shard_size=4, device="cpu")
    summary = generate_pool(cfg)
    assert summary["checker"] == "lab" and summary["problems"] == 10 and summary["generations"] == 30
    rows = read_jsonl(tmp_path / "pool.jsonl")
    assert [r["id"] for r in rows] == [p["id"] for p in problems]
    for r, p in zip(rows, problems):
        assert r["problem"] == p["problem"] and r["answer"] == p["answer"] and r["task"] == "modchain"
        assert len(r["generations"]) == len(r["correctness"]) == len(r["finished"]) == len(r["n_tokens"]) == 3
        assert r["correctness"] == [check(g, p["answer"]) for g in r["generations"]]
        assert all(1 <= t <= 40 for t in r["n_tokens"])
        assert all(f or t == 40 for f, t in zip(r["finished"], r["n_tokens"]))  # unfinished only at the cap
    assert summary["correct"] == sum(sum(r["correctness"]) for r in rows)
    pool = read_pool(tmp_path / "pool.jsonl", PoolOptions(all_candidates=True))
    assert pool.layout == "grouped" and len(pool) == 10 and pool.n_candidates == 30
    saved = json.loads((tmp_path / "pool.config.json").read_text())
    assert saved["stage"] == "generate" and saved["settings"]["n"] == 3
    again = generate_pool(cfg)  # served from the shard cache, same bytes
    assert again["from_cache"] == 10
    assert json.loads((tmp_path / "pool.jsonl").read_text().splitlines()[0]) == rows[0]


def test_killed_run_resumes_to_the_same_pool(tiny_llama, tmp_path, monkeypatch):
    write_jsonl(tmp_path / "p.jsonl", [{"problem": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(9)])
    common = dict(teacher=tiny_llama, problems=str(tmp_path / "p.jsonl"), n=2, temperature=1.0,
                  max_new_tokens=8, shard_size=3, device="cpu", seed=5)
    generate_pool(GenerateConfig(out=str(tmp_path / "whole.jsonl"), **common))
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "cold-home"))
    stopped = generate_pool(GenerateConfig(out=str(tmp_path / "resumed.jsonl"), **common), stop_after_shards=1)
    assert stopped["stopped_early"] and not (tmp_path / "resumed.jsonl").exists()
    summary = generate_pool(GenerateConfig(out=str(tmp_path / "resumed.jsonl"), **common))
    assert summary["from_cache"] == 3
    assert (tmp_path / "resumed.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


class Scripted:
    """A backend that answers from a script: checks the checker, not the model."""

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, n=1, progress=None, details=False, **kw):
        out = [[{"text": t, "n_tokens": len(t), "finished": not t.endswith("...")} for t in self.script[p][:n]] for p in prompts]
        if progress:
            progress(len(prompts))
        return out


def test_math_answers_are_checked_and_parquet_reads_back(tiny_llama, tmp_path, monkeypatch):
    script = {"What is 2+2?": ["so \\boxed{4}", "it is \\boxed{5}", "The answer is 4.", "thinking..."],
              "What is 3*3?": ["\\boxed{9}", "\\boxed{ 9 }", "nine", "\\boxed{6}"]}
    write_jsonl(tmp_path / "p.jsonl", [{"question": q, "final_answer": a, "uuid": f"q{i}"}
                                       for i, (q, a) in enumerate([("What is 2+2?", "4"), ("What is 3*3?", "9")])])
    monkeypatch.setattr(gen_mod, "_make_backend", lambda name, lm, cfg: Scripted(script))
    r = CliRunner().invoke(cli, ["generate", "-t", tiny_llama, "-p", str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "pool.parquet"),
                                 "--n", "4", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["fields"] == {"prompt": "question", "answer": "final_answer", "id": "uuid"}
    assert summary["correct"] == 4 and summary["unfinished"] == 1 and summary["problems_with_two_correct"] == 2
    pool = read_pool(tmp_path / "pool.parquet")  # correct-only by default
    assert [p.id for p in pool.problems] == ["q0", "q1"]
    assert [c.k for c in pool.problems[0].candidates] == [0, 2] and [c.k for c in pool.problems[1].candidates] == [0, 1]


@pytest.mark.parametrize("args,message", [
    (["-p", "missing.jsonl"], "problems file missing.jsonl does not exist"),
    (["--n", "0"], "--n 0 must be at least 1"),
    (["--temperature", "0", "--n", "2"], "--temperature 0 is greedy"),
    (["-o", "pool.txt"], "write the pool as .jsonl or .parquet"),
    (["--prompt-field", "nope"], "--prompt-field 'nope' is not a field"),
])
def test_bad_input_is_one_line_and_no_output(tiny_llama, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "p.jsonl", [{"problem": "1+1?", "answer": "2"}])
    base = {"-t": tiny_llama, "-p": "p.jsonl", "-o": "pool.jsonl"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    r = CliRunner().invoke(cli, ["generate", *[x for kv in base.items() for x in kv], "--device", "cpu"])
    assert r.exit_code == 2 and message in r.output and r.output.count("error:") == 1
    assert not any(p.name.startswith("pool") for p in tmp_path.iterdir())


@pytest.mark.parametrize("rows,message", [
    ([{"text": "1+1?"}], "no problem text field"),
    ([{"problem": "1+1?", "id": 1}, {"problem": "2+2?", "id": 1}], "id '1' appears twice"),
    ([{"problem": "1+1?"}, {"problem": "  "}], "row 2: field 'problem' is missing or empty"),
])
def test_malformed_problems(tiny_llama, tmp_path, rows, message):
    write_jsonl(tmp_path / "p.jsonl", rows)
    r = CliRunner().invoke(cli, ["generate", "-t", tiny_llama, "-p", str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "o.jsonl").exists()


def test_vllm_and_hf_greedy_pools_agree(tiny_qwen, tmp_path, monkeypatch):
    write_jsonl(tmp_path / "p.jsonl", [{"problem": q} for q in ("what is 12 + 35?", "Let us think", "quick brown fox")])
    common = dict(teacher=tiny_qwen, problems=str(tmp_path / "p.jsonl"), n=1, temperature=0.0, max_new_tokens=6,
                  device="cpu", shard_size=2)
    hf = generate_pool(GenerateConfig(out=str(tmp_path / "hf.jsonl"), backend="hf", **common))
    fake_vllm.install(monkeypatch)
    vl = generate_pool(GenerateConfig(out=str(tmp_path / "vl.jsonl"), backend="vllm", **common))
    assert hf["backend"] == "hf" and vl["backend"] == "vllm" and vl["checker"] == "none"
    assert (tmp_path / "hf.jsonl").read_text() == (tmp_path / "vl.jsonl").read_text()
    assert "correctness" not in json.loads((tmp_path / "vl.jsonl").read_text().splitlines()[0])
    assert fake_vllm.ENGINES[0].args["model"] == tiny_qwen


def test_data_parallel_ranks(tiny_llama, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"problem": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(6)])
    common = dict(teacher=tiny_llama, problems=str(tmp_path / "p.jsonl"), n=2, temperature=1.0, max_new_tokens=5,
                  device="cpu", shard_size=2, out=str(tmp_path / "pool.jsonl"))
    first = generate_pool(GenerateConfig(dp_rank=0, dp_size=2, **common))
    assert first["waiting_for"] == [1] and not (tmp_path / "pool.jsonl").exists()
    last = generate_pool(GenerateConfig(dp_rank=1, dp_size=2, **common))
    assert last["problems"] == 6
    dp_bytes = (tmp_path / "pool.jsonl").read_bytes()
    single = generate_pool(GenerateConfig(**common))
    assert single["from_cache"] == 6 and (tmp_path / "pool.jsonl").read_bytes() == dp_bytes


def test_sampling_leaves_the_callers_random_state_as_it_was(tiny_llama):
    """An evaluation generated in the middle of training must not move the training's RNG (dropout,
    shuffling): the draws after a sampled generation are the draws there would have been without it,
    while the sampled text itself is still fixed by the generation's own seed."""
    import torch

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model

    backend = HFBackend(load_model(tiny_llama, device="cpu"))
    prompts = ["2+3=", "7*6="]
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    first = backend.generate(prompts, max_new_tokens=6, temperature=1.0, n=2, seed=5)
    after = torch.rand(4)
    assert torch.equal(after, expected)
    torch.manual_seed(999)  # another caller state: the same seed still samples the same text
    assert backend.generate(prompts, max_new_tokens=6, temperature=1.0, n=2, seed=5) == first
