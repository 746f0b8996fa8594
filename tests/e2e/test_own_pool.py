"""Calibrated on the user's own pool: `advisor fit` on several record files names each file's
pool sources and marks the sources only later files hold as the user's own, with a policy chosen
for them on the proxy split; `advisor recommend` on such a pool (the same content) says so and
answers with that policy. And the proxy split itself: its folds and what `fit --cv proxy` prints."""

import json

import pytest
from helpers import RECORDS, ROOT, lab_pool, read_jsonl, record_subset, resign, run, write_jsonl

from capacity_advisor.advisor.predictor import PROXY_CUT, Predictor, label_rows, proxy_folds, read_records, unit_of
from capacity_advisor.advisor.predictor.labels import ranking_sum

SHIPPED = ROOT / "advisor" / "predictor_data"
MINE = "lab2:listmax/program"  # one of helpers.SUBSET_SOURCES


def test_proxy_folds_hold_one_large_student_on_one_source_out():
    rows = label_rows(read_records(RECORDS))
    folds = proxy_folds(rows)
    assert folds and len({name for name, _, _ in folds}) == len(folds)
    for name, train, test in folds:
        source, student = name.split("|")
        assert {(r["source"], r["student"]) for r in test} == {(source, student)}
        assert all(r["n_params"] >= PROXY_CUT for r in test)
        assert not any(r["student"] == student for r in train)  # the target student nowhere in the fit
        own = [r for r in train if r["source"] == source]
        assert own and all(r["n_params"] < PROXY_CUT for r in own)  # its source's proxies only
    name, train, test = folds[0]
    source = name.split("|")[0]
    assert not any(r["source"] == source for r in proxy_folds(rows, own=0)[0][1])  # the control: no own proxies
    largest = {r["student"] for r in proxy_folds(rows, own=1)[0][1] if r["source"] == source}
    assert len(largest) == 1


def _split_files(tmp_path):
    """The committed records' subset (helpers.record_subset: three sources, five students) as two
    files: everything but one source, and that source's small students (a user's own proxies on
    their own pool)."""
    base, mine = [], []
    for line in record_subset():
        rec = json.loads(line)
        if unit_of(rec)["source"] != MINE:
            base.append(line)
        elif rec["model"]["n_params"] < PROXY_CUT:
            mine.append(line)
    (tmp_path / "calibration.jsonl").write_text("\n".join(base) + "\n")
    (tmp_path / "mine.jsonl").write_text("\n".join(mine) + "\n")
    return tmp_path / "calibration.jsonl", tmp_path / "mine.jsonl", len(base), len(mine)


