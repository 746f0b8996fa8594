"""Probe runs: short SFT from the same base weights on D_high, D_low (and D_mixed), measured as they go.

    from capacity_advisor.probes.run import ProbeConfig, ProbeData, run_probe
    report = run_probe(student_of("lab:s"), data, ProbeConfig(LAB.with_(steps=100)), out_dir="runs/probe")

A probe is the full training run stopped early: each strategy is trained by `training.sft.run_sft`
— the trainer, schedule code, evaluation and loop detector `advisor train` and calibration use —
with smaller settings: `steps` optimizer steps at a constant learning rate after `warmup_steps`
(so a shorter probe is exactly the prefix of a longer one), evaluated every `eval_every` steps on
a fixed held-out slice of the pool. Every strategy starts from the same weights and sees its
problems in the same order (the trainer's seeded sampler over sets that list the same problems
in the same order), so the curves differ only by which response of each problem is trained on.

Each evaluation point holds `training.evaluate`'s metrics: train_loss, teacher_nll (+ _high /
_low: the held-out problems' own high and low responses), answer_logprob, accuracy,
answer_rate, repetition_rate, copy_rate, finish_rate, base_drift and, with a teacher model,
teacher_view. `features()` condenses the curves into the scale-free inputs the predictor reads.

Checkpoints at every evaluation point make a killed probe resume where it stopped; a folder that
holds a probe of another model, data or setting is refused (the trainer's run key).
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Callable, Sequence

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import atomic_path, finite, versions, write_json, write_jsonl
from capacity_advisor.models import loading
from capacity_advisor.models.template import encode_pair
from capacity_advisor.probes.recipe import REAL, Recipe, file_name, flag
from capacity_advisor.probes.student import Student
from capacity_advisor.training import sft, text_metrics as metrics
from capacity_advisor.training.manifest import EvalSpec, Manifest, SETS, TrainingSpec, schedule_of

METRICS = ("train_loss", "teacher_nll", "teacher_nll_high", "teacher_nll_low", "answer_logprob", "accuracy",
           "answer_rate", "repetition_rate", "copy_rate", "finish_rate", "base_drift", "teacher_view")

# What the selection measured on the pool under the base, without training: the likelihood gap,
# the length ratio and the candidates' own repetition (kept among the probe's features)
POOL_CONTRASTS = ("likelihood_gap_per_token", "length_ratio_low_high", *metrics.REPETITION_KEYS)


@dataclass
class ProbeConfig:
    """A probe run: the recipe it measures with (`probes.recipe`), and the run's own settings; each
    field is the CLI flag of the same name. The recipe defaults to the real students'."""

    recipe: Recipe = REAL  # steps, batch, warm-up, evaluation points, held-out problems, new tokens, lengths
    learning_rate: float | None = None  # --learning-rate; None: the recipe's rule (probes.recipe)
    strategies: tuple[str, ...] = ("high", "low")  # --strategies: add "mixed" to probe D_mixed too
    lora_r: int = 0  # --lora-r: 0 = full fine-tuning; > 0 = LoRA of that rank (peft)
    seed: int = 0  # --seed: data order
    device: str = "auto"  # --device
    dtype: str = "auto"  # --dtype
    teacher: str | None = None  # --teacher: a teacher model, for teacher_view
    per_problem: bool = False  # keep per-problem results (calibration: replay cheaper probes)

    def settings(self) -> dict:
        """What the probe report and its config.json state, as they always have: the recipe's
        settings by their files' names, among the run's (`advisor lab replay` reads them)."""
        r = self.recipe
        return {"steps": r.steps, "batch_size": r.batch_size, "learning_rate": self.learning_rate,
                "warmup_steps": r.warmup_steps, "eval_every": r.eval_every, "eval_problems": r.eval_problems,
                "max_new_tokens": r.max_new_tokens, file_name("train_length"): r.train_length,
                "strategies": list(self.strategies),
                "lora_r": self.lora_r, "seed": self.seed, "device": self.device, "dtype": self.dtype,
                "teacher": self.teacher, "per_problem": self.per_problem, "token_budget": r.token_budget}

    def validate(self) -> None:
        r, bad = self.recipe, []
        if r.steps < 1:
            bad.append(f"{flag('steps')} {r.steps} must be at least 1")
        if r.batch_size < 1:
            bad.append(f"{flag('batch_size')} {r.batch_size} must be at least 1")
        if r.eval_every < 1 or r.eval_every > r.steps:
            bad.append(f"{flag('eval_every')} {r.eval_every} must be between 1 and {flag('steps')} ({r.steps})")
        if r.warmup_steps < 0:
            bad.append(f"{flag('warmup_steps')} {r.warmup_steps} must be at least 0")
        if self.learning_rate is not None and not self.learning_rate > 0:
            bad.append(f"--learning-rate {self.learning_rate} must be positive")
        if r.eval_problems < 1:
            bad.append(f"{flag('eval_problems')} {r.eval_problems} must be at least 1")
        if r.max_new_tokens < 1:
            bad.append(f"--max-new-tokens {r.max_new_tokens} must be at least 1")
        if r.train_length < 8:
            bad.append(f"{flag('train_length')} {r.train_length} must be at least 8")
        unknown = [s for s in self.strategies if s not in SETS]
        if unknown or not self.strategies:
            bad.append(f"--strategies {','.join(self.strategies)}: use high, low and/or mixed")
        if bad:
            raise InputError("; ".join(bad))


