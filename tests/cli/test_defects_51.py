"""Bad inputs of the newer verbs (issue 51): a torn evaluation file, special files where a regular
one is expected, two writers on one folder, repeated records, out-of-range numbers. Each is one
`error:` line and exit code 2 with nothing left behind, or a rerun that ends as the run would have."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_S, ROOT, make_manifest, one_error_line, race_manifest, record_subset, run

from capacity_advisor.advisor.calibration.grid import CalibrateConfig

STASHED = "addition-teacher-xl-t0.7"  # a source of `advisor lab sweep`


def no_loading(monkeypatch):
    """Loading a model fails the test: what is refused must be refused before any model loads."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("capacity_advisor.models.loading.load_model", refuse)


def tear(path: Path, n: int = 40) -> None:
    """What a kill or a full disk during a write leaves: the file without its last `n` bytes."""
    data = path.read_bytes()
    path.write_bytes(data[:-n])


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


# ---- 1: a torn last line of eval.jsonl --------------------------------------------------------

def test_1_a_torn_last_line_of_a_runs_evaluations_is_dropped_and_the_rerun_ends_as_the_run_did(tmp_path, tiny_llama):
    path = race_manifest(tmp_path / "rec", tiny_llama)
    out = tmp_path / "race"
    first = run("train", path, "--out", out, "--race", 0.5, "--records", tmp_path / "r.jsonl", "--json")
    assert first.exit_code == 0, first.stderr
    evals = {s: (out / "race" / s / "eval.jsonl").read_text() for s in ("high", "low")}
    race = (out / "race.json").read_text()
    for s in ("high", "low"):  # the winner's and the loser's last evaluation, each cut 40 bytes short
        tear(out / "race" / s / "eval.jsonl")
    again = run("train", path, "--out", out, "--race", 0.5, "--records", tmp_path / "r.jsonl", "--json")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout) and (out / "race.json").read_text() == race
    for s in ("high", "low"):  # each row put back from its checkpoint's marker
        assert (out / "race" / s / "eval.jsonl").read_text() == evals[s]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 1

    # a run killed after its last checkpoint, before its record, with its last row torn: the rerun
    # finishes from that checkpoint and records what the whole run measured
    plain, store = tmp_path / "plain", tmp_path / "plain.jsonl"
    assert run("train", path, "--out", plain, "--records", store, "--max-steps", 4).exit_code == 0
    record = json.loads((plain / "record.json").read_text())
    (plain / "record.json").unlink()
    store.write_bytes(store.read_bytes()[:-40])  # the store's append cut short too
    tear(plain / "eval.jsonl")
    rerun = run("train", path, "--out", plain, "--records", store, "--max-steps", 4)
    assert rerun.exit_code == 0, rerun.stderr
    again = json.loads((plain / "record.json").read_text())
    assert without(again, "provenance") == without(record, "provenance")
    assert [json.loads(line) for line in store.read_text().splitlines()] == [again]  # the torn line cut off


# ---- 2: special files where a regular one is expected ----------------------------------------

def test_2_a_fifo_folder_or_device_where_a_run_keeps_a_file_is_one_error_line_at_once(tmp_path, monkeypatch):
    no_loading(monkeypatch)
    plain = make_manifest(tmp_path / "rec", "lab:s")
    raced = race_manifest(tmp_path / "race-rec", "lab:s")
    cases = [("config.json", os.mkfifo, []), ("config.json", os.mkfifo, ["--race", 0.5]),
             ("eval.jsonl", os.mkfifo, []), ("record.json", os.mkdir, []), ("race.json", os.mkfifo, ["--race", 0.5]),
             ("config.json", lambda p: os.symlink("/dev/zero", p), [])]
    for i, (name, make, more) in enumerate(cases):
        out = tmp_path / f"out{i}"
        out.mkdir()
        make(out / name)
        line = one_error_line(run("train", raced if more else plain, "--out", out, *more), f"{out / name} is a")
        assert "pass a new --out" in line
        assert sorted(p.name for p in out.iterdir()) == [name]
    fifo = tmp_path / "records.jsonl"
    os.mkfifo(fifo)
    one_error_line(run("train", plain, "--out", tmp_path / "o", "--records", fifo), "is a FIFO, not a regular file",
                   tmp_path / "o")


# ---- 3: two writers on one folder --------------------------------------------------------------

