"""GPU check: the hf backend at the paper's student sizes, one real `advisor recommend`, their cost
in GPU-hours, and vllm beside hf.

    python -m benchmarks.gpu_check --hf-only --out gpu-check.json   # one GPU, no vllm needed
    python -m benchmarks.gpu_check --out gpu-check.json             # also vllm against hf (its environment: docs/vllm.md)
    python -m benchmarks.gpu_check --quick --hf-only                # the whole path at tiny shapes on a CPU, in seconds
    python -m benchmarks.gpu_check.bare OUT                         # a bare checkout on a GPU machine (docs/gpu-check.md)

Needs one CUDA GPU (and vllm, unless --hf-only); without them it says which is missing in one
`error:` line and exits 2. `--quick` shrinks every shape and length so that the path runs on a
CPU: its figures check the code and describe no GPU. Nothing is downloaded: every model is built
here with random weights. The JSON goes to --out, the Markdown for docs/results.md section 3 beside
it (the same name with the suffix .md); both are rewritten as each measurement ends, so a run
stopped early leaves what it finished. A part that would end past --budget-s (from PART_SECONDS,
its expected seconds on one H200-class GPU) is skipped and the JSON says so.

In one process, in this order:

1. each student (--students; `none` skips them), alone on the device: Qwen2.5-1.5B and Qwen2.5-7B
   built from the numbers of their public config.json with random weights, in the dtype the
   trainer picks (training.trainer_settings.precision: bf16 on a GPU):
   - scoring: `HFBackend.score_encoded` at the device's default token budget, as `advisor score`
     runs it, on --scoring-pairs pairs of the assumed pool's shape cut at recommend's scoring
     length (probes.recipe.REAL.score_length): response tokens/s and peak memory; the first
     NAIVE_PAIRS of them again through the naive loop (one pair at a time, the whole log-softmax);
   - one probe step as `advisor probe` and `recommend` take it (probes/recipe.py REAL and
     probes.run.manifest_for, the Trainer settings of training/trainer_settings.py), on a copy of
     the student while the base stays on the device for base_drift, as run_sft does; full
     fine-tuning at 1.5B, LoRA of rank --lora-r at 7B. Seconds per step (one warm-up step left
     out) and peak memory. A step that runs out of memory is measured again with gradient
     checkpointing, and the JSON says so;
   - the evaluation's generation, as EvalCallback runs it: greedy, `HFBackend.generate` on the
     trained copy, one batch of the size the token budget gives at the recipe's new-token cap,
     --eval-gen-tokens new tokens timed (the random model has no EOS: every row runs to the bound);
   - one full-run step: the full run recommend's manifest describes (probes.recipe.full_run_manifest:
     its batch and training length), on a fresh student with no base beside it, as `advisor train`
     runs it; full fine-tuning at 1.5B, LoRA at 7B;
   - each rate as a share of the matmul roofline (gpu_check_roofline.py: the ceiling measured here,
     and the peak the dry run assumes), the projection of `advisor recommend` on the assumed pool
     (gpu_check_projection.py) and the GPU-hours of a probe, a full run, a race and a calibration
     (gpu_check_hours.py);
2. after the student --e2e names: one real `advisor recommend` on a generated pool with that
   student saved as a model folder, each stage's seconds (gpu_check_e2e.py; sizes: EndToEnd);
3. agreement (a random-init Qwen2-shaped model of --hidden and --layers, or --model): hf in fp32,
   hf in bf16 and vllm in bf16 on the same token ids, scoring and generation throughput and the
   long trace's memory (gpu_check_agreement.py).

The pool is an ASSUMPTION, not a measurement (--pool-problems, --candidates, --prompt-tokens,
--response-tokens): 12,000 problems x 4 candidates, 128-token prompts and 4,000-token responses.
Peak memory is CUDA's allocator peak (torch.cuda.max_memory_allocated) over each measurement,
weights included; on a CPU (--quick) the process's resident set, sampled, which shows only that
the path ran.

The JSON: `students.<name>` holds `shape`, `params`, `dtype`, `scoring`, `probe_step`,
`generation`, `full_run_step` (the measured fields of each in MEASURED, each with its `roofline`),
`projection` and `hours`; `recommend` the end-to-end run; `matmul_ceiling`; `parts` (seconds of each
part) and `skipped`; the agreement part's figures at the top level (`agreement`, `scoring`,
`generation`, `long_trace`); `wall_seconds` once the run ends.

This module holds the command line and the order of work; the parts lie beside it in
benchmarks/gpu_check/ (the package's docstring names them).
"""

