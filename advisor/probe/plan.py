"""A probe's plan: every setting settled, each with where it came from.

`plan_probe` settles them from the recipe the predictor's inputs were measured with
(`probes.recipe.fitted_recipe`), the recipe for the student's kind, the user's flags, the model's
context and the pool's size; and it says plainly where the probe then measures otherwise than the
predictor's inputs were measured. `advisor probe`, `advisor recommend` and both calibrations plan
through it, so the same student, pool and predictor give the same features from any of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from importlib import resources

from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.advisor.predictor import Predictor
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.numbers import whole
from capacity_advisor.models.loading import hub_options, load_tokenizer, resolve_model_path
from capacity_advisor.models.template import response_ids
from capacity_advisor.probes.recipe import (
    Fitted, LENGTHS, RECIPE_FLAGS, Recipe, field_of, fitted_recipe, flag, setting_name,
)
from capacity_advisor.probes.run import ProbeConfig
from capacity_advisor.probes.student import Student

FROM_PREDICTOR = "the predictor (its inputs were measured so)"
RESPONSE_BOUND = 1.5  # a real student's new tokens: this many times the pool's 99th-percentile response
MIN_NEW_TOKENS = 64
RESPONSES_READ = 4000  # candidates whose tokens bound the new tokens (a seeded sample of a larger pool)
SHIPPED = "predictor_data"  # package folder of the default predictor


def predictor_root(path: str | None):
    return path if path is not None else resources.files("capacity_advisor.advisor") / SHIPPED


def load_predictor(path: str | None):
    return Predictor.load(predictor_root(path))


@dataclass(frozen=True)
class ProbePlan:
    """A probe's settings, where each came from, and how they stand against the predictor's recipe."""

    recipe: Recipe
    sources: dict  # recipe setting -> where its value came from
    fitted: Fitted | None = None
    departing: frozenset = frozenset()  # settings the user's flags (or a small pool) moved
    build_note: str | None = None  # the model folder's build.json was not read (`Student.note`)

    def settings(self) -> dict:
        """{name: {"value", "source"}} for every recipe setting, named after its flag."""
        return {setting_name(k): {"value": getattr(self.recipe, k), "source": self.sources[k]}
                for k in RECIPE_FLAGS}

    def within(self, context: int | None) -> "ProbePlan":
        """The plan within a model's context (`max_position_embeddings`), the caps said in the sources."""
        capped = self.recipe.capped(context)
        sources = {k: (f"{s}, capped at the model's context ({context:,} positions)"
                       if getattr(capped, k) != getattr(self.recipe, k) else s) for k, s in self.sources.items()}
        return replace(self, recipe=capped, sources=sources)

    def for_pool(self, problems: int) -> "ProbePlan":
        """The plan for a pool of `problems` rankable problems: held-out problems cut to a quarter
        of a pool too small for the recipe (unless a flag set them); InputError when the pool
        cannot hold the probe at all."""
        r, plan = self.recipe, self
        eval_flag, batch_flag = flag("eval_problems"), flag("batch_size")
        if problems < 2 * (r.eval_problems + r.batch_size) and self.sources["eval_problems"] != eval_flag \
                and problems // 4 < r.eval_problems:
            plan = replace(self, recipe=replace(r, eval_problems=max(1, problems // 4)),
                           sources={**self.sources, "eval_problems": f"capped at a quarter of the pool's {problems} problems"},
                           departing=self.departing | {"eval_problems"})
        r = plan.recipe
        if problems < r.eval_problems + r.batch_size:
            raise InputError(f"the pool has {problems} rankable problems; a probe needs {eval_flag} ({r.eval_problems}) "
                             f"held out plus at least {batch_flag} ({r.batch_size}) to train on: use a larger pool or "
                             "smaller settings")
        return plan

    def for_responses(self, lengths: list[int]) -> "ProbePlan":
        """The plan bounded by the pool's own responses (`lengths`: their tokens under the student):
        a real student's evaluations generate at most RESPONSE_BOUND x the 99th percentile of those
        (rounded up to 16, at least MIN_NEW_TOKENS), unless a flag set the new tokens. A student
        that learned the pool's style stops within it; one that rambles or loops is cut there, so
        the probe's cost is what it trains, not what it generates."""
        r = self.recipe
        if r.kind != "real" or not lengths or self.sources["max_new_tokens"] == flag("max_new_tokens"):
            return self
        ordered = sorted(lengths)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        bound = max(MIN_NEW_TOKENS, -(-int(RESPONSE_BOUND * (p99 + 1)) // 16) * 16)
        if bound >= r.max_new_tokens:
            return self
        why = (f"bounded by the pool's responses: {RESPONSE_BOUND:g} x their 99th percentile ({p99:,} tokens), "
               f"from {r.max_new_tokens:,}")
        return replace(self, recipe=replace(r, max_new_tokens=bound), sources={**self.sources, "max_new_tokens": why})

    def notes(self) -> tuple[list[str], bool]:
        """Lines saying that the folder's build.json was not read, and where this probe measures
        otherwise than the predictor's inputs were measured; and whether the user's flags (or pool)
        caused any of the latter."""
        lines = [self.build_note] if self.build_note else []
        if self.fitted is None:
            return lines, False
        moved, kept = [], []
        for k in self.fitted.stated:
            value, theirs = getattr(self.recipe, k), getattr(self.fitted.recipe, k)
            if value != theirs:
                # a student of the predictor's own kind is measured its way in every setting
                same_kind = self.recipe.kind == self.fitted.recipe.kind
                (moved if k in self.departing or same_kind else kept).append(
                    f"{setting_name(k)} {value:,} ({self.sources[k]}) where they had {theirs:,}")
        if moved:
            lines.append("the probe measured otherwise than the predictor's inputs were measured: " + "; ".join(moved)
                         + ". The predictor reads these features as if measured its way")
        if kept:
            lines.append(f"the predictor's inputs were measured on {self.fitted.recipe.kind} students; this "
                         f"{self.recipe.kind} student is probed with its own kind's lengths: " + "; ".join(kept))
        return lines, bool(moved)

    def probe_config(self, **run) -> ProbeConfig:
        return ProbeConfig(self.recipe, **run)


def plan_probe(student: Student, fitted: Fitted | None = None, given: dict | None = None) -> ProbePlan:
    """The probe's settings before the model's context and the pool are known (`ProbePlan.within`,
    `ProbePlan.for_pool`): the predictor's recipe where it states one (its lengths only for students
    of its own kind), else the recipe for the student's kind; then the flags in `given` ({recipe
    setting: value})."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    own = student.recipe
    check_given(given)
    sources = {k: "lab default" if own.kind == "lab" else "default for real students" for k in RECIPE_FLAGS}
    recipe = own
    if fitted is not None:
        lengths = {field_of(k) for k in LENGTHS}
        take = [k for k in fitted.stated if fitted.recipe.kind == own.kind or k not in lengths]
        recipe = recipe.with_(**{k: getattr(fitted.recipe, k) for k in take})
        sources.update({k: FROM_PREDICTOR for k in take})
    recipe = recipe.with_(**given)
    sources.update({k: flag(k) for k in given})
    departing = set(given)
    if "eval_every" in given and given["eval_every"] > recipe.steps:
        raise InputError(f"{flag('eval_every')} {given['eval_every']} must not exceed the probe's steps "
                         f"({recipe.steps}, {sources['steps']})")
    if recipe.eval_every > recipe.steps:
        recipe = replace(recipe, eval_every=recipe.steps)
        sources["eval_every"] = "capped at the probe steps"
        if "steps" in given:
            departing.add("eval_every")
    return ProbePlan(recipe, sources, fitted, frozenset(departing), student.note)


def response_lengths(pool: Pool, tokenizer, seed: int = 0) -> list[int]:
    """Tokens of the pool's usable candidates under `tokenizer` (with the EOS a trained student
    writes): all of them, or a seeded sample of RESPONSES_READ of a larger pool."""
    texts = [c.text for p in pool.problems for c in p.candidates]
    if len(texts) > RESPONSES_READ:
        texts = random.Random(seed).sample(texts, RESPONSES_READ)
    return [len(response_ids(tokenizer, t, add_eos=True)) for t in texts]


def bound_by_responses(plan: ProbePlan, pool: Pool, spec: str, seed: int = 0) -> ProbePlan:
    """`plan.for_responses` with the pool's candidates read under `spec`'s tokenizer (a real
    student's only: the lab's recipe has its own bound)."""
    if plan.recipe.kind != "real" or plan.sources["max_new_tokens"] == flag("max_new_tokens"):
        return plan

    path = resolve_model_path(spec)
    return plan.for_responses(response_lengths(pool, load_tokenizer(path, hub_options(path)), seed))


def check_given(given: dict) -> None:
    bad = []
    for k, v in given.items():
        if k not in RECIPE_FLAGS:
            raise InputError(f"{k} is not a probe setting")
        low = 0 if k == "warmup_steps" else 8 if k in ("train_length", "score_length") else 1
        if not whole(v, low):
            bad.append(f"{flag(k)} {v} must be at least {low}")
    if bad:
        raise InputError("; ".join(bad))


def predictor_plan(student: Student, predictor, given: dict | None = None) -> ProbePlan:
    """`plan_probe` with the recipe a loaded predictor states (checked: its file is user input)."""
    return plan_probe(student, fitted_recipe(predictor.meta), given)
