"""`advisor recommend`: score, select, probe, predict — and write what training needs.

    advisor recommend --model lab:m --budget 3 --out runs/rec
    advisor recommend --model ./qwen-1.5b --budget 5 --pool openr1.parquet --sample 2000 --out runs/rec
    advisor recommend --model ./config-only-folder --budget 5 --no-probe --out runs/rec   # the paper's findings

Writes OUT/recommendation.json (the manifest `advisor train` consumes unchanged), OUT/train.jsonl
(the selected data, TRL prompt/completion), OUT/eval.jsonl (the probe's held-out slice, when the
pool has reference answers), OUT/report.png, OUT/config.json; OUT/score/ and OUT/probe/ keep the
stages' own outputs, so a rerun resumes from them. A folder that holds a recommendation for other
inputs is refused, before any work.

`recommend` reads as its steps: check every input (`check_inputs`), describe the student, then
either advise from the priors alone (`advise_only`) or take the pool, score and probe it
(`measure`), ask the predictor (`advise`), and write the dataset, manifest, config and figure
(`write_outputs`). The probe's settings come from `probe.plan.plan_probe` (the predictor's
recipe, the student's kind, the flags, the model's context, the pool's size), each reported with
where it came from.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from capacity_advisor.advisor.lab.student import describe_student, lab_identity, lab_pool
from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.advisor.predictor import Policy, calibrated_source
from capacity_advisor.advisor.predictor.advice import Advice
from capacity_advisor.advisor.predictor.priors import PAPER_FROM, check_lab_prior, paper_prior_advice, prior_advice
from capacity_advisor.advisor.probe.plan import (
    ProbePlan, bound_by_responses, check_given, load_predictor, predictor_plan,
)
from capacity_advisor.advisor.probe.stage import LOCAL_WINDOW, given_scores, probe_pool
from capacity_advisor.advisor.recommendation import figure
from capacity_advisor.advisor.recommendation.draws import (
    by_proxy_rule, calibrated_line, combined_cost, draw_advice, draws_line, mean_features, pool_contrasts, probe_folder,
    race_note, race_plan,
)
from capacity_advisor.advisor.recommendation.result import (
    BUDGET_GRID, Recommendation, recommendation, write_advice, write_manifest,
)
from capacity_advisor.advisor.scoring.select import RANKINGS, SelectConfig, export, select
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    check_writable_dir, finite, folder_lock, recorded_key, refuse_overwrite, stable_hash, versions, write_json,
    write_jsonl,
)
from capacity_advisor.models import loading
from capacity_advisor.models.backends import BACKENDS
from capacity_advisor.models.lab.tasks import FAMILIES, PRETRAINED
from capacity_advisor.models.loading import check_model_spec, describe_config
from capacity_advisor.probes.recipe import file_name
from capacity_advisor.probes.student import Student, student_of
from capacity_advisor.training.manifest import SETS
from capacity_advisor.training.manifest_checks import MAX_EPOCHS
from capacity_advisor.training.ranking import DEFAULT_RANKING
from capacity_advisor.training.text_metrics import CHECKER_DEFAULT

MAX_REPEATS = 8  # --probe-repeats: each draw costs one more probe


@dataclass
class RecommendConfig:
    model: str  # --model
    budget: float  # --budget: epochs of the full run
    out: str  # --out
    pool: str | None = None  # --pool; None: the lab's teacher pool (lab students only)
    scores: str | None = None  # --scores: scores.jsonl of this pool under this model (e.g. from `score --backend vllm`)
    teacher: str | None = None  # --teacher: a teacher model, for the teacher view in the probe
    no_probe: bool = False  # --no-probe: a prior from parameter count and budget alone
    predictor: str | None = None  # --predictor: a folder written by `advisor fit`; None: the shipped one
    lab_task: str = "modchain"  # --lab-task
    lab_n: int = 1000  # --lab-n: problems of the lab pool
    sample: int | None = None  # --sample: rank and probe on N problems drawn with --seed
    recipe: dict = field(default_factory=dict)  # probe settings given by flags: {recipe setting: value} (probes.recipe.RECIPE_FLAGS)
    backend: str = "hf"  # --backend for scoring (the probe always trains with hf)
    score: str = DEFAULT_RANKING  # --score: rank candidates by summed log-prob (the paper's), mean per token (GRAPE's), rsr or local
    skip_tokens: int = 0  # --skip-tokens: leave each response's first N tokens out of its score
    checker: str = CHECKER_DEFAULT
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    probe_repeats: int = 1  # --probe-repeats: probes from N draws (held-out slice and data order: seeds seed..seed+N-1), inputs averaged
    pool_options: dict = field(default_factory=dict)

    def settings(self) -> dict:
        """The settings as config.json and the inputs key have always named them (a recipe flag by
        the name files give its setting: --train-length's is `max_length`)."""
        return {**asdict(self), "recipe": {file_name(k): v for k, v in self.recipe.items()}}

    def validate(self, student: Student) -> None:
        bad = []
        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and 0 < self.budget <= MAX_EPOCHS):
            bad.append(f"--budget {self.budget} must be a positive number of epochs, at most {MAX_EPOCHS:,} "
                       "(the manifest's training.epochs)")
        if self.scores and not self.pool:
            bad.append("--scores needs the --pool they were computed on")
        if self.score not in RANKINGS:
            bad.append(f"--score {self.score!r} is unknown: use {', '.join(RANKINGS)}")
        if self.skip_tokens < 0:
            bad.append(f"--skip-tokens {self.skip_tokens} must be at least 0")
        if self.backend not in BACKENDS:
            bad.append(f"--backend {self.backend!r} is unknown: use {' or '.join(BACKENDS)}")
        if self.sample is not None and self.sample < 1:
            bad.append(f"--sample {self.sample} must be at least 1")
        if self.lab_n < 1:
            bad.append(f"--lab-n {self.lab_n} must be at least 1")
        if not 1 <= self.probe_repeats <= MAX_REPEATS:
            bad.append(f"--probe-repeats {self.probe_repeats} must be from 1 to {MAX_REPEATS}")
        elif self.probe_repeats > 1 and self.no_probe:
            bad.append("--probe-repeats repeats the probe, and --no-probe runs none: drop one of them")
        if self.lab_task not in PRETRAINED:  # the built-in pool is the lab teacher model's, pretrained on these only
            bad.append(f"--lab-task {self.lab_task!r} has no built-in pool: use one of {', '.join(PRETRAINED)}"
                       + (f" (for {self.lab_task}, write a pool with `advisor lab pool --task {self.lab_task}` and pass "
                          "--pool)" if self.lab_task in FAMILIES else ""))
        if not self.pool and student.size is None and not self.no_probe:
            bad.append(f"--pool is needed to probe {self.model} (only lab students have a built-in pool); "
                       "or pass --no-probe for advice from the parameter count alone")
        try:
            check_given(self.recipe)
        except InputError as e:
            bad.append(str(e))
        if bad:
            raise InputError("; ".join(bad))


