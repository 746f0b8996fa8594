"""training/: manifest validation, metrics, a tiny SFT run single-process and under torchrun,
kill-and-resume, the CLI and the exports. Tiny random-init models, a few CPU steps each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import HANG_S, ROOT, make_manifest, read_jsonl, write_data, write_jsonl

from capacity_advisor.core.errors import InputError
from capacity_advisor.training import metrics, text_metrics
from capacity_advisor.training.callbacks import eval_schedule
from capacity_advisor.training.manifest import EvalSpec, Manifest, TrainingSpec, load_manifest

RECORD_KEYS = {"version", "run_id", "model", "strategy", "mix", "n_train", "epochs", "features", "pool", "evals",
               "best_accuracy", "final_accuracy", "settings", "provenance", "best_checkpoint"}


# ---- metrics on handmade strings ----------------------------------------------------------
LOOP = "First add 3 and 4 to get 7. Then " + "we add 7 and 7 to get 14. " * 6
CLEAN = ("First add the tens: 10 + 30 = 40. Then the units: 2 + 5 = 7. "
         "Together 40 + 7 = 47, so the final answer is \\boxed{47}.")


def test_repetition_flags_a_loop_not_a_clean_solution():
    assert text_metrics.is_repetitive(LOOP)
    assert not text_metrics.is_repetitive(CLEAN)
    assert not text_metrics.is_repetitive("1111 +3+3+3")  # short legitimate repeats do not count
    assert text_metrics.repetition_rate([LOOP, CLEAN]) == 0.5


def test_final_answer_extraction_and_summary():
    assert metrics.extract_final_answer(CLEAN) == "47"
    assert metrics.extract_final_answer("so \\boxed{\\frac{1}{2}} it is") == "\\frac{1}{2}"
    assert metrics.extract_final_answer("no answer here") is None
    assert metrics.extract_final_answer("|3,7;A7", "lab") == "7"
    s = metrics.generation_metrics([CLEAN, LOOP], ["47", "47"], "math")
    assert s["accuracy"] == 0.5 and s["repetition_rate"] == 0.5 and s["answer_rate"] == 0.5
    assert metrics.generation_metrics([CLEAN], ["47"], "none")["accuracy"] is None


def test_eval_schedule_is_four_per_epoch_and_ends_on_the_last_step():
    assert eval_schedule(8, 16, 4) == [2, 4, 6, 8, 10, 12, 14, 16]
    assert eval_schedule(6, 12, 4) == [2, 3, 5, 6, 8, 9, 11, 12]
    assert eval_schedule(3, 5, 4) == [1, 2, 3, 4, 5]  # fewer steps than evaluations: every step, once


def test_eval_schedule_adds_the_first_step_at_or_past_each_share():
    # one evaluation an epoch of 4 steps, 2 epochs: a race's 30 % and 75 % are steps 3 and 6, not 4 and 8
    assert eval_schedule(4, 8, 1, at=(0.3, 0.75), epochs=2) == [3, 4, 6, 8]
    assert eval_schedule(4, 8, 1, at=(0.5,), epochs=2) == [4, 8]  # already on the schedule: once
    # a budget in steps (max_steps, no epochs): the share is of the steps
    assert eval_schedule(10, 7, 1, every=5, at=(0.2,)) == [2, 5, 7]
    # 2.5 epochs of 3 steps (the Trainer runs 8): 10 % is the first step whose epoch reaches 0.25
    assert eval_schedule(3, 8, 1, at=(0.1,), epochs=2.5) == [1, 3, 6, 8]


# ---- manifests ------------------------------------------------------------------------------
def test_manifest_round_trip_and_relative_paths(tmp_path):
    path = make_manifest(tmp_path / "rec", "lab:s")
    assert "eval_at" not in json.loads(path.read_text())["training"]  # written only when set: run keys as before
    from dataclasses import replace

    empty = load_manifest(path)
    assert replace(empty, training=replace(empty.training, eval_at=[])).to_dict() == empty.to_dict()
    m = load_manifest(path)
    assert m.dataset_path == tmp_path / "rec" / "train.jsonl" and m.training.epochs == 2
    assert m.to_dict() == json.loads(path.read_text())
    assert m.features == {"probe_feature": 1.0}


def test_manifest_names_every_field_to_fix(tmp_path):
    path = make_manifest(tmp_path / "rec", "lab:s")
    d = json.loads(path.read_text())
    d["dataset"] = "missing.jsonl"
    d["training"]["epochs"] = 0
    d["eval"]["checker"] = "regex"
    d["training"]["epochz"] = 3
    path.write_text(json.dumps(d))
    with pytest.raises(InputError) as e:
        load_manifest(path)
    msg = str(e.value)
    assert "\n" not in msg
    for field in ("dataset: file", "training.epochs", "eval.checker", "epochz"):
        assert field in msg


def test_cli_errors_are_one_line(tmp_path):
    from capacity_advisor.advisor.cli.train import train

    path = make_manifest(tmp_path / "rec", "lab:s")
    d = json.loads(path.read_text())
    d["training"]["epochs"] = -1
    path.write_text(json.dumps(d))
    r = CliRunner().invoke(train, [str(path), "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "training.epochs" in r.output and "Traceback" not in r.output
    (tmp_path / "rec" / "train.jsonl").unlink()
    d["training"]["epochs"] = 2
    path.write_text(json.dumps(d))
    r = CliRunner().invoke(train, [str(path), "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "dataset: file" in r.output and len(r.output.strip().splitlines()) == 1


def test_curriculum_dataset_switches_phase():
    from capacity_advisor.training.data import SFTDataset

    rows = [{"prompt": "p", "completion": "H", "phase": "high"}, {"prompt": "p", "completion": "L", "phase": "low"}]
    ds = SFTDataset(rows, switch_epoch=1)
    assert len(ds) == 1 and ds[0]["completion"] == "H"
    ds.epoch = 1
    assert ds[0]["completion"] == "L"
    with pytest.raises(InputError):
        SFTDataset(rows[:1], switch_epoch=1)


# ---- end-to-end runs ------------------------------------------------------------------------
def check_run(run: Path, record: dict, steps_per_epoch: int = 4, epochs: int = 2, limit: int = 2) -> None:
    assert set(record) == RECORD_KEYS
    assert json.loads((run / "record.json").read_text()) == record
    assert (run / "curve.png").stat().st_size < 200_000
    rows = read_jsonl(run / "eval.jsonl")
    steps = [r["step"] for r in rows]
    expected = [0] + eval_schedule(steps_per_epoch, steps_per_epoch * epochs, 4)
    assert steps == expected  # base model + 4 per epoch, no duplicates
    assert [e["step"] for e in record["evals"]] == expected
    for e in record["evals"]:
        assert e["epoch"] == e["step"] / steps_per_epoch
        assert 0 <= e["accuracy"] <= 1 and 0 <= e["repetition_rate"] <= 1 and 0 <= e["answer_rate"] <= 1
    assert record["evals"][-1]["epoch"] == epochs and record["n_train"] == 16 and record["epochs"] == epochs
    assert record["features"] == {"probe_feature": 1.0} and record["pool"] == {"problems": 16}
    assert record["model"]["n_params"] > 0 and record["settings"]["checker_used"] in ("math-verify", "boxed-string-match")
    ckpts = sorted(p.name for p in run.glob("checkpoint-*"))
    assert len(ckpts) == limit and f"checkpoint-{steps_per_epoch * epochs}" in ckpts
    assert all((run / c / "advisor_state.json").exists() for c in ckpts)
    check_best(run, record)


def check_best(run: Path, record: dict) -> None:
    """RUN/best/ holds the model of the best trained evaluation (the earliest on ties), its
    checkpoint was kept from rotation, and the record says which it is."""
    from safetensors.torch import load_file

    top = max((e for e in record["evals"] if e["step"] > 0), key=lambda e: (e["accuracy"], -e["step"]))
    assert record["best_checkpoint"] == {"step": top["step"], "epoch": top["epoch"], "accuracy": top["accuracy"],
                                         "folder": "best"}
    assert record["best_accuracy"] == top["accuracy"]
    best = run / "best"
    assert json.loads((best / "advisor_state.json").read_text())["step"] == top["step"]
    assert (best / "model.safetensors").is_file() and (best / "config.json").is_file()
    assert not any(best.glob("optimizer*")) and not (best / "trainer_state.json").exists()
    kept = run / f"checkpoint-{top['step']}"
    assert kept.is_dir()  # protected from rotation
    a, b = load_file(str(best / "model.safetensors")), load_file(str(kept / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_single_process_run_writes_checkpoints_evals_and_record(tmp_path, tiny_qwen):
    from capacity_advisor.advisor.cli.train import train
    from capacity_advisor.core.files import advisor_home

    path = make_manifest(tmp_path / "rec", tiny_qwen)
    run = tmp_path / "run"
    r = CliRunner().invoke(train, [str(path), "--out", str(run), "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    record = json.loads((run / "record.json").read_text())
    check_run(run, record)
    assert record["settings"]["template"] == "chat" and record["settings"]["processes"] == 1
    n = json.loads((run / "eval.jsonl").read_text().splitlines()[0])["n_eval"]  # each evaluation's generation is told from its start to its end
    for e in record["evals"]:
        assert f"eval step {e['step']}: 0/{n} problems generated" in r.stderr
        assert f"eval step {e['step']}: {n}/{n} problems generated" in r.stderr
    best = record["best_checkpoint"]  # the summary names the folder to load
    assert json.loads(r.stdout)["best_checkpoint"] == {"path": str(run / "best"), "step": best["step"],
                                                       "epoch": best["epoch"], "accuracy": best["accuracy"]}
    store = advisor_home() / "records.jsonl"
    assert [json.loads(x)["run_id"] for x in store.read_text().splitlines()] == [record["run_id"]]
    losses = [e["train_loss"] for e in record["evals"][1:]]
    assert losses[-1] < losses[0]  # it learns
    # a finished run is not trained again, and the store gets no second line
    r = CliRunner().invoke(train, [str(path), "--out", str(run), "--threads", "1"])
    assert r.exit_code == 0 and "already complete" in r.output
    assert len(store.read_text().splitlines()) == 1


class Killed(Exception):
    pass


def test_killed_run_resumes_at_the_last_checkpoint(tmp_path, tiny_llama):
    from transformers import TrainerCallback

    from capacity_advisor.training.sft import run_sft

    class KillAfter(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if state.global_step >= 3:
                raise Killed

    path = make_manifest(tmp_path / "rec", tiny_llama)
    store = tmp_path / "records.jsonl"
    with pytest.raises(Killed):
        run_sft(path, tmp_path / "run", records=str(store), threads=1, callbacks=[KillAfter()])
    run = tmp_path / "run"
    assert not (run / "record.json").exists() and not store.exists()
    # kept: the last checkpoint, and the best evaluation's (protected from rotation for best/)
    rows = read_jsonl(run / "eval.jsonl")
    top = max((r for r in rows if r["step"] > 0), key=lambda r: (r["accuracy"], -r["step"]))
    assert sorted(p.name for p in run.glob("checkpoint-*")) == sorted({f"checkpoint-{top['step']}", "checkpoint-3"}
                                                                   | ({"checkpoint-2"} if top["step"] == 3 else set()))
    # a checkpoint half-written by the kill (no marker) must be ignored and removed
    (run / "checkpoint-4").mkdir()
    (run / "eval.jsonl").open("a").write(json.dumps({"step": 4, "epoch": 1.0}) + "\n")
    record = run_sft(path, run, records=str(store), threads=1)
    assert record["provenance"]["resumed_from_step"] == 3
    check_run(run, record)
    full = run_sft(path, tmp_path / "full", records=str(store), threads=1)
    assert full["provenance"]["resumed_from_step"] is None
    # the tokens trained count the whole run, the part before the kill included (kept in the checkpoint)
    assert record["provenance"]["train_tokens"] == full["provenance"]["train_tokens"] > 0
    # what should be identical is: provenance (wall time, resume point, paths) is kept apart
    same = lambda r: {k: v for k, v in r.items() if k not in ("provenance", "evals")}  # noqa: E731
    assert same(record) == same(full) and record["run_id"] == full["run_id"]
    assert [e["step"] for e in full["evals"]] == [e["step"] for e in record["evals"]]
    # same data order and optimizer state after the resume: the same losses
    for a, b in zip(full["evals"][2:], record["evals"][2:]):
        if a["step"] > 4:
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert len(store.read_text().splitlines()) == 2


def test_a_run_killed_during_an_evaluation_resumes_from_that_checkpoint_and_evaluates_it(tmp_path, tiny_llama):
    """The Trainer's rotation deletes the checkpoint before as soon as the new one is saved, before
    its evaluation (minutes on a real model): a kill there once left no resumable checkpoint, and
    the run started over. It resumes from the unmarked one and ends as the uninterrupted run."""
    from capacity_advisor.training.callbacks import MARKER
    from capacity_advisor.training.sft import run_sft

    def kill_in_evaluation(step, done, total):
        if step == 3 and done > 0:
            raise Killed

    path = make_manifest(tmp_path / "rec", tiny_llama, save_total_limit=1)  # as calibration runs keep them
    store = tmp_path / "records.jsonl"
    run = tmp_path / "run"
    with pytest.raises(Killed):
        run_sft(path, run, records=str(store), threads=1, keep_best=False, eval_progress=kill_in_evaluation)
    assert [p.name for p in run.glob("checkpoint-*")] == ["checkpoint-3"] and not (run / "checkpoint-3" / MARKER).exists()
    assert max(r["step"] for r in read_jsonl(run / "eval.jsonl")) == 2
    # a race's paused segment (one evaluation a call) that resumes there makes that evaluation and stops
    assert run_sft(path, run, records=str(store), threads=1, keep_best=False, pause_after_evals=1) == {"paused_at_step": 3}
    assert (run / "checkpoint-3" / MARKER).exists() and max(r["step"] for r in read_jsonl(run / "eval.jsonl")) == 3
    (run / "checkpoint-3" / MARKER).unlink()  # as if killed again after that evaluation: resumed, not redone
    record = run_sft(path, run, records=str(store), threads=1, keep_best=False)
    assert record["provenance"]["resumed_from_step"] == 3
    full = run_sft(path, tmp_path / "full", records=str(store), threads=1, keep_best=False)
    keys = ("step", "epoch", "accuracy", "train_loss", "learning_rate", "answer_rate", "mean_chars", "answer_logprob")
    resumed, whole = read_jsonl(run / "eval.jsonl"), read_jsonl(tmp_path / "full" / "eval.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole] and resumed[3]["step"] == 3
    for a, b in zip(resumed, whole):
        for k in keys:
            assert (a[k] is None and b[k] is None) or a[k] == pytest.approx(b[k], rel=1e-4), (a["step"], k)
    assert resumed[3]["train_loss"] is not None and resumed[3]["learning_rate"] is not None


def test_another_manifest_in_the_same_run_folder_is_refused(tmp_path, tiny_llama):
    from capacity_advisor.training.sft import run_sft

    path = make_manifest(tmp_path / "rec", tiny_llama, epochs=1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"run_key": "something-else"}))
    with pytest.raises(InputError, match="another manifest"):
        run_sft(path, tmp_path / "run", records=str(tmp_path / "r.jsonl"), threads=1)


@pytest.mark.slow  # two torchrun processes
def test_torchrun_two_processes_on_cpu(tmp_path, tiny_llama):
    path = make_manifest(tmp_path / "rec", tiny_llama)
    run, store = tmp_path / "run", tmp_path / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "capacity_advisor.training.sft", "--manifest", str(path), "--out", str(run), "--records", str(store)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-3000:]
    record = json.loads((run / "record.json").read_text())
    check_run(run, record)
    s = record["settings"]
    assert s["processes"] == 2 and s["per_device_batch"] == 2
    assert len(store.read_text().splitlines()) == 1
    assert p.stderr.count("done: best accuracy") == 1  # one process reports
    assert (run / "checkpoint-8" / "rng_state_1.pth").exists()


TEARDOWN = """
import os, sys
import torch
import torch.distributed as dist
from capacity_advisor.training.callbacks import end_process_group, gather_to_main

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
holder = {"model": model}
holder["self"] = holder  # a cycle holds the wrapped model, and through it the group, as the Trainer's callbacks do
del model, holder
for _ in range(3):
    gather_to_main({"rank": dist.get_rank()})  # collectives that hold Python tensors
