"""`advisor recommend`: score, select, probe, predict — and write what training needs.

    advisor recommend --model lab:m --budget 3 --out runs/rec
    advisor recommend --model ./qwen-1.5b --budget 5 --pool openr1.parquet --sample 2000 --out runs/rec
    advisor recommend --model ./config-only-folder --budget 5 --no-probe --out runs/rec   # the paper's findings

Writes OUT/recommendation.json (the manifest `advisor train` consumes unchanged), OUT/train.jsonl
(the selected data, TRL prompt/completion), OUT/eval.jsonl (the probe's held-out slice, when the
pool has reference answers), OUT/report.png, OUT/config.json; OUT/score/ and OUT/probe/ keep the
stages' own outputs, so a rerun resumes from them. A folder that holds a recommendation for other
inputs is refused.

Every setting recommend chooses itself comes from one place (`StudentDefaults`, one per kind of
student) and is reported with where it came from: a flag, the lab's defaults, the defaults for
real students, or the model's config.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path


from capacity_advisor.advisor.predictor import BUDGETS, Predictor
from capacity_advisor.advisor.select import RANKINGS
from capacity_advisor.training.manifest import SETS, schedule_of
from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import stable_hash, versions, write_json, write_jsonl
from capacity_advisor.probes.recipe import LAB, REAL

SHIPPED = "predictor_data"  # package folder of the default predictor
BUDGET_GRID = tuple(x / 4 for x in range(2, 41))  # 0.5 .. 10 epochs, for the crossover


@dataclass(frozen=True)
class StudentDefaults:
    """What recommend uses when a flag is not given, for one kind of student."""

    kind: str
    max_length: int  # scoring: prompt + response tokens
    probe_max_length: int  # probe training: prompt + response tokens
    max_new_tokens: int  # probe and full-run evaluation generations
    probe_steps: int
    probe_batch: int
    probe_eval_every: int
    probe_eval_problems: int
    train_batch: int  # the manifest's global batch


LAB_DEFAULTS = StudentDefaults("lab", max_length=LAB.max_length, probe_max_length=LAB.max_length,
                               max_new_tokens=LAB.max_new_tokens, probe_steps=LAB.steps, probe_batch=LAB.batch_size,
                               probe_eval_every=LAB.eval_every, probe_eval_problems=LAB.eval_problems, train_batch=32)
# Reasoning traces run to thousands of tokens; 64 held-out generations of up to 2,048 tokens at
# each of the 3 evaluation points (the base, then each set after its steps) is the probe's largest
# cost on a GPU. The probe's length is the lab's (the predictor's inputs are measured that way).
REAL_DEFAULTS = StudentDefaults("real", max_length=4096, probe_max_length=REAL.max_length,
                                max_new_tokens=REAL.max_new_tokens, probe_steps=REAL.steps, probe_batch=REAL.batch_size,
                                probe_eval_every=REAL.eval_every, probe_eval_problems=REAL.eval_problems, train_batch=16)
CHOSEN = ("max_length", "probe_max_length", "max_new_tokens", "probe_steps", "probe_batch", "probe_eval_every",
          "probe_eval_problems")


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
    max_length: int | None = None  # --max-length (scoring); None: by kind of student, capped by the model config
    probe_max_length: int | None = None  # --probe-max-length
    max_new_tokens: int | None = None  # --max-new-tokens (evaluation generations)
    probe_steps: int | None = None
    probe_batch: int | None = None
    probe_eval_every: int | None = None
    probe_eval_problems: int | None = None
    backend: str = "hf"  # --backend for scoring (the probe always trains with hf)
    mix: float = 0.5  # the mix written for a "mixed" recommendation
    score: str = "sum"  # --score: rank candidates by summed log-prob (the paper's), mean per token (GRAPE's), or rsr
    skip_tokens: int = 0  # --skip-tokens: leave each response's first N tokens out of its score
    checker: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    pool_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        bad = []
        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and self.budget > 0):
            bad.append(f"--budget {self.budget} must be a positive number of epochs")
        if self.scores and not self.pool:
            bad.append("--scores needs the --pool they were computed on")
        if self.score not in RANKINGS:
            bad.append(f"--score {self.score!r} is unknown: use {', '.join(RANKINGS)}")
        if self.skip_tokens < 0:
            bad.append(f"--skip-tokens {self.skip_tokens} must be at least 0")
        if not 0 <= self.mix <= 1:
            bad.append(f"--mix {self.mix} is outside [0, 1]")
        if self.backend not in ("hf", "vllm"):
            bad.append(f"--backend {self.backend!r} is unknown: use hf or vllm")
        for name in (*CHOSEN, "sample"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                bad.append(f"--{name.replace('_', '-')} {v} must be a whole number of at least 1")
        if self.probe_steps and self.probe_eval_every and self.probe_eval_every > self.probe_steps:
            bad.append(f"--probe-eval-every {self.probe_eval_every} must not exceed --probe-steps ({self.probe_steps})")
        if self.lab_n < 1:
            bad.append(f"--lab-n {self.lab_n} must be at least 1")
        if not self.pool and not self.model.startswith("lab:") and not self.no_probe:
            bad.append(f"--pool is needed to probe {self.model} (only lab students have a built-in pool); "
                       "or pass --no-probe for advice from the parameter count alone")
        if bad:
            raise InputError("; ".join(bad))


def predictor_root(path: str | None):
    return path if path is not None else resources.files("capacity_advisor.advisor") / SHIPPED


def load_predictor(path: str | None) -> Predictor:
    return Predictor.load(predictor_root(path))


def predictor_probe(predictor: Predictor) -> dict | None:
    """The probe a predictor's inputs were measured with (`advisor fit` stores it when its records
    agree), checked: a predictor file is user input."""
    p = (predictor.meta or {}).get("probe")
    if p is None:
        return None
    if not isinstance(p, dict) or not all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool)
                                          and 1 <= p[k] <= 100_000 for k in ("steps", "eval_problems")):
        raise InputError("the predictor's meta.probe must hold whole numbers 'steps' and 'eval_problems' "
                         "between 1 and 100000: refit it with `advisor fit`")
    return {"steps": p["steps"], "eval_problems": p["eval_problems"]}


def resolve_settings(cfg: RecommendConfig, description: dict, predictor_probe: dict | None = None) -> dict:
    """Every setting recommend chooses, as {name: {"value", "source"}}. The probe's length and
    held-out problems default to those the predictor's inputs were measured with, when it says."""
    lab = cfg.model.startswith("lab:")
    d = LAB_DEFAULTS if lab else REAL_DEFAULTS
    where = "lab default" if lab else "default for real students"
    fitted = {"probe_steps": (predictor_probe or {}).get("steps"),
              "probe_eval_problems": (predictor_probe or {}).get("eval_problems")}
    out = {}
    for name in CHOSEN:
        given = getattr(cfg, name)
        if given is not None:
            out[name] = {"value": given, "source": f"--{name.replace('_', '-')}"}
        elif fitted.get(name):
            out[name] = {"value": fitted[name], "source": "the predictor (its inputs were measured so)"}
        else:
            out[name] = {"value": getattr(d, name), "source": where}
    ctx = description.get("max_position_embeddings")
    for name in ("max_length", "probe_max_length"):
        if ctx and out[name]["source"] != f"--{name.replace('_', '-')}" and ctx < out[name]["value"]:
            out[name] = {"value": int(ctx), "source": "model config (max_position_embeddings)"}
    if out["probe_eval_every"]["value"] > out["probe_steps"]["value"]:
        out["probe_eval_every"] = {"value": out["probe_steps"]["value"], "source": "capped at the probe steps"}
    lr, lr_source = learning_rate(cfg.model, description["n_params"])
    out["learning_rate"] = {"value": lr, "source": lr_source}
    out["train_batch"] = {"value": d.train_batch, "source": where}
    out["score"] = {"value": cfg.score, "source": "--score" if cfg.score != "sum" else "default (the paper's ranking)"}
    return out