@dataclass
class Checked:
    """What recommend reads before any work, every part of it checked."""

    predictor: object  # the Predictor
    plan: ProbePlan  # the probe's settings, within a described student's context and the user's pool
    key: str  # what the out folder is made from
    student: Student  # not yet described for a lab student (describing it may pretrain it)
    pool: object | None  # the user's pool, sampled; None: the lab pool, taken when the work starts
    pool_size: int  # problems of the user's pool before --sample drew from it
    scores: dict | None  # the user's --scores, checked against the pool


def recommend(cfg: RecommendConfig, status=None, progress=None) -> Recommendation:
    """The flow of the module doc; `status(message)` reports the stage, `progress(strategy, step,
    total)` the probe's steps. Nothing is reported, and nothing written, before every check passed.
    One writer in OUT at a time (`core.files.folder_lock`)."""
    with folder_lock(cfg.out):
        say = status or (lambda message: None)
        t0 = time.time()
        checked = check_inputs(cfg)
        student, plan = checked.student, checked.plan
        if student.description is None:  # a lab student: built, and so its context known, only now
            student = student.described(describe_student(cfg.model, say))
            plan = plan.within(student.description.get("max_position_embeddings"))
        if cfg.no_probe and not cfg.pool:
            return advise_only(cfg, checked, student, plan, t0)
        pool, whole = (checked.pool, checked.pool_size) if checked.pool is not None else take_pool(cfg, say)
        plan = plan if checked.pool is not None else plan.for_pool(len(pool))
        settings = chosen_settings(cfg, plan, student)
        heavy = None if cfg.no_probe else probe_outweighs_run(plan.recipe, len(pool) - plan.recipe.eval_problems, cfg.budget)
        if heavy:
            say(f"note: {heavy}")
        stages = measure(cfg, student, pool, checked.scores, plan, settings, say, progress)
        rec = advise(cfg, checked.predictor, student.description, settings, stages, plan, pool.fingerprint())
        return write_outputs(cfg, rec, pool, whole, stages[0], checked, plan.recipe, t0)