dist.barrier()
end_process_group()
names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.txt"), "w") as f:
    f.write(f"{dist.is_initialized()} {' '.join(names)}")
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc")
def test_a_process_that_trained_under_torchrun_ends_its_process_group_before_the_interpreter_does(tmp_path):
    """gloo's worker threads drop their last collective after the caller has returned from it, and
    that collective holds Python tensors: a thread still running at the interpreter's exit aborts the
    process ("terminate called without an active exception", rank 1 of a finished run dead of
    SIGABRT). end_process_group, the last call of `python -m capacity_advisor.training.sft`, joins
    them: none is left once it returns, even while a cycle holds the wrapped model."""
    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-3000:]
    for rank in (0, 1):
        left = (tmp_path / f"rank-{rank}.txt").read_text()
        assert left.startswith("False ") and "gloo" not in left, left  # the group gone, its threads joined


def test_nproc_builds_the_launch_command(tmp_path):
    from capacity_advisor.advisor.cli.train import train

    path = make_manifest(tmp_path / "rec", "lab:s")
    r = CliRunner().invoke(train, [str(path), "--out", str(tmp_path / "run"), "--nproc", "4", "--dry-run"])
    assert r.exit_code == 0
    assert f"torchrun --standalone --nproc_per_node 4 -m capacity_advisor.training.sft --manifest {path} --out {tmp_path / 'run'}" in r.output
    from capacity_advisor.training.launch import launch_command, shown

    cmd = launch_command(str(path), "RUN", 8, "accelerate", str(ROOT / "configs" / "accelerate_fsdp.yaml"))
    assert shown(cmd).startswith("accelerate launch --num_processes 8 --config_file")
    assert (ROOT / "configs" / "accelerate_fsdp.yaml").exists() and (ROOT / "configs" / "accelerate_ddp.yaml").exists()
    # without GPUs accelerate starts gloo processes too (tests/unit/test_fsdp.py runs them)
    assert "--multi_gpu" in launch_command(str(path), "RUN", 2, "accelerate", cuda=False)
    with pytest.raises(InputError, match="fsdp_sync_module_states: true"):
        launch_command(str(path), "RUN", 2, "accelerate", str(ROOT / "configs" / "accelerate_fsdp.yaml"), cuda=False)


