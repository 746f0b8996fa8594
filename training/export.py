"""Exports for people with their own launchers: the dataset and a config for TRL, LLaMA-Factory
and axolotl, carrying the manifest's settings and the student's rendering of each pair.

    advisor train rec/recommendation.json --export out/ --format all

Writes into the folder `train.jsonl` (prompt/completion strings; where the manifest plans a race,
also `train-high.jsonl` and `train-low.jsonl`) and, per format,
- trl:          `trl_sft.py` (SFTTrainer, completion-only loss, bf16 decided where it runs). A student
                with a chat template gets `train_chat.jsonl`, prompt and completion as chat messages,
                so TRL renders the chat template the candidates were scored under;
- llamafactory: `dataset_info.json` + `llamafactory_sft.yaml`, naming the LLaMA-Factory template
                that matches the student's chat template (or saying why none could be named). A
                student without a chat template gets `train_llamafactory.jsonl`, whose rows carry
                the tokenizer's BOS and EOS as text: LLaMA-Factory's `empty` template adds neither;
- axolotl:      `axolotl_sft.yaml` (+ `train_messages.jsonl` when the student has a chat template) and
                `axolotl_train.sh`, which runs it with axolotl's telemetry off (AXOLOTL_DO_NOT_TRACK=1:
                offline, the telemetry would otherwise hold the run open after training).

Every file is written atomically (a link planted at an output's name is replaced, never written
through), and none may replace an input: the dataset, the eval set, the candidates or the manifest.
With a chat template, every prompt is rendered once here, within the bounds of
`models.template.render_prompt`, so a template that fails, loops or balloons on some prompts is
refused now rather than inside the launcher.

The student's tokenizer is read here (a local folder, a built lab student, or a hub id already in
the local cache) to decide chat or plain; when it cannot be, the manifest's description decides.
Scoring renders a pair as prompt + response; the launchers train on that plus EOS, as advisor does,
with the prompt masked. TRL and LLaMA-Factory also train whatever the chat template writes after
the end-of-turn token (ChatML's newline after `<|im_end|>`); axolotl leaves it unlabelled.

They save checkpoints on the same schedule (evals_per_epoch per epoch); our generation-based
evaluation is not part of them: score their checkpoints with `advisor` afterwards. Curriculum sets
need two runs in those tools (phase=high, then phase=low); the files say so.

Every value from the manifest or the command line enters the generated files as a literal (Python
`repr`, a double-quoted YAML scalar), so a crafted manifest cannot add code or keys to them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    check_writable_dir, check_writable_file, refuse_overwrite, write_jsonl, write_text,
)
from capacity_advisor.models.template import check_prompts
from capacity_advisor.training.data import read_sft_rows
from capacity_advisor.training.export_student import Student, bos_eos_text, llamafactory_template, read_student
from capacity_advisor.training.manifest import Manifest
from capacity_advisor.training.race import set_files

FORMATS = ("trl", "llamafactory", "axolotl")
# Everything an export may write, by name: checked against the inputs before anything is written.
OUTPUTS = ("train.jsonl", "train_chat.jsonl", "trl_sft.py", "train_llamafactory.jsonl", "dataset_info.json",
           "llamafactory_sft.yaml", "axolotl_sft.yaml", "train_messages.jsonl", "axolotl_train.sh",
           "train-high.jsonl", "train-low.jsonl")

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


def export(m: Manifest, out: str | Path, formats=FORMATS, manifest_path: str | os.PathLike | None = None,
           dry_run: bool = False) -> list[Path]:
    """Write the dataset and the launchers' configs into `out` (see the module docstring);
    `manifest_path`: the manifest's file, which must not be written over either. Every check comes
    before the first write; `dry_run` makes them all and returns what would be written, writing nothing."""
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise InputError(f"--format {','.join(bad)} is unknown: use {', '.join(FORMATS)} or all")
    out = check_writable_dir(out, "--export")
    refuse_overwrite([m.dataset_path, m.eval_path, m.candidates_path, manifest_path, *map(m.resolve, m.sets.values())],
                     [out / name for name in OUTPUTS], "--export")
    for name in OUTPUTS:  # a folder (or a link to nothing) where a file goes is refused now, not half-way
        check_writable_file(out / name, f"--export {out}: its file")
    rows = read_sft_rows(m.dataset_path)
    st = read_student(m)
    if st.chat and st.tokenizer is not None:
        check_prompts(st.tokenizer, (r["prompt"] for r in rows))  # what the launchers will render
    # every rendering before anything is written, so a template that fails on one writes nothing
    lf_template = llamafactory_template(st) if "llamafactory" in formats else None
    bos_eos = bos_eos_text(st.tokenizer) if not st.chat and st.tokenizer is not None else None
    if dry_run:
        return [out / name for name in _planned(m, formats, st.chat, bos_eos is not None)]
    out.mkdir(parents=True, exist_ok=True)
    phase = [({"phase": r["phase"]} if "phase" in r else {}) for r in rows]
    train = out / "train.jsonl"
    write_jsonl(train, ({"prompt": r["prompt"], "completion": r["completion"], **ph} for r, ph in zip(rows, phase)))
    written = [train, *_race_sets(m, out)]
    t = m.training
    per_device = max(1, t.batch_size // t.grad_accum)
    steps = save_steps(m, len(rows))
    note = (f"# curriculum: train on rows with phase=high for {float(t.switch_epoch)!r} epochs, "
            "then on phase=low for the rest\n" if t.switch_epoch else "")
    for fmt, write in (("trl", _write_trl), ("llamafactory", _write_llamafactory), ("axolotl", _write_axolotl)):
        if fmt in formats:
            written += write(_Job(st, out, train, rows, phase, t, per_device, steps, note, lf_template, bos_eos))
    return written


def _planned(m: Manifest, formats, chat: bool, bos_eos: bool) -> list[str]:
    """The names `export` writes, in its order: what a dry run reports."""
    names = ["train.jsonl", *(["train-high.jsonl", "train-low.jsonl"] if m.race is not None else [])]
    by_format = {"trl": [*(["train_chat.jsonl"] if chat else []), "trl_sft.py"],
                 "llamafactory": [*(["train_llamafactory.jsonl"] if bos_eos else []), "dataset_info.json",
                                  "llamafactory_sft.yaml"],
                 "axolotl": [*(["train_messages.jsonl"] if chat else []), "axolotl_sft.yaml", "axolotl_train.sh"]}
    return names + [n for fmt in FORMATS if fmt in formats for n in by_format[fmt]]


def _race_sets(m: Manifest, out: Path) -> list[Path]:
    """Where the manifest plans a race: D_high and D_low as prompt/completion JSONL (train-high.jsonl,
    train-low.jsonl), so both sets travel with the export; the race itself runs through `advisor train`."""
    if m.race is None:
        return []

    written = []
    for s, f in set_files(m).items():
        path = out / f"train-{s}.jsonl"
        write_jsonl(path, ({"prompt": r["prompt"], "completion": r["completion"]} for r in read_sft_rows(m.resolve(f))))
        written.append(path)
    return written


@dataclass
class _Job:
    """What every launcher's files are made from."""

    st: object  # the student as read_student read it
    out: Path
    train: Path  # train.jsonl, written already
    rows: list
    phase: list
    t: object  # the manifest's training block
    per_device: int
    steps: int
    note: str
    lf_template: tuple | None
    bos_eos: tuple | None


