"""Terminal output: tables and progress on stderr, JSON on stdout.

Progress (`work`) shows nothing until the first report, so a mistake found while the inputs are
checked is the only line printed. On a terminal it draws rich bars (cleared again when a mistake
of the user's stops the work). Elsewhere (a pipe, nohup, a scheduler, CI) it prints plain lines as
the work goes — one per stage and about one per tenth of a counted one — and tables are laid out
wide instead of cut at 80 columns. A plain line cannot be taken back, so a stage's first line is
printed only once the stage is known to have succeeded (the next line follows, or the work ends
without a mistake): a mistake found however long into a stage (a damaged model file on a busy
machine) is still the only line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import finite

console = Console(stderr=True)
WIDE = 200  # columns for tables when stderr is not a terminal (a log file has no width)
PLAIN_STEPS = 10  # a plain progress line about every tenth of a counted stage


def prepare() -> None:
    """Lay tables out wide when stderr is not a terminal (unless COLUMNS says otherwise)."""
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = WIDE


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(finite(obj), indent=2, ensure_ascii=False, default=str) + "\n")


class Work:
    """Progress of one verb: tasks with a description, and a count once they have a total.

    `add_task` / `update` mirror rich's Progress; `status(message)`, `steps(label, done, total)`
    and `start(description, total, done)` / `advance(n)` are the callbacks library code reports
    through."""

    def __init__(self, unit: str = "items", plain: bool | None = None):
        self.unit = unit
        self.plain = (not console.is_terminal) if plain is None else plain
        self.tasks: list[dict] = []
        self._bar: Progress | None = None  # rich bars, started at the first report
        self._status: int | None = None
        self._labels: dict[str, int] = {}
        self._pending: str | None = None  # a stage's plain line, held until the stage is known to succeed
        self._lock = threading.Lock()

    # ---- rich's shape ----------------------------------------------------------------------
    def add_task(self, description: str, total: int | None = None, rate: str = "", unit: str | None = None,
                 rate_format: str | None = None, **_) -> int:
        self.tasks.append({"description": description, "total": total, "completed": 0, "rate": rate,
                           "unit": unit or self.unit, "rate_format": rate_format, "t0": time.perf_counter(),
                           "done0": 0, "next": 0, "shown": False, "rich": None})
        return len(self.tasks) - 1

    def update(self, task: int, description: str | None = None, total: int | None = None, completed: int | None = None,
               rate: str | None = None, advance: int = 0, **_) -> None:
        t = self.tasks[task]
        new_stage = description is not None and description != t["description"]
        if description is not None:
            t["description"] = description
        if total is not None:
            t["total"] = total
        if completed is not None:
            t["completed"] = completed
        t["completed"] += advance
        if rate is not None:
            t["rate"] = rate
        elif t["rate_format"] and advance:
            elapsed = max(1e-9, time.perf_counter() - t["t0"])
            t["rate"] = t["rate_format"].format((t["completed"] - t["done0"]) / elapsed)
        if self.plain:
            self._line(t, new_stage)
        else:
            self._draw(t)

    def advance(self, task: int, n: int = 1) -> None:
        self.update(task, advance=n)

    # ---- callbacks for library code ------------------------------------------------------------
    def status(self, message: str) -> None:
        """A stage without a count (loading, scoring): the one status line changes."""
        if self._status is None:
            self._status = self.add_task(message)
            self.tasks[self._status]["description"] = None  # so the first report is a new stage
        self.update(self._status, description=message, total=None)

    def steps(self, label: str, done: int, total: int, unit: str | None = None) -> None:
        """The count of the stage named `label` (a task per label), in `unit` (the verb's by default)."""
        if label not in self._labels:
            self._labels[label] = self.add_task(label, total=total, unit=unit)
        self.update(self._labels[label], total=total, completed=done)

    def start(self, description: str, total: int, done: int = 0, unit: str | None = None,
              rate_format: str | None = "{:.1f}/s") -> int:
        """A counted stage that may resume work done before: its rate counts this run's work only."""
        task = self.add_task(description, total=total, unit=unit, rate_format=rate_format)
        self.tasks[task].update(done0=done, t0=time.perf_counter())
        self.update(task, completed=done)
        return task

    # ---- drawing -------------------------------------------------------------------------
    def _line(self, t: dict, new_stage: bool) -> None:
        if t["total"] is None:
            if new_stage:
                self._print(t["description"], hold=True)
            return
        done, total = t["completed"], t["total"]
        first = not t["shown"]
        if not (new_stage or first or done >= t["next"] or (done >= total and done != t.get("last"))):
            return
        t["shown"], t["last"] = True, done
        t["next"] = done + max(1, total // PLAIN_STEPS)
        rate = f" {t['rate']}" if t["rate"] else ""
        self._print(f"{t['description']}: {done:,}/{total:,} {t['unit']}{rate} ({time.perf_counter() - t['t0']:.0f}s)",
                    hold=first or new_stage)

    def _print(self, text: str, hold: bool = False) -> None:
        """A plain line; one that opens a stage is held until a line follows (the stage went on)."""
        with self._lock:
            self._release()
            if hold:
                self._pending = text
            else:
                console.print(text, highlight=False, soft_wrap=True)

    def _release(self) -> None:
        if self._pending is not None:
            console.print(self._pending, highlight=False, soft_wrap=True)
            self._pending = None

    def _draw(self, t: dict) -> None:
        if self._bar is None:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TextColumn("{task.fields[rate]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
            self._bar.start()
        if t["rich"] is None:
            t["rich"] = self._bar.add_task(t["description"] or "", total=t["total"], unit=t["unit"], rate=t["rate"])
        self._bar.update(t["rich"], description=t["description"] or "", total=t["total"], completed=t["completed"],
                         rate=t["rate"])

    def close(self, error: BaseException | None = None) -> None:
        """Stop the bars; after a mistake of the user's, clear them (and drop a held line), so the
        error line stands alone."""
        with self._lock:
            if error is not None:
                self._pending = None
            self._release()
        if self._bar is not None:
            if isinstance(error, InputError):
                self._bar.live.transient = True
            self._bar.stop()
            self._bar = None


@contextlib.contextmanager
def work(unit: str = "items") -> Iterator[Work]:
    w = Work(unit)
    try:
        yield w
    except BaseException as e:
        w.close(e)
        raise
    w.close()


@contextlib.contextmanager
def progress(description: str = "", unit: str = "items") -> Iterator[Work]:
    """Bars in rich's shape (`add_task`, `update`); nothing is drawn before the first update."""
    with work(unit) as w:
        yield w


@contextlib.contextmanager
def work_progress(description: str, unit: str, rate_format: str = "{:.1f}/s") -> Iterator[tuple]:
    """A progress bar for resumable work: yields `(on_start(total, already_done), advance(n))`.

    The bar appears at `on_start`, once the work is known to be possible. The rate counts only
    work done in this run, not what was found cached."""
    with work(unit) as w:
        task: list[int] = []

        def on_start(total: int, done: int) -> None:
            task[:] = [w.start(description, total, done, rate_format=rate_format)]

        def advance(n: int) -> None:
            w.advance(task[0], n)

        yield on_start, advance


class PlainProgress:
    """Progress as plain stderr lines when stderr is not a terminal (nohup, a scheduler, CI, a
    pipe), where a progress bar would print nothing until the end: a line at the start, then one
    every `every` seconds and one at the end, each flushed at once."""

    def __init__(self, what: str, unit: str = "steps", every: float = 30.0, stream=None):
        self.what, self.unit, self.every = what, unit, every
        self.stream = stream or sys.stderr
        self.last: float | None = None

    def __call__(self, step: int, total: int | None, loss: float | None = None) -> None:
        now = time.monotonic()
        final = total is not None and step >= total
        if self.last is not None and now - self.last < self.every and not final:
            return
        self.last = now
        of = f"/{total}" if total else ""
        extra = f", loss {loss:.3f}" if loss is not None else ""
        self.stream.write(f"{self.what}: {step}{of} {self.unit}{extra}\n")
        self.stream.flush()


@contextlib.contextmanager
def loss_progress(unit: str = "steps") -> Iterator:
    """Yields `progress(label, step, total, loss)`: a bar per label with its loss on a terminal, else
    `PlainProgress` lines (a log, a pipe, CI: lines that arrive as the work goes)."""
    if not sys.stderr.isatty():
        shown: dict[str, PlainProgress] = {}

        def plain(label: str, step: int, total: int | None, loss: float | None) -> None:
            shown.setdefault(label, PlainProgress(label, unit=unit))(step, total, loss)

        yield plain
        return
    with progress(unit=unit) as bar:
        tasks: dict[str, int] = {}

        def drawn(label: str, step: int, total: int | None, loss: float | None) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=None, rate="")
            bar.update(tasks[label], total=total, completed=step, rate=f"loss {loss:.3f}")

        yield drawn


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold", overflow="fold")
    t.add_column(overflow="fold")
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
    """Libraries' own progress bars, logs and warnings (transformers', datasets' "Generating train
    split" bars, torch's notes on pickled weights) would interleave with ours, or stand before a
    mistake's one `error:` line."""
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # read when datasets is imported
    os.environ.setdefault("DATASETS_VERBOSITY", "critical")  # its error logs repeat what our one line says
    for module in (r"torch(\..*)?", r"transformers(\..*)?", r"datasets(\..*)?"):
        warnings.filterwarnings("ignore", module=module)
    if "datasets" in sys.modules:  # imported already: tell it directly
        datasets = sys.modules["datasets"]
        with contextlib.suppress(Exception):
            datasets.disable_progress_bars()
            datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - transformers is a hard dependency
        pass
