"""The vllm backend without vllm: a stand-in engine keeps vLLM's API contract (tests/fake_vllm.py).

Checked here: the clear errors when vllm or a GPU is missing; that scoring asks vLLM for exactly
the prompt log-probs it needs, aligns them with the response tokens under both prompt renderings
(plain and chat template), and returns the hf backend's rows and numbers; that generation returns
the hf backend's layout; and data-parallel scoring over ranks.
"""

import json
import sys

import pytest
from click.testing import CliRunner

from capacity_advisor.advisor.cli.main import cli
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.hf import HFBackend
from capacity_advisor.models.loading import load_model
import fake_vllm
from helpers import PAIRS, one_error_line, doubling_pool


@pytest.fixture
def fake(monkeypatch):
    return fake_vllm.install(monkeypatch)


@pytest.fixture(params=["tiny_llama", "tiny_qwen"])
def model_path(request):
    return request.getfixturevalue(request.param)


def test_missing_vllm_is_one_clear_error(tiny_llama, monkeypatch):
    from capacity_advisor.models.vllm import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(InputError, match="needs the vllm package.*--backend hf"):
        VLLMBackend(load_model(tiny_llama, device="cpu", weights=False))


def test_missing_gpu_is_one_clear_error(tiny_llama, fake, monkeypatch):
    import torch

    from capacity_advisor.models.vllm import VLLMBackend

    monkeypatch.delenv("ADVISOR_VLLM_ALLOW_CPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="needs a CUDA GPU"):
        VLLMBackend(load_model(tiny_llama, device="cpu", weights=False))


def test_cli_without_vllm_exits_2_and_writes_nothing(tiny_llama, tmp_path, monkeypatch):

    monkeypatch.setitem(sys.modules, "vllm", None)
    pool = doubling_pool(tmp_path / "pool.jsonl")
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(pool), "-o", str(tmp_path / "out"), "--backend", "vllm"])
    assert r.exit_code == 2
    assert r.output.count("error:") == 1 and "vllm" in r.output
    assert not (tmp_path / "out").exists()


def test_scores_match_hf_backend(model_path, fake):
    from capacity_advisor.models.vllm import VLLMBackend

    hf_rows = HFBackend(load_model(model_path, device="cpu")).score(PAIRS)
    lm = load_model(model_path, device="cpu", weights=False)
    assert lm.model.device.type == "meta"  # vllm loads the weights itself
    be = VLLMBackend(lm, tensor_parallel_size=2, token_budget=4096)
    rows = be.score(PAIRS)
    assert len(rows) == len(PAIRS)
    for a, b in zip(rows, hf_rows):
        assert set(a) == set(b) == {"n_tokens", "n_scored", "logprob_sum", "logprob_mean", "rank_mean", "first_tokens",
                                    "truncated"}
        assert a["n_tokens"] == b["n_tokens"] > 0
        assert a["truncated"] is b["truncated"] is False
        assert abs(a["logprob_sum"] - b["logprob_sum"]) < 1e-4 * max(1, a["n_tokens"])
        assert abs(a["logprob_mean"] - b["logprob_mean"]) < 1e-4
        assert a["rank_mean"] == pytest.approx(b["rank_mean"]) and a["first_tokens"] == b["first_tokens"]
    skipped = VLLMBackend(lm, token_budget=4096, skip_tokens=2).score(PAIRS)
    hf_skipped = HFBackend(load_model(model_path, device="cpu"), skip_tokens=2).score(PAIRS)
    for a, b in zip(skipped, hf_skipped):
        assert a["n_scored"] == b["n_scored"] == max(0, a["n_tokens"] - 2) and abs(a["logprob_sum"] - b["logprob_sum"]) < 1e-3
    engine = fake_vllm.ENGINES[0]
    assert engine.args["tensor_parallel_size"] == 2 and engine.args["max_num_batched_tokens"] == 4096
    assert engine.args["model"] == model_path and engine.args["dtype"] == "float32"
    probe, call = fake_vllm.CALLS[:2]  # the engine's start-up request, then the scoring
    assert probe["n_prompts"] == 1 and probe["params"][0].max_tokens == 1
    assert call["n_prompts"] == len(PAIRS)
    for sp in call["params"]:  # only the prompt's own log-probs, nothing decoded, one dummy token
        assert sp.prompt_logprobs == 0 and sp.detokenize is False and sp.max_tokens == 1


