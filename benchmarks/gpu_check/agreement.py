"""gpu_check's agreement part: hf in fp32, hf in bf16 and vllm in bf16 on one random-init model.

`agreement_part` builds a random-init Qwen2-shaped model of --hidden and --layers (or loads
--model) and measures, on the same token ids: the per-response mean log-prob of each against
hf-fp32 (the reference) and how often the high / low picks over groups of 4 flip; scoring
throughput, hf against a naive per-example loop (`naive_score`) and against vllm; generation
throughput; and hf's peak CUDA memory above the weights for one long trace. vllm is left out
with --hf-only. Its figures go to the top level of the result: `model`, `params`, `pairs`,
`response_tokens`, `agreement`, `scoring`, `generation`, `long_trace`.
"""

import random
from pathlib import Path

from benchmarks.gpu_check.measure import build_tokenizer, naive_score, timed
from benchmarks.gpu_check.shapes import MAX_POSITIONS


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


def agreement_part(args, tmp: str, res: dict) -> None:
    """Parts 2 to 5 of the run on the agreement model; their figures are added to `res`."""
    import torch

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model

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
