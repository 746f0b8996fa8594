"""The lab experiment: does the Fast-Fit / Slow-Gain pattern appear along the capacity ladder?

    advisor lab experiment --out docs/lab --sizes xs,s,m,l,xl --seeds 0,1 --threads 1

For each ladder size and seed: write a teacher pool (seeded problems and candidates), score every
candidate under the *base* student with the same backend `advisor score` uses, let
`advisor.select` take each problem's highest (D_high) and lowest (D_low) mean-log-prob candidate,
then fine-tune a fresh copy of the base on each set (completion-only loss) and evaluate 4 times
per epoch: greedy pass@1 on held-out problems, repetition rate, and teacher NLL (the student's
NLL of a fixed held-out set of teacher responses, averaged per procedure). No style is ever
chosen by hand: which candidates are "high" is whatever the student's own scores say.

Resumable: every finished run is one JSON file under OUT/runs/, written last; a rerun skips it.
OUT/results.json (curves, means over seeds) and OUT/curves.png are rebuilt from the run files.
Cost on a 2-core CPU with one thread: the ladder builds once in ~15 min; then ~6 min per seed for
all five sizes (docs/lab.md). `--score sum` is the arm that shows Fast-Fit / Slow-Gain here;
the default per-token `mean` picks the spelled-out chains as *high* for the larger students.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Callable

from models.errors import InputError
from models.files import read_jsonl, versions, write_json, write_jsonl

Log = Callable[[str], None]


@dataclass
class ExperimentConfig:
    out: str = "lab-experiment"  # --out: folder for pools, scores, runs, results.json, curves.png
    sizes: tuple[str, ...] = ("xs", "s", "m", "l", "xl")  # --sizes: ladder students
    seeds: tuple[int, ...] = (0, 1)  # --seeds: each seed draws its own pool and data order
    task: str = "modchain"  # --task
    difficulty: int | None = None  # --difficulty (default: the task's own)
    n_train: int = 3000  # --n-train: problems in the pool (and in D_high / D_low)
    n_eval: int = 300  # --n-eval: held-out problems for greedy pass@1
    n_reference: int = 100  # --n-reference: held-out problems whose teacher candidates give teacher NLL
    candidates: int = 6  # --candidates: teacher responses per problem (4-8)
    epochs: int = 5  # --epochs
    evals_per_epoch: int = 4  # --evals-per-epoch
    batch: int = 32  # --batch
    score: str = "mean"  # --score: selection score, mean (per-token log-prob, the default everywhere) | sum
    lr_scale: float = 0.5  # --lr-scale: SFT peak lr = scale x the student's pretraining lr
    max_new_tokens: int = 48  # --max-new-tokens: generation budget (hitting it counts as repetition)
    threads: int = 1  # --threads: torch threads (1 leaves a core free on a shared machine)

    def validate(self) -> None:
        from models.lab import FAMILIES, LADDER

        problems = []
        bad = [s for s in self.sizes if s not in LADDER]
        if bad or not self.sizes:
            problems.append(f"--sizes {','.join(bad) or '(none)'}: use names from {', '.join(LADDER)}")
        if self.task not in FAMILIES:
            problems.append(f"--task {self.task!r}: use one of {', '.join(FAMILIES)}")
        if self.score not in ("mean", "sum"):
            problems.append(f"--score {self.score!r}: use mean or sum")
        if not self.seeds:
            problems.append("--seeds must name at least one seed")
        if not 4 <= self.candidates <= 8:
            problems.append(f"--candidates {self.candidates}: use 4 to 8")
        for name in ("n_train", "n_eval", "n_reference", "epochs", "evals_per_epoch", "batch"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be at least 1")
        if problems:
            raise InputError("; ".join(problems))


STRATEGIES = ("high", "low")
EVAL_SEED, REF_SEED = 10_000, 20_000  # held-out problem draws, shared by every size and seed


def _held_out(cfg: ExperimentConfig):
    from models.lab import make_problems, pool_rows

    evals = make_problems(cfg.task, cfg.n_eval, cfg.difficulty, seed=EVAL_SEED)
    ref_probs = [p for p in make_problems(cfg.task, cfg.n_reference * 2, cfg.difficulty, seed=REF_SEED)
                 if p.prompt not in {e.prompt for e in evals}][: cfg.n_reference]
    ref_rows = pool_rows(cfg.task, candidates=cfg.candidates, seed=REF_SEED, problems=ref_probs)
    reference = [(r["problem"], g) for r in ref_rows for g in r["generations"]]
    styles = [s for r in ref_rows for s in r["styles"]]
    return evals, reference, styles


def train_pool(cfg: ExperimentConfig, seed: int, exclude: set[str]) -> Path:
    """The seed's teacher pool (grouped layout), disjoint from the held-out prompts."""
    from models.lab import make_problems, pool_rows

    path = Path(cfg.out) / "pools" / f"{cfg.task}-s{seed}.jsonl"
    if not path.exists():
        probs = [p for p in make_problems(cfg.task, cfg.n_train + len(exclude), cfg.difficulty, seed=seed)
                 if p.prompt not in exclude][: cfg.n_train]
        write_jsonl(path, pool_rows(cfg.task, candidates=cfg.candidates, seed=seed, problems=probs))
    return path


