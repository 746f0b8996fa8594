"""The Hugging Face `Trainer`'s settings for a run, in one place: the precision a device trains in,
the `TrainingArguments` of a TrainingSpec (activation checkpointing under the name this
transformers version uses), and LoRA through peft. `training.sft` trains with them, and
`python -m benchmarks.gpu_check` times a step with the same ones.
"""

from __future__ import annotations

from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import TrainingSpec


def precision(dtype: str, cuda: bool) -> tuple[str, bool, bool]:
    """(weights dtype, bf16 autocast, fp16 autocast). CPUs train in fp32; fp16 keeps fp32 master weights."""
    if dtype == "auto":
        if not cuda:
            return "float32", False, False
        import torch

        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype == "bfloat16":
        return "bfloat16", cuda, False
    if dtype == "float16":
        if not cuda:
            raise InputError("--dtype float16 needs a CUDA GPU; use float32 (or bfloat16) on a CPU")
        return "float32", False, True
    return "float32", False, False


def training_arguments(t: TrainingSpec, run_dir: Path, per_device: int, use_cpu: bool, bf16: bool, fp16: bool,
                       world: int = 1):
    """The Trainer's settings for a TrainingSpec, in one place, so that what times a training step
    (`python -m benchmarks.gpu_check`) steps exactly as a run does."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(run_dir),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=t.grad_accum,
        num_train_epochs=float(t.epochs),
        max_steps=t.max_steps or -1,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        # transformers 5 reads a warmup_steps below 1 as a share of all steps
        warmup_steps=t.warmup_steps if t.warmup_steps is not None else float(t.warmup_ratio),
        weight_decay=t.weight_decay,
        logging_strategy="steps",
        logging_steps=1,
        eval_strategy="no",  # evaluation is generation-based, in EvalCallback
        save_strategy="no",  # EvalCallback asks for a checkpoint at each evaluation
        save_total_limit=t.save_total_limit,
        seed=t.seed,
        data_seed=t.seed,
        use_cpu=use_cpu,
        bf16=bf16,
        fp16=fp16,
        **_checkpointing(t.gradient_checkpointing),
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        # the tokens trained (attention mask, prompt and response), kept in the checkpoint's trainer
        # state: a resumed run's record counts the whole run's, not this process's part
        include_num_input_tokens_seen="non_padding",
        ddp_backend="gloo" if use_cpu and world > 1 else None,
        ddp_find_unused_parameters=False,
    )


def _checkpointing(on: bool) -> dict:
    """Activation checkpointing, under the name this transformers version uses."""
    if not on:
        return {}
    from dataclasses import fields

    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": True}


def require_peft():
    try:
        import peft
    except ImportError:
        raise InputError("training.lora needs peft: pip install 'capacity-advisor[lora]'") from None
    return peft


def with_lora(model, spec: dict, seed: int):
    LoraConfig, get_peft_model = require_peft().LoraConfig, require_peft().get_peft_model
    import torch

    torch.manual_seed(seed)
    cfg = LoraConfig(r=spec["r"], lora_alpha=spec.get("alpha", 2 * spec["r"]), lora_dropout=spec.get("dropout", 0.0),
                     target_modules=spec.get("target_modules", "all-linear"), task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)
