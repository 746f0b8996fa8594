"""The shipped predictor's judgment on the real pretrained student (meta.transfer, stored by
`python -m experiments.transfer ... --store NAME`): it is what the committed real rows give today,
`advisor recommend` quotes it beside a planned race for a student that is not a lab student only,
and a predictor file's meta.transfer that does not read as one is passed over, never trusted."""

import json
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

from capacity_advisor.advisor.predictor import Predictor
from capacity_advisor.advisor.recommendation.draws import judged_elsewhere, race_headline, race_plan
from experiments.transfer import judge, read_records, stored_entry

SHIPPED = ROOT / "advisor" / "predictor_data"
NAME = "real pretrained student"


def shipped_entry() -> dict:
    entries = Predictor.load(SHIPPED).meta["transfer"]
    (entry,) = [e for e in entries if e["name"] == NAME]
    return entry


def test_the_stored_judgment_is_what_the_committed_real_rows_give():
    entry = shipped_entry()
    paths = shlex.split(entry["command"])[3:]  # python -m experiments.transfer PATHS, from the checkout's root
    assert paths and all((ROOT / p).is_dir() for p in paths)
    shipped = Predictor.load(SHIPPED).meta["policy"]["race"]
    fresh = stored_entry(judge(read_records([ROOT / p for p in paths])), NAME, [ROOT / p for p in paths], shipped)
    assert fresh == entry and entry["gate"] == shipped  # the judgment of the gate the predictor ships
    # every committed real-student folder, so a source published since is judged too
    real = sorted(str(f.parent.relative_to(ROOT)) for f in (ROOT / "calibration" / "real").glob("*/records.jsonl.xz"))
    assert sorted(paths) == real and len(real) >= 11
    assert entry["rows"] >= 38 and len(entry["sources"]) >= 6 and entry["students"] == ["lab:smollm2-135m"]
    gated, high = entry["methods"]["gated race"], entry["methods"]["always high"]
    assert gated["regret"] < high["regret"] and 0 < gated["overhead"] <= gated["overhead_where_raced"] <= 1


def test_a_planned_race_for_a_real_student_quotes_it_and_for_a_lab_student_does_not():
    pred = Predictor.load(SHIPPED)
    race = {"fraction": 0.75, "wait": None, "why": "P(D_low) 0.60 reaches the gate's 0.2"}
    lab, real = race_plan(pred, race), race_plan(pred, race, real_student=True)
    assert "elsewhere" not in lab
    w = real["elsewhere"]
    entry = shipped_entry()
    assert w["rows"] == entry["rows"] and w["regret"] == entry["methods"]["gated race"]["regret"]
    assert w["always_high_regret"] == entry["methods"]["always high"]["regret"]
    line = race_headline(real)
    assert (f"judged where it was never fitted (real pretrained student: lab:smollm2-135m, {len(entry['sources'])} pool "
            f"sources, {entry['rows']} rows) "
            f"it lost {w['regret']:.1f} points at {w['overhead']:.0%} more training "
            f"({w['overhead_tokens']:.0%} more tokens) ({w['always_high_regret']:.1f} without races)") in line
    assert w["overhead_tokens"] == entry["methods"]["gated race"]["overhead_tokens"] > 0
    assert "never fitted" not in race_headline(lab)
    assert race_plan(pred, None, real_student=True) is None


GOOD = {"name": "n", "rows": 24, "students": ["a"], "sources": ["b"],
        "methods": {"gated race": {"regret": 1, "overhead": 0.2}, "always high": {"regret": 3}}}


@pytest.mark.parametrize("transfer", [
    None, "text", [1, None], [{**GOOD, "name": "[bold]x[/bold]"}], [{**GOOD, "name": "x :thumbs_up: y"}],
    [{**GOOD, "rows": True}], [{**GOOD, "students": ["a\x1b[31m"]}], [{**GOOD, "sources": []}],
    [{**GOOD, "methods": {"gated race": {"regret": float("nan"), "overhead": 0.2}, "always high": {"regret": 3}}}],
    [{**GOOD, "methods": {"gated race": {"regret": 1, "overhead": 40.0}, "always high": {"regret": 3}}}],
    [{**GOOD, "methods": {"gated race": {"regret": "1"}}}],
    [{**GOOD, "gate": {"threshold": 0.5}}],  # a judgment of another gate than the one the predictor ships
])
def test_a_meta_transfer_that_does_not_read_as_one_is_passed_over(transfer):
    pred = Predictor.load(SHIPPED)
    gate = pred.meta["policy"]["race"]
    if isinstance(transfer, list):  # each entry names the shipped gate unless the case is another gate
        transfer = [{"gate": gate, **e} if isinstance(e, dict) else e for e in transfer]
    pred.meta = {**pred.meta, "transfer": transfer}
    assert judged_elsewhere(pred) is None
    pred.meta = {**pred.meta, "transfer": [{**GOOD, "gate": gate}]}  # the same entry, well formed, is read
    assert judged_elsewhere(pred)["regret"] == 1.0
    pred.meta = {**pred.meta, "transfer": transfer}
    plan = race_plan(pred, {"fraction": 1.0, "wait": None, "why": "w"}, real_student=True)
    assert "elsewhere" not in plan and "never fitted" not in race_headline(plan)