HOLD = """
import sys
from capacity_advisor.core.files import folder_lock

with folder_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_3_a_folder_in_use_is_refused_in_one_line_and_a_killed_writers_lock_does_not_block_the_rerun(
        tmp_path, tiny_llama):
    path = race_manifest(tmp_path / "rec", tiny_llama)
    out = tmp_path / "out"
    # another process writing into OUT (the lock every writing verb takes), stopped dead at a known point
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for args in (["train", path, "--out", out, "--race", 0.5], ["train", path, "--out", out],
                     ["recommend", "-m", "lab:xs", "-b", 1, "--out", out]):
            line = one_error_line(run(*args), f"is in use by process {holder.pid}")
            assert str(out) in line
        assert sorted(p.name for p in out.iterdir()) == [".advisor.lock"]
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the lock file stays, holding its PID
        holder.wait()
    assert (out / ".advisor.lock").read_text().strip() == str(holder.pid)
    r = run("train", path, "--out", out, "--max-steps", 2, "--records", tmp_path / "r.jsonl")
    assert r.exit_code == 0, r.stderr
    assert (out / "record.json").is_file() and not (out / ".advisor.lock").exists()


# ---- 4, 5: lab restore ------------------------------------------------------------------------

def test_4_lab_restore_into_a_work_folder_that_cannot_be_made_is_one_error_line(tmp_path):
    (tmp_path / "stash").mkdir()
    one_error_line(run("lab", "restore", "--work", "/proc/x", "--stash-dir", tmp_path / "stash", "--sources", STASHED),
                   "--work /proc/x: cannot write in /proc")


@pytest.mark.parametrize("kind, make, words", [
    ("folder", os.mkdir, "is a folder, not a stash archive"),
    ("fifo", os.mkfifo, "is a FIFO, not a stash archive"),
    ("device", lambda p: os.symlink("/dev/zero", p), "is a device, not a stash archive"),
])
def test_5_a_stash_that_is_no_archive_is_one_error_line_not_nothing_restored(tmp_path, kind, make, words):
    (tmp_path / "stash").mkdir()
    make(tmp_path / "stash" / f"{STASHED}.tar.gz")
    work = tmp_path / "work"
    one_error_line(run("lab", "restore", "--work", work, "--stash-dir", tmp_path / "stash", "--sources", STASHED),
                   words, work)


# ---- 6: repeated records in fit ---------------------------------------------------------------

def test_6_repeated_records_count_once_in_the_fit_and_the_fit_says_how_many(tmp_path):
    """B repeats 60 of A's records, and one file holds every record twice: each run counts once, the
    fit says how many it dropped, and both fit what A alone holds."""
    lines = record_subset()
    # a.jsonl as a records store left by a killed append: its last line cut short, no newline
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:300])
    (tmp_path / "b.jsonl").write_text("\n".join(lines[:60]) + "\n")  # 60 of a's records again
    (tmp_path / "twice.jsonl").write_text("\n".join(lines + lines) + "\n")  # every record twice
    fit = ("--kinds", "logistic", "--members", 2, "--cv", "student")
    r = run("fit", "-r", tmp_path / "a.jsonl", "-r", tmp_path / "b.jsonl", "-o", tmp_path / "ab", *fit)
    assert r.exit_code == 0, r.stderr
    assert "dropped 60 repeated records (60 in b.jsonl): each run counts once" in r.stderr
    r = run("fit", "-r", tmp_path / "twice.jsonl", "-o", tmp_path / "twice", *fit, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["repeated_records"] == len(lines)
    ab, twice = (json.loads((tmp_path / d / "predictor.json").read_text()) for d in ("ab", "twice"))
    assert [f["records"] for f in ab["meta"]["record_files"]] == [len(lines), 0]
    assert ab["meta"]["record_files"][1]["repeated"] == 60
    assert twice["meta"]["record_files"] == [{"file": "twice.jsonl", "records": len(lines), "repeated": len(lines),
                                              "sources": ab["meta"]["record_files"][0]["sources"]}]
    # both fitted on the same rows: the same predictor, but for the files they name
    for p in (ab, twice):
        p.pop("sha256")
        p["meta"].pop("record_files")
    assert ab == twice


# ---- 7: lab publish ---------------------------------------------------------------------------

def test_7_publish_names_a_run_whose_evaluations_cannot_be_read(tmp_path):
    sweep = tmp_path / "sweep"
    cfg = CalibrateConfig.quick_settings(str(sweep))
    sweep.mkdir()
    from dataclasses import asdict

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


# ---- 8: a refused sweep leaves nothing --------------------------------------------------------

def test_8_an_out_of_range_setting_of_lab_calibrate_is_refused_with_its_value_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    huge = 10 ** 30
    line = one_error_line(run("lab", "calibrate", "--quick", "--out", out, "--measure-every", huge),
                          f"--measure-every {huge} is beyond what a run takes", out)
    assert "got 10" not in line
    # so the same command with a sane value finds no settings of another sweep: the flags that differ
    # are refused for what they are, and nothing is written either
    one_error_line(run("lab", "calibrate", "--quick", "--out", out, "--measure-every", 2, "--epochs", huge),
                   f"--epochs {huge} is beyond what a run takes", out)


# ---- 9: a damaged D_low ----------------------------------------------------------------------

@pytest.mark.parametrize("damage, words", [
    ("torn", "line 16: not valid JSON"), ("fields", "row 3: needs string fields"), ("utf-8", "not valid UTF-8"),
    ("empty", "has no rows"), ("fifo", "is a FIFO, not a file"), ("folder", "is a folder, not a file"),
])
def test_9_a_damaged_d_low_is_refused_before_a_model_is_loaded(tmp_path, tiny_llama, monkeypatch, damage, words):
    no_loading(monkeypatch)
    path = race_manifest(tmp_path / "rec", tiny_llama)
    low = tmp_path / "rec" / "train-low.jsonl"
    rows = low.read_text().splitlines()
    if damage == "torn":
        tear(low)
    elif damage == "fields":
        low.write_text("\n".join(rows[:2] + ['{"prompt": "x", "response": 3}'] + rows[3:]) + "\n")
    elif damage == "utf-8":
        low.write_bytes(low.read_bytes()[:-30] + b"\xff\xfe}\n")
    elif damage == "empty":
        low.write_text("")
    else:
        low.unlink()
        (os.mkfifo if damage == "fifo" else os.mkdir)(low)
    out = tmp_path / "out"
    line = one_error_line(run("train", path, "--out", out, "--race", 0.5), words, out)
    assert "train-low.jsonl" in line


# ---- 10: out-of-range race numbers ------------------------------------------------------------

def test_10_a_race_share_below_one_step_or_a_lead_longer_than_a_run_is_refused(tmp_path, monkeypatch):
    no_loading(monkeypatch)
    path = race_manifest(tmp_path / "rec", "lab:s")  # 2 epochs of 4 steps: 8 steps, 8 evaluations
    out = tmp_path / "out"
    one_error_line(run("train", path, "--out", out, "--race", "1e-320"), "below one training step (a run here is 8 "
                   "steps): give a share of at least 0.125", out)
    one_error_line(run("train", path, "--out", out, "--race", 0.5, "--race-k", "99999999999999999999"),
                   "more evaluations in a row than a run here has (8)", out)
    assert run("train", path, "--out", out, "--race", 0.125, "--race-k", 8, "--dry-run").exit_code == 0
    assert not out.exists()


# ---- 11: the bare GPU check -------------------------------------------------------------------

def test_11_the_bare_gpu_check_refused_without_cuda_leaves_no_folders(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check.bare", str(tmp_path / "a" / "b" / "c")],
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 2 and "no CUDA GPU is visible" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "a").exists()


# ---- past the list: special files and numbers out of range against the other verbs -----------

@pytest.mark.parametrize("args, words", [
    (["train", "<fifo>", "-o", "<out>"], "fifo is a FIFO: pass the recommendation.json"),
    (["fit", "-r", "<fifo>", "-o", "<out>"], "fifo is a FIFO, not a regular file"),
    (["select", "-p", "<pool>", "-s", "<pool>", "-o", "<out>/s.jsonl"], "pool.jsonl is a FIFO, not a regular file"),
    (["score", "-m", "lab:xs", "-p", "<zero>", "-o", "<out>"], "zero.jsonl is a device or socket, not a regular file"),
    (["recommend", "-m", "lab:xs", "-b", 1, "-p", "<pool>", "-o", "<out>"], "pool.jsonl is a FIFO, not a regular file"),
    (["train", "<manifest>", "-o", "<out>", "--nproc", 2, "--launcher", "accelerate", "--accelerate-config", "<fifo>"],
     "fifo is a FIFO, not a config file"),
    (["lab", "pool", "--n", 10 ** 14, "--out", "<out>/p.jsonl"], "--n must be from 1 to 1,000,000 problems"),
])
def test_a_special_file_where_a_verb_reads_a_file_or_a_count_past_any_use_is_one_error_line(tmp_path, monkeypatch,
                                                                                              args, words):
    no_loading(monkeypatch)
    names = {"<fifo>": tmp_path / "fifo", "<pool>": tmp_path / "pool.jsonl", "<zero>": tmp_path / "zero.jsonl",
             "<manifest>": make_manifest(tmp_path / "rec", "lab:s"), "<out>": tmp_path / "out"}
    os.mkfifo(names["<fifo>"])
    os.mkfifo(names["<pool>"])
    os.symlink("/dev/zero", names["<zero>"])
    for key, path in names.items():
        args = [str(a).replace(key, str(path)) for a in args]
    one_error_line(run(*args), words, tmp_path / "out")
