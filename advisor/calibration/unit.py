"""What a calibration runs: a unit — one student on one pool at one seed under one ranking — with
its pool (`UnitPool`) and full runs (`Run`), and what every unit of one calibration shares
(`Calibration`). `calibration.run` runs a unit and collects its records.

    advisor calibrate --students ./qwen2.5-0.5b,./qwen2.5-1.5b --pool openr1.parquet --out runs/cal   # your pool
    advisor lab calibrate --out runs/cal --jobs 2                                                   # the lab sweep

Two callers make the units: `calibration.proxies` (the user's pool and proxy students, the full
runs' held-out problems drawn once with `EVAL_SEED`) and `calibration.sweep` (the lab teacher's
pools and the ladder's students); `calibration.run` runs each unit and collects its records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from capacity_advisor.advisor.pools.read import Pool, read_pool
from capacity_advisor.probes.recipe import Recipe
from capacity_advisor.probes.student import Student

EVAL_SEED = 10_000  # the full runs' held-out problems: one draw, the same for every student, seed and run


@dataclass(frozen=True)
class Run:
    """One full run of a unit: its folder, the option (set or schedule) it trains, its budget."""

    name: str
    option: str
    epochs: float | None = None  # None: the calibration's
    ranking: str | None = None  # the ranking its set is selected by (None: the unit's)
    rerank: dict | None = None  # a training.rerank spec; the candidates it re-chooses from are written beside the set


@dataclass(frozen=True)
class UnitPool:
    """The problems a unit ranks, probes and trains on, the held-out set its runs are judged on, and
    what its manifests and records say of the pool."""

    path: Path  # the pool file (records name it by its file name)
    eval_path: Path  # the held-out problems (JSONL of prompt, answer, task), never trained on
    checker: str
    task: str  # the pool source's name in the records
    teacher: str  # what wrote the candidates
    temperature: float | None = None  # the teacher's sampling temperature, where the lab sampled it
    problems: Pool | None = None  # None: read from `path` when the unit runs (the lab's pools, one per unit)
    fingerprint: str | None = None  # the pool's content hash (None: the problems')

    def read(self) -> tuple[Pool, str]:
        """The problems, and the content hash the records know the pool by."""
        problems = self.problems if self.problems is not None else read_pool(self.path)
        return problems, self.fingerprint or problems.fingerprint()

    def about(self, ranking: str, fingerprint: str) -> dict:
        """The manifests' (and so the records') `pool`."""
        return {"task": self.task, "source": self.path.name, "score": ranking, "fingerprint": fingerprint,
                "teacher": self.teacher, **({} if self.temperature is None else {"temperature": self.temperature})}


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One student on one pool at one seed under one ranking: a probe, then the full runs `runs`."""

    student: Student  # resolved once; its learning rate is the probe's and the full runs'
    name: str  # how its records name it (no machine path)
    recipe: Recipe  # its probe, and the lengths, batch and new tokens of its full runs
    pool: UnitPool
    seed: int  # the probe's held-out slice and data order, the mixed set, the full runs' data order
    ranking: str
    folder: Path
    runs: tuple[Run, ...]
    label: str  # how the log names it
    record: dict | None = None  # the `unit` its records carry (the lab's: task, ranking, size, seed, teacher, ...)

    @property
    def learning_rate(self) -> float:
        """Its probe's and its full runs' learning rate: the student's (`Student.learning_rate`)."""
        return self.student.learning_rate()[0]


@dataclass(frozen=True)
class Calibration:
    """What every unit of one calibration shares: the full runs' budget and evaluations, where they
    run, and the source its records name."""

    source: str  # the records' `source`: "calibrate" (the lab sweep), "calibrate-pool" (the user's pool)
    epochs: float  # kept as given: the manifests, and so the run keys, state it so
    evals_per_epoch: int = 4
    device: str = "auto"
    dtype: str = "auto"
    nproc: int = 1  # processes per full run; > 1 launches it (as `advisor train --nproc`)
    launcher: str = "torchrun"
    probe: dict = field(default_factory=dict)  # the probe's run settings beyond the recipe (teacher, per_problem)
    eval: dict = field(default_factory=dict)  # the full runs' EvalSpec beyond the held-out set (teacher, view_limit, ...)
    model_path: bool = False  # the manifests' model keeps the loaded folder's path (the lab's run keys were made so)
    scoring: dict = field(default_factory=dict)  # the scoring's token budget and shard size (ScoreConfig), where not the defaults
    eval_at: tuple[float, ...] = ()  # more evaluations of every full run, at these shares of its budget (`--eval-at`)