def check_inputs(cfg: RecommendConfig) -> Checked:
    """Flags, model, out folder, predictor, pool and scores: every input recommend reads, checked
    before any work (a lab student is not pretrained, no file is written)."""
    student = student_of(cfg.model)
    cfg.validate(student)
    check_model_spec(cfg.model)
    check_writable_dir(cfg.out, "--out")
    out = Path(cfg.out)
    refuse_overwrite([cfg.pool, cfg.scores, cfg.predictor],
                     [out, *(out / name for name in ("train.jsonl", "train-high.jsonl", "train-low.jsonl", "eval.jsonl",
                                                     "recommendation.json", "config.json",
                                                     "report.png", "score",
                                                     *(probe_folder(r) for r in range(cfg.probe_repeats))))], "--out")
    predictor = load_predictor(cfg.predictor)
    plan = predictor_plan(student, predictor, cfg.recipe)
    desc = None if student.size is not None else describe_config(cfg.model)
    key = inputs_key(cfg, desc["fingerprint"] if desc else lab_identity(cfg.model), plan.recipe.as_dict())
    if desc is not None:
        student, plan = student.described(desc), plan.within(desc.get("max_position_embeddings"))
    scoring = plan.recipe.score_length
    if cfg.skip_tokens >= scoring - 1 and not (cfg.no_probe and not cfg.pool):  # the prompt takes a token at least
        raise InputError(f"--skip-tokens {cfg.skip_tokens} leaves nothing to score within --score-length {scoring} "
                         "(the scoring length): lower --skip-tokens")
    if cfg.no_probe and (desc is None or desc["n_params"] < PAPER_FROM):  # the lab prior will answer
        check_lab_prior(predictor.meta.get("lab_prior"), predictor.options)
    if recorded_key(out, "inputs_key") not in (None, key):
        raise InputError(f"{out} holds a recommendation made from other inputs (model, pool or settings); "
                         "pass a new --out, or delete that folder to start over")
    pool = scores = None
    whole = 0
    if cfg.pool:
        pool = read_pool(cfg.pool, PoolOptions(**cfg.pool_options), sample=cfg.sample, seed=cfg.seed)
        whole = pool.whole_problems or len(pool)
        plan = plan.for_pool(len(pool))
        if desc is not None:  # a real student's evaluations are bounded by the pool's own responses
            plan = bound_by_responses(plan, pool, cfg.model, cfg.seed)
        if cfg.scores:
            scores = given_scores(cfg.scores, pool, cfg.score, cfg.skip_tokens)
    return Checked(predictor, plan, key, student, pool, whole, scores)


def inputs_key(cfg: RecommendConfig, model_identity, recipe: dict) -> str:
    """What a recommendation folder was made from (the flags, the model, and the probe recipe the
    predictor states); a folder is reused only for the same inputs."""
    d = cfg.settings()
    for informational in ("out", "predictor", "device"):
        d.pop(informational)
    if d["probe_repeats"] == 1:  # folders made before the setting existed keep their key
        d.pop("probe_repeats")
    return stable_hash({"config": d, "model": model_identity, "recipe": recipe})


def take_pool(cfg: RecommendConfig, say) -> tuple:
    """The lab teacher's pool for a lab student (OUT/pool.jsonl), sampled; and its size before."""
    pool = read_pool(lab_pool(cfg.lab_task, cfg.lab_n, Path(cfg.out), say), sample=cfg.sample, seed=cfg.seed)
    return pool, pool.whole_problems or len(pool)


