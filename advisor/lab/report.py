"""`advisor lab report`: what a calibration sweep shows about the paper's pattern, per student.

    advisor lab report calibration --out docs/lab           # results.json, curves.png, results.md

From the full runs of `advisor lab calibrate` (one folder per task, ranking, student and seed), per
student, strategy and checkpoint: pass@1 (mean and spread over seeds), the teacher view (the lab
teacher's NLL per token of the student's generations: lower is closer to the teacher), repetition
and the held-out teacher NLL. And per student a summary: who leads in the first epoch, who at the
end, the epoch where D_low first overtakes D_high, and how far each set moved the student toward
the teacher. Nothing is recomputed: the numbers are read from each run's eval.jsonl.

A calibration folder, a sweep's or one published (`advisor lab publish`: its evaluations in one
file), is a file a user may be handed, so it is read as a pool is: a sweep's every run's
record.json must be JSON, every run's evaluations readable rows with a numeric `epoch` and
`accuracy`, a trained checkpoint besides epoch 0, its student a lab student. Any fault is one
InputError naming the file (and run), found before anything is written; the outputs are then
written together.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from statistics import mean, pstdev

from capacity_advisor.advisor.calibration.grid import Cell
from capacity_advisor.advisor.lab.published import EVALS, evaluations, is_published, path_order
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import atomic_path, check_writable_dir, write_json, write_text
from capacity_advisor.core.jsonl import read_jsonl_input
from capacity_advisor.core.numbers import number
from capacity_advisor.models.lab.ladder import LADDER, n_params, shape
from capacity_advisor.training.manifest import SETS

METRICS = ("accuracy", "teacher_view", "repetition_rate", "teacher_nll", "answer_logprob", "base_drift")


def _runs(cal: Path) -> dict:
    """{(task, score, size): {strategy: [eval rows per repeat]}} from the finished runs, each checked
    (`_checked`); a repeat is a seed of one pretraining build, and a student's builds are pooled."""
    out: dict = {}
    for run, rows in sorted(_finished(cal), key=lambda r: path_order(r[0])):
        task, score, unit, strategy = run.split("/")
        if strategy not in SETS or "-s" not in unit:
            continue
        u = Cell.from_name(task, score, unit)
        if u is None or u.size not in LADDER:
            raise InputError(f"{cal / run}: {unit!r} is not a lab student (a unit folder is SIZE-sSEED or SIZE+bBUILD-sSEED, "
                             f"SIZE from the ladder: {', '.join(LADDER)}); a calibration folder holds runs of lab students only")
        out.setdefault((task, score, u.size), {}).setdefault(strategy, []).append(rows())
    return out


def _finished(cal: Path):
    """(TASK/RANKING/UNIT/RUN, a call giving its checked evaluation rows) of every finished run: from
    the evaluations file of a published folder, or each run folder's files of a sweep's."""
    if is_published(cal):
        for run, rows in evaluations(cal):
            yield run, lambda rows=rows, run=run: _checked(rows, f"{cal / EVALS}, run {run},", "publish the sweep again")
        return
    for rec in cal.glob("*/*/*/*/record.json"):
        yield rec.parent.relative_to(cal).as_posix(), lambda run=rec.parent: _run_rows(run)


_NUMBER = (int, float)


