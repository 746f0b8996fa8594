"""The RunRecord (one full run, the predictor's training example), the records store, the curve.

RUN/record.json is one JSON object:

    {"version": 1, "run_id", "model": description, "strategy", "mix", "n_train", "epochs": budget,
     "features", "pool", "evals": [{"epoch", "step", "accuracy", "repetition_rate", "answer_rate",
     "train_loss"}, ...], "best_accuracy", "final_accuracy", "settings",
     "provenance": {"seconds", "resumed_from_step", "final_checkpoint", "finished_at", "manifest", "train_tokens"}}

`run_id` is the run key (a hash of the manifest and its data files), so the same run has the same id.

`evals` starts with the base model (step 0) and then has one row per checkpoint; `epoch` is
exactly step / steps_per_epoch; a run that kept per-problem correctness (full runs and races)
adds `correct` to each, one character per held-out problem, so a replayed race can decide on one
half of the problems and be judged on the other. `best_accuracy` is the best over trained checkpoints (step > 0),
`final_accuracy` the last checkpoint's. The same object is appended as one line to the store
(`$ADVISOR_HOME/records.jsonl` unless told otherwise).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from capacity_advisor.core.files import advisor_home, atomic_path, finite, refuse_special, write_json

RECORD_VERSION = 1
EVAL_KEYS = ("epoch", "step", "accuracy", "repetition_rate", "answer_rate", "train_loss")


def default_store() -> Path:
    return advisor_home() / "records.jsonl"


def build_record(*, run_id: str, description: dict, manifest, n_train: int, eval_rows: list[dict],
                 settings: dict, provenance: dict, best: dict | None = None) -> dict:
    """The RunRecord. Everything outside `provenance` is the same for a run resumed after a kill
    and an uninterrupted one; `provenance` says where and how this run happened (its wall time,
    the step it resumed from, its last checkpoint, when it finished). `best`: the checkpoint kept
    as RUN/best/ (`sft.keep_best`), written as `best_checkpoint` where given."""
    evals = [_eval_of(r) for r in sorted(eval_rows, key=lambda r: r["step"])]
    trained = [e["accuracy"] for e in evals if e["step"] > 0 and e["accuracy"] is not None]
    final = evals[-1]["accuracy"] if evals and evals[-1]["step"] > 0 else None
    return {
        "version": RECORD_VERSION,
        "run_id": run_id,
        "model": description,
        "strategy": manifest.strategy,
        "mix": manifest.mix,
        "n_train": n_train,
        "epochs": manifest.training.epochs,
        "features": manifest.features,
        "pool": manifest.pool,
        "evals": evals,
        "best_accuracy": max(trained) if trained else None,
        "final_accuracy": final,
        "settings": settings,
        **({"best_checkpoint": best} if best is not None else {}),
        "provenance": provenance,
    }


def best_checkpoint(run_dir: Path, record: dict) -> dict | None:
    """Where a finished run's best evaluation is kept, for a user to load: {"path", "step", "epoch",
    "accuracy"} ("path" RUN/best, or None where that checkpoint was gone), or None where the run kept
    none (no evaluation measured accuracy, or a run of an older version)."""
    best = record.get("best_checkpoint")
    if not isinstance(best, dict):
        return None
    folder = best.get("folder")
    return {"path": str(Path(run_dir) / folder) if folder else None,
            **{k: best.get(k) for k in ("step", "epoch", "accuracy")}}


def _eval_of(row: dict) -> dict:
    """A record's evaluation: EVAL_KEYS, and where the run kept per-problem correctness, `correct`
    as one character per held-out problem ("1" right, "0" wrong), in the eval set's order."""
    e = {k: row.get(k) for k in EVAL_KEYS}
    correct = (row.get("per_problem") or {}).get("correct")
    if isinstance(correct, list) and correct:
        e["correct"] = "".join("1" if c else "0" for c in correct)
    return e


def write_record(run_dir: Path, record: dict, store: str | os.PathLike | None) -> Path:
    """Append to the store, then write RUN/record.json last: its presence means the run is whole."""
    store_path = Path(store) if store else default_store()
    append_line(store_path, record)
    path = Path(run_dir) / "record.json"
    write_json(path, record)
    return store_path


def append_line(path: Path, obj: dict) -> None:
    """One JSON line in one write(2) on an O_APPEND file, under an exclusive flock, so concurrent runs
    do not interleave. A last line a killed or failed append cut short (no newline) is cut off first:
    it would otherwise run into this line, and its run, which wrote no record.json after it, appends
    its record again when it is rerun."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_special(path.parent, [path.name], "name a records file (--records)")
    # NaN and infinities become null, as in every file we write: strict JSON readers refuse them
    data = (json.dumps(finite(obj), ensure_ascii=False, default=str, allow_nan=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.ftruncate(fd, _after_last_newline(fd, size))
        os.write(fd, data)
    finally:
        os.close(fd)


def _after_last_newline(fd: int, size: int) -> int:
    """The offset just past the file's last newline (0 where it has none)."""
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def plot_curve(eval_rows: list[dict], path: Path, title: str) -> None:
    """accuracy, repetition rate and training loss against epoch (PNG, ~50 KB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(eval_rows, key=lambda r: r["step"])
    x = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.0), dpi=90)
    for ax, key, label in zip(axes, ("accuracy", "repetition_rate", "train_loss"),
                              ("pass@1", "repetition rate", "train loss (since previous eval)")):
        pts = [(xi, r.get(key)) for xi, r in zip(x, rows) if r.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if key != "train_loss":
            ax.set_ylim(-0.02, 1.02)
    _save_figure(fig, path, title)


def _save_figure(fig, path: Path, title: str) -> None:
    """Title, lay out and write the figure atomically (a killed run never leaves half a PNG)."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
