"""The scoring benchmark's memory measurement (part 4 of benchmarks/scoring.py): one long trace.

`memory` runs, for each --long-tokens length, one fresh child process per contender, one at a
time: `python -m benchmarks.scoring --memory-child hf|naive`, which runs `memory_child`. A child loads a
small model with a large vocabulary, samples its resident set while scoring the trace and prints
one JSON line with its peak growth; the naive child runs under an address-space cap
(--naive-cap-gb), so a trace it cannot hold fails cleanly and only a bound is reported.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.scoring_contenders import build, naive_score
from capacity_advisor.models.hf import HFBackend
from capacity_advisor.models.template import Encoded

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks.scoring` finds its package


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
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scoring", "--memory-child", mode, "--long-tokens", str(tokens),
                           "--vocab", str(vocab), "--naive-cap-gb", str(cap_gb)], capture_output=True, text=True, cwd=ROOT)
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
