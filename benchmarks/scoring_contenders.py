"""The scoring benchmark's contenders and their measurement (parts 1 to 3 of benchmarks/scoring.py).

The contenders: `HFBackend.score_encoded` and a naive loop (`naive_score`: one example at a
time, full fp32 log-softmax over the vocabulary) on random-init Llama models (`build`, cast to
bf16 by `cast`) and random pairs (`make_pairs`), beside a same-run torch.matmul roofline
(`matmul_flops_per_s`) against which `useful_flops` is set. The measurements: `throughput` (fp32
and bf16, interleaved rounds, best kept, with bf16's accuracy against fp32), `budget_sweep` (the
fp32 hf backend at several token budgets) and `lab_accuracy` (bf16 against fp32 on a trained lab
student and a lab pool).
"""

from __future__ import annotations

import copy
import random
import time

import torch

from capacity_advisor.models.hf import HFBackend
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.models.template import Encoded
from benchmarks.scoring_accuracy import compare


class _PadOnly:
    """The tokenizer the benchmark's scorers need: a pad id, and token ids written as text (for the
    response-start cue every score row carries)."""

    pad_token_id = 0

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def build(hidden: int, layers: int, vocab: int, inter: int, heads: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=32768,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    return LoadedModel(model, _PadOnly(), torch.device("cpu"), "bench", None, {})


def cast(lm: LoadedModel, dtype) -> LoadedModel:
    """A deep copy of `lm` with its weights cast to `dtype` (the original is left as it is)."""
    out = copy.copy(lm)
    out.model = copy.deepcopy(lm.model).to(dtype)
    return out


def make_pairs(n: int, vocab: int, seed: int = 0) -> list[Encoded]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, r = rng.randint(32, 96), rng.randint(64, 448)
        out.append(Encoded([rng.randrange(1, vocab) for _ in range(p + r)], p, False))
    return out


def useful_flops(model, pairs: list[Encoded]) -> float:
    cfg = model.config
    h, v = cfg.hidden_size, cfg.vocab_size
    linear = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "lm_head" not in n)
    total = 0.0
    for e in pairs:
        t = len(e.input_ids)
        total += 2 * linear * t  # every linear layer, every real token
        total += cfg.num_hidden_layers * 2 * h * t * (t + 1)  # QK^T and AV, causal: sum over positions of 4*h*pos
        total += 2 * h * v * e.n_response  # LM head where a response token is predicted
    return total


def naive_score(lm, pairs: list[Encoded]) -> list[float]:
    out = []
    with torch.inference_mode():
        for e in pairs:
            ids = torch.tensor([e.input_ids])
            logp = lm.model(ids).logits.float().log_softmax(-1)[0]
            tgt = ids[0, e.n_prompt:]
            out.append(logp[e.n_prompt - 1:-1].gather(1, tgt[:, None]).sum().item())
    return out


def matmul_flops_per_s(n: int = 2048, repeats: int = 5, dtype=torch.float32) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


