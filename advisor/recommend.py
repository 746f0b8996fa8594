"""`advisor recommend`: score, select, probe, predict — and write what training needs.

    advisor recommend --model lab:m --budget 3 --out runs/rec
    advisor recommend --model ./qwen-1.5b --budget 5 --pool openr1.parquet --out runs/rec --device cuda
    advisor recommend --model lab:m --budget 3 --no-probe --out runs/rec   # prior only: low confidence

Writes OUT/recommendation.json (the manifest `advisor train` consumes unchanged), OUT/train.jsonl
(the selected data, TRL prompt/completion), OUT/eval.jsonl (the held-out slice, when the pool has
reference answers), OUT/report.png, OUT/config.json; OUT/score/ and OUT/probe/ keep the stages'
own outputs, so a rerun resumes from them.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from advisor.predictor import STRATEGIES, Predictor
from models.errors import InputError
from models.files import versions, write_json, write_jsonl

SHIPPED = "predictor_data"  # package folder of the default predictor
BUDGET_GRID = tuple(x / 4 for x in range(2, 41))  # 0.5 .. 10 epochs, for the crossover


@dataclass
class RecommendConfig:
    model: str  # --model
    budget: float  # --budget: epochs of the full run
    out: str  # --out
    pool: str | None = None  # --pool; None: a lab pool (--lab-task, --lab-n)
    scores: str | None = None  # --scores: scores.jsonl of this pool under this model (e.g. from `score --backend vllm`)
    teacher: str | None = None  # --teacher
    no_probe: bool = False  # --no-probe: prior from parameter count and budget alone
    predictor: str | None = None  # --predictor: a folder written by `advisor fit`; None: the shipped one
    lab_task: str = "modchain"
    lab_n: int = 1000
    probe_steps: int = 100
    probe_batch: int = 8
    probe_eval_every: int | None = None  # None: a quarter of the probe steps
    probe_eval_problems: int = 32
    max_new_tokens: int | None = None  # None: 48 for lab students, 256 otherwise
    mix: float = 0.5  # the mix written for a "mixed" recommendation
    score: str = "mean"  # --score: rank candidates by mean (per token) or sum log-prob
    checker: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    pool_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        bad = []
        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and self.budget > 0):
            bad.append(f"--budget {self.budget} must be a positive number of epochs")
        if self.lab_n < self.probe_eval_problems + self.probe_batch + 2:
            bad.append(f"--lab-n {self.lab_n} is too small for the probe's held-out slice")
        if self.scores and not self.pool:
            bad.append("--scores needs the --pool they were computed on")
        if self.score not in ("mean", "sum"):
            bad.append(f"--score {self.score!r} is unknown: use mean or sum")
        if not 0 <= self.mix <= 1:
            bad.append(f"--mix {self.mix} is outside [0, 1]")
        if bad:
            raise InputError("; ".join(bad))


def load_predictor(path: str | None) -> Predictor:
    return Predictor.load(predictor_root(path))


def recommend(cfg: RecommendConfig, status=None) -> dict:
    from advisor.pool import PoolOptions, read_pool
    from advisor.probe import build_probe_data
    from advisor.scoring import ScoreConfig, score_pool
    from advisor.select import SelectConfig, export, load_scores, select
    from models.loading import load_model
    from probes.run import ProbeConfig, run_probe

    cfg.validate()
    say = status or (lambda msg: None)
    predictor = load_predictor(cfg.predictor)
    prior = Predictor.load(Path(predictor_root(cfg.predictor)) / "prior") if cfg.no_probe else None
    out = Path(cfg.out)
    t0 = time.time()
    is_lab = cfg.model.startswith("lab:")
    pool = read_pool(cfg.pool, PoolOptions(**cfg.pool_options)) if cfg.pool else None
    say(f"loading {cfg.model}")
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    desc = lm.description
    if pool is None:  # no pool given: the lab's, written where the user can see what was used
        from models.lab import write_pool

        if not (out / "pool.jsonl").exists():
            write_pool(out / "pool.jsonl", task=cfg.lab_task, n=cfg.lab_n, seed=cfg.seed)
        pool = read_pool(out / "pool.jsonl")
    if cfg.scores:
        scores = load_scores(cfg.scores)
    else:
        say(f"scoring {pool.n_candidates:,} candidates")
        max_length = 96 if is_lab else 4096
        score_pool(pool, ScoreConfig(cfg.model, device=cfg.device, dtype=cfg.dtype, max_length=max_length), out / "score", lm=lm)
        scores = load_scores(out / "score" / "scores.jsonl")
    pcfg = ProbeConfig(steps=cfg.probe_steps, batch_size=cfg.probe_batch,
                       eval_every=cfg.probe_eval_every or max(1, cfg.probe_steps // 4),
                       eval_problems=cfg.probe_eval_problems,
                       max_new_tokens=cfg.max_new_tokens or (48 if is_lab else 256),
                       max_length=96 if is_lab else 2048, seed=cfg.seed, device=cfg.device, dtype=cfg.dtype,
                       teacher=cfg.teacher)
    split = build_probe_data(pool, scores, pcfg, tokenizer=lm.tokenizer, checker=cfg.checker, score=cfg.score)
    features = {"log10_params": math.log10(desc["n_params"]), "budget": float(cfg.budget),
                "score_is_sum": float(cfg.score == "sum"),
                "likelihood_gap": split.data.context["likelihood_gap"],
                "length_ratio_low_high": split.data.context["length_ratio_low_high"]}
    probe = None
    if not cfg.no_probe:
        say("probing D_high and D_low")
        probe = run_probe(cfg.model, split.data, pcfg, out / "probe", lm=lm)
        features.update(probe["features"])
        features["budget"] = float(cfg.budget)
        features["score_is_sum"] = float(cfg.score == "sum")
    model = prior if cfg.no_probe else predictor
    proba = model.predict_proba([features])[0]
    probs = {s: float(p) for s, p in zip(STRATEGIES, proba)}
    strategy = max(probs, key=probs.get)
    curve = model.predict_proba([{**features, "budget": b} for b in BUDGET_GRID])
    crossover = next((b for b, p in zip(BUDGET_GRID, curve) if p[1] > p[0]), None)
    confidence = "low" if cfg.no_probe else ("high" if max(proba) >= 0.75 else "medium" if max(proba) >= 0.5 else "low")
    reasons = model.reasons(features)
    baselines = baseline_advice(predictor, features)

    # the dataset: every problem outside the probe's held-out slice, which becomes the eval set
    held = set(split.eval_ids)
    sel = select(pool, scores, SelectConfig(strategy=strategy, mix=cfg.mix, seed=cfg.seed, score=cfg.score))
    sel.rows = [r for r in sel.rows if r["id"] not in held]
    export(sel, out / "train.jsonl", "trl")
    eval_rows = [{"prompt": pool.get(i).prompt, "answer": pool.get(i).answer, "task": pool.get(i).task}
                 for i in split.eval_ids if pool.get(i).answer is not None]
    if eval_rows:
        write_jsonl(out / "eval.jsonl", eval_rows)
    report = {
        "strategy": strategy,
        "mix": cfg.mix if strategy == "mixed" else 0.0,
        "probabilities": probs,
        "crossover_epoch": crossover,
        "confidence": confidence,
        "reasons": [_reason_text(r) for r in reasons],
        "baselines": baselines,
        "model": desc,
        "budget": cfg.budget,
        "features": features,
        "predictor": model.kind if not cfg.no_probe else "prior",
        "selection": sel.summary,
        "train_rows": len(sel.rows),
        "eval_rows": len(eval_rows),
        "probe_cost": probe["cost"] if probe else None,
        "seconds": round(time.time() - t0, 1),
    }
    write_manifest(report, pool, split.data.checker if eval_rows else "none", cfg, out, is_lab)
    write_json(out / "config.json", {"stage": "recommend", "settings": asdict(cfg), "versions": versions()})
    plot_report(report, BUDGET_GRID, curve, probe, out / "report.png")
    return report


def predictor_root(path: str | None):
    return path if path is not None else resources.files("advisor") / SHIPPED


def baseline_advice(predictor: Predictor, features: dict) -> dict:
    rule = predictor.meta.get("rule_of_thumb") or {}
    out = {"GRAPE (always high)": "high", "always hardest (low)": "low"}
    if rule:
        tp, te = rule["log10_params"], rule["budget"]
        low = features["log10_params"] >= tp and features["budget"] >= te
        name = (f"rule of thumb (low if params ≥ 10^{tp:.2f} and epochs ≥ {te:g})" if math.isfinite(tp) and math.isfinite(te)
                else "rule of thumb (fitted on the records: always high)")
        out[name] = "low" if low else "high"
    return out


def _reason_text(r: dict) -> str:
    v = r["value"]
    val = "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"
    return f"{r['feature']} = {val} (pushes toward {r['toward']}, weight {r['weight']:+.2f})"


def write_manifest(report: dict, pool, checker: str, cfg: RecommendConfig, out: Path, is_lab: bool) -> None:
    from probes.run import auto_learning_rate
    from training.manifest import EvalSpec, Manifest, TrainingSpec

    lr = auto_learning_rate(report["model"]["n_params"])
    if is_lab:
        from models.lab import LADDER

        name = cfg.model[len("lab:"):]
        lr = LADDER[name].lr * 0.5 if name in LADDER else lr  # the lab experiment's SFT rate
    manifest = Manifest(
        model={**report["model"], "spec": cfg.model},
        dataset="train.jsonl",
        strategy=report["strategy"],
        mix=report["mix"],
        probabilities=report["probabilities"],
        crossover_epoch=report["crossover_epoch"],
        confidence=report["confidence"],
        reasons=report["reasons"],
        eval=EvalSpec(path="eval.jsonl" if report["eval_rows"] else None, checker=checker,
                      max_new_tokens=48 if is_lab else 1024),
        training=TrainingSpec(epochs=float(cfg.budget), learning_rate=lr, batch_size=32 if is_lab else 16,
                              max_length=96 if is_lab else 4096, seed=cfg.seed),
        features=report["features"],
        pool=pool.summary(),
    )
    manifest.to_json(out / "recommendation.json")


def plot_report(report: dict, grid, curve: np.ndarray, probe: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from models.files import atomic_path

    panels = 2 if probe else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 3.4), squeeze=False)
    ax = axes[0][0]
    colors = {"high": "tab:blue", "low": "tab:red", "mixed": "tab:purple"}
    for j, s in enumerate(STRATEGIES):
        ax.plot(grid, curve[:, j], label=f"P({s})", color=colors[s])
    ax.axvline(report["budget"], color="gray", ls="--", lw=1)
    if report["crossover_epoch"]:
        ax.axvline(report["crossover_epoch"], color="tab:red", ls=":", lw=1)
    ax.set_xlabel("epoch budget")
    ax.set_title(f"recommendation at {report['budget']:g} epochs: {report['strategy']}", fontsize=9)
    ax.legend(fontsize=7)
    if probe:
        ax = axes[0][1]
        for s, c in probe["curves"].items():
            key = "accuracy" if c[-1].get("accuracy") is not None else "teacher_nll"
            ax.plot([p["step"] for p in c], [p[key] for p in c], marker="o", ms=3, label=f"D_{s}", color=colors.get(s))
            ax.set_ylabel(key)
        ax.set_xlabel("probe step")
        ax.set_title("probe", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)


def print_report(report: dict, out: str) -> None:
    from rich.panel import Panel
    from rich.table import Table

    from advisor.ui import console, fmt

    m = report["model"]
    head = (f"[bold]Train on: D_{report['strategy']}[/bold]"
            + (f" (mix {report['mix']:g} of problems on their low response)" if report["strategy"] == "mixed" else "")
            + f"   confidence: {report['confidence']}   ({report['predictor']} predictor)\n"
            + f"student {m['spec']} ({m['n_params']:,} params), budget {report['budget']:g} epochs")
    co = report["crossover_epoch"]
    head += ("\npredicted crossover: D_low overtakes D_high from about epoch " + f"{co:g}") if co else \
        "\npredicted crossover: none within 10 epochs (D_high stays ahead)"
    console.print(Panel(head, title="capacity-advisor", expand=False))
    t = Table(title="Probabilities", title_justify="left")
    for s in report["probabilities"]:
        t.add_column(f"D_{s}", justify="right")
    t.add_row(*[f"{p:.2f}" for p in report["probabilities"].values()])
    console.print(t)
    if report["reasons"]:
        console.print("[bold]Why[/bold]: " + "; ".join(report["reasons"]))
    f = report["features"]
    keys = ("likelihood_gap", "length_ratio_low_high", "high_teacher_nll_drop_rel", "low_teacher_nll_drop_rel",
            "low_repetition_end", "high_accuracy_end", "low_accuracy_end")
    shown = {k: f[k] for k in keys if k in f}
    if shown:
        t = Table(title="Measurements", title_justify="left", show_header=False)
        for k, v in shown.items():
            t.add_row(k, fmt(v))
        console.print(t)
    t = Table(title="What the rules would say", title_justify="left", show_header=False)
    for rule, choice in report["baselines"].items():
        t.add_row(rule, choice)
    console.print(t)
    cost = report.get("probe_cost")
    spent = f"{report['seconds']}s"
    if cost and cost.get("share_of_full_run"):
        spent += f"; probe {cost['probe_tokens']:,} tokens"
    console.print(f"compute: {spent}. Wrote {out}/recommendation.json, train.jsonl ({report['train_rows']} rows)"
                  + (", eval.jsonl" if report["eval_rows"] else "") + ", report.png. "
                  + f"Next: advisor train {out}/recommendation.json --out RUN")
