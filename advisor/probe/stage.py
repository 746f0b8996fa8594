"""The probe stage from the advisor's side: its settings, the held-out split, the run.

    advisor probe --model lab:s --pool pool.jsonl --out runs/probe

`plan_probe` settles every setting of a probe, each with where it came from: the recipe the
predictor's inputs were measured with (`probes.recipe.fitted_recipe`), the recipe for the
student's kind, the user's flags, the model's context and the pool's size; and it says plainly
where the probe then measures otherwise than the predictor's inputs were measured. `advisor probe`
and `advisor recommend` both probe through it, so the same student, pool and predictor give the
same features from either verb.

A held-out slice of `eval_problems` problems (drawn with the seed) never enters probe training:
its prompts are generated from, its references checked, and its high and low responses form the
teacher set. The rest give D_high / D_low / D_mixed by the student's own scores.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from statistics import mean

from capacity_advisor.core.numbers import whole
from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.advisor.scoring.score import ScoreConfig
from capacity_advisor.advisor.scoring.select import SelectConfig, select
from capacity_advisor.training import text_metrics as metrics
from capacity_advisor.core.errors import InputError
from capacity_advisor.probes.recipe import (
    LENGTHS, REAL, RECIPE_FLAGS, Fitted, Recipe, field_of, fitted_recipe, flag, setting_name,
)
from capacity_advisor.probes.run import ProbeConfig, ProbeData, ProbeReport
from capacity_advisor.probes.student import Student, student_of
from capacity_advisor.training.manifest import DEFAULT_MIX
from capacity_advisor.training.ranking import DEFAULT_RANKING

FROM_PREDICTOR = "the predictor (its inputs were measured so)"
RESPONSE_BOUND = 1.5  # a real student's new tokens: this many times the pool's 99th-percentile response
MIN_NEW_TOKENS = 64
RESPONSES_READ = 4000  # candidates whose tokens bound the new tokens (a seeded sample of a larger pool)
SHIPPED = "predictor_data"  # package folder of the default predictor


def predictor_root(path: str | None):
    return path if path is not None else resources.files("capacity_advisor.advisor") / SHIPPED


def load_predictor(path: str | None):
    from capacity_advisor.advisor.predictor import Predictor

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
    from capacity_advisor.models.template import response_ids

    texts = [c.text for p in pool.problems for c in p.candidates]
    if len(texts) > RESPONSES_READ:
        texts = random.Random(seed).sample(texts, RESPONSES_READ)
    return [len(response_ids(tokenizer, t, add_eos=True)) for t in texts]


def bound_by_responses(plan: ProbePlan, pool: Pool, spec: str, seed: int = 0) -> ProbePlan:
    """`plan.for_responses` with the pool's candidates read under `spec`'s tokenizer (a real
    student's only: the lab's recipe has its own bound)."""
    if plan.recipe.kind != "real" or plan.sources["max_new_tokens"] == flag("max_new_tokens"):
        return plan
    from capacity_advisor.models.loading import hub_options, load_tokenizer, resolve_model_path

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


# ---- the held-out split and the sets --------------------------------------------------------


def pick_checker(pool: Pool, checker: str = metrics.CHECKER_DEFAULT) -> str:
    return metrics.choose_checker(checker, pool.has_answers, pool.tasks)


@dataclass
class Split:
    data: ProbeData
    train_ids: list[str]
    eval_ids: list[str]
    selection_summary: dict


def build_probe_data(pool: Pool, scores: dict, cfg: ProbeConfig, tokenizer=None, checker: str = metrics.CHECKER_DEFAULT,
                     mix: float = DEFAULT_MIX, score: str = DEFAULT_RANKING) -> Split:
    r = cfg.recipe
    if len(pool) < r.eval_problems + r.batch_size:
        raise InputError(
            f"the pool has {len(pool)} rankable problems; a probe needs {flag('eval_problems')} "
            f"({r.eval_problems}) held out plus at least {flag('batch_size')} ({r.batch_size}) to train on: "
            "use a larger pool or smaller settings"
        )
    high = select(pool, scores, SelectConfig("high", score=score))
    low = select(pool, scores, SelectConfig("low", score=score))
    mixed = select(pool, scores, SelectConfig("mixed", mix=mix, seed=cfg.seed, score=score))
    ids = [p.id for p in pool.problems]
    held = set(random.Random(cfg.seed).sample(ids, r.eval_problems))
    eval_ids = [i for i in ids if i in held]
    train_ids = [i for i in ids if i not in held]

    def pairs(sel, keep):
        return [(r["prompt"], r["response"]) for r in sel.rows if r["id"] in keep]

    keep = set(train_ids)
    check = pick_checker(pool, checker)
    context = {
        "problems": len(pool),
        "train_problems": len(train_ids),
        "eval_problems": len(eval_ids),
        "score": score,
        "likelihood_gap": high.summary["likelihood_gap"],
        "likelihood_gap_per_token": high.summary["likelihood_gap_per_token"],
        "length_ratio_low_high": high.summary["length_ratio_low_high"],
        "mean_tokens_high": high.summary["mean_tokens_high"],
        "mean_tokens_low": high.summary["mean_tokens_low"],
    }
    if tokenizer is not None:
        from capacity_advisor.models.template import prompt_ids

        prompt_tokens = mean(len(prompt_ids(tokenizer, p.prompt)) for p in pool.problems)
        resp = (context["mean_tokens_high"] + context["mean_tokens_low"]) / 2
        # one epoch of the full SFT over the pool's problems less the held-out ones (recommend's train.jsonl),
        # at the mean of the two sets' lengths
        context["full_run_tokens_per_epoch"] = max(1, len(pool) - len(eval_ids)) * (prompt_tokens + resp)
    data = ProbeData(
        train={"high": pairs(high, keep), "low": pairs(low, keep), "mixed": pairs(mixed, keep)},
        eval_prompts=[pool.get(i).prompt for i in eval_ids],
        eval_answers=[pool.get(i).answer for i in eval_ids],
        teacher_high=pairs(high, held),
        teacher_low=pairs(low, held),
        checker=check,
        context=context,
    )
    return Split(data, train_ids, eval_ids, high.summary)


# ---- scores, then the probe -----------------------------------------------------------------

LOCAL_WINDOW = 32  # tokens of context each step is scored with under --score local
SCORING = "scoring"  # what `probe_pool`'s progress names the scoring by (its other names are the probed sets)


def progress_label(name: str, prefix: str = "probe ") -> str:
    """How a progress display names one of `probe_pool`'s counts: the scoring, or a probed set."""
    return "scoring candidates" if name == SCORING or name.startswith(SCORING + " ") else f"{prefix}D_{name}"


