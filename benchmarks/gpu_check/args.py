"""gpu_check's command line: its flags (`parse_args`), their checks (`check_args`) and what the
machine must have (`check_environment`); each refusal is one `error:` line and exit status 2,
before any work.
"""

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks.gpu_check.shapes import (AGREEMENT, E2E_STUDENT, GEN_TIMED_TOKENS, QUICK_AGREEMENT, QUICK_SCORING_PAIRS,
                              SCORING_PAIRS, STUDENTS, PoolAssumption)


def problem(msg: str) -> None:
    print(f"gpu_check: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv, description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
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
    ap.add_argument("--e2e", default=None,
                    help=f"the student whose shape runs `advisor recommend` end to end (default {E2E_STUDENT} when it is "
                         "measured); 'none' skips it")
    ap.add_argument("--scoring-pairs", type=int, default=None,
                    help=f"pairs timed per student (default {SCORING_PAIRS}; {QUICK_SCORING_PAIRS} with --quick)")
    ap.add_argument("--eval-gen-tokens", type=int, default=GEN_TIMED_TOKENS,
                    help=f"new tokens timed in the evaluation's generation (default {GEN_TIMED_TOKENS}; 4 with --quick)")
    ap.add_argument("--lora-r", type=int, default=None,
                    help=f"LoRA rank of the LoRA-probed students (default {STUDENTS['qwen2.5-7b'].lora_r})")
    for k, v in asdict(PoolAssumption()).items():
        ap.add_argument("--" + k.replace("_", "-").replace("problems", "pool-problems"), dest=k, type=int, default=None,
                        help=f"the assumed pool, timed at its shape and projected on (default {v:,})")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip a part that is expected to end past this many seconds (PART_SECONDS); default: no limit")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the summary and the table")
    ap.add_argument("--out", default=None, help="write the results JSON here, and the Markdown table beside it (.md)")
    return ap.parse_args(argv)


def check_args(args) -> None:
    """Settle the defaults and refuse a bad value in one `error:` line, before any work."""
    for k, v in (QUICK_AGREEMENT if args.quick else AGREEMENT).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.device = args.device or ("cpu" if args.quick else "cuda")
    args.students = [] if args.students.strip() == "none" else [s.strip() for s in args.students.split(",") if s.strip()]
    if args.e2e is None:  # the default follows the students measured
        args.e2e = E2E_STUDENT if E2E_STUDENT in args.students else None
    elif args.e2e.strip() == "none":
        args.e2e = None
    else:
        args.e2e = args.e2e.strip()
    if args.out and Path(args.out).suffix == ".md":
        problem(f"--out {args.out}: give the JSON's path; the Markdown table is written beside it (.md)")
    unknown = [s for s in args.students if s not in STUDENTS]
    if unknown:
        problem(f"--students {','.join(unknown)}: use {', '.join(STUDENTS)} or none")
    if args.e2e is not None and args.e2e not in args.students:
        problem(f"--e2e {args.e2e}: name one of the measured students ({', '.join(args.students) or 'none'}) or none")
    for k in ("pool_problems", "candidates", "prompt_tokens", "response_tokens", "lora_r", "scoring_pairs", "eval_gen_tokens"):
        v = getattr(args, "problems" if k == "pool_problems" else k)
        if v is not None and v < 1:
            problem(f"--{k.replace('_', '-')} {v} must be at least 1")
    if args.budget_s is not None and not args.budget_s > 0:
        problem(f"--budget-s {args.budget_s:g} must be a positive number of seconds")
    if args.out:
        from benchmarks.gpu_check.report import check_out

        why = check_out(args.out)
        if why:
            problem(f"--out {args.out}: {why}")


def check_environment(args):
    """torch, CUDA (unless --quick or --device cpu), transformers' version, vllm (unless --hf-only)."""
    try:
        import torch
    except ImportError:
        problem("torch is not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        problem("no CUDA GPU is visible: run this on a GPU machine, or pass --quick to check the path on a CPU "
                "(the hf backend's CPU figures are in benchmarks/scoring.py)")
    try:
        from capacity_advisor.core.errors import InputError
        from capacity_advisor.models.loading import check_transformers
    except ImportError as e:
        problem(f"the project is not importable ({e}): install it (pip install --no-deps -e .), or run "
                "`python3 -m benchmarks.gpu_check.bare`, which installs it into a scratch folder")
    try:
        check_transformers()
    except InputError as e:
        problem(str(e))
    if not args.hf_only:
        try:
            import vllm  # noqa: F401
        except ImportError:
            problem("vllm is not importable: create its environment first (make vllm-env; docs/vllm.md), "
                    "or pass --hf-only to measure the hf backend alone")
    return torch