def test_truncated_pairs_score_the_kept_tokens(tiny_llama, fake):
    from capacity_advisor.models.vllm import VLLMBackend

    prompt, response = PAIRS[1]
    hf = HFBackend(load_model(tiny_llama, device="cpu")).score([(prompt, response)], max_length=20)[0]
    vl = VLLMBackend(load_model(tiny_llama, device="cpu", weights=False)).score([(prompt, response)], max_length=20)[0]
    assert vl["truncated"] is True and vl["n_tokens"] == hf["n_tokens"]
    assert abs(vl["logprob_sum"] - hf["logprob_sum"]) < 1e-4


def test_misaligned_engine_output_is_caught():
    from capacity_advisor.models.template import Encoded
    from capacity_advisor.models.vllm import response_logprobs

    e = Encoded([1, 5, 6, 7], 2, False)
    good = [None, {5: fake_vllm.Logprob(-1.0)}, {6: fake_vllm.Logprob(-2.0, 3)}, {7: -0.5}]
    vals = response_logprobs(e, good)
    assert [v[0] for v in vals] == [-2.0, -0.5] and vals[0][1] == 3.0 and vals[1][1] != vals[1][1]  # no rank: NaN
    with pytest.raises(RuntimeError, match="3 prompt log-probs for 4 tokens"):
        response_logprobs(e, good[:3])
    with pytest.raises(RuntimeError, match="no prompt log-probs"):
        response_logprobs(e, None)


def test_generation_layout_matches_hf(model_path, fake):
    from capacity_advisor.models.vllm import VLLMBackend

    prompts = ["what is 12 + 35?", "Let us think"]
    hf = HFBackend(load_model(model_path, device="cpu"))
    vl = VLLMBackend(load_model(model_path, device="cpu", weights=False))
    greedy_hf = hf.generate(prompts, max_new_tokens=6, details=True)
    greedy_vl = vl.generate(prompts, max_new_tokens=6, details=True)
    assert greedy_vl == greedy_hf  # same model, same rendering, greedy: the same tokens and flags
    assert hf.generate(prompts, max_new_tokens=6) == vl.generate(prompts, max_new_tokens=6) == [[c["text"]] for c in
                                                                                            [g[0] for g in greedy_hf]]
    sampled = vl.generate(prompts, max_new_tokens=5, temperature=1.0, n=3, seed=7, details=True)
    assert [len(s) for s in sampled] == [3, 3]
    assert all(set(c) == {"text", "n_tokens", "finished"} and 1 <= c["n_tokens"] <= 5 for s in sampled for c in s)
    again = vl.generate(prompts[:1], max_new_tokens=5, temperature=1.0, n=3, seed=7, details=True)
    assert again[0] == sampled[0]  # a request's seed depends on its position, not on what else is batched
    sp = fake_vllm.CALLS[-1]["params"][0]
    assert sp.n == 3 and sp.temperature == 1.0 and sp.max_tokens == 5 and sp.seed == 7
    with pytest.raises(InputError, match="temperature"):
        vl.generate(prompts, n=2, temperature=0.0)


def test_cli_score_with_vllm_backend(tiny_qwen, fake, tmp_path):

    pool = doubling_pool(tmp_path / "pool.jsonl")
    runner = CliRunner()
    r = runner.invoke(cli, ["score", "-m", tiny_qwen, "-p", str(pool), "-o", str(tmp_path / "v"), "--backend", "vllm",
                            "--tensor-parallel-size", "2", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    r2 = runner.invoke(cli, ["score", "-m", tiny_qwen, "-p", str(pool), "-o", str(tmp_path / "h"), "--device", "cpu", "--json"])
    assert r2.exit_code == 0, r2.output
    v = [json.loads(x) for x in (tmp_path / "v" / "scores.jsonl").read_text().splitlines()]
    h = [json.loads(x) for x in (tmp_path / "h" / "scores.jsonl").read_text().splitlines()]
    assert [(a["id"], a["k"], a["n_tokens"]) for a in v] == [(b["id"], b["k"], b["n_tokens"]) for b in h]
    assert max(abs(a["logprob_mean"] - b["logprob_mean"]) for a, b in zip(v, h)) < 1e-4
    cfg_v = json.loads((tmp_path / "v" / "config.json").read_text())
    cfg_h = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg_v["settings"]["backend"] == "vllm" and cfg_v["cache_key"] != cfg_h["cache_key"]


def test_tensor_parallel_needs_vllm(tiny_llama, tmp_path):

    pool = doubling_pool(tmp_path / "pool.jsonl")
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(pool), "-o", str(tmp_path / "o"),
                                 "--tensor-parallel-size", "2"])
    assert r.exit_code == 2 and "applies to --backend vllm only" in r.output


