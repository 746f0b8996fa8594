"""GPU check: the hf backend at the paper's student sizes, the cost of `advisor recommend`, and vllm beside hf.

    python benchmarks/gpu_check.py --hf-only --out gpu-check.json   # one GPU, no vllm needed
    python benchmarks/gpu_check.py --out gpu-check.json             # also vllm against hf (its environment: docs/vllm.md)
    python benchmarks/gpu_check.py --quick --hf-only                # the whole path at tiny shapes on a CPU, in seconds

Needs CUDA (and vllm, unless --hf-only); without them it says which is missing in one `error:`
line and exits 2. `--quick` shrinks every shape and length so that the path runs on a CPU: its
figures check the code and describe no GPU. Nothing is downloaded: every model is built here with
random weights. The JSON goes to --out, the Markdown table for docs/results.md section 3 beside it
(the same name with the suffix .md); both are printed (--json: the JSON alone). The command is sized
to finish within about 8 minutes on one H200-class GPU; it has not been timed on one yet.

In one process, in this order:

1. the students (--students; `none` skips them), each alone on the device: Qwen2.5-1.5B and
   Qwen2.5-7B built from the numbers of their public config.json (hidden size, layers, attention
   and KV heads, intermediate size, vocabulary 151,936 / 152,064, tied / untied embeddings) with
   random weights, in the dtype the trainer picks (training.sft.precision: bf16 on a GPU):
   - scoring: `HFBackend.score_encoded` at the device's default token budget, as `advisor score`
     runs it, on --scoring-pairs pairs of the assumed pool's shape cut at recommend's scoring max_length
     (probes.recipe.REAL.score_length): response tokens/s and peak memory;
   - one probe step as `advisor probe` and `recommend` take it: the real-student recipe
     (probes/recipe.py REAL: batch 8, its max_length, warm-up, constant rate, the size's learning
     rate), its manifest (probes.run.manifest_for) and the Trainer settings of training/trainer_settings.py
     (training_arguments: the Trainer's AdamW, bf16, no gradient checkpointing, as probe manifests
     leave it), on a deep copy of the student while the base stays on the device for base_drift,
     as run_sft does; full fine-tuning at 1.5B, LoRA of rank --lora-r (peft, training.sft._lora:
     all linear layers) at 7B. Every sequence fills max_length (the assumed responses are longer).
     Seconds per step, end to end (one warm-up step left out), and peak memory. If the step runs
     out of memory it is measured again with gradient checkpointing, and the JSON says so;
   - the evaluation's generation, as EvalCallback runs it: greedy, through the hf backend
     (`HFBackend.generate`), on the trained copy with the base and the optimizer state still
     held, on one batch of the size the backend's token budget gives prompts of the pool's length
     plus the recipe's max_new_tokens. The random model has no EOS, so every row runs to the cap;
   - the projection of `advisor recommend` on the assumed pool (`project`, from those figures
     alone): every candidate scored; 2 sets x the recipe's steps; 1 + 2 x (steps / eval_every)
     evaluations of eval_problems x max_new_tokens new tokens, plus what each evaluation scores
     (each generation's answer and its base_drift, both held-out teacher responses per problem)
     at the base's scoring rate. Its peak is the largest of the three measured peaks. Not
     included: loading the model, reading the pool, the checkpoint written at each evaluation,
     the predictor;
2. agreement (a random-init Qwen2-shaped model of --hidden and --layers, or --model): per-response
   mean log-prob from hf in fp32 (the reference), hf in bf16 and vllm in bf16 on the same token
   ids. "Within bf16 tolerance" means vllm's error against the fp32 reference is no more than
   twice hf-bf16's own (plus 1e-3), and the high/low picks over groups of 4 candidates flip no
   more often than hf-bf16's do (plus 2 points);
3. scoring throughput: response tokens per second, hf (bf16, batched, chunked LM head) vs vllm,
   and vs a naive loop (one example at a time, full-vocabulary log-softmax) in the same dtype;
4. generation throughput: new tokens per second sampling --gen-n completions of --gen-prompts
   prompts, hf `generate` vs vllm;
5. memory: hf's peak CUDA memory above the weights for one --long-tokens trace (vLLM reserves a
   fixed share of the GPU up front, so only hf's figure is meaningful).

The pool is an ASSUMPTION, not a measurement (--pool-problems, --candidates, --prompt-tokens,
--response-tokens): 12,000 problems x 4 candidates, 128-token prompts and 4,000-token responses,
as long reasoning traces run. Peak memory is CUDA's allocator peak (torch.cuda.max_memory_allocated)
over each measurement, weights included; on a CPU (--quick) it is the process's resident set,
sampled, which shows only that the path ran.

The JSON: `students.<name>` holds `shape`, `params`, `dtype`, `scoring`, `probe_step`,
`generation` (the measured fields of each are listed in MEASURED) and `projection` (`seconds` per
part, `total_seconds`, `peak_memory_mb`); `projection_inputs` holds the recipe, the scoring
max_length, the assumed pool and the number of sets; the agreement part's figures sit at the top
level (`agreement`, `scoring`, `generation`, `long_trace`), as before; `wall_seconds` is the run's.
"""

