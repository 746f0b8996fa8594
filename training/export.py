"""Exports for people with their own launchers: the dataset and a config snippet for TRL,
LLaMA-Factory and axolotl, carrying the manifest's settings.

    advisor train rec/recommendation.json --export out/ --format all

Writes into the folder: `train.jsonl` (prompt/completion) and, per format,
- trl:          `trl_sft.py` — SFTTrainer on the prompt/completion file (completion-only loss);
- llamafactory: `dataset_info.json` (maps our columns, no conversion) + `llamafactory_sft.yaml`;
- axolotl:      `axolotl_sft.yaml` (+ `train_messages.jsonl` when the student has a chat template).
They save checkpoints on the same schedule (evals_per_epoch per epoch); our generation-based
evaluation is not part of them — score their checkpoints with `advisor` afterwards. Curriculum
sets need two runs in those tools (phase=high, then phase=low); the snippets say so.

Every value from the manifest or the command line enters the generated files as a literal (Python
`repr`, a double-quoted YAML scalar), so a crafted manifest cannot add code or keys to them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from models.errors import InputError
from models.files import write_jsonl
from training.data import read_sft_rows
from training.manifest import Manifest

FORMATS = ("trl", "llamafactory", "axolotl")


# Characters a YAML reader treats as line breaks or refuses, which json.dumps leaves unescaped.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _y(v) -> str:
    """`v` as one YAML scalar (or flow collection) that reads back as exactly `v`."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float) and math.isfinite(v):
        r = repr(v)
        # YAML 1.1 readers (PyYAML) take 1e-05 for a string: the mantissa needs a dot.
        return r.replace("e", ".0e", 1) if "e" in r and "." not in r else r
    if isinstance(v, (int, float, str, list, dict)):
        return _YAML_UNSAFE.sub(lambda c: f"\\u{ord(c.group()):04x}", json.dumps(v, ensure_ascii=False))
    raise TypeError(f"no YAML literal for {type(v).__name__}")


def save_steps(m: Manifest, n_rows: int) -> int:
    per_epoch = max(1, math.ceil(n_rows / m.training.batch_size))
    return max(1, round(per_epoch / m.training.evals_per_epoch))