def _write_trl(j: _Job) -> list[Path]:
    st, out, rows, phase, t = j.st, j.out, j.rows, j.phase, j.t
    written = []
    data = j.train
    if st.chat:
        data = out / "train_chat.jsonl"
        write_jsonl(data, ({"prompt": [{"role": "user", "content": r["prompt"]}],
                            "completion": [{"role": "assistant", "content": r["completion"]}], **ph}
                           for r, ph in zip(rows, phase)))
        written.append(data)
    p = out / "trl_sft.py"
    write_text(p, _trl_script(st, data, t, j.per_device, j.steps, j.note))
    written.append(p)
    return written


def _write_llamafactory(j: _Job) -> list[Path]:
    st, out, rows, phase, t, lora, per_device, steps, note = j.st, j.out, j.rows, j.phase, j.t, j.t.lora, j.per_device, j.steps, j.note
    written = []
    name, system, why = j.lf_template
    lf_data = j.train
    if j.bos_eos is not None:
        bos, eos = j.bos_eos
        lf_data = out / "train_llamafactory.jsonl"
        write_jsonl(lf_data, ({"prompt": bos + r["prompt"], "completion": r["completion"] + eos, **ph}
                              for r, ph in zip(rows, phase)))
        written.append(lf_data)
    info = out / "dataset_info.json"
    write_text(info, json.dumps({"capacity_advisor": {
        "file_name": lf_data.name, "columns": {"prompt": "prompt", "response": "completion"}}}, indent=2) + "\n")
    p = out / "llamafactory_sft.yaml"
    write_text(p, "".join([
        "# llamafactory-cli train llamafactory_sft.yaml   (any key can be overridden after it: bf16=true)\n", note,
        f"model_name_or_path: {_y(st.ref)}\n",
        "stage: sft\ndo_train: true\n",
        f"finetuning_type: {'lora' if lora else 'full'}\n",
        *([f"lora_rank: {_y(lora['r'])}\n", f"lora_alpha: {_y(lora.get('alpha', 2 * lora['r']))}\n",
           f"lora_dropout: {_y(lora.get('dropout', 0.0))}\n", "lora_target: all\n"] if lora else []),
        "dataset: capacity_advisor\n", f"dataset_dir: {_y(str(out.resolve()))}\n",
        why + "\n",
        *([f"template: {_y(name)}\n"] if name else []),
        *([f"default_system: {_y(system)}\n"] if system is not None else []),
        f"cutoff_len: {_y(t.max_length)}\n", "train_on_prompt: false\n",
        "output_dir: llamafactory-run\n",
        f"per_device_train_batch_size: {_y(per_device)}  # divide by the number of GPUs\n",
        f"gradient_accumulation_steps: {_y(t.grad_accum)}\n", f"learning_rate: {_y(float(t.learning_rate))}\n",
        f"num_train_epochs: {_y(float(t.epochs))}\n", *([f"max_steps: {_y(t.max_steps)}\n"] if t.max_steps else []),
        f"lr_scheduler_type: {_y(t.lr_scheduler)}\n",
        f"warmup_ratio: {_y(float(t.warmup_ratio))}\n", f"weight_decay: {_y(float(t.weight_decay))}\n",
        f"disable_gradient_checkpointing: {_y(not t.gradient_checkpointing)}\n",
        "save_strategy: steps\n", f"save_steps: {_y(steps)}  # {t.evals_per_epoch} checkpoints per epoch\n",
        *([f"save_total_limit: {_y(t.save_total_limit)}\n"] if t.save_total_limit else []),
        f"seed: {_y(t.seed)}\n",
        # YAML has no "when supported": fp32 runs anywhere; GPUs want bf16=true (or fp16=true) on the command line.
        "bf16: false  # on GPUs with bf16 (A100, H100, ...): llamafactory-cli train llamafactory_sft.yaml bf16=true\n",
        "logging_steps: 10\n", "report_to: none\n",
    ]))
    written += [info, p]
    return written


