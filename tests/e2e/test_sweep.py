"""A quick pool-source sweep end to end: two sources calibrate, publish, refit, and the held-out
tables the fit stores are the ones it prints and the ones a second fit reproduces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import ROOT


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory, lab_cache):
    """Two scripted-teacher sources (modchain, listmax), two tiny students, two seeds of modchain and one of
    listmax, published.

    `xs` comes from the suite's lab cache; `s` is pretrained for 30 steps instead of its 1,000
    (another recipe hash, so its own folder): the sweep's machinery is under test, not `s`'s skill."""
    import capacity_advisor.models.lab.ladder as ladder
    from capacity_advisor.advisor.calibration.sweep import run_calibration
    from capacity_advisor.advisor.lab.publish import publish
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig
    from helpers import advisor_home

    home = tmp_path_factory.mktemp("sweep-home") / "home"
    shutil.copytree(lab_cache, home)
    work, dest = tmp_path_factory.mktemp("work"), tmp_path_factory.mktemp("published")
    with advisor_home(home), pytest.MonkeyPatch.context() as mp:
        mp.setitem(ladder.LADDER, "s", replace(ladder.LADDER["s"], steps=30))
        for task, seeds in (("modchain", (0, 1)), ("listmax", (0,))):  # two seeds of one source: the noise floor
            cfg = replace(CalibrateConfig.quick_settings(str(work / task)), tasks=(task,), sizes=("xs", "s"),
                          seeds=seeds, budget_runs=(0.5,))
            run_calibration(cfg, log=lambda m: None)
            publish(work / task, dest / task)
    return dest


@pytest.mark.slow
def test_a_quick_sweep_publishes_refits_and_reproduces_its_own_table(two_sources, tmp_path):
    import lzma

    from capacity_advisor.advisor.fit import FitSettings, fit_and_save
    from capacity_advisor.advisor.lab import published
    from capacity_advisor.advisor.predictor import Predictor

    records = []
    for task in ("modchain", "listmax"):
        folder = two_sources / task
        for kind in (published.RECORDS, published.BUDGET_RECORDS, published.EVALS, published.PROBES):
            text = lzma.decompress((folder / kind).read_bytes()).decode()
            assert str(two_sources.parent) not in text and "/tmp/" not in text, kind  # no machine paths
        records += published.records(folder)
        budget = published.records(folder, budget=True)
        assert budget and all(r["settings"]["training"]["epochs"] == 0.5 for r in budget)
        assert {r["unit"]["seed"] for r in budget} == {0}
    assert {r["unit"]["task"] for r in records} == {"modchain", "listmax"}
    settings = FitSettings(n_members=2, kinds=("logistic",), cv=("student", "source"), cv_members=2)
    first = fit_and_save(records, tmp_path / "a", settings)
    second = fit_and_save(records, tmp_path / "b", settings)
    assert first["cv"] == second["cv"]
    assert set(first["cv"]) == {"source"}  # with two students, holding one out would leave one to learn from
    assert {"policy", "always high", "always low", "always mixed", "size rule", "noise floor"} <= set(first["cv"]["source"])
    stored = Predictor.load(tmp_path / "a").meta["cv"]
    assert stored["source"]["folds"] == sorted({f"lab2:{t}/program" for t in ("modchain", "listmax")})
    for split, methods in first["cv"].items():
        for name, row in methods.items():
            assert row["regret"] == stored[split]["methods"][name]["regret"]
    printed = subprocess.run([sys.executable, "-m", "experiments.cv_tables", str(tmp_path / "a")],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout
    policy = first["cv"]["source"]["policy"]
    assert f"| **policy** (shipped) | {policy['regret']:.2f} |" in printed


@pytest.mark.slow
def test_a_lab_runs_evaluations_are_the_stored_ones(two_sources):
    """The runs of one unit of the quick sweep (xs on modchain, seed 0) evaluate as the stored numbers say:
    the accuracy, answer and repetition rates and forward tokens at every evaluation exactly, the base drift and teacher
    NLL to 1e-5. A change to how a run trains or evaluates (the evaluator's cache of the fixed
    models' scores among them) that would move a label shows here.

    To store new numbers after a deliberate change: ADVISOR_STORE_NUMBERS=1 pytest tests/e2e/test_sweep.py"""
    from capacity_advisor.advisor.lab.published import evaluations
    from helpers import stored_numbers

    runs = dict(evaluations(two_sources / "modchain"))
    exact, close = ("accuracy", "answer_rate", "repetition_rate", "eval_tokens"), ("base_drift", "teacher_nll")
    got = {}
    for option in ("high", "low", "mixed"):
        for r in runs[f"modchain/sum/xs-s0/{option}"]:
            got[f"{option}@{r['step']}"] = {k: r[k] for k in (*exact, *close)}
    want = stored_numbers(ROOT / "tests" / "data" / "lab_run.json", "xs-modchain-sum-s0", got)
    assert sorted(got) == sorted(want) and len(want) >= 9
    assert len({row["accuracy"] for row in want.values()}) >= 2  # the runs move: a frozen evaluation would not pass
    for at, row in want.items():
        assert all(row[k] is not None for k in (*exact, *close)), (at, row)
        assert {k: got[at][k] for k in exact} == {k: row[k] for k in exact}, at
        assert {k: got[at][k] for k in close} == pytest.approx({k: row[k] for k in close}, abs=1e-5), at


@pytest.mark.slow
def test_budget_runs_compare_with_the_truncated_labels(two_sources):
    from experiments.budget_labels import compare

    out = compare([two_sources / "modchain", two_sources / "listmax"])
    row = out["by_budget"]["0.5"]
    assert row["rows"] == out["rows"] == 4  # two students x two sources, seed 0
    assert 0 <= row["labels_agree"] <= 1 and row["regret_of_truncated_label"] >= 0
    assert set(row["mean_accuracy_shift"]) == {"high", "low", "mixed"}
    json.dumps(out)


def test_a_source_in_progress_is_stashed_and_restored_without_checkpoints_or_machine_paths(tmp_path):
    import io
    import tarfile

    from capacity_advisor.advisor.lab.sources import config
    from capacity_advisor.advisor.lab.stash import restore, stash
    from capacity_advisor.advisor.calibration.grid import cells, run_names
    from capacity_advisor.core.errors import InputError

    name, work = "addition-teacher-xl-t0.7", tmp_path / "work"
    cfg = config(name, work, 1)
    src = work / name
    (src / "addition" / "pools").mkdir(parents=True)
    (src / "config.json").write_text('{"stage": "calibrate"}\n')
    (src / "addition" / "pools" / "s0.jsonl").write_text('{"id": "q0"}\n')
    (src / "addition" / "pools" / "s0.config.json").write_text(json.dumps(
        {"stage": "generate", "summary": {"cache": str(tmp_path / "cache"), "correct": 3}}))
    finished, half = cells(cfg)[:2]
    for u, sets in ((finished, run_names(cfg, finished)), (half, run_names(cfg, half)[:1])):
        folder = u.folder(src)
        for r in sets:
            (folder / r / "checkpoint-8").mkdir(parents=True)
            (folder / r / "checkpoint-8" / "model.safetensors").write_bytes(b"weights")
            (folder / r / "record.json").write_text(json.dumps({"run": r}))
            (folder / r / "eval.jsonl").write_text('{"step": 0}\n')
        (folder / "probe").mkdir()
        (folder / "probe" / "probe.json").write_text("{}")
        (folder / "scores.jsonl").write_text("{}\n")
    out = stash(work, cfg, name, tmp_path / "in-progress")
    assert (out["units_done"], out["units"]) == (1, len(cells(cfg)))
    archive = tmp_path / "in-progress" / f"{name}.tar.gz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    rel = str(finished.folder(src).relative_to(work))
    assert names == {f"{name}/config.json", f"{name}/addition/pools/s0.jsonl", f"{name}/addition/pools/s0.config.json",
                     f"{rel}/probe/probe.json", *(f"{rel}/{r}/{f}" for r in run_names(cfg, finished)
                                                  for f in ("record.json", "eval.jsonl"))}
    assert archive.read_bytes() == (stash(work, cfg, name, tmp_path / "again") and
                                    (tmp_path / "again" / f"{name}.tar.gz").read_bytes())  # byte-stable
    fresh = tmp_path / "fresh"
    assert restore(tmp_path / "in-progress", fresh, name) and not restore(tmp_path / "in-progress", fresh, name)
    back = fresh / name
    assert json.loads((back / "addition" / "pools" / "s0.config.json").read_text()) == {
        "stage": "generate", "summary": {"correct": 3}}  # no machine path travels
    assert all((finished.folder(back) / r / "record.json").read_text() == json.dumps({"run": r})
               for r in run_names(cfg, finished))
    assert not half.folder(back).exists() and not list(back.rglob("checkpoint-*"))
    # an archive that would write outside its source is refused
    (tmp_path / "bad").mkdir()
    with tarfile.open(tmp_path / "bad" / f"{name}.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("elsewhere/x.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(InputError, match="not a file inside"):
        restore(tmp_path / "bad", tmp_path / "fresh2", name)
