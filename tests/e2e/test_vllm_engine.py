"""The vllm backend against vLLM's real engine (its CPU build): `make test-vllm`, in `.venv-vllm-cpu`.

Every test here is marked `vllm_engine` and the module is skipped where vllm is not importable
(the main `.venv`, where `tests/unit/test_vllm.py` checks the same plumbing against a stand-in). The
models are random-init Llama (no chat template) and Qwen2 (chat template) built here, with head
size 32: vLLM's CPU attention takes 32, 64, 80, ... only. One engine per model is shared by the
in-process tests; the CLI tests run `advisor score` in subprocesses, each starting its own.

Checked: scores agree with the hf backend per token within 1e-4 with the same token counts;
greedy generations are the same text; data-parallel ranks merge to the single run's file; a run
killed with SIGKILL resumes from its shards to the uninterrupted run's file; with --json, stdout
is the JSON alone; the settings the backend chooses on CPU; and an engine that cannot run the
model (head size, architecture, memory, damaged weights) ends as one `error:` line, exit code 2.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from capacity_advisor.models.hf import HFBackend  # noqa: E402
from capacity_advisor.models.loading import load_model  # noqa: E402
from capacity_advisor.models import vllm as vllm_backend  # noqa: E402
from capacity_advisor.models.vllm import VLLMBackend  # noqa: E402
from capacity_advisor.models.vllm_engine import KV_ENV, on_cpu_build  # noqa: E402
from helpers import CORPUS, PAIRS, addition_pool, build_tiny, one_error_line  # noqa: E402

pytestmark = pytest.mark.vllm_engine

if not on_cpu_build():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vllm is installed but neither its CPU build nor a CUDA GPU is here", allow_module_level=True)

ADVISOR = Path(sys.executable).with_name("advisor")  # the console script of this environment
HIDDEN = 128  # 4 heads of 32: the smallest head size vLLM's CPU attention takes
WORDS = " ".join(CORPUS).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# A mix of short and long responses; the last one is cut at MAX_LENGTH.
MAX_LENGTH = 512
_rng = random.Random(0)
SCORE_PAIRS = list(PAIRS) + [(f"what is {i} + {i + 3}?", words(_rng, _rng.randint(3, 160))) for i in range(24)] + [
    ("a long one", words(_rng, 700))]
PROMPTS = ["what is 12 + 35?", "Let us think", "The quick brown fox", "Question: what is 7 + 8? Answer:"]


@pytest.fixture(scope="module", autouse=True)
def _backend_chooses():
    """No cache size or logging config of the caller's: these tests check what the backend picks."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [KV_ENV, *(k for k in os.environ if k.startswith("VLLM_LOGGING") or k == "VLLM_CONFIGURE_LOGGING")]:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{arch: folder} of the two tiny models."""
    return {"qwen2": build_tiny(tmp_path_factory.mktemp("qwen2"), "qwen2", seed=1, hidden=HIDDEN),
            "llama": build_tiny(tmp_path_factory.mktemp("llama"), "llama", seed=0, hidden=HIDDEN)}


@pytest.fixture(scope="module")
def engines(models):
    """One VLLMBackend per model, its engine started at first use and stopped with the module."""
    made: dict[str, VLLMBackend] = {}

    def get(arch: str) -> VLLMBackend:
        if arch not in made:
            made[arch] = VLLMBackend(load_model(models[arch], device="cpu", weights=False), token_budget=4096)
        return made[arch]

    yield get
    for be in made.values():
        be.close()


