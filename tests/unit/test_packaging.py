"""The installed distribution is one import namespace, and lives beside unrelated `models` / `training` packages."""

import subprocess
import sys
import zipfile
from helpers import HANG_S, ROOT


def test_wheel_holds_one_namespace_and_coexists_with_a_package_named_models(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                            "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=HANG_S)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"capacity_advisor", wheel.name.split("-")[0] + "-" +
                                                 wheel.name.split("-")[1] + ".dist-info"}
    for data in ("capacity_advisor/advisor/predictor_data/predictor.json",
                 "capacity_advisor/advisor/predictor_data/paper_findings.json",
                 "capacity_advisor/models/lab/data/modchain-teacher-pool.jsonl.gz"):
        assert data in names
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, timeout=HANG_S)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for unrelated in ("models", "training"):  # someone else's packages, installed beside ours
        (site / unrelated).mkdir()
        (site / unrelated / "__init__.py").write_text(f"WHO = 'someone else\\'s {unrelated}'\n")
    code = ("import models, training; from capacity_advisor.models.loading import load_model; "
            "from capacity_advisor.advisor.predictor import Predictor; import capacity_advisor.training.sft; "
            "print(models.WHO, '|', training.WHO, '|', capacity_advisor.training.sft.__name__)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "someone else's models | someone else's training | capacity_advisor.training.sft"
