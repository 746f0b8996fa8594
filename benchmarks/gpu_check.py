"""GPU check: the hf and vllm backends on one model, side by side — agreement and speed.

    python benchmarks/gpu_check.py                      # random-init ~0.2B Qwen2-shaped model, built locally
    python benchmarks/gpu_check.py --model ./my-model   # a real model folder (or hub id, where reachable)
    python benchmarks/gpu_check.py --json --out results.json

Needs CUDA and vllm (its own environment: docs/vllm.md); without them it says which is missing
and exits 2. `--hf-only` measures the hf backend alone (CUDA without vllm). Measured in one run, so the ratios hold on a shared machine:

1. agreement: per-response mean log-prob from hf in fp32 (the reference), hf in bf16 and vllm in
   bf16 on the same token ids. "Within bf16 tolerance" means vllm's error against the fp32
   reference is no more than twice hf-bf16's own (plus 1e-3), and the high/low picks over groups
   of 4 candidates flip no more often than hf-bf16's do (plus 2 points);
2. scoring throughput: response tokens per second, hf (bf16, batched, chunked LM head) vs vllm,
   and vs a naive loop (one example at a time, full-vocabulary log-softmax) in the same dtype;
3. generation throughput: new tokens per second sampling --gen-n completions of --gen-prompts
   prompts, hf `generate` vs vllm;
4. memory: hf's peak CUDA memory above the weights for one --long-tokens trace (vLLM reserves a
   fixed share of the GPU up front, so only hf's figure is meaningful).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path



def problem(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr)
    raise SystemExit(2)


def build_model(path: Path, vocab: int, hidden: int, layers: int, seed: int = 0) -> str:
    """A random-init Qwen2-shaped model with a small trained byte-level tokenizer (no download)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
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
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                      max_position_embeddings=32768, tie_word_embeddings=True,
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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder or hub id (default: build a random-init one)")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--min-response", type=int, default=256)
    ap.add_argument("--max-response", type=int, default=2048)
    ap.add_argument("--long-tokens", type=int, default=16384)
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-n", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--device", default="cuda", help="cuda (cpu only with ADVISOR_VLLM_ALLOW_CPU=1, for the tests)")
    ap.add_argument("--hf-only", action="store_true", help="skip vllm: the hf backend's figures alone")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="also write the results JSON here")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        problem("torch is not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        problem("no CUDA GPU is visible: run this on a GPU machine (the hf backend's CPU figures are in benchmarks/scoring.py)")
    if not args.hf_only:
        try:
            import vllm  # noqa: F401
        except ImportError:
            problem("vllm is not importable: create its environment first (make vllm-env; docs/vllm.md), "
                    "or pass --hf-only to measure the hf backend alone")

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model

    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    path = args.model or build_model(Path(tmp) / "model", args.vocab, args.hidden, args.layers)
    res: dict = {"model": path, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                 "versions": {"torch": torch.__version__, "vllm": getattr(sys.modules.get("vllm"), "__version__", "?")}}
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
    report(args, res)
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


def report(args, res) -> None:
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    if args.json:
        print(json.dumps(res, indent=2))
        return
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


if __name__ == "__main__":
    main()
