"""The probe recipe: how a probe is run for each kind of student, defined once.

    from capacity_advisor.probes.recipe import LAB
    cfg = ProbeConfig(LAB.with_(steps=50), seed=0, device="cpu")  # probes.run: a probe measuring exactly that way
    student_of("lab:m").recipe                     # probes.student: the recipe for the student's kind

`advisor probe`, `advisor recommend` and both calibrations take their probe settings from here,
and a fitted predictor stores the recipe its inputs were measured with (`as_dict()`, under
`meta.recipe`; `fitted_recipe` reads it back), so a probe measured another way is reported rather
than silently read as if it matched. Two lengths: `train_length` (prompt + response tokens of a
training sequence, the probe's and the full run's) and `score_length` (of a scored candidate).
Files name the training length `max_length`, as a manifest's `training` and TRL's SFTConfig do.

Two kinds: `lab` (the embedded lab's students, whose responses are under a hundred characters)
and `real` (everything else: reasoning traces of thousands of tokens). The step count and the
number of held-out problems are the lab's cheapest probe within 0.5 points of held-out regret of
the best (experiments/probe_cost.py, docs/results.md section 5); the rest follows the kind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.numbers import whole
from capacity_advisor.models.backends import SCORE_LENGTH
from capacity_advisor.models.lab.ladder import MAX_LENGTH as LAB_CONTEXT
from capacity_advisor.training.manifest import EvalSpec, Manifest, TrainingSpec

DEFAULT_STEPS = 25
DEFAULT_EVAL_PROBLEMS = 64
FULL_RUN_EVAL_PROBLEMS = 200  # held-out problems at each evaluation of a calibration's full runs (lab and own pool)
# The settings that shape a probe's measurements, as files name them (a predictor's meta.recipe, a
# record's settings.probe, a probe report's settings): a predictor fitted on one recipe reads
# features measured with another only if these agree.
MEASURING = ("steps", "batch_size", "eval_every", "eval_problems", "max_new_tokens", "max_length", "warmup_steps")
LENGTHS = ("max_new_tokens", "max_length")  # bounds that follow the kind of student, not the predictor
FIELDS = {"max_length": "train_length"}  # a file's name of a setting -> the Recipe field, where they differ
MAX_SETTING = 1_000_000  # no recipe setting is larger; a file that says otherwise is refused


# Each recipe setting: its flag, the same in every verb that probes (`advisor probe`, `advisor
# recommend`), and its help. The CLI builds the verbs' options from this table, and every message
# about a setting names its flag; reports and config.json name the setting after it.
RECIPE_FLAGS = {
    "steps": ("--probe-steps", "Optimizer steps per probed set."),
    "batch_size": ("--probe-batch", "Sequences per probe step."),
    "eval_every": ("--probe-eval-every", "Probe steps between evaluation points."),
    "eval_problems": ("--probe-eval-problems", "Held-out problems the probe generates on and checks (never trained on)."),
    "warmup_steps": ("--probe-warmup-steps", "Linear warm-up steps of the probe, then a constant rate."),
    "max_new_tokens": ("--max-new-tokens", "New tokens per evaluation generation: the probe's, and the full run's "
                                           "(recommend's manifest)."),
    "train_length": ("--train-length", "Training: prompt + response tokens, the probe's and the full run's "
                                       "(recommend's manifest)."),
    "score_length": ("--score-length", "Scoring: prompt + response tokens of each candidate (longer ones are cut "
                                       "and flagged)."),
}
# The names each verb took before they were one: refused, with the flag to use instead
# ({verb: {setting: old flag}}; `--max-length` meant the training length in one verb and the
# scoring length in another).
OLD_FLAGS = {
    "probe": {"steps": "--steps", "batch_size": "--batch-size", "eval_every": "--eval-every",
              "eval_problems": "--eval-problems", "warmup_steps": "--warmup-steps", "train_length": "--max-length"},
    "recommend": {"train_length": "--probe-max-length", "score_length": "--max-length"},
    "score": {"score_length": "--max-length"},
}

def flag(setting: str) -> str:
    return RECIPE_FLAGS[setting][0]


def field_of(name: str) -> str:
    """The Recipe field a measuring setting is, from the name files give it (MEASURING)."""
    return FIELDS.get(name, name)


def file_name(setting: str) -> str:
    """The name files give a recipe setting (a Recipe field): `field_of` turned round."""
    return next((name for name, f in FIELDS.items() if f == setting), setting)


def setting_name(setting: str) -> str:
    """How reports and config.json name a recipe setting: after its flag."""
    return flag(setting)[2:].replace("-", "_")



@dataclass(frozen=True)
class Recipe:
    """How a probe measures, and the lengths, batch and new tokens of the full run it advises on;
    the configs that run it hold one (`ProbeConfig.recipe`), rather than copies of its settings."""

    kind: str  # "lab" or "real"
    steps: int = DEFAULT_STEPS  # optimizer steps per set
    batch_size: int = 8  # sequences per step
    eval_every: int = 25  # steps between evaluation points
    eval_problems: int = DEFAULT_EVAL_PROBLEMS  # held-out problems generated on at each point
    max_new_tokens: int = 2048  # generation bound at each evaluation (the probe's and the full run's)
    train_length: int = TrainingSpec.max_length  # prompt + response tokens in probe training (and the full run's)
    warmup_steps: int = 10  # linear warm-up, then a constant rate (a shorter probe is a prefix of a longer one)
    token_budget: int | None = None  # padded tokens per evaluation batch (None: the backend's default)
    score_length: int = SCORE_LENGTH  # scoring: prompt + response tokens of each candidate (longer ones are cut and flagged)
    train_batch: int = TrainingSpec.batch_size  # sequences per optimizer step of the full run the manifest describes

    def as_dict(self) -> dict:
        """What a predictor stores as `meta.recipe` (and a record as `settings.probe`): the kind and
        every measuring setting, as files name them."""
        return {"kind": self.kind, **{k: getattr(self, field_of(k)) for k in MEASURING}}

    def with_(self, **changes) -> "Recipe":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def capped(self, context: int | None) -> "Recipe":
        """The recipe within a model's context: training and scoring length at most `context`, new
        tokens at most three quarters of it (prompt and generation share it)."""
        if not context or context < 16:
            return self
        return replace(self, train_length=min(self.train_length, context), score_length=min(self.score_length, context),
                       max_new_tokens=min(self.max_new_tokens, max(8, context * 3 // 4)))


def full_run_manifest(recipe: Recipe, *, epochs: float, learning_rate: float, seed: int, eval: dict,
                      training: dict | None = None, **fields):
    """The training manifest of a full run under `recipe`, the one builder of recommend's manifest
    and of calibration's runs (the lab's and the user's own): the recipe's training length, full-run
    batch, new tokens and evaluation token budget; `eval` and `training` add the EvalSpec and
    TrainingSpec fields that are the caller's (held-out file, checker, evaluations per epoch, ...);
    `fields` are the Manifest's own (model, dataset, strategy, mix, features, pool, ...)."""
    return Manifest(
        # per-problem correctness kept: a race decides on one half of the problems, judged on the other
        eval=EvalSpec(**{"max_new_tokens": recipe.max_new_tokens, "token_budget": recipe.token_budget,
                         "per_problem": True, **eval}),
        training=TrainingSpec(**{"batch_size": recipe.train_batch, **(training or {}), "epochs": epochs,
                                 "learning_rate": learning_rate, file_name("train_length"): recipe.train_length,
                                 "seed": seed}),
        **fields)