def export(m: Manifest, out: str | Path, formats=FORMATS) -> list[Path]:
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise InputError(f"--format {','.join(bad)} is unknown: use {', '.join(FORMATS)} or all")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_sft_rows(m.dataset_path)
    written = [out / "train.jsonl"]
    write_jsonl(written[0], ({"prompt": r["prompt"], "completion": r["completion"],
                              **({"phase": r["phase"]} if "phase" in r else {})} for r in rows))
    t = m.training
    chat = bool(m.model.get("chat_template"))
    note = (f"# curriculum: train on rows with phase=high for {float(t.switch_epoch)!r} epochs, then on phase=low for the rest\n"
            if t.switch_epoch else "")
    steps = save_steps(m, len(rows))
    spec = m.model.get("path") or m.model_spec  # a lab:NAME spec means nothing to other tools
    if "trl" in formats:
        p = out / "trl_sft.py"
        p.write_text(f'''"""SFT with TRL on the selected data, with the recommendation's settings.
    pip install trl; accelerate launch trl_sft.py   (or: python trl_sft.py)
"""
{note}from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

data = load_dataset("json", data_files={str((out / 'train.jsonl').resolve())!r}, split="train")
args = SFTConfig(
    output_dir="trl-run",
    num_train_epochs={float(t.epochs)!r},
    learning_rate={float(t.learning_rate)!r},
    per_device_train_batch_size={max(1, t.batch_size // t.grad_accum)!r},  # divide by the number of GPUs
    gradient_accumulation_steps={t.grad_accum!r},
    lr_scheduler_type={t.lr_scheduler!r},
    warmup_ratio={float(t.warmup_ratio)!r},
    weight_decay={float(t.weight_decay)!r},
    max_length={t.max_length!r},
    completion_only_loss=True,  # loss on the completion only, as advisor trains
    save_strategy="steps",
    save_steps={steps!r},  # {t.evals_per_epoch} checkpoints per epoch
    save_total_limit={t.save_total_limit!r},
    seed={t.seed!r},
    bf16=True,  # False on CPU
)
SFTTrainer(model={spec!r}, args=args, train_dataset=data).train()
''', encoding="utf-8")
        written.append(p)
    if "llamafactory" in formats:
        info = out / "dataset_info.json"
        info.write_text(json.dumps({"capacity_advisor": {
            "file_name": "train.jsonl", "columns": {"prompt": "prompt", "response": "completion"}}}, indent=2) + "\n")
        p = out / "llamafactory_sft.yaml"
        lora = t.lora
        p.write_text("".join([
            "# llamafactory-cli train llamafactory_sft.yaml\n", note,
            f"model_name_or_path: {_y(spec)}\n",
            "stage: sft\ndo_train: true\n",
            f"finetuning_type: {'lora' if lora else 'full'}\n",
            *([f"lora_rank: {_y(lora['r'])}\n", f"lora_alpha: {_y(lora.get('alpha', 2 * lora['r']))}\n", "lora_target: all\n"] if lora else []),
            "dataset: capacity_advisor\n", f"dataset_dir: {_y(str(out.resolve()))}\n",
            f"template: {'empty' if not chat else 'CHANGE_ME  # the chat template of the student, e.g. qwen, llama3'}\n",
            f"cutoff_len: {_y(t.max_length)}\n", "train_on_prompt: false\n",
            "output_dir: llamafactory-run\n",
            f"per_device_train_batch_size: {_y(max(1, t.batch_size // t.grad_accum))}  # divide by the number of GPUs\n",
            f"gradient_accumulation_steps: {_y(t.grad_accum)}\n", f"learning_rate: {_y(float(t.learning_rate))}\n",
            f"num_train_epochs: {_y(float(t.epochs))}\n", f"lr_scheduler_type: {_y(t.lr_scheduler)}\n",
            f"warmup_ratio: {_y(float(t.warmup_ratio))}\n", f"weight_decay: {_y(float(t.weight_decay))}\n",
            f"save_steps: {_y(steps)}  # {t.evals_per_epoch} checkpoints per epoch\n",
            *([f"save_total_limit: {_y(t.save_total_limit)}\n"] if t.save_total_limit else []),
            f"seed: {_y(t.seed)}\n", "bf16: true\n", "logging_steps: 10\n",
        ]), encoding="utf-8")
        written += [info, p]
    if "axolotl" in formats:
        p = out / "axolotl_sft.yaml"
        if chat:
            msgs = out / "train_messages.jsonl"
            write_jsonl(msgs, ({"messages": [{"role": "user", "content": r["prompt"]},
                                             {"role": "assistant", "content": r["completion"]}]} for r in rows))
            written.append(msgs)
            ds = ("datasets:\n  - path: " + _y(str(msgs.resolve())) + "\n    ds_type: json\n    type: chat_template\n"
                  "    field_messages: messages\n    roles_to_train: [\"assistant\"]\nchat_template: tokenizer_default\n")
        else:
            ds = ("datasets:\n  - path: " + _y(str((out / 'train.jsonl').resolve())) + "\n    ds_type: json\n    type:\n"
                  "      field_instruction: prompt\n      field_output: completion\n"
                  "      format: \"{instruction}\"\n      no_input_format: \"{instruction}\"\n")
        p.write_text("".join([
            "# axolotl train axolotl_sft.yaml\n", note,
            f"base_model: {_y(spec)}\n", ds, "train_on_inputs: false\n",
            f"sequence_len: {_y(t.max_length)}\n",
            *([f"adapter: lora\nlora_r: {_y(t.lora['r'])}\nlora_alpha: {_y(t.lora.get('alpha', 2 * t.lora['r']))}\n"
               "lora_target_linear: true\n"] if t.lora else []),
            f"micro_batch_size: {_y(max(1, t.batch_size // t.grad_accum))}  # divide by the number of GPUs\n",
            f"gradient_accumulation_steps: {_y(t.grad_accum)}\n",
            f"num_epochs: {_y(float(t.epochs))}\n", f"learning_rate: {_y(float(t.learning_rate))}\n",
            f"lr_scheduler: {_y(t.lr_scheduler)}\n",
            f"warmup_ratio: {_y(float(t.warmup_ratio))}\n", f"weight_decay: {_y(float(t.weight_decay))}\n",
            f"saves_per_epoch: {_y(t.evals_per_epoch)}\n",
            *([f"save_total_limit: {_y(t.save_total_limit)}\n"] if t.save_total_limit else []),
            f"seed: {_y(t.seed)}\n", "bf16: auto\n", "output_dir: axolotl-run\n",
        ]), encoding="utf-8")
        written.append(p)
    return written
