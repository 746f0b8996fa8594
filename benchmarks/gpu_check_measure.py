"""gpu_check's measurements of one student, as `advisor score`, `probe` and `recommend` run them.

The random-weight student and the small tokenizer it is built with (nothing is downloaded); the
clocks (`timed`, StepClock) and the memory gauges (PeakMemory: CUDA's allocator peak on a GPU, the
sampled resident set on a CPU); and the three measurements: `measure_scoring` (HFBackend's scoring
of pairs of the assumed pool's shape), `_probe_trainer` (the probe's Trainer on a copy of the
student, seconds per step and peak memory) and `measure_generation` (the probe evaluation's
greedy generation on the trained copy). gpu_check.measure_student runs them in that order.
"""

import copy
import gc
import os
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

from gpu_check_shapes import MAX_POSITIONS, PoolAssumption, Student


def build_tokenizer():
    """A small trained byte-level BPE tokenizer with a chat template (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["Let us think step by step about problem %d: %d + %d = %d, so the answer is \\boxed{%d}." % (i, i, 2 * i, 3 * i, 3 * i)
            for i in range(2000)]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return fast


def timed(fn):
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


# ---- memory ------------------------------------------------------------------------------------


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # kB on Linux


def memory_now_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.memory_allocated() / 2**20
    return _rss_mb()


class PeakMemory:
    """Peak memory over a block, in MiB: CUDA's allocator peak on a GPU (reserved alongside); on a
    CPU the process's resident set, sampled every few milliseconds."""

    def __init__(self, device: str):
        self.device = device
        self.mb = self.reserved_mb = 0.0

    def __enter__(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._stop = threading.Event()
            self.mb = _rss_mb()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.mb = max(self.mb, _rss_mb())

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.mb = torch.cuda.max_memory_allocated() / 2**20
            self.reserved_mb = torch.cuda.max_memory_reserved() / 2**20
        else:
            self._stop.set()
            self._thread.join()
            self.mb = max(self.mb, _rss_mb())
            self.reserved_mb = self.mb
        return False


def free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---- the students ------------------------------------------------------------------------------


def build_student(name: str, shape: dict, tokenizer, device: str, dtype: str, seed: int = 0):
    """A random-weight Qwen2 of `shape`, built on `device` in `dtype`, as a LoadedModel."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from capacity_advisor.models.loading import LoadedModel, describe

    torch.manual_seed(seed)
    # no EOS: random weights would end generations at random; the projection assumes they run to the cap
    cfg = Qwen2Config(**shape, max_position_embeddings=MAX_POSITIONS, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=None, bos_token_id=None)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(cfg, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = None
    model.eval()
    spec = f"random:{name}"
    return LoadedModel(model, tokenizer, torch.device(device), spec, None, describe(model, tokenizer, spec, None))


def filler(tokenizer, n_tokens: int, seed: int) -> str:
    """Arithmetic prose of `n_tokens` tokens under `tokenizer` (as near as decoding allows)."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n_tokens:
        text = " ".join(f"{a} + {b} = {a + b}." for a, b in ((rng.randrange(1000), rng.randrange(1000)) for _ in range(200)))
        ids += tokenizer(" " + text, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:n_tokens])


def prompt_text(tokenizer, n_tokens: int, seed: int) -> str:
    """A prompt of about `n_tokens` tokens once the chat template has wrapped it."""
    from capacity_advisor.models.template import prompt_ids

    return filler(tokenizer, max(1, n_tokens - len(prompt_ids(tokenizer, ""))), seed)