# ---- 1-3: throughput, efficiency, bf16 accuracy -----------------------------------------------
def throughput(args, vocab: int) -> dict:
    lm = build(hidden=320, layers=6, vocab=vocab, inter=1280, heads=5)
    lm_bf = cast(lm, torch.bfloat16)
    n_params = sum(p.numel() for p in lm.model.parameters())
    pairs = make_pairs(args.pairs, vocab)
    resp_tokens = sum(e.n_response for e in pairs)
    flops = useful_flops(lm.model, pairs)
    be, be_bf = HFBackend(lm, token_budget=args.token_budget), HFBackend(lm_bf, token_budget=args.token_budget)  # None: the default
    for b, m in ((be, lm), (be_bf, lm_bf)):  # warm-up
        b.score_encoded(pairs[:8])
        naive_score(m, pairs[:2])
    results = {"vocab": vocab, "params": n_params, "pairs": len(pairs), "response_tokens": resp_tokens,
               "threads": torch.get_num_threads(), "rounds": args.rounds}
    best = {"hf": float("inf"), "naive": float("inf"), "hf_bf16": float("inf"), "naive_bf16": float("inf"),
            "matmul": 0.0, "matmul_bf16": 0.0}

    def timed(name, fn):
        t = time.perf_counter()
        r = fn()
        best[name] = min(best[name], time.perf_counter() - t)
        return r

    # interleave the contenders so load from other processes hits all of them alike
    for _ in range(args.rounds):
        best["matmul"] = max(best["matmul"], matmul_flops_per_s())
        best["matmul_bf16"] = max(best["matmul_bf16"], matmul_flops_per_s(dtype=torch.bfloat16))
        hf_rows = timed("hf", lambda: be.score_encoded(pairs))
        ref = timed("naive", lambda: naive_score(lm, pairs))
        bf_rows = timed("hf_bf16", lambda: be_bf.score_encoded(pairs))
        ref_bf = timed("naive_bf16", lambda: naive_score(lm_bf, pairs))
    err = max(abs(r["logprob_sum"] - x) for r, x in zip(hf_rows, ref))
    err_bf = max(abs(r["logprob_sum"] - x) for r, x in zip(bf_rows, ref_bf))
    results.update({
        "hf_tokens_per_s": resp_tokens / best["hf"],
        "naive_tokens_per_s": resp_tokens / best["naive"],
        "speedup_vs_naive": best["naive"] / best["hf"],
        "hf_flops_per_s": flops / best["hf"],
        "matmul_flops_per_s": best["matmul"],
        "fraction_of_matmul": flops / best["hf"] / best["matmul"],
        "max_abs_diff_logprob_sum": err,
        "bf16": {
            "hf_tokens_per_s": resp_tokens / best["hf_bf16"],
            "naive_tokens_per_s": resp_tokens / best["naive_bf16"],
            "speedup_vs_naive": best["naive_bf16"] / best["hf_bf16"],
            "ratio_vs_fp32_hf": best["hf"] / best["hf_bf16"],
            "ratio_vs_fp32_naive": best["naive"] / best["naive_bf16"],
            "hf_flops_per_s": flops / best["hf_bf16"],
            "matmul_flops_per_s": best["matmul_bf16"],
            "fraction_of_matmul": flops / best["hf_bf16"] / best["matmul_bf16"],
            "fraction_of_fp32_matmul": flops / best["hf_bf16"] / best["matmul"],
            "max_abs_diff_logprob_sum_vs_naive_bf16": err_bf,
            "accuracy_vs_fp32": compare(hf_rows, bf_rows, group=4),
        },
    })
    return results


def budget_sweep(args) -> dict:
    """fp32 hf backend at several token budgets (padded tokens per forward batch) vs the naive loop."""
    vocab = args.throughput_vocabs[0]
    lm = build(hidden=320, layers=6, vocab=vocab, inter=1280, heads=5)
    pairs = make_pairs(args.pairs, vocab)
    resp_tokens = sum(e.n_response for e in pairs)
    bes = {tb: HFBackend(lm, token_budget=tb) for tb in args.budget_sweep}
    for b in bes.values():
        b.score_encoded(pairs[:8])
    naive_score(lm, pairs[:2])
    best = {tb: float("inf") for tb in bes}
    best["naive"] = float("inf")
    for _ in range(args.rounds):  # interleaved, best of rounds
        for tb, b in bes.items():
            t = time.perf_counter()
            b.score_encoded(pairs)
            best[tb] = min(best[tb], time.perf_counter() - t)
        t = time.perf_counter()
        naive_score(lm, pairs)
        best["naive"] = min(best["naive"], time.perf_counter() - t)
    return {"vocab": vocab, "params": sum(p.numel() for p in lm.model.parameters()), "pairs": len(pairs),
            "response_tokens": resp_tokens, "rounds": args.rounds, "naive_tokens_per_s": resp_tokens / best["naive"],
            "budgets": [{"token_budget": tb, "hf_tokens_per_s": resp_tokens / best[tb], "speedup_vs_naive": best["naive"] / best[tb]}
                        for tb in bes]}


def lab_accuracy(args) -> dict:
    """bf16 vs fp32 scores of a trained lab student on a lab pool (6 candidates per problem)."""
    from capacity_advisor.advisor.pools.lab import pool_rows
    from capacity_advisor.models.loading import load_model

    t0 = time.perf_counter()
    lm = load_model(f"lab:{args.lab_model}", device="cpu", dtype="float32")
    load_s = time.perf_counter() - t0
    rows = pool_rows("modchain", n=args.lab_problems, candidates=6, seed=0)
    pairs = [(r["problem"], g) for r in rows for g in r["generations"]]
    texts = [g for r in rows for g in r["generations"]]
    lm_bf = cast(lm, torch.bfloat16)
    be, be_bf = HFBackend(lm), HFBackend(lm_bf)
    fp = be.score(pairs, max_length=512)
    bf = be_bf.score(pairs, max_length=512)
    res = compare(fp, bf, group=6, texts=texts)
    res.update({"model": f"lab:{args.lab_model}", "params": sum(p.numel() for p in lm.model.parameters()),
                "pool": f"modchain, {len(rows)} problems x 6 candidates, seed 0",
                "duplicate_text_problems": sum(len(set(r["generations"])) < len(r["generations"]) for r in rows),
                "response_tokens": sum(r["n_tokens"] for r in fp), "load_seconds": load_s})
    return res