def learning_rate(spec: str, n_params: int) -> tuple[float, str]:
    """The SFT rate a probe and the full run share: the probe recipe's rule."""
    from capacity_advisor.probes.recipe import recipe_for

    return recipe_for(spec).learning_rate(spec, n_params)


def inputs_key(cfg: RecommendConfig, description: dict) -> str:
    """What a recommendation folder was made from; a folder is reused only for the same inputs."""
    d = asdict(cfg)
    for informational in ("out", "predictor", "device"):
        d.pop(informational)
    return stable_hash({"config": d, "model": description.get("fingerprint")})


def _check_out(out: Path, key: str) -> None:
    from capacity_advisor.models.files import recorded_key

    if recorded_key(out, "inputs_key") not in (None, key):
        raise InputError(f"{out} holds a recommendation made from other inputs (model, pool or settings); "
                         "pass a new --out, or delete that folder to start over")


TEACHER_SAMPLING = dict(n=8, temperature=1.0, top_p=1.0, max_new_tokens=LAB.max_new_tokens, seed=0)  # as calibration samples pools


def lab_pool(task: str, n: int, out: Path, say=lambda m: None) -> Path:
    """`n` problems of the lab teacher's pool for `task`, written to OUT/pool.jsonl.

    The first 1,000 problems of each task ship with the package (sampled from `lab:teacher` by
    `advisor generate` with `TEACHER_SAMPLING`); a larger pool is sampled the same way on demand.
    """
    import gzip
    import json

    from capacity_advisor.models.lab import FAMILIES

    if task not in FAMILIES:
        raise InputError(f"--lab-task {task!r} is unknown: use one of {', '.join(FAMILIES)}")
    src = resources.files("capacity_advisor.models.lab") / "data" / f"{task}-teacher-pool.jsonl.gz"
    rows = []
    if src.is_file():
        with gzip.open(src, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line, _ in zip(f, range(n))]
    if len(rows) < n:
        from capacity_advisor.advisor.generate import GenerateConfig, generate_pool
        from capacity_advisor.models.lab import write_pool

        say(f"sampling a {n}-problem {task} pool from lab:teacher (built on first use)")
        write_pool(out / "problems.jsonl", task=task, n=n, seed=TEACHER_SAMPLING["seed"])
        generate_pool(GenerateConfig(teacher="lab:teacher", problems=str(out / "problems.jsonl"), out=str(out / "pool.jsonl"),
                                     device="cpu", dtype="float32", checker="lab", token_budget=32768,
                                     **TEACHER_SAMPLING))
        return out / "pool.jsonl"
    write_jsonl(out / "pool.jsonl", rows)
    return out / "pool.jsonl"