import argparse
import copy
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.gpu_check.agreement import agreement_part
from benchmarks.gpu_check.args import check_args, check_environment, parse_args
from benchmarks.gpu_check.e2e import end_to_end, save_student
from benchmarks.gpu_check.hours import EPOCHS, hours
from benchmarks.gpu_check.measure import (
    build_student, build_tokenizer, free, full_run_spec, measure_generation, measure_scoring, probe_spec, train_steps,
)
from benchmarks.gpu_check.projection import project
from benchmarks.gpu_check.report import optional_packages, versions, write_and_print, write_files
from benchmarks.gpu_check.roofline import add_roofline, matmul_ceiling
from benchmarks.gpu_check.shapes import (
    NAIVE_PAIRS, PART_SECONDS, QUICK_E2E, QUICK_GEN_TIMED_TOKENS, QUICK_LENGTHS, QUICK_NAIVE_PAIRS, QUICK_POOL,
    QUICK_SCORE_MAX_LENGTH, QUICK_SCORING_PAIRS, QUICK_SHAPE, QUICK_TIMED_STEPS, SCORING_PAIRS, STUDENTS, TIMED_STEPS,
    EndToEnd, PoolAssumption, Student,
)


_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"gpu_check [{time.perf_counter() - _T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One run's settings, its results so far and its clock; `save` rewrites the files."""

    args: argparse.Namespace
    res: dict
    recipe: object = None
    score_max_length: int = 0
    pool: PoolAssumption | None = None
    strategies: int = 2
    tokenizer: object = None
    t0: float = 0.0

    def save(self) -> None:
        write_files(self.args, self.res)

    def fits(self, *parts: str) -> bool:
        """Whether `parts`, one after another from now, are expected to end within --budget-s."""
        budget = self.args.budget_s
        return budget is None or time.perf_counter() - self.t0 + sum(PART_SECONDS[p] for p in parts) <= budget

    def skip(self, part: str, why: str) -> None:
        self.res.setdefault("skipped", {})[part] = why
        say(f"{part}: skipped ({why})")
        self.save()

    def starts(self, part: str) -> bool:
        """Whether `part` may start: it is expected to end within --budget-s (else it is skipped)."""
        if self.fits(part):
            return True
        self.skip(part, f"not started at {time.perf_counter() - self.t0:.0f} s: expected to take {PART_SECONDS[part]} s, "
                        f"past --budget-s {self.args.budget_s:g}")
        return False

    def timed_part(self, part: str, fn) -> None:
        """Run one part; a failure is recorded (`errors`) and the run goes on to the next part."""
        import traceback

        t = time.perf_counter()
        failed = False
        try:
            fn()
        except Exception as e:  # one GPU run is all there is: keep the other parts' figures
            traceback.print_exc()
            self.res.setdefault("errors", {})[part] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            say(f"{part}: failed ({self.res['errors'][part]})")
            failed = True
        finally:
            self.res.setdefault("parts", {})[part] = time.perf_counter() - t
            self.save()
        if failed:  # outside the handler, whose traceback held the part's tensors
            free(self.args.device)


# ---- the students ------------------------------------------------------------------------------


def _fitting(device: str, label: str, attempt, checkpointing: bool):
    """attempt(checkpointing) -> (trainer, step); once more with gradient checkpointing if it runs out of memory."""
    import torch

    oom = False
    try:
        trainer, step = attempt(checkpointing)
    except torch.cuda.OutOfMemoryError:
        oom = True
    if oom:  # as configured it does not fit: what gradient checkpointing makes of it
        free(device)  # outside the handler, whose traceback still held the failed attempt
        say(f"{label}: out of memory without gradient checkpointing; again with it")
        trainer, step = attempt(True)
    step["out_of_memory_as_configured"] = oom
    return trainer, step