@pytest.mark.parametrize("tokens", ["0.3", float("nan"), -0.1, 1e9, True])
def test_a_token_figure_that_does_not_read_as_one_is_left_out_and_the_rest_quoted(tokens):
    pred = Predictor.load(SHIPPED)
    entry = {**GOOD, "gate": pred.meta["policy"]["race"],
             "methods": {**GOOD["methods"], "gated race": {"regret": 1, "overhead": 0.2, "overhead_tokens": tokens}}}
    pred.meta = {**pred.meta, "transfer": [entry]}
    w = judged_elsewhere(pred)
    assert w["regret"] == 1.0 and w["overhead_tokens"] is None
    line = race_headline(race_plan(pred, {"fraction": 1.0, "wait": None, "why": "w"}, real_student=True))
    assert "it lost 1.0 points at 20% more training (3.0 without races)" in line and "tokens" not in line


def test_store_keeps_one_entry_per_name_in_the_predictor_judged(tmp_path):
    shipped = (SHIPPED / "predictor.json").read_bytes()
    pred = tmp_path / "pred"
    shutil.copytree(SHIPPED, pred, ignore=shutil.ignore_patterns("*.py", "__pycache__", "paper_findings.json"))
    cmd = [sys.executable, "-m", "experiments.transfer", "calibration/real/place-scripted-s0", "--predictor", str(pred),
           "--store", "one source", "--json"]
    bad = subprocess.run(cmd[:4] + cmd[6:], cwd=ROOT, capture_output=True, text=True)  # no --predictor named
    assert bad.returncode == 2 and "name it with --predictor" in bad.stderr and bad.stderr.count("\n") == 1
    for _ in range(2):  # stored again under the same name: replaced, not added
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    meta = Predictor.load(pred).meta
    names = [e["name"] for e in meta["transfer"]]
    assert names == [NAME, "one source"]
    (mine,) = [e for e in meta["transfer"] if e["name"] == "one source"]
    assert mine["rows"] == json.loads(p.stdout)["rows"] == 3 and mine["sources"] == ["place/scripted"]
    assert mine["command"] == "python -m experiments.transfer calibration/real/place-scripted-s0"
    for name in (" ", "[bold]x[/bold]"):  # a name the report would not print as it is: refused before any work
        bad = subprocess.run(cmd[:-3] + ["--store", name], cwd=ROOT, capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --store") and bad.stderr.count("\n") == 1
    bad = subprocess.run(cmd[:5] + [str(tmp_path / "none")] + cmd[6:], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    assert (SHIPPED / "predictor.json").read_bytes() == shipped  # only the predictor named was written


def test_on_the_terse_sources_run_after_it_shipped_the_plan_beats_both_constants_on_each():
    """listmax-terse and digitsum-terse were published after the shipped predictor and every refit were
    made (docs/results.md, "Two terse sources no fit has seen"): on their rows the shipped plan, raced as
    `advisor train` races, recovers most of always-high's loss at a fifth of a run and no source ends
    above either constant."""
    from experiments.transfer import AT_SHARES

    paths = [ROOT / "calibration" / "lab2" / n for n in ("listmax-terse", "digitsum-terse")]
    fitted_on = set(Predictor.load(SHIPPED).meta["record_files"][0]["sources"])
    out = judge(read_records(paths), str(SHIPPED))
    assert out["rows"] == 240 and not set(out["sources"]) & fitted_on
    m = out["methods"]
    plan, high, low = (m[k]["all"] for k in (AT_SHARES, "always high", "always low"))
    assert plan["regret"] < 0.25 * high["regret"] and plan["regret"] < 0.25 * low["regret"]
    assert 0 < plan["overhead"] <= 0.25
    for s in out["sources"]:
        assert m[AT_SHARES]["by_source"][s]["regret"] <= min(m[k]["by_source"][s]["regret"] for k in ("always high", "always low"))
