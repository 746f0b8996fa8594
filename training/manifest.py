"""The recommendation manifest: what `advisor recommend` writes and `advisor train` consumes unchanged.

    from capacity_advisor.training.manifest import load_manifest, Manifest, TrainingSpec, EvalSpec
    m = load_manifest("rec/recommendation.json")     # validated; relative paths resolved
    m = Manifest(model={"spec": "lab:m"}, dataset="train.jsonl", training=TrainingSpec(epochs=3))
    m.to_json("rec/recommendation.json")              # validated, then written atomically

Relative paths (`dataset`, `eval.path`) are relative to the manifest's own folder, so a
recommendation folder can be moved as a whole. Validation collects every problem and raises one
`InputError` naming each field to fix; unknown keys are rejected (a typo must not silently fall
back to a default).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import special_kind, write_json
from capacity_advisor.core.numbers import number
from capacity_advisor.models.backends import NEW_TOKENS
from capacity_advisor.training.manifest_checks import (
    MAX_COUNT, MAX_EPOCHS, MAX_TOKENS, is_line, is_one_of, key_list, race_problems, show, training_problems,
    whole_problems,
)
from capacity_advisor.training.text_metrics import CHECKERS

MANIFEST_VERSION = 1
STRATEGIES = ("high", "low", "mixed", "curriculum")
SETS = STRATEGIES[:3]  # the sets a probe trains on; the predictor's options are these and the schedules below
DEFAULT_MIX = 0.5  # D_mixed: the share of problems that take their low response (the paper's mix)


def option_of(strategy: str, mix: float | None = None, switch_epoch: float | None = None) -> str:
    """The name of a schedule: high, low, mixed (half the problems on their low response),
    mixed@F (a share F of them), curriculum@E (D_high for E epochs, then D_low)."""
    if strategy == "mixed" and mix is not None and abs(mix - DEFAULT_MIX) > 1e-9:
        return f"mixed@{mix:g}"
    if strategy == "curriculum":
        return f"curriculum@{switch_epoch:g}"
    return strategy


def schedule_of(option: str) -> tuple[str, float, float | None]:
    """(strategy, mix, switch_epoch) of an option name; InputError when it names none."""
    strategy, _, arg = option.partition("@")
    try:
        value = float(arg) if arg else None
    except ValueError:
        value = None
        arg = "?"
    if strategy in ("high", "low") and not arg:
        return strategy, 0.0, None
    if strategy == "mixed" and (not arg or (value is not None and 0 < value < 1)):
        return "mixed", value if value is not None else DEFAULT_MIX, None
    if strategy == "curriculum" and value is not None and 0 < value <= MAX_EPOCHS:  # not inf, nor nan
        return "curriculum", 0.0, value
    raise InputError(f"{option!r} names no schedule: use high, low, mixed, mixed@SHARE (0 < SHARE < 1) or "
                     f"curriculum@EPOCHS (0 < EPOCHS <= {MAX_EPOCHS:,})")


def option_order(option: str) -> tuple:
    """The order in which near-tied options are preferred: the cheaper, steadier first (high, then
    mixes by rising share of low responses, then curricula by falling epochs of D_high, then low)."""
    strategy, mix, switch = schedule_of(option)
    return {"high": (0, 0.0), "mixed": (1, mix), "curriculum": (2, -(switch or 0.0)), "low": (3, 0.0)}[strategy]


@dataclass
class EvalSpec:
    """Held-out evaluation at every checkpoint: pass@1 with answer checking, repetition rate."""

    path: str | None = None  # JSONL of {"prompt", "answer", "task"?}; None: no generation eval
    checker: str = "none"  # lab (the lab's exact checker) | math (math-verify, else boxed/last-number match) | none
    max_new_tokens: int = NEW_TOKENS  # generation bound (a loop that hits it counts as repetition)
    temperature: float = 0.0  # 0 = greedy pass@1; > 0 samples one completion per prompt
    limit: int | None = 200  # first `limit` rows of the eval file; None = all
    teacher: str | None = None  # a teacher model (folder, hub id, lab:NAME): its NLL of the generations is teacher_view
    base_drift: bool = False  # report the frozen base student's NLL of the generations (one more model in memory)
    per_problem: bool = False  # keep each problem's correctness and answer log-likelihood in eval.jsonl
    view_limit: int | None = None  # teacher_view / base_drift on the first N generations only; None = all
    token_budget: int | None = None  # padded tokens per generation / scoring batch; None = the backend's default
    # the scoring measures (answer_logprob, teacher_nll, base_drift, teacher_view) at every Nth evaluation
    # and always at step 0, at whole epochs and at the last one; accuracy and the rates at every evaluation
    measure_every: int = 1


@dataclass
class TrainingSpec:
    """Training settings; the paper's protocol by default (4 evaluations per epoch over the budget)."""

    epochs: float = 3  # the epoch budget
    learning_rate: float = 1e-5  # peak learning rate
    batch_size: int = 16  # sequences per optimizer step over all processes (= per-device x processes x grad_accum)
    grad_accum: int = 1  # micro-batches per optimizer step on each process
    max_length: int = 2048  # prompt + response tokens; longer pairs keep the prompt and the response's start
    evals_per_epoch: int = 4  # evaluations (and checkpoints) per epoch
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.03  # share of all steps spent warming up
    warmup_steps: int | None = None  # warm-up in steps, instead of warmup_ratio (probes: so a shorter probe is a prefix of a longer one)
    max_steps: int | None = None  # stop after this many optimizer steps (probes); None: the epochs decide
    eval_every: int | None = None  # evaluate every N steps (probes) instead of evals_per_epoch per epoch
    eval_at: list | None = None  # also evaluate at the first step at or past each of these shares of the budget (races)
    weight_decay: float = 0.0
    seed: int = 0  # data order, init of LoRA weights, sampling
    lora: dict | None = None  # None = full-parameter SFT; {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
    save_total_limit: int | None = 2  # checkpoints kept on disk (oldest deleted first); None = all
    switch_epoch: float | None = None  # curriculum: rows with phase=high before this epoch, phase=low after
    gradient_checkpointing: bool = False  # trade compute for memory on large students
    rerank: dict | None = None  # {"epochs": [2, 4], "candidates": "candidates.jsonl", "score": "sum"}: re-choose the rows (training.rerank)


