"""Bad inputs a hostile user tried last: each is one `error:` line and exit code 2, found before any
work and with nothing written, or behaves as its test says."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_advisor.advisor.cli.main import cli


def one_error_line(result, fragment: str, *absent: Path) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment in lines[0], lines[0]
    for p in absent:
        assert not os.path.lexists(p), p
    return lines[0]


def run(args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def manifest(folder: Path, spec: str, **training) -> Path:
    from capacity_advisor.training.manifest import Manifest, TrainingSpec

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text('{"prompt": "what is 1 + 2?", "completion": "3"}\n' * 4)
    m = Manifest(model={"spec": spec}, dataset="train.jsonl", training=TrainingSpec(**training))
    path = folder / "recommendation.json"
    path.write_text(json.dumps(m.to_dict()))
    return path


# ---- 1. every rendering of a chat template is bounded ----------------------------------------

LOOPS_ON_X = ("{% if messages[0]['content'] == 'x' %}{% for i in range(100000) %}{% for j in range(100000) %}"
              "{% endfor %}{% endfor %}{% endif %}<|im_start|>user\n{{ messages[0]['content'] }}<|im_end|>\n"
              "<|im_start|>assistant\n")


def test_a_template_looping_on_the_export_probe_stops_the_llamafactory_export(tiny_qwen, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    (folder / "chat_template.jinja").write_text(LOOPS_ON_X)
    path = manifest(tmp_path / "rec", str(folder))
    code = ("import sys; import capacity_advisor.models.template as t; t.TEMPLATE_SECONDS = 1.0; "
            "from capacity_advisor.advisor.cli.main import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", code, "train", str(path), "--export", str(tmp_path / "export"),
                        "--format", "llamafactory"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "chat template" in lines[0], p.stderr
    assert not (tmp_path / "export").exists()


# ---- 5. the manifest's numbers are bounded by what can run -----------------------------------

@pytest.mark.parametrize("field", ["batch_size", "max_length", "grad_accum", "evals_per_epoch", "max_steps"])
def test_dry_run_refuses_numbers_no_run_can_take(tmp_path, field):
    path = manifest(tmp_path / "rec", "lab:xs")
    m = json.loads(path.read_text())
    m["training"][field] = 10 ** 20
    path.write_text(json.dumps(m))
    one_error_line(run(["train", path, "--out", tmp_path / "run", "--dry-run"]), f"training.{field}", tmp_path / "run")


def test_eval_numbers_are_bounded_too(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    m = json.loads(path.read_text())
    m["eval"]["max_new_tokens"] = 10 ** 20
    path.write_text(json.dumps(m))
    one_error_line(run(["train", path, "--out", tmp_path / "run", "--dry-run"]), "eval.max_new_tokens")


# ---- 6. no tracebacks ----------------------------------------------------------------------

def test_negative_threads_is_a_usage_line(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    one_error_line(run(["train", path, "--out", tmp_path / "run", "--threads", "-1"]), "--threads", tmp_path / "run")