def recommend(cfg: RecommendConfig, status=None, progress=None) -> dict:
    """Run the flow of the module doc; `status(message)` reports the stage, `progress(strategy,
    step, total)` the probe's steps. Returns the report (the CLI prints it)."""
    from capacity_advisor.models.loading import describe_config

    cfg.validate()
    say = status or (lambda msg: None)
    out = Path(cfg.out)
    t0 = time.time()
    predictor = load_predictor(cfg.predictor)
    desc = describe_config(cfg.model)  # the config on the meta device: no weights, no tokenizer
    key = inputs_key(cfg, desc)
    _check_out(out, key)
    settings = resolve_settings(cfg, desc, predictor_probe(predictor))
    if cfg.no_probe and not cfg.pool:
        return _advice_only(cfg, desc, predictor, settings, key, out, t0)
    return _full(cfg, desc, predictor, settings, key, out, t0, say, progress)


def _prior(cfg: RecommendConfig, desc: dict, predictor: Predictor) -> tuple[dict, dict]:
    from capacity_advisor.advisor.priors import prior_advice

    advice = prior_advice(desc["n_params"], cfg.budget, predictor)
    by_budget = [prior_advice(desc["n_params"], b, predictor)["probabilities"] for b in BUDGET_GRID]
    return advice, {s: [p[s] for p in by_budget] for s in SETS}


def _crossover(curve: dict) -> float | None:
    """The first budget at which D_low is more likely the best than D_high."""
    return next((b for b, lo, hi in zip(BUDGET_GRID, curve["low"], curve["high"]) if lo > hi + 1e-9), None)


