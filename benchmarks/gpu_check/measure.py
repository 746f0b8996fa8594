"""gpu_check's measurements of one student, as `advisor score`, `probe`, `recommend` and `train` run them.

The random-weight student and the small tokenizer it is built with (nothing is downloaded); the
clocks (`timed`, StepClock) and the memory gauges (PeakMemory: CUDA's allocator peak on a GPU, the
sampled resident set on a CPU); and the measurements: `measure_scoring` (HFBackend's scoring of
pairs of the assumed pool's shape, and the same pairs through `naive_score`, the loop it replaces),
`train_steps` (a Trainer on the settings of `probe_spec` or `full_run_spec`: seconds per step and
peak memory) and `measure_generation` (the probe evaluation's greedy generation on the trained
copy). gpu_check.measure_student runs them in that order.
"""

import gc
import os
import random
import threading
import time
from pathlib import Path

from benchmarks.gpu_check.shapes import MAX_POSITIONS, PoolAssumption, Student


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


def naive_score(model, pairs) -> list[float]:
    """One example at a time, the whole (sequence x vocabulary) log-softmax: what the hf backend replaces."""
    import torch

    dev = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for e in pairs:
            ids = torch.tensor([e.input_ids], device=dev)
            logp = model(ids).logits.float().log_softmax(-1)[0]
            tgt = ids[0, e.n_prompt:]
            out.append(logp[e.n_prompt - 1:-1].gather(1, tgt[:, None]).sum().item())
    return out


def measure_scoring(lm, pool: PoolAssumption, score_max_length: int, n_pairs: int, device: str, n_naive: int) -> dict:
    """`advisor score`'s hf path on pairs of the pool's shape, cut as scoring cuts them; then the
    first `n_naive` of them through the naive loop, in the same dtype."""
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
    naive = pairs[:n_naive]
    naive_score(lm.model, naive[:1])  # warm-up
    _, naive_s = timed(lambda: naive_score(lm.model, naive))
    rate = n_pairs * resp / s
    return {"pairs": n_pairs, "prompt_tokens": prompt, "response_tokens_per_pair": resp, "token_budget": hf.token_budget,
            "seconds": s, "response_tokens_per_s": rate, "forward_tokens_per_s": n_pairs * (prompt + resp) / s,
            "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb,
            "naive": {"pairs": len(naive), "seconds": naive_s, "response_tokens_per_s": len(naive) * resp / naive_s},
            "hf_over_naive": rate / (len(naive) * resp / naive_s)}


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


def probe_spec(lm, student: Student, recipe, device: str, workdir: Path):
    """The TrainingSpec of a probe run (probes.run.manifest_for, the real-student recipe)."""
    from capacity_advisor.probes.run import ProbeConfig, ProbeData, manifest_for
    from capacity_advisor.probes.student import student_of

    cfg = ProbeConfig(recipe, lora_r=student.lora_r, device=device, dtype="auto")
    stub = ProbeData(train={}, eval_prompts=[], eval_answers=[], teacher_high=[], teacher_low=[], checker="math")
    lr = student_of(lm.spec, lm.description).learning_rate()[0]
    return manifest_for("high", cfg, stub, {"spec": lm.spec}, lr, workdir).training


def full_run_spec(lm, student: Student, recipe, epochs: float):
    """The TrainingSpec of the full run recommend's manifest describes (probes.recipe.full_run_manifest:
    the full-run batch, the training length), with LoRA where the student is probed with it."""
    from capacity_advisor.probes.recipe import full_run_manifest
    from capacity_advisor.probes.student import student_of

    lr = student_of(lm.spec, lm.description).learning_rate()[0]
    m = full_run_manifest(recipe, epochs=epochs, learning_rate=lr, seed=0, eval={},
                          training={"lora": {"r": student.lora_r}} if student.lora_r else None,
                          model={"spec": lm.spec}, dataset="train.jsonl")
    return m.training


def train_steps(model, tokenizer, t, device: str, pool: PoolAssumption, workdir: Path):
    """`model` trained t.max_steps steps by the Trainer on `t`'s settings (training_arguments, LoRA
    through with_lora), every sequence of the pool's shape cut at t.max_length: (trainer, figures)."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging

    from capacity_advisor.training import trainer_settings
    from capacity_advisor.training.data import CompletionCollator, SFTDataset

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    _, bf16, fp16 = trainer_settings.precision("auto", cuda=device == "cuda")
    args = trainer_settings.training_arguments(t, workdir / "run", t.batch_size // t.grad_accum, device == "cpu", bf16, fp16)
    model.train()
    if t.lora:
        model = trainer_settings.with_lora(model, t.lora, t.seed)
    tok = tokenizer
    row = {"prompt": prompt_text(tok, pool.prompt_tokens, 1), "completion": filler(tok, pool.response_tokens, 2)}
    collator = CompletionCollator(tok, t.max_length)
    clock = StepClock(device)
    trainer = Trainer(model=model, args=args, data_collator=collator, train_dataset=SFTDataset([row] * (t.batch_size * t.max_steps)),
                      processing_class=tok, callbacks=[clock.callback()])
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    with PeakMemory(device) as mem:
        trainer.train()
    times = clock.seconds()[1:]  # the first step allocates the optimizer state and warms the kernels
    step = {"mode": f"LoRA r={t.lora['r']}" if t.lora else "full fine-tuning", "lora_r": t.lora["r"] if t.lora else 0,
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "batch_size": t.batch_size, "max_length": t.max_length, "optimizer": getattr(args.optim, "value", str(args.optim)),
            "learning_rate": t.learning_rate, "lr_scheduler": t.lr_scheduler, "bf16": bool(args.bf16),
            "gradient_checkpointing": bool(t.gradient_checkpointing), "steps_timed": len(times),
            "seconds_per_step": sum(times) / len(times), "tokens_per_step": collator.tokens / t.max_steps,
            "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb, "resident_memory_mb": clock.resident_mb}
    return trainer, step


def measure_generation(trainer, lm, recipe, pool: PoolAssumption, device: str, timed_tokens: int | None = None) -> dict:
    """The probe evaluation's generation (training.evaluate.Evaluator.generate, EvalCallback's model):
    one batch of the size the token budget gives at the recipe's cap, `timed_tokens` new tokens
    (None: the cap) timed."""
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
    n_new = min(timed_tokens or recipe.max_new_tokens, recipe.max_new_tokens)
    with PeakMemory(device) as mem:
        _, s = timed(lambda: backend.generate(picked, max_new_tokens=n_new, temperature=0.0, seed=0, details=True))
    new = len(picked) * n_new  # no EOS: every row runs to the bound
    return {"batch_rows": len(picked), "prompt_tokens": sum(lengths[i] for i in batch) / len(batch),
            "max_new_tokens": recipe.max_new_tokens, "timed_new_tokens": n_new, "token_budget": backend.token_budget,
            "decoding": "greedy",
            "seconds": s, "new_tokens": new, "new_tokens_per_s": new / s, "memory_at_start_mb": held,
            "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb}