@pytest.mark.slow
def test_fit_on_two_record_files_marks_the_users_own_source(tmp_path):
    a, b, n_a, n_b = _split_files(tmp_path)
    r = run("fit", "--records", a, "--records", b, "--out", tmp_path / "pred", "--kinds", "logistic", "--members", 2,
            "--cv-members", 2, "--cv", "student", "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["own_sources"] == [MINE] and "max_distance" in result["policy_own"]
    meta = Predictor.load(tmp_path / "pred").meta
    assert [f["file"] for f in meta["record_files"]] == ["calibration.jsonl", "mine.jsonl"]
    assert [f["records"] for f in meta["record_files"]] == [n_a, n_b]
    assert meta["record_files"][1]["sources"] == [MINE] and MINE not in meta["record_files"][0]["sources"]
    own = meta["own_sources"][MINE]
    assert own["students"] and all(n < PROXY_CUT for n in own["n_params"]) and own["epochs"] == 5.0
    assert meta["policy_own"]["chosen_by"] == "leave-one-proxy-target-out regret"
    # what the proxy rule reads: each proxy's lead of D_low over D_high by budget and ranking
    from statistics import mean

    mine = [r for r in label_rows(read_records(b)) if r["source"] == MINE]
    for n, budget, ranking, lead in own["proxy_leads"]:
        at = [r for r in mine if r["n_params"] == n and r["budget"] == budget
              and ranking_sum(r["score"]) == ranking]
        assert at and lead == pytest.approx(mean(r["accuracy"]["low"] - r["accuracy"]["high"] for r in at))
    assert {"top", "margin"} <= set(meta["proxy_rule"])


def test_record_files_named_twice_or_measured_otherwise_are_one_error_line(tmp_path):
    a, b, _, _ = _split_files(tmp_path)
    r = run("fit", "--records", a, "--records", a, "--out", tmp_path / "p")
    assert r.exit_code == 2 and "named twice" in r.stderr and r.stderr.count("error:") == 1
    other = read_jsonl(b)
    for rec in other:
        rec["settings"]["probe"]["steps"] = 50
    c = tmp_path / "other.jsonl"
    write_jsonl(c, other)
    r = run("fit", "--records", a, "--records", c, "--out", tmp_path / "p")
    assert r.exit_code == 2 and "measured its probes otherwise" in r.stderr and "steps 50 against 25" in r.stderr
    assert not (tmp_path / "p").exists()


def test_recommend_on_a_calibrated_pool_says_so_and_uses_its_policy(lab_home, tmp_path):
    from capacity_advisor.advisor.pools.read import read_pool

    pool = tmp_path / "pool.jsonl"
    lab_pool(pool, 24)
    pred = Predictor.load(SHIPPED)
    pred.meta = {**pred.meta, "policy": {"max_distance": None, "margin": 0.0, "use_range": False},
                 "policy_own": {"max_distance": None, "margin": 2.0, "use_range": False},  # never leaves D_high
                 "own_sources": {"mine/lab:teacher@T1": {"students": ["lab:xs", "lab:s"], "n_params": [3856, 27744],
                                                         "fingerprints": [read_pool(pool).fingerprint()], "epochs": 5.0}}}
    pred.save(tmp_path / "pred")
    small = ["--probe-steps", 4, "--probe-eval-every", 2, "--probe-eval-problems", 4, "--probe-batch", 4]
    common = ["--model", "lab:xs", "--budget", 3, "--predictor", tmp_path / "pred", "--device", "cpu", "--json", *small]
    r = run("recommend", *common, "--pool", pool, "--out", tmp_path / "rec")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["calibrated_on"]["source"] == "mine/lab:teacher@T1" and rep["strategy"] == "high"
    assert rep["answered_by"] == "the policy: always D_high"
    line = rep["confidence_reasons"][0]
    assert line.startswith("calibrated on your pool: 2 proxies (lab:xs (3,856 params), lab:s (27,744 params); up to 5 epochs)")
    # another pool: not calibrated, the shipped thresholds answer
    other = tmp_path / "other.jsonl"
    lab_pool(other, 24, "--seed", 1)
    r = run("recommend", *common, "--pool", other, "--out", tmp_path / "rec2")
    rep = json.loads(r.stdout)
    assert "calibrated_on" not in rep and rep["answered_by"] == "predictor"


@pytest.mark.parametrize("bad", [
    {"own_sources": {"x": {"students": ["a"], "n_params": [], "fingerprints": []}}},
    {"own_sources": {"x": {"students": "a", "n_params": [1], "fingerprints": []}}},
    {"own_sources": {"x": {"students": ["a"], "n_params": [1], "fingerprints": [], "epochs": "5"}}},
    {"policy_own": {"max_distance": "far", "margin": 0.0, "use_range": False}},
    {"proxy_rule": {"top": 0, "margin": 0.1}},
    {"own_sources": {"x": {"students": ["a"], "n_params": [1], "fingerprints": [], "proxy_leads": [[1, 3.0, 1.0, 5.0]]}}},
    {"record_files": [{"file": 3, "sources": []}]},
    {"races": [{"method": "race", "fraction": 2.0, "regret": 1.0, "decision_accuracy": 0.5, "overhead": 0.5}]},
    {"races": [{"method": "race", "fraction": None, "regret": "low", "decision_accuracy": 0.5, "overhead": 0.5}]},
])
def test_a_damaged_own_calibration_in_a_predictor_is_refused_at_load(bad, tmp_path):
    body = json.loads((SHIPPED / "predictor.json").read_text())
    body["meta"] = {**body["meta"], **bad}
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "predictor.json").write_text(json.dumps(resign(body)))
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--predictor", tmp_path / "pred", "--out", tmp_path / "rec")
    assert r.exit_code == 2 and r.stderr.count("error:") == 1 and "predictor" in r.stderr
    assert not (tmp_path / "rec").exists()


