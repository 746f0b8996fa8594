"""training/race.py and `advisor train --race`: D_high against D_low on tiny random-init students.

The data make one set clearly better: every held-out problem's answer is 7, D_high's responses all
end in \\boxed{7} and D_low's in \\boxed{3}, so after a few steps D_high answers every problem right
and D_low none."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import EvalSpec
from capacity_advisor.advisor.predictor.races import race
from capacity_advisor.training.race import RaceRule, decide, keeps_low, race_manifests, run_race
from helpers import RACE_MANIFEST, race_curve, race_manifest

EVAL_FIELDS = ("step", "epoch", "accuracy", "repetition_rate", "answer_rate", "per_problem")


def invoke(*args):
    from capacity_advisor.advisor.cli.train import train

    return CliRunner().invoke(train, [str(a) for a in args])


def weights(run: Path) -> dict:
    from safetensors.torch import load_file

    last = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return load_file(str(last / "model.safetensors"))


def eval_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in EVAL_FIELDS} for r in rows]


@pytest.fixture(scope="module")
def clear_race(tmp_path_factory, tiny_llama):
    """A race on the clear data through the CLI, with the whole budget allowed (--race 1)."""
    root = tmp_path_factory.mktemp("race")
    path = race_manifest(root / "rec", tiny_llama)
    out = root / "out"
    r = invoke(path, "--out", out, "--race", 1, "--threads", 1, "--records", root / "records.jsonl", "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output[r.output.index("{\n"):]) if "{\n" in r.output else json.loads(r.output.splitlines()[-1])
    return root, path, out, shown


def test_race_stops_once_one_set_leads_for_k_evaluations(clear_race):
    root, _, out, shown = clear_race
    race = json.loads((out / "race.json").read_text())
    assert race["winner"] == "high" and race["loser"] == "low" and race["status"] == "done"
    stop = race["stopped"]
    assert stop["reason"] == "lead" and stop["winner"] == "high" and stop["share"] < 1
    comps = race["comparisons"]
    assert len(comps) == stop["evaluation"] and [c["leader"] for c in comps[-2:]] == ["high", "high"]
    assert all(c["leader"] is None for c in comps[:-2])  # no lead before the two that stopped it
    assert comps[-1]["mean_difference"] > 0.05 and comps[-1]["problems"] == 8
    assert shown["winner"] == "high" and shown["stopped"] == "lead" and shown["final_accuracy"] == 1.0
    # the winner ran to the end; the loser stopped at the race's last evaluation, its folder kept
    high, low = out / "race" / "high", out / "race" / "low"
    record = json.loads((high / "record.json").read_text())
    assert record["evals"][-1]["epoch"] == 2 and record["provenance"]["race"]["stopped"] == stop
    assert not (low / "record.json").exists()
    assert eval_rows(low)[-1]["step"] == stop["step"] and (low / f"checkpoint-{stop['step']}").is_dir()
    # only the finished run is in the records store
    store = [json.loads(x) for x in (root / "records.jsonl").read_text().splitlines()]
    assert [s["run_id"] for s in store] == [record["run_id"]]


def test_the_base_is_evaluated_once_for_both_raced_runs(clear_race):
    """Both runs start from the same student and are judged on the same problems: the second takes
    the first's step-0 evaluation whole (its timing too) instead of generating it again."""
    _, _, out, _ = clear_race
    first, second = ([json.loads(x) for x in (out / "race" / s / "eval.jsonl").read_text().splitlines()][0]
                     for s in ("high", "low"))
    assert first["step"] == 0 and first["eval_seconds"] > 0
    assert second == first