def test_exports_for_trl_llamafactory_axolotl(tmp_path, tiny_qwen, tiny_llama):
    import yaml

    from capacity_advisor.advisor.cli.train import train

    path = make_manifest(tmp_path / "rec", tiny_qwen)
    out = tmp_path / "export"
    r = CliRunner().invoke(train, [str(path), "--export", str(out)])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out / "train.jsonl")
    assert len(rows) == 16 and set(rows[0]) == {"prompt", "completion"}
    chat = json.loads((out / "train_chat.jsonl").read_text().splitlines()[0])
    assert chat == {"prompt": [{"role": "user", "content": rows[0]["prompt"]}],
                    "completion": [{"role": "assistant", "content": rows[0]["completion"]}]}
    lf = yaml.safe_load((out / "llamafactory_sft.yaml").read_text())
    assert lf["stage"] == "sft" and lf["num_train_epochs"] == 2.0 and lf["dataset"] == "capacity_advisor"
    assert lf["template"] == "qwen" and lf["default_system"] == "" and lf["bf16"] is False  # ChatML, no system turn
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["capacity_advisor"] == {"file_name": "train.jsonl", "columns": {"prompt": "prompt", "response": "completion"}}
    ax = yaml.safe_load((out / "axolotl_sft.yaml").read_text())
    assert ax["train_on_inputs"] is False and ax["saves_per_epoch"] == 4 and ax["chat_template"] == "tokenizer_default"
    assert ax["bf16"] == "auto" and ax["fp16"] is False

    # A student without a chat template: LLaMA-Factory's empty template, BOS and EOS carried in the rows.
    path = make_manifest(tmp_path / "plain", tiny_llama)
    r = CliRunner().invoke(train, [str(path), "--export", str(tmp_path / "plain-export"), "--format", "llamafactory"])
    assert r.exit_code == 0, r.output
    lf = yaml.safe_load((tmp_path / "plain-export" / "llamafactory_sft.yaml").read_text())
    assert lf["template"] == "empty" and "default_system" not in lf
    row = json.loads((tmp_path / "plain-export" / "train_llamafactory.jsonl").read_text().splitlines()[0])
    assert row == {"prompt": "<s>" + rows[0]["prompt"], "completion": rows[0]["completion"] + "</s>"}