def chosen_settings(cfg: RecommendConfig, plan: ProbePlan, student: Student) -> dict:
    """Every setting recommend chose, {name: {"value", "source"}}: the probe's, then the run's."""
    lr, lr_source = student.learning_rate()
    kind = "lab default" if plan.recipe.kind == "lab" else "default for real students"
    return {**plan.settings(), "learning_rate": {"value": lr, "source": lr_source},
            "train_batch": {"value": plan.recipe.train_batch, "source": kind},
            "score": {"value": cfg.score, "source": "--score" if cfg.score != "sum" else "default (the paper's ranking)"}}


def measure(cfg: RecommendConfig, student: Student, pool, scores, plan: ProbePlan, settings: dict, say, progress) -> list:
    """Load the student, score the pool (or take --scores), split off the held-out slice, probe;
    with --probe-repeats N, N probes, the r-th from seed + r (its own held-out slice, mixed set and
    data order; the pool's scores are shared). One stage per draw, the first being --seed's."""
    say(f"loading {student.spec}")
    lm = loading.load_model(student.spec, device=cfg.device, dtype=cfg.dtype)
    out = Path(cfg.out)
    stages = []
    for r in range(cfg.probe_repeats):
        pcfg = plan.probe_config(learning_rate=settings["learning_rate"]["value"], seed=cfg.seed + r, device=cfg.device,
                                 dtype=cfg.dtype, teacher=cfg.teacher)
        tell = progress
        if r and progress is not None:
            tell = (lambda s, step, total, d=r + 1: progress(f"{s} (draw {d} of {cfg.probe_repeats})", step, total))
        stages.append(probe_pool(student, pool, pcfg, lm, out / "score", out / probe_folder(r),
                                 scores=stages[0].scores if stages else scores, checker=cfg.checker, score=cfg.score,
                                 score_length=plan.recipe.score_length, skip_tokens=cfg.skip_tokens, backend=cfg.backend,
                                 run=not cfg.no_probe, say=say if not r else (lambda m, d=r + 1: say(f"{m} (draw {d} of {cfg.probe_repeats})")),
                                 progress=tell))
    return stages


def prior(cfg: RecommendConfig, n_params: float, predictor) -> tuple[Advice, dict]:
    """The priors' advice at the budget, and their curve over BUDGET_GRID."""
    advice = prior_advice(n_params, cfg.budget, predictor)
    by_budget = [prior_advice(n_params, b, predictor).probabilities for b in BUDGET_GRID]
    return advice, {s: [p[s] for p in by_budget] for s in SETS}


def advise(cfg: RecommendConfig, predictor, desc: dict, settings: dict, stages: list, plan: ProbePlan,
           pool_fingerprint: str | None = None) -> Recommendation:
    """The predictor's answer on the probe's measurements (averaged over the draws when there are
    several; each draw's own answer beside it); the priors' without a probe. On a pool the user
    calibrated with proxies (its content hash among the predictor's own sources), the policy
    chosen for that case answers, or the proxy rule where the proxies' own runs put D_low ahead
    (`by_proxy_rule`), and the report says so."""
    stage = stages[0]
    context = stage.split.data.context
    measured = pool_contrasts(context)
    draws = race = None
    calibrated = calibrated_source(predictor, pool_fingerprint)
    if stage.report is None:
        advice, curve = prior(cfg, desc["n_params"], predictor)
    else:
        reports = [st.report for st in stages]
        measured.update(mean_features(reports))
        advice, curve, draws, race = measured_advice(cfg, predictor, desc, plan, measured, calibrated,
                                                     context if len(stages) > 1 else None, reports,
                                                     sequence_ratio(context))
    probe = stage.report if len(stages) == 1 or stage.report is None else \
        replace(stage.report, cost=combined_cost([st.report for st in stages]))
    return recommendation(advice, curve, predictor, desc, settings, cfg.budget, cfg.score, measurements=measured,
                          draws=draws, calibrated_on=calibrated, probe=probe, race=race)