def test_data_parallel_ranks_write_the_single_process_file(tiny_llama, tmp_path, monkeypatch):

    pool = read_pool(doubling_pool(tmp_path / "pool.jsonl"))
    lm = load_model(tiny_llama, device="cpu")
    single = score_pool(pool, ScoreConfig(tiny_llama, device="cpu", shard_size=5), tmp_path / "single", lm=lm)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "dp-home"))  # a cold cache shared by the ranks
    first = score_pool(pool, ScoreConfig(tiny_llama, device="cpu", shard_size=5, dp_rank=0, dp_size=2), tmp_path / "dp", lm=lm)
    assert first["waiting_for"] and all(i % 2 == 1 for i in first["waiting_for"])
    assert not (tmp_path / "dp").exists()
    last = score_pool(pool, ScoreConfig(tiny_llama, device="cpu", shard_size=5, dp_rank=1, dp_size=2), tmp_path / "dp", lm=lm)
    assert "waiting_for" not in last and last["from_cache"] == 0
    assert (tmp_path / "dp" / "scores.jsonl").read_bytes() == (tmp_path / "single" / "scores.jsonl").read_bytes()
    assert single["key"] == last["key"]


def test_gpu_check_script_runs_end_to_end_on_the_stand_in(tmp_path, fake, monkeypatch):
    """benchmarks.gpu_check is for GPU machines; here its whole path runs on the CPU stand-in."""
    import benchmarks.gpu_check.run as gpu_check

    res = gpu_check.main(["--device", "cpu", "--vocab", "2048", "--hidden", "64", "--layers", "1", "--pairs", "8",
                          "--min-response", "8", "--max-response", "24", "--long-tokens", "200", "--gen-prompts", "2",
                          "--gen-n", "2", "--gen-tokens", "4", "--students", "none", "--out", str(tmp_path / "r.json")])
    assert res["agreement"]["within_bf16_tolerance"] is True  # fp32 on both sides here
    assert res["agreement"]["max_abs_diff_mean_vllm_vs_hf_bf16"] < 1e-4
    assert res["scoring"]["hf_tokens_per_s"] > 0 and res["generation"]["vllm_new_tokens"] > 0
    assert res["agreement"]["max_abs_diff_sum_hf_vs_naive"] < 1e-3 and res["scoring"]["hf_over_naive"] > 0
    assert json.loads((tmp_path / "r.json").read_text())["pairs"] == 8


def test_gpu_check_says_what_is_missing(capsys):
    import subprocess
    from pathlib import Path

    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], capture_output=True, text=True,
                       cwd=Path(__file__).parents[2])
    assert r.returncode == 2 and r.stderr.startswith("gpu_check: ") and ("CUDA" in r.stderr or "vllm" in r.stderr)


# ---- the settings the backend picks, and engines that fail (issue 29) -----------------------------------

def test_on_a_gpu_build_nothing_is_chosen_for_the_cpu(tiny_llama, fake):
    import os

    from capacity_advisor.models.vllm import VLLMBackend
    from capacity_advisor.models.vllm_engine import KV_ENV

    be = VLLMBackend(load_model(tiny_llama, device="cpu", weights=False))
    be.score(PAIRS[:1])
    assert fake_vllm.ENGINES[0].args["gpu_memory_utilization"] == 0.9 and KV_ENV not in os.environ
    assert be.chosen["platform"]["value"] == "gpu" and be.chosen["gpu_memory_utilization"]["source"] == "default"
    assert KV_ENV not in be.chosen


@pytest.fixture
def cpu_build(fake, monkeypatch):
    """The stand-in engine, seen as vLLM's CPU build whose attention takes head sizes 8 and 32."""
    from capacity_advisor.models import vllm as backend

    monkeypatch.setattr(backend, "on_cpu_build", lambda: True)
    monkeypatch.setattr(backend, "cpu_head_sizes", lambda: [8, 32])
    return backend


