"""The tiny teacher the tests load instead of pretraining one (tests/data/lab/, helpers.TINY_TEACHER_SHAPE):
the lab teacher's recipe at a tiny shape. Its pretraining still runs here, through the lab's own
path (seconds), and makes the stored build; the fixture loads that build under the teacher's names."""

import json

import pytest
from helpers import TINY_TEACHER_BUILDS, TINY_TEACHER_SHAPE, pretrain_tiny_teacher, tiny_teacher_spec

from capacity_advisor.models.lab import committed, ladder


def test_the_tiny_teacher_is_pretrained_by_the_lab_into_the_stored_build(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    calls = []
    build = ladder.build_student
    monkeypatch.setattr(ladder, "build_student", lambda *a, **k: calls.append(a[0]) or build(*a, **k))
    built = pretrain_tiny_teacher(tmp_path / "home")
    assert calls == ["teacher"]  # pretrained here, not copied from a kept build
    stored = TINY_TEACHER_BUILDS / built.name
    assert stored.is_dir() and committed.committed_folder(built.name) is None  # named by this recipe; kept only for the tests
    got, want = (json.loads((d / "build.json").read_text()) for d in (built, stored))
    assert got["recipe"] == want["recipe"] and got["recipe_hash"] == want["recipe_hash"] == built.name.rpartition("-")[2]
    # the lab teacher's recipe (its corpus, rate and batch) at the tiny shape and budget
    teacher = ladder.recipe("teacher")
    assert got["recipe"]["student"] == {**teacher["student"], **TINY_TEACHER_SHAPE}
    assert {k: v for k, v in got["recipe"].items() if k != "student"} == {k: v for k, v in teacher.items() if k != "student"}
    assert got["n_params"] == want["n_params"] == 27744
    assert got["final_loss"] == pytest.approx(want["final_loss"], rel=1e-4)
    a, b = load_file(str(built / "model.safetensors")), load_file(str(stored / "model.safetensors"))
    assert sorted(a) == sorted(b) and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (built / name).read_text() == (stored / name).read_text(), name


def test_the_fixture_loads_the_stored_build_under_the_teachers_names(tiny_teacher, monkeypatch):
    from capacity_advisor.models.loading import load_model

    monkeypatch.setattr(ladder, "build_student", lambda *a, **k: pytest.fail("pretrained the tiny teacher"))
    folder = ladder.student_path("teacher")
    assert ladder.student_path("teacher@40") == ladder.folder_of("teacher@40") == folder  # one recipe, one folder
    assert folder.parent.parent == tiny_teacher and (TINY_TEACHER_BUILDS / folder.name).is_dir()
    lm = load_model("lab:teacher@40", device="cpu")
    assert sum(p.numel() for p in lm.model.parameters()) == 27744


def test_the_real_teacher_is_back_outside_the_tiny_teachers_block():
    with tiny_teacher_spec() as folder:
        assert ladder.spec("teacher").hidden == TINY_TEACHER_SHAPE["hidden"]
    assert ladder.spec("teacher") is ladder.TEACHER and ladder.student_dir("teacher").name != folder.name