def _run_rows(run: Path) -> list[dict]:
    """The evaluation rows of one finished run of a sweep, in step order, or one InputError saying what is wrong."""
    rec = run / "record.json"
    try:
        record = json.loads(rec.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deeply, a huge integer
        raise InputError(f"{rec} is not a readable record ({type(e).__name__}); copy the run folder again") from None
    if not isinstance(record, dict):
        raise InputError(f"{rec} is not a record (a JSON object); copy the run folder again")
    path = run / "eval.jsonl"
    rows = read_jsonl_input(path, f"{path} is missing: the run's evaluations are not there; copy the run folder again",
                            "; copy the run folder again")
    return _checked(rows, str(path), "copy the run folder again")


def _checked(rows: list[dict], where: str, fix: str) -> list[dict]:
    """`rows`, once every one has a numeric epoch and accuracy and there is a trained checkpoint."""
    if not rows:
        raise InputError(f"{where} is empty: the run has no evaluations; {fix}")
    for n, r in enumerate(rows, 1):
        epoch = r.get("epoch")
        if not number(epoch) or epoch < 0:
            raise InputError(f"{where} line {n}: epoch {_show(epoch)} is not a number of epochs")
        if not number(r.get("accuracy")):
            raise InputError(f"{where} line {n}: accuracy {_show(r.get('accuracy'))} is not a number; the lab report "
                             "compares pass@1, so every evaluation needs one")
        bad = [m for m in METRICS if r.get(m) is not None and not number(r[m])]
        if bad:
            raise InputError(f"{where} line {n}: {', '.join(bad)} not a number")
    if all(r["epoch"] == 0 for r in rows):
        raise InputError(f"{where} holds only the base model's evaluation (epoch 0): the run has no trained checkpoint")
    return rows


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "…"


def aggregate(cal: str | Path) -> dict:
    cal = Path(cal)
    if not cal.is_dir():
        raise InputError(f"calibration folder {cal} does not exist: pass the --out folder of `advisor lab calibrate`")
    runs = _runs(cal)
    if not runs:
        raise InputError(f"{cal} holds no finished calibration runs: run `advisor lab calibrate --out {cal}` first")

    order = {name: i for i, name in enumerate(LADDER)}
    groups = []
    for (task, score, size), by in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 99))):
        entry = {"task": task, "score": score, "size": size, "n_params": n_params(size), "shape": shape(LADDER[size]),
                 "strategies": {}}
        for strategy, seeds in by.items():
            n = min(len(s) for s in seeds)
            curve = []
            for i in range(n):
                row = {"epoch": round(seeds[0][i]["epoch"], 4), "seeds": len(seeds)}
                for m in METRICS:
                    vals = [s[i].get(m) for s in seeds if s[i].get(m) is not None]
                    row[m] = mean(vals) if vals else None
                    row[f"{m}_sd"] = pstdev(vals) if len(vals) > 1 else 0.0 if vals else None
                curve.append(row)
            entry["strategies"][strategy] = curve
        entry["summary"] = summarize(entry["strategies"])
        groups.append(entry)
    return {"groups": groups}


def _at(curve: list[dict], epoch: float, key: str = "accuracy") -> float | None:
    near = min(curve, key=lambda r: abs(r["epoch"] - epoch)) if curve else None
    return near.get(key) if near and abs(near["epoch"] - epoch) < 0.13 else None


def summarize(strategies: dict) -> dict:
    hi, lo = strategies.get("high"), strategies.get("low")
    if not hi or not lo:
        return {}
    trained_hi = [r for r in hi if r["epoch"] > 0]
    trained_lo = [r for r in lo if r["epoch"] > 0]
    if not trained_hi or not trained_lo:  # the seeds' curves share no trained checkpoint
        return {}
    first_hi = _mean(r["accuracy"] for r in trained_hi if r["epoch"] <= 1.0001)
    first_lo = _mean(r["accuracy"] for r in trained_lo if r["epoch"] <= 1.0001)
    last = max(r["epoch"] for r in hi)
    end_hi = _mean(r["accuracy"] for r in trained_hi if r["epoch"] > last - 1.0001)
    end_lo = _mean(r["accuracy"] for r in trained_lo if r["epoch"] > last - 1.0001)
    over = next((a["epoch"] for a, b in zip(trained_lo, trained_hi) if a["accuracy"] > b["accuracy"] + 0.02
                 and all(x["accuracy"] >= y["accuracy"] for x, y in zip(trained_lo, trained_hi) if x["epoch"] >= a["epoch"])),
                None)

    def moved(curve, key):
        start, end = curve[0].get(key), curve[-1].get(key)
        return None if start is None or end is None else start - end

    return {
        "acc_epoch1_high": first_hi, "acc_epoch1_low": first_lo,
        "acc_last_epoch_high": end_hi, "acc_last_epoch_low": end_lo,
        "best_high": max(r["accuracy"] for r in trained_hi), "best_low": max(r["accuracy"] for r in trained_lo),
        "high_ahead_in_epoch1": _ahead(first_hi, first_lo), "low_ahead_at_end": _ahead(end_lo, end_hi),
        "low_overtakes_from_epoch": over,
        "teacher_view_drop_high": moved(hi, "teacher_view"), "teacher_view_drop_low": moved(lo, "teacher_view"),
        "repetition_mean_high": _mean(r["repetition_rate"] for r in trained_hi),
        "repetition_mean_low": _mean(r["repetition_rate"] for r in trained_lo),
        "repetition_peak_low": max((r["repetition_rate"] for r in trained_lo if r["repetition_rate"] is not None),
                                   default=None),
    }


def _mean(values) -> float | None:
    """The mean of the values that exist (a metric a run did not measure is None), or None."""
    vals = [v for v in values if v is not None]
    return mean(vals) if vals else None


def _ahead(a: float | None, b: float | None) -> bool | None:
    return None if a is None or b is None else a > b


def plot(results: dict, path: Path, task: str, score: str) -> None:
    """pass@1, teacher view and repetition by epoch: one column per student, D_high vs D_low (± sd over seeds)."""
    png = plot_png(results, task, score)
    if png is not None:
        with atomic_path(path) as tmp:
            tmp.write_bytes(png)