def measure_scoring(lm, pool: PoolAssumption, score_max_length: int, n_pairs: int, device: str) -> dict:
    """`advisor score`'s hf path on pairs of the pool's shape, cut as scoring cuts them."""
    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.template import Encoded

    prompt = min(pool.prompt_tokens, score_max_length - 1)
    resp = min(pool.response_tokens, score_max_length - prompt)
    vocab = lm.description["vocab_size"]
    rng = random.Random(0)
    pairs = [Encoded([rng.randrange(3, vocab) for _ in range(prompt + resp)], prompt, resp < pool.response_tokens)
             for _ in range(n_pairs)]
    hf = HFBackend(lm)  # the device's default token budget, as `advisor score` uses it
    hf.score_encoded(pairs[:2])  # warm-up
    with PeakMemory(device) as mem:
        _, s = timed(lambda: hf.score_encoded(pairs))
    return {"pairs": n_pairs, "prompt_tokens": prompt, "response_tokens_per_pair": resp, "token_budget": hf.token_budget,
            "seconds": s, "response_tokens_per_s": n_pairs * resp / s, "forward_tokens_per_s": n_pairs * (prompt + resp) / s,
            "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb}


class StepClock:
    """Wall time of each optimizer step (end to end, data and logging included) and the memory
    still held at each step's end (weights, optimizer state, the resident base)."""

    def __init__(self, device: str):
        self.device = device
        self.marks: list[float] = []
        self.resident_mb = 0.0

    def _sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class _Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if not clock.marks:
                    clock._sync()
                    clock.marks.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                clock._sync()
                clock.marks.append(time.perf_counter())
                clock.resident_mb = memory_now_mb(clock.device)

        return _Clock()

    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def _probe_trainer(lm, student: Student, recipe, device: str, steps: int, checkpointing: bool,
                   pool: PoolAssumption, workdir: Path):
    """The probe's Trainer on a deep copy of `lm` (run_sft's settings), trained `steps` steps."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging

    from capacity_advisor.probes.run import ProbeConfig, ProbeData, manifest_for
    from capacity_advisor.training import trainer_settings
    from capacity_advisor.training.data import CompletionCollator, SFTDataset

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cfg = ProbeConfig.from_recipe(recipe, lora_r=student.lora_r, device=device, dtype="auto")
    stub = ProbeData(train={}, eval_prompts=[], eval_answers=[], teacher_high=[], teacher_low=[], checker="math")
    lr = recipe.learning_rate(lm.spec, lm.description["n_params"])[0]
    t = manifest_for("high", cfg, stub, {"spec": lm.spec}, lr, workdir).training
    t = replace(t, max_steps=steps, gradient_checkpointing=t.gradient_checkpointing or checkpointing)
    _, bf16, fp16 = trainer_settings.precision(cfg.dtype, cuda=device == "cuda")
    args = trainer_settings.training_arguments(t, workdir / "run", t.batch_size // t.grad_accum, device == "cpu", bf16, fp16)
    model = copy.deepcopy(lm.model)  # run_sft trains a copy; the base stays for base_drift
    model.train()
    if t.lora:
        model = trainer_settings.with_lora(model, t.lora, t.seed)
    tok = lm.tokenizer
    row = {"prompt": prompt_text(tok, pool.prompt_tokens, 1), "completion": filler(tok, pool.response_tokens, 2)}
    collator = CompletionCollator(tok, t.max_length)
    clock = StepClock(device)
    trainer = Trainer(model=model, args=args, data_collator=collator, train_dataset=SFTDataset([row] * (t.batch_size * steps)),
                      processing_class=tok, callbacks=[clock.callback()])
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    with PeakMemory(device) as mem:
        trainer.train()
    times = clock.seconds()[1:]  # the first step allocates the optimizer state and warms the kernels
    step = {"mode": f"LoRA r={t.lora['r']}" if t.lora else "full fine-tuning", "lora_r": student.lora_r,
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "batch_size": t.batch_size, "max_length": t.max_length, "optimizer": getattr(args.optim, "value", str(args.optim)),
            "learning_rate": lr, "bf16": bool(args.bf16), "gradient_checkpointing": bool(t.gradient_checkpointing),
            "steps_timed": len(times), "seconds_per_step": sum(times) / len(times),
            "tokens_per_step": collator.tokens / steps, "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb,
            "resident_memory_mb": clock.resident_mb}
    return trainer, step


def measure_generation(trainer, lm, recipe, pool: PoolAssumption, device: str) -> dict:
    """The probe evaluation's generation (training.evaluate.Evaluator.generate, EvalCallback's model)."""
    from capacity_advisor.models.backends import make_backend
    from capacity_advisor.models.hf import length_batches
    from capacity_advisor.models.loading import LoadedModel
    from capacity_advisor.models.template import prompt_ids

    model = trainer.model
    model.eval()
    gen_lm = LoadedModel(model, lm.tokenizer, lm.device, lm.spec, None, {})
    backend = make_backend("hf", gen_lm, token_budget=recipe.token_budget)
    prompts = [prompt_text(lm.tokenizer, pool.prompt_tokens, 100 + i) for i in range(recipe.eval_problems)]
    lengths = [len(prompt_ids(lm.tokenizer, p)) for p in prompts]
    batch = length_batches([n + recipe.max_new_tokens for n in lengths], backend.token_budget, backend.max_batch)[0]
    picked = [prompts[i] for i in batch]
    backend.generate(picked, max_new_tokens=2, temperature=0.0, seed=0)  # warm-up
    held = memory_now_mb(device)
    with PeakMemory(device) as mem:
        _, s = timed(lambda: backend.generate(picked, max_new_tokens=recipe.max_new_tokens, temperature=0.0, seed=0,
                                              details=True))
    new = len(picked) * recipe.max_new_tokens  # no EOS: every row runs to max_new_tokens
    return {"batch_rows": len(picked), "prompt_tokens": sum(lengths[i] for i in batch) / len(batch),
            "max_new_tokens": recipe.max_new_tokens, "token_budget": backend.token_budget, "decoding": "greedy",
            "seconds": s, "new_tokens": new, "new_tokens_per_s": new / s, "memory_at_start_mb": held,
            "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb}