def test_the_continued_winner_equals_an_uninterrupted_run(clear_race):
    import torch

    from capacity_advisor.training.manifest import load_manifest
    from capacity_advisor.training.sft import run_sft

    root, path, out, _ = clear_race
    plain = race_manifests(load_manifest(path))["high"]
    full = run_sft(plain, root / "full", records=str(root / "full.jsonl"), threads=1)
    raced = json.loads((out / "race" / "high" / "record.json").read_text())
    assert full["provenance"]["resumed_from_step"] is None and raced["provenance"]["resumed_from_step"] > 0
    assert raced["run_id"] == full["run_id"]
    assert eval_rows(out / "race" / "high") == eval_rows(root / "full")
    a, b = weights(out / "race" / "high"), weights(root / "full")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    same = lambda r: {k: v for k, v in r.items() if k not in ("provenance", "evals")}  # noqa: E731
    assert same(raced) == same(full)
    assert raced["evals"] == full["evals"]  # the training losses too


def test_a_rerun_of_a_finished_race_trains_nothing(clear_race):
    root, path, out, _ = clear_race
    before = (out / "race.json").read_text()
    r = invoke(path, "--out", out, "--race", 1, "--threads", 1, "--records", root / "records.jsonl", "--json")
    assert r.exit_code == 0, r.output
    assert "already complete" in r.output and json.loads((out / "race.json").read_text()) == json.loads(before)
    assert len((root / "records.jsonl").read_text().splitlines()) == 1


def test_a_race_without_a_lead_stops_at_its_share_of_the_budget(tmp_path, tiny_llama):
    # the same responses in both sets: the paired difference is 0 at every evaluation
    path = race_manifest(tmp_path / "rec", tiny_llama, low=7)
    summary = run_race(path, tmp_path / "out", RaceRule(fraction=0.3), records=str(tmp_path / "r.jsonl"), threads=1)
    stop = summary["stopped"]
    # evaluations at every step of 8: the first at or past 30 % of the budget is step 3
    assert stop == {"reason": "fraction", "winner": "high", "step": 3, "epoch": 0.75, "share": 0.375, "evaluation": 3}
    assert all(c["mean_difference"] == 0 and c["leader"] is None for c in summary["comparisons"])
    assert json.loads((tmp_path / "out" / "race" / "high" / "record.json").read_text())["evals"][-1]["step"] == 8
    assert eval_rows(tmp_path / "out" / "race" / "low")[-1]["step"] == 3


def test_a_race_evaluates_at_its_share_between_the_scheduled_evaluations(tmp_path, tiny_llama):
    """One evaluation an epoch (steps 4 and 8): a race to 30 % of the budget adds one at step 3 and
    stops there, where it stopped at step 4 (half the budget) before."""
    from capacity_advisor.training.manifest import TrainingSpec

    coarse = TrainingSpec(epochs=2, learning_rate=3e-3, batch_size=4, evals_per_epoch=1, save_total_limit=2,
                          warmup_ratio=0.0)
    path = race_manifest(tmp_path / "rec", tiny_llama, low=7, training=coarse)
    summary = run_race(path, tmp_path / "out", RaceRule(fraction=0.3), records=str(tmp_path / "r.jsonl"), threads=1)
    assert summary["stopped"] == {"reason": "fraction", "winner": "high", "step": 3, "epoch": 0.75, "share": 0.375,
                                  "evaluation": 1}
    assert [r["step"] for r in eval_rows(tmp_path / "out" / "race" / "high")] == [0, 3, 4, 8]
    assert [r["step"] for r in eval_rows(tmp_path / "out" / "race" / "low")] == [0, 3]
    record = json.loads((tmp_path / "out" / "race" / "high" / "record.json").read_text())
    assert [e["step"] for e in record["evals"]] == [0, 3, 4, 8]


