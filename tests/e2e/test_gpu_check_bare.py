"""benchmarks.gpu_check.bare from a bare checkout, in its quick form on a CPU.

The tree is copied without what a GPU machine does not receive (the lab's weights, calibration/,
docs/lab), and run with the packages a GPU machine lacks hidden from every process it starts
(lightgbm, datasets, math-verify, TRL, vLLM, matplotlib, pyarrow): the check must install the
project into its own scratch folder, leave this environment's install as it was, and write the
JSON and the Markdown into the folder it is given, `advisor recommend` end to end included.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_S, ROOT, checkout_copy

LEFT_OUT = ("models/lab/weights/", "calibration/", "docs/lab/")  # what a GPU machine does not receive
HIDDEN = ("lightgbm", "datasets", "math_verify", "trl", "vllm", "matplotlib", "pyarrow")
# Imported first by every python started with this folder on PYTHONPATH: the hidden packages are not
# found, as on a machine where they are not installed (find_spec says None, so libraries that probe
# for them carry on without them).
BLOCKER = f'''import importlib.machinery

HIDDEN = {set(HIDDEN)!r}
_find = importlib.machinery.PathFinder.find_spec.__func__


def _find_spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in HIDDEN:
        return None
    return _find(cls, name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(_find_spec)
'''


def own_install() -> dict:
    """What this environment's site-packages holds of the project (the editable install's finder,
    .pth and dist-info), with their times: the bare check must neither change nor add to it."""
    import sysconfig

    purelib = Path(sysconfig.get_paths()["purelib"])
    return {p.name: p.stat().st_mtime_ns for p in purelib.iterdir() if "capacity" in p.name.replace("-", "_")}


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bare")
    tree = checkout_copy(tmp / "tree", LEFT_OUT)
    (tmp / "block").mkdir()
    (tmp / "block" / "sitecustomize.py").write_text(BLOCKER)
    before = own_install()
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check.bare", str(tmp / "out"), "--quick"],
                       cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp / "block")})
    return r, tmp, tree, before


def test_bare_checkout_installs_and_runs_the_quick_check(bare):
    r, tmp, tree, before = bare
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log", "gpu-check.md", "install.json"]
    installed = json.loads((out / "install.json").read_text())
    assert installed["install"]["method"].startswith("pip install --no-deps --no-build-isolation --no-index --target")
    assert installed["exit"] == 0 and installed["stopped"] is None
    assert "--hf-only" in installed["check"] and "--quick" in installed["check"]
    # the tree was neither built in nor written to, and this environment's install is as it was
    assert not (tree / "build").exists() and not list(tree.glob("*.egg-info"))
    assert not (tree / "models" / "lab" / "weights").exists()
    assert own_install() == before
    res = json.loads((out / "gpu-check.json").read_text())
    assert res["quick"] is True and not res.get("errors") and not res.get("skipped")
    assert res["optional_packages"] == {name: False for name in HIDDEN}  # hidden, and not needed
    assert set(res["parts"]) == {"qwen2.5-1.5b", "recommend", "qwen2.5-7b", "agreement"}
    timed = {"scoring": "seconds", "probe_step": "seconds_per_step", "full_run_step": "seconds_per_step",
             "generation": "seconds"}
    for m in res["students"].values():
        assert all(m[part][field] > 0 for part, field in timed.items())
        assert m["hours"]["gpu_hours"]["calibration_proxy"] > 0
    md = (out / "gpu-check.md").read_text()
    assert "| Qwen2.5-1.5B (--quick shape), float32 |" in md and "| Qwen2.5-7B (--quick shape), float32 |" in md
    assert "GPU-hours on the assumed pool" in md and "advisor recommend --model STUDENT" in md


def test_recommend_ran_end_to_end_with_each_stage_timed(bare):
    _, tmp, _, _ = bare
    rec = json.loads((tmp / "out" / "gpu-check.json").read_text())["recommend"]
    stages = rec["stages"]
    order = ["check_inputs", "load_student", "score_pool", "probe", "probe_evaluations", "probe_training", "advise",
             "write_outputs"]
    assert list(stages) == order and all(v >= 0 and math.isfinite(v) for v in stages.values())
    assert stages["probe_evaluations"] > 0 and stages["probe_training"] > 0
    assert stages["probe"] == pytest.approx(stages["probe_evaluations"] + stages["probe_training"])
    whole = sum(stages[k] for k in ("check_inputs", "load_student", "score_pool", "probe", "advise", "write_outputs"))
    assert 0.8 * rec["total_seconds"] <= whole <= rec["total_seconds"]
    assert rec["strategy"] in ("high", "low", "mixed", "curriculum") and rec["train_rows"] > 0
    assert {"recommendation.json", "train.jsonl", "eval.jsonl", "config.json", "score", "probe"} <= set(rec["written"])
    assert rec["figures"].startswith("not drawn: matplotlib is not installed")
    assert rec["command"].startswith("advisor recommend --model STUDENT --pool pool.jsonl --budget 3 ")


def test_an_out_folder_that_cannot_be_written_is_one_error_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check.bare", str(blocker / "out"), "--quick"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("gpu_check_bare: error: ") and "cannot write there" in r.stderr


def test_without_cuda_and_without_quick_one_error_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check.bare", str(tmp_path / "a" / "b" / "out")],
                       capture_output=True, text=True, cwd=ROOT, timeout=HANG_S)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("gpu_check_bare: error: ") and "CUDA" in r.stderr and "--quick" in r.stderr
    assert not (tmp_path / "a").exists()  # nothing installed, nothing written, no folder made (nor above it)


def test_where_pip_cannot_build_the_folders_are_laid_out(tmp_path, monkeypatch, capsys):
    """A machine whose setuptools is older than pyproject.toml asks for: the wheel's layout by hand."""
    import benchmarks.gpu_check.bare as bare

    real = subprocess.run

    def pip_fails(cmd, *a, **kw):
        if cmd[1:3] == ["-m", "pip"]:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: setuptools>=77 is required (raised by the test)\n")
        return real(cmd, *a, **kw)

    monkeypatch.setattr(bare.subprocess, "run", pip_fails)
    how = bare.install(tmp_path)
    assert how["method"].startswith("folders laid out") and "raised by the test" in how["pip_error"][-1]
    site = tmp_path / "site"
    assert sorted(p.name for p in (site / "capacity_advisor").iterdir()) == sorted(bare.PACKAGES)
    assert (site / "capacity_advisor" / "advisor" / "predictor_data" / "predictor.json").is_file()
    assert not (site / "capacity_advisor" / "models" / "lab" / "weights").exists()
    bare.verify(site, {**os.environ, "PYTHONPATH": str(site)})  # imported from there: no error
    # a folder without the project: the copy installed in this environment would be imported, and is refused
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        bare.verify(tmp_path / "empty", {**os.environ, "PYTHONPATH": str(tmp_path / "empty")})
    assert e.value.code == 2 and "another installed copy" in capsys.readouterr().err