def test_races_replayed_on_the_records_and_priced_in_the_report(lab_home, tmp_path):
    """`fit` stores the races replayed on its records (meta.races); recommend states what the
    half-budget race would cost beside its advice, from those numbers."""
    from capacity_advisor.advisor.predictor.races import race, race_summary

    # one replayed race: D_low leads from the second evaluation; stopped at half the budget it is kept
    high, low = [(0.5, 0.3), (1.0, 0.3), (1.5, 0.3), (2.0, 0.3)], [(0.5, 0.2), (1.0, 0.6), (1.5, 0.7), (2.0, 0.8)]
    assert race(high, low, 2.0, 0.5) == ("low", 0.5)
    assert race(high, low, 2.0, 0.25) == ("high", 0.25)  # stopped before D_low's gain: D_high kept
    assert race(high, low, 2.0, 1.0, k=2, n_eval=1000) == ("low", 0.75)  # the adaptive race: a lead twice in a row
    summary = {r["method"]: r for r in race_summary(read_records(RECORDS))}
    half, always = summary["race, fixed at 50% of the budget"], summary["always high"]
    # the overhead is the share at which each replayed race stopped: at or past half the budget
    assert half["fraction"] == 0.5 and 0.5 <= half["overhead"] < 0.6 and always["overhead"] == 0
    assert half["rows"] == always["rows"] == len(label_rows(read_records(RECORDS)))
    assert half["regret"] < always["regret"]  # on the committed records the race beats always-high
    pred = Predictor.load(SHIPPED)
    pred.meta = {**pred.meta, "races": race_summary(read_records(RECORDS))}
    pred.save(tmp_path / "pred")
    pool = tmp_path / "pool.jsonl"
    lab_pool(pool, 24)
    r = run("recommend", "--model", "lab:xs", "--budget", 2, "--pool", pool, "--predictor", tmp_path / "pred",
            "--probe-steps", 4, "--probe-eval-every", 2, "--probe-eval-problems", 4, "--probe-batch", 4,
            "--out", tmp_path / "rec", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    note = next(n for n in json.loads(r.stdout)["notes"] if n.startswith("a race instead"))
    assert f"lost {half['regret']:.2f} points" in note and f"always-high {always['regret']:.2f}" in note
    assert "--race 0.5" in note and f"{half['overhead']:.0%} more training" in note


def test_a_race_chosen_leaving_each_source_out_never_sees_that_source():
    """races_left_out picks each source's race on the other sources only (lowest regret within the
    overhead cap) and judges it on that source's rows: checked against a recomputation."""
    from capacity_advisor.advisor.predictor.races import race_grid, race_picks, races_left_out, summarize_races

    records = read_records(RECORDS)
    rows, picks = race_picks(records)
    assert set(picks) == set(race_grid()) and all(len(p) == len(rows) for p in picks.values())
    out = races_left_out(records, max_overhead=0.3)
    sources = {r["source"] for r in rows}
    assert set(out["folds"]) == sources and out["all"]["rows"] == len(rows)
    for source, fold in out["folds"].items():
        train = {n: summarize_races([p for p in ps if p[0]["source"] != source]) for n, ps in picks.items()}
        allowed = {n: t for n, t in train.items() if t["overhead"] <= 0.3 + 1e-9}
        assert allowed and fold["race"] in allowed
        assert fold["train"]["regret"] == min(t["regret"] for t in allowed.values())
        test = summarize_races([p for p in picks[fold["race"]] if p[0]["source"] == source])
        assert fold["test"] == test and test["rows"] == sum(r["source"] == source for r in rows)
    # a wider cap can only buy lower regret on the training sources: the 50 % cap allows the 50 % race
    wide = races_left_out(records, max_overhead=0.5)
    assert all(wide["folds"][s]["train"]["regret"] <= out["folds"][s]["train"]["regret"] for s in sources)


def test_the_proxy_split_breaks_its_regret_down_by_pool_source():
    from capacity_advisor.advisor.predictor.evaluate import by_value, summarize

    rows = label_rows(read_records(RECORDS))
    pairs = [(r, "low" if i % 3 == 0 else "high") for i, r in enumerate(rows)]
    per = by_value(pairs, "source")
    assert sorted(per) == sorted({r["source"] for r in rows}) and len(per) >= 7
    for source, row in per.items():
        alone = summarize([p for p in pairs if p[0]["source"] == source])
        assert row["rows"] == alone["rows"] and row["regret"] == pytest.approx(alone["regret"])
        assert row["decision_accuracy"] == pytest.approx(alone["decision_accuracy"])
    whole = summarize(pairs)
    assert sum(r["rows"] for r in per.values()) == whole["rows"]
    assert sum(r["rows"] * r["regret"] for r in per.values()) / whole["rows"] == pytest.approx(whole["regret"])


def test_the_proxy_rule_reads_the_largest_proxies_and_is_chosen_on_other_sources():
    """proxy_gap averages D_low's lead over D_high for the largest `top` proxies (seeds first);
    held out by source on the committed records, the rule chosen on the other sources never loses
    to always-high on a source, and on a source where the proxies saw D_low win it gains."""
    from statistics import mean

    from capacity_advisor.advisor.predictor.evaluate import regret
    from capacity_advisor.advisor.predictor.proxy_rule import ProxyRule, choose_rule, lead, proxy_gap, rule_picks

    rows = label_rows(read_records(RECORDS))
    source = "lab1:modchain/program"
    proxies = [r for r in rows if r["source"] == source and r["n_params"] < PROXY_CUT]
    at = [r for r in proxies if r["budget"] == 5 and r["score"] == "sum"]
    biggest = max(r["n_params"] for r in at)
    want = mean(lead(r) for r in at if r["n_params"] == biggest)
    assert proxy_gap(proxies, 5, 1.0, top=1) == pytest.approx(want)
    assert want == pytest.approx(mean(r["accuracy"]["low"] - r["accuracy"]["high"] for r in at if r["n_params"] == biggest))
    assert proxy_gap(proxies, 5, 1.0, top=None) == pytest.approx(mean(
        mean(lead(r) for r in at if r["n_params"] == n) for n in {r["n_params"] for r in at}))
    assert proxy_gap(proxies, 7, 1.0, top=1) is None and ProxyRule(1, 0.05).choose(None) == "high"
    per_source = {}
    for name, train, test in proxy_folds(rows):
        rule = choose_rule(train)
        for r, c in rule_picks(train, test, rule):
            per_source.setdefault(r["source"], []).append((regret(r, c), regret(r, "high")))
    ours = [o for v in per_source.values() for o, _ in v]
    high = [h for v in per_source.values() for _, h in v]
    assert mean(ours) < mean(high)
    assert mean(o for o, _ in per_source[source]) < mean(h for _, h in per_source[source]) - 0.05
    for s, v in per_source.items():  # no source where the rule loses to always-high
        assert mean(o for o, _ in v) <= mean(h for _, h in v) + 1e-9, s
    assert ProxyRule.from_dict({"top": 0, "margin": 0.1}) is None and ProxyRule.from_dict({"top": None, "margin": 0.0})


def test_recommend_on_a_calibrated_pool_turns_to_d_low_where_the_proxies_saw_it_win(lab_home, tmp_path):
    from capacity_advisor.advisor.pools.read import read_pool

    pool = tmp_path / "pool.jsonl"
    lab_pool(pool, 24)
    pred = Predictor.load(SHIPPED)
    own = {"students": ["lab:xs", "lab:s"], "n_params": [3856, 27744], "fingerprints": [read_pool(pool).fingerprint()],
           "epochs": 5.0}
    small = ["--probe-steps", 4, "--probe-eval-every", 2, "--probe-eval-problems", 4, "--probe-batch", 4]
    for gap, want in ((0.30, "low"), (-0.10, "high")):
        leads = [[3856, b, 1.0, 0.0] for b in (1.0, 3.0, 5.0)] + [[27744, b, 1.0, gap] for b in (1.0, 3.0, 5.0)]
        pred.meta = {**pred.meta, "policy_own": {"max_distance": None, "margin": 2.0, "use_range": False},
                     "own_sources": {"mine/lab:teacher@T1": {**own, "proxy_leads": leads}},
                     "proxy_rule": {"top": 1, "margin": 0.05, "chosen_by": "a test"}}
        pred.save(tmp_path / f"pred{want}")
        r = run("recommend", "--model", "lab:xs", "--budget", 3, "--predictor", tmp_path / f"pred{want}", "--device",
                "cpu", "--json", *small, "--pool", pool, "--out", tmp_path / f"rec{want}")
        assert r.exit_code == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["strategy"] == want
        line = next(x for x in rep["confidence_reasons"] if x.startswith("your proxies (lab:s)"))
        assert f"led D_high by {100 * gap:+.1f} points of held-out accuracy at 3 epochs" in line
        assert rep["answered_by"] == ("the proxy rule" if want == "low" else "the policy: always D_high")
        manifest = json.loads((tmp_path / f"rec{want}" / "recommendation.json").read_text())
        assert manifest["strategy"] == want