def test_only_sets_of_equal_size_are_evaluated_at_the_shares_and_a_manifests_own_are_kept(tmp_path, tiny_llama):
    """Evaluations are paired by their order, so the rule's shares are added only where both runs take
    the same steps (as many rows in both sets); a manifest's own eval_at is kept beside them."""
    from capacity_advisor.training.manifest import TrainingSpec
    from capacity_advisor.training.race import check_race
    from helpers import write_set

    own = TrainingSpec(epochs=2, learning_rate=3e-3, batch_size=4, evals_per_epoch=1, warmup_ratio=0.0, eval_at=[0.9])
    path = race_manifest(tmp_path / "rec", tiny_llama, training=own)
    _, runs, *_ = check_race(path, tmp_path / "out", RaceRule(fraction=0.75, tie=0.3), "cpu", "auto", None, None)
    assert all(runs[s].training.eval_at == [0.3, 0.75, 0.9] for s in ("high", "low"))
    write_set(tmp_path / "rec" / "train-low.jsonl", 3, n=12)  # D_low now has 3 steps an epoch, D_high 4
    _, runs, *_ = check_race(path, tmp_path / "out2", RaceRule(fraction=0.75, tie=0.3), "cpu", "auto", None, None)
    assert all(runs[s].training.eval_at == [0.9] for s in ("high", "low"))


def test_a_replay_pairs_the_two_runs_by_epoch():
    """A race's winner stored with an evaluation at its share, beside a plain run of the other set:
    the replay pairs the evaluations both made, as if the extra one were not there."""
    plain = [(0.5, 0.4), (1.0, 0.5), (1.5, 0.6), (2.0, 0.6)]
    extra = [(0.5, 0.4), (1.0, 0.5), (1.25, 0.9), (1.5, 0.6), (2.0, 0.6)]
    low = [(0.5, 0.3), (1.0, 0.55), (1.5, 0.7), (2.0, 0.7)]
    assert race(extra, low, 2.0, 0.75) == race(plain, low, 2.0, 0.75) == ("low", 0.75)


def test_the_race_shares_a_launched_segment_evaluates_at_are_checked():
    from capacity_advisor.training.launch import sft_args
    from capacity_advisor.training.sft_cli import race_shares

    args = sft_args("m.json", "out", race_set="low", pause_after_evals=1, race_eval_at=[0.3, 0.75])
    assert args[args.index("--race-eval-at") + 1] == "0.3,0.75" and race_shares("0.3,0.75") == [0.3, 0.75]
    assert race_shares(None) is None
    for bad in ("x", "0", "0.5,2", ","):
        with pytest.raises(InputError, match="--race-eval-at"):
            race_shares(bad)
    assert RaceRule(fraction=0.75, tie=0.3, wait=1.0).shares() == [0.3, 0.75]
    from capacity_advisor.training.sft_cli import main

    r = CliRunner().invoke(main, ["--manifest", "m.json", "--out", "o", "--race-eval-at", "0.5"])
    assert r.exit_code == 2 and "--race-eval-at goes with --race-set" in r.output


def test_a_killed_race_resumes_to_the_same_decision(tmp_path, tiny_llama, monkeypatch, clear_race):
    from transformers import TrainerCallback

    import capacity_advisor.training.sft as sft

    class Killed(Exception):
        pass

    class DieInTheStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            raise Killed  # after an optimizer step, before its checkpoint

    real, calls = sft.run_sft, []

    def dies_on_the_fifth(*a, **kw):  # the third segment of D_high
        calls.append(a[1])
        return real(*a, **kw, **({"callbacks": [DieInTheStep()]} if len(calls) == 5 else {}))

    path = race_manifest(tmp_path / "rec", tiny_llama)
    monkeypatch.setattr(sft, "run_sft", dies_on_the_fifth)
    with pytest.raises(Killed):
        run_race(path, tmp_path / "out", RaceRule(fraction=1.0), records=str(tmp_path / "r.jsonl"), threads=1)
    assert json.loads((tmp_path / "out" / "race.json").read_text())["status"] == "racing"
    monkeypatch.setattr(sft, "run_sft", real)
    summary = run_race(path, tmp_path / "out", RaceRule(fraction=1.0), records=str(tmp_path / "r.jsonl"), threads=1)
    uninterrupted = json.loads((clear_race[2] / "race.json").read_text())
    assert summary["stopped"] == uninterrupted["stopped"] and summary["comparisons"] == uninterrupted["comparisons"]


