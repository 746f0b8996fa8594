"""Selection picks argmax / argmin per problem, and its exports read back as pools."""

import pytest
from helpers import write_jsonl

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.scoring.select import SelectConfig, export, extremes, select
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.text_metrics import ngram_repetition


@pytest.fixture
def pool_and_scores(tmp_path):
    rows, scores = [], {}
    for i in range(10):
        gens = [f"resp {i}-{k} " + "x" * k for k in range(4)]
        rows.append({"id": f"q{i}", "problem": f"problem {i}", "generations": gens, "answer": str(i)})
        for k in range(4):
            # a different winner for every problem: high is k = i % 4, low is k = (i + 1) % 4
            val = -1.0 if k == i % 4 else (-9.0 if k == (i + 1) % 4 else -5.0 - 0.1 * k)
            scores[(f"q{i}", k)] = {"id": f"q{i}", "k": k, "n_tokens": 10 + k, "logprob_sum": val * (10 + k),
                                    "logprob_mean": val, "truncated": False}
    path = tmp_path / "pool.jsonl"
    write_jsonl(path, rows)
    return read_pool(path), scores


def test_high_and_low_are_argmax_and_argmin(pool_and_scores):
    pool, scores = pool_and_scores
    high = select(pool, scores, SelectConfig("high", score="mean"))
    low = select(pool, scores, SelectConfig("low", score="mean"))
    for i, (h, lo) in enumerate(zip(high.rows, low.rows)):
        assert (h["id"], h["k"]) == (f"q{i}", i % 4)
        assert (lo["id"], lo["k"]) == (f"q{i}", (i + 1) % 4)
        assert h["response"] == pool.get(f"q{i}").candidates[i % 4].text
    assert high.summary["likelihood_gap"] == pytest.approx(8.0)
    assert high.summary["mean_score_high"] == pytest.approx(-1.0)


def test_each_set_reports_its_candidates_own_trigram_repetition(tmp_path):
    # problem a: the likelier candidate restates its step (4 of its 10 word trigrams repeat an earlier
    # one), the other states it once; problem b: both are bare answers, which hold no trigram
    looping, once = "so 3 + 4 = 7 so 3 + 4 = 7", "3 + 4 gives 7 , done"
    write_jsonl(tmp_path / "pool.jsonl", [{"id": "a", "problem": "3+4?", "generations": [looping, once], "answer": "7"},
                                          {"id": "b", "problem": "1+1?", "generations": ["2", "two"], "answer": "2"}])
    scores = {(pid, k): {"id": pid, "k": k, "n_tokens": 5, "logprob_sum": -1.0 - 5 * k, "logprob_mean": -0.2 - k,
                         "truncated": False} for pid in "ab" for k in (0, 1)}
    s = select(read_pool(tmp_path / "pool.jsonl"), scores, SelectConfig("high")).summary
    assert s["trigram_repetition_high"] == pytest.approx(4 / 10)
    assert s["trigram_repetition_low"] == 0.0
    assert s["gap_trigram_repetition"] == pytest.approx(-0.4)
    assert ngram_repetition("2") is None and ngram_repetition("C3+4*9=;A7") == 0.0
    assert ngram_repetition("a b c a b c a b c") == pytest.approx(4 / 7)


def test_sum_ranking_differs_from_mean(pool_and_scores):
    pool, scores = pool_and_scores
    for k in range(4):  # make longer responses win on the sum while mean is unchanged
        scores[("q0", k)]["logprob_sum"] = -100.0 + 10 * k
    assert select(pool, scores, SelectConfig("high", score="sum")).rows[0]["k"] == 3
    assert select(pool, scores, SelectConfig("high", score="mean")).rows[0]["k"] == 0
    assert SelectConfig().score == "sum"  # the paper's ranking is the default


def test_mixed_and_curriculum(pool_and_scores):
    pool, scores = pool_and_scores
    mixed = select(pool, scores, SelectConfig("mixed", score="mean", mix=0.3, seed=1))
    assert len(mixed.rows) == 10 and sum(r["phase"] == "low" for r in mixed.rows) == 3
    for r in mixed.rows:
        i = int(r["id"][1:])
        assert r["k"] == ((i + 1) % 4 if r["phase"] == "low" else i % 4)
    again = select(pool, scores, SelectConfig("mixed", score="mean", mix=0.3, seed=1))
    assert [r["k"] for r in again.rows] == [r["k"] for r in mixed.rows]
    assert sum(r["phase"] == "low" for r in select(pool, scores, SelectConfig("mixed", score="mean", mix=0.0)).rows) == 0
    cur = select(pool, scores, SelectConfig("curriculum", score="mean"))
    assert [r["phase"] for r in cur.rows] == ["high"] * 10 + ["low"] * 10