def _write_axolotl(j: _Job) -> list[Path]:
    st, out, rows, phase, t, lora, per_device, note = j.st, j.out, j.rows, j.phase, j.t, j.t.lora, j.per_device, j.note
    train = j.train
    written = []
    p = out / "axolotl_sft.yaml"
    if st.chat:
        msgs = out / "train_messages.jsonl"
        write_jsonl(msgs, ({"messages": [{"role": "user", "content": r["prompt"]},
                                         {"role": "assistant", "content": r["completion"]}], **ph}
                           for r, ph in zip(rows, phase)))
        written.append(msgs)
        ds = (f"datasets:\n  - path: {_y(str(msgs.resolve()))}\n    ds_type: json\n    type: chat_template\n"
              "    field_messages: messages\n    roles_to_train: [\"assistant\"]\nchat_template: tokenizer_default\n")
    else:
        ds = (f"datasets:\n  - path: {_y(str(train.resolve()))}\n    ds_type: json\n    type:\n"
              "      field_instruction: prompt\n      field_output: completion\n"
              "      format: \"{instruction}\"\n      no_input_format: \"{instruction}\"\n")
    write_text(p, "".join([
        "# sh axolotl_train.sh   (= AXOLOTL_DO_NOT_TRACK=1 axolotl train axolotl_sft.yaml: no telemetry, which "
        "offline holds the run open after training)\n", note,
        f"base_model: {_y(st.ref)}\n", ds, "train_on_inputs: false\n",
        f"sequence_len: {_y(t.max_length)}\n",
        *([f"adapter: lora\nlora_r: {_y(lora['r'])}\nlora_alpha: {_y(lora.get('alpha', 2 * lora['r']))}\n"
           f"lora_dropout: {_y(lora.get('dropout', 0.0))}\nlora_target_linear: true\n"] if lora else []),
        f"micro_batch_size: {_y(per_device)}  # divide by the number of GPUs\n",
        f"gradient_accumulation_steps: {_y(t.grad_accum)}\n",
        f"num_epochs: {_y(float(t.epochs))}\n", *([f"max_steps: {_y(t.max_steps)}\n"] if t.max_steps else []),
        f"learning_rate: {_y(float(t.learning_rate))}\n",
        f"lr_scheduler: {_y(t.lr_scheduler)}\n",
        f"warmup_ratio: {_y(float(t.warmup_ratio))}\n", f"weight_decay: {_y(float(t.weight_decay))}\n",
        *(["gradient_checkpointing: true\n"] if t.gradient_checkpointing else []),
        f"saves_per_epoch: {_y(t.evals_per_epoch)}\n",
        *([f"save_total_limit: {_y(t.save_total_limit)}\n"] if t.save_total_limit else []),
        f"seed: {_y(t.seed)}\n",
        # auto: bf16 where the GPU has it; fp16 off, else axolotl falls back to it and fails on a CPU.
        "bf16: auto\nfp16: false\n", "output_dir: axolotl-run\n",
    ]))
    launch = out / "axolotl_train.sh"
    write_text(launch, AXOLOTL_LAUNCH)
    written += [p, launch]
    return written