def test_on_the_cpu_build_the_backend_picks_what_starts(tiny_llama, cpu_build, monkeypatch):
    import os

    KV_ENV = cpu_build.KV_ENV
    lm = load_model(tiny_llama, device="cpu", weights=False)
    be = cpu_build.VLLMBackend(lm).start()
    assert fake_vllm.ENGINES[-1].args["gpu_memory_utilization"] == 0.2 and os.environ[KV_ENV] == "1"
    assert be.chosen[KV_ENV]["value"] == "1 GiB" and "room for 1.25 x 4,096 tokens" in be.chosen[KV_ENV]["source"]
    assert be.chosen["gpu_memory_utilization"]["source"].startswith("default of vLLM's CPU build")
    # a share the user gives wins, and vLLM sizes its cache from it: no cache size is set for it
    monkeypatch.delenv(KV_ENV)
    given = cpu_build.VLLMBackend(lm, gpu_memory_utilization=0.5).start()
    assert fake_vllm.ENGINES[-1].args["gpu_memory_utilization"] == 0.5 and KV_ENV not in os.environ
    assert given.chosen["gpu_memory_utilization"]["source"] == "--gpu-memory-utilization"
    monkeypatch.setenv(KV_ENV, "4")  # so does the user's own cache size
    assert cpu_build.VLLMBackend(lm).start().chosen[KV_ENV] == {"value": "4 GiB", "source": f"{KV_ENV} (yours)"}
    assert os.environ[KV_ENV] == "4"
    # the size follows the model: 2 layers x 2 KV heads x 8 x 4 bytes x 2 (K, V) x 4,096 tokens is far below 1 GiB,
    # while a 28-layer model with 2 KV heads of 128 in fp32 and 32,768 positions needs 1.25 x 1.75 GiB
    from types import SimpleNamespace

    big = SimpleNamespace(num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, head_dim=128,
                          max_position_embeddings=32768)
    assert cpu_build.cpu_kv_cache_gib(big, "float32", None)[0] == 3
    assert cpu_build.cpu_kv_cache_gib(big, "bfloat16", 4096)[0] == 1


def test_a_head_size_the_cpu_kernels_lack_is_one_line_before_any_engine(tiny_llama, cpu_build, tmp_path, monkeypatch):

    monkeypatch.setattr(cpu_build, "cpu_head_sizes", lambda: [32, 64])  # the tiny model's heads are 8 wide
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(doubling_pool(tmp_path / "pool.jsonl")), "-o",
                                 str(tmp_path / "out"), "--backend", "vllm"])
    one_error_line(r, "vLLM's CPU attention does not support head size 8 (this model's); it takes 32, 64; "
                            "use --backend hf", tmp_path / "out", quiet=True)
    assert not fake_vllm.ENGINES


# An engine process as vLLM starts them: it inherits this process's stdout and stderr, says something
# on stdout at once, and when told to fail prints a traceback on stderr (multiprocessing does, not a log).
CHILD = r"""
import sys
print("EngineCore pid=1 INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine", flush=True)
if sys.stdin.readline().strip() == "fail":
    print("Process EngineCore:\nTraceback (most recent call last):\n  File 'core.py', line 1, in run_engine_core\n"
          + sys.argv[1] + "\nDuring handling of the above exception, another exception occurred:\n"
          "Traceback (most recent call last):\nRuntimeError: Worker failed, see above", file=sys.stderr, flush=True)
"""


def failing_engine(cause: str | None, when: str):
    """A stand-in LLM whose engine process fails with `cause` (a traceback's last line) at start
    or at the first request, raising what vLLM raises then; with `cause` None it works."""

    class LLM(fake_vllm.LLM):
        def __init__(self, model, **kwargs):
            super().__init__(model, **kwargs)
            self.child = __import__("subprocess").Popen([sys.executable, "-c", CHILD, cause or ""], stdin=-1, text=True)
            if cause is None:
                self.child.communicate("\n")
            elif when == "start":
                self.child.communicate("fail\n")
                raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")

        def generate(self, *args, **kwargs):
            if cause is not None and when == "request":
                self.child.communicate("fail\n")
                raise RuntimeError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
            return super().generate(*args, **kwargs)

    return LLM