import argparse
import copy
import gc
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Student:
    label: str  # the model whose architecture this is
    shape: dict  # Qwen2Config fields, as in the model's public config.json
    lora_r: int  # the probe's --lora-r at this size: 0 = full fine-tuning


STUDENTS = {
    "qwen2.5-1.5b": Student("Qwen2.5-1.5B", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151_936,
                                                  tie_word_embeddings=True), lora_r=0),
    "qwen2.5-7b": Student("Qwen2.5-7B", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                              num_attention_heads=28, num_key_value_heads=4, vocab_size=152_064,
                                              tie_word_embeddings=False), lora_r=16),
}
# --quick: each student keeps its tying and its probe mode; the rest shrinks to what a CPU runs in seconds
QUICK_SHAPE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=4096)
QUICK_LENGTHS = dict(max_length=64, max_new_tokens=16)  # the probe recipe's lengths under --quick
QUICK_SCORE_MAX_LENGTH = 128
# the agreement model's settings (the first part), full and under --quick
AGREEMENT = dict(vocab=151_936, hidden=1024, layers=12, pairs=256, min_response=256, max_response=2048,
                 long_tokens=16384, gen_prompts=64, gen_n=4, gen_tokens=256)
QUICK_AGREEMENT = dict(vocab=2048, hidden=64, layers=1, pairs=8, min_response=8, max_response=24, long_tokens=200,
                       gen_prompts=2, gen_n=2, gen_tokens=4)
SCORING_PAIRS, QUICK_SCORING_PAIRS = 32, 4  # pairs timed per student, of the pool's shape (--scoring-pairs)
TIMED_STEPS, QUICK_TIMED_STEPS = 3, 2  # probe steps timed after one warm-up step
MAX_POSITIONS = 32768  # room for every length used here; the position limit does not change the cost


@dataclass(frozen=True)
class PoolAssumption:
    """The pool `advisor recommend` is projected on: an assumption, not a measurement."""

    problems: int = 12_000
    candidates: int = 4  # teacher responses per problem, all scored
    prompt_tokens: int = 128
    response_tokens: int = 4_000  # long reasoning traces: cut at scoring's and the probe's max_length


QUICK_POOL = PoolAssumption(prompt_tokens=16, response_tokens=120)

# The measured fields of each student, all positive and finite when a measurement ran; the test
# checks them and `project` reads them.
MEASURED = {
    "scoring": ("seconds", "response_tokens_per_s", "forward_tokens_per_s", "peak_memory_mb"),
    "probe_step": ("seconds_per_step", "tokens_per_step", "peak_memory_mb", "resident_memory_mb"),
    "generation": ("seconds", "new_tokens", "new_tokens_per_s", "peak_memory_mb"),
}