@dataclass
class ProbeData:
    """What a probe trains and evaluates on, prepared by the advisor from a pool and its scores.

    `train[strategy]` lists (prompt, response) pairs; every list covers the same problems in the
    same order. `teacher_high` / `teacher_low` are the held-out problems' high and low responses.
    """

    train: dict[str, list[tuple[str, str]]]
    eval_prompts: list[str]
    eval_answers: list[str | None]
    teacher_high: list[tuple[str, str]]
    teacher_low: list[tuple[str, str]]
    checker: str = "none"
    context: dict = field(default_factory=dict)  # pool / selection summary: likelihood gap, length ratio, sizes

    def validate(self, strategies) -> None:
        missing = [s for s in strategies if s not in self.train]
        if missing:
            raise InputError(f"probe data has no training set for {', '.join(missing)}")
        sizes = {len(self.train[s]) for s in strategies}
        if len(sizes) != 1 or 0 in sizes:
            raise InputError("probe training sets must be non-empty and cover the same problems")
        if self.checker not in metrics.CHECKERS:
            raise InputError(f"unknown answer checker {self.checker!r}: use one of {', '.join(metrics.CHECKERS)}")

    def eval_rows(self) -> list[dict]:
        return [{"prompt": p, "answer": a, "references": {"high": h, "low": lo}}
                for p, a, (_, h), (_, lo) in zip(self.eval_prompts, self.eval_answers, self.teacher_high, self.teacher_low)]


Progress = Callable[[str, int, int], None]  # (strategy, step, total)
REPORT_VERSION = 2  # the layout of probe.json


@dataclass(frozen=True)
class ProbeReport:
    """What a probe measured; OUT/probe.json is `as_dict()`. `features` are what the predictor
    reads, `curves` the evaluation rows per set (step 0, then every `eval_every` steps), `cost` its
    tokens against the full run's."""

    version: int
    model: dict  # the base student's description, with its spec
    teacher: str | None
    settings: dict  # the probe's settings as files name them (`ProbeConfig.settings`), with its learning rate
    checker: str
    context: dict  # the pool and the selection: sizes, likelihood gap, length ratio
    curves: dict[str, list[dict]]
    features: dict
    cost: dict
    seconds: float
    versions: dict

    def as_dict(self) -> dict:
        return asdict(self)


def manifest_for(strategy: str, cfg: ProbeConfig, data: ProbeData, model: dict, lr: float, out: Path):
    """The training manifest of one strategy's probe run (files under OUT/data/)."""
    r = cfg.recipe
    return Manifest(
        model=model, dataset=f"data/{strategy}.jsonl", strategy=strategy, mix=schedule_of(strategy)[1],
        eval=EvalSpec(path="data/eval.jsonl", checker=data.checker, max_new_tokens=r.max_new_tokens, limit=None,
                      teacher=cfg.teacher, base_drift=True, per_problem=cfg.per_problem, token_budget=r.token_budget),
        training=TrainingSpec(epochs=1, learning_rate=lr, batch_size=r.batch_size, max_length=r.train_length,
                              lr_scheduler="constant_with_warmup", warmup_steps=r.warmup_steps,
                              max_steps=r.steps, eval_every=r.eval_every, seed=cfg.seed, save_total_limit=1,
                              lora={"r": cfg.lora_r} if cfg.lora_r else None),
        base_dir=str(out),
    )


EVALUATION = " evaluation at step "  # how `run_probe`'s progress names an evaluation's count (of problems)


def evaluation_name(strategy: str, step: int) -> str:
    """The progress name of one held-out evaluation of a probed set (the base's at step 0)."""
    return f"{strategy}{EVALUATION}{step}" + (" (the base)" if step == 0 else "")