# ---- the decision on handmade evaluations ----------------------------------------------------
def test_a_lead_counts_only_in_a_row_and_beyond_its_noise():
    rule = RaceRule(fraction=1.0, k=2, margin=0.05)
    ten = lambda n: [1] * n + [0] * (10 - n)  # noqa: E731
    # every problem flips (far beyond the noise) at evaluations 1, 3 and 4, level at 2: the run of two ends at 4
    flips = {"high": race_curve([ten(0), ten(5), ten(0), ten(0), ten(0)]), "low": race_curve([ten(10), ten(5), ten(10), ten(10), ten(10)])}
    comps, stop = decide(flips, rule, RACE_MANIFEST)
    assert [c["leader"] for c in comps] == ["low", None, "low", "low"]
    assert stop["reason"] == "lead" and stop["winner"] == "low" and stop["evaluation"] == 4 and stop["step"] == 4
    assert comps[0]["mean_difference"] == -1 and comps[0]["standard_error"] == 0
    # 2 of 10 problems better under D_high: 0.2 is past the margin but within 1.96 standard errors (0.26)
    comps, stop = decide({"high": race_curve([ten(4)] * 3), "low": race_curve([ten(2)] * 3)}, rule, RACE_MANIFEST)
    assert [c["leader"] for c in comps] == [None, None, None] and stop is None
    assert comps[0]["mean_difference"] == pytest.approx(0.2) and 1.96 * comps[0]["standard_error"] > 0.2
    # 20 of 100 are beyond it (1.96 standard errors: 0.08)
    hundred = lambda n: [1] * n + [0] * (100 - n)  # noqa: E731
    comps, stop = decide({"high": race_curve([hundred(40)] * 2), "low": race_curve([hundred(20)] * 2)}, rule, RACE_MANIFEST)
    assert [c["leader"] for c in comps] == ["high", "high"] and stop["winner"] == "high"
    # a difference under the margin is no lead, however steady
    wide = RaceRule(fraction=1.0, k=1, margin=0.5)
    comps, stop = decide({"high": race_curve([ten(0)]), "low": race_curve([ten(4)])}, wide, RACE_MANIFEST)
    assert comps[0]["leader"] is None and stop is None
    # when neither run can go on, their last evaluation ends the race
    _, stop = decide({"high": race_curve([ten(0)]), "low": race_curve([ten(4)])}, wide, RACE_MANIFEST, finished=True)
    assert stop["reason"] == "fraction" and stop["winner"] == "low"


def test_at_the_share_the_best_accuracy_so_far_wins_and_high_wins_ties():
    rule = RaceRule(fraction=0.5, k=2)
    ten = lambda n: [1] * n + [0] * (10 - n)  # noqa: E731
    _, stop = decide({"high": race_curve([ten(3), ten(4), ten(4), ten(4)]), "low": race_curve([ten(5), ten(3), ten(3), ten(3)])},
                     rule, RACE_MANIFEST)
    assert stop["reason"] == "fraction" and stop["winner"] == "low" and stop["share"] == 0.5 and stop["step"] == 4
    _, stop = decide({"high": race_curve([ten(4)] * 4), "low": race_curve([ten(4)] * 4)}, rule, RACE_MANIFEST)
    assert stop["winner"] == "high"