def score_candidates(lm, pool, path: Path) -> dict:
    """Scores of every candidate under the base student, in `advisor score`'s row format (cached)."""
    from models.hf import HFBackend

    if not path.exists():
        items = [(p.id, c.k, p.prompt, c.text) for p in pool.problems for c in p.candidates]
        rows = HFBackend(lm).score([(pr, tx) for _, _, pr, tx in items], max_length=96)
        write_jsonl(path, [{"id": i, "k": k, **r} for (i, k, _, _), r in zip(items, rows)])
    return {(str(r["id"]), int(r["k"])): r for r in read_jsonl(path)}


def run_one(cfg: ExperimentConfig, size: str, strategy: str, seed: int, base_lm, evals, reference,
            ref_styles, log: Log) -> dict:
    """Select D_strategy by the base's scores, fine-tune a copy of the base, evaluate on the way."""
    import torch

    from advisor.pool import read_pool
    from advisor.select import SelectConfig, select
    from models.hf import HFBackend
    from models.lab import LADDER, check, extract_answer
    from models.lab.tasks import shape_of
    from models.lab.train import evaluate, train_loop
    from models.loading import LoadedModel

    out = Path(cfg.out)
    pool_path = train_pool(cfg, seed, {e.prompt for e in evals} | {p for p, _ in reference})
    pool = read_pool(pool_path)
    scores = score_candidates(base_lm, pool, out / "scores" / f"{size}-s{seed}.jsonl")
    sel = select(pool, scores, SelectConfig(strategy=strategy, score=cfg.score))
    styles = {r["id"]: r["styles"] for r in read_jsonl(pool_path)}
    chosen_styles = Counter(styles[r["id"]][r["k"]] for r in sel.rows)
    data = [(r["prompt"], r["response"]) for r in sel.rows]

    torch.manual_seed(seed)
    model = copy.deepcopy(base_lm.model)
    lm = LoadedModel(model, base_lm.tokenizer, base_lm.device, f"lab:{size}+sft", None, {})
    backend = HFBackend(lm)
    steps_per_epoch = (len(data) + cfg.batch - 1) // cfg.batch
    total = steps_per_epoch * cfg.epochs
    every = max(1, steps_per_epoch // cfg.evals_per_epoch)
    eval_steps = {min(total, every * i) for i in range(1, cfg.epochs * cfg.evals_per_epoch + 1)} | {total}
    order_rng = random.Random(f"sft:{size}:{strategy}:{seed}")

    def batches():
        for _ in range(cfg.epochs):
            idx = list(range(len(data)))
            order_rng.shuffle(idx)
            for s in range(0, len(idx), cfg.batch):
                yield [data[i] for i in idx[s:s + cfg.batch]]

    curve: list[dict] = []
    timing = {"train_s": 0.0, "eval_s": 0.0}
    t_mark = [time.time()]

    def on_step(step: int, loss: float) -> None:
        if step not in eval_steps:
            return
        timing["train_s"] += time.time() - t_mark[0]
        t0 = time.time()
        model.eval()
        row = evaluate(backend, evals, check, extract_answer, reference, ref_styles, cfg.max_new_tokens)
        row["shapes"] = dict(Counter(shape_of(t) for t in row.pop("all_texts", [])))
        timing["eval_s"] += time.time() - t0
        row.update(step=step, epoch=round(step / steps_per_epoch, 3), train_loss=loss)
        curve.append(row)
        log(f"{size} {strategy} s{seed} epoch {row['epoch']:.2f}: acc {row['accuracy']:.3f} "
            f"rep {row['repetition_rate']:.3f} teacher_nll {row['teacher_nll']:.3f}")
        t_mark[0] = time.time()

    lr = LADDER[size].lr * cfg.lr_scale
    train_loop(model, base_lm.tokenizer, batches(), total, lr, completion_only=True, on_step=on_step)
    return {
        "size": size, "strategy": strategy, "seed": seed, "n_params": base_lm.description["n_params"],
        "n_train": len(data), "steps": total, "steps_per_epoch": steps_per_epoch, "lr": lr,
        "selection": {**{k: v for k, v in sel.summary.items() if not isinstance(v, (list, dict))},
                      "styles": dict(chosen_styles),
                      "mean_response_tokens": mean(r["n_tokens"] for r in sel.rows)},
        "curve": curve,
        "sft_seconds_per_epoch": timing["train_s"] / cfg.epochs,
        "eval_seconds_per_eval": timing["eval_s"] / max(1, len(curve)),
    }


def base_eval(cfg, size, lm, evals, reference, ref_styles) -> dict:
    from models.hf import HFBackend
    from models.lab import check, extract_answer
    from models.lab.tasks import shape_of
    from models.lab.train import evaluate

    row = evaluate(HFBackend(lm), evals, check, extract_answer, reference, ref_styles, cfg.max_new_tokens)
    row["shapes"] = dict(Counter(shape_of(t) for t in row.pop("all_texts", [])))
    row.update(step=0, epoch=0.0)
    return row


def run_experiment(cfg: ExperimentConfig, log: Log = print) -> dict:
    """Run (or resume) every size x seed x strategy; returns the aggregated results."""
    cfg.validate()
    from models.lab import student_path
    from models.lab.train import set_threads
    from models.loading import load_model

    set_threads(cfg.threads)
    out = Path(cfg.out)
    write_json(out / "config.json", {"config": asdict(cfg), "versions": versions()})
    evals, reference, ref_styles = _held_out(cfg)
    t_all = time.time()
    for size in cfg.sizes:
        todo = [(st, s) for s in cfg.seeds for st in STRATEGIES
                if not (out / "runs" / f"{size}-{st}-s{s}.json").exists()]
        base_path = out / "runs" / f"{size}-base.json"
        if not todo and base_path.exists():
            log(f"{size}: all runs done, skipped")
            continue
        t0 = time.time()
        path = student_path(size)
        lm = load_model(str(path), device="cpu", dtype="float32")
        log(f"{size}: student ready ({lm.description['n_params']:,} params, {time.time() - t0:.0f}s)")
        if not base_path.exists():
            write_json(base_path, {"size": size, "n_params": lm.description["n_params"],
                                   "base": base_eval(cfg, size, lm, evals, reference, ref_styles),
                                   "build": json.loads((path / "build.json").read_text())})
        for strategy, seed in todo:
            t1 = time.time()
            res = run_one(cfg, size, strategy, seed, lm, evals, reference, ref_styles, log)
            res["wall_seconds"] = time.time() - t1
            write_json(out / "runs" / f"{size}-{strategy}-s{seed}.json", res)
            log(f"{size} {strategy} s{seed}: done in {res['wall_seconds']:.0f}s")
    results = aggregate(cfg)
    results["wall_seconds_this_call"] = time.time() - t_all
    write_json(out / "results.json", results)
    plot(results, out / "curves.png")
    return results


def aggregate(cfg: ExperimentConfig) -> dict:
    """Mean over seeds of each curve, per size and strategy, from whatever run files exist."""
    out = Path(cfg.out)
    sizes = {}
    for size in cfg.sizes:
        base_file = out / "runs" / f"{size}-base.json"
        if not base_file.exists():
            continue
        base = json.loads(base_file.read_text())
        entry = {"n_params": base["n_params"], "base": _slim(base["base"]),
                 "build_seconds": base["build"].get("build_seconds"), "strategies": {}}
        for st in STRATEGIES:
            runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob(f"{size}-{st}-s*.json"))]
            if not runs:
                continue
            n = min(len(r["curve"]) for r in runs)
            metrics = ("accuracy", "repetition_rate", "teacher_nll", "answer_rate", "mean_length")
            curve = [{"epoch": runs[0]["curve"][i]["epoch"],
                      **{m: mean(r["curve"][i][m] for r in runs) for m in metrics},
                      "per_seed_accuracy": [r["curve"][i]["accuracy"] for r in runs]}
                     for i in range(n)]
            entry["strategies"][st] = {
                "seeds": [r["seed"] for r in runs],
                "curve": curve,
                "selected_styles": [r["selection"]["styles"] for r in runs],
                "mean_response_tokens": mean(r["selection"]["mean_response_tokens"] for r in runs),
                "final_shapes": [r["curve"][-1].get("shapes") for r in runs],
                "sft_seconds_per_epoch": mean(r["sft_seconds_per_epoch"] for r in runs),
                "eval_seconds_per_eval": mean(r["eval_seconds_per_eval"] for r in runs),
                "wall_seconds": sum(r.get("wall_seconds", 0) for r in runs),
            }
        sizes[size] = entry
    return {"config": asdict(cfg), "sizes": sizes, "summary": summarize(sizes)}


