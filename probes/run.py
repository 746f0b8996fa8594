"""Probe runs: short SFT from the same base weights on D_high, D_low (and D_mixed), measured as they go.

    from probes.run import ProbeConfig, ProbeData, run_probe
    report = run_probe("lab:s", data, ProbeConfig(steps=100), out_dir="runs/probe")

Every strategy starts from the same weights and sees its problems in the same order (one
permutation per epoch, drawn from `seed`), so the curves differ only by which response of each
problem is trained on. Every `eval_every` steps, on a fixed held-out slice of the pool:

- train_loss: mean completion-only loss of the steps since the previous point;
- teacher_nll: mean NLL per token of held-out teacher responses (both each problem's high and its
  low response, averaged per response, so long responses do not dominate), also split into
  teacher_nll_high / teacher_nll_low;
- from greedy generations on the held-out prompts: repetition_rate, copy_rate, answer_rate,
  accuracy (when references exist), base_drift (the frozen base student's NLL per token of them)
  and teacher_view (the teacher's, when a teacher model is given).

A checkpoint (weights, optimizer, curve) is written at every evaluation point, so a killed probe
resumes from its last point and ends with the same report. Under `accelerate launch` / `torchrun`
the training steps run data-parallel; evaluation runs on the main process.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Callable

from models import metrics
from models.errors import InputError
from models.files import atomic_path, versions, write_json

METRICS = ("train_loss", "teacher_nll", "teacher_nll_high", "teacher_nll_low", "base_drift", "teacher_view",
           "repetition_rate", "copy_rate", "answer_rate", "accuracy")


@dataclass
class ProbeConfig:
    """Settings of a probe run; each field is the CLI flag of the same name."""

    steps: int = 100  # --steps: optimizer steps per strategy
    batch_size: int = 8  # --batch-size: sequences per step (split across processes)
    learning_rate: float | None = None  # --learning-rate; None: by size (see auto_learning_rate)
    warmup_ratio: float = 0.1  # --warmup-ratio: linear warm-up share of the steps
    eval_every: int = 25  # --eval-every: steps between evaluation points
    eval_problems: int = 32  # --eval-problems: held-out problems for generations and teacher NLL
    max_new_tokens: int = 256  # --max-new-tokens: generation bound at each evaluation
    max_length: int = 2048  # --max-length: prompt + response tokens in training
    strategies: tuple[str, ...] = ("high", "low")  # --strategies: add "mixed" to probe D_mixed too
    lora_r: int = 0  # --lora-r: 0 = full fine-tuning; > 0 = LoRA of that rank (peft)
    seed: int = 0  # --seed: data order
    device: str = "auto"  # --device
    dtype: str = "auto"  # --dtype
    teacher: str | None = None  # --teacher: a teacher model, for teacher_view

    def validate(self) -> None:
        bad = []
        if self.steps < 1:
            bad.append(f"--steps {self.steps} must be at least 1")
        if self.batch_size < 1:
            bad.append(f"--batch-size {self.batch_size} must be at least 1")
        if self.eval_every < 1 or self.eval_every > self.steps:
            bad.append(f"--eval-every {self.eval_every} must be between 1 and --steps ({self.steps})")
        if self.learning_rate is not None and not self.learning_rate > 0:
            bad.append(f"--learning-rate {self.learning_rate} must be positive")
        if self.eval_problems < 1:
            bad.append(f"--eval-problems {self.eval_problems} must be at least 1")
        unknown = [s for s in self.strategies if s not in ("high", "low", "mixed")]
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


def auto_learning_rate(n_params: int) -> float:
    """Full-fine-tuning rates in the range SFT recipes use by size (tiny lab students tolerate far more)."""
    if n_params < 10e6:
        return 1e-3
    if n_params < 200e6:
        return 2e-4
    if n_params < 3e9:
        return 2e-5
    return 1e-5


def data_order(n: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """Row indices for every step: a fresh permutation each pass over the data."""
    rng = random.Random(seed)
    flat: list[int] = []
    while len(flat) < steps * batch:
        perm = list(range(n))
        rng.shuffle(perm)
        flat.extend(perm)
    return [flat[s * batch:(s + 1) * batch] for s in range(steps)]


class _Evaluator:
    """Scores and generates on the held-out slice with a given model; holds the frozen base and teacher."""

    def __init__(self, base, teacher, data: ProbeData, cfg: ProbeConfig):
        from models.hf import HFBackend

        self.base = HFBackend(base)
        self.teacher = HFBackend(teacher) if teacher is not None else None
        self.data, self.cfg = data, cfg

    def __call__(self, lm) -> dict:
        from models.hf import HFBackend

        d, cfg = self.data, self.cfg
        be = HFBackend(lm)
        refs = be.score(d.teacher_high + d.teacher_low, max_length=cfg.max_length)
        nll = [-r["logprob_mean"] for r in refs]
        n_hi = len(d.teacher_high)
        gens = [g[0] for g in be.generate(d.eval_prompts, max_new_tokens=cfg.max_new_tokens)]
        pairs = [(p, g) for p, g in zip(d.eval_prompts, gens) if g.strip()]
        drift = self.base.score(pairs, max_length=cfg.max_length) if pairs else []
        view = self.teacher.score(pairs, max_length=cfg.max_length) if (self.teacher and pairs) else []
        gen_tokens = sum(len(lm.tokenizer(g, add_special_tokens=False)["input_ids"]) for g in gens)
        return {
            # forward tokens this evaluation spent (teacher set, generations, their re-scoring), for the cost report
            "eval_tokens": sum(r["n_tokens"] for r in refs) + (2 + bool(view)) * gen_tokens,
            "teacher_nll": mean(nll),
            "teacher_nll_high": mean(nll[:n_hi]),
            "teacher_nll_low": mean(nll[n_hi:]),
            "base_drift": mean(-r["logprob_mean"] for r in drift) if drift else float("nan"),
            "teacher_view": mean(-r["logprob_mean"] for r in view) if view else None,
            "repetition_rate": metrics.repetition_rate(gens),
            "copy_rate": metrics.copy_rate(d.eval_prompts, gens),
            "answer_rate": metrics.answer_rate(gens, d.checker) if d.checker != "none" else None,
            "accuracy": metrics.accuracy(gens, d.eval_answers, d.checker) if d.checker != "none" else None,
            "samples": gens[:3],
        }


Progress = Callable[[str, int, int], None]  # (strategy, step, total)


def run_probe(model_spec: str, data: ProbeData, cfg: ProbeConfig, out_dir: str | Path,
              progress: Progress | None = None, stop_after_points: int | None = None, lm=None) -> dict:
    """Run (or resume) the probe and write OUT/probe.json and OUT/probe.png; returns the report."""
    import torch
    from accelerate import Accelerator

    from models.loading import load_model

    cfg.validate()
    data.validate(cfg.strategies)
    out = Path(out_dir)
    state = out / "state"
    base = lm or load_model(model_spec, device=cfg.device, dtype=cfg.dtype)
    teacher = load_model(cfg.teacher, device=cfg.device, dtype=cfg.dtype) if cfg.teacher else None
    lr = cfg.learning_rate or auto_learning_rate(base.description["n_params"])
    evaluator = _Evaluator(base, teacher, data, cfg)
    acc = Accelerator(cpu=base.device.type == "cpu")
    torch.manual_seed(cfg.seed)

    point0_path = state / "point0.json"
    if point0_path.exists():
        point0 = _read_json(point0_path)
    else:
        point0 = {"step": 0, "train_loss": None, **evaluator(base)} if acc.is_main_process else None
        if acc.is_main_process:
            write_json(point0_path, point0)
    acc.wait_for_everyone()
    point0 = point0 or _read_json(point0_path)

    n = len(next(iter(data.train.values())))
    order = data_order(n, cfg.steps, cfg.batch_size, cfg.seed)
    curves: dict[str, list[dict]] = {}
    train_tokens = 0
    t0 = time.perf_counter()
    stopped = False
    for strategy in cfg.strategies:
        curve, tokens, finished = _run_strategy(strategy, base, data, cfg, lr, order, point0, evaluator, acc,
                                                state / strategy, progress, stop_after_points)
        curves[strategy] = curve
        train_tokens += tokens
        if not finished:
            stopped = True
            break
    if stopped:
        return {"stopped_early": True}
    report = {
        "version": 1,
        "model": base.description,
        "teacher": teacher.description if teacher else None,
        "settings": {**asdict(cfg), "learning_rate": lr, "strategies": list(cfg.strategies)},
        "checker": data.checker if data.checker != "math" else metrics.math_checker_name(),
        "context": data.context,
        "curves": curves,
        "features": features(curves, data.context, base.description),
        "cost": cost(train_tokens, _eval_tokens(point0, curves), data.context),
        "seconds": round(time.perf_counter() - t0, 2),
        "versions": versions(),
    }
    if acc.is_main_process:
        write_json(out / "probe.json", report)
        write_json(out / "config.json", {"stage": "probe", "settings": report["settings"], "model": model_spec,
                                         "versions": versions()})
        plot(report, out / "probe.png")
    return report


def _run_strategy(strategy, base, data, cfg, lr, order, point0, evaluator, acc, sdir: Path, progress,
                  stop_after_points) -> tuple[list[dict], int, bool]:
    import torch

    from models.loading import LoadedModel
    from models.template import collate

    done = sdir / "done.pt"
    if done.exists():
        st = torch.load(done, weights_only=True)
        return st["curve"], st["train_tokens"], True
    model = copy.deepcopy(base.model)
    if cfg.lora_r > 0:
        model = _lora(model, cfg.lora_r)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    curve, start, train_tokens, losses = [dict(point0)], 0, 0, []
    ckpt = sdir / "ckpt.pt"
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=True)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        curve, start, train_tokens = st["curve"], st["step"], st["train_tokens"]
    model, opt = acc.prepare(model, opt)
    pairs = data.train[strategy]
    warm = max(1, int(cfg.warmup_ratio * cfg.steps))
    points_this_run = 0
    for step in range(start, cfg.steps):
        rows = order[step][acc.process_index::acc.num_processes]
        ids, mask, labels = collate(base.tokenizer, [pairs[i] for i in rows], cfg.max_length)
        ids, mask, labels = ids.to(acc.device), mask.to(acc.device), labels.to(acc.device)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warm)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        train_tokens += int(mask.sum()) * acc.num_processes
        if progress and acc.is_main_process:
            progress(strategy, step + 1, cfg.steps)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            point = {"step": step + 1, "train_loss": mean(losses) if losses else None}
            if acc.is_main_process:
                inner = acc.unwrap_model(model)
                inner.eval()
                point.update(evaluator(LoadedModel(inner, base.tokenizer, base.device, base.spec, base.path,
                                                   base.description)))
                inner.train()
            losses = []
            curve.append(point)
            state = {"model": acc.unwrap_model(model).state_dict(), "optimizer": opt.state_dict(),
                     "curve": curve, "step": step + 1, "train_tokens": train_tokens}
            if acc.is_main_process:
                _save(state, ckpt)
            points_this_run += 1
            acc.wait_for_everyone()
            if stop_after_points is not None and points_this_run >= stop_after_points and step + 1 < cfg.steps:
                return curve, train_tokens, False
    if acc.is_main_process:
        _save({"curve": curve, "train_tokens": train_tokens}, done)
        ckpt.unlink(missing_ok=True)  # weights are no longer needed once the curve is final
    return curve, train_tokens, True


def _lora(model, r: int):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InputError("--lora-r needs peft: pip install 'capacity-advisor[lora]'") from None
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", lora_dropout=0.0))


def _save(obj, path: Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


# ---- features and cost ------------------------------------------------------------------------


def _ratio(a, b):
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or abs(b) < 1e-9:
        return float("nan")
    return a / b


def _get(point: dict, key: str) -> float:
    v = point.get(key)
    return float("nan") if v is None else float(v)


def features(curves: dict[str, list[dict]], context: dict, description: dict) -> dict:
    """The flat measurements the predictor reads (NaN where a metric does not apply)."""
    f: dict[str, float] = {"n_params": float(description["n_params"]),
                           "log10_params": math.log10(max(1, description["n_params"]))}
    first = next(iter(curves.values()))[0]
    for key in ("accuracy", "repetition_rate", "teacher_nll", "answer_rate"):
        f[f"base_{key}"] = _get(first, key)
    for s, c in curves.items():
        start, early, end = c[0], c[1] if len(c) > 1 else c[0], c[-1]
        f[f"{s}_teacher_nll_drop"] = _get(start, "teacher_nll") - _get(end, "teacher_nll")
        f[f"{s}_teacher_nll_drop_rel"] = _ratio(f[f"{s}_teacher_nll_drop"], _get(start, "teacher_nll"))
        f[f"{s}_teacher_nll_low_drop"] = _get(start, "teacher_nll_low") - _get(end, "teacher_nll_low")
        f[f"{s}_repetition_end"] = _get(end, "repetition_rate")
        f[f"{s}_repetition_max"] = max(_get(p, "repetition_rate") for p in c)
        f[f"{s}_repetition_delta"] = _get(end, "repetition_rate") - _get(start, "repetition_rate")
        f[f"{s}_copy_end"] = _get(end, "copy_rate")
        f[f"{s}_drift_end"] = _get(end, "base_drift")
        f[f"{s}_answer_rate_end"] = _get(end, "answer_rate")
        f[f"{s}_accuracy_early"] = _get(early, "accuracy")
        f[f"{s}_accuracy_end"] = _get(end, "accuracy")
        f[f"{s}_accuracy_gain"] = _get(end, "accuracy") - _get(start, "accuracy")
        f[f"{s}_train_loss_end"] = _get(end, "train_loss")
        f[f"{s}_train_loss_drop_rel"] = _ratio(_get(early, "train_loss") - _get(end, "train_loss"), _get(early, "train_loss"))
    if "high" in curves and "low" in curves:
        f["teacher_nll_drop_ratio_low_high"] = _ratio(f["low_teacher_nll_drop"], f["high_teacher_nll_drop"])
        f["accuracy_end_gap_low_high"] = f["low_accuracy_end"] - f["high_accuracy_end"]
        f["accuracy_gain_gap_low_high"] = f["low_accuracy_gain"] - f["high_accuracy_gain"]
        f["repetition_end_gap_low_high"] = f["low_repetition_end"] - f["high_repetition_end"]
        f["drift_end_gap_low_high"] = f["low_drift_end"] - f["high_drift_end"]
        f["train_loss_end_ratio_low_high"] = _ratio(f["low_train_loss_end"], f["high_train_loss_end"])
    for key in ("likelihood_gap", "length_ratio_low_high"):
        f[key] = float(context.get(key, float("nan")))
    return f


def _eval_tokens(point0: dict, curves: dict[str, list[dict]]) -> int:
    """The base evaluation is shared by all strategies, so it is counted once."""
    return point0["eval_tokens"] + sum(p["eval_tokens"] for c in curves.values() for p in c[1:])


def cost(train_tokens: int, eval_tokens: int, context: dict) -> dict:
    """Tokens the probe processed against the tokens of the full SFT it advises on."""
    per_epoch = context.get("full_run_tokens_per_epoch")
    out = {"probe_train_tokens": train_tokens, "probe_eval_tokens": eval_tokens,
           "probe_tokens": train_tokens + eval_tokens, "full_run_tokens_per_epoch": per_epoch, "share_of_full_run": {}}
    if per_epoch:
        for epochs in (1, 3, 5):
            out["share_of_full_run"][str(epochs)] = (train_tokens + eval_tokens) / (per_epoch * epochs)
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = report["curves"]
    keys = [k for k in METRICS if any(p.get(k) is not None and not _isnan(p.get(k)) for c in curves.values() for p in c)]
    cols = 3
    rows = math.ceil(len(keys) / cols)
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
    m = report["model"]
    fig.suptitle(f"probe: {m['spec']} ({m['n_params']:,} params)", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