# The lab's students train and score at their whole context (`ladder.MAX_LENGTH`, every task's longest pair).
LAB = Recipe("lab", max_new_tokens=72, train_length=LAB_CONTEXT, token_budget=16384, score_length=LAB_CONTEXT,
             train_batch=32)
# Reasoning traces run to thousands of tokens; 64 held-out generations of up to 2,048 tokens at
# each of the 3 evaluation points (the base, then each set after its steps) is the probe's largest
# cost on a GPU.
REAL = Recipe("real")
RECIPES = {r.kind: r for r in (LAB, REAL)}


def size_learning_rate(n_params: int) -> float:
    """Full-fine-tuning rates in the range SFT recipes use by size (tiny lab students tolerate far more)."""
    if n_params < 10e6:
        return 1e-3
    if n_params < 200e6:
        return 2e-4
    if n_params < 3e9:
        return 2e-5
    return 1e-5


def check_recipe(raw) -> dict:
    """A recipe read from a file a user may hand over (a predictor's `meta.recipe`), checked. Every
    measuring setting but the lengths is required (records that differed in a length leave it out)."""
    if not isinstance(raw, dict) or raw.get("kind") not in RECIPES:
        raise InputError("the predictor's meta.recipe must be an object with 'kind' lab or real")
    out = {"kind": raw["kind"]}
    for k in MEASURING:
        if k in LENGTHS and k not in raw:  # records that differed in it (a probe takes its own kind's)
            continue
        v = raw.get(k)
        if not whole(v, 0 if k == "warmup_steps" else 1, MAX_SETTING):
            raise InputError(f"the predictor's meta.recipe.{k} must be a whole number from "
                             f"{0 if k == 'warmup_steps' else 1} to {MAX_SETTING:,}: refit it with `advisor fit`")
        out[k] = v
    if out["eval_every"] > out["steps"]:
        raise InputError("the predictor's meta.recipe.eval_every exceeds its steps: refit it with `advisor fit`")
    return out


def read_recipe(raw: dict) -> Recipe:
    """The recipe a file states (`as_dict()`'s form: its kind, and measuring settings by their files'
    names), its kind's defaults for the settings it leaves out."""
    return RECIPES[raw["kind"]].with_(**{field_of(k): raw[k] for k in MEASURING if k in raw})


PROBE_STATES = ("steps", "eval_problems")  # what a predictor file's older `meta.probe` states


@dataclass(frozen=True)
class Fitted:
    """The recipe a predictor's inputs were measured with, and which of its settings the file states."""

    recipe: Recipe
    stated: tuple[str, ...]  # the Recipe fields of the measuring settings the predictor file gives; the rest are its kind's


def fitted_recipe(meta) -> Fitted | None:
    """The recipe a predictor's inputs were measured with, from its `meta`: `meta.recipe`; for
    files that predate it, the lab recipe with `meta.probe`'s steps and held-out problems (the
    only settings those files state); None when the file says neither. Checked: a predictor file
    is user input."""
    meta = meta if isinstance(meta, dict) else {}
    if meta.get("recipe") is not None:
        raw = check_recipe(meta["recipe"])
        return Fitted(read_recipe(raw), tuple(field_of(k) for k in MEASURING if k in raw))
    p = meta.get("probe")
    if p is None:
        return None
    if not (isinstance(p, dict) and all(whole(p.get(k), 1, 100_000) for k in PROBE_STATES)):
        raise InputError("the predictor's meta.probe must hold whole numbers 'steps' and 'eval_problems' "
                         "between 1 and 100000: refit it with `advisor fit`")
    return Fitted(LAB.with_(**{k: p[k] for k in PROBE_STATES}), PROBE_STATES)
