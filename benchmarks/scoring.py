"""Scoring benchmark: the hf backend against a naive per-example loop and a matmul roofline, fp32 and bf16.

    .venv/bin/python -m benchmarks.scoring            # ~5 minutes on 2 CPU cores, ~10 GB peak RAM (one child at a time)
    .venv/bin/python -m benchmarks.scoring --quick    # smoke run: few pairs, one round, no lab, short trace
    .venv/bin/python -m benchmarks.scoring --json     # machine-readable

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

This file holds the command line and the report; the parts lie beside it in benchmarks/:
scoring_contenders.py (the models, the pairs, the naive loop, the roofline; parts 1 to 3),
scoring_accuracy.py (bf16 against fp32) and scoring_memory.py (part 4 and its child processes,
which run this file with --memory-child). Every name of those modules is importable from this
one as well.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.scoring_contenders import budget_sweep, lab_accuracy, throughput
from benchmarks.scoring_memory import memory, memory_child


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