def given_scores(path: str, pool: Pool, score: str = DEFAULT_RANKING, skip_tokens: int | None = None) -> dict:
    """Scores a user hands over (`--scores`), read and checked against the pool and the settings
    asked for (`skip_tokens`; None: any) before any work."""
    from capacity_advisor.advisor.scoring.select import load_scores

    scores = load_scores(path)
    made = scores_skip_tokens(path, scores)
    if skip_tokens is not None and made is not None and made != skip_tokens:
        raise InputError(f"--scores {path} were made with --skip-tokens {made}, not {skip_tokens}: pass "
                         f"--skip-tokens {made}, or score the pool again with --skip-tokens {skip_tokens}")
    missing = [p.id for p in pool.problems if any((p.id, c.k) not in scores for c in p.candidates)]
    if missing:
        raise InputError(f"--scores {path} does not cover {len(missing)} of the pool's {len(pool)} problems (first: "
                         f"{missing[0]!r}): they are scores of another pool, or of this one read with other field or "
                         "filter flags; score this pool under this model with `advisor score` (the same pool flags) "
                         "and pass those, or drop --scores to score it now")
    if score != "sum":
        select(pool, scores, SelectConfig("high", score=score))  # the ranking's own fields are there
    return scores


def scores_skip_tokens(path: str, scores: dict) -> int | None:
    """The --skip-tokens a scores file was made with: its config.json says so, else its rows do
    (n_tokens - n_scored, the same in every row long enough); None when neither tells."""
    import json
    from pathlib import Path

    try:
        recorded = json.loads((Path(path).parent / "config.json").read_text(encoding="utf-8"))["settings"]["skip_tokens"]
        if whole(recorded):
            return recorded
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    gaps = {r["n_tokens"] - r["n_scored"] for r in scores.values()
            if isinstance(r.get("n_scored"), int) and r["n_scored"] > 0 and isinstance(r.get("n_tokens"), int)}
    return gaps.pop() if len(gaps) == 1 else None


@dataclass
class ProbeStage:
    scores: dict  # (problem id, k) -> score row
    split: Split
    report: ProbeReport | None  # None when the probe was not run


