"""Scoring benchmark: the hf backend against a naive per-example loop and a matmul roofline, fp32 and bf16.

    .venv/bin/python benchmarks/scoring.py            # ~5 minutes on 2 CPU cores, ~10 GB peak RAM (one child at a time)
    .venv/bin/python benchmarks/scoring.py --quick    # smoke run: few pairs, one round, no lab, short trace
    .venv/bin/python benchmarks/scoring.py --json     # machine-readable

Everything is measured side by side in one run (a shared machine is noisy), so the
figures that matter are ratios; contenders are interleaved within each round and the best of the
rounds is kept:
1. throughput: response tokens per second of `HFBackend.score_encoded` vs a naive loop (one
   example at a time, full fp32 log-softmax over the vocabulary) on the same pairs, with the
   model in fp32 and cast to bf16 (`model.to(torch.bfloat16)`);
2. efficiency: the useful FLOP/s the hf backend achieves (linear layers over every real token,
   causal attention, the LM head over scored positions) as a fraction of a same-run
   torch.matmul measurement of the same dtype;
3. accuracy of bf16: bf16 scores against fp32 scores of the same pairs (|Δ| per pair, rank
   correlation, and how often the high / low pick of a problem changes), on the random-init
   throughput models and on a trained lab student (`lab:m`, a 200-problem modchain pool);
4. memory: peak resident memory above the loaded model when scoring one long trace (8k and 16k
   tokens) with a 150k-token vocabulary, hf backend vs naive, each in a fresh subprocess; the
   naive child runs under an address-space cap (`--naive-cap-gb`) so that a trace it cannot
   hold fails cleanly, and then only a bound is reported.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import subprocess
import sys
import time


import numpy as np
import torch

from capacity_advisor.models.hf import HFBackend
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.models.template import Encoded


class _PadOnly:
    pad_token_id = 0


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


# ---- accuracy of bf16 against fp32 ------------------------------------------------------------
def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    return float(np.corrcoef(ra, rb)[0, 1])


def compare(ref: list[dict], test: list[dict], group: int, texts: list | None = None) -> dict:
    """bf16 (`test`) against fp32 (`ref`) scores of the same pairs.

    Problems are consecutive runs of `group` pairs. A pick "flips" when the candidate chosen by
    argmax (high) or argmin (low) differs between the two; with `texts`, only a change to a
    candidate with a different text counts (identical duplicate candidates are interchangeable).
    """
    d_mean = np.array([abs(r["logprob_mean"] - t["logprob_mean"]) for r, t in zip(ref, test)])
    d_sum = np.array([abs(r["logprob_sum"] - t["logprob_sum"]) for r, t in zip(ref, test)])
    out = {
        "pairs": len(ref), "group": group, "problems": len(ref) // group,
        "max_abs_diff_logprob_mean": float(d_mean.max()), "mean_abs_diff_logprob_mean": float(d_mean.mean()),
        "max_abs_diff_logprob_sum": float(d_sum.max()), "mean_abs_diff_logprob_sum": float(d_sum.mean()),
        "spearman_logprob_mean": spearman([r["logprob_mean"] for r in ref], [t["logprob_mean"] for t in test]),
        "spearman_logprob_sum": spearman([r["logprob_sum"] for r in ref], [t["logprob_sum"] for t in test]),
    }
    n_prob = len(ref) // group
    for key in ("logprob_mean", "logprob_sum"):
        flips = {"high": 0, "low": 0, "high_index": 0, "low_index": 0}
        for p in range(n_prob):
            sl = slice(p * group, (p + 1) * group)
            a = np.array([r[key] for r in ref[sl]])
            b = np.array([t[key] for t in test[sl]])
            tx = texts[sl] if texts is not None else list(range(group))
            for pick, fn in (("high", np.argmax), ("low", np.argmin)):
                i, j = int(fn(a)), int(fn(b))
                flips[pick + "_index"] += i != j
                flips[pick] += tx[i] != tx[j]
        out[f"flip_rate_{key}"] = {k: v / n_prob for k, v in flips.items()}
    return out


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
    from capacity_advisor.models.lab.pool import pool_rows
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


# ---- 4: memory of one long trace ----------------------------------------------------------------
def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory_child(mode: str, tokens: int, vocab: int, cap_gb: float) -> None:
    """Runs in a fresh process: load, measure RSS, score one long trace, report peak growth.

    With `cap_gb` > 0 the process's address space is capped (RLIMIT_AS), so an allocation that
    would pass it fails with an error instead of pushing the machine into swap or the OOM killer.
    """
    import resource
    import threading

    if cap_gb > 0:
        cap = int(cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.set_num_threads(1)
    lm = build(hidden=64, layers=2, vocab=vocab, inter=128, heads=4)
    e = Encoded([random.Random(0).randrange(1, vocab) for _ in range(tokens)], 64, False)

    base = _rss_kb()
    peak = [base]
    done = threading.Event()

    def poll():  # ru_maxrss cannot be reset after loading, so sample the resident set while scoring
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kb())
            time.sleep(0.002)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    t = time.perf_counter()
    error = None
    val = None
    try:
        if mode == "hf":
            val = HFBackend(lm).score_encoded([e])[0]["logprob_sum"]
        else:
            val = naive_score(lm, [e])[0]
    except (MemoryError, RuntimeError) as exc:  # torch reports a refused allocation as RuntimeError
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    secs = time.perf_counter() - t
    done.set()
    watcher.join()
    peak[0] = max(peak[0], _rss_kb())
    refused = None
    if error:
        m = re.search(r"allocate (\d+) bytes", error)
        refused = int(m.group(1)) if m else None
    print(json.dumps({"mode": mode, "tokens": tokens, "vocab": vocab, "peak_growth_mb": (peak[0] - base) / 1024,
                      "seconds": secs, "logprob_sum": val, "error": error, "refused_bytes": refused,
                      "cap_gb": cap_gb if cap_gb > 0 else None}))


def _run_child(mode: str, tokens: int, vocab: int, cap_gb: float) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--memory-child", mode, "--long-tokens", str(tokens),
                           "--vocab", str(vocab), "--naive-cap-gb", str(cap_gb)], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"mode": mode, "tokens": tokens, "error": f"child exited {proc.returncode}: {tail}", "peak_growth_mb": None,
                "refused_bytes": None, "logprob_sum": None, "seconds": None, "cap_gb": cap_gb}
    return json.loads(lines[-1])


def memory(args) -> list[dict]:
    out = []
    for tokens in args.long_tokens:  # one child at a time: the naive one may take most of the machine
        hf = _run_child("hf", tokens, args.vocab, 0)
        naive = _run_child("naive", tokens, args.vocab, args.naive_cap_gb)
        row = {"tokens": tokens, "vocab": args.vocab, "naive_cap_gb": args.naive_cap_gb,
               "hf_peak_mb": hf["peak_growth_mb"], "hf_seconds": hf["seconds"], "hf_error": hf["error"],
               "naive_peak_mb": naive["peak_growth_mb"], "naive_seconds": naive["seconds"], "naive_error": naive["error"],
               "naive_refused_mb": naive["refused_bytes"] / 2**20 if naive["refused_bytes"] else None,
               "logits_fp32_mb": tokens * args.vocab * 4 / 2**20}
        if hf["error"] is None and naive["error"] is None:
            row.update({"naive_is_bound": False, "hf_over_naive": hf["peak_growth_mb"] / naive["peak_growth_mb"],
                        "abs_diff_logprob_sum": abs(hf["logprob_sum"] - naive["logprob_sum"])})
        elif hf["error"] is None and naive["peak_growth_mb"] is not None:
            # The naive child stopped at a refused allocation. Its peak resident growth is at least
            # what it held when refused plus the refused block (which it would have written in full);
            # without the size in the message, only what it held.
            lower = naive["peak_growth_mb"] + (row["naive_refused_mb"] or 0.0)
            row.update({"naive_is_bound": True, "naive_peak_lower_bound_mb": lower,
                        "hf_over_naive_upper_bound": hf["peak_growth_mb"] / lower,
                        "hf_over_cap": hf["peak_growth_mb"] / (args.naive_cap_gb * 1024), "abs_diff_logprob_sum": None})
        out.append(row)
    return out


# ---- report -------------------------------------------------------------------------------------
def _flip_line(acc: dict, key: str) -> str:
    f = acc[f"flip_rate_{key}"]
    return (f"high pick {100 * f['high']:.1f}%, low pick {100 * f['low']:.1f}% of {acc['problems']} problems"
            + ("" if f["high"] == f["high_index"] and f["low"] == f["low_index"] else
               f" (by index, counting duplicate texts: {100 * f['high_index']:.1f}% / {100 * f['low_index']:.1f}%)"))


def _acc_lines(acc: dict, indent: str = "    ") -> list[str]:
    return [
        f"{indent}|Δ logprob_mean| per pair: max {acc['max_abs_diff_logprob_mean']:.2e}, mean {acc['mean_abs_diff_logprob_mean']:.2e}; "
        f"max |Δ logprob_sum| {acc['max_abs_diff_logprob_sum']:.2e}",
        f"{indent}Spearman rho of logprob_mean over {acc['pairs']} pairs: {acc['spearman_logprob_mean']:.4f} "
        f"(logprob_sum: {acc['spearman_logprob_sum']:.4f})",
        f"{indent}picks that change, {acc['group']} candidates per problem, by logprob_mean: {_flip_line(acc, 'logprob_mean')}",
        f"{indent}                                            by logprob_sum:  {_flip_line(acc, 'logprob_sum')}",
    ]


def report(res: dict) -> None:
    for t in res.get("throughput", []):
        b = t["bf16"]
        print(f"model: Llama, {t['params'] / 1e6:.1f}M params (vocab {t['vocab']}), {t['threads']} threads; "
              f"{t['pairs']} pairs, {t['response_tokens']} response tokens; best of {t['rounds']} interleaved rounds")
        print(f"  fp32 hf backend  {t['hf_tokens_per_s']:10.0f} response tok/s")
        print(f"  fp32 naive loop  {t['naive_tokens_per_s']:10.0f} response tok/s")
        print(f"  fp32 speed-up    {t['speedup_vs_naive']:10.2f}x   (target >= 3x)")
        print(f"  fp32 useful FLOP/s {t['hf_flops_per_s'] / 1e9:8.1f} GFLOP/s = {100 * t['fraction_of_matmul']:.0f}% of same-run "
              f"fp32 matmul ({t['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)   (target >= 65%)")
        print(f"  fp32 max |hf - naive| logprob_sum: {t['max_abs_diff_logprob_sum']:.2e}")
        print(f"  bf16 hf backend  {b['hf_tokens_per_s']:10.0f} response tok/s = {b['ratio_vs_fp32_hf']:.2f}x fp32 hf")
        print(f"  bf16 naive loop  {b['naive_tokens_per_s']:10.0f} response tok/s = {b['ratio_vs_fp32_naive']:.2f}x fp32 naive")
        print(f"  bf16 speed-up    {b['speedup_vs_naive']:10.2f}x   (hf bf16 vs naive bf16)")
        print(f"  bf16 useful FLOP/s {b['hf_flops_per_s'] / 1e9:8.1f} GFLOP/s = {100 * b['fraction_of_matmul']:.0f}% of same-run "
              f"bf16 matmul ({b['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s; {100 * b['fraction_of_fp32_matmul']:.0f}% of the fp32 one)")
        print(f"  bf16 max |hf - naive bf16| logprob_sum: {b['max_abs_diff_logprob_sum_vs_naive_bf16']:.2e}")
        print("  bf16 vs fp32 scores of the same pairs (random-init model):")
        print("\n".join(_acc_lines(b["accuracy_vs_fp32"])))
    if "lab" in res:
        a = res["lab"]
        print(f"trained lab student {a['model']} ({a['params']:,} params), {a['pool']} "
              f"({a['duplicate_text_problems']} problems hold duplicate texts), {a['response_tokens']} response tokens: bf16 vs fp32")
        print("\n".join(_acc_lines(a, "  ")))
    if "budget_sweep" in res:
        w = res["budget_sweep"]
        print(f"token-budget sweep, fp32, {w['params'] / 1e6:.1f}M params (vocab {w['vocab']}), {w['pairs']} pairs, "
              f"{w['response_tokens']} response tokens, best of {w['rounds']} interleaved rounds; naive loop {w['naive_tokens_per_s']:.0f} tok/s")
        for b in w["budgets"]:
            print(f"  hf --token-budget {b['token_budget']:6d}  {b['hf_tokens_per_s']:8.0f} response tok/s = {b['speedup_vs_naive']:.2f}x naive")
    for m in res.get("memory", []):
        head = f"long trace: {m['tokens']} tokens, vocab {m['vocab']} (fp32 logits alone {m['logits_fp32_mb']:.0f} MB): peak RSS growth "
        if m["hf_error"]:
            print(head + f"hf FAILED ({m['hf_error']}); naive {m['naive_peak_mb']} MB ({m['naive_error']})")
        elif not m.get("naive_is_bound", True):
            print(head + f"hf {m['hf_peak_mb']:.0f} MB vs naive {m['naive_peak_mb']:.0f} MB = {100 * m['hf_over_naive']:.1f}%   "
                  f"(target <= 10%); |diff| {m['abs_diff_logprob_sum']:.2e}; naive under a {m['naive_cap_gb']:g} GB address-space cap")
        elif "naive_peak_lower_bound_mb" in m:
            refused = (f"allocation of {m['naive_refused_mb'] / 1024:.2f} GB refused" if m["naive_refused_mb"]
                       else "allocation refused, size not reported")
            print(head + f"hf {m['hf_peak_mb']:.0f} MB vs naive > cap: under a {m['naive_cap_gb']:g} GB address-space cap the naive "
                  f"loop failed ({refused}) holding {m['naive_peak_mb']:.0f} MB, so naive >= {m['naive_peak_lower_bound_mb']:.0f} MB "
                  f"(bound) and hf/naive <= {100 * m['hf_over_naive_upper_bound']:.1f}% (bound; < hf/cap = "
                  f"{100 * m['hf_over_cap']:.1f}%)   (target <= 10%)")
            print(f"  naive error: {m['naive_error']}")
        else:
            print(head + f"hf {m['hf_peak_mb']:.0f} MB; naive FAILED without a measurement: {m['naive_error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=None, help="pairs for throughput (default 96; 12 with --quick)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds, best kept (default 2; 1 with --quick)")
    ap.add_argument("--token-budget", type=int, default=None, help="hf padded tokens per batch (default: the backend's, 1,024 on CPU)")
    ap.add_argument("--long-tokens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma list of trace lengths for the memory test (default 8192,16384; 2048 with --quick)")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--naive-cap-gb", type=float, default=14.0,
                    help="address-space cap (RLIMIT_AS) of the naive memory child; 0 = none")
    ap.add_argument("--throughput-vocabs", type=lambda s: [int(x) for x in s.split(",")], default=[8000, 32000],
                    help="vocabularies of the throughput model (8000 keeps it ~15M params for the roofline)")
    ap.add_argument("--lab-model", default="m", help="lab student for the bf16 accuracy test (built on first use)")
    ap.add_argument("--lab-problems", type=int, default=200)
    ap.add_argument("--budget-sweep", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="also time the fp32 hf backend at these token budgets vs the naive loop (first throughput vocab)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-lab", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smoke run: 12 pairs, one round, no lab, a 2048-token trace")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--memory-child", choices=["hf", "naive"])
    args = ap.parse_args()
    if args.pairs is None:
        args.pairs = 12 if args.quick else 96
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.long_tokens is None:
        args.long_tokens = [2048] if args.quick else [8192, 16384]
    if args.memory_child:
        return memory_child(args.memory_child, args.long_tokens[0], args.vocab,
                            args.naive_cap_gb if args.memory_child == "naive" else 0)
    res = {} if args.skip_throughput else {"throughput": [throughput(args, v) for v in args.throughput_vocabs]}
    if args.budget_sweep:
        res["budget_sweep"] = budget_sweep(args)
    if not (args.quick or args.skip_lab):
        res["lab"] = lab_accuracy(args)
    if not args.skip_memory:
        res["memory"] = memory(args)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        report(res)


if __name__ == "__main__":
    main()
