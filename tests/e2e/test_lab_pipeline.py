"""The lab's data pipeline as verbs: `advisor lab sweep`, `publish`, `replay`, `stash`, `restore`.

The committed calibration (one compressed file per kind per pool source) replays, source by source,
to the very bytes of calibration/records.jsonl, the shipped predictor's training set; every bad
input is one `error:` line and exit code 2, found before any work, with nothing written."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

from helpers import ROOT, advisor, one_error_line

from capacity_advisor.advisor.lab import published
from capacity_advisor.advisor.predictor.labels import unit_of
from capacity_advisor.advisor.probe.plan import load_predictor

CALIBRATION = ROOT / "calibration"
SOURCES = sorted(p.parent for p in CALIBRATION.glob("**/" + published.RECORDS))
SMALL = CALIBRATION / "lab2" / "modchain-program-builds"  # the smallest committed source


def test_the_committed_sources_replay_to_the_predictors_training_set_byte_for_byte(capsys, tmp_path):
    """Each source the shipped predictor was fitted on, replayed alone, is one block of
    calibration/records.jsonl, and the blocks tile it; a source published since (not yet in a fit)
    replays too, keeps each problem's correctness, and is not in the file."""
    committed = (CALIBRATION / "records.jsonl").read_bytes()
    fitted_on = set(load_predictor(None).meta["record_files"][0]["sources"])
    assert len(SOURCES) == 40
    blocks, since = [], []
    for folder in SOURCES:
        out = tmp_path / f"{folder.name}.jsonl"
        code, _, err = advisor(capsys, "lab", "replay", folder, "--out", out, "--json")
        assert code == 0, err
        block = out.read_bytes()
        if not {unit_of(json.loads(line))["source"] for line in block.splitlines()} <= fitted_on:
            since.append(folder.name)
            assert committed.find(block.splitlines()[0]) < 0, folder.name
            assert all("per_problem" in row for _, rows in published.evaluations(folder) for row in rows[1:]), folder.name
            continue
        at = committed.find(block)
        assert block and at >= 0 and committed.count(block) == 1, folder.name
        blocks.append((at, at + len(block)))
    assert sorted(since) == ["addition-explore", "arith-scripted-s0", "arith-scripted-s1", "digitsum-explore", "digitsum-program", "digitsum-terse", "linear-scripted", "listmax-explore", "listmax-terse", "modchain-explore", "modchain-terse", "place-mixlang-s0", "place-mixlang-s1", "place-neural-s0", "place-neural-s1", "place-scripted-s0", "place-scripted-s1", "poly-scripted-s0", "poly-scripted-s1", "round-mixlang-s0", "round-mixlang-s1", "round-mixlang-s2", "round-scripted-s0", "round-scripted-s1", "round-scripted-s2", "subtraction-explore", "subtraction-program", "subtraction-terse"]
    blocks.sort()
    assert blocks[0][0] == 0 and blocks[-1][1] == len(committed)
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # contiguous: nothing left out, nothing twice


def test_a_published_source_holds_one_compressed_file_per_kind_and_nothing_per_run():
    for folder in SOURCES:
        names = sorted(p.name for p in folder.iterdir())
        kinds = [published.EVALS, published.PROBES, published.RECORDS]
        assert names in (sorted(["config.json", *kinds]), sorted(["config.json", published.BUDGET_RECORDS, *kinds])), folder
    records = published.records(SMALL)
    runs = dict(published.evaluations(SMALL))
    assert len(records) == len(runs) == 48 and len(published.probes(SMALL)) == 16
    assert all(rows and rows[0]["epoch"] == 0 for rows in runs.values())


def test_lab_help_lists_the_pipeline_verbs(capsys):
    code, out, _ = advisor(capsys, "lab", "--help")
    assert code == 0
    for verb in ("sweep", "publish", "replay", "stash", "restore", "report"):
        assert f"  {verb} " in out, verb


def test_the_sweep_lists_its_sources_in_run_order(capsys):
    code, out, _ = advisor(capsys, "lab", "sweep", "--list", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["name"] for r in rows][:2] == ["modchain-program", "listmax-program"] and len(rows) == 21
    # the new families and the exploring teacher, after the eight sources and their builds; then the terse teacher
    assert [(r["tasks"][0], r["teacher"]) for r in rows[10:]] == [
        ("digitsum", "program"), ("subtraction", "explore"), ("digitsum", "explore"), ("subtraction", "program"),
        ("listmax", "explore"), ("modchain", "explore"), ("addition", "explore"), ("subtraction", "terse"),
        ("modchain", "terse"), ("listmax", "terse"), ("digitsum", "terse")]
    assert rows[9] == {"name": "modchain-teacher-xl-t1-builds", "tasks": ["modchain"], "teacher": "lab:teacher-xl",
                        "temperature": 1.0, "seeds": [0, 1], "budget_runs": [], "sizes": ["m", "l", "xl", "xxl"],
                        "builds": [1, 2]}


