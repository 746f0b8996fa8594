"""Bad inputs of the newer verbs (fit's record files, calibrate's proxies, the lab's builds and the
sweep's stashes): each is one `error:` line and exit code 2, found before any work and with nothing
left behind, or behaves as its test says."""

import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from capacity_advisor.advisor.cli.main import main
from helpers import HANG_S, ROOT, addition_pool

SMALL = ["--epochs", "1", "--n-eval", "8", "--probe-steps", "2", "--probe-batch", "4", "--probe-eval-problems", "4",
         "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32"]


def one_error_line(code: int, err: str, fragment: str, *absent: Path) -> str:
    assert code == 2, (code, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]
    for p in absent:
        assert not os.path.lexists(p), p
    return lines[0]


def advisor(capsys, *args) -> tuple[int, str, str]:
    """`advisor ARGS` through main(argv): (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    got = capsys.readouterr()
    return code, got.out, got.err


def pool(path: Path) -> Path:
    return addition_pool(path, 48, lambda a, b, i: [f"{a + b}", f"the answer is {a + b}"])


def model_with_build(tiny_llama, folder: Path, build: bytes) -> Path:
    shutil.copytree(tiny_llama, folder)
    (folder / "build.json").write_bytes(build)
    return folder


# ---- the sweep's stashes: 1, 11, 12 ------------------------------------------------------------

SOURCE = "addition-teacher-xl-t0.7"


def archive(folder: Path, members: list[tuple[str, bytes]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{SOURCE}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def restore(capsys, stashed: Path, work: Path) -> tuple[int, str]:
    code, _, err = advisor(capsys, "lab", "restore", "--work", work, "--stash-dir", stashed, "--sources", SOURCE)
    return code, err


def test_1_a_stash_member_climbing_out_of_its_source_is_refused_and_nothing_is_unpacked(capsys, tmp_path):
    from capacity_advisor.advisor.lab.stash import restore as restore_source

    archive(tmp_path / "stash", [(f"{SOURCE}/config.json", b"{}"), (f"{SOURCE}/../../x", b"{}")])
    work = tmp_path / "runs" / "work"
    code, err = restore(capsys, tmp_path / "stash", work)
    one_error_line(code, err, f"not a file inside {SOURCE}/", work / SOURCE, tmp_path / "runs" / "x", tmp_path / "x")
    assert not work.exists() or not list(work.iterdir())  # no half-unpacked folder, no temporary one
    # a member that only passes through its folder on the way back in is the same file, and taken
    archive(tmp_path / "good", [(f"{SOURCE}/pools/../config.json", b'{"stage": "calibrate"}')])
    assert restore_source(tmp_path / "good", work, SOURCE)
    assert [p.name for p in (work / SOURCE).iterdir()] == ["config.json"]


def test_11_a_truncated_or_non_gzip_stash_is_one_error_line(capsys, tmp_path):
    whole = archive(tmp_path / "whole", [(f"{SOURCE}/pools/s{i}.jsonl", os.urandom(20_000)) for i in range(4)])
    for name, data in (("truncated", whole.read_bytes()[:30_000]), ("not-gzip", b"a tar.gz this is not\n" * 10),
                       ("not-tar", gzip.compress(b"plain text, not a tar archive\n" * 40))):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{SOURCE}.tar.gz").write_bytes(data)
        work = tmp_path / f"work-{name}"
        code, err = restore(capsys, tmp_path / name, work)
        one_error_line(code, err, "cannot be unpacked", work / SOURCE)
        assert not work.exists() or not list(work.iterdir()), name


def test_12_a_stash_member_of_any_size_is_refused_before_it_is_read(capsys, tmp_path):
    """A member whose header states 1 GiB (its bytes would unpack from a few megabytes): refused
    from its header alone, so the archive here need not hold them."""
    info = tarfile.TarInfo(f"{SOURCE}/pools/s0.jsonl")
    info.size = 1 << 30
    (tmp_path / "stash").mkdir()
    (tmp_path / "stash" / f"{SOURCE}.tar.gz").write_bytes(gzip.compress(info.tobuf() + b"\0" * 4096))
    work = tmp_path / "work"
    code, err = restore(capsys, tmp_path / "stash", work)
    one_error_line(code, err, "larger than a stash is", work / SOURCE)


# ---- calibrate's proxies: 2, 3 -----------------------------------------------------------------

def test_2_a_proxy_folder_holding_only_its_config_is_refused_before_anything_is_written(tiny_llama, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(tiny_llama) / "config.json", bare / "config.json")
    out = tmp_path / "cal"
    code, _, err = advisor(capsys, "calibrate", "--students", bare, "--pool", pool(tmp_path / "pool.jsonl"),
                           "--out", out, *SMALL)
    one_error_line(code, err, "holds no weights", out)
    # the dry run plans from configs alone
    code, _, err = advisor(capsys, "calibrate", "--students", bare, "--pool", tmp_path / "pool.jsonl", "--out", out,
                           "--dry-run", "--json", *SMALL)
    assert code == 0 and not out.exists(), err


def test_3_one_proxy_named_twice_by_another_spelling_is_refused(tiny_llama, tmp_path, capsys):
    out = tmp_path / "cal"
    link = tmp_path / "link"
    link.symlink_to(tiny_llama)
    for second in (f"{tiny_llama}/", link):
        code, _, err = advisor(capsys, "calibrate", "--students", f"{tiny_llama},{second}",
                               "--pool", pool(tmp_path / "pool.jsonl"), "--out", out, *SMALL)
        one_error_line(code, err, "names a model twice", out)


# ---- fit's record files: 4, 5 ------------------------------------------------------------------

def test_4_an_empty_or_blank_records_file_is_refused_by_name(tmp_path, capsys):
    out = tmp_path / "pred"
    for text in ("", "\n  \n\n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        code, _, err = advisor(capsys, "fit", "-r", ROOT / "calibration" / "records.jsonl", "-r", empty, "--out", out)
        line = one_error_line(code, err, "holds no records", out)
        assert str(empty) in line


def test_5_a_record_number_that_is_not_finite_is_refused(tmp_path, capsys):
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
        code, _, err = advisor(capsys, "fit", "-r", path, "--out", out)
        one_error_line(code, err, "line 2: not readable JSON", out)


# ---- the lab sweep's flags: 6 ------------------------------------------------------------------

def test_6_measure_every_below_one_is_refused_with_quick_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("capacity_advisor.advisor.calibration.sweep.run_calibration",
                        lambda *a, **k: pytest.fail("the sweep ran"))
    out = tmp_path / "cal"
    for every in ("0", "-1"):
        for quick in ([], ["--quick"]):
            code, _, err = advisor(capsys, "lab", "calibrate", *quick, "--measure-every", every, "--out", out)
            one_error_line(code, err, f"--measure-every {every} must be at least 1", out)


# ---- a lab build's build.json: 8, 9 ------------------------------------------------------------

def test_8_a_build_rate_no_pretraining_runs_at_is_refused(tiny_llama, tmp_path, capsys):
    build = json.dumps({"recipe": {"student": {"name": "xs", "lr": 1e-300}}}).encode()
    folder = model_with_build(tiny_llama, tmp_path / "student", build)
    out = tmp_path / "cal"
    code, _, err = advisor(capsys, "calibrate", "--students", folder, "--pool", pool(tmp_path / "pool.jsonl"),
                           "--out", out, "--dry-run", "--json", *SMALL)
    one_error_line(code, err, "recipe.student.lr 1e-300", out)


def test_9_an_unreadable_build_file_is_one_note_and_the_real_recipe(tiny_llama, tmp_path, capsys):
    damaged = {"damaged": b'{"recipe": {"student": ', "huge": b" " * (2 << 20) + b"{}",
               "not-utf8": b'{"recipe": {"student": {"name": "xs\xff", "lr": 0.001}}}',
               "nan-rate": b'{"recipe": {"student": {"name": "xs", "lr": NaN}}}'}
    path = pool(tmp_path / "pool.jsonl")
    for name, build in damaged.items():
        folder = model_with_build(tiny_llama, tmp_path / name, build)
        code, out, err = advisor(capsys, "calibrate", "--students", folder, "--pool", path, "--out", tmp_path / "cal",
                                 "--dry-run", "--json", *SMALL)
        assert code == 0, err
        notes = [line for line in err.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and f"{folder}/build.json was not read" in notes[0] and "real" in notes[0], (name, err)
        assert json.loads(out)["cost"]["students"][0]["learning_rate"] == 1e-3  # the size default, not a lab rate
    readable = model_with_build(tiny_llama, tmp_path / "readable",
                                json.dumps({"recipe": {"student": {"name": "xs", "lr": 3e-3}}}).encode())
    code, out, err = advisor(capsys, "calibrate", "--students", readable, "--pool", path, "--out", tmp_path / "cal",
                             "--dry-run", "--json", *SMALL)
    assert code == 0 and "note:" not in err and json.loads(out)["cost"]["students"][0]["learning_rate"] == 1.5e-3


# ---- a killed writer's temporary: 10 -----------------------------------------------------------

DIES_WRITING_SCORES = """
import os, signal, sys
import capacity_advisor.advisor.scoring.score as scoring