def test_llamafactory_template_is_named_after_the_students_chat_template(tiny_qwen):
    from transformers import AutoTokenizer

    from capacity_advisor.training.export_student import Student, llamafactory_template

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    turns = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tok.chat_template = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}"
                         + turns + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert llamafactory_template(Student("m", tok, "qwen2", True))[:2] == ("qwen", "Be brief.")
    assert llamafactory_template(Student("m", tok, "olmo2", True))[:2] == ("chatml", "Be brief.")
    tok.chat_template = "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{% endfor %}"
    assert llamafactory_template(Student("m", tok, "llama", True))[:2] == ("llama3", None)
    tok.chat_template = "{% for m in messages %}<｜User｜>{{ m['content'] }}<｜Assistant｜><think>\n{% endfor %}"
    assert llamafactory_template(Student("m", tok, "qwen2", True))[0] == "deepseekr1"  # R1's distilled Qwen
    tok.chat_template = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    name, _, why = llamafactory_template(Student("m", tok, "llama", True))
    assert name is None and "parses the tokenizer's own" in why
    assert llamafactory_template(Student("org/m", None, "qwen3", True))[0] == "qwen3"  # tokenizer not readable here
    name, _, why = llamafactory_template(Student("org/m", None, "rwkv", True))
    assert name is None and "could not be read" in why