@dataclass
class Manifest:
    """A recommendation plus everything needed to run the training it recommends."""

    model: dict  # {"spec": "lab:NAME | /path | org/name", ...models.loading.describe() output}
    dataset: str  # TRL prompt/completion JSONL (+ id, k, phase)
    strategy: str = "high"
    mix: float = 0.0
    probabilities: dict = field(default_factory=dict)
    crossover_epoch: float | None = None
    confidence: str | None = None
    reasons: list = field(default_factory=list)
    eval: EvalSpec = field(default_factory=EvalSpec)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    features: dict = field(default_factory=dict)  # probe features, copied into the RunRecord
    pool: dict = field(default_factory=dict)  # pool summary, copied into the RunRecord
    sets: dict = field(default_factory=dict)  # {"high": FILE, "low": FILE}: each set's own data, for `advisor train --race`
    race: dict | None = None  # the race the recommendation plans ({"fraction", "wait", "why", "expected"}; "k", "margin", "patient" where it stops on a lead; "tie" where it has a tie check): `advisor train` runs it
    version: int = MANIFEST_VERSION
    base_dir: str = field(default=".", repr=False, compare=False)  # the manifest's folder (not written)

    # ---- paths -------------------------------------------------------------------------
    def resolve(self, p: str | None) -> Path | None:
        if p is None:
            return None
        q = Path(os.path.expanduser(p))
        return q if q.is_absolute() else Path(self.base_dir) / q

    @property
    def dataset_path(self) -> Path:
        return self.resolve(self.dataset)  # type: ignore[return-value]

    @property
    def eval_path(self) -> Path | None:
        return self.resolve(self.eval.path)

    @property
    def candidates_path(self) -> Path | None:
        """training.rerank's candidates file, relative to the manifest's folder."""
        r = self.training.rerank
        return self.resolve(r["candidates"]) if isinstance(r, dict) and is_line(r.get("candidates")) else None

    @property
    def model_spec(self) -> str:
        return str(self.model.get("spec", "")) if isinstance(self.model, dict) else str(self.model)

    # ---- validation --------------------------------------------------------------------
    def problems(self, check_files: bool = True) -> list[str]:
        """Every field that must change, as 'field: what is wrong' strings. Any JSON value, of any
        type or size, in any field gives a problem here, never an exception."""
        bad: list[str] = []
        t, e = self.training, self.eval
        if not (number(self.version) and self.version == MANIFEST_VERSION):
            bad.append(f"version: {show(self.version)} is not supported (this tool reads version {MANIFEST_VERSION})")
        spec = self.model.get("spec") if isinstance(self.model, dict) else None
        if not isinstance(self.model, dict):
            bad.append(f"model: expected an object with a spec, got {show(self.model)}")
        elif not spec:
            bad.append("model.spec: missing (a local HF folder, a hub id, or lab:NAME)")
        elif not is_line(spec):
            bad.append(f"model.spec: must be one line of text (a local HF folder, a hub id, or lab:NAME), got {show(spec)}")
        bad += self._path_problems("dataset", self.dataset, "the selected training set, TRL prompt/completion JSONL",
                                   check_files, required=True)
        if not is_one_of(self.strategy, STRATEGIES):
            bad.append(f"strategy: {show(self.strategy)} is unknown (use {', '.join(STRATEGIES)})")
        if not number(self.mix) or not 0 <= self.mix <= 1:
            bad.append(f"mix: {show(self.mix)} must be between 0 and 1")
        for name, kind, what in (("probabilities", dict, "an object"), ("reasons", list, "an array"),
                                 ("features", dict, "an object"), ("pool", dict, "an object")):
            if not isinstance(getattr(self, name), kind):
                bad.append(f"{name}: must be {what}, got {show(getattr(self, name))}")
        if self.crossover_epoch is not None and not number(self.crossover_epoch):
            bad.append(f"crossover_epoch: must be a number or null, got {show(self.crossover_epoch)}")
        if self.confidence is not None and not isinstance(self.confidence, str):
            bad.append(f"confidence: must be text or null, got {show(self.confidence)}")
        bad += self._sets_problems(check_files)
        bad += self._race_problems(check_files)
        bad += training_problems(t)
        if check_files and self.candidates_path is not None and not self.candidates_path.is_file():
            bad.append(f"training.rerank.candidates: file {self.candidates_path} not found")
        bad += self._path_problems("eval.path", e.path, "a held-out JSONL of prompt/answer rows", check_files, required=False)
        if not is_one_of(e.checker, CHECKERS):
            bad.append(f"eval.checker: {show(e.checker)} is unknown (use {', '.join(CHECKERS)})")
        elif e.path is None and e.checker in ("lab", "math"):
            bad.append(f"eval.path: missing, but eval.checker is {e.checker!r} (give a held-out JSONL of prompt/answer rows, or checker none)")
        bad += whole_problems("eval.max_new_tokens", e.max_new_tokens, 1, MAX_TOKENS)
        if not number(e.temperature) or not 0 <= e.temperature <= 100:
            bad.append(f"eval.temperature: must be from 0 (greedy) to 100, got {show(e.temperature)}")
        for name in ("limit", "view_limit", "token_budget"):
            bad += whole_problems(f"eval.{name}", getattr(e, name), 1, MAX_COUNT, null=True)
        bad += whole_problems("eval.measure_every", e.measure_every, 1, MAX_COUNT)
        for name in ("base_drift", "per_problem"):
            if not isinstance(getattr(e, name), bool):
                bad.append(f"eval.{name}: must be true or false, got {show(getattr(e, name))}")
        return bad

    def _sets_problems(self, check_files: bool) -> list[str]:
        if not isinstance(self.sets, dict):
            return [f"sets: must be an object naming each set's data file (keys {', '.join(SETS)}), got {show(self.sets)}"]
        unknown = set(self.sets) - set(SETS)
        bad = [f"sets: unknown keys {key_list(unknown)} (use {', '.join(SETS)})"] if unknown else []
        for name in sorted(set(self.sets) & set(SETS)):
            bad += self._path_problems(f"sets.{name}", self.sets[name], f"the D_{name} training set, TRL prompt/completion JSONL",
                                       check_files, required=True)
        return bad

    def _race_problems(self, check_files: bool) -> list[str]:
        """The race's own fields, and that the manifest names D_high and D_low as two different files."""
        bad = race_problems(self.race)
        if self.race is None or bad or not isinstance(self.sets, dict):
            return bad
        files = {s: self.sets.get(s) or (self.dataset if self.strategy == s else None) for s in SETS[:2]}
        missing = [s for s, f in files.items() if not f]
        if missing:
            return [f"race: the manifest names no D_{missing[0]} (sets.{missing[0]}), so there is nothing to race; "
                    "add it, or remove race"]
        if check_files and all(is_line(f) for f in files.values()):
            a, b = (self.resolve(f) for f in files.values())
            try:
                same = a.is_file() and b.is_file() and a.samefile(b)
            except OSError:
                same = False
            if same:
                return [f"race: D_high and D_low are the same file ({files['high']}); a race needs each set's own data"]
        return []

    def _path_problems(self, name: str, value: Any, what: str, check_files: bool, required: bool) -> list[str]:
        if value is None or (required and value == ""):
            return [f"{name}: missing ({what})"] if required else []
        if not is_line(value):
            return [f"{name}: must be a file path on one line ({what}), got {show(value)}"]
        if not check_files:
            return []
        path = self.resolve(value)
        try:
            found = path.is_file()
        except OSError as err:  # e.g. a name longer than the filesystem allows
            return [f"{name}: {show(value)} cannot be a file here ({err.strerror})"]
        if found:
            return []

        kind = special_kind(path)  # a folder, a FIFO or a device where the file should be
        return [f"{name}: {show(value)} is {kind}, not a file" if kind else f"{name}: file {show(str(path))} not found"]

    def validate(self, check_files: bool = True, where: str = "manifest") -> "Manifest":
        bad = self.problems(check_files)
        if bad:
            raise InputError(f"{where}: fix " + "; ".join(bad))
        return self

    # ---- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("base_dir")
        for key in ("sets", "race"):  # written only when set, so manifests without them read as before
            if not d[key]:
                d.pop(key)
        if not d["training"].get("eval_at"):  # written only when set (null and [] alike): run keys stay as they were
            d["training"].pop("eval_at")
        if d["eval"].get("measure_every") == 1:  # written only when it thins the measures: run keys stay as they were
            d["eval"].pop("measure_every")
        return {"version": d.pop("version"), **d}

    def to_json(self, path: str | os.PathLike, check_files: bool = True) -> Path:
        """Validate (paths relative to `path`'s folder) and write atomically."""
        p = Path(path)
        probe = Manifest(**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "base_dir"},
                         base_dir=str(p.parent))
        probe.validate(check_files, where=str(p))
        write_json(p, self.to_dict())
        return p

    @classmethod
    def from_dict(cls, d: dict, base_dir: str | os.PathLike = ".", where: str = "manifest") -> "Manifest":
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("advice_only") is True:
            raise InputError(f"{where}: this manifest holds advice only (recommend ran with --no-probe and no --pool, "
                             "so there is no selected dataset to train on): rerun `advisor recommend` with --pool "
                             "to get a dataset and a training manifest")
        bad: list[str] = []
        d = dict(d)
        sub = {}
        for key, kind in (("training", TrainingSpec), ("eval", EvalSpec)):
            raw = d.pop(key, None)
            if raw is None:
                raw = {}
            if not isinstance(raw, dict):
                bad.append(f"{key}: expected an object, got {show(raw)}")
                raw = {}
            known = {f.name for f in fields(kind)}
            unknown = set(raw) - known
            if unknown:
                bad.append(f"{key}: unknown keys {key_list(unknown)} (known: {', '.join(sorted(known))})")
            sub[key] = kind(**{k: v for k, v in raw.items() if k in known})
        known_top = {f.name for f in fields(cls)} - {"base_dir", "training", "eval"}
        unknown = set(d) - known_top
        if unknown:
            bad.append(f"unknown top-level keys {key_list(unknown)}")
        if isinstance(d.get("model"), str):  # a bare spec is accepted for hand-written manifests
            d["model"] = {"spec": d["model"]}
        d.setdefault("model", {})
        d.setdefault("dataset", "")
        m = cls(**{k: v for k, v in d.items() if k in known_top}, **sub, base_dir=str(base_dir))
        bad += m.problems(check_files=True)
        if bad:
            raise InputError(f"{where}: fix " + "; ".join(bad))
        return m


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate a manifest; every problem is named in one InputError."""
    p = Path(path)
    if not p.is_file():
        kind = special_kind(p)
        raise InputError(f"manifest {p} {f'is {kind}' if kind else 'not found'}: pass the recommendation.json written "
                         "by `advisor recommend`")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"manifest {p} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except UnicodeDecodeError as e:
        raise InputError(f"manifest {p} is not valid UTF-8 (byte {e.start}); save it as UTF-8") from None
    except RecursionError:
        raise InputError(f"manifest {p} is nested too deeply to be a manifest") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise InputError(f"manifest {p} is not readable JSON ({e})") from None
    except OSError as e:
        raise InputError(f"cannot read manifest {p}: {e.strerror}") from None
    return Manifest.from_dict(d, base_dir=p.parent, where=str(p))