def _slim(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("samples",)}


def summarize(sizes: dict) -> dict:
    """Per size: who leads in the first epoch, who leads at the end, repetition and NLL movement."""
    out = {}
    for size, e in sizes.items():
        hi, lo = e["strategies"].get("high"), e["strategies"].get("low")
        if not hi or not lo:
            continue
        epe = max(1, round(1 / hi["curve"][0]["epoch"])) if hi["curve"][0]["epoch"] else 4
        first = slice(0, epe)
        h_early = mean(r["accuracy"] for r in hi["curve"][first])
        l_early = mean(r["accuracy"] for r in lo["curve"][first])
        last = slice(-epe, None)
        h_late = mean(r["accuracy"] for r in hi["curve"][last])
        l_late = mean(r["accuracy"] for r in lo["curve"][last])
        base_nll = e["base"].get("teacher_nll")
        out[size] = {
            "n_params": e["n_params"],
            "acc_epoch1_high": h_early, "acc_epoch1_low": l_early,
            "acc_last_epoch_high": h_late, "acc_last_epoch_low": l_late,
            "high_ahead_early": h_early > l_early,
            "low_ahead_late": l_late > h_late,
            "final_acc_high": hi["curve"][-1]["accuracy"], "final_acc_low": lo["curve"][-1]["accuracy"],
            "mean_repetition_high": mean(r["repetition_rate"] for r in hi["curve"]),
            "mean_repetition_low": mean(r["repetition_rate"] for r in lo["curve"]),
            "teacher_nll_base": base_nll,
            "teacher_nll_drop_high": base_nll - hi["curve"][-1]["teacher_nll"] if base_nll is not None else None,
            "teacher_nll_drop_low": base_nll - lo["curve"][-1]["teacher_nll"] if base_nll is not None else None,
        }
    return out


