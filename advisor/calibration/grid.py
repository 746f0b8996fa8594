"""What a lab sweep runs: its settings (`CalibrateConfig`, the flags of `advisor lab calibrate`), its
grid (a `Cell` per task, ranking, student build and seed: where one calibration unit runs, and the
folder it fills) and the run folders a finished unit holds. `calibration.sweep` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import json_object
from capacity_advisor.models.lab.ladder import LAB_TEACHER, LADDER, MAX_BUILD, TEACHERS, lab_model, n_params, parse_name
from capacity_advisor.models.lab.tasks import FAMILIES, PRETRAINED, SCRIPTED_TEACHERS
from capacity_advisor.probes.recipe import FULL_RUN_EVAL_PROBLEMS, LAB
from capacity_advisor.training.manifest import SETS, schedule_of
from capacity_advisor.training.manifest_checks import MAX_COUNT


@dataclass
class CalibrateConfig:
    out: str = "runs/lab-calibration"  # --out: folder (resumable); records go to OUT/records.jsonl
    sizes: tuple[str, ...] = ()  # --sizes: ladder names (empty: the whole ladder)
    seeds: tuple[int, ...] = (0, 1, 2)  # --seeds: pool draw, data order
    builds: tuple[int, ...] = (0,)  # --builds: each student's pretraining builds (0: the ladder's own; b: `lab:NAME+bB`)
    mean_seeds: tuple[int, ...] = (0,)  # --mean-seeds: seeds that also run the mean-ranked arm
    tasks: tuple[str, ...] = ("modchain", "addition")  # --tasks
    epochs: int = 5  # --epochs: the longest budget
    n_train: int = 3000  # --n-train: problems per pool
    n_eval: int = FULL_RUN_EVAL_PROBLEMS  # --n-eval: held-out problems for the full runs' evaluations
    candidates: int = 8  # --candidates: teacher samples per problem
    evals_per_epoch: int = 4
    batch: int = LAB.train_batch  # sequences per optimizer step of the full runs
    probe_steps: int = 2 * LAB.steps  # --probe-steps: the longest probe (shorter ones, the recipe's among them, are its prefixes)
    probe_batch: int = LAB.batch_size
    probe_eval_every: int = LAB.eval_every
    probe_eval_problems: int = LAB.eval_problems
    max_new_tokens: int = LAB.max_new_tokens
    measure_every: int = 1  # --measure-every: the full runs' scoring measures at every Nth evaluation (eval.measure_every)
    jobs: int = 1  # --jobs: units in parallel (one torch thread each)
    teacher: str = LAB_TEACHER  # --teacher: the lab model that samples the pools, or a scripted teacher ("program", "explore", "terse")
    temperature: float = 1.0  # --temperature: the teacher's sampling temperature
    budget_runs: tuple[float, ...] = ()  # --budget-runs: also train each set as a run of just these epochs (seed 0)
    schedules: tuple[str, ...] = ()  # --schedules: options beyond D_high / D_low / D_mixed, e.g. mixed@0.25,curriculum@2
    quick: bool = False  # --quick: tiny settings for tests

    def validate(self) -> None:
        bad = []
        unknown = [s for s in self.sizes if s not in LADDER]
        if unknown:
            bad.append(f"--sizes {','.join(unknown)}: use names from {', '.join(LADDER)}")
        unknown = [t for t in self.tasks if t not in FAMILIES]
        if unknown or not self.tasks:
            bad.append(f"--tasks {','.join(unknown) or '(none)'}: use names from {', '.join(FAMILIES)}")
        if not self.seeds:
            bad.append("--seeds must name at least one seed")

        if not self.builds or any(not 0 <= b <= MAX_BUILD for b in self.builds):
            bad.append(f"--builds {','.join(map(str, self.builds)) or '(none)'}: name one or more builds from 0 to {MAX_BUILD}")
        if self.probe_steps < 1:
            bad.append(f"--probe-steps {self.probe_steps} must be at least 1")
        if self.epochs < 1 or self.n_train < self.probe_eval_problems + self.probe_batch or self.n_eval < 1:
            bad.append(f"--epochs {self.epochs}, --n-train {self.n_train}, --n-eval {self.n_eval}: need epochs >= 1, "
                       f"n-eval >= 1 and n-train >= {self.probe_eval_problems + self.probe_batch}")
        if not 2 <= self.candidates <= 16:
            bad.append(f"--candidates {self.candidates} must be between 2 and 16")
        if self.jobs < 1:
            bad.append(f"--jobs {self.jobs} must be at least 1")
        if self.measure_every < 1:
            bad.append(f"--measure-every {self.measure_every} must be at least 1 (1: every evaluation)")

        # the bounds the runs' manifests hold these to, so a value no run takes is refused before the
        # sweep writes its settings (and a sane rerun is not then a sweep of other settings)
        for name in ("epochs", "n_train", "n_eval", "evals_per_epoch", "batch", "probe_steps", "probe_batch",
                     "probe_eval_every", "probe_eval_problems", "max_new_tokens", "measure_every", "jobs"):
            value = getattr(self, name)
            if value > MAX_COUNT:
                bad.append(f"--{name.replace('_', '-')} {value} is beyond what a run takes (at most {MAX_COUNT:,})")
        for option in self.schedules:
            try:
                strategy, _, switch = schedule_of(option)
            except InputError as e:
                bad.append(f"--schedules: {e}")
                continue
            if switch is not None and switch >= self.epochs:
                bad.append(f"--schedules {option}: the switch must come before the last epoch ({self.epochs})")

        if self.teacher not in SCRIPTED_TEACHERS and not (self.teacher.startswith("lab:")
                                                          and self.teacher[len("lab:"):] in {**LADDER, **TEACHERS}):
            bad.append(f"--teacher {self.teacher!r}: name a lab model ({', '.join('lab:' + t for t in TEACHERS)}) or "
                       f"a scripted teacher ({', '.join(SCRIPTED_TEACHERS)})")
        new = [t for t in self.tasks if t not in PRETRAINED]
        if new and self.teacher.startswith("lab:"):
            bad.append(f"--tasks {','.join(new)}: no lab teacher model was pretrained on "
                       f"{'this family' if len(new) == 1 else 'these families'}; use a scripted teacher "
                       f"({', '.join(SCRIPTED_TEACHERS)})")
        for flag, values in (("--seeds", self.seeds), ("--mean-seeds", self.mean_seeds), ("--builds", self.builds),
                             ("--sizes", self.sizes), ("--tasks", self.tasks), ("--budget-runs", self.budget_runs),
                             ("--schedules", self.schedules)):
            twice = sorted({str(v) for v in values if list(values).count(v) > 1})
            if twice:
                bad.append(f"{flag} names {', '.join(twice)} more than once: name each once")
        if any(not 0 <= s < 2 ** 31 for s in (*self.seeds, *self.mean_seeds)):
            bad.append(f"--seeds / --mean-seeds must lie in 0 .. {2 ** 31 - 1}")
        if not 0 < self.temperature <= 2:
            bad.append(f"--temperature {self.temperature} must be in (0, 2]")
        if any(not 0 < b < self.epochs for b in self.budget_runs):
            bad.append(f"--budget-runs {','.join(map(str, self.budget_runs))}: each must lie between 0 and --epochs ({self.epochs})")
        if bad:
            raise InputError("; ".join(bad))

    @property
    def options(self) -> tuple[str, ...]:
        """Every schedule a unit trains: the three sets, then the extra schedules."""
        return tuple(dict.fromkeys((*SETS, *self.schedules)))

    @property
    def models(self) -> list[str]:
        """Every lab model the sweep needs: its teacher model, then each student's builds (`NAME+bB`)."""
        return ([self.teacher[len("lab:"):]] if self.teacher_model else []) + [
            f"{s}+b{b}" if b else s for s in self.ladder for b in self.builds]

    @property
    def ladder(self) -> tuple[str, ...]:
        return self.sizes or tuple(LADDER)

    @classmethod
    def quick_settings(cls, out: str) -> "CalibrateConfig":
        return cls(out=out, sizes=("xs",), seeds=(0,), mean_seeds=(), tasks=("modchain",), epochs=1, n_train=64,
                   n_eval=8, candidates=4, evals_per_epoch=2, batch=16, probe_steps=4, probe_batch=4,
                   probe_eval_every=2, probe_eval_problems=8, max_new_tokens=24, teacher="program", quick=True)

    @classmethod
    def from_folder(cls, out: str | Path) -> "CalibrateConfig":
        """The settings a sweep folder was run with (its config.json), with `out` that folder."""
        path = Path(out) / "config.json"
        if not path.is_file():
            raise InputError(f"{out} has no config.json: name a folder written by `advisor lab calibrate --out`")

        saved = json_object(path, "name a folder written by `advisor lab calibrate --out`")
        if "inputs_key" in saved:
            raise InputError(f"{out} is an `advisor calibrate` folder (your own pool): give its records.jsonl to "
                             "`advisor fit --records`; this command takes `advisor lab calibrate` sweeps")
        settings = saved.get("settings")
        if not isinstance(settings, dict):
            raise InputError(f"{path} holds no sweep settings: name a folder written by `advisor lab calibrate --out`")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k in cls.__dataclass_fields__}
        cfg = cls(**{**kw, "out": str(out)})
        cfg.validate()  # settings of the wrong type or out of range: one error, not a failure later
        return cfg

    @property
    def source(self) -> str:
        """The pool source this sweep samples from: the teacher, and its temperature for a model."""
        return self.teacher if self.scripted else f"{self.teacher}@T{self.temperature:g}"

    @property
    def scripted(self) -> bool:
        """Whether a scripted teacher (no model, no temperature) writes the pools."""
        return self.teacher in SCRIPTED_TEACHERS

    @property
    def teacher_model(self) -> str | None:
        """The teacher whose view the evaluations report (none for a scripted teacher)."""
        return None if self.scripted else self.teacher