@pytest.mark.parametrize("arch", ["llama", "qwen"])
def test_trl_export_trains_the_pairs_as_they_were_scored(tmp_path, arch, request, monkeypatch):
    """The exported script, run as `python trl_sft.py --max_steps 2`, trains on the scored tokens."""
    import math
    import runpy

    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from capacity_advisor.models.template import encode_pair
    from capacity_advisor.training.data import read_sft_rows
    from capacity_advisor.training.export import export

    model = request.getfixturevalue(f"tiny_{arch}")
    m = load_manifest(make_manifest(tmp_path / "rec", model))
    script = next(p for p in export(m, tmp_path / "export", ("trl",)) if p.name == "trl_sft.py")
    trainers = []
    real_train = SFTTrainer.train

    def spy(self, *args, **kwargs):
        trainers.append(self)
        return real_train(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "train", spy)
    monkeypatch.setattr(sys, "argv", ["trl_sft.py", "--max_steps", "2", "--output_dir", str(tmp_path / "run"),
                                      "--save_strategy", "no"])
    runpy.run_path(str(script), run_name="__main__")
    (trainer,) = trainers
    assert trainer.state.global_step == 2 and math.isfinite(trainer.state.log_history[-1]["train_loss"])

    tok = AutoTokenizer.from_pretrained(model)
    tail = "\n" if arch == "qwen" else ""  # what the chat template writes after its end-of-turn token
    rows = read_sft_rows(m.dataset_path)
    assert len(trainer.train_dataset) == len(rows)
    for r, ex in zip(rows, trainer.train_dataset):
        scored = encode_pair(tok, r["prompt"], r["completion"], m.training.max_length)
        ids, labels = ex["input_ids"], ex["labels"]
        n = len(scored.input_ids)
        assert ids[:n] == scored.input_ids and ids[n] == tok.eos_token_id  # the scored tokens, then EOS
        assert tok.decode(ids) == tok.decode(scored.input_ids) + tok.eos_token + tail
        assert labels[:scored.n_prompt] == [-100] * scored.n_prompt  # completion-only loss
        assert labels[scored.n_prompt:] == ids[scored.n_prompt:]
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert batch["labels"][0].tolist() == trainer.train_dataset[0]["labels"]