def test_a_replay_at_the_shares_stops_there_on_what_was_seen_before():
    """`races.race(at_shares=True)` replays a race that evaluates at its stop shares on records that
    evaluated twice a budget: it stops at the share itself and decides on the evaluations before it."""
    high, low = [(0.5, 0.4), (1.0, 0.5)], [(0.5, 0.3), (1.0, 0.9)]  # D_low ahead only at the end
    assert race(high, low, 1.0, 0.75) == ("low", 1.0)  # the schedule's next evaluation: the whole budget
    assert race(high, low, 1.0, 0.75, at_shares=True) == ("high", 0.75)  # at 75 %, on the half-way evaluation
    assert race(high, low, 1.0, 0.5, at_shares=True) == ("high", 0.5)  # on the schedule: as before
    # nothing seen before a share: the tie check cannot stop for D_high, the race stops at F for D_high
    assert race(high, low, 1.0, 0.75, tie=0.3, at_shares=True) == ("high", 0.75)
    assert race([(1.0, 0.5)], [(1.0, 0.9)], 1.0, 0.75, at_shares=True) == ("high", 0.75)
    # a race waiting for a gaining D_low stops at its wait share, not at the end
    rising = [(0.2, 0.1), (0.4, 0.2), (0.55, 0.3), (0.8, 0.35), (1.0, 0.9)]
    flat = [(e, 0.4) for e, _ in rising]
    assert race(flat, rising, 1.0, 0.6, wait=0.9, at_shares=True) == ("high", 0.9)
    assert race(flat, rising, 1.0, 0.6, wait=0.9) == ("low", 1.0)


def test_a_tie_check_stops_for_d_high_where_d_low_shows_nothing_and_the_replay_agrees():
    """At the first evaluation at or past `tie`, a race whose D_low has not been ahead at any evaluation
    and is not gaining stops for D_high ("tie"); one whose D_low led once (even if overtaken since), or
    is climbing, goes on to its
    fraction. The replay of the calibration records (`races.race`) stops the same races the same way."""
    ten = lambda n: [1] * n + [0] * (10 - n)  # noqa: E731
    rule = RaceRule(fraction=0.75, k=None, tie=0.375)  # evaluations every eighth of the budget: the check is the 3rd
    cases = {
        "nothing": ([4, 4, 4, 4, 4, 4], [3, 3, 3, 3, 3, 3], ("tie", "high", 3)),
        "led once": ([4, 4, 4, 4, 4, 4], [5, 3, 3, 3, 3, 3], ("fraction", "low", 6)),
        # ahead at the first evaluation, overtaken since (D_high's best is higher): it has been ahead, so it goes on
        "led, then overtaken": ([4, 6, 6, 6, 6, 6], [5, 3, 3, 3, 3, 3], ("fraction", "high", 6)),
        "climbing": ([4, 4, 4, 4, 4, 4], [1, 2, 3, 3, 3, 3], ("fraction", "high", 6)),
        "level": ([4] * 6, [4] * 6, ("tie", "high", 3)),
    }
    for name, (high, low, (reason, winner, at)) in cases.items():
        curves = {"high": race_curve([ten(n) for n in high]), "low": race_curve([ten(n) for n in low])}
        _, stop = decide(curves, rule, RACE_MANIFEST)
        assert (stop["reason"], stop["winner"], stop["evaluation"]) == (reason, winner, at), name
        replayed = race([(r["epoch"], r["accuracy"]) for r in curves["high"][1:]],
                        [(r["epoch"], r["accuracy"]) for r in curves["low"][1:]], 2.0, 0.75, tie=0.375, n_eval=10)
        assert replayed == (winner, stop["share"]), name
    # without the check the level race runs to its fraction
    _, stop = decide({"high": race_curve([ten(4)] * 6), "low": race_curve([ten(4)] * 6)},
                     RaceRule(fraction=0.75, k=None), RACE_MANIFEST)
    assert (stop["reason"], stop["evaluation"]) == ("fraction", 6)
    for bad in (0.75, 0.9, 0.0, -0.1, math.nan):
        with pytest.raises(InputError, match="--race-tie"):
            RaceRule(fraction=0.75, tie=bad).check()


