"""FSDP on CPU processes over gloo: what `advisor train` does with the documented FSDP config, and
the closest path that shards (tests/fsdp_worker.py). docs/training.md, "FSDP on CPU"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import HANG_S, ROOT, frozen_at, kill_when_frozen, make_manifest

ADVISOR = str(Path(sys.executable).parent / "advisor")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.slow  # two torchrun processes and one plain one
def test_fsdp_shards_over_two_cpu_processes_and_trains_and_evaluates_as_one_process(tmp_path, tiny_llama):
    path = make_manifest(tmp_path / "rec", tiny_llama)
    worker = str(ROOT / "tests" / "fsdp_worker.py")
    one = subprocess.run([sys.executable, worker, str(path), str(tmp_path / "one")], env=ENV,
                         capture_output=True, text=True, timeout=HANG_S)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          worker, str(path), str(tmp_path / "two")], env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("one", "two"))
    assert b["fsdp"] and b["world"] == 2
    assert b["full_params"] == a["full_params"] and b["local_params"] <= 0.55 * b["full_params"]  # sharded, not copied
    assert len(a["losses"]) == len(b["losses"]) == 8
    assert b["losses"] == pytest.approx(a["losses"], rel=1e-5)
    assert a["losses"][-1] < a["losses"][0]  # it learns
    assert max_diff(weights(tmp_path / "one" / "model.safetensors"), weights(tmp_path / "two" / "model.safetensors")) < 1e-5
    # the project's evaluation under FSDP: generations sharded over the ranks, the full-parameter
    # view entered by every rank, rank 0 measuring (answer log-likelihood scored by the student)
    ra, rb = (json.loads((tmp_path / d / "eval.jsonl").read_text().splitlines()[-1]) for d in ("one", "two"))
    assert ra["examples"] == rb["examples"] and ra["eval_tokens"] == rb["eval_tokens"] > 0
    for k in ("accuracy", "answer_rate", "repetition_rate", "mean_chars"):
        assert rb[k] == ra[k]
    assert rb["answer_logprob"] == pytest.approx(ra["answer_logprob"], abs=1e-4)


def cpu_config(tmp_path: Path, **top) -> Path:
    """configs/accelerate_fsdp.yaml with the two settings FSDP refuses on CPU processes turned off,
    on a port accelerate finds free as it launches (main_process_port 0: the config's static
    rendezvous would take 29500, which another run, or one killed just before, may hold)."""
    cfg = yaml.safe_load((ROOT / "configs" / "accelerate_fsdp.yaml").read_text())
    cfg["fsdp_config"].update(fsdp_sync_module_states=False, fsdp_cpu_ram_efficient_loading=False)
    cfg.update(main_process_port=0, **top)
    out = tmp_path / f"fsdp-cpu-{'-'.join(f'{k}-{v}' for k, v in sorted(top.items())) or 'as-documented'}.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_the_shipped_fsdp_config_on_cpu_is_one_error_line_before_anything_runs(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the check is for machines without CUDA")
    path = make_manifest(tmp_path / "rec", "lab:s")
    run = tmp_path / "run"
    p = subprocess.run([ADVISOR, "train", str(path), "--out", str(run), "--nproc", "2", "--launcher", "accelerate",
                        "--accelerate-config", str(ROOT / "configs" / "accelerate_fsdp.yaml")],
                       env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "fsdp_sync_module_states: true" in lines[0]
    assert "Traceback" not in p.stderr and not run.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: [FSDP\n")
    p = subprocess.run([ADVISOR, "train", str(path), "--out", str(run), "--nproc", "2", "--launcher", "accelerate",
                        "--accelerate-config", str(bad)], env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 2 and p.stderr.startswith("error: --accelerate-config") and "YAML" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not run.exists()


@pytest.mark.slow  # accelerate launch with two processes, killed and resumed, and a one-process run
def test_the_documented_fsdp_config_on_cpu_trains_data_parallel_and_resumes_after_kill_9(tmp_path, tiny_llama):
    from capacity_advisor.training.sft import run_sft

    path = make_manifest(tmp_path / "rec", tiny_llama, epochs=12)  # 48 steps, a checkpoint at each
    run, store = tmp_path / "run", tmp_path / "records.jsonl"
    # fp32 to compare with one fp32 process (the config's bf16 applies on CPU too: the record says so)
    cmd = [ADVISOR, "train", str(path), "--out", str(run), "--records", str(store), "--nproc", "2",
           "--launcher", "accelerate", "--accelerate-config", str(cpu_config(tmp_path, mixed_precision="no"))]
    # killed (the CLI, accelerate's launcher and both workers) right after rank 0 has said checkpoint 5
    # is whole (advisor_saved.json), before its evaluation, wherever the machine's load puts that
    # moment: both processes resume from it and evaluate step 5 first
    env, flag = frozen_at(tmp_path / "freeze", re.escape(str(run / "checkpoint-5" / "advisor_saved.json")), ENV)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    kill_when_frozen(p, flag)
    assert not (run / "record.json").exists() and not store.exists()

    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runs an FSDP config on CPU processes as DDP" in done.stderr
    record = json.loads((run / "record.json").read_text())
    s = record["settings"]
    assert s["processes"] == 2 and s["per_device_batch"] == 2 and s["bf16"] is False
    # accelerate enables FSDP for GPU processes only; if this turns "fsdp", docs/training.md is out of date
    assert s["sharding"] == "ddp"
    assert record["provenance"]["resumed_from_step"] == 5
    assert [e["step"] for e in record["evals"]] == list(range(49))
    assert len(store.read_text().splitlines()) == 1

    one = run_sft(path, tmp_path / "one", records=str(tmp_path / "one.jsonl"), threads=1)
    assert one["settings"]["sharding"] is None
    for a, b in zip(one["evals"][1:], record["evals"][1:]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4), a["step"]
    assert max_diff(weights(tmp_path / "one" / "checkpoint-48" / "model.safetensors"),
                    weights(run / "checkpoint-48" / "model.safetensors")) < 1e-5

    # the config as documented (bf16) on CPU: accelerate applies it over the fp32 chosen for a CPU
    # run, and the record says what was used
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    p = subprocess.run([ADVISOR, "train", str(path), "--out", str(bf16 / "run"), "--records", str(bf16 / "r.jsonl"),
                        "--nproc", "2", "--max-steps", "2", "--launcher", "accelerate",
                        "--accelerate-config", str(cpu_config(bf16))], env=ENV, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((bf16 / "run" / "record.json").read_text())["settings"]["bf16"] is True