def plot_png(results: dict, task: str, score: str) -> bytes | None:
    """`plot`'s figure as PNG bytes (None when no student has runs of this task and ranking)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in results["groups"] if g["task"] == task and g["score"] == score]
    if not groups:
        return None
    rows = (("accuracy", "pass@1"), ("teacher_view", "teacher view (NLL/token)"), ("repetition_rate", "repetition"))
    fig, axes = plt.subplots(len(rows), len(groups), figsize=(2.3 * len(groups), 6.6), squeeze=False, sharex=True)
    colors = {"high": "tab:blue", "low": "tab:red", "mixed": "tab:purple"}
    for j, g in enumerate(groups):
        for i, (metric, label) in enumerate(rows):
            ax = axes[i][j]
            for st in ("high", "low"):
                c = g["strategies"].get(st) or []
                pts = [(r["epoch"], r[metric], r.get(f"{metric}_sd") or 0.0) for r in c if r.get(metric) is not None]
                if not pts:
                    continue
                xs, ys, sd = zip(*pts)
                ax.plot(xs, ys, color=colors[st], lw=1.5, label=f"D_{st}")
                ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], color=colors[st],
                                alpha=0.15, lw=0)
            if i == 0:
                ax.set_title(f"{g['size']} ({g['n_params'] / 1e3:.0f}k)", fontsize=8)
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("epoch", fontsize=8)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"lab, {task}, D_high / D_low by each student's {score} log-prob: mean ± sd over seeds", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=80, format="png")
    plt.close(fig)
    return buf.getvalue()


def markdown(results: dict, epochs: tuple[float, ...] = (0.25, 1, 2, 3, 5)) -> str:
    """Per task and ranking: pass@1 by epoch (D_high / D_low), teacher view moved, repetition."""
    out = []
    keys = sorted({(g["task"], g["score"]) for g in results["groups"] if g["summary"]})  # only pairs with D_high and D_low
    for task, score in keys:
        out += [(f"**{task}, ranked by {score} log-prob** — pass@1 D_high / D_low (mean ± sd over seeds), "
                "the epoch D_low overtakes for good, teacher view (NLL/token) moved toward the teacher by "
                "each set (base − end; positive = closer), repetition (mean over checkpoints, peak on D_low):"), "",
                "| student | params | shape | seeds | " + " | ".join(f"ep {e:g}" for e in epochs)
                + " | D_low overtakes | teacher view moved high / low | repetition high / low (peak) |",
                "|---|---|---|---|" + "---|" * len(epochs) + "---|---|---|"]
        for g in (g for g in results["groups"] if g["task"] == task and g["score"] == score):
            hi, lo, s = g["strategies"].get("high") or [], g["strategies"].get("low") or [], g["summary"]
            if not s:
                continue
            cells = [f"{_pm(hi, e)} / {_pm(lo, e)}" for e in epochs]
            out.append(f"| {g['size']} | {g['n_params']:,} | {g['shape']} | {hi[0]['seeds'] if hi else 0} | "
                       + " | ".join(cells) + f" | {_f(s['low_overtakes_from_epoch'], 2) if s['low_overtakes_from_epoch'] else 'never'} | "
                       f"{_f(s['teacher_view_drop_high'])} / {_f(s['teacher_view_drop_low'])} | "
                       f"{_f(s['repetition_mean_high'])} / {_f(s['repetition_mean_low'])} ({_f(s['repetition_peak_low'])}) |")
        out.append("")
    return "\n".join(out)


def _pm(curve: list[dict], epoch: float) -> str:
    """mean ± sd over seeds at an epoch (the mean alone for one seed)."""
    m, sd = _at(curve, epoch), _at(curve, epoch, "accuracy_sd")
    return _f(m) + (f"±{_f(sd)}" if m is not None and sd and curve[0].get("seeds", 1) > 1 else "")


def _f(v, digits: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def write_report(cal: str | Path, out: str | Path) -> dict:
    """results.json, results.md and one curves-TASK-RANKING.png per task and ranking in `out`. All
    are made in memory first, so a fault in the folder leaves nothing written."""
    check_writable_dir(out, "--out")
    results = aggregate(cal)
    text = markdown(results)
    figures = {f"curves-{task}-{score}.png": plot_png(results, task, score)
               for task, score in sorted({(g["task"], g["score"]) for g in results["groups"]})}
    out = Path(out)
    write_json(out / "results.json", results)
    for name, png in figures.items():
        if png is not None:
            with atomic_path(out / name) as tmp:
                tmp.write_bytes(png)
    write_text(out / "results.md", text)
    return results
