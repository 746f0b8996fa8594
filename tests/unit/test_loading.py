"""Hub ids without a reachable hub: one error line before any download starts, or the local cache."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_S

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def advisor(args, tmp_path, **env):
    (tmp_path / "pool.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **env}
    r = subprocess.run([sys.executable, "-m", "capacity_advisor.advisor.cli.main", *args, "-p", str(tmp_path / "pool.jsonl"),
                        "-o", str(tmp_path / "out"), "--device", "cpu"],
                       capture_output=True, text=True, env=env, timeout=HANG_S, cwd=Path(__file__).parents[2])
    return r


@pytest.mark.parametrize("setting", [("ENDPOINT", UNREACHABLE), ("HF_HUB_OFFLINE", True)], ids=["unreachable", "offline"])
def test_a_hub_id_without_the_hub_is_one_line_at_once(tmp_path, monkeypatch, setting):
    import transformers
    from click.testing import CliRunner
    from huggingface_hub import constants

    from capacity_advisor.advisor.cli.main import cli

    monkeypatch.setattr(constants, *setting)  # what HF_ENDPOINT / HF_HUB_OFFLINE set when huggingface_hub loads
    asked = []  # it was 50 s of retries inside transformers' downloads: none may start
    for auto in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(auto, "from_pretrained", lambda *a, **k: asked.append(a) or 1 / 0)
    (tmp_path / "pool.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    r = CliRunner().invoke(cli, ["score", "-m", "someorg/somemodel", "-p", str(tmp_path / "pool.jsonl"), "-o", str(tmp_path / "out")])
    assert not asked
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "not in the local Hugging Face cache" in r.stderr and "--model DIR" in r.stderr


@pytest.mark.slow  # a fresh interpreter imports torch and transformers
def test_a_cached_hub_id_loads_without_the_hub(tiny_llama, tmp_path):
    snapshot = tmp_path / "hf" / "hub" / "models--someorg--tiny" / "snapshots" / "0123abc"
    shutil.copytree(tiny_llama, snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abc")
    r = advisor(["score", "-m", "someorg/tiny", "--json"], tmp_path, HF_ENDPOINT=UNREACHABLE)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "scores.jsonl").exists()
