"""gpu_check's report: the plain-text summary and the Markdown table of docs/results.md section 3
(`table`: one row per student, then what the projection assumes), both printed on stdout; the
package versions a result records; and `write_and_print`, which writes the JSON to --out with the
table beside it (the same name with the suffix .md), or with --json prints the JSON alone.
"""

import json
import sys
from pathlib import Path


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
