"""`advisor score` / `advisor select` end to end in-process: outputs, errors, no partial output, resume."""

import json

import pytest
from helpers import doubling_pool as write_pool
from helpers import read_jsonl, run

from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool


def test_score_then_select(tiny_llama, tmp_path):
    pool = write_pool(tmp_path / "pool.jsonl")
    r = run("score", "--model", tiny_llama, "--pool", pool, "--out", tmp_path / "s", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["candidates"] == 36 and summary["pool"]["skipped_candidates"] == {"marked incorrect": 12}
    rows = read_jsonl(tmp_path / "s" / "scores.jsonl")
    assert len(rows) == 36 and set(rows[0]) == {"id", "k", "n_tokens", "n_scored", "logprob_sum", "logprob_mean", "rank_mean",
                                                "first_tokens", "truncated"}
    assert rows[0]["id"] == "u0" and {r["k"] for r in rows} == {0, 1, 2}
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["settings"]["model"] == tiny_llama and cfg["versions"]["format"] == "2"

    r = run("select", "--pool", pool, "--scores", tmp_path / "s" / "scores.jsonl", "--strategy", "low",
            "--out", tmp_path / "low.jsonl", "--json")
    assert r.exit_code == 0, r.stderr
    out = read_jsonl(tmp_path / "low.jsonl")
    assert len(out) == 12 and set(out[0]) == {"prompt", "completion", "id", "k"}
    by_id = {}
    for row in rows:
        by_id.setdefault(row["id"], []).append(row)
    for o in out:
        assert o["k"] == min(by_id[o["id"]], key=lambda x: x["logprob_sum"])["k"]  # the paper's ranking by default
    assert json.loads(r.stdout)["rows"] == 12
    assert (tmp_path / "low.config.json").exists()


def test_rerun_is_served_from_cache(tiny_llama, tmp_path):
    pool = write_pool(tmp_path / "pool.jsonl")
    args = ["score", "--model", tiny_llama, "--pool", pool, "--device", "cpu", "--json", "--shard-size", "5"]
    first = json.loads(run(*args, "--out", tmp_path / "a").stdout)
    second = json.loads(run(*args, "--out", tmp_path / "b").stdout)
    assert first["from_cache"] == 0 and second["from_cache"] == 36
    assert (tmp_path / "a" / "scores.jsonl").read_bytes() == (tmp_path / "b" / "scores.jsonl").read_bytes()


def test_killed_and_resumed_equals_uninterrupted(tiny_llama, tmp_path, monkeypatch):
    pool = read_pool(write_pool(tmp_path / "pool.jsonl"))
    cfg = ScoreConfig(tiny_llama, device="cpu", shard_size=7)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-a"))
    score_pool(pool, cfg, tmp_path / "whole")
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-b"))
    stopped = score_pool(pool, cfg, tmp_path / "resumed", stop_after_shards=2)
    assert stopped["stopped_early"] and not (tmp_path / "resumed").exists()
    cache = tmp_path / "home-b" / "scores"
    shards = sorted(cache.glob("*/shard-*.jsonl"))
    assert len(shards) == 2
    # a kill in the middle of a write leaves only a temporary file, never a shard under its final name
    (shards[0].parent / ".shard-00002.jsonl.abc.tmp").write_text('{"id": "u0", "k"')
    seen = {}
    summary = score_pool(pool, cfg, tmp_path / "resumed", on_start=lambda total, done: seen.update(total=total, done=done))
    assert seen == {"total": 36, "done": 14} and summary["from_cache"] == 14
    assert (tmp_path / "whole" / "scores.jsonl").read_bytes() == (tmp_path / "resumed" / "scores.jsonl").read_bytes()


def test_damaged_shard_is_removed_with_a_clear_error(tiny_llama, tmp_path):
    pool = write_pool(tmp_path / "pool.jsonl")
    args = ["score", "--model", tiny_llama, "--pool", pool, "--device", "cpu", "--shard-size", "5"]
    assert run(*args, "--out", tmp_path / "a").exit_code == 0
    shard = sorted((tmp_path / "advisor-home" / "scores").glob("*/shard-*.jsonl"))[1]
    shard.write_text("{broken\n")
    r = run(*args, "--out", tmp_path / "b")
    assert r.exit_code == 2 and "damaged and has been removed" in r.stderr and not (tmp_path / "b").exists()
    assert run(*args, "--out", tmp_path / "b").exit_code == 0
    assert (tmp_path / "a" / "scores.jsonl").read_bytes() == (tmp_path / "b" / "scores.jsonl").read_bytes()


BAD_POOLS = {
    "malformed JSON line": ('{"problem": "a", "generations": ["x", "y"]}\n{"problem": \n', "line 2: not valid JSON"),
    "missing field": ('{"problem": "a", "generations": ["x", "y"]}\n{"generations": ["x", "y"]}\n', "missing field 'problem'"),
    "one candidate": ('{"problem": "a", "generations": ["only one"]}\n', "no problem has 2 usable candidates"),
    "empty response": ('{"problem": "a", "generations": ["x", ""]}\n', "no problem has 2 usable candidates"),
}


@pytest.mark.parametrize("case", list(BAD_POOLS))
def test_bad_pool_is_one_line_and_no_output(tiny_llama, tmp_path, case):
    text, msg = BAD_POOLS[case]
    (tmp_path / "bad.jsonl").write_text(text)
    r = run("score", "--model", tiny_llama, "--pool", tmp_path / "bad.jsonl", "--out", tmp_path / "out", "--device", "cpu")
    assert r.exit_code == 2
    assert msg in r.stderr and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_strict_turns_a_skip_into_an_error(tiny_llama, tmp_path):
    path = write_pool(tmp_path / "pool.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps({"uuid": "x", "problem": "q", "generations": ["a", ""]}) + "\n")
    r = run("score", "--model", tiny_llama, "--pool", path, "--out", tmp_path / "out", "--strict")
    assert r.exit_code == 2 and "problem 'x': empty response (--strict)" in r.stderr
    assert not (tmp_path / "out").exists()


def test_bad_model_and_flags(tiny_llama, tmp_path):
    pool = write_pool(tmp_path / "pool.jsonl")
    r = run("score", "--model", tmp_path / "no-such-model", "--pool", pool, "--out", tmp_path / "out")
    assert r.exit_code == 2 and "does not exist" in r.stderr and not (tmp_path / "out").exists()
    r = run("score", "--model", pool, "--pool", pool, "--out", tmp_path / "out")
    assert r.exit_code == 2 and "is a file, not a model folder" in r.stderr

    assert run("score", "--model", tiny_llama, "--pool", pool, "--out", tmp_path / "s", "--device", "cpu").exit_code == 0
    scores = tmp_path / "s" / "scores.jsonl"
    for flags, msg in [(["--strategy", "hardest"], "'hardest' is not one of 'high', 'low', 'mixed', 'curriculum'"),
                       (["--strategy", "mixed", "--mix", "-0.5"], "--mix -0.5 is outside [0, 1]"),
                       (["--format", "csv"], "'csv' is not one of 'trl', 'messages', 'alpaca'")]:
        r = run("select", "--pool", pool, "--scores", scores, "--out", tmp_path / "sel.jsonl", *flags)
        assert r.exit_code == 2 and msg in r.stderr, r.stderr
        assert not (tmp_path / "sel.jsonl").exists()
    r = run("select", "--pool", pool, "--scores", tmp_path / "missing.jsonl", "--out", tmp_path / "sel.jsonl")
    assert r.exit_code == 2 and "run `advisor score` first" in r.stderr


def test_transformers_floor_is_one_number(monkeypatch):
    """pyproject's lower bound and the runtime check agree, and an older release is one clear error."""
    import re
    from pathlib import Path

    from capacity_advisor.models import loading
    from capacity_advisor.core.errors import InputError

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floor = re.search(r'"transformers>=([\d.]+)"', text).group(1)
    assert tuple(int(x) for x in floor.split(".")) == loading.MIN_TRANSFORMERS
    monkeypatch.setattr("importlib.metadata.version", lambda name: "4.46.0")
    import pytest

    with pytest.raises(InputError, match="transformers 4.46.0 is installed; capacity-advisor needs 5.0 or newer"):
        loading.check_transformers()


def test_progress_off_a_terminal_is_plain_lines_and_nothing_before_the_first_report(capsys):
    from capacity_advisor.advisor.cli import ui
    from capacity_advisor.core.errors import InputError

    with ui.work("steps") as w:
        task = w.add_task("probe D_high", total=20)  # no line yet: the work may still be refused
        assert capsys.readouterr().err == ""
        for step in range(1, 21):
            w.update(task, completed=step)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [f"probe D_high: {n}/20 steps" for n in range(1, 21, 2)] + [
        "probe D_high: 20/20 steps"]
    with pytest.raises(InputError):
        with ui.work() as w:
            w.status("loading the model")  # a stage's first line waits, and goes with a mistake found as it begins
            raise InputError("bad weights")
    assert capsys.readouterr().err == ""
    with ui.work() as w:
        w.status("loading the model")
        w.status("scoring")
    assert capsys.readouterr().err.splitlines() == ["loading the model", "scoring"]