@dataclass(frozen=True)
class Cell:
    """One cell of the sweep's grid: a task, a ranking, a ladder student's build and a seed. The sweep
    runs a calibration unit there (`calibration.sweep.lab_unit`: a probe and a full run per option)
    in the folder TASK/RANKING/NAME; published records and reports name their unit by it."""

    task: str
    score: str
    size: str
    seed: int
    build: int = 0  # the student's pretraining build (0: the ladder's own)

    @property
    def name(self) -> str:
        return f"{self.size}{f'+b{self.build}' if self.build else ''}-s{self.seed}"

    @property
    def model(self) -> str:
        """The student's model spec: `lab:SIZE`, or `lab:SIZE+bB` for another build."""
        return lab_model(self.size, self.build)

    def folder(self, out: Path) -> Path:
        return out / self.task / self.score / self.name

    @classmethod
    def from_name(cls, task: str, score: str, name: str) -> "Cell | None":
        """The cell a folder named `name` (`SIZE-sSEED` or `SIZE+bB-sSEED`) holds; None for any other name."""
        head, _, seed = name.rpartition("-s")
        try:
            size, steps, build = parse_name(head)
        except InputError:
            return None
        if not seed.isdigit() or steps is not None:
            return None
        return cls(task=task, score=score, size=size, seed=int(seed), build=build)