def _advice_only(cfg, desc, predictor, settings, key, out: Path, t0: float) -> dict:
    """`--no-probe` without a pool: advice from the parameter count, nothing scored, no weights read."""
    advice, curve = _prior(cfg, desc, predictor)
    report = _report(cfg, desc, advice, curve, settings, features={"budget": float(cfg.budget)}, probe=None,
                     predictor=predictor, selection=None, train_rows=0, eval_rows=0, t0=t0)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "recommendation.json", {"version": 1, "advice_only": True, **{k: report[k] for k in (
        "strategy", "answer", "probabilities", "crossover_epoch", "confidence", "confidence_reasons", "prior", "model",
        "budget")}, "dataset": None, "next": "rerun with --pool to get the selected dataset and a training manifest"})
    write_json(out / "config.json", {"stage": "recommend", "inputs_key": key, "settings": asdict(cfg),
                                     "chosen": settings, "versions": versions()})
    plot_report(report, curve, None, predictor, out / "report.png")
    return report


def _full(cfg, desc, predictor, settings, key, out: Path, t0: float, say, progress) -> dict:
    from capacity_advisor.advisor.pool import Pool, PoolOptions, read_pool
    from capacity_advisor.advisor.priors import PAPER_FROM, paper_prior_advice
    from capacity_advisor.advisor.probe import probe_pool
    from capacity_advisor.advisor.select import SelectConfig, export, select
    from capacity_advisor.models.loading import load_model
    from capacity_advisor.probes.run import ProbeConfig

    v = {k: s["value"] for k, s in settings.items()}
    pool_path = cfg.pool or None
    if pool_path is None:
        pool_path = lab_pool(cfg.lab_task, cfg.lab_n, out, say)
    pool = read_pool(pool_path, PoolOptions(**cfg.pool_options))
    if cfg.sample and cfg.sample < len(pool):
        import random

        keep = set(random.Random(cfg.seed).sample([p.id for p in pool.problems], cfg.sample))
        pool = Pool([p for p in pool.problems if p.id in keep], pool.source, pool.layout, pool.fields, pool.n_rows,
                    pool.skipped_candidates, pool.skipped_problems, pool.skipped_examples)
    need = v["probe_eval_problems"] + v["probe_batch"]
    if len(pool) < 2 * need and settings["probe_eval_problems"]["source"] != "--probe-eval-problems":
        v["probe_eval_problems"] = max(1, len(pool) // 4)
        settings["probe_eval_problems"] = {"value": v["probe_eval_problems"],
                                           "source": f"capped at a quarter of the pool's {len(pool)} problems"}
    pcfg = ProbeConfig(steps=v["probe_steps"], batch_size=v["probe_batch"], learning_rate=v["learning_rate"],
                       eval_every=v["probe_eval_every"], eval_problems=v["probe_eval_problems"],
                       max_new_tokens=v["max_new_tokens"], max_length=v["probe_max_length"], seed=cfg.seed,
                       device=cfg.device, dtype=cfg.dtype, teacher=cfg.teacher)
    pcfg.validate()
    say(f"loading {cfg.model}")
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    stage = probe_pool(cfg.model, pool, pcfg, lm, out / "score", out / "probe", scores_path=cfg.scores,
                       checker=cfg.checker, score=cfg.score, mix=cfg.mix, max_length=v["max_length"],
                       skip_tokens=cfg.skip_tokens,
                       backend=cfg.backend, run=not cfg.no_probe, say=say, progress=progress)
    scores, split, probe = stage.scores, stage.split, stage.report
    features = {"budget": float(cfg.budget), "ranking_sum": float(cfg.score == "sum"),
                "likelihood_gap_per_token": split.data.context["likelihood_gap_per_token"],
                "length_ratio_low_high": split.data.context["length_ratio_low_high"]}
    if probe is None:
        advice, curve = _prior(cfg, desc, predictor)
    else:
        features.update(probe["features"])
        advice = predictor.advise(features)
        advice["reasons"] = predictor.reasons(features)
        probs = predictor.predict_proba([{**features, "budget": b} for b in BUDGET_GRID])
        curve = {o: probs[:, j].tolist() for j, o in enumerate(predictor.options)}
        if desc["n_params"] >= PAPER_FROM:  # what the paper found for students of this size, beside the measurement
            advice["paper_prior"] = paper_prior_advice(desc["n_params"], cfg.budget)
    strategy, _, switch = schedule_of(advice["strategy"])
    if strategy == "curriculum" and switch >= cfg.budget:  # the switch never comes: this is D_high
        advice["confidence_reasons"].append(f"{advice['strategy']} switches after the {cfg.budget:g}-epoch budget: "
                                            "within it, it trains on D_high")
        advice["strategy"] = "high"
    strategy, mix, switch = _schedule(cfg, advice["strategy"])

    # the dataset: every problem outside the probe's held-out slice, which becomes the eval set
    held = set(split.eval_ids)
    sel = select(pool, scores, SelectConfig(strategy=strategy, mix=mix, seed=cfg.seed, score=cfg.score))
    sel.rows = [r for r in sel.rows if r["id"] not in held]
    export(sel, out / "train.jsonl", "trl")
    eval_rows = [{"prompt": pool.get(i).prompt, "answer": pool.get(i).answer, "task": pool.get(i).task}
                 for i in split.eval_ids if pool.get(i).answer is not None]
    if eval_rows:
        write_jsonl(out / "eval.jsonl", eval_rows)
    report = _report(cfg, desc, advice, curve, settings, features, probe, predictor, sel.summary, len(sel.rows),
                     len(eval_rows), t0)
    report["pool"] = {**pool.summary(), "source": Path(str(pool.source)).name,
                      **({"sampled": cfg.sample} if cfg.sample else {})}
    write_manifest(report, split.data.checker if eval_rows else "none", cfg, settings, out)
    write_json(out / "config.json", {"stage": "recommend", "inputs_key": key, "settings": asdict(cfg),
                                     "chosen": settings, "versions": versions()})
    plot_report(report, curve, probe, predictor, out / "report.png")
    return report


def _schedule(cfg: RecommendConfig, option: str) -> tuple[str, float, float | None]:
    """(strategy, mix, switch epoch) of an advised option; a plain "mixed" takes --mix."""
    strategy, mix, switch = schedule_of(option)
    return strategy, cfg.mix if option == "mixed" else mix, switch


def _report(cfg, desc, advice, curve, settings, features, probe, predictor, selection, train_rows, eval_rows, t0) -> dict:
    return {
        "strategy": advice["strategy"],
        "answer": advice.get("answer", advice["strategy"]),
        "mix": _schedule(cfg, advice["strategy"])[1],
        "switch_epoch": _schedule(cfg, advice["strategy"])[2],
        "probabilities": advice["probabilities"],
        "interval": advice.get("interval"),
        "crossover_epoch": _crossover(curve),
        "confidence": advice["confidence"],
        "confidence_reasons": advice.get("confidence_reasons", []),
        "range": advice.get("range"),
        "neighbours": advice.get("neighbours"),
        "reasons": [_reason_text(r) for r in advice.get("reasons", [])],
        "paper_prior": advice.get("paper_prior"),
        "prior": advice.get("prior"),
        "predictor": advice.get("prior") and f"{advice['prior']} prior" or predictor.kind,
        "baselines": baseline_advice(predictor, desc["n_params"], cfg.budget),
        "model": desc,
        "budget": cfg.budget,
        "features": features,
        "settings": settings,
        "selection": selection,
        "train_rows": train_rows,
        "eval_rows": eval_rows,
        "probe_cost": probe["cost"] if probe else None,
        "seconds": round(time.time() - t0, 1),
    }


def baseline_advice(predictor: Predictor, n_params: float, budget: float) -> dict:
    out = {"GRAPE (always high)": "high", "always low": "low", "always mixed": "mixed"}
    rule = predictor.meta.get("rule_of_thumb") or {}
    if rule:
        tp, te = rule.get("t_params"), rule.get("t_budget")
        if isinstance(tp, (int, float)) and isinstance(te, (int, float)):
            low = math.log10(max(1, n_params)) >= tp and budget >= te
            name = (f"lab rule of thumb (low if params ≥ 10^{tp:.2f} and epochs ≥ {te:g})"
                    if math.isfinite(tp) and math.isfinite(te) else "lab rule of thumb (always high)")
            out[name] = "low" if low else "high"
    return out


def _reason_text(r: dict) -> str:
    val = r["value"]
    val = "n/a" if val is None or (isinstance(val, float) and math.isnan(val)) else f"{val:.3g}"
    return f"{r['feature']} = {val} (moves P(D_{r['toward'].replace('not ', '')}) by {r['weight']:+.2f})"


def write_manifest(report: dict, checker: str, cfg: RecommendConfig, settings: dict, out: Path) -> None:
    from capacity_advisor.training.manifest import EvalSpec, Manifest, TrainingSpec

    v = {k: s["value"] for k, s in settings.items()}
    manifest = Manifest(
        model={**{k: x for k, x in report["model"].items() if k != "path"}, "spec": cfg.model},
        dataset="train.jsonl",
        strategy=schedule_of(report["strategy"])[0],
        mix=report["mix"],
        probabilities=report["probabilities"],
        crossover_epoch=report["crossover_epoch"],
        confidence=report["confidence"],
        reasons=report["reasons"] + report["confidence_reasons"],
        eval=EvalSpec(path="eval.jsonl" if report["eval_rows"] else None, checker=checker,
                      max_new_tokens=v["max_new_tokens"], teacher=cfg.teacher),
        training=TrainingSpec(epochs=float(cfg.budget), learning_rate=v["learning_rate"], batch_size=v["train_batch"],
                              max_length=v["max_length"], seed=cfg.seed, switch_epoch=report["switch_epoch"]),
        features=report["features"],
        pool=report["pool"],
    )
    manifest.to_json(out / "recommendation.json")


def plot_report(report: dict, curve: dict, probe: dict | None, predictor: Predictor, path: Path) -> None:
    """Left: P(strategy) by budget. Middle: the probe. Right: where the student sits among the
    calibrated students (parameters against the input that moved the advice most)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from capacity_advisor.models.files import atomic_path

    panels = 3 if probe else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.0 * panels, 3.4), squeeze=False)
    ax = axes[0][0]
    colors = {"high": "tab:blue", "low": "tab:red", "mixed": "tab:purple"}
    for s, probs in curve.items():
        ax.plot(BUDGET_GRID, probs, label=f"P(D_{s})", color=colors.get(s))
    ax.axvline(report["budget"], color="gray", ls="--", lw=1)
    if report["crossover_epoch"]:
        ax.axvline(report["crossover_epoch"], color="tab:red", ls=":", lw=1)
    ax.set_xlabel("epoch budget")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"at {report['budget']:g} epochs: D_{report['strategy']} ({report['confidence']} confidence)", fontsize=9)
    ax.legend(fontsize=7)
    if probe:
        ax = axes[0][1]
        for s, c in probe["curves"].items():
            key = "answer_logprob" if c[-1].get("answer_logprob") is not None else "teacher_nll"
            ax.plot([p["step"] for p in c], [p[key] for p in c], marker="o", ms=3, label=f"D_{s}", color=colors.get(s))
            ax.set_ylabel(key)
        ax.set_xlabel("probe step")
        ax.set_title("probe", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[0][2]
        feature = next((r.split(" = ")[0] for r in report["reasons"]), None) or "gap_answer_logprob_area_gain"
        j = predictor.features.index(feature) if feature in predictor.features else None
        budget = f"{min(BUDGETS, key=lambda b: abs(b - report['budget'])):g}"
        for u in predictor.units:
            if j is None or u.get("n_params") is None:
                continue
            zj = u["z"][[k for k in predictor.features if k not in ("budget", "ranking_sum")].index(feature)] \
                if feature not in ("budget", "ranking_sum") else None
            if zj is None:
                continue
            y = zj * predictor.range[feature]["sd"] + predictor.range[feature]["mean"]
            label = (u.get("outcomes", {}).get(budget) or {}).get("label", "high")
            ax.scatter(u["n_params"], y, s=12, color=colors.get(label), alpha=0.6)
        y_student = report["features"].get(feature)
        if y_student is not None and not (isinstance(y_student, float) and math.isnan(y_student)):
            ax.scatter(report["model"]["n_params"], y_student, s=80, marker="*", color="black", label="this student")
            ax.legend(fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(feature, fontsize=8)
        ax.set_title(f"calibrated students, coloured by best set at {budget} epochs", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)