def run_probe(student: Student, data: ProbeData, cfg: ProbeConfig, out_dir: str | Path,
              progress: Progress | None = None, lm=None, log: io.TextIOBase | None = None) -> "ProbeReport":
    """Run (or resume) the probe and write OUT/probe.json and OUT/probe.png; returns the report.

    `lm`: the base student already loaded (else loaded from its spec); without `cfg.learning_rate`,
    the student's rate. `log`: where the trainer's progress lines go (default: discarded;
    `progress` reports steps instead, and each evaluation's problems generated under
    `evaluation_name`).
    """
    from transformers import TrainerCallback


    cfg.validate()
    data.validate(cfg.strategies)
    out = Path(out_dir)
    base = lm or loading.load_model(student.spec, device=cfg.device, dtype=cfg.dtype)
    lr = cfg.learning_rate or student.described(base.description).learning_rate()[0]
    model = {**base.description, "spec": student.spec}
    write_jsonl(out / "data" / "eval.jsonl", data.eval_rows())
    for s in cfg.strategies:
        write_jsonl(out / "data" / f"{s}.jsonl", [{"prompt": p, "completion": r} for p, r in data.train[s]])

    class _Steps(TrainerCallback):
        def __init__(self, strategy):
            self.strategy = strategy

        def on_step_end(self, args, state, control, **kw):
            if progress is not None:
                progress(self.strategy, state.global_step, cfg.recipe.steps)

    curves: dict[str, list[dict]] = {}
    records: dict[str, dict] = {}
    step0 = None
    for s in cfg.strategies:
        m = manifest_for(s, cfg, data, model, lr, out)
        told = None if progress is None else (
            lambda step, done, total, s=s: progress(evaluation_name(s, step), done, total))
        records[s] = sft.run_sft(m, out / s, device=cfg.device, dtype=cfg.dtype, lm=base, store=False,
                                 callbacks=[_Steps(s)], stream=log or io.StringIO(), step0_row=step0,
                                 eval_progress=told)
        curves[s] = _curve(out / s / "eval.jsonl")
        step0 = step0 or curves[s][0]
    # sequences trained x the set's mean length: the same count whether the probe resumed or not
    r = cfg.recipe
    train_tokens = round(sum(_mean_tokens(base.tokenizer, data.train[s], r.train_length) * r.steps * r.batch_size
                             for s in cfg.strategies))
    report = ProbeReport(
        REPORT_VERSION, base.description | {"spec": student.spec}, cfg.teacher, {**cfg.settings(), "learning_rate": lr},
        data.checker if data.checker != "math" else metrics.math_checker_name(), data.context, curves,
        features(curves, data.context),
        cost(train_tokens, _eval_tokens(curves), data.context, _eval_tokens(curves, "generated_tokens")),
        round(sum(r["provenance"]["seconds"] for r in records.values()), 2), versions())
    write_json(out / "probe.json", finite(report.as_dict()))  # NaN (a metric that does not apply) is null in the file
    write_json(out / "config.json", {"stage": "probe", "settings": report.settings, "model": student.spec,
                                     "versions": versions()})
    plot(report, out / "probe.png")
    return report


