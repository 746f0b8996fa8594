"""The suite's fixtures: tiny random-init models of two architectures (no download), cache homes
with the smallest lab student or the tiny teacher, and a cache home of its own for every test.

`tiny_llama`: Llama, no chat template (plain prompt/response join, BOS added by the tokenizer).
`tiny_qwen`: Qwen2, with a chat template.

The helpers the test files share are in tests/helpers.py; no test file imports from here.
"""

from __future__ import annotations

import os

import pytest

# The tests' models are tiny: a second torch thread buys nothing, and on shared cores the threads of
# one process spin against each other (a lab probe took twice as long). OMP_NUM_THREADS overrides.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import build_tiny, home_with, tiny_teacher_home, tiny_teacher_spec  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Every test that takes a minute or more on two shared cores carries its own
    `@pytest.mark.slow` (`make test-fast` leaves them out); one that uses a slow fixture without
    the mark is a mistake this catches at collection rather than a fast run that turns slow."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid} uses a slow fixture: mark it @pytest.mark.slow")


SLOW_FIXTURES: set[str] = set()  # fixtures that take a minute or so: a test using one must be marked slow


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap():
    """At each test file's start, with the libraries every training test imports loaded, what is
    alive (those libraries, session fixtures, the loaded models' cache) is moved out of the cycle
    collector's sight (`gc.freeze`). A run collects garbage twice (the Trainer as it starts,
    `training.sft.release_memory` as it returns), and a full collection over a heap holding torch and
    transformers takes about 0.3 s: in a suite of hundreds of tiny runs, a third of a calibration
    test's time. Garbage is collected first (a failed test's frames released), so none is frozen;
    frozen objects are still freed when their last reference goes."""
    import gc
    import sys

    import torch  # noqa: F401
    from transformers import Trainer  # noqa: F401

    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny-qwen"), "qwen2", seed=1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Each test gets its own cache home unless it asks for a shared one."""
    if "ADVISOR_HOME" not in os.environ or os.environ.get("ADVISOR_TEST_KEEP_HOME") != "1":
        monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "advisor-home"))


@pytest.fixture(scope="session")
def lab_cache(tmp_path_factory):
    """A cache home holding the smallest lab student, built once per test session (seconds)."""
    return home_with(tmp_path_factory, "lab-cache", "xs")


@pytest.fixture
def lab_home(lab_cache, monkeypatch):
    monkeypatch.setenv("ADVISOR_HOME", str(lab_cache))
    return lab_cache


@pytest.fixture(scope="session")
def tiny_teacher_cache(tmp_path_factory):
    """A cache home holding the tiny teacher, loaded from tests/data/lab/ (not pretrained), once per session."""
    return tiny_teacher_home(tmp_path_factory.mktemp("tiny-teacher"))


@pytest.fixture
def tiny_teacher(tiny_teacher_cache, monkeypatch):
    """For this test the lab's `teacher` (`lab:teacher`, and `lab:teacher@40`: the same recipe) is
    the tiny teacher (helpers.TINY_TEACHER_SHAPE), held in the cache home this returns, which is
    ADVISOR_HOME. A test that writes to the home copies it first (the home is shared)."""
    with tiny_teacher_spec():
        monkeypatch.setenv("ADVISOR_HOME", str(tiny_teacher_cache))
        yield tiny_teacher_cache