def plot(results: dict, path: Path) -> None:
    """Accuracy, repetition and teacher NLL per checkpoint: one column per size, high vs low."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s for s in results["sizes"] if results["sizes"][s]["strategies"]]
    if not sizes:
        return
    rows = (("accuracy", "pass@1"), ("repetition_rate", "repetition"), ("teacher_nll", "teacher NLL"))
    fig, axes = plt.subplots(len(rows), len(sizes), figsize=(3.0 * len(sizes), 7.5), squeeze=False, sharex=True)
    colors = {"high": "tab:blue", "low": "tab:red"}
    for j, size in enumerate(sizes):
        e = results["sizes"][size]
        for i, (metric, label) in enumerate(rows):
            ax = axes[i][j]
            for st, d in e["strategies"].items():
                xs = [0.0] + [r["epoch"] for r in d["curve"]]
                ys = [e["base"][metric]] + [r[metric] for r in d["curve"]]
                ax.plot(xs, ys, color=colors[st], label=f"D_{st}", lw=1.8)
                if metric == "accuracy":
                    for k in range(len(d["seeds"])):
                        ax.plot(xs[1:], [r["per_seed_accuracy"][k] for r in d["curve"]], color=colors[st], lw=0.5, alpha=0.35)
            if i == 0:
                ax.set_title(f"{size} ({e['n_params'] / 1e3:.0f}k params)", fontsize=9)
            if j == 0:
                ax.set_ylabel(label)
            if i == len(rows) - 1:
                ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
    top = max([0.05] + [r["repetition_rate"] for s in sizes for d in results["sizes"][s]["strategies"].values()
                        for r in d["curve"]])
    for ax in axes[1]:  # one scale, so small students' loops stand out against large ones' zeros
        ax.set_ylim(-0.02 * top, 1.05 * top)
    axes[0][0].legend(fontsize=8)
    c = results.get("config", {})
    fig.suptitle(f"Lab ({c.get('task')}): SFT on D_high vs D_low picked by each student's own log-prob "
                 f"({c.get('score')}), {c.get('n_train')} problems, mean over seeds {list(c.get('seeds', []))}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def markdown(results: dict, epochs_shown: tuple[float, ...] = (0.25, 0.5, 1, 2, 3, 4, 5)) -> str:
    """Results as Markdown tables (accuracy per checkpoint; repetition and teacher NLL), for docs."""
    lines = ["| size | params | data | base | " + " | ".join(f"ep {e:g}" for e in epochs_shown) + " |",
             "|---|---|---|---|" + "---|" * len(epochs_shown)]
    for size, e in results["sizes"].items():
        for st, d in e["strategies"].items():
            by_epoch = {round(r["epoch"], 2): r for r in d["curve"]}
            cells = []
            for ep in epochs_shown:
                near = min(by_epoch, key=lambda x: abs(x - ep)) if by_epoch else None
                cells.append(f"{by_epoch[near]['accuracy']:.2f}" if near is not None and abs(near - ep) < 0.13 else "—")
            lines.append(f"| {size} | {e['n_params'] / 1e3:.0f}k | D_{st} | {e['base']['accuracy']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "| size | selected styles D_high | selected styles D_low | repetition (mean over checkpoints) high / low | "
              "teacher NLL base → final high / low |", "|---|---|---|---|---|"]
    for size, s in results["summary"].items():
        st = results["sizes"][size]["strategies"]

        def styles(d):
            tot: Counter = Counter()
            for c in d["selected_styles"]:
                tot.update(c)
            n = sum(tot.values()) or 1
            return ", ".join(f"{k} {v / n:.0%}" for k, v in tot.most_common())

        lines.append(f"| {size} | {styles(st['high'])} | {styles(st['low'])} | "
                     f"{s['mean_repetition_high']:.2f} / {s['mean_repetition_low']:.2f} | "
                     f"{s['teacher_nll_base']:.2f} → {st['high']['curve'][-1]['teacher_nll']:.2f} / "
                     f"{st['low']['curve'][-1]['teacher_nll']:.2f} |")
    return "\n".join(lines) + "\n"