def _mean_tokens(tokenizer, pairs: list[tuple[str, str]], train_length: int, sample: int = 512) -> float:
    """Mean tokens of a training sequence (prompt, response, EOS) over an evenly spaced sample: the
    probe's training tokens are steps x batch x this, the same whether or not it was resumed."""
    picked = pairs[:: max(1, len(pairs) // sample)][:sample]
    return mean(len(encode_pair(tokenizer, p, r, train_length, add_eos=True).input_ids) for p, r in picked)


def _curve(path: Path) -> list[dict]:
    from capacity_advisor.training.callbacks import read_curve

    # timings differ between an interrupted and a whole run; the measurements must not
    return [{k: v for k, v in r.items() if k not in ("examples", "eval_seconds", "elapsed")} for r in read_curve(path)]


# ---- features and cost ------------------------------------------------------------------------


def _get(point: dict, key: str) -> float:
    v = point.get(key)
    return float("nan") if v is None else float(v)


def _rel(start: float, end: float) -> float:
    """(start - end) / |start|: the share by which a quantity fell (negative when it rose)."""
    if not (math.isfinite(start) and math.isfinite(end)) or abs(start) < 1e-9:
        return float("nan")
    return (start - end) / abs(start)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
    if len(pts) < 2:
        return float("nan")
    mx, my = mean(p[0] for p in pts), mean(p[1] for p in pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else float("nan")


def truncate(curves: dict[str, list[dict]], steps: int) -> dict[str, list[dict]]:
    """The curves a probe of `steps` steps would have measured (a probe is a prefix of a longer one)."""
    return {s: [p for p in c if p["step"] <= steps] for s, c in curves.items()}


def features(curves: dict[str, list[dict]], context: dict) -> dict:
    """The flat, scale-free measurements the predictor reads (NaN where a metric does not apply).

    Per strategy: how far its training loss and the held-out teacher NLL fall relative to their
    start, how far its generations drift from the base (relative), repetition over the whole
    curve (peak, area = mean over trained points, slope per probe fraction), and the changes in
    answer rate, answer log-likelihood and accuracy (end and area). Between strategies: low minus
    high of those. From the selection: the per-token likelihood gap and the length ratio.
    """
    f: dict[str, float] = {}
    first = next(iter(curves.values()))[0]
    for key in ("accuracy", "answer_logprob", "answer_rate", "repetition_rate", "finish_rate"):
        f[f"base_{key}"] = _get(first, key)
    for s, c in curves.items():
        start, end, trained = c[0], c[-1], c[1:] or c[:1]
        last_step = max(1, end["step"])
        frac = [p["step"] / last_step for p in trained]
        losses = [_get(p, "train_loss") for p in trained]
        f[f"{s}_train_loss_drop_rel"] = _rel(losses[0], losses[-1]) if len(losses) > 1 else float("nan")
        for key in ("teacher_nll", "teacher_nll_high", "teacher_nll_low", "teacher_view"):
            f[f"{s}_{key}_drop_rel"] = _rel(_get(start, key), _get(end, key))
        f[f"{s}_teacher_view_slope"] = _slope(frac, [_get(p, "teacher_view") for p in trained])
        f[f"{s}_drift_rel"] = -_rel(_get(start, "base_drift"), _get(end, "base_drift"))
        reps = [_get(p, "repetition_rate") for p in trained]
        f[f"{s}_repetition_peak"] = max(reps)
        f[f"{s}_repetition_area"] = mean(reps)
        f[f"{s}_repetition_slope"] = _slope(frac, reps)
        f[f"{s}_finish_rate_end"] = _get(end, "finish_rate")
        for key in ("answer_rate", "answer_logprob", "accuracy"):
            f[f"{s}_{key}_gain"] = _get(end, key) - _get(start, key)
            f[f"{s}_{key}_area_gain"] = mean(_get(p, key) for p in trained) - _get(start, key)
    if "high" in curves and "low" in curves:
        for key in ("train_loss_drop_rel", "teacher_nll_drop_rel", "teacher_view_drop_rel", "drift_rel",
                    "repetition_area", "repetition_peak", "answer_logprob_gain", "answer_logprob_area_gain",
                    "accuracy_gain", "accuracy_area_gain", "answer_rate_gain"):
            f[f"gap_{key}"] = f[f"low_{key}"] - f[f"high_{key}"]
    for key in POOL_CONTRASTS:  # a probe from before the repetition was read replays without it, as it was
        if key in context or key not in metrics.REPETITION_KEYS:
            v = context.get(key)  # None where nothing was measured (a set of bare answers has no trigrams)
            f[key] = float("nan") if v is None else float(v)
    return f


def _eval_tokens(curves: dict[str, list[dict]], key: str = "eval_tokens") -> int | None:
    """The evaluations' tokens of `key` (all they read, or those generated); the base evaluation
    is shared by all strategies, so it is counted once. None where rows predate the count."""
    first = next(iter(curves.values()))[0]
    rows = [first] + [p for c in curves.values() for p in c[1:]]
    if any(p.get(key) is None for p in rows):
        return None
    return sum(int(p[key]) for p in rows)


def cost(train_tokens: int, eval_tokens: int, context: dict, generated_tokens: int | None = None) -> dict:
    """Tokens the probe processed against the tokens of the full SFT it advises on: all of them
    (`share_of_full_run`), and those it trained on or generated, the work a probe adds where its
    evaluations' scoring is not counted (`share_trained_generated`)."""
    per_epoch = context.get("full_run_tokens_per_epoch")
    out = {"probe_train_tokens": train_tokens, "probe_eval_tokens": eval_tokens,
           "probe_tokens": train_tokens + eval_tokens, "full_run_tokens_per_epoch": per_epoch, "share_of_full_run": {}}
    if generated_tokens is not None:
        out["probe_generated_tokens"] = generated_tokens
        out["share_trained_generated"] = {}
    if per_epoch:
        for epochs in (1, 3, 5):
            out["share_of_full_run"][str(epochs)] = (train_tokens + eval_tokens) / (per_epoch * epochs)
            if generated_tokens is not None:
                out["share_trained_generated"][str(epochs)] = (train_tokens + generated_tokens) / (per_epoch * epochs)
    return out


def plot(report: ProbeReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = report.curves
    keys = [k for k in METRICS if any(p.get(k) is not None and not _isnan(p.get(k)) for c in curves.values() for p in c)]
    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    colors = {"high": "tab:blue", "low": "tab:red", "mixed": "tab:purple"}
    for ax, key in zip(axes.flat, keys):
        for s, c in curves.items():
            pts = [(p["step"], p[key]) for p in c if p.get(key) is not None and not _isnan(p[key])]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=f"D_{s}", color=colors.get(s))
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    m = report.model
    fig.suptitle(f"probe: {m['spec']} ({m['n_params']:,} params)", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