# The axolotl launch: fixed text, no manifest value in it. DO_NOT_TRACK is the common opt-out too.
AXOLOTL_LAUNCH = """#!/bin/sh
# axolotl with its telemetry off: offline, the telemetry would hold the run open after training.
# Extra arguments go to `axolotl train`, e.g.: sh axolotl_train.sh --max-steps 2
export AXOLOTL_DO_NOT_TRACK=1 DO_NOT_TRACK=1
exec axolotl train "$(dirname "$0")/axolotl_sft.yaml" "$@"
"""


def _trl_script(st: Student, data: Path, t, per_device: int, steps: int, note: str) -> str:
    settings = [
        ("output_dir", "trl-run", ""),
        ("num_train_epochs", float(t.epochs), ""),
        ("learning_rate", float(t.learning_rate), ""),
        ("per_device_train_batch_size", per_device, "divide by the number of GPUs"),
        ("gradient_accumulation_steps", t.grad_accum, ""),
        ("lr_scheduler_type", t.lr_scheduler, ""),
        ("warmup_steps", float(t.warmup_ratio), "below 1: a share of all steps"),
        ("weight_decay", float(t.weight_decay), ""),
        ("max_length", t.max_length, "longer pairs keep their start"),
        ("completion_only_loss", True, "loss on the completion (and EOS) only, as advisor trains"),
        ("save_strategy", "steps", ""),
        ("save_steps", steps, f"{t.evals_per_epoch} checkpoints per epoch"),
        ("save_total_limit", t.save_total_limit, ""),
        ("seed", t.seed, ""),
        ("data_seed", t.seed, ""),
        ("report_to", "none", ""),
        *([("max_steps", t.max_steps, "")] if t.max_steps else []),
    ]
    lines = "".join(f"    {k!r}: {v!r},{'  # ' + c if c else ''}\n" for k, v, c in settings)
    lora = t.lora
    peft, peft_arg = "", ""
    if lora:
        peft = ("    from peft import LoraConfig\n\n"
                f"    peft_config = LoraConfig(r={lora['r']!r}, lora_alpha={lora.get('alpha', 2 * lora['r'])!r}, "
                f"lora_dropout={lora.get('dropout', 0.0)!r},\n"
                f"                             target_modules={lora.get('target_modules', 'all-linear')!r}, "
                "task_type='CAUSAL_LM')\n")
        peft_arg = ", peft_config=peft_config"
    kind = ("prompt/completion as chat messages, so TRL renders the student's chat template as scoring did"
            if st.chat else "prompt/completion strings: TRL joins them, BOS from the tokenizer, EOS appended")
    return f'''"""SFT with TRL on the data advisor selected, with the recommendation's settings.

    pip install 'trl>=1.16' 'transformers>=5'
    python trl_sft.py                      # one process: a CPU, or a GPU (bf16 where it is supported)
    accelerate launch trl_sft.py           # several GPUs
    python trl_sft.py --max_steps 2 --output_dir /tmp/try   # any SFTConfig field, on the command line

Data: {kind}.
"""
{note}
from dataclasses import fields

import torch
from datasets import load_dataset
from transformers import HfArgumentParser
from trl import SFTConfig, SFTTrainer

MODEL = {st.ref!r}
DATA = {str(data.resolve())!r}
BF16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
# activation_checkpointing is the current name; transformers before it knew only gradient_checkpointing
CHECKPOINTING = next(n for n in ("activation_checkpointing", "gradient_checkpointing") if n in {{f.name for f in fields(SFTConfig)}})
SETTINGS = {{
{lines}    CHECKPOINTING: {bool(t.gradient_checkpointing)!r},  # trade compute for memory
    'bf16': BF16,
    'fp16': torch.cuda.is_available() and not BF16,  # GPUs without bf16 (V100, T4)
}}


def build_trainer(argv=None):
    parser = HfArgumentParser(SFTConfig)
    parser.set_defaults(**SETTINGS)
    (args,) = parser.parse_args_into_dataclasses(argv)
{peft}    data = load_dataset("json", data_files=DATA, split="train")
    return SFTTrainer(model=MODEL, args=args, train_dataset=data{peft_arg})


if __name__ == "__main__":
    build_trainer().train()
'''