def measure_student(run: Run, name: str, student: Student, shape: dict, m: dict, keep: Path | None) -> None:
    """Scoring, one probe step, the evaluation's generation and one full-run step of one student,
    alone on the device, each written to `m` (and the files) as it ends; with `keep`, the student
    is saved there as a model folder for the end-to-end part."""
    from capacity_advisor.training.trainer_settings import precision

    a, device = run.args, run.args.device
    dtype = precision("auto", cuda=device == "cuda")[0]
    lm = build_student(name, shape, run.tokenizer, device, dtype)
    m.update(params=lm.description["n_params"], dtype=lm.description["dtype"])
    say(f"{name}: {m['params']:,} parameters built in {m['dtype']}; scoring")
    n_pairs = a.scoring_pairs or (QUICK_SCORING_PAIRS if a.quick else SCORING_PAIRS)
    m["scoring"] = measure_scoring(lm, run.pool, run.score_max_length, n_pairs, device,
                                   QUICK_NAIVE_PAIRS if a.quick else NAIVE_PAIRS)
    run.save()
    steps = 1 + (QUICK_TIMED_STEPS if a.quick else TIMED_STEPS)
    workdir = Path(tempfile.mkdtemp(prefix=f"gpu-check-{name}-"))  # the Trainers' output folder (nothing is saved)
    try:
        probe = replace(probe_spec(lm, student, run.recipe, device, workdir), max_steps=steps)
        say(f"{name}: probe step")
        trainer, m["probe_step"] = _fitting(device, f"{name} probe", lambda ckpt: train_steps(
            copy.deepcopy(lm.model), lm.tokenizer, replace(probe, gradient_checkpointing=probe.gradient_checkpointing or ckpt),
            device, run.pool, workdir), False)
        run.save()
        say(f"{name}: evaluation generation")
        m["generation"] = measure_generation(trainer, lm, run.recipe, run.pool, device,
                                             QUICK_GEN_TIMED_TOKENS if a.quick else a.eval_gen_tokens)
        run.save()
        del trainer
        if keep is not None:
            say(f"{name}: saved as a model folder for the end-to-end run")
            m["saved_seconds"] = save_student(lm, keep)
        full = replace(full_run_spec(lm, student, run.recipe, EPOCHS), max_steps=steps)
        lm = None  # a full run holds no base beside the student (EvalSpec.base_drift is off)
        free(device)
        say(f"{name}: full-run step")
        trainer, m["full_run_step"] = _fitting(device, f"{name} full run", lambda ckpt: train_steps(
            build_student(name, shape, run.tokenizer, device, dtype).model, run.tokenizer,
            replace(full, gradient_checkpointing=full.gradient_checkpointing or ckpt), device, run.pool, workdir), False)
        del trainer
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    free(device)


def _student(run: Run, name: str, keep: Path | None) -> None:
    import torch

    a = run.args
    student = STUDENTS[name]
    shape = {**student.shape, **QUICK_SHAPE} if a.quick else dict(student.shape)
    if a.lora_r is not None and student.lora_r:
        student = replace(student, lora_r=a.lora_r)
    m = run.res["students"][name] = {"label": student.label, "shape": shape}
    try:
        measure_student(run, name, student, shape, m, keep)
    except torch.cuda.OutOfMemoryError as e:
        m["error"] = f"out of memory: {str(e).splitlines()[0]}"
    if "error" in m:
        free(a.device)  # outside the handler, whose traceback still holds the student
        say(f"{name}: {m['error']}")
        return
    ceiling = run.res["matmul_ceiling"]["tflops"]
    add_roofline(m, shape, ceiling, run.res["assumed_peak_tflops"])
    m["projection"] = project(m, run.recipe, run.pool, run.score_max_length, run.strategies)
    m["hours"] = hours(m, run.recipe, run.pool, run.score_max_length, run.strategies)
    h = m["hours"]["gpu_hours"]
    say(f"{name}: projected recommend {h['probe']:.2f} GPU-h, one {m['hours']['epochs']:g}-epoch run "
        f"{h['full_run']:.2f}, calibration proxy {h['calibration_proxy']:.2f}")