HOSTILE = '"); import os; os.system("touch PWNED") #\nx: 1\n\'\'\'"""\u2028y: [\x85z: {'


def test_exported_files_keep_manifest_values_literal(tmp_path, monkeypatch):
    """A crafted manifest cannot add code to trl_sft.py nor keys to the YAML files."""
    import ast
    import runpy

    import yaml

    from capacity_advisor.training.export import _y, export

    for v in [HOSTILE, 1e-05, 2.5e20, 0.0, 3, True, None, "no", "1e-05", "#", ["assistant"], "\ud83d\ude00 ok"]:
        assert yaml.safe_load(f"k: {_y(v)}  # c\n")["k"] == v
    from dataclasses import replace

    path = make_manifest(tmp_path / "rec", "lab:s", lora={"r": 4, "alpha": 8})
    m = load_manifest(path)
    # loading refuses such values (one-line specs, numeric alpha); the export must quote them even so
    m = replace(m, model={"spec": HOSTILE, "path": HOSTILE, "chat_template": True, "model_type": "qwen2"},
                training=replace(m.training, lora={"r": 4, "alpha": HOSTILE}))
    out = tmp_path / "out \"'#: x"
    export(m, out)

    src = (out / "trl_sft.py").read_text()
    tree = ast.parse(src)
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(n.value == HOSTILE for n in strings)
    for n in strings:
        n.value = ""
    assert "PWNED" not in ast.unparse(tree) and "system" not in ast.unparse(tree)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(out / "trl_sft.py"))  # the module's top level: settings, imports
    assert not (tmp_path / "PWNED").exists()

    lf = yaml.safe_load((out / "llamafactory_sft.yaml").read_text())
    assert lf["model_name_or_path"] == HOSTILE and lf["lora_alpha"] == HOSTILE and lf["dataset_dir"] == str(out)
    assert lf["template"] == "qwen" and not {"x", "y"} & set(lf)
    ax = yaml.safe_load((out / "axolotl_sft.yaml").read_text())
    assert ax["base_model"] == HOSTILE and ax["lora_alpha"] == HOSTILE and not {"x", "y"} & set(ax)
    assert ax["datasets"][0]["path"] == str(out / "train_messages.jsonl")


