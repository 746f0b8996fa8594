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
   random weights, in the dtype the trainer picks (training.trainer_settings.precision: bf16 on a GPU):
   - scoring: `HFBackend.score_encoded` at the device's default token budget, as `advisor score`
     runs it, on --scoring-pairs pairs of the assumed pool's shape cut at recommend's scoring max_length
     (probes.recipe.REAL.score_length): response tokens/s and peak memory;
   - one probe step as `advisor probe` and `recommend` take it: the real-student recipe
     (probes/recipe.py REAL: batch 8, its max_length, warm-up, constant rate, the size's learning
     rate), its manifest (probes.run.manifest_for) and the Trainer settings of training/trainer_settings.py
     (training_arguments: the Trainer's AdamW, bf16, no gradient checkpointing, as probe manifests
     leave it), on a deep copy of the student while the base stays on the device for base_drift,
     as run_sft does; full fine-tuning at 1.5B, LoRA of rank --lora-r (peft, training.trainer_settings.with_lora:
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

This file holds the command line and the student part's order of work (`student_part`,
`measure_student`); the rest lies beside it in benchmarks/: gpu_check_shapes.py (the student
shapes, the --quick sizes, the assumed pool), gpu_check_measure.py (a student built and its
scoring, probe step and generation measured), gpu_check_projection.py (the projection),
gpu_check_agreement.py (parts 2 to 5) and gpu_check_report.py (the summary, the table and the
files written). Every name of those modules is importable from this one as well.
"""

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the names the parts define, all importable from here (the tests load this file alone)
from gpu_check_agreement import agreement_part, build_model, flip_rates, naive_score, random_pairs  # noqa: E402, F401
from gpu_check_measure import (PeakMemory, StepClock, _probe_trainer, _rss_mb, build_student,  # noqa: E402, F401
                               build_tokenizer, filler, free, measure_generation, measure_scoring,
                               memory_now_mb, prompt_text, timed)
from gpu_check_projection import n_evaluations, project, recipe_of  # noqa: E402, F401
from gpu_check_report import _duration, _gib, _params, summary, table, versions, write_and_print  # noqa: E402, F401
from gpu_check_shapes import (AGREEMENT, MAX_POSITIONS, MEASURED, QUICK_AGREEMENT, QUICK_LENGTHS,  # noqa: E402, F401
                              QUICK_POOL, QUICK_SCORE_MAX_LENGTH, QUICK_SCORING_PAIRS, QUICK_SHAPE,
                              QUICK_TIMED_STEPS, SCORING_PAIRS, STUDENTS, TIMED_STEPS, PoolAssumption,
                              Student)


def problem(msg: str) -> None:
    print(f"gpu_check: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"gpu_check [{time.perf_counter() - _T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


# ---- the students ------------------------------------------------------------------------------


def measure_student(name: str, student: Student, shape: dict, recipe, score_max_length: int, pool: PoolAssumption,
                    device: str, n_pairs: int, timed_steps: int, tokenizer) -> dict:
    """Scoring, one probe step and the evaluation's generation of one student shape, alone on `device`."""
    import torch

    from capacity_advisor.training.trainer_settings import precision

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

    t_start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    res: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "quick": args.quick,
                 "versions": versions()}
    if args.students:  # first, so that each peak counts nothing but that student's own work
        student_part(args, args.device, res)
    say("agreement model")
    agreement_part(args, tmp, res)
    res["wall_seconds"] = time.perf_counter() - t_start
    write_and_print(args, res)
    return res


if __name__ == "__main__":
    main()
