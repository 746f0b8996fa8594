"""A lab build's files, read as input: a build.json that states a rate no pretraining runs at is
refused, one that cannot be read is one note (the folder is then a real student), and a build whose
file is a link is neither adopted into the cache nor kept in the repository."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import CALIBRATE_SMALL, advisor, answer_pool, one_error_line


def model_with_build(tiny_llama, folder: Path, build: bytes) -> Path:
    shutil.copytree(tiny_llama, folder)
    (folder / "build.json").write_bytes(build)
    return folder


def test_a_build_rate_no_pretraining_runs_at_is_refused(tiny_llama, tmp_path, capsys):
    build = json.dumps({"recipe": {"student": {"name": "xs", "lr": 1e-300}}}).encode()
    folder = model_with_build(tiny_llama, tmp_path / "student", build)
    out = tmp_path / "cal"
    one_error_line(advisor(capsys, "calibrate", "--students", folder, "--pool", answer_pool(tmp_path / "pool.jsonl"),
                           "--out", out, "--dry-run", "--json", *CALIBRATE_SMALL), "recipe.student.lr 1e-300", out)


def test_an_unreadable_build_file_is_one_note_and_the_real_recipe(tiny_llama, tmp_path, capsys):
    damaged = {"damaged": b'{"recipe": {"student": ', "huge": b" " * (2 << 20) + b"{}",
               "not-utf8": b'{"recipe": {"student": {"name": "xs\xff", "lr": 0.001}}}',
               "nan-rate": b'{"recipe": {"student": {"name": "xs", "lr": NaN}}}'}
    path = answer_pool(tmp_path / "pool.jsonl")
    for name, build in damaged.items():
        folder = model_with_build(tiny_llama, tmp_path / name, build)
        code, out, err = advisor(capsys, "calibrate", "--students", folder, "--pool", path, "--out", tmp_path / "cal",
                                 "--dry-run", "--json", *CALIBRATE_SMALL)
        assert code == 0, err
        notes = [line for line in err.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and f"{folder}/build.json was not read" in notes[0] and "real" in notes[0], (name, err)
        assert json.loads(out)["cost"]["students"][0]["learning_rate"] == 1e-3  # the size default, not a lab rate
    readable = model_with_build(tiny_llama, tmp_path / "readable",
                                json.dumps({"recipe": {"student": {"name": "xs", "lr": 3e-3}}}).encode())
    code, out, err = advisor(capsys, "calibrate", "--students", readable, "--pool", path, "--out", tmp_path / "cal",
                             "--dry-run", "--json", *CALIBRATE_SMALL)
    assert code == 0 and "note:" not in err and json.loads(out)["cost"]["students"][0]["learning_rate"] == 1.5e-3


def linked_build(built: Path, folder: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the lab build `built` at `folder` whose file `name` is a link to a file elsewhere."""
    shutil.copytree(built, folder)
    elsewhere = tmp_path / f"elsewhere-{name}"
    shutil.copy(folder / name, elsewhere)
    (folder / name).unlink()
    (folder / name).symlink_to(elsewhere)
    return folder


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_lab_build_whose_file_is_a_link_is_neither_adopted_nor_stashed(lab_cache, tmp_path, capsys, monkeypatch,
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
    one_error_line(advisor(capsys, "lab", "build", "--sizes", "xs"), "symbolic link", home / "lab" / built.name)
    assert not (home / "lab").exists() or not list((home / "lab").iterdir())
    # a build in the cache: not kept in the repository
    shutil.rmtree(kept)
    (tmp_path / "again").mkdir()
    linked_build(built, home / "lab" / built.name, tmp_path / "again", name)
    one_error_line(advisor(capsys, "lab", "stash", "--sizes", "xs"), "symbolic link", kept)
