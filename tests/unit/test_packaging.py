"""The installed distribution: built from what a fresh clone holds, the wheel carries every package
folder of the tree (found by setup.py, not listed), is one import namespace, and lives beside
unrelated `models` / `training` packages."""

import ast
import subprocess
import sys
import zipfile

import pytest
from helpers import HANG_S, ROOT, checkout_copy

LEFT_OUT = ("calibration/", "docs/lab/")  # large, and no package data: a clone's copy builds without them


def package_folders() -> dict[str, list[str]]:
    """{package folder: its modules} under the folders setup.py installs (its ROOTS), as the wheel
    must hold them: capacity_advisor/<folder>/<module>.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    roots = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ROOTS")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *roots], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    folders: dict[str, list[str]] = {}
    for rel in listed:
        if rel.endswith("/__init__.py"):
            folders.setdefault(rel.rpartition("/")[0], [])
    for rel in listed:
        if rel.endswith(".py") and rel.rpartition("/")[0] in folders:
            folders[rel.rpartition("/")[0]].append(rel)
    return folders


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel pip builds from a copy of the files a fresh clone holds (no build folder, egg-info or
    editable install of this checkout takes part)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = checkout_copy(tmp / "clone", LEFT_OUT)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(tree),
                            "-w", str(tmp / "wheel")], capture_output=True, text=True, timeout=HANG_S)
    assert built.returncode == 0, built.stderr[-2000:]
    (path,) = (tmp / "wheel").glob("*.whl")
    return path


def test_the_wheel_holds_every_package_folder_of_the_tree_and_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = package_folders()
    assert {"advisor", "core", "models", "probes", "training", "advisor/calibration", "models/lab"} <= set(folders)
    missing = [f"capacity_advisor/{m}" for modules in folders.values() for m in modules
               if f"capacity_advisor/{m}" not in names]
    assert not missing, missing
    packaged = {n.rpartition("/")[0][len("capacity_advisor/"):] for n in names if n.endswith("/__init__.py")}
    assert packaged == set(folders), packaged ^ set(folders)  # nothing more either (no build leftovers)


def test_wheel_holds_one_namespace_and_coexists_with_a_package_named_models(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"capacity_advisor", wheel.name.split("-")[0] + "-" +
                                                 wheel.name.split("-")[1] + ".dist-info"}
    for data in ("capacity_advisor/advisor/predictor_data/predictor.json",
                 "capacity_advisor/advisor/predictor_data/paper_findings.json",
                 "capacity_advisor/advisor/pools/modchain-teacher-pool.jsonl.gz"):
        assert data in names
    assert any(n.startswith("capacity_advisor/models/lab/weights/shipped/xs-") for n in names)
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, timeout=HANG_S)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for unrelated in ("models", "training"):  # someone else's packages, installed beside ours
        (site / unrelated).mkdir()
        (site / unrelated / "__init__.py").write_text(f"WHO = 'someone else\\'s {unrelated}'\n")
    code = ("import models, training; from capacity_advisor.models.loading import load_model; "
            "from capacity_advisor.advisor.predictor import Predictor; import capacity_advisor.training.sft; "
            "from capacity_advisor.advisor.cli.main import main; "
            "print(models.WHO, '|', training.WHO, '|', capacity_advisor.training.sft.__name__)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "someone else's models | someone else's training | capacity_advisor.training.sft"
