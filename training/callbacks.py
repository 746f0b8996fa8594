"""Trainer callbacks: checkpoint evaluation on the paper's schedule, curriculum, one progress line.

Evaluation (`EvalCallback`): at step 0 (the base model) and at `evals_per_epoch` evenly spaced
steps per epoch (step round(k * steps_per_epoch / evals_per_epoch), plus the last step) — or,
for probes, every `eval_every` steps — right after that step's checkpoint is written, every
process generates for its own slice of the held-out prompts (rows rank, rank + world, ...); the
texts are gathered on rank 0, which measures them (`training.evaluate.Evaluator`) and writes the row. A checkpoint is saved at each
of those steps; once a barrier says every rank's files are in it, `advisor_saved.json` (the time
spent so far), and a marker (`advisor_state.json`: the eval row and that time) is written into it
last, after the evaluation. The Trainer's rotation deletes the checkpoint before as soon as the new one
is saved, before its evaluation (minutes on a real model): a run killed during that evaluation
resumes from the unmarked checkpoint, evaluates its step first (the step's training loss and
learning rate read from the checkpoint's log history) and marks it.

`eval.jsonl` is keyed by step: a row recomputed after a resume replaces the old one.

With `keep_best`, the checkpoint of the best trained evaluation so far (highest accuracy, the
earliest on ties) is the Trainer's `best_model_checkpoint`, which its rotation never deletes, so
the run can keep it as `best/` when it ends (`best_row`); the best is read again from eval.jsonl
on a resume.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from transformers import TrainerCallback

from capacity_advisor.core.files import give_umask_modes, write_json, write_jsonl
from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.training import metrics
from capacity_advisor.training.evaluate import Evaluator

MARKER = "advisor_state.json"
SAVED = "advisor_saved.json"  # written once every rank's files of a checkpoint are in place, before its evaluation


# ---- processes ---------------------------------------------------------------------------
def dist_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist_ready() else 0


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist_ready() else 1


def barrier() -> None:
    import torch.distributed as dist

    if dist_ready():
        dist.barrier()


def end_process_group() -> None:
    """Tear the process group down while the interpreter is alive: the last call of a process that
    trained under torchrun / accelerate launch, once every rank has passed the run's last barrier.

    A gloo worker thread drops its finished collective after the caller has returned from it; that
    collective still holds Python tensors (all_gather_object's), whose release takes the GIL. Left
    to the interpreter's exit, a thread asking for the GIL during finalization is ended in the
    middle of a C++ destructor: "terminate called without an active exception", SIGABRT, and the
    launcher reports the run failed. The group is freed here instead: cycles holding the wrapped
    model (and through it the group) are collected first, then destroy_process_group drops the
    last reference, whose destructor joins the worker threads."""
    import gc

    import torch.distributed as dist

    if dist_ready():
        gc.collect()
        dist.destroy_process_group()


def gather_to_main(obj):
    """Every rank's `obj`, in rank order, on every rank (small Python objects only)."""
    import torch.distributed as dist

    if not dist_ready():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ---- schedule ----------------------------------------------------------------------------
def eval_schedule(steps_per_epoch: int, max_steps: int, evals_per_epoch: int, every: int | None = None,
                  at: Sequence[float] = (), epochs: float | None = None) -> list[int]:
    """Steps at which to evaluate and checkpoint: evals_per_epoch per epoch (or every `every`
    steps), the last step, and the first step at or past each share of the budget in `at` (a
    race's decision points, so that it stops at its share rather than at the next evaluation): the
    budget is `epochs` epochs, or `max_steps` steps where `epochs` is None."""
    if every:
        steps = set(range(every, max_steps + 1, every))
    else:
        n = math.ceil(max_steps / steps_per_epoch * evals_per_epoch)
        steps = {int(k * steps_per_epoch / evals_per_epoch + 0.5) for k in range(1, n + 1)}  # round half up
    steps |= {share_step(share, steps_per_epoch, max_steps, epochs) for share in at}
    return sorted({s for s in steps if 1 <= s <= max_steps} | {max_steps})


def share_step(share: float, steps_per_epoch: int, max_steps: int, epochs: float | None = None) -> int:
    """The first step at or past `share` of the budget, as `training.race.budget_share` reads a row:
    its epoch over `epochs`, or its step over `max_steps` where `epochs` is None."""
    total = epochs * steps_per_epoch if epochs else max_steps
    return min(max(math.ceil(share * total - 1e-9), 1), max_steps)


def steps_per_epoch_of(dataloader, grad_accum: int) -> int:
    n = len(dataloader)
    return max(n // grad_accum + int(n % grad_accum > 0), 1)


# ---- eval rows ---------------------------------------------------------------------------
def read_curve(path: Path) -> list[dict]:
    """The rows of a run's eval.jsonl (one per evaluation point), or none yet.

    The file is written whole each time (atomically), so a torn last line is damage from outside (a
    kill or a full disk while it was copied or appended to): it is dropped, not fatal. The row of
    every complete checkpoint is in that checkpoint's marker, so a row missing from the file is put
    back from there (an evaluation no marker holds is redone by the resumed run), and the file is
    written back whole: a rerun after the damage finds the run as it was."""
    if not path.exists():
        return []
    torn: list[int] = []
    rows = read_jsonl(path, torn=torn)
    restored = _marked_rows(path.parent, {r.get("step") for r in rows})
    if restored:
        rows = sorted(rows + restored, key=lambda r: r["step"])
    if torn or restored:
        write_jsonl(path, rows)
    return rows


def base_row_of(run_dirs) -> dict | None:
    """The base student's evaluation (step 0) that one of `run_dirs` made already, the first found;
    None before any did. Runs of one base on the same held-out problems with the same settings
    (greedy generation) differ in their data only, so that evaluation is theirs too: the race's
    second set and a calibration unit's later runs take it instead of making it again. A run whose
    eval.jsonl cannot be read is passed over (its own resume deals with it)."""
    from capacity_advisor.core.errors import InputError

    for run_dir in run_dirs:
        try:
            rows = read_curve(Path(run_dir) / "eval.jsonl")
        except (InputError, OSError, ValueError, KeyError, TypeError):
            continue
        row = next((r for r in rows if isinstance(r, dict) and r.get("step") == 0), None)
        if row is not None:
            return row
    return None


def _marked_rows(run_dir: Path, steps: set) -> list[dict]:
    """The evaluation rows the complete checkpoints of `run_dir` hold in their markers, for the
    steps not in `steps`."""
    out = []
    for ckpt in run_dir.glob("checkpoint-*"):
        if not ckpt.name[len("checkpoint-"):].isdigit() or not (ckpt / "trainer_state.json").is_file():
            continue
        step = int(ckpt.name[len("checkpoint-"):])
        row = (marker_of(ckpt) or {}).get("eval")
        if step not in steps and isinstance(row, dict) and row.get("step") == step:
            out.append(row)
    return out


def upsert_eval_row(path: Path, row: dict) -> list[dict]:
    rows = {r["step"]: r for r in read_curve(path)}
    rows[row["step"]] = row
    out = [rows[s] for s in sorted(rows)]
    write_jsonl(path, out)
    return out


def truncate_eval_rows(path: Path, last_step: int) -> None:
    """Drop rows past the checkpoint a run resumes from (they are recomputed)."""
    rows = read_curve(path)
    keep = [r for r in rows if r["step"] <= last_step]
    if len(keep) != len(rows):
        write_jsonl(path, keep)


def best_row(rows: list[dict]) -> dict | None:
    """The trained evaluation (step > 0) with the highest accuracy, the earliest on ties; None
    where no trained evaluation measured accuracy."""
    scored = [r for r in rows if r.get("step", 0) > 0 and isinstance(r.get("accuracy"), (int, float))]
    return max(scored, key=lambda r: (r["accuracy"], -r["step"]), default=None)


class EvalCallback(TrainerCallback):
    """Generation-based evaluation at the scheduled steps; see the module doc."""

    def __init__(self, run_dir: Path, evaluator: Evaluator, evals_per_epoch: int, grad_accum: int, seed: int,
                 tokenizer, spec: str, eval_every: int | None = None, elapsed_before: float = 0.0, log=None,
                 step0_row: dict | None = None, measure_every: int = 1, keep_best: bool = False,
                 on_generated=None, eval_at: Sequence[float] = (), epochs: float | None = None):
        self.run_dir = Path(run_dir)
        self.eval_file = self.run_dir / "eval.jsonl"
        self.evaluator = evaluator
        self.eval_rows = evaluator.rows
        self.checker = evaluator.checker
        self.evals_per_epoch = evals_per_epoch
        self.eval_every = eval_every
        self.eval_at = tuple(eval_at)  # shares of the budget to evaluate at besides the schedule (`eval_schedule`)
        self.epochs = epochs  # the budget in epochs, or None where max_steps sets it
        self.step0_row = step0_row
        self.measure_every = measure_every
        self.grad_accum = grad_accum
        self.seed = seed
        self.tokenizer = tokenizer
        self.spec = spec
        self.elapsed_before = elapsed_before
        self.log = log or (lambda s: None)
        self.trainer = None  # set by the runner: needed for the FSDP full-parameter view
        self.schedule: list[int] = []
        self.steps_per_epoch = 1
        self.losses: list[float] = []
        self.last_lr = None
        self.t0 = time.perf_counter()
        self.last_row: dict | None = None
        self.keep_best = keep_best
        self.on_generated = on_generated  # (step, prompts done, prompts) as an evaluation generates, on rank 0
        self.evaluated_at_begin = False  # this call made the evaluation a kill had interrupted (`_finish_interrupted`)

    # elapsed wall time of the whole run, over every attempt
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kw):
        self.steps_per_epoch = steps_per_epoch_of(train_dataloader, self.grad_accum)
        self.schedule = eval_schedule(self.steps_per_epoch, state.max_steps, self.evals_per_epoch, self.eval_every,
                                      self.eval_at, self.epochs)
        self._protect_best(args, state)
        if state.global_step == 0:
            # rank 0's view decides for all ranks, since every rank must join the evaluation
            done = gather_to_main(0 in {r["step"] for r in read_curve(self.eval_file)} if rank() == 0 else None)[0]
            if not done and self.step0_row is not None:
                if rank() == 0:
                    upsert_eval_row(self.eval_file, {**self.step0_row, "step": 0, "epoch": 0.0})
            elif not done:
                self._evaluate(model, state, args)
        elif state.global_step in self.schedule:
            self._finish_interrupted(model, state, args)

    def _finish_interrupted(self, model, state, args) -> None:
        """Resumed from a checkpoint whose evaluation a kill interrupted (no marker): evaluate that
        step as the uninterrupted run did (its loss from the log history), then mark it."""
        step = state.global_step
        ckpt = self.run_dir / f"checkpoint-{step}"
        row = next((r for r in read_curve(self.eval_file) if r["step"] == step), None) if rank() == 0 else None
        todo = gather_to_main((marker_of(ckpt) is None, row is None) if rank() == 0 else None)[0]
        if not todo[0]:
            return
        if todo[1]:
            before = max((s for s in self.schedule if s < step), default=0)
            logged = [h for h in state.log_history if isinstance(h.get("step"), int) and before < h["step"] <= step]
            self.losses = [float(h["loss"]) for h in logged if "loss" in h]
            rates = [float(h["learning_rate"]) for h in logged if "learning_rate" in h]
            self.last_lr = rates[-1] if rates else self.last_lr
            self._evaluate(model, state, args)
            self._protect_best(args, state)
            self.evaluated_at_begin = True
        elif rank() == 0:
            self.last_row = row
        self._mark(state)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if logs and "learning_rate" in logs:
            self.last_lr = float(logs["learning_rate"])

    def on_step_end(self, args, state, control, **kw):
        if state.global_step in self.schedule:
            control.should_save = True
        return control

    def on_save(self, args, state, control, model=None, **kw):
        # The Trainer logs (on_log, this step's loss) before it saves, so evaluating here puts
        # the loss of every step up to this one into the row.
        barrier()  # every rank's files (weights, optimizer, RNG state) are in place: the checkpoint is whole
        if rank() == 0:
            ckpt = self.run_dir / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                write_json(ckpt / SAVED, {"step": state.global_step, "elapsed": self.elapsed()})
        if state.global_step in self.schedule:
            self._evaluate(model, state, args)
            self._protect_best(args, state)
        self._mark(state)

    def _mark(self, state) -> None:
        """Write the marker into this step's checkpoint: it is whole, and evaluated."""
        barrier()  # the evaluation is written
        if rank() == 0:
            ckpt = self.run_dir / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                give_umask_modes(ckpt)
                write_json(ckpt / MARKER, {"step": state.global_step, "epoch": state.global_step / self.steps_per_epoch,
                                           "elapsed": self.elapsed(), "eval": self.last_row})
        barrier()

    def _protect_best(self, args, state) -> None:
        """Name the best trained evaluation's checkpoint to the Trainer, whose rotation keeps it."""
        if not self.keep_best:
            return
        best = best_row(read_curve(self.eval_file)) if rank() == 0 else None
        best = gather_to_main(best)[0]
        if best is not None:  # the path as the Trainer's rotation lists it
            state.best_model_checkpoint = str(Path(args.output_dir) / f"checkpoint-{best['step']}")

    # ---- the evaluation itself ------------------------------------------------------------
    def scores_at(self, step: int) -> bool:
        """Whether the evaluation at `step` runs the scoring measures (eval.measure_every): every
        Nth evaluation of the schedule, step 0, whole epochs and the last evaluation."""
        if self.measure_every <= 1 or step == 0 or not self.schedule or step == self.schedule[-1]:
            return True
        if step % self.steps_per_epoch == 0:
            return True
        k = self.schedule.index(step) + 1 if step in self.schedule else 0
        return k % self.measure_every == 0

    def _evaluate(self, model, state, args) -> None:
        step = state.global_step
        t0 = time.perf_counter()
        row = {"step": step, "epoch": step / self.steps_per_epoch}
        if self.eval_rows:
            gens = self._generate(model, args, step)
            was_training = model.training
            model.eval()
            try:
                # gathering FSDP's shards is a collective: every rank enters, rank 0 measures
                with full_params(self.trainer):
                    if rank() == 0:
                        row.update(self.evaluator.measure(self._lm(model, args), gens, scores=self.scores_at(step)))
            finally:
                if was_training:
                    model.train()
            if rank() == 0:
                row["examples"] = [{"prompt": r["prompt"], "answer": r.get("answer"), "generation": g["text"]}
                                   for r, g in zip(self.eval_rows[:3], gens[:3])]
        else:
            row.update({"accuracy": None, "repetition_rate": None, "answer_rate": None, "mean_chars": None})
        row["train_loss"] = sum(self.losses) / len(self.losses) if self.losses else None
        row["learning_rate"] = self.last_lr
        row["checker"] = metrics.checker_name(self.checker)
        row["n_eval"] = len(self.eval_rows)
        row["eval_seconds"] = round(time.perf_counter() - t0, 3)
        row["elapsed"] = round(self.elapsed(), 3)
        self.losses = []
        self.last_row = row
        if rank() == 0:
            upsert_eval_row(self.eval_file, row)
            acc = row.get("accuracy")
            self.log(f"eval step {step} (epoch {row['epoch']:.2f}): accuracy "
                     f"{'—' if acc is None else f'{acc:.3f}'}, repetition {_f(row.get('repetition_rate'))}, "
                     f"answers {_f(row.get('answer_rate'))} [{row['eval_seconds']:.1f}s]")

    def _lm(self, model, args):
        return LoadedModel(model, self.tokenizer, args.device, self.spec, None, {})

    def _generate(self, model, args, step: int) -> list[dict]:
        """Generations for every eval prompt, in order, on rank 0 (sharded over ranks)."""
        r, w = rank(), world()
        mine = list(range(r, len(self.eval_rows), w))
        tick = None
        if self.on_generated is not None and r == 0:  # rank 0 tells its own share
            done = [0]

            def tick(n: int) -> None:
                done[0] += n
                self.on_generated(step, done[0], len(mine))

            self.on_generated(step, 0, len(mine))
        was_training = model.training
        model.eval()
        try:
            with full_params(self.trainer):
                out = self.evaluator.generate(self._lm(model, args), mine, seed=self.seed + step, progress=tick)
        finally:
            if was_training:
                model.train()
        parts = gather_to_main(list(zip(mine, out)))
        gens: list[dict] = [{"text": "", "n_tokens": 0, "finished": True}] * len(self.eval_rows)
        for part in parts:
            for i, g in part:
                gens[i] = g
        return gens


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def full_params(trainer):
    """Under FSDP (v1), gather full parameters for generation; elsewhere a no-op."""
    wrapped = getattr(trainer, "model_wrapped", None)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # pragma: no cover
        return _NullCtx()
    if isinstance(wrapped, FSDP):
        return FSDP.summon_full_params(wrapped, writeback=False, recurse=True)
    return _NullCtx()


class PausedBeforeTraining(Exception):
    """Raised (on every rank alike) when a paused call has made all its evaluations before its first step."""


class PauseCallback(TrainerCallback):
    """Stops training once `evals` scheduled evaluations have run in this call (each after its
    checkpoint and marker are written), so a later call resumes there exactly as after a kill.
    Registered after the EvalCallback it counts for, so that one's marker is written first."""

    def __init__(self, evaluator: EvalCallback, evals: int):
        self.evaluator = evaluator
        self.evals = evals
        self.seen = 0

    def on_train_begin(self, args, state, control, **kw):
        # the evaluation a kill interrupted, made again at the start of this call, counts (the
        # EvalCallback's on_train_begin runs first); with nothing left to count, stop before training
        self.seen = int(self.evaluator.evaluated_at_begin)

    def on_step_begin(self, args, state, control, **kw):
        if self.seen >= self.evals:
            raise PausedBeforeTraining(state.global_step)

    def on_save(self, args, state, control, **kw):
        if state.global_step in self.evaluator.schedule:
            self.seen += 1
            if self.seen >= self.evals:
                control.should_training_stop = True
        return control


class CurriculumCallback(TrainerCallback):
    """Tells the dataset which epoch it serves, so curriculum sets switch phase at switch_epoch."""

    def __init__(self, dataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kw):
        self.dataset.epoch = int(math.floor((state.epoch or 0) + 1e-6))


class ProgressCallback(TrainerCallback):
    """One progress line on rank 0: step, epoch, loss, s/step, ETA (rewritten in place on a terminal)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.loss = None
        self.t0 = None
        self.start_step = 0
        self.every = 1
        self.eval_shown: float | None = None  # when an evaluation's progress was last written

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
        self.start_step = state.global_step
        self.every = 1 if self.tty else max(1, state.max_steps // 20)

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:
            return
        self.loss = float(logs["loss"])
        if rank() != 0:
            return
        step, total = state.global_step, state.max_steps
        if step % self.every and step != total:
            return
        done = step - self.start_step
        per = (time.perf_counter() - self.t0) / max(done, 1)
        line = (f"train step {step}/{total} epoch {state.epoch or 0:.2f} loss {_f(self.loss)} "
                f"{per:.2f} s/step eta {_hms(per * (total - step))}")
        if self.tty:
            self.stream.write("\r" + line.ljust(78) + ("\n" if step == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def evaluating(self, step: int, done: int, total: int, every: float = 30.0) -> None:
        """How far an evaluation's generation has come (a real model's can take many minutes):
        rewritten in place on a terminal, else a line at its start, every `every` seconds and at its end."""
        if rank() != 0:
            return
        now = time.monotonic()
        last = self.eval_shown
        if not self.tty and done and done < total and last is not None and now - last < every:
            return
        self.eval_shown = now
        line = f"eval step {step}: {done}/{total} problems generated"
        if self.tty:
            self.stream.write("\r" + line.ljust(78))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if rank() != 0:
            return
        self.stream.write(("\r" if self.tty else "") + text.ljust(78 if self.tty else 0) + "\n")
        self.stream.flush()


def _f(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def resumed_elapsed(run_dir: Path, resume) -> float:
    """Wall time the run had spent by the checkpoint it resumes from: its marker's, or for one a
    kill left unmarked, the last evaluation's before it."""
    if not resume:
        return 0.0
    for name in (MARKER, SAVED):
        marked = (marker_of(resume[1], name) or {}).get("elapsed")
        if isinstance(marked, (int, float)):
            return float(marked)
    rows = [r for r in read_curve(Path(run_dir) / "eval.jsonl") if r["step"] <= resume[0]]
    last = rows[-1].get("elapsed") if rows else None
    return float(last) if isinstance(last, (int, float)) else 0.0


def marker_of(ckpt: Path, name: str = MARKER) -> dict | None:
    """A checkpoint's JSON object file `name` (its MARKER, SAVED, or the Trainer's trainer_state.json),
    or None where it has none (or none that reads as one)."""
    p = Path(ckpt) / name
    if not p.is_file():
        return None
    try:
        marker = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return marker if isinstance(marker, dict) else None