def probe_outweighs_run(recipe, train_problems: int, budget: float) -> str | None:
    """Where the probe trains each set on at least as many sequences as the full run at `budget`
    does on the pool's training problems (a pool of a few hundred problems at a short budget), a
    race of D_high against D_low to the end of the budget trains less than the probe does (at most
    one run of the losing set, where the probe trains both sets that much) and answers from the
    two sets' own results: the line saying so, else None."""
    probe, run = recipe.steps * recipe.batch_size, budget * max(train_problems, 0)
    if run <= 0 or probe < run:
        return None
    return (f"the probe trains each set on {probe:,} sequences, {probe / run:.1f}x what a {budget:g}-epoch run on this "
            f"pool's {train_problems:,} training problems does: on a pool this small, racing D_high against D_low to "
            "the end of the budget (advisor train OUT/recommendation.json --out RUN --race 1) trains less than the probe "
            "and answers from both sets' own results; --no-probe skips the probe")


def sequence_ratio(context: dict) -> float | None:
    """Tokens an epoch of D_low trains over an epoch of D_high's (one response a problem each: the
    ratio of their mean sequences, prompt included); None where the pool's context lacks them."""
    p, hi, lo = (context.get(k) for k in ("prompt_tokens_mean", "mean_tokens_high", "mean_tokens_low"))
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (p, hi, lo)) or p + hi <= 0 or p + lo <= 0:
        return None
    return (p + lo) / (p + hi)


def measured_advice(cfg: RecommendConfig, predictor, desc: dict, plan: ProbePlan, measured: dict,
                    calibrated: dict | None, context: dict | None, reports: list, token_ratio: float | None = None
                    ) -> tuple[Advice, dict, list | None, dict | None]:
    """The policy's advice on the measured inputs, its curve over BUDGET_GRID, each draw's own
    advice (`context` given: several draws) and the race its gate opened (`draws.race_plan`, or
    None). The confidence is low where a fallback answered, where the probe departed from the
    predictor's recipe, or where the draws disagree."""
    policy = Policy.of(predictor, own_source=calibrated is not None)
    decision = policy.decide(predictor, measured, desc["n_params"], cfg.budget, cfg.score, student=cfg.model)
    advice = decision.advice_given(policy.describe(), predictor.reasons(measured, cfg.budget, cfg.score))
    probs = predictor.over_budgets(measured, BUDGET_GRID, cfg.score)
    curve = {o: probs[:, j].tolist() for j, o in enumerate(predictor.options)}
    notes, low = plan.notes()
    heavy = probe_outweighs_run(plan.recipe, reports[0].context.get("train_problems", 0), cfg.budget)
    if heavy:
        notes.append(heavy)
    draws = None
    if context is not None:
        draws = draw_advice(cfg, predictor, policy, desc, context, reports)
        line, agree = draws_line(draws, decision.strategy)
        notes.append(line)
        low = low or not agree
    if calibrated is not None:
        advice = by_proxy_rule(cfg, predictor, calibrated, advice, notes)
        notes.insert(0, calibrated_line(predictor, calibrated))
    advice = replace(advice, confidence="low" if low else advice.confidence,
                     confidence_reasons=tuple(notes) + advice.confidence_reasons,
                     # what the paper found for students of this size, beside the measurement
                     paper_prior=paper_prior_advice(desc["n_params"], cfg.budget) if desc["n_params"] >= PAPER_FROM else None)
    return advice, curve, draws, race_plan(predictor, decision.race, real_student=plan.recipe.kind != "lab",
                                           token_ratio=token_ratio)


def advise_only(cfg: RecommendConfig, checked: Checked, student: Student, plan: ProbePlan, t0: float) -> Recommendation:
    """`--no-probe` without a pool: advice from the parameter count, nothing scored, no weights read."""
    desc = student.description
    settings = chosen_settings(cfg, plan, student)
    advice, curve = prior(cfg, desc["n_params"], checked.predictor)
    rec = replace(recommendation(advice, curve, checked.predictor, desc, settings, cfg.budget, cfg.score),
                  seconds=round(time.time() - t0, 1))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_advice(rec, out)
    write_config(cfg, checked.key, settings)
    figure.write_figure(rec, checked.predictor, out / "report.png")
    return rec


