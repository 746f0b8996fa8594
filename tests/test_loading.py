"""Hub ids without a reachable hub: one error line within seconds, or the local cache."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def advisor(args, tmp_path, **env):
    (tmp_path / "pool.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **env}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "capacity_advisor.advisor.cli.main", *args, "-p", str(tmp_path / "pool.jsonl"),
                        "-o", str(tmp_path / "out"), "--device", "cpu"],
                       capture_output=True, text=True, env=env, timeout=60, cwd=Path(__file__).parent.parent)
    return r, time.perf_counter() - t0


@pytest.mark.parametrize("setting", [("ENDPOINT", UNREACHABLE), ("HF_HUB_OFFLINE", True)], ids=["unreachable", "offline"])
def test_a_hub_id_without_the_hub_is_one_line_at_once(tmp_path, monkeypatch, setting):
    from click.testing import CliRunner
    from huggingface_hub import constants

    from capacity_advisor.advisor.cli.main import cli

    monkeypatch.setattr(constants, *setting)  # what HF_ENDPOINT / HF_HUB_OFFLINE set when huggingface_hub loads
    (tmp_path / "pool.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    t0 = time.perf_counter()
    r = CliRunner().invoke(cli, ["score", "-m", "someorg/somemodel", "-p", str(tmp_path / "pool.jsonl"), "-o", str(tmp_path / "out")])
    assert time.perf_counter() - t0 < 10  # it was 50 s of retries
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "not in the local Hugging Face cache" in r.stderr and "--model DIR" in r.stderr


def test_a_cached_hub_id_loads_without_the_hub(tiny_llama, tmp_path):
    snapshot = tmp_path / "hf" / "hub" / "models--someorg--tiny" / "snapshots" / "0123abc"
    shutil.copytree(tiny_llama, snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abc")
    r, seconds = advisor(["score", "-m", "someorg/tiny", "--json"], tmp_path, HF_ENDPOINT=UNREACHABLE)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "scores.jsonl").exists() and seconds < 20  # it was 27 s of retries