def cells(cfg: CalibrateConfig) -> list[Cell]:
    """Every cell: the summed-ranking arm first, and in each arm the most expensive (largest
    students) first, so that parallel jobs finish together."""
    out = [Cell(t, "sum", s, seed, b) for t in cfg.tasks for s in cfg.ladder for seed in cfg.seeds for b in cfg.builds]
    out += [Cell(t, "mean", s, seed, b) for t in cfg.tasks for s in cfg.ladder for seed in cfg.mean_seeds for b in cfg.builds]
    return sorted(out, key=lambda u: (u.score != "sum", u.seed, u.build, -n_params(u.size), u.task))


def budget_run_name(option: str, budget: float) -> str:
    """The folder of a set's run of just `budget` epochs (its own schedule, as the manifest of
    `advisor recommend --budget B` trains it)."""
    return f"{option}-e{budget:g}"


def unit_runs(cfg: CalibrateConfig, cell: Cell) -> list[tuple[str, str, float | None]]:
    """(run folder, option, epochs) of every full run the unit of a cell trains: one per option at the
    sweep's budget, then, on the first seed, each set at every budget of --budget-runs (None: the
    sweep's epochs)."""
    extra = [(budget_run_name(o, b), o, b) for b in cfg.budget_runs for o in SETS] if cell.seed == min(cfg.seeds) else []
    return [*((o, o, None) for o in cfg.options), *extra]


def run_names(cfg: CalibrateConfig, cell: Cell) -> list[str]:
    """The run folders a cell's unit holds when finished: one per option, and its budget runs."""
    return [name for name, _, _ in unit_runs(cfg, cell)]