real = scoring.write_jsonl

def dying(path, rows):
    def rows_then_kill():
        for i, row in enumerate(rows):
            if i == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            yield row
    return real(path, rows_then_kill())

scoring.write_jsonl = dying
from capacity_advisor.advisor.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_10_a_killed_run_leaves_no_temporary_after_the_rerun(tiny_llama, tmp_path, capsys):
    out = tmp_path / "score"
    args = ["score", "-m", tiny_llama, "-p", pool(tmp_path / "pool.jsonl"), "-o", out]
    killed = subprocess.run([sys.executable, "-c", DIES_WRITING_SCORES, *map(str, args)], capture_output=True,
                            text=True, timeout=HANG_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert list(out.glob(".scores.jsonl.*.tmp"))  # killed while writing scores.jsonl
    code, _, err = advisor(capsys, *args)
    assert code == 0, err
    assert (out / "scores.jsonl").is_file() and not list(out.glob(".*.tmp"))


# ---- a kept or stashed lab build with a linked file: 13 ----------------------------------------

def linked_build(built: Path, folder: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the lab build `built` at `folder` whose file `name` is a link to a file elsewhere."""
    shutil.copytree(built, folder)
    elsewhere = tmp_path / f"elsewhere-{name}"
    shutil.copy(folder / name, elsewhere)
    (folder / name).unlink()
    (folder / name).symlink_to(elsewhere)
    return folder


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_13_a_lab_build_whose_file_is_a_link_is_neither_adopted_nor_stashed(lab_cache, tmp_path, capsys, monkeypatch,
                                                                            name):
    import capacity_advisor.models.lab.ladder as ladder
    from capacity_advisor.models.lab import committed

    built = lab_cache / "lab" / f"xs-{ladder.recipe_hash('xs')}"
    home = tmp_path / "home"
    monkeypatch.setenv("ADVISOR_HOME", str(home))
    monkeypatch.setattr(ladder, "build_student", lambda *a, **k: pytest.fail("pretrained"))
    kept = tmp_path / "kept"
    monkeypatch.setattr(committed, "WEIGHTS", kept)
    # a kept build: not copied into the cache
    linked_build(built, kept / built.name, tmp_path, name)
    code, _, err = advisor(capsys, "lab", "build", "--sizes", "xs")
    one_error_line(code, err, "symbolic link", home / "lab" / built.name)
    assert not (home / "lab").exists() or not list((home / "lab").iterdir())
    # a build in the cache: not kept in the repository
    shutil.rmtree(kept)
    (tmp_path / "again").mkdir()
    linked_build(built, home / "lab" / built.name, tmp_path / "again", name)
    code, _, err = advisor(capsys, "lab", "stash", "--sizes", "xs")
    one_error_line(code, err, "symbolic link", kept)
