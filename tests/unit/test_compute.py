"""Compute-responsive problems: the split is exactly the problems a longer budget flips to right."""

import json

import pytest
from click.testing import CliRunner
from helpers import read_jsonl, write_jsonl

from capacity_advisor.advisor.cli.main import cli
from capacity_advisor.advisor.scoring.compute import ComputeConfig, keep_problems, measure
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.core.errors import InputError


class Budgeted:
    """A backend whose answers depend on the budget: problem i is right with the short budget when
    i % 3 == 0, with the long one when i % 3 != 2."""

    def generate(self, prompts, max_new_tokens, temperature=0.0, n=1, seed=0, progress=None, **kw):
        out = []
        for p in prompts:
            i = int(p.split()[1])
            right = i % 3 == 0 if max_new_tokens < 100 else i % 3 != 2
            out.append([f"so \\boxed{{{i + 1 if right else -1}}}"] * n)
        return out


@pytest.fixture
def pool(tmp_path):
    rows = [{"id": f"p{i}", "problem": f"problem {i}", "answer": str(i + 1), "generations": ["a", "b"]} for i in range(9)]
    path = tmp_path / "pool.jsonl"
    write_jsonl(path, rows)
    return path


def test_the_responsive_split_is_exactly_the_problems_that_flip(pool, tmp_path):
    p = read_pool(pool)
    rows = measure(Budgeted(), p, ComputeConfig(short=32, long=512), "math")
    assert {r["id"]: r["class"] for r in rows} == {f"p{i}": ("solved", "responsive", "unsolved")[i % 3] for i in range(9)}
    write_jsonl(tmp_path / "compute.jsonl", rows)
    assert [q.id for q in keep_problems(p, tmp_path / "compute.jsonl", "responsive").problems] == ["p1", "p4", "p7"]
    assert len(keep_problems(p, tmp_path / "compute.jsonl", "all")) == 9
    with pytest.raises(InputError, match="--compute-budgets"):
        keep_problems(p, tmp_path / "missing.jsonl", "responsive")
    with pytest.raises(InputError, match="SHORT < LONG"):
        ComputeConfig.parse("512,32")


def test_score_measures_and_select_composes_with_the_strategy(lab_home, tmp_path):
    pool = tmp_path / "lab.jsonl"
    assert CliRunner().invoke(cli, ["lab", "pool", "--n", 30, "--out", str(pool)]).exit_code == 0
    r = CliRunner().invoke(cli, ["score", "-m", "lab:xs", "-p", str(pool), "-o", str(tmp_path / "s"), "--score-length", 96,
                                 "--compute-budgets", "2,48", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    rows = read_jsonl(tmp_path / "s" / "compute.jsonl")
    assert len(rows) == 30 and all(r["short_right"] == 0 for r in rows)  # 2 new tokens never reach ";A<n>"
    solved_long = {r["id"] for r in rows if r["long_right"]}
    assert {r["id"] for r in rows if r["class"] == "responsive"} == solved_long
    if solved_long:
        r = CliRunner().invoke(cli, ["select", "-p", str(pool), "-s", str(tmp_path / "s" / "scores.jsonl"), "--problems",
                                     "responsive", "--strategy", "low", "-o", str(tmp_path / "d.jsonl"), "--json"])
        assert r.exit_code == 0, r.stderr
        assert {json.loads(x)["id"] for x in (tmp_path / "d.jsonl").read_text().splitlines()} == solved_long