@pytest.fixture(scope="module")
def hf(models):
    return lambda arch: HFBackend(load_model(models[arch], device="cpu"))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_scores_agree_with_hf_per_token(arch, engines, hf):
    be = engines(arch)
    vl_rows = be.score(SCORE_PAIRS, max_length=MAX_LENGTH)
    hf_rows = hf(arch).score(SCORE_PAIRS, max_length=MAX_LENGTH)
    assert len(vl_rows) == len(hf_rows) == len(SCORE_PAIRS)
    assert hf_rows[-1]["truncated"] is True and sum(r["truncated"] for r in hf_rows) == 1
    per_token = []
    for v, h in zip(vl_rows, hf_rows):
        assert v["n_tokens"] == h["n_tokens"] > 0 and v["truncated"] is h["truncated"]
        assert v["first_tokens"] == h["first_tokens"]
        n = v["n_tokens"]
        per_token += [abs(v["logprob_mean"] - h["logprob_mean"]), abs(v["logprob_sum"] - h["logprob_sum"]) / n]
        assert abs(v["rank_mean"] - h["rank_mean"]) * n <= 2  # at most two near-tied ranks swapped
    assert max(per_token) <= 1e-4, max(per_token)
    # the same engine, a backend leaving each response's first two tokens out
    skipped = VLLMBackend(be.lm, engine=be.engine, skip_tokens=2).score(SCORE_PAIRS[:8], max_length=MAX_LENGTH)
    hf_skipped = HFBackend(hf(arch).lm, skip_tokens=2).score(SCORE_PAIRS[:8], max_length=MAX_LENGTH)
    for v, h in zip(skipped, hf_skipped):
        assert v["n_scored"] == h["n_scored"] and abs(v["logprob_sum"] - h["logprob_sum"]) <= 1e-4 * max(1, v["n_scored"])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_generation_is_the_hf_text(arch, engines, hf):
    vl = engines(arch).generate(PROMPTS, max_new_tokens=24, details=True)
    ref = hf(arch).generate(PROMPTS, max_new_tokens=24, details=True)
    assert [[c["text"] for c in g] for g in vl] == [[c["text"] for c in g] for g in ref]
    assert vl == ref  # token counts and finish flags too
    assert any(c["n_tokens"] > 3 for g in vl for c in g)


def test_the_backend_chooses_cpu_settings(engines, models, monkeypatch):
    if not on_cpu_build():
        pytest.skip("CPU-build settings")
    be = engines("qwen2")
    be.engine  # started with the settings it chose
    assert be.chosen["platform"]["value"] == "cpu"
    assert be.chosen["gpu_memory_utilization"] == {"value": 0.2, "source": "default of vLLM's CPU build (a share of "
                                                                            "system memory)"}
    assert be.chosen[KV_ENV]["value"] == "1 GiB" and os.environ[KV_ENV] == "1"
    assert Path(be.chosen["vllm_log"]["value"]).stat().st_size > 0  # vLLM's messages went there
    lm = be.lm
    # a share the user gives is passed on, and vLLM then sizes its cache from it
    given = VLLMBackend(lm, gpu_memory_utilization=0.3)
    assert given._engine_args["gpu_memory_utilization"] == 0.3 and given.chosen[KV_ENV]["value"] is None
    monkeypatch.setenv(KV_ENV, "3")  # the user's cache size wins
    assert VLLMBackend(lm).chosen[KV_ENV] == {"value": "3 GiB", "source": f"{KV_ENV} (yours)"}


def test_head_size_failure_at_the_first_request_is_explained(tmp_path, monkeypatch):
    """Without the backend's own check, vLLM's CPU engine starts on a head size it lacks and dies
    at the first request; the user still gets one line saying so, read from vLLM's log."""
    if not on_cpu_build():
        pytest.skip("CPU attention")
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    model = build_tiny(tmp_path / "h8", "llama", hidden=32)  # head size 8
    pool = addition_pool(tmp_path / "pool.jsonl", 3, lambda a, b, i: [f"{a} + {b} = {a + b}", "it is " + str(a + b)])
    monkeypatch.setattr(vllm_backend, "cpu_head_sizes", lambda: None)  # the backend cannot tell before the engine runs
    r = CliRunner().invoke(cli, ["score", "-m", model, "-p", str(pool), "-o", str(tmp_path / "out"), "--backend", "vllm",
                                 "--json"])
    assert r.exit_code == 2, (r.stderr, r.exception)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "vLLM's CPU attention does not support head size 8" in r.stderr and "--backend hf" in r.stderr
    log = re.search(r"vLLM's log: (\S+)\)", r.stderr)[1]
    assert "Unsupported CPU attention configuration: head_dim=8" in Path(log).read_text()
    assert not (tmp_path / "out").exists()


