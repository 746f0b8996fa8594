"""The records `advisor fit` reads and the runs `advisor lab publish` keeps: a records file with no
records or a number that is not finite is refused by name, repeated records count once (the fit
says how many), and a run whose evaluations cannot be read is named."""

import json
import os
from dataclasses import asdict

from helpers import ROOT, advisor, one_error_line, record_subset, run

from capacity_advisor.advisor.calibration.grid import CalibrateConfig


def test_an_empty_or_blank_records_file_is_refused_by_name(tmp_path, capsys):
    out = tmp_path / "pred"
    for text in ("", "\n  \n\n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        line = one_error_line(advisor(capsys, "fit", "-r", ROOT / "calibration" / "records.jsonl", "-r", empty, "--out", out), "holds no records", out)
        assert str(empty) in line


def test_a_record_number_that_is_not_finite_is_refused(tmp_path, capsys):
    with open(ROOT / "calibration" / "records.jsonl") as f:
        good = [json.loads(next(f)) for _ in range(2)]
    feature = next(iter(good[0]["features"]))
    out = tmp_path / "pred"
    for where, value in (("features", float("nan")), ("features", float("inf")), ("features", -float("inf")),
                         ("best_accuracy", float("nan"))):
        bad = json.loads(json.dumps(good[1]))
        if where == "features":
            bad["features"][feature] = value
        else:
            bad["best_accuracy"] = value
        path = tmp_path / "records.jsonl"
        path.write_text(json.dumps(good[0]) + "\n" + json.dumps(bad) + "\n")  # json writes NaN, Infinity
        one_error_line(advisor(capsys, "fit", "-r", path, "--out", out), "line 2: not readable JSON", out)


def test_repeated_records_count_once_in_the_fit_and_the_fit_says_how_many(tmp_path):
    """B repeats 60 of A's records, and one file holds every record twice: each run counts once, the
    fit says how many it dropped, and both fit what A alone holds."""
    lines = record_subset()
    # a.jsonl as a records store left by a killed append: its last line cut short, no newline
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:300])
    (tmp_path / "b.jsonl").write_text("\n".join(lines[:60]) + "\n")  # 60 of a's records again
    (tmp_path / "twice.jsonl").write_text("\n".join(lines + lines) + "\n")  # every record twice
    fit = ("--kinds", "logistic", "--members", 2, "--cv-members", 2, "--cv", "student")
    r = run("fit", "-r", tmp_path / "a.jsonl", "-r", tmp_path / "b.jsonl", "-o", tmp_path / "ab", *fit)
    assert r.exit_code == 0, r.stderr
    assert "dropped 60 repeated records (60 in b.jsonl): each run counts once" in r.stderr
    r = run("fit", "-r", tmp_path / "twice.jsonl", "-o", tmp_path / "twice", *fit, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["repeated_records"] == len(lines)
    ab, twice = (json.loads((tmp_path / d / "predictor.json").read_text()) for d in ("ab", "twice"))
    assert [f["records"] for f in ab["meta"]["record_files"]] == [len(lines), 0]
    assert ab["meta"]["record_files"][1]["repeated"] == 60
    assert ab["meta"]["cv_members"] == 2  # stated where not the default (8): the shipped fit's is
    assert "cv_members" not in json.loads((ROOT / "advisor" / "predictor_data" / "predictor.json").read_text())["meta"]
    assert twice["meta"]["record_files"] == [{"file": "twice.jsonl", "records": len(lines), "repeated": len(lines),
                                              "sources": ab["meta"]["record_files"][0]["sources"]}]
    # both fitted on the same rows: the same predictor, but for the files they name
    for p in (ab, twice):
        p.pop("sha256")
        p["meta"].pop("record_files")
    assert ab == twice


def test_publish_names_a_run_whose_evaluations_cannot_be_read(tmp_path):
    sweep = tmp_path / "sweep"
    cfg = CalibrateConfig.quick_settings(str(sweep))
    sweep.mkdir()
    (sweep / "config.json").write_text(json.dumps({"stage": "calibrate", "settings": asdict(cfg)}))
    for name in ("high", "low", "mixed"):
        run_dir = sweep / "modchain" / "sum" / "xs-s0" / name
        run_dir.mkdir(parents=True)
        (run_dir / "record.json").write_text("{}")
        (run_dir / "eval.jsonl").write_text("{}\n")
    os.unlink(sweep / "modchain" / "sum" / "xs-s0" / "low" / "eval.jsonl")
    os.mkfifo(sweep / "modchain" / "sum" / "xs-s0" / "low" / "eval.jsonl")
    dest = tmp_path / "dest"
    one_error_line(run("lab", "publish", sweep, dest), "run modchain/sum/xs-s0/low of", dest)