def write_outputs(cfg: RecommendConfig, rec: Recommendation, pool, whole: int, stage, checked: Checked, recipe,
                  t0: float) -> Recommendation:
    """The recommended set minus the probe's held-out slice (train.jsonl), that slice (eval.jsonl),
    the manifest, config.json and the figure; returns the Recommendation with what was written."""
    out = Path(cfg.out)
    held = set(stage.split.eval_ids)
    s = rec.schedule
    sel = select(pool, stage.scores, SelectConfig(strategy=s.strategy, mix=s.mix, seed=cfg.seed, score=cfg.score))
    sel.rows = [r for r in sel.rows if r["id"] not in held]
    export(sel, out / "train.jsonl", "trl")
    sets = {}  # the other of D_high / D_low, so `advisor train --race` can race them (the recommended one is train.jsonl)
    for name in ("high", "low"):
        if s.strategy != name:
            other = select(pool, stage.scores, SelectConfig(strategy=name, seed=cfg.seed, score=cfg.score))
            other.rows = [r for r in other.rows if r["id"] not in held]
            export(other, out / f"train-{name}.jsonl", "trl")
            sets[name] = f"train-{name}.jsonl"
    eval_rows = [{"prompt": pool.get(i).prompt, "answer": pool.get(i).answer, "task": pool.get(i).task}
                 for i in stage.split.eval_ids if pool.get(i).answer is not None]
    if eval_rows:
        write_jsonl(out / "eval.jsonl", eval_rows)
    notes = list(rec.notes)
    if rec.race is not None and not eval_rows:  # nothing to judge the two sets on
        notes.append(f"the policy's gate opened a race ({rec.race['why']}), but the pool has no reference answers to "
                     f"compare D_high and D_low on: train D_{s.option} alone, or give a pool with answers")
        rec = replace(rec, race=None)
    if len(pool) < whole:
        notes.append(sample_note(cfg, rec, len(sel.rows), whole, len(held)))
    if sets and rec.race is None and (line := race_note(checked.predictor, cfg.out)):
        notes.append(line)
    rec = replace(rec, selection=sel.summary, train_rows=len(sel.rows), eval_rows=len(eval_rows),
                  checker=stage.split.data.checker, notes=notes, seconds=round(time.time() - t0, 1),
                  pool={**pool.summary(), "source": Path(str(pool.source)).name,
                        **({"sampled": cfg.sample} if cfg.sample else {})})
    write_manifest(rec, out, recipe, cfg.model, cfg.teacher, cfg.seed, sets)
    write_config(cfg, checked.key, rec.settings)
    figure.write_figure(rec, checked.predictor, out / "report.png")
    return rec


def write_config(cfg: RecommendConfig, key: str, settings: dict) -> None:
    write_json(Path(cfg.out) / "config.json", finite({"stage": "recommend", "inputs_key": key, "settings": cfg.settings(),
                                                      "chosen": settings, "versions": versions()}))


def sample_note(cfg: RecommendConfig, rec: Recommendation, train_rows: int, whole: int, held: int) -> str:
    """What --sample did to train.jsonl, and how to train on the whole pool instead (scored and
    ranked exactly as the advice was)."""
    pool = cfg.pool or f"{cfg.out}/pool.jsonl"
    scoring = f" --score-length {rec.value('score_length')}"
    if cfg.skip_tokens:
        scoring += f" --skip-tokens {cfg.skip_tokens}"
    if cfg.score == "local":
        scoring += f" --local-window {LOCAL_WINDOW}"
    ranking = f" --score {cfg.score}" if cfg.score != "sum" else ""
    return (f"train.jsonl holds the {cfg.sample} problems --sample drew, less the probe's {held} held out "
            f"({train_rows} rows), not the pool's {whole:,}. To train on the whole pool, rerun without --sample (it "
            f"scores every problem; the probe stays this size), or select it from the pool's scores: advisor score "
            f"--model {cfg.model} --pool {pool}{scoring} --out {cfg.out}/score-all, then advisor select --pool {pool} "
            f"--scores {cfg.out}/score-all/scores.jsonl {rec.schedule.select_flags()}{ranking} --out {cfg.out}/train-all.jsonl "
            f"(with the same pool flags), and set \"dataset\" in recommendation.json to train-all.jsonl")