def _recommend(run: Run, folder: Path, workdir: Path) -> None:
    a = run.args
    e = QUICK_E2E if a.quick else EndToEnd()
    say(f"recommend: advisor recommend end to end at the {a.e2e} shape on {e.problems} x {e.candidates} candidates")
    r = end_to_end(a.e2e, folder, run.res["students"][a.e2e].get("saved_seconds"), run.tokenizer, e, a.device, workdir)
    run.res["recommend"] = r
    say(f"recommend: {r['total_seconds']:.0f} s, chose D_{r['strategy']}")


def student_part(run: Run) -> None:
    """The students in turn, the end-to-end run after the one --e2e names; each part only if it fits."""
    from capacity_advisor.advisor.calibration.cost import PEAK_TFLOPS
    from capacity_advisor.probes.recipe import REAL, field_of
    from capacity_advisor.probes.run import ProbeConfig
    from capacity_advisor.training.trainer_settings import precision

    a, res = run.args, run.res
    run.recipe = REAL.with_(**{field_of(k): v for k, v in QUICK_LENGTHS.items()}) if a.quick else REAL
    run.score_max_length = QUICK_SCORE_MAX_LENGTH if a.quick else REAL.score_length
    base_pool = QUICK_POOL if a.quick else PoolAssumption()
    run.pool = PoolAssumption(**{k: getattr(a, k) if getattr(a, k) is not None else v for k, v in asdict(base_pool).items()})
    run.strategies = len(ProbeConfig().strategies)
    res["projection_inputs"] = {"recipe": {**run.recipe.as_dict(), "token_budget": run.recipe.token_budget,
                                           "train_batch": run.recipe.train_batch},
                                "score_max_length": run.score_max_length, "pool_assumed": asdict(run.pool),
                                "sets": run.strategies}
    res["matmul_ceiling"] = matmul_ceiling(a.device, precision("auto", cuda=a.device == "cuda")[0], a.quick)
    res["assumed_peak_tflops"] = PEAK_TFLOPS
    say(f"matmul ceiling {res['matmul_ceiling']['tflops']:.1f} TFLOP/s")
    run.tokenizer = build_tokenizer()
    res["students"] = {}
    run.save()
    for name in a.students:
        if not run.starts(name):
            if a.e2e == name:
                run.skip("recommend", f"its student, {name}, was skipped")
            continue
        e2e = a.e2e == name and run.fits(name, "recommend")  # the student is saved only for a run that fits
        if a.e2e == name and not e2e:
            run.skip("recommend", f"expected to take {PART_SECONDS['recommend']} s after {name}, past --budget-s")
        workdir = Path(tempfile.mkdtemp(prefix="gpu-check-e2e-")) if e2e else None
        try:
            run.timed_part(name, lambda: _student(run, name, workdir / "student" if workdir else None))
            if e2e and "error" not in res["students"][name] and name not in res.get("errors", {}) \
                    and run.starts("recommend"):
                run.timed_part("recommend", lambda: _recommend(run, workdir / "student", workdir))
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


# ---- main --------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    args = parse_args(argv, __doc__.splitlines()[0])
    check_args(args)
    torch = check_environment(args)
    res: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "quick": args.quick,
                 "versions": versions(), "optional_packages": optional_packages(), "budget_s": args.budget_s}
    run = Run(args, res, t0=_T0)  # the budget counts from the start of the process, imports included
    run.save()
    if args.students:  # first, so that each peak counts nothing but that student's own work
        student_part(run)
    if run.starts("agreement"):
        say("agreement model")
        tmp = tempfile.mkdtemp(prefix="gpu-check-")
        try:
            run.timed_part("agreement", lambda: agreement_part(args, tmp, res))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    res["wall_seconds"] = time.perf_counter() - run.t0
    write_and_print(args, res)
    return res


if __name__ == "__main__":
    sys.exit(1 if main().get("errors") else 0)
