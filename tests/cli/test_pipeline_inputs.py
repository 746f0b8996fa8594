"""The calibration pipeline's verbs on folders another command made and on hostile archives: each
refused in one `error:` line before any work, nothing in the folder replaced (`advisor calibrate`,
`advisor lab calibrate`, `lab publish`, `lab replay`, `lab stash` / `restore` and `fit`)."""

import gzip
import io
import json
import tarfile
from dataclasses import asdict, replace

import pytest
from helpers import RECORDS, ROOT, one_error_line, run

from capacity_advisor.advisor.lab.units import CalibrateConfig

SMALL = ROOT / "calibration" / "lab2" / "modchain-program-builds"  # a committed, published source
KEPT = '{"kept": 1}\n'


def sweep_folder(folder, **changes):
    """A folder as `advisor lab calibrate --quick --out FOLDER` leaves it (its config.json), settings changed."""
    cfg = replace(CalibrateConfig.quick_settings(str(folder)), **changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"stage": "calibrate", "settings": asdict(cfg)}))
    return cfg


def own_calibration(folder):
    """A folder as `advisor calibrate --out FOLDER` leaves it: its records and config.json with its inputs' key."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"stage": "calibrate-pool", "inputs_key": "0123456789abcdef"}))
    (folder / "records.jsonl").write_text(KEPT)
    return folder


@pytest.mark.parametrize("made_by, words", [
    ("a sweep of other settings", "holds a sweep of other settings (--epochs 1 there, 2 now)"),
    ("a published calibration", "holds files but no sweep's config.json"),
    ("advisor calibrate", "holds another command's output"),
])
def test_lab_calibrate_resumes_only_its_own_sweep(tmp_path, made_by, words):
    out = tmp_path / "out"
    if made_by == "advisor calibrate":
        own_calibration(out)
    else:
        out.mkdir()
        (out / "records.jsonl").write_text(KEPT)
        if made_by == "a sweep of other settings":
            sweep_folder(out)
    one_error_line(run("lab", "calibrate", "--quick", "--out", out, "--epochs", 2), words)
    assert (out / "records.jsonl").read_text() == KEPT


@pytest.mark.parametrize("args, words", [
    (["--seeds", "0,0"], "--seeds names 0 more than once"),
    (["--seeds", "-1"], "--seeds / --mean-seeds must lie in 0 .."),
    (["--teacher", "lab:nope"], "--teacher 'lab:nope': name a lab model"),
    (["--students", "lab:xs"], "--students belongs to `advisor calibrate`"),
    (["--pool", "pool.jsonl", "--dry-run"], "--dry-run, --pool belong to `advisor calibrate`"),
])
def test_lab_calibrate_refuses_before_writing(tmp_path, args, words):
    one_error_line(run("lab", "calibrate", "--quick", "--out", tmp_path / "t", *args), words, tmp_path / "t")


def test_calibrate_refuses_a_folder_of_files_it_did_not_make_and_repeated_seeds(tmp_path):
    pool = tmp_path / "pool.jsonl"
    assert run("lab", "pool", "--n", 64, "--out", pool).exit_code == 0
    out = tmp_path / "calibration"  # e.g. a checkout's committed folder: its records.jsonl must survive
    out.mkdir()
    (out / "records.jsonl").write_text(KEPT)
    args = ("calibrate", "--students", "lab:xs", "--pool", pool, "--epochs", 1, "--n-eval", 8)
    one_error_line(run(*args, "--out", out), "holds files but no calibration's config.json")
    assert (out / "records.jsonl").read_text() == KEPT and sorted(p.name for p in out.iterdir()) == ["records.jsonl"]
    one_error_line(run(*args, "--out", tmp_path / "c", "--seeds", "0,0"), "--seeds names a seed more than once",
                   tmp_path / "c")
    one_error_line(run(*args, "--out", tmp_path / "c", "--checker", "none"), "needs a checker", tmp_path / "c")
    one_error_line(run(*args, "--out", tmp_path / "c", "--launcher", "accelerate"), "give --nproc 2 or more",
                   tmp_path / "c")


def test_publish_takes_a_sweep_into_its_own_or_a_new_dest(tmp_path):
    dest = tmp_path / "dest"
    one_error_line(run("lab", "publish", SMALL, dest), "is a published calibration already", dest)
    # an `advisor calibrate` folder is published by its own settings: one without them is refused
    one_error_line(run("lab", "publish", own_calibration(tmp_path / "own"), dest), "holds no calibration settings",
                   dest)
    sweep = tmp_path / "sweep"
    sweep_folder(sweep)
    sweep_folder(dest, epochs=3)  # the publication of another sweep
    one_error_line(run("lab", "publish", sweep, dest), "holds the publication of a sweep of other settings")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    one_error_line(run("lab", "publish", sweep, other), "holds files but no published sweep's config.json")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_replay_and_fit_point_to_what_they_take(tmp_path):
    out = tmp_path / "r.jsonl"
    one_error_line(run("lab", "replay", SMALL, SMALL, "--out", out), "is named twice", out)
    one_error_line(run("fit", "--records", SMALL / "records.jsonl.xz", "--out", tmp_path / "p"),
                   "is compressed: a published calibration's files are replayed", tmp_path / "p")
    one_error_line(run("fit", "--records", SMALL, "--out", tmp_path / "p"), "is a folder: name its records file",
                   tmp_path / "p")
    sweep = tmp_path / "sweep"  # a record whose unit lacks its fields: named, not a KeyError
    sweep_folder(sweep)
    record = json.loads(RECORDS.read_text().splitlines()[0])
    (sweep / "records.jsonl").write_text(json.dumps({**record, "run_id": "r1", "unit": {"task": "modchain"}}) + "\n")
    one_error_line(run("lab", "replay", sweep, "--out", out), "(run 'r1') lacks score, size, seed", out)


def test_stash_refuses_a_work_folder_that_is_not_there_or_of_other_settings(tmp_path):
    from capacity_advisor.advisor.lab.sources import config

    one_error_line(run("lab", "stash", "--sources", "modchain-program", "--work", tmp_path / "typo", "--stash-dir",
                       tmp_path / "s"), "--work", tmp_path / "s")
    name = "modchain-program"
    sweep_folder(tmp_path / "work" / name, **{**asdict(config(name, tmp_path / "work", 1)), "epochs": 2, "quick": False})
    one_error_line(run("lab", "stash", "--sources", name, "--work", tmp_path / "work", "--stash-dir", tmp_path / "s"),
                   "holds a sweep of other settings (--epochs 2 there, 5 now): rerun with its settings to resume it, or pass a new --work", tmp_path / "s")


SOURCE = "modchain-program"


def stash_of(folder, data: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{SOURCE}.tar.gz").write_bytes(gzip.compress(data))
    return folder


def test_restore_bounds_what_an_archive_unpacks_to_before_tarfile_reads_it(tmp_path, monkeypatch):
    from capacity_advisor.advisor.lab import stash

    # a GNU long-name header is read whole by tarfile before any size check: 2 MiB of name here, above
    # a bound lowered to 1 MiB (the shipped one is STASH_BYTES and 16 MiB more)
    monkeypatch.setattr(stash, "ARCHIVE_BYTES", 1 << 20)
    info = tarfile.TarInfo(f"{SOURCE}/" + "a" * (2 << 20))
    stashed = stash_of(tmp_path / "long", info.tobuf(format=tarfile.GNU_FORMAT))
    work = tmp_path / "work"
    one_error_line(run("lab", "restore", "--sources", SOURCE, "--stash-dir", stashed, "--work", work),
                   "unpacks to more than 1 MiB", work / SOURCE)
    # and more members than a stash of one source holds
    monkeypatch.setattr(stash, "MAX_MEMBERS", 3)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(5):
            m = tarfile.TarInfo(f"{SOURCE}/pools/s{i}.jsonl")
            m.size = 2
            tar.addfile(m, io.BytesIO(b"{}"))
    stashed = stash_of(tmp_path / "many", buf.getvalue())
    one_error_line(run("lab", "restore", "--sources", SOURCE, "--stash-dir", stashed, "--work", work),
                   "holds more than 3 files", work / SOURCE)