# ---- the command line, in subprocesses -------------------------------------------------------------

SHARD = 16


def long_generations(a: int, b: int, i: int) -> list[str]:
    rng = random.Random(i)
    return [f"{a} + {b} = {a + b}. " + words(rng, rng.randint(150, 350)) for _ in range(3)]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """400 problems x 3 responses of 150-350 words: 75 shards, several seconds of scoring."""
    return addition_pool(tmp_path_factory.mktemp("pool") / "pool.jsonl", 400, long_generations)


def run_env(home: Path, env: dict | None = None) -> dict:
    """This environment for a subprocess with its own cache home, less what the in-process
    engines here set in it (the backend's settings are the subprocess's own to choose)."""
    inherited = {k: v for k, v in os.environ.items() if k != KV_ENV and not k.startswith("VLLM_LOGGING")}
    return {**inherited, "ADVISOR_HOME": str(home), **(env or {})}


def advisor(*args, home: Path, env: dict | None = None):
    """`advisor ARGS` in a subprocess."""
    return subprocess.run([str(ADVISOR), *map(str, args)], capture_output=True, text=True, env=run_env(home, env))


def score_args(model, pool, out, *extra):
    return ["score", "-m", model, "-p", pool, "-o", out, "--backend", "vllm", "--score-length", 1024,
            "--shard-size", SHARD, "--json", *extra]


@pytest.fixture(scope="module")
def reference(models, pool, tmp_path_factory):
    """One uninterrupted, single-process run: (its stdout and stderr, its scores.jsonl)."""
    base = tmp_path_factory.mktemp("reference")
    r = advisor(*score_args(models["qwen2"], pool, base / "out"), home=base / "home")
    assert r.returncode == 0, r.stderr[-3000:]
    return r, (base / "out" / "scores.jsonl").read_bytes()


def test_json_stdout_holds_only_the_json(reference):
    r, scores = reference
    summary = json.loads(r.stdout)  # the whole of stdout
    assert summary["candidates"] == 1200 and summary["from_cache"] == 0 and summary["truncated"] == 0
    assert summary["chosen"]["platform"]["value"] in ("cpu", "gpu") and summary["chosen"]["vllm_log"]["value"]
    assert len(scores.splitlines()) == 1200
    # vLLM's own lines (INFO ..., WARNING ..., its engine processes' tracebacks) are in its log, not here
    assert not re.search(r"\b(INFO|WARNING|ERROR) \d\d-\d\d ", r.stdout + r.stderr) and "Traceback" not in r.stderr
    log = Path(summary["chosen"]["vllm_log"]["value"]).read_text()
    assert "EngineCore" in log and re.search(r"\bINFO \d\d-\d\d ", log)