# ---- bad input: one error line, exit 2, nothing written ----------------------------------------
@pytest.mark.parametrize("fraction", ["0", "-0.5", "1.5", "nan", "inf"])
def test_a_bad_share_is_one_error_line(tmp_path, fraction):
    path = race_manifest(tmp_path / "rec", "lab:s")
    r = invoke(path, "--out", tmp_path / "out", "--race", fraction)
    assert r.exit_code == 2 and r.output.startswith("error: --race") and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, words", [
    ({"sets": {}}, "needs both D_high and D_low"),
    ({"sets": {}, "strategy": "mixed", "mix": 0.5}, "D_high (sets.high) or D_low (sets.low)"),
    ({"eval": EvalSpec()}, "held-out problems"),
])
def test_a_manifest_without_both_sets_is_one_error_line(tmp_path, change, words):
    path = race_manifest(tmp_path / "rec", "lab:s", **change)
    r = invoke(path, "--out", tmp_path / "out", "--race", "0.5")
    assert r.exit_code == 2 and r.output.startswith("error:") and words in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_bad_race_options_and_sets_are_one_error_line(tmp_path):
    path = race_manifest(tmp_path / "rec", "lab:s")
    for extra, words in ((["--race-k", "0"], "--race-k 0"), (["--race-margin", "1"], "--race-margin 1"),
                         (["--nproc", "0"], "--nproc"), (["--export", tmp_path / "x"], "--export")):
        r = invoke(path, "--out", tmp_path / "out", "--race", "0.5", *extra)
        assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    d = json.loads(path.read_text())
    d["sets"] = {"low": "gone.jsonl", "medium": "x.jsonl"}
    path.write_text(json.dumps(d))
    r = invoke(path, "--out", tmp_path / "out", "--race", "0.5")
    assert r.exit_code == 2 and "sets.low: file" in r.output and "medium" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="--race nan"):
        RaceRule(fraction=math.nan).check()


def test_a_hold_keeps_d_low_only_on_a_lead_beyond_the_noise_of_the_problems_and_the_replay_agrees():
    """With `hold` Z, a race stopped at its share keeps D_low only where its best accuracy leads D_high's
    by more than Z standard errors of the difference over the problems evaluated: on 32 problems a lead
    of one problem (0.22 against 0.25: the round/mixlang race) is noise, one of eight is not."""
    assert keeps_low(0.3, 0.31, 32) and not keeps_low(0.3, 0.3, 32)  # no hold: any lead, D_high on ties
    se = math.sqrt((0.21875 * 0.78125 + 0.25 * 0.75) / 32)  # 0.106
    assert not keeps_low(0.21875, 0.25, 32, hold=0.5) and keeps_low(0.21875, 0.25, 32, hold=0.29)
    assert 0.03125 < 0.5 * se and keeps_low(0.125, 0.375, 32, hold=1.0)  # 8 problems of 32: 0.25 > 0.11
    assert not keeps_low(0.0, 0.0, 32, hold=1.0) and keeps_low(0.0, 1.0, 32, hold=10)  # no noise at 0 and 1
    n32 = lambda n: [1] * n + [0] * (32 - n)  # noqa: E731
    rule = RaceRule(fraction=0.5, k=None, hold=0.5)
    for high, low, winner in (([7, 7], [8, 8], "high"), ([7, 7], [12, 12], "low"), ([7, 5], [6, 9], "low")):
        curves = {"high": race_curve([n32(n) for n in high + [0, 0]]), "low": race_curve([n32(n) for n in low + [0, 0]])}
        _, stop = decide(curves, rule, RACE_MANIFEST)
        assert (stop["reason"], stop["winner"], stop["evaluation"]) == ("fraction", winner, 4), (high, low)
        _, plain = decide(curves, replace(rule, hold=0.0), RACE_MANIFEST)
        assert plain["winner"] == ("low" if max(low) > max(high) else "high")
        replayed = race([(r["epoch"], r["accuracy"]) for r in curves["high"][1:]],
                        [(r["epoch"], r["accuracy"]) for r in curves["low"][1:]], 2.0, 0.5, n_eval=32, hold=0.5)
        assert replayed == (winner, stop["share"])
    for bad in (-0.1, 11, math.nan, True):
        with pytest.raises(InputError, match="--race-hold"):
            RaceRule(fraction=0.75, hold=bad).check()
