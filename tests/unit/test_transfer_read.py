"""experiments.transfer reads a calibration folder still running from its runs' record.json files;
each run keeps the seed its unit folder names, so two seeds of one student are two units, not one."""

import json
import math

import pytest

from capacity_advisor.advisor.predictor.labels import unit_of
from experiments.transfer import read_records


def test_a_running_calibration_folder_keeps_each_units_seed(tmp_path):
    for seed in (0, 1):
        for s in ("high", "low"):
            run = tmp_path / "units" / f"lab:smollm2-135m-s{seed}" / s
            run.mkdir(parents=True)
            (run / "record.json").write_text(json.dumps({
                "strategy": s, "model": {"spec": "lab:smollm2-135m"}, "settings": {"seed": None},
                "pool": {"task": "linear", "teacher": "scripted"},
                "evals": [{"step": 0, "epoch": 0.0, "accuracy": 0.1}]}))
    records = read_records([tmp_path])
    assert sorted(unit_of(r)["seed"] for r in records) == [0, 0, 1, 1]
    assert {(unit_of(r)["repeat"], r["strategy"]) for r in records} == {(0, "high"), (0, "low"), (1, "high"), (1, "low")}


def test_the_gated_race_is_replayed_with_the_plans_own_stops(monkeypatch):
    """A gate whose race has a tie check or a lead rule is judged as `advisor train` would run it:
    the transfer's "gated race (shipped)" equals the replay of that very race on each row."""
    import math

    from helpers import ROOT

    import experiments.transfer as transfer
    from capacity_advisor.advisor.predictor import Policy, label_rows
    from capacity_advisor.advisor.predictor.evaluate import regret
    from capacity_advisor.advisor.predictor.gate import Gate
    from capacity_advisor.advisor.predictor.races import with_curves

    records = read_records([ROOT / "calibration" / "lab2" / "subtraction-explore"])[:12]  # six units: D_high wins
    rows = with_curves(label_rows(records), records)
    for gate in (Gate(0.0, math.inf, 0.75, tie=0.3), Gate(0.0, math.inf, 1.0, k=1, margin=0.0)):
        monkeypatch.setattr(transfer.Policy, "of", classmethod(lambda cls, p, g=gate: Policy(margin=2.0, gate=g)))
        judged = transfer.judge(records)["methods"]
        got = judged["gated race (shipped)"]["all"]
        at = [gate.replay(r, at_shares=True) for r in rows]  # the race as `advisor train` runs it: at its shares
        assert judged[transfer.AT_SHARES]["all"]["overhead"] == pytest.approx(sum(s for _, s in at) / len(at))
        want = [gate.replay(r) for r in rows]
        plain = [Gate(0.0, math.inf, gate.fraction).replay(r) for r in rows]  # the same share, no stop before it
        assert got["rows"] == len(rows) == 24 and want != plain
        assert got["overhead"] == pytest.approx(sum(s for _, s in want) / len(want)), gate
        kept = [regret(r, c) for r, (c, _) in zip(rows, want)]  # the very sets the replay kept, not only its cost
        assert got["regret"] == pytest.approx(100 * sum(kept) / len(kept)), gate
    # the row with a D_high scout: where the probe's D_high lead reaches it, D_high at no cost; elsewhere the race
    leads = [transfer.accuracy_lead(r["features"]) for r in rows]
    t = sorted(-x for x in leads)[len(leads) // 2]  # a lead half of these rows reach
    scouted = transfer.judge(records, high_scout=t)["methods"][transfer.high_row(t)]["all"]
    at = [("high", 0.0) if -x >= t - 1e-9 else gate.replay(r, at_shares=True) for r, x in zip(rows, leads)]
    assert 0 < sum(-x >= t - 1e-9 for x in leads) < len(rows)
    assert scouted["overhead"] == pytest.approx(sum(s for _, s in at) / len(at))
    assert scouted["regret"] == pytest.approx(100 * sum(regret(r, c) for r, (c, _) in zip(rows, at)) / len(at))


def test_the_cost_where_a_plan_races_is_the_mean_over_the_rows_it_raced_on():
    """Issue 50's figure for the user whose gate opens: a plan that races on a quarter of the rows at
    80 % of a run costs 20 % on average, and 80 % where it raced; one that never races, nothing."""
    from experiments.transfer import markdown, summary

    rows = [{"source": "s", "score": "sum", "student": f"st{i}", "budget": 1.0, "label": "high", "repeat": 0,
             "accuracy": {"high": 0.5, "low": 0.4, "mixed": 0.3}} for i in range(4)]
    raced = summary([(r, "high", 0.8 if i == 0 else 0.0) for i, r in enumerate(rows)], rows)
    assert raced["overhead"] == pytest.approx(0.2) and raced["raced"] == 0.25
    assert raced["overhead_where_raced"] == pytest.approx(0.8)
    never = summary([(r, "high", 0.0) for r in rows], rows)
    assert never["raced"] == 0 and never["overhead_where_raced"] is None
    table = {"rows": 4, "gate_opened": 0.25, "sources": ["s"],
             "methods": {"gated": {"all": raced, "by_source": {"s": raced}},
                         "always high": {"all": never, "by_source": {"s": never}}}}
    lines = markdown(table).splitlines()
    assert "| extra training | in tokens | raced on | extra training where raced |" in lines[2]
    assert "| 20 % | — | 25 % | 80 % |" in lines[4] and "| 0 % | — | 0 % | — |" in lines[5]


def test_a_race_costs_in_tokens_its_share_times_the_losing_sets_tokens_over_the_kept_sets():
    """D_low's worked solutions train several times D_high's tokens an epoch: a race that stops at 80 %
    and keeps D_high trains 0.8 x 3 = 2.4 runs of D_high's tokens more; keeping D_low, 0.8 / 3."""
    from capacity_advisor.advisor.predictor.labels import token_share
    from experiments.transfer import markdown, summary

    per_epoch = {"high": 100.0, "low": 300.0}
    assert token_share(per_epoch, "high", 0.8) == pytest.approx(2.4)
    assert token_share(per_epoch, "low", 0.8) == pytest.approx(0.8 / 3)
    assert token_share(per_epoch, "mixed", 0.0) == 0.0 and token_share({"high": 100.0}, "high", 0.5) is None
    rows = [{"source": "s", "score": "sum", "student": f"st{i}", "budget": 1.0, "label": "high", "repeat": 0,
             "accuracy": {"high": 0.5, "low": 0.4, "mixed": 0.3}} for i in range(4)]
    picks = [(rows[0], "high", 0.8), (rows[1], "low", 0.8), (rows[2], "high", 0.0), (rows[3], "high", 0.0)]
    got = summary(picks, rows, lambda r, kept, share: token_share(per_epoch, kept, share))
    assert got["overhead"] == pytest.approx(0.4) and got["overhead_tokens"] == pytest.approx((2.4 + 0.8 / 3) / 4)
    assert summary(picks, rows, lambda r, kept, share: None if share else 0.0)["overhead_tokens"] is None
    table = {"rows": 4, "gate_opened": 0.5, "sources": ["s"], "methods": {"gated": {"all": got, "by_source": {"s": got}}}}
    assert "| 40 % | 67 % | 50 % | 80 % |" in markdown(table).splitlines()[4]


def test_each_row_says_how_the_shipped_plan_met_it_and_they_add_up_to_its_table():
    """`--rows`: every (unit, budget) row with the shipped plan's P(D_low), its plan, what it kept and
    where it stopped; their regrets and stops average to the table's "evaluated at its shares" row,
    and a row the gate left shut costs nothing."""
    from helpers import ROOT

    from experiments.transfer import AT_SHARES, judge, rows_markdown

    paths = [ROOT / "calibration" / "real" / "round-scripted-s0", ROOT / "calibration" / "real" / "place-neural-s1"]
    t = judge(read_records(paths))
    per, shipped = t["per_row"], t["methods"][AT_SHARES]["all"]
    assert len(per) == t["rows"] == shipped["rows"] == 7
    assert sum(p["regret"] for p in per) / len(per) == pytest.approx(shipped["regret"])
    assert sum(p["share"] for p in per) / len(per) == pytest.approx(shipped["overhead"])
    assert sum(p["raced"] for p in per) / len(per) == pytest.approx(t["gate_opened"])
    assert all(p["share"] == 0 and p["kept"] == p["plan"] for p in per if not p["raced"])
    assert all(0 <= p["p_low"] <= 1 and p["label"] in p["accuracy"] for p in per)
    table = rows_markdown(t).splitlines()
    assert len(table) == 2 + len(per) and all(line.count("|") == 14 for line in table)
    assert {line.split(" | ")[0].lstrip("| ") for line in table[2:]} == {"round/scripted", "place/smollm2-135m-ft@T1"}


def test_rows_are_printed_after_the_table_only_when_asked(capsys):
    from helpers import ROOT

    from experiments.transfer import main

    folder = str(ROOT / "calibration" / "real" / "round-scripted-s0")
    assert main([folder]) == 0
    plain = capsys.readouterr().out
    assert main([folder, "--rows"]) == 0
    rows = capsys.readouterr().out
    assert rows.startswith(plain.rstrip("\n")) and "| P(D_low) |" in rows and "| P(D_low) |" not in plain


def test_the_likelihood_gap_rows_take_d_low_without_a_race_only_where_the_sum_ranking_shows_the_gap():
    """The "D_low where the likelihood gap per token ≤ G" rows: D_low at no cost where the pool's gap,
    ranked by the sum, is G or less (place-neural: D_low's worked answers likelier per token than
    D_high's), the race at its shares elsewhere (round-scripted's gap −0.15 is over −0.25)."""
    from helpers import ROOT

    from experiments.transfer import AT_SHARES, gap_row, gap_scouts, judge

    row = {"score": "sum", "features": {"likelihood_gap_per_token": -0.3}}
    assert gap_scouts(row, -0.25) and not gap_scouts(row, -0.5)
    assert not gap_scouts({**row, "score": "mean"}, -0.25)  # by the mean D_high is never less likely per token
    assert not gap_scouts({"score": "sum", "features": {"likelihood_gap_per_token": None}}, 0.0)
    paths = [ROOT / "calibration" / "real" / "round-scripted-s0", ROOT / "calibration" / "real" / "place-neural-s1"]
    t = judge(read_records(paths))
    picks = t["methods"][gap_row(-0.25)]["by_source"]
    assert picks["place/smollm2-135m-ft@T1"]["overhead"] == 0 and picks["place/smollm2-135m-ft@T1"]["regret"] == 0
    assert picks["round/scripted"] == t["methods"][AT_SHARES]["by_source"]["round/scripted"]
    # the shipped gate's own gap scout is -0.25: that row is the shipped plan, and the gate without it raced
    # place-neural, whose probe shows D_low ahead, so the row that also asks the probe takes D_low there too
    from experiments.transfer import GAP_LEAD, PLAIN, gap_lead_row

    assert t["methods"][gap_row(-0.25)]["all"] == t["methods"][AT_SHARES]["all"]
    assert t["methods"][PLAIN]["by_source"]["place/smollm2-135m-ft@T1"]["overhead"] > 0
    lead = t["methods"][gap_lead_row(GAP_LEAD)]["by_source"]
    assert lead["place/smollm2-135m-ft@T1"]["overhead"] == 0 and lead["round/scripted"] == picks["round/scripted"]


def test_the_d_high_scout_with_a_gain_reads_only_rows_whose_gain_is_measured_and_reached(monkeypatch, capsys):
    """`--high-scout-gain G`: a row whose probe shows D_high ahead by the scout's lead is taken as D_high
    only where D_high's own accuracy gain in the probe is a number of G or more; a row without that
    gain, or below it, is raced as the plan races it; a G that is not an accuracy gain is one error line."""
    import copy

    from capacity_advisor.advisor.lab.published import records as published_records
    from helpers import ROOT

    import experiments.transfer as transfer
    from capacity_advisor.advisor.predictor import Policy, label_rows
    from capacity_advisor.advisor.predictor.gate import Gate
    from capacity_advisor.advisor.predictor.races import with_curves

    # the five largest students at both seeds: D_high leads the probe by 0.08-0.13 (l-wide) or by 0.7 (xl, xxl)
    records = copy.deepcopy(published_records(ROOT / "calibration" / "lab2" / "subtraction-program")[30:])
    gate = Gate(0.0, math.inf, 0.75)  # opens on every row
    monkeypatch.setattr(transfer.Policy, "of", classmethod(lambda cls, p, g=gate: Policy(margin=2.0, gate=g)))
    t, g = 0.07, 0.5
    for r in records:  # one unit's D_high gain goes missing from its records
        if r["unit"]["size"] == "xxl" and r["unit"]["seed"] == 1:
            r["features"] = {k: v for k, v in r["features"].items() if k != "high_accuracy_gain"}
    rows = with_curves(label_rows(records), records)
    leads = [-transfer.accuracy_lead(r["features"]) for r in rows]
    gains = [transfer.as_float(r["features"].get("high_accuracy_gain")) for r in rows]
    scouted = [x >= t and y >= g for x, y in zip(leads, gains)]
    assert any(scouted)
    assert any(x >= t and y < g for x, y in zip(leads, gains))  # ahead, but learned little from D_high
    assert any(x >= t and math.isnan(y) for x, y in zip(leads, gains))  # ahead, gain not measured
    want = [("high", 0.0) if s else gate.replay(r, at_shares=True) for r, s in zip(rows, scouted)]
    got = transfer.judge(records, high_scout=t, high_gain=g)["methods"][transfer.high_row(t, g)]["all"]
    assert got["overhead"] == pytest.approx(sum(s for _, s in want) / len(want))
    assert got["regret"] == pytest.approx(100 * sum(transfer.regret(r, c) for r, (c, _) in zip(rows, want)) / len(want))
    without = transfer.judge(records, high_scout=t)["methods"][transfer.high_row(t)]["all"]  # no gain asked: more scouted
    assert without["overhead"] < got["overhead"]
    for bad in ("2", "-1.5", "nan"):
        assert transfer.main([str(ROOT / "calibration" / "lab2" / "subtraction-explore"), "--high-scout-gain", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --high-scout-gain") and err.count("\n") == 1


def test_another_race_on_the_shipped_gate_changes_only_where_its_races_stop(capsys):
    """`--race F [--race-tie T]`: the shipped plan with its race stopped at F (and a tie check at T).
    At the shipped share it is the shipped judgment itself; stopped sooner, every raced row stops at
    the new share (or at the tie check), the gate opens on the same rows, and the rows the gate left
    shut are as they were. Bad values are one error line before any row is read."""
    from helpers import ROOT

    from experiments.transfer import AT_SHARES, main

    folders = [str(ROOT / "calibration" / "real" / f) for f in ("round-scripted-s0", "round-mixlang-s2")]

    def judged(*extra):
        assert main([*folders, "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    shipped, same = judged(), judged("--race", "0.75")
    assert same["methods"][AT_SHARES] == shipped["methods"][AT_SHARES] and same["per_row"] == shipped["per_row"]
    raced = [p for p in shipped["per_row"] if p["raced"]]
    assert raced and {p["share"] for p in raced} == {0.75}
    for extra, stops in ((("--race", "0.5"), {0.5}), (("--race", "0.75", "--race-tie", "0.3"), {0.3, 0.75})):
        t = judged(*extra)
        assert [p["raced"] for p in t["per_row"]] == [p["raced"] for p in shipped["per_row"]]
        assert {p["share"] for p in t["per_row"] if p["raced"]} <= stops
        assert [p for p in t["per_row"] if not p["raced"]] == [p for p in shipped["per_row"] if not p["raced"]]
        assert t["methods"][AT_SHARES]["all"]["overhead"] <= shipped["methods"][AT_SHARES]["all"]["overhead"]
    assert 0.3 in {p["share"] for p in judged("--race", "0.75", "--race-tie", "0.3")["per_row"]}
    assert judged("--race", "0.5")["race"] == {"fraction": 0.5, "tie": None} and "race" not in shipped
    # where D_low overtakes late (the exploring teacher's digitsum), a race stopped at 40 % keeps D_low on
    # fewer rows, and each row's regret is its own accuracies' at what it kept
    folders[:] = [str(ROOT / "calibration" / "lab2" / "digitsum-explore")]
    late, short = judged(), judged("--race", "0.4")
    assert [p["raced"] for p in late["per_row"]] == [p["raced"] for p in short["per_row"]]  # rows in one order
    kept, now = ([p["kept"] for p in t["per_row"] if p["raced"]] for t in (late, short))
    assert kept.count("low") > now.count("low") > 0
    assert short["methods"][AT_SHARES]["all"]["regret"] > late["methods"][AT_SHARES]["all"]["regret"]
    for p in short["per_row"]:
        best = max(p["accuracy"].values())
        assert p["regret"] == pytest.approx(100 * (best - p["accuracy"][p["kept"]]))
    assert main([*folders, "--race", "0.4"]) == 0 and "its race replaced: stopped at 40% of the budget" in \
        capsys.readouterr().out
    for bad, words in ((("--race-tie", "0.5"), "needs --race F"), (("--race", "1.5"), "--race 1.5 must be"),
                       (("--race", "0.5", "--race-tie", "0.5"), "--race-tie 0.5 must be"),
                       (("--race", "nan"), "--race nan must be"), (("--race", "0.5", "--race-tie", "inf"), "--race-tie inf"),
                       (("--race", "0.5", "--store", "x"), "--store keeps the shipped gate's own judgment")):
        assert main([*folders, *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