def test_curriculum_trains_high_rows_then_low_rows(tmp_path, tiny_llama, monkeypatch):
    import io

    import capacity_advisor.training.data as data
    from capacity_advisor.training.sft import run_sft

    path = make_manifest(tmp_path / "rec", tiny_llama, switch_epoch=1)
    rows = read_jsonl(tmp_path / "rec" / "train.jsonl")
    with open(tmp_path / "rec" / "train.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "phase": "high"}) + "\n")
            f.write(json.dumps({**r, "completion": " LOW", "phase": "low"}) + "\n")
    seen = []
    real = data.CompletionCollator.__call__

    def spy(self, feats):
        seen.append({f["completion"] == " LOW" for f in feats})
        return real(self, feats)

    monkeypatch.setattr(data.CompletionCollator, "__call__", spy)
    record = run_sft(path, tmp_path / "run", records=str(tmp_path / "r.jsonl"), threads=1, stream=io.StringIO())
    assert record["n_train"] == 16
    assert seen == [{False}] * 4 + [{True}] * 4  # epoch 0 on the high rows, epoch 1 on the low rows


def test_rerank_rescores_with_the_checkpoint_and_swaps_the_rows(tmp_path, tiny_llama):
    """At epoch 1 the candidates are scored by the weights of that moment (the saved checkpoint),
    each problem takes its argmin (strategy low), and epoch 2 trains on those rows."""
    import torch
    from transformers import TrainerCallback

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import LoadedModel, load_model
    from capacity_advisor.training.sft import run_sft

    folder = tmp_path / "rec"
    write_data(folder)
    cands = [{"id": str(i), "prompt": f"Question: what is 12 + {i}? Answer:",
              "responses": [f" {12 + i}.", f" Let us think step by step. \\boxed{{{12 + i}}}", f" It is {12 + i}, so \\boxed{{{12 + i}}}"]}
             for i in range(16)]
    write_jsonl(folder / "candidates.jsonl", cands)
    m = Manifest(model={"spec": tiny_llama}, dataset="train.jsonl", strategy="low",
                 eval=EvalSpec(path="eval.jsonl", checker="math", max_new_tokens=8),
                 training=TrainingSpec(epochs=2, learning_rate=1e-3, batch_size=4, evals_per_epoch=1, save_total_limit=None,
                                       warmup_ratio=0.0, rerank={"epochs": [1], "candidates": "candidates.jsonl", "score": "sum"}))
    path = m.to_json(folder / "recommendation.json")
    seen = {}

    class Watch(TrainerCallback):
        def on_epoch_begin(self, args, state, control, train_dataloader=None, **kw):
            seen[int(state.epoch or 0)] = [dict(r) for r in train_dataloader.dataset.phases["all"]]

    record = run_sft(path, tmp_path / "run", records=str(tmp_path / "store.jsonl"), threads=1, callbacks=[Watch()])
    chosen = read_jsonl(tmp_path / "run" / "rerank" / "epoch-1.jsonl")
    assert len(chosen) == 16 and record["settings"]["rerank"]["epoch-1"]["problems"] == 16
    assert record["provenance"]["rerank_tokens"] > 0
    ckpt = load_model(str(tmp_path / "run" / "checkpoint-4"), device="cpu")  # the end of epoch 1 (16 rows / batch 4)
    lm = load_model(tiny_llama, device="cpu")
    backend = HFBackend(LoadedModel(ckpt.model, lm.tokenizer, torch.device("cpu"), tiny_llama, None, {}))
    for c, row in zip(cands, chosen):
        direct = backend.score([(c["prompt"], r) for r in c["responses"]], max_length=2048)
        assert [s["logprob_sum"] for s in row["scores"]] == pytest.approx([d["logprob_sum"] for d in direct], abs=1e-4)
        assert row["k"] == min(range(3), key=lambda k: (direct[k]["logprob_sum"], k))
    assert [r["completion"] for r in seen[1]] == [c["responses"][row["k"]] for c, row in zip(cands, chosen)]
    assert [r["completion"] for r in seen[0]] != [r["completion"] for r in seen[1]]


def test_measure_every_thins_the_scoring_measures_and_nothing_else(tmp_path, tiny_llama):
    """eval.measure_every 4: the scoring measures at step 0, whole epochs and the last evaluation
    only; accuracy, losses and the measures where they are taken are those of the full protocol."""
    from capacity_advisor.training.run_check import run_key
    from capacity_advisor.training.sft import run_sft

    runs = {}
    for every in (1, 4):
        path = make_manifest(tmp_path / f"rec{every}", tiny_llama, epochs=2)
        d = json.loads(path.read_text())
        assert "measure_every" not in d["eval"]  # the default is not written: older manifests keep their run keys
        d["eval"].update(base_drift=True, measure_every=every)
        path.write_text(json.dumps(d))
        m = load_manifest(path)
        assert m.eval.measure_every == every and ("measure_every" in m.to_dict()["eval"]) == (every != 1)
        runs[every] = (run_key(m), run_sft(path, tmp_path / f"run{every}", records=str(tmp_path / "r.jsonl"), threads=1))
    (key1, _), (key4, _) = runs[1], runs[4]
    assert key1 != key4
    rows = {every: read_jsonl(tmp_path / f"run{every}" / "eval.jsonl")
            for every in (1, 4)}
    full, thin = rows[1], rows[4]
    assert [e["step"] for e in full] == [e["step"] for e in thin] == list(range(9))
    measured = {0, 4, 8}  # step 0, the end of epoch 1 (4 steps per epoch), the last step
    for a, b in zip(full, thin):
        assert a["accuracy"] == b["accuracy"] and a["answer_rate"] == b["answer_rate"]
        assert (a["train_loss"] is None and b["train_loss"] is None and a["step"] == 0) or \
            a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        for key in ("answer_logprob", "base_drift"):
            assert isinstance(a[key], float)
            if b["step"] in measured:
                assert b[key] == pytest.approx(a[key], rel=1e-6)
            else:
                assert b[key] is None
    assert sum(e["eval_tokens"] for e in thin) < sum(e["eval_tokens"] for e in full)
    # a bad value is named, not crashed on
    d["eval"]["measure_every"] = 0
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match="eval.measure_every"):
        load_manifest(path)


def test_the_trained_model_and_its_optimizer_are_freed_when_a_run_returns(tmp_path, tiny_llama):
    """The Trainer keeps its model and optimizer in reference cycles: without a collection at the
    end of `run_sft`, a race's next segment (or a probe's second set) loaded beside them. With the
    collector's automatic runs off, nothing but `run_sft` itself can free them."""
    import gc
    import weakref

    from transformers import TrainerCallback

    from capacity_advisor.training.sft import run_sft

    held = {}

    class Hold(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            held.setdefault("model", weakref.ref(model))
            held.setdefault("state", [weakref.ref(t) for s in optimizer.state.values() for t in s.values()
                                      if hasattr(t, "shape")])

    path = make_manifest(tmp_path / "rec", tiny_llama)
    gc.collect()
    gc.disable()
    try:
        got = run_sft(path, tmp_path / "run", threads=1, keep_best=False, store=False, pause_after_evals=1,
                      callbacks=[Hold()])
        assert got == {"paused_at_step": 1}
        assert held["state"] and held["model"]() is None and all(r() is None for r in held["state"])
    finally:
        gc.enable()