def test_data_parallel_ranks_merge_to_the_single_run(models, pool, reference, tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    first = advisor(*score_args(models["qwen2"], pool, out, "--dp-rank", 0, "--dp-size", 2), home=home)
    assert first.returncode == 0, first.stderr[-3000:]
    waiting = json.loads(first.stdout)["waiting_for"]
    assert waiting == list(range(1, 75, 2)) and not out.exists()  # rank 1's shards; rank 0 writes nothing
    last = advisor(*score_args(models["qwen2"], pool, out, "--dp-rank", 1, "--dp-size", 2), home=home)
    assert last.returncode == 0, last.stderr[-3000:]
    summary = json.loads(last.stdout)
    assert "waiting_for" not in summary and summary["candidates"] == 1200
    assert (out / "scores.jsonl").read_bytes() == reference[1]


def test_a_run_killed_with_sigkill_resumes_to_the_same_scores(models, pool, reference, tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    args = score_args(models["qwen2"], pool, out)
    run = subprocess.Popen([str(ADVISOR), *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=run_env(home), start_new_session=True)
    shards = lambda: sorted(home.glob("scores/*/shard-*.jsonl"))  # noqa: E731  (finished shards: written atomically)
    while not shards():
        if run.poll() is not None:
            pytest.fail(f"the run ended before its first shard: {run.stderr.read()[-3000:]}")
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)  # the run and the engine processes it started, as a scheduler would
    run.wait()
    assert run.returncode == -signal.SIGKILL
    done = shards()
    assert 0 < len(done) < 75 and not out.exists(), len(done)
    for _ in range(300):  # let the engine processes go before the rerun starts its own
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    kept = sum(len(p.read_text().splitlines()) for p in done)
    again = advisor(*args, home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert summary["from_cache"] == kept == SHARD * len(done)
    assert (out / "scores.jsonl").read_bytes() == reference[1]


# ---- engines that cannot run the model: one error line each -------------------------------------------

@pytest.fixture
def small_pool(tmp_path):
    return addition_pool(tmp_path / "small.jsonl", 4, lambda a, b, i: [f"{a} + {b} = {a + b}", f"it is {a + b}"])


def test_unsupported_head_size_is_refused_before_the_engine_starts(tmp_path, small_pool):
    if not on_cpu_build():
        pytest.skip("CPU attention")
    model = build_tiny(tmp_path / "h8", "llama", hidden=32)
    line = one_error_line(advisor(*score_args(model, small_pool, tmp_path / "out"), home=tmp_path / "home"),
                          quiet=True)
    assert line.startswith("error: vLLM's CPU attention does not support head size 8 (this model's); it takes 32, 64")
    assert line.endswith("use --backend hf") and not (tmp_path / "out").exists()


def test_an_architecture_vllm_lacks_is_one_line(models, tmp_path, small_pool):
    import shutil

    model = tmp_path / "renamed"
    shutil.copytree(models["llama"], model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]  # transformers loads it by model_type; vLLM goes by this
    (model / "config.json").write_text(json.dumps(config))
    line = one_error_line(advisor(*score_args(model, small_pool, tmp_path / "out"), home=tmp_path / "home"),
                          quiet=True)
    assert line.startswith("error: vLLM does not support this model's architecture (NoSuchForCausalLM); use --backend hf")


def test_not_enough_memory_is_one_line(models, tmp_path, small_pool):
    if not on_cpu_build():
        pytest.skip("the CPU build's KV cache")
    r = advisor(*score_args(models["llama"], small_pool, tmp_path / "out"), home=tmp_path / "home",
                env={KV_ENV: "100000"})  # 100,000 GiB of KV cache
    line = one_error_line(r, quiet=True)
    assert line.startswith("error: vLLM could not get the memory it needs (") and f"{KV_ENV} GiB" in line
    assert "(100000 GiB here)" in line and "--backend hf" in line and "vLLM's log: " in line


def test_damaged_weights_are_one_line_naming_the_failure(models, tmp_path, small_pool):
    import shutil

    model = tmp_path / "damaged"
    shutil.copytree(models["llama"], model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # a download cut short
    line = one_error_line(advisor(*score_args(model, small_pool, tmp_path / "out"), home=tmp_path / "home"),
                          quiet=True)
    assert line.startswith(f"error: vLLM's engine could not start on {model}: ")
    assert "use --backend hf to run without vLLM (vLLM's log: " in line
    name = re.match(r"error: vLLM's engine could not start on \S+: (\w+): ", line)
    assert name and name[1].endswith(("Error", "Exception")), line