def damaged(tmp_path: Path, kind: str, data: bytes) -> Path:
    """A copy of the smallest committed source whose file `kind` holds `data`."""
    folder = shutil.copytree(SMALL, tmp_path / "damaged")
    (folder / kind).write_bytes(data)
    return folder


def test_replay_refuses_bad_inputs_before_writing(capsys, tmp_path):
    out = tmp_path / "out" / "r.jsonl"
    one_error_line(advisor(capsys, "lab", "replay", tmp_path / "nowhere", "--out", out), "is not a folder", out)
    (tmp_path / "empty").mkdir()
    one_error_line(advisor(capsys, "lab", "replay", tmp_path / "empty", "--out", out), "holds no records", out)
    one_error_line(advisor(capsys, "lab", "replay", SMALL, "--out", out, "--probe-steps", "60"),
                   "fewer than --probe-steps 60", out)
    one_error_line(advisor(capsys, "lab", "replay", SMALL, "--out", out, "--probe-eval-problems", "0"),
                   "--probe-eval-problems", out)
    inside = tmp_path / "copy"
    shutil.copytree(SMALL, inside)
    one_error_line(advisor(capsys, "lab", "replay", inside, "--out", inside / "r.jsonl"), "inside the input folder",
                   inside / "r.jsonl")
    records = (SMALL / published.RECORDS).read_bytes()
    one_error_line(advisor(capsys, "lab", "replay", damaged(tmp_path / "a", published.RECORDS, records[:len(records) // 2]),
                           "--out", out), "cannot be unpacked", out)
    bad = lzma.compress(b'{"unit": {"task": "modchain"}, "x": NaN}\n')
    one_error_line(advisor(capsys, "lab", "replay", damaged(tmp_path / "b", published.RECORDS, bad), "--out", out),
                   "line 1: not readable JSON", out)
    no_probe = lzma.compress(b"")
    one_error_line(advisor(capsys, "lab", "replay", damaged(tmp_path / "c", published.PROBES, no_probe), "--out", out),
                   "has records but no probe report", out)


def test_lab_report_on_a_damaged_published_folder_is_one_error_line(capsys, tmp_path):
    rows = lzma.compress(b'{"run": "modchain/sum/m+b1-s0/high", "evals": [{"epoch": 0, "accuracy": "lots"}]}\n')
    folder = damaged(tmp_path, published.EVALS, rows)
    one_error_line(advisor(capsys, "lab", "report", folder, "--out", tmp_path / "rep"),
                   "evals.jsonl.xz, run modchain/sum/m+b1-s0/high, line 1: accuracy", tmp_path / "rep")


def test_publish_refuses_bad_inputs_before_writing(capsys, tmp_path):
    dest = tmp_path / "dest"
    one_error_line(advisor(capsys, "lab", "publish", tmp_path / "nowhere", dest), "has no config.json", dest)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "config.json").write_text(json.dumps({"stage": "calibrate", "settings": {"tasks": ["modchain"]}}))
    one_error_line(advisor(capsys, "lab", "publish", sweep, dest), "holds no finished runs", dest)
    one_error_line(advisor(capsys, "lab", "publish", sweep, sweep / "pub"), "inside the input folder", sweep / "pub")
    (tmp_path / "file").write_text("")
    one_error_line(advisor(capsys, "lab", "publish", sweep, tmp_path / "file"), "is a file")


def test_stash_without_sources_keeps_the_teachers_builds_as_before(capsys, tmp_path, monkeypatch):
    from capacity_advisor.models.lab import committed

    monkeypatch.setattr(committed, "WEIGHTS", tmp_path / "kept")
    code, out, err = advisor(capsys, "lab", "stash", "--json")  # nothing built in this home: nothing kept
    assert code == 0, err
    rows = json.loads(out[out.index("["):])
    assert [(r["name"], r["kept"]) for r in rows] == [("teacher", None), ("teacher-xl", None)]
    assert not (tmp_path / "kept").exists()


def test_publish_leaves_dest_as_it_was_when_a_file_of_the_sweep_is_damaged(capsys, tmp_path):
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig

    sweep, dest = tmp_path / "sweep", tmp_path / "dest"
    cfg = CalibrateConfig.quick_settings(str(sweep))
    sweep.mkdir()
    (sweep / "config.json").write_text(json.dumps({"stage": "calibrate", "settings": cfg.__dict__, "versions": {}},
                                                  default=list))
    run = sweep / "modchain" / "sum" / "xs-s0" / "high"
    run.mkdir(parents=True)
    (run / "record.json").write_text(json.dumps({"run_id": "r", "model": {"spec": "lab:xs"}, "settings": {}}))
    (run / "eval.jsonl").write_text('{"epoch": 0, "accuracy": 0.1}\n{"epoch": 1, \n')
    one_error_line(advisor(capsys, "lab", "publish", sweep, dest), "eval.jsonl line 2", dest)


def test_sweep_stash_and_restore_refuse_bad_inputs_before_any_work(capsys, tmp_path):
    work = tmp_path / "work"
    one_error_line(advisor(capsys, "lab", "sweep", "--sources", "modchain-program,nosuch", "--work", work),
                   "unknown source nosuch", work)
    one_error_line(advisor(capsys, "lab", "sweep", "--sources", "modchain-program", "--work", work, "--restore",
                           tmp_path / "no-stashes"), "is not a folder of stashes", work)
    (tmp_path / "file").write_text("")
    one_error_line(advisor(capsys, "lab", "sweep", "--sources", "modchain-program", "--work", work, "--publish",
                           tmp_path / "file"), "--publish", work)
    one_error_line(advisor(capsys, "lab", "sweep", "--jobs", "0"), "--jobs", work)
    one_error_line(advisor(capsys, "lab", "stash", "--sources", "nosuch", "--stash-dir", tmp_path / "s"),
                   "unknown source", tmp_path / "s")
    one_error_line(advisor(capsys, "lab", "stash", "--sources", "all", "--stash-dir", tmp_path / "file"),
                   "--stash-dir")
    one_error_line(advisor(capsys, "lab", "restore", "--stash-dir", tmp_path / "no-stashes", "--work", work),
                   "is not a folder of stashes", work)


def test_a_source_is_stashed_and_restored_through_the_verbs(capsys, tmp_path):
    from dataclasses import asdict

    from capacity_advisor.advisor.lab.sources import config
    from capacity_advisor.advisor.calibration.grid import cells, run_names

    name, work = "listmax-program", tmp_path / "work"
    cfg = config(name, work, 1)
    (work / name / "listmax" / "pools").mkdir(parents=True)
    (work / name / "config.json").write_text(json.dumps({"stage": "calibrate", "settings": asdict(cfg)}) + "\n")
    (work / name / "listmax" / "pools" / "s0.jsonl").write_text('{"id": "q0"}\n')
    unit = cells(cfg)[0]
    for r in run_names(cfg, unit):  # a record names its run's folder, as a finished run's does
        (unit.folder(work / name) / r).mkdir(parents=True)
        (unit.folder(work / name) / r / "record.json").write_text(
            json.dumps({"best_checkpoint": str((unit.folder(work / name) / r / "checkpoint-4").resolve())}))
        (unit.folder(work / name) / r / "eval.jsonl").write_text('{"step": 0}\n')
    (unit.folder(work / name) / "probe").mkdir()
    (unit.folder(work / name) / "probe" / "probe.json").write_text("{}")
    code, out, err = advisor(capsys, "lab", "stash", "--sources", name, "--work", work, "--stash-dir", tmp_path / "s", "--json")
    assert code == 0, err
    (row,) = json.loads(out[out.index("["):])
    assert (row["source"], row["units_done"]) == (name, 1) and (tmp_path / "s" / f"{name}.tar.gz").is_file()
    import gzip
    assert str(tmp_path.resolve()).encode() not in gzip.decompress((tmp_path / "s" / f"{name}.tar.gz").read_bytes())
    fresh = tmp_path / "fresh"
    code, out, err = advisor(capsys, "lab", "restore", "--work", fresh, "--stash-dir", tmp_path / "s", "--json")
    assert code == 0 and json.loads(out[out.index("{"):])["restored"] == [name], err
    assert (unit.folder(fresh / name) / "probe" / "probe.json").read_text() == "{}"
    r = run_names(cfg, unit)[0]  # the restored record names the restored folder
    assert json.loads((unit.folder(fresh / name) / r / "record.json").read_text())["best_checkpoint"] == \
        str((unit.folder(fresh / name) / r / "checkpoint-4").resolve())
