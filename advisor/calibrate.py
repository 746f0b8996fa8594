"""`advisor calibrate`: measured runs on the embedded lab, the predictor's training data.

    advisor calibrate --out calibration               # the full sweep (about an hour on 2 cores)
    advisor calibrate --out /tmp/cal --quick          # a minute: one tiny student, one seed, one epoch

For each task x ladder size x seed: the seed's teacher pool is scored under the base student; a
probe (short SFT on D_high and D_low, the same probe `advisor recommend` runs) measures the
features; full SFT runs on D_high, D_low and D_mixed (mix 0.5) up to the maximum budget,
evaluated 4 times per epoch, give the outcomes. Each (student, pool, seed, strategy) becomes one
RunRecord line. The full runs are `advisor lab experiment` runs (same files, same folder layout),
so a calibration folder resumes — and reuses an experiment's high/low runs — file by file.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from models.files import versions, write_json, write_jsonl

STRATEGIES = ("high", "low", "mixed")


@dataclass
class CalibrateConfig:
    out: str = "calibration"  # --out: folder (resumable); records go to OUT/records.jsonl
    sizes: tuple[str, ...] = ("xs", "s", "m", "l", "xl")  # --sizes
    seeds: tuple[int, ...] = (0, 1)  # --seeds
    tasks: tuple[str, ...] = ("modchain",)  # --tasks
    epochs: int = 5  # --epochs: the maximum budget
    n_train: int = 3000  # --n-train: problems per pool
    n_eval: int = 300  # --n-eval: held-out problems for pass@1
    n_reference: int = 100  # held-out problems for the experiment's teacher NLL
    evals_per_epoch: int = 4
    batch: int = 32
    probe_steps: int = 100  # --probe-steps
    probe_batch: int = 8
    probe_eval_every: int = 25
    probe_eval_problems: int = 32
    max_new_tokens: int = 48
    threads: int = 1  # --threads
    score: str = "mean"  # --score: which log-prob ranks candidates (mean per token, or sum)
    quick: bool = False  # --quick: tiny settings for tests

    @classmethod
    def quick_settings(cls, out: str) -> "CalibrateConfig":
        return cls(out=out, sizes=("xs",), seeds=(0,), epochs=1, n_train=96, n_eval=16, n_reference=8,
                   evals_per_epoch=2, batch=16, probe_steps=4, probe_batch=4, probe_eval_every=2,
                   probe_eval_problems=8, max_new_tokens=24, quick=True)


Log = Callable[[str], None]


def run_calibration(cfg: CalibrateConfig, log: Log = print) -> dict:
    """Run or resume the sweep; rebuild OUT/records.jsonl from every finished run."""
    from advisor.lab_experiment import ExperimentConfig, _held_out, score_candidates, train_pool, run_one
    from advisor.pool import read_pool
    from advisor.probe import build_probe_data
    from models.lab import student_path
    from models.lab.train import set_threads
    from models.loading import load_model
    from probes.run import ProbeConfig, run_probe

    set_threads(cfg.threads)
    out = Path(cfg.out)
    write_json(out / "config.json", {"stage": "calibrate", "settings": asdict(cfg), "versions": versions()})
    t_all = time.time()
    for task in cfg.tasks:
        ecfg = ExperimentConfig(out=str(out / task), sizes=cfg.sizes, seeds=cfg.seeds, task=task, n_train=cfg.n_train,
                                n_eval=cfg.n_eval, n_reference=cfg.n_reference, epochs=cfg.epochs,
                                evals_per_epoch=cfg.evals_per_epoch, batch=cfg.batch, max_new_tokens=cfg.max_new_tokens,
                                threads=cfg.threads, score=cfg.score)
        ecfg.validate()
        evals, reference, ref_styles = _held_out(ecfg)
        exclude = {e.prompt for e in evals} | {p for p, _ in reference}
        for size in cfg.sizes:
            lm = None
            for seed in cfg.seeds:
                runs = {s: out / task / "runs" / f"{size}-{s}-s{seed}.json" for s in STRATEGIES}
                probe_dir = out / task / "probes" / f"{size}-s{seed}"
                if all(p.exists() for p in runs.values()) and (probe_dir / "probe.json").exists():
                    continue
                if lm is None:
                    lm = load_model(str(student_path(size)), device="cpu", dtype="float32")
                    lm.description["spec"] = f"lab:{size}"
                pool = read_pool(train_pool(ecfg, seed, exclude))
                scores = score_candidates(lm, pool, out / task / "scores" / f"{size}-s{seed}.jsonl")
                if not (probe_dir / "probe.json").exists():
                    t0 = time.time()
                    pcfg = ProbeConfig(steps=cfg.probe_steps, batch_size=cfg.probe_batch, eval_every=cfg.probe_eval_every,
                                       eval_problems=cfg.probe_eval_problems, max_new_tokens=cfg.max_new_tokens,
                                       max_length=96, seed=seed, device="cpu")
                    split = build_probe_data(pool, scores, pcfg, tokenizer=lm.tokenizer, checker="lab", score=cfg.score)
                    run_probe(f"lab:{size}", split.data, pcfg, probe_dir, lm=lm)
                    log(f"{task} {size} s{seed}: probe done in {time.time() - t0:.0f}s")
                for strategy, path in runs.items():
                    if path.exists():
                        continue
                    t0 = time.time()
                    res = run_one(ecfg, size, strategy, seed, lm, evals, reference, ref_styles, log)
                    res["wall_seconds"] = time.time() - t0
                    write_json(path, res)
                    log(f"{task} {size} {strategy} s{seed}: full run done in {res['wall_seconds']:.0f}s")
    records = collect_records(cfg)
    write_jsonl(out / "records.jsonl", records)
    return {"records": len(records), "path": str(out / "records.jsonl"), "seconds": round(time.time() - t_all, 1)}


def collect_records(cfg: CalibrateConfig) -> list[dict]:
    """RunRecords from the finished files, in a fixed order (task, size, seed, strategy)."""
    out = Path(cfg.out)
    records = []
    for task in cfg.tasks:
        for size in cfg.sizes:
            for seed in cfg.seeds:
                probe_file = out / task / "probes" / f"{size}-s{seed}" / "probe.json"
                if not probe_file.exists():
                    continue
                probe = json.loads(probe_file.read_text())
                pool_file = out / task / "pools" / f"{task}-s{seed}.jsonl"
                for strategy in STRATEGIES:
                    run_file = out / task / "runs" / f"{size}-{strategy}-s{seed}.json"
                    if run_file.exists():
                        records.append(to_record(json.loads(run_file.read_text()), probe, task, pool_file, cfg))
    return records


def to_record(run: dict, probe: dict, task: str, pool_file: Path, cfg: CalibrateConfig) -> dict:
    """A RunRecord (DESIGN.md) from one lab full run and the probe measured on the same student and pool."""
    evals = [{"epoch": p["epoch"], "step": p["step"], "accuracy": p["accuracy"],
              "repetition_rate": p.get("repetition_rate"), "answer_rate": p.get("answer_rate")} for p in run["curve"]]
    accs = [e["accuracy"] for e in evals]
    return {
        "version": 1,
        "source": "calibrate",
        "model": {**probe["model"], "spec": f"lab:{run['size']}"},
        "strategy": run["strategy"],
        "mix": 0.5 if run["strategy"] == "mixed" else None,
        "n_train": run["n_train"],
        "epochs": cfg.epochs,
        "features": {**probe["features"], "score_is_sum": float(cfg.score == "sum")},
        "pool": {"task": task, "source": pool_file.name, "score": cfg.score,
                 "fingerprint": f"{task}-s{run['seed']}-n{cfg.n_train}-{cfg.score}"},
        "settings": {"seed": run["seed"], "lr": run["lr"], "batch": cfg.batch, "evals_per_epoch": cfg.evals_per_epoch},
        "evals": evals,
        "best_accuracy": max(accs) if accs else None,
        "final_accuracy": accs[-1] if accs else None,
        "seconds": run.get("wall_seconds"),
    }