def test_ties_go_to_the_lower_index():
    assert extremes({0: -1.0, 1: -1.0, 2: -3.0, 3: -3.0}) == (0, 2)


@pytest.mark.parametrize("fmt,name", [("trl", "d.jsonl"), ("messages", "d.jsonl"), ("alpaca", "d.json")])
def test_exports_read_back_as_pools(pool_and_scores, tmp_path, fmt, name):
    pool, scores = pool_and_scores
    for strategy in ("high", "low"):
        sel = select(pool, scores, SelectConfig(strategy))
        out = tmp_path / f"{strategy}-{name}"
        assert export(sel, out, fmt) == 10
        back = read_pool(out, PoolOptions(min_candidates=1))
        assert [(p.prompt, p.candidates[0].text) for p in back.problems] == [(r["prompt"], r["response"]) for r in sel.rows]


def test_bad_settings_and_mismatched_scores(pool_and_scores):
    pool, scores = pool_and_scores
    with pytest.raises(InputError, match="--strategy 'best' is unknown"):
        select(pool, scores, SelectConfig("best"))
    with pytest.raises(InputError, match=r"--mix -0.2 is outside \[0, 1\]"):
        select(pool, scores, SelectConfig("mixed", score="mean", mix=-0.2))
    del scores[("q3", 2)]
    with pytest.raises(InputError, match="scores do not cover 1 of 10 problems.*q3"):
        select(pool, scores, SelectConfig("high", score="mean"))


def test_a_curriculum_must_switch_after_at_least_one_epoch(pool_and_scores):
    pool, scores = pool_and_scores
    for epoch in (0, -1):  # a manifest refuses training.switch_epoch outside (0, epochs)
        with pytest.raises(InputError, match=f"--switch-epoch {epoch} must be at least 1"):
            select(pool, scores, SelectConfig("curriculum", switch_epoch=epoch))
    assert select(pool, scores, SelectConfig("curriculum", switch_epoch=1)).summary["switch_epoch"] == 1


def test_rank_surprisal_ranking_and_response_start_cues(pool_and_scores):
    """rsr: D_high is each problem's lowest mean-rank / mean-NLL response; cues count response starts."""
    pool, scores = pool_and_scores
    for (pid, k), r in scores.items():
        r["rank_mean"] = 1.0 + k  # lower k: higher-ranked tokens
        r["logprob_mean"] = -1.0 - (3 - k) * 0.1  # lower k: more surprising
        r["first_tokens"] = "Okay," if k % 2 else "So"
    high = select(pool, scores, SelectConfig("high", score="rsr"))
    low = select(pool, scores, SelectConfig("low", score="rsr"))
    ratio = {k: (1.0 + k) / (1.0 + (3 - k) * 0.1) for k in range(4)}
    assert {r["k"] for r in high.rows} == {min(ratio, key=ratio.get)} and {r["k"] for r in low.rows} == {max(ratio, key=ratio.get)}
    assert high.summary["start_cues_high"] == [("So", 1.0)] and high.summary["start_cues_low"] == [("Okay,", 1.0)]
    del scores[("q0", 0)]["rank_mean"]
    with pytest.raises(InputError, match="rescore"):
        select(pool, scores, SelectConfig("high", score="rsr"))


def test_local_ranking_needs_step_local_scores(pool_and_scores):
    pool, scores = pool_and_scores
    with pytest.raises(InputError, match="--local-window"):
        select(pool, scores, SelectConfig("high", score="local"))
    for (pid, k), r in scores.items():
        r["logprob_local"] = -0.1 * ((k + 2) % 4)
    assert {r["k"] for r in select(pool, scores, SelectConfig("high", score="local")).rows} == {2}


def test_the_repetition_is_read_on_an_evenly_spaced_sample_of_a_large_pool():
    from capacity_advisor.advisor.scoring.select import REPETITION_SAMPLE, repetition_summary

    n = 4 * REPETITION_SAMPLE  # every 4th problem is read: those are the looping ones here
    high = ["a b c a b c" if i % 4 == 0 else "x y z" for i in range(n)]
    s = repetition_summary(high, ["one two three"] * n)
    assert s["trigram_repetition_high"] == pytest.approx(0.25) and s["trigram_repetition_low"] == 0.0
    small = repetition_summary(high[:8], high[:8])  # a small pool is read whole: 2 looping of 8
    assert small["trigram_repetition_high"] == pytest.approx(0.25 * 2 / 8) and small["gap_trigram_repetition"] == 0.0