def problem(msg: str) -> None:
    print(f"gpu_check: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"gpu_check [{time.perf_counter() - _T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


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


def build_model(path: Path, vocab: int, hidden: int, layers: int, seed: int = 0) -> str:
    """A random-init Qwen2-shaped model with the small tokenizer, saved to `path`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    fast = build_tokenizer()
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                      max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    model = Qwen2ForCausalLM(cfg)
    # random init gives near-uniform predictions; scale the embeddings so scores spread as a trained model's do
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(5)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


def random_pairs(n: int, vocab_in_use: int, seed: int, lo: int, hi: int):
    from capacity_advisor.models.template import Encoded

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, r = rng.randint(32, 128), rng.randint(lo, hi)
        out.append(Encoded([rng.randrange(3, vocab_in_use) for _ in range(p + r)], p, False))
    return out


def flip_rates(a: list[float], b: list[float], group: int = 4) -> tuple[float, float]:
    hi = lo = 0
    groups = range(0, len(a) - group + 1, group)
    for s in groups:
        ga, gb = a[s:s + group], b[s:s + group]
        hi += max(range(group), key=ga.__getitem__) != max(range(group), key=gb.__getitem__)
        lo += min(range(group), key=ga.__getitem__) != min(range(group), key=gb.__getitem__)
    n = max(1, len(groups))
    return hi / n, lo / n


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

    from capacity_advisor.probes.run import ProbeData, manifest_for
    from capacity_advisor.training import sft
    from capacity_advisor.training.data import CompletionCollator, SFTDataset

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cfg = recipe.probe_config(lora_r=student.lora_r, device=device, dtype="auto")
    stub = ProbeData(train={}, eval_prompts=[], eval_answers=[], teacher_high=[], teacher_low=[], checker="math")
    lr = recipe.learning_rate(lm.spec, lm.description["n_params"])[0]
    t = manifest_for("high", cfg, stub, {"spec": lm.spec}, lr, workdir).training
    t = replace(t, max_steps=steps, gradient_checkpointing=t.gradient_checkpointing or checkpointing)
    _, bf16, fp16 = sft.precision(cfg.dtype, cuda=device == "cuda")
    args = sft.training_arguments(t, workdir / "run", t.batch_size // t.grad_accum, device == "cpu", bf16, fp16)
    model = copy.deepcopy(lm.model)  # run_sft trains a copy; the base stays for base_drift
    model.train()
    if t.lora:
        model = sft._lora(model, t.lora, t.seed)
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


def measure_student(name: str, student: Student, shape: dict, recipe, score_max_length: int, pool: PoolAssumption,
                    device: str, n_pairs: int, timed_steps: int, tokenizer) -> dict:
    """Scoring, one probe step and the evaluation's generation of one student shape, alone on `device`."""
    import torch

    from capacity_advisor.training.sft import precision

    dtype = precision("auto", cuda=device == "cuda")[0]
    lm = build_student(name, shape, tokenizer, device, dtype)
    d = lm.description
    out: dict = {"label": student.label, "shape": shape, "params": d["n_params"], "dtype": d["dtype"]}
    say(f"{name}: {d['n_params']:,} parameters built in {d['dtype']}; scoring")
    out["scoring"] = measure_scoring(lm, pool, score_max_length, n_pairs, device)
    workdir = Path(tempfile.mkdtemp(prefix=f"gpu-check-{name}-"))
    say(f"{name}: probe step")
    oom = False
    try:
        trainer, step = _probe_trainer(lm, student, recipe, device, 1 + timed_steps, False, pool, workdir)
    except torch.cuda.OutOfMemoryError:
        oom = True
    if oom:  # the probe as configured does not fit: what gradient checkpointing makes of it
        free(device)
        say(f"{name}: out of memory without gradient checkpointing; again with it")
        trainer, step = _probe_trainer(lm, student, recipe, device, 1 + timed_steps, True, pool, workdir)
    step["out_of_memory_as_configured"] = oom
    out["probe_step"] = step
    say(f"{name}: evaluation generation")
    out["generation"] = measure_generation(trainer, lm, recipe, pool, device)
    del trainer
    del lm
    free(device)
    return out


# ---- the projection ----------------------------------------------------------------------------


def n_evaluations(recipe, strategies: int) -> int:
    """Evaluation points of a probe: the base once (shared by the sets), then each set's schedule."""
    from capacity_advisor.training.callbacks import eval_schedule

    return 1 + strategies * len(eval_schedule(1, recipe.steps, 1, recipe.eval_every))


def project(measured: dict, recipe, pool: PoolAssumption, score_max_length: int, strategies: int) -> dict:
    """Wall time and peak memory of `advisor recommend` on `pool`, from one student's measurements."""
    sc, st, ge = measured["scoring"], measured["probe_step"], measured["generation"]
    scored = min(pool.response_tokens, score_max_length - min(pool.prompt_tokens, score_max_length - 1))
    evals = n_evaluations(recipe, strategies)
    # what each evaluation point scores (training.evaluate): the answer after each generation and
    # base_drift of each generation (prompt + generation), and both held-out teacher responses
    generated = min(pool.prompt_tokens + recipe.max_new_tokens, recipe.max_length)
    reference = min(pool.prompt_tokens + pool.response_tokens, recipe.max_length)
    eval_forward = recipe.eval_problems * (2 * generated + 2 * reference)
    seconds = {
        "scoring": pool.problems * pool.candidates * scored / sc["response_tokens_per_s"],
        "probe_training": strategies * recipe.steps * st["seconds_per_step"],
        "evaluation_generation": evals * recipe.eval_problems * recipe.max_new_tokens / ge["new_tokens_per_s"],
        "evaluation_scoring": evals * eval_forward / sc["forward_tokens_per_s"],
    }
    return {"pool": asdict(pool), "scored_tokens_per_response": scored, "sets": strategies, "steps_per_set": recipe.steps,
            "evaluations": evals, "eval_problems": recipe.eval_problems, "max_new_tokens": recipe.max_new_tokens,
            "seconds": seconds, "total_seconds": sum(seconds.values()),
            "peak_memory_mb": max(sc["peak_memory_mb"], st["peak_memory_mb"], ge["peak_memory_mb"]),
            "not_included": ["loading the model", "reading and tokenizing the pool",
                             "the checkpoint written at each evaluation", "the predictor"]}


def recipe_of(inputs: dict):
    """The probe recipe a result's projection used (its `projection_inputs`)."""
    from capacity_advisor.probes.recipe import ProbeRecipe

    return ProbeRecipe(**inputs["recipe"])


def student_part(args, device: str, res: dict) -> None:
    import torch

    from capacity_advisor.probes.recipe import REAL as REAL_RECIPE
    from capacity_advisor.probes.recipe import REAL
    from capacity_advisor.probes.run import ProbeConfig

    recipe = REAL.with_(**QUICK_LENGTHS) if args.quick else REAL
    score_max_length = QUICK_SCORE_MAX_LENGTH if args.quick else REAL_RECIPE.score_length
    base_pool = QUICK_POOL if args.quick else PoolAssumption()
    pool = PoolAssumption(**{k: getattr(args, k) if getattr(args, k) is not None else v for k, v in asdict(base_pool).items()})
    strategies = len(ProbeConfig().strategies)
    res["projection_inputs"] = {"recipe": {**recipe.as_dict(), "token_budget": recipe.token_budget},
                                "score_max_length": score_max_length, "pool_assumed": asdict(pool), "sets": strategies}
    tokenizer = build_tokenizer()
    res["students"] = {}
    for name in args.students:
        student = STUDENTS[name]
        shape = {**student.shape, **QUICK_SHAPE} if args.quick else dict(student.shape)
        if args.lora_r is not None and student.lora_r:
            student = replace(student, lora_r=args.lora_r)
        try:
            m = measure_student(name, student, shape, recipe, score_max_length, pool, device,
                                args.scoring_pairs or (QUICK_SCORING_PAIRS if args.quick else SCORING_PAIRS),
                                QUICK_TIMED_STEPS if args.quick else TIMED_STEPS, tokenizer)
        except torch.cuda.OutOfMemoryError as e:
            m = {"label": student.label, "shape": shape, "error": f"out of memory: {str(e).splitlines()[0]}"}
        if "error" in m:
            free(device)  # outside the handler, whose traceback still holds the student
            res["students"][name] = m
            say(f"{name}: {m['error']}")
            continue
        m["projection"] = project(m, recipe, pool, score_max_length, strategies)
        res["students"][name] = m
        p = m["projection"]
        say(f"{name}: projected recommend {p['total_seconds'] / 3600:.2f} h, peak {p['peak_memory_mb'] / 1024:.1f} GiB")


# ---- main --------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="model folder or hub id for the agreement part (default: build a random-init one)")
    for k, v in AGREEMENT.items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None, help=f"agreement part (default {v}; smaller with --quick)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--device", default=None,
                    help="cuda (default), or cpu with --quick or with ADVISOR_VLLM_ALLOW_CPU=1 (the tests)")
    ap.add_argument("--hf-only", action="store_true", help="skip vllm: the hf backend's figures alone")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and lengths: the whole path on a CPU in seconds")
    ap.add_argument("--students", default=",".join(STUDENTS),
                    help=f"comma-separated, from {', '.join(STUDENTS)}; 'none' skips the student part")
    ap.add_argument("--scoring-pairs", type=int, default=None,
                    help=f"pairs timed per student (default {SCORING_PAIRS}; {QUICK_SCORING_PAIRS} with --quick)")
    ap.add_argument("--lora-r", type=int, default=None,
                    help=f"LoRA rank of the LoRA-probed students (default {STUDENTS['qwen2.5-7b'].lora_r})")
    for k, v in asdict(PoolAssumption()).items():
        ap.add_argument("--" + k.replace("_", "-").replace("problems", "pool-problems"), dest=k, type=int, default=None,
                        help=f"the assumed pool, timed at its shape and projected on (default {v:,})")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the summary and the table")
    ap.add_argument("--out", default=None, help="write the results JSON here, and the Markdown table beside it (.md)")
    args = ap.parse_args(argv)
    for k, v in (QUICK_AGREEMENT if args.quick else AGREEMENT).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.device = args.device or ("cpu" if args.quick else "cuda")
    args.students = [] if args.students.strip() == "none" else [s.strip() for s in args.students.split(",") if s.strip()]
    if args.out and Path(args.out).suffix == ".md":
        problem(f"--out {args.out}: give the JSON's path; the Markdown table is written beside it (.md)")
    unknown = [s for s in args.students if s not in STUDENTS]
    if unknown:
        problem(f"--students {','.join(unknown)}: use {', '.join(STUDENTS)} or none")
    for k in ("pool_problems", "candidates", "prompt_tokens", "response_tokens", "lora_r", "scoring_pairs"):
        v = getattr(args, "problems" if k == "pool_problems" else k)
        if v is not None and v < 1:
            problem(f"--{k.replace('_', '-')} {v} must be at least 1")

    try:
        import torch
    except ImportError:
        problem("torch is not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        problem("no CUDA GPU is visible: run this on a GPU machine, or pass --quick to check the path on a CPU "
                "(the hf backend's CPU figures are in benchmarks/scoring.py)")
    if not args.hf_only:
        try:
            import vllm  # noqa: F401
        except ImportError:
            problem("vllm is not importable: create its environment first (make vllm-env; docs/vllm.md), "
                    "or pass --hf-only to measure the hf backend alone")

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model

    t_start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    res: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "quick": args.quick,
                 "versions": versions()}
    if args.students:  # first, so that each peak counts nothing but that student's own work
        student_part(args, args.device, res)
    say("agreement model")
    path = args.model or build_model(Path(tmp) / "model", args.vocab, args.hidden, args.layers)
    res["model"] = path
    hf32 = load_model(path, device=args.device, dtype="float32")
    used = min(len(hf32.tokenizer), hf32.description["vocab_size"])
    pairs = random_pairs(args.pairs, used, 0, args.min_response, args.max_response)
    resp_tokens = sum(e.n_response for e in pairs)
    res["params"], res["pairs"], res["response_tokens"] = hf32.description["n_params"], len(pairs), resp_tokens

    ref = [r["logprob_mean"] for r in HFBackend(hf32, token_budget=32768).score_encoded(pairs)]
    del hf32
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    hf16 = load_model(path, device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32")
    hf = HFBackend(hf16, token_budget=32768)
    hf.score_encoded(pairs[:8])  # warm-up
    hf_rows, hf_s = timed(lambda: hf.score_encoded(pairs))
    naive_sums, naive_s = timed(lambda: naive_score(hf16.model, pairs))
    hf_m = [r["logprob_mean"] for r in hf_rows]
    err_hf = max(abs(a - b) for a, b in zip(hf_m, ref))
    flips_hf = flip_rates(ref, hf_m)
    res["agreement"] = {"max_abs_diff_mean_hf_bf16_vs_fp32": err_hf, "flip_rate_high_low_hf_bf16": flips_hf,
                        "max_abs_diff_sum_hf_vs_naive": max(abs(r["logprob_sum"] - x) for r, x in zip(hf_rows, naive_sums))}
    res["scoring"] = {"hf_tokens_per_s": resp_tokens / hf_s, "naive_tokens_per_s": resp_tokens / naive_s,
                      "hf_over_naive": naive_s / hf_s}
    prompts = [f"Problem {i}: what is {i} + {2 * i}? Think step by step." for i in range(args.gen_prompts)]
    kw = dict(max_new_tokens=args.gen_tokens, temperature=1.0, n=args.gen_n, seed=0, details=True)
    hf_gen, hf_gs = timed(lambda: hf.generate(prompts, **kw))
    hf_new = sum(c["n_tokens"] for row in hf_gen for c in row)
    res["generation"] = {"hf_new_tokens_per_s": hf_new / hf_gs, "hf_new_tokens": hf_new}
    long = random_pairs(1, used, 1, args.long_tokens - 128, args.long_tokens - 128)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    long_rows, long_s = timed(lambda: hf.score_encoded(long))
    res["long_trace"] = {
        "tokens": len(long[0].input_ids),
        "hf_peak_extra_mb": (torch.cuda.max_memory_allocated() - base) / 2**20 if args.device == "cuda" else None,
        "naive_logits_fp32_mb": len(long[0].input_ids) * hf16.description["vocab_size"] * 4 / 2**20,
        "hf_seconds": long_s,
    }
    if not args.hf_only:
        from capacity_advisor.models.vllm import VLLMBackend

        # vLLM's memory profiling does not see the (tokens x vocab) prompt-logprob tensors, so keep its batches modest
        vl = VLLMBackend(load_model(path, device=args.device, dtype=hf16.description["dtype"], weights=False),
                         token_budget=8192, gpu_memory_utilization=args.gpu_memory_utilization,
                         max_model_len=max(args.long_tokens, args.max_response + 256) + 8)
        vl.score_encoded(pairs[:8])  # engine start and warm-up
        vl_rows, vl_s = timed(lambda: vl.score_encoded(pairs))
        vl_m = [r["logprob_mean"] for r in vl_rows]
        err_vl = max(abs(a - b) for a, b in zip(vl_m, ref))
        flips_vl = flip_rates(ref, vl_m)
        res["agreement"].update({
            "max_abs_diff_mean_vllm_vs_fp32": err_vl,
            "max_abs_diff_mean_vllm_vs_hf_bf16": max(abs(a - b) for a, b in zip(hf_m, vl_m)),
            "flip_rate_high_low_vllm": flips_vl,
            "within_bf16_tolerance": err_vl <= 2 * err_hf + 1e-3 and max(flips_vl) <= max(flips_hf) + 0.02,
        })
        res["scoring"].update({"vllm_tokens_per_s": resp_tokens / vl_s, "vllm_over_hf": hf_s / vl_s})
        vl_gen, vl_gs = timed(lambda: vl.generate(prompts, **kw))
        vl_new = sum(c["n_tokens"] for row in vl_gen for c in row)
        res["generation"].update({"vllm_new_tokens_per_s": vl_new / vl_gs, "vllm_new_tokens": vl_new,
                                  "vllm_over_hf": (vl_new / vl_gs) / (hf_new / hf_gs)})
        vl_long, vl_long_s = timed(lambda: vl.score_encoded(long))
        res["long_trace"].update({"vllm_seconds": vl_long_s,
                                  "abs_diff_mean_vllm_vs_hf": abs(long_rows[0]["logprob_mean"] - vl_long[0]["logprob_mean"])})
    res["wall_seconds"] = time.perf_counter() - t_start
    write_and_print(args, res)
    return res

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


def summary(res) -> None:
    a, s, g, m = res["agreement"], res["scoring"], res["generation"], res["long_trace"]
    print(f"model {res['model']} ({res['params'] / 1e6:.0f}M params) on {res['device']}; {res['pairs']} pairs, "
          f"{res['response_tokens']} response tokens")
    print(f"agreement: max |Δ mean log-prob| vs fp32: hf-bf16 {a['max_abs_diff_mean_hf_bf16_vs_fp32']:.2e}; "
          f"high/low flips hf-bf16 {a['flip_rate_high_low_hf_bf16']}")
    print(f"scoring: hf {s['hf_tokens_per_s']:.0f} vs naive loop {s['naive_tokens_per_s']:.0f} response tok/s = "
          f"{s['hf_over_naive']:.2f}x")
    print(f"generation: hf {g['hf_new_tokens_per_s']:.0f} new tok/s")
    print(f"long trace {m['tokens']} tokens: hf peak extra {m['hf_peak_extra_mb']} MB vs {m['naive_logits_fp32_mb']:.0f} MB "
          f"for the naive fp32 logits alone")
    if "vllm_tokens_per_s" in s:
        print(f"vllm: max |Δ mean| vs fp32 {a['max_abs_diff_mean_vllm_vs_fp32']:.2e}, flips {a['flip_rate_high_low_vllm']} "
              f"-> within bf16 tolerance: {a['within_bf16_tolerance']}")
        print(f"vllm scoring {s['vllm_tokens_per_s']:.0f} tok/s = {s['vllm_over_hf']:.2f}x hf; generation "
              f"{g['vllm_new_tokens_per_s']:.0f} new tok/s = {g['vllm_over_hf']:.2f}x hf; long trace |Δ| vs hf "
              f"{m['abs_diff_mean_vllm_vs_hf']:.2e}")
    for name, m in res.get("students", {}).items():
        if "error" in m:
            print(f"{name}: {m['error']}")
            continue
        sc, st, ge, pr = m["scoring"], m["probe_step"], m["generation"], m["projection"]
        print(f"{name} ({_params(m['params'])}, {m['dtype']}): scoring {sc['response_tokens_per_s']:.0f} response tok/s; "
              f"probe step ({st['mode']}) {st['seconds_per_step']:.3f} s, peak {st['peak_memory_mb']:.0f} MiB; "
              f"generation {ge['new_tokens_per_s']:.0f} new tok/s at batch {ge['batch_rows']}; projected recommend "
              f"{pr['total_seconds'] / 3600:.2f} h, peak {pr['peak_memory_mb']:.0f} MiB")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "peft", "vllm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = getattr(sys.modules.get(pkg), "__version__", None)
    return out


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


def table(res: dict) -> str:
    """The Markdown of docs/results.md section 3: one row per student, then what the projection assumes."""
    inp = res["projection_inputs"]
    r, pool = inp["recipe"], inp["pool_assumed"]
    evals = next((m["projection"]["evaluations"] for m in res["students"].values() if "projection" in m), "the")
    mem = "peak CUDA memory (max_memory_allocated)" if res["device"] != "cpu" else "peak resident memory of the process (CPU, --quick)"
    lines = [f"`benchmarks/gpu_check.py{' --quick' if res['quick'] else ''}` on {res['device']}; random weights at each "
             f"model's shape, {mem}; torch {res['versions']['torch']}, transformers {res['versions']['transformers']}.", "",
             "| student shape | params | scoring (hf) | one probe step | evaluation generation (hf) | "
             f"projected `advisor recommend`, {pool['problems']:,} problems |",
             "|---|---|---|---|---|---|"]
    shape = " (--quick shape)" if res["quick"] else ""
    for name, m in res["students"].items():
        if "error" in m:
            lines.append(f"| {m['label']}{shape} | — | {m['error']} | | | |")
            continue
        sc, st, ge, pr = m["scoring"], m["probe_step"], m["generation"], m["projection"]
        ps = pr["seconds"]
        fits = " (as configured: out of memory; this is with gradient checkpointing)" if st["out_of_memory_as_configured"] else ""
        lines.append(
            f"| {m['label']}{shape}, {m['dtype']} | {_params(m['params'])} | {sc['response_tokens_per_s']:,.0f} response tok/s; "
            f"peak {_gib(sc['peak_memory_mb'])} | {st['mode']}, {st['batch_size']} × {st['max_length']:,} tokens{fits}: "
            f"{st['seconds_per_step']:.2f} s; peak {_gib(st['peak_memory_mb'])} | {ge['batch_rows']} × "
            f"{ge['max_new_tokens']:,} new tokens: {ge['new_tokens_per_s']:,.0f} tok/s; peak {_gib(ge['peak_memory_mb'])} | "
            f"**{_duration(pr['total_seconds'])}** (scoring {_duration(ps['scoring'])}, probe training "
            f"{_duration(ps['probe_training'])}, evaluations {_duration(ps['evaluation_generation'] + ps['evaluation_scoring'])}); "
            f"peak **{_gib(pr['peak_memory_mb'])}** |")
    lines += ["", f"Projection inputs: the pool is assumed — {pool['problems']:,} problems × {pool['candidates']} candidates, "
              f"{pool['prompt_tokens']:,}-token prompts and {pool['response_tokens']:,}-token responses, scored up to "
              f"{inp['score_max_length']:,} tokens; the probe is probes/recipe.py's real-student recipe: {inp['sets']} sets × "
              f"{r['steps']} steps of {r['batch_size']} sequences of up to {r['max_length']:,} tokens, and "
              f"{evals} evaluations of {r['eval_problems']} problems × up to {r['max_new_tokens']:,} new "
              "tokens (every generation assumed to run to the cap). Not included: loading the model, reading the pool, "
              "the checkpoint written at each evaluation, the predictor."]
    return "\n".join(lines) + "\n"


def write_and_print(args, res) -> None:
    md = table(res) if res.get("students") else None
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        if md:
            out.with_suffix(".md").write_text(md)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    summary(res)
    if md:
        print()
        print(md, end="")


if __name__ == "__main__":
    main()