ENGINE_FAILURES = [
    ("RuntimeError: Unsupported CPU attention configuration: head_dim=8 isa=1 kv_cache_idx=0", True,
     "vLLM's CPU attention does not support head size 8 (this model's); it takes 8, 32; use --backend hf (vLLM's log: "),
    ("ValueError: Available memory on node 0 (1.2/2.0 GiB) on kv cache allocation is less than requested memory for kv "
     "(100000.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other "
     "processes.", True, "vLLM could not get the memory it needs (Available memory on node 0"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False,
     "vLLM could not get the memory it needs (CUDA out of memory. Tried to allocate 2.00 GiB); lower "
     "--gpu-memory-utilization or --token-budget"),
    ("safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata", False,
     "SafetensorError: Error while deserializing header: incomplete metadata; use --backend hf to run without vLLM"),
]


@pytest.mark.parametrize("when", ["start", "request"])
@pytest.mark.parametrize("cause,cpu,fragment", ENGINE_FAILURES, ids=["head size", "cpu memory", "gpu memory", "unknown"])
def test_an_engine_that_fails_is_one_error_line(tiny_llama, fake, tmp_path, monkeypatch, cause, cpu, fragment, when):
    """Whether it fails as it starts or at its first request, the user reads one line, saying what
    the engine process said, with nothing on stdout; its output is in vLLM's log."""

    from capacity_advisor.models import vllm as backend, vllm_engine

    if cpu:
        for module in (backend, vllm_engine):  # the backend's checks, and the engine's explanation of a failure
            monkeypatch.setattr(module, "on_cpu_build", lambda: True)
            monkeypatch.setattr(module, "cpu_head_sizes", lambda: [8, 32])
    monkeypatch.setattr(fake, "LLM", failing_engine(cause, when))
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(doubling_pool(tmp_path / "pool.jsonl")), "-o",
                                 str(tmp_path / "out"), "--backend", "vllm", "--json"])
    one_error_line(r, fragment, tmp_path / "out", quiet=True)
    if "could not start" in r.stderr:
        assert f"vLLM's engine could not start on {tiny_llama}: " in r.stderr
    log = (tmp_path / "advisor-home" / "logs").glob("vllm-*.log")
    text = "".join(p.read_text() for p in log)
    assert "Initializing a V1 LLM engine" in text and cause in text  # the engine process's own lines, kept


def test_vllm_output_stays_off_stdout_with_json(tiny_llama, fake, tmp_path, monkeypatch):

    monkeypatch.setattr(fake, "LLM", failing_engine(None, "never"))  # an engine process that talks on stdout
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(doubling_pool(tmp_path / "pool.jsonl")), "-o",
                                 str(tmp_path / "out"), "--backend", "vllm", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)  # all of it
    log = summary["chosen"]["vllm_log"]["value"]
    assert "Initializing a V1 LLM engine" in open(log).read() and "Initializing" not in r.stderr


def test_a_bug_is_not_dressed_as_an_engine_failure(tiny_llama, fake, tmp_path, monkeypatch):

    class Broken(fake_vllm.LLM):
        def __init__(self, model, **kwargs):
            raise TypeError("LLM.__init__() got an unexpected keyword argument 'bogus'")

    monkeypatch.setattr(fake, "LLM", Broken)
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(doubling_pool(tmp_path / "pool.jsonl")), "-o",
                                 str(tmp_path / "out"), "--backend", "vllm"])
    assert r.exit_code == 1 and isinstance(r.exception, TypeError)  # a traceback, for whoever fixes it


def test_the_root_cause_is_the_first_traceback_of_the_log():
    from capacity_advisor.models.vllm_engine import root_cause

    log = ("MainProcess pid=1 INFO [a.py:1] ValueError: not in a traceback, so not a cause\n"
           "VllmWorker-0 pid=3 ERROR [m.py:9] WorkerProc hit an exception.\n"
           "VllmWorker-0 pid=3 ERROR [m.py:9] Traceback (most recent call last):\n"
           "VllmWorker-0 pid=3 ERROR [m.py:9]   File \"x.py\", line 2, in f\n"
           "VllmWorker-0 pid=3 ERROR [m.py:9] RuntimeError: Unsupported CPU attention configuration: head_dim=8\n"
           "Traceback (most recent call last):\n"
           "RuntimeError: Worker failed with error 'Unsupported CPU attention configuration', see above\n")
    assert root_cause(log) == ("RuntimeError", "Unsupported CPU attention configuration: head_dim=8")
    assert root_cause("INFO all is well\n") is None
