"""Terminal output: rich tables and progress bars on stderr, JSON on stdout."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    from capacity_advisor.models.files import finite

    sys.stdout.write(json.dumps(finite(obj), indent=2, ensure_ascii=False, default=str) + "\n")


def _progress_bar(unit: str) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(f"{unit}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def progress(description: str, unit: str = "items") -> Iterator[Progress]:
    with _progress_bar(unit) as bar:
        yield bar


@contextlib.contextmanager
def work_progress(description: str, unit: str, rate_format: str = "{:.1f}/s") -> Iterator[tuple]:
    """A progress bar for resumable work: yields `(on_start(total, already_done), advance(n))`.

    The bar appears at `on_start`, once the work is known to be possible: a mistake found while
    reading inputs or loading the model prints its one error line and nothing else. The rate
    counts only work done in this run, not what was found cached."""
    import time

    bar = _progress_bar(unit)
    task = bar.add_task(description, total=None, rate="")
    t0 = [time.perf_counter(), 0]

    def on_start(total: int, done: int) -> None:
        bar.update(task, total=total, completed=done)
        t0[:] = [time.perf_counter(), done]
        bar.start()

    def advance(n: int) -> None:
        bar.advance(task, n)
        done = bar.tasks[0].completed - t0[1]
        bar.update(task, rate=rate_format.format(done / max(1e-9, time.perf_counter() - t0[0])))

    try:
        yield on_start, advance
    finally:
        if bar.live.is_started:
            bar.stop()


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows.items():
        t.add_row(k, fmt(v))
    return t


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) or "—"
    if v is None:
        return "—"
    return str(v)


def quiet_libraries() -> None:
    """Transformers' own progress bars and warnings would interleave with ours."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - transformers is a hard dependency
        pass