def probe_pool(student: Student, pool: Pool, cfg: ProbeConfig, lm, score_dir, probe_dir, scores: dict | None = None,
               checker: str = metrics.CHECKER_DEFAULT, score: str = DEFAULT_RANKING, mix: float = DEFAULT_MIX,
               score_length: int = REAL.score_length,
               backend: str = "hf", run: bool = True, say=None, progress=None, skip_tokens: int = 0,
               token_budget: int | None = None, shard_size: int = ScoreConfig.shard_size) -> ProbeStage:
    """Score the pool under the student (cached; unless `scores` are given), split it, and probe.

    The one path from a pool to probe measurements, for `advisor probe`, `advisor recommend` and
    both calibrations. `say(message)` reports the stage; `progress(strategy, step, total)` the
    probe's steps, and `progress(SCORING, done, total)` the candidates scored; `token_budget` and `shard_size` are the scoring's (`ScoreConfig`).
    """
    from capacity_advisor.advisor.scoring.score import score_pool
    from capacity_advisor.advisor.scoring.select import load_scores
    from capacity_advisor.probes.run import run_probe

    say = say or (lambda message: None)
    cfg.validate()
    if scores is None:
        say(f"scoring {pool.n_candidates:,} candidates under the student (cached)")
        counted = [0, 0]  # done, total

        def on_start(total: int, done: int) -> None:
            counted[:] = [done, total]
            progress(SCORING, done, total)

        def advance(n: int) -> None:
            counted[0] += n
            progress(SCORING, *counted)

        score_pool(pool, ScoreConfig(student.spec, device=cfg.device, dtype=cfg.dtype, backend=backend, score_length=score_length,
                                     token_budget=token_budget, shard_size=shard_size, skip_tokens=skip_tokens,
                                     local_window=LOCAL_WINDOW if score == "local" else 0),
                   score_dir, lm=lm if backend == "hf" else None,
                   on_start=on_start if progress else None, advance=advance if progress else None)
        scores = load_scores(Path(score_dir) / "scores.jsonl")
    split = build_probe_data(pool, scores, cfg, tokenizer=lm.tokenizer, checker=checker, mix=mix, score=score)
    report = None
    if run:
        say(f"probing {', '.join(f'D_{s}' for s in cfg.strategies)}")
        report = run_probe(student, split.data, cfg, probe_dir, lm=lm, progress=progress)
    return ProbeStage(scores, split, report)


# ---- `advisor probe` ---------------------------------------------------------------------------


@dataclass
class ProbeJob:
    """What `advisor probe` is asked; each field is the flag of the same name."""

    model: str
    pool: str
    out: str
    scores: str | None = None  # scores.jsonl of this pool under this model (else scored now, cached)
    predictor: str | None = None  # whose recipe to measure with (None: the shipped predictor's)
    recipe: dict = field(default_factory=dict)  # recipe settings given by flags ({setting: value})
    learning_rate: float | None = None  # None: the recipe's rule
    strategies: tuple[str, ...] = ("high", "low")
    lora_r: int = 0
    teacher: str | None = None
    checker: str = metrics.CHECKER_DEFAULT
    score: str = DEFAULT_RANKING
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    pool_options: dict = field(default_factory=dict)


def probe_job(job: ProbeJob, say=None, progress=None) -> dict:
    """`advisor probe`: every input checked before any work (flags, model, pool, scores, predictor,
    the probe's fit in the pool), then the student loaded and probed. Returns the probe report
    with `chosen` (each setting and its source) and `notes` (where it measured otherwise than
    the predictor's inputs)."""
    from capacity_advisor.advisor.pools.read import PoolOptions, read_pool
    from capacity_advisor.models.loading import check_model_spec, load_model

    say = say or (lambda message: None)
    run = dict(learning_rate=job.learning_rate, strategies=tuple(job.strategies), lora_r=job.lora_r, seed=job.seed,
               device=job.device, dtype=job.dtype, teacher=job.teacher)
    student = student_of(job.model)
    plan = predictor_plan(student, load_predictor(job.predictor), job.recipe)
    plan.probe_config(**run).validate()
    check_model_spec(job.model)
    from capacity_advisor.core.files import refuse_overwrite

    refuse_overwrite([job.pool, job.scores, job.predictor], [job.out], "--out")
    pool = read_pool(job.pool, PoolOptions(**job.pool_options))
    plan = bound_by_responses(plan.for_pool(len(pool)), pool, job.model, job.seed)
    scores = given_scores(job.scores, pool, job.score) if job.scores else None
    say(f"loading {job.model}")
    lm = load_model(job.model, device=job.device, dtype=job.dtype)
    student = student.described(lm.description)
    plan = plan.within(lm.description.get("max_position_embeddings"))
    rate = (job.learning_rate, "--learning-rate") if job.learning_rate else student.learning_rate()
    cfg = plan.probe_config(**{**run, "learning_rate": rate[0]})
    stage = probe_pool(student, pool, cfg, lm, Path(job.out) / "score", job.out, scores=scores, checker=job.checker,
                       score=job.score, score_length=plan.recipe.score_length, say=say, progress=progress)
    notes, _ = plan.notes()
    if plan.fitted is not None and (job.learning_rate or job.lora_r):
        notes.append("the probe measured otherwise than the predictor's inputs were measured: "
                     + "; ".join(x for x in (f"--learning-rate {job.learning_rate:g}" if job.learning_rate else "",
                                             f"--lora-r {job.lora_r}" if job.lora_r else "") if x)
                     + " (the predictor's were measured at the recipe's rate, with full fine-tuning)")
    chosen = {**plan.settings(), "learning_rate": {"value": rate[0], "source": rate[1]}}
    return {**stage.report.as_dict(), "chosen": chosen, "notes": notes}
