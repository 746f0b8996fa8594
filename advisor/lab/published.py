"""A calibration sweep as the repository keeps it: one compressed file per kind.

    calibration/lab2/NAME/           `advisor lab publish SWEEP calibration/lab2/NAME` writes it
        config.json                  the sweep's settings, without its folder
        records.jsonl.xz             every finished run's record, as the sweep collected them
        budget-records.jsonl.xz      the runs of --budget-runs (only where the sweep trained them)
        evals.jsonl.xz               per run: {"run": "TASK/RANKING/UNIT/RUN", "evals": [its evaluation rows]}
        probes.jsonl.xz              per unit: {"unit": "TASK/RANKING/UNIT", "probe": its probe report}

Each file is JSONL compressed with xz (`xzcat` reads it), its lines in path order, so that
publishing the same sweep twice writes the same bytes. The readers below take a sweep folder
(`advisor lab calibrate --out`: records.jsonl, TASK/RANKING/UNIT/RUN/eval.jsonl,
TASK/RANKING/UNIT/probe/probe.json) as well, so an analysis reads a sweep in progress and a
published one alike. A folder is a file a user may be handed: a damaged file or line is one
InputError naming it.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Iterable, Iterator

from capacity_advisor.advisor.predictor import read_records
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import atomic_path, finite, json_object
from capacity_advisor.core.jsonl import MAX_LINE_BYTES
from capacity_advisor.core.numbers import strict_loads

RECORDS, BUDGET_RECORDS = "records.jsonl.xz", "budget-records.jsonl.xz"
EVALS, PROBES = "evals.jsonl.xz", "probes.jsonl.xz"
# The largest dictionary a source's file needs (8 MiB, the biggest file unpacks to about that)
# at a tenth of the compressor's memory of preset 9.
PRESET = 6 | lzma.PRESET_EXTREME
_AGAIN = "publish the sweep again (`advisor lab publish`)"


def is_published(folder: str | Path) -> bool:
    return (Path(folder) / RECORDS).is_file()


def line_of(row: dict) -> str:
    """One JSONL line as every records file of the project writes it (`core.files.write_jsonl`)."""
    return json.dumps(finite(row), ensure_ascii=False, allow_nan=False) + "\n"


def write_rows(path: str | Path, rows: Iterable[dict]) -> int:
    """`rows` as xz-compressed JSONL at `path`, atomically; the number of rows."""
    n = 0
    with atomic_path(path) as tmp, lzma.open(tmp, "wt", encoding="utf-8", preset=PRESET) as f:
        for row in rows:
            f.write(line_of(row))
            n += 1
    return n


def read_rows(path: str | Path) -> Iterator[dict]:
    """The rows of an xz-compressed JSONL file, one at a time, every number finite."""
    try:
        with lzma.open(path, "rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
                if len(raw) > MAX_LINE_BYTES:
                    raise InputError(f"{path} line {n}: longer than {MAX_LINE_BYTES >> 20} MiB; {_AGAIN}")
                try:
                    row = strict_loads(raw.decode("utf-8"))
                except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, not finite, nested too deeply
                    raise InputError(f"{path} line {n}: not readable JSON ({type(e).__name__}); {_AGAIN}") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path} line {n}: expected a JSON object; {_AGAIN}")
                yield row
    except FileNotFoundError:
        raise InputError(f"{path} is missing; {_AGAIN}") from None
    except (lzma.LZMAError, EOFError) as e:
        raise InputError(f"{path} cannot be unpacked ({type(e).__name__}): it is damaged; {_AGAIN}") from None


def records(folder: str | Path, budget: bool = False) -> list[dict]:
    """The records of a published or a sweep folder (with `budget`, those of its budget runs; none
    where it trained none)."""
    folder = Path(folder)
    if is_published(folder):
        path = folder / (BUDGET_RECORDS if budget else RECORDS)
        return list(read_rows(path)) if path.is_file() else []
    plain = folder / ("budget-records.jsonl" if budget else "records.jsonl")
    if budget:
        return read_records(plain) if plain.is_file() else []
    if not plain.is_file():
        raise InputError(f"{folder} holds no records ({RECORDS} or records.jsonl): name a folder published by "
                         "`advisor lab publish` or written by `advisor lab calibrate --out`")
    return read_records(plain)


def evaluations(folder: str | Path) -> Iterator[tuple[str, list[dict]]]:
    """(TASK/RANKING/UNIT/RUN, its evaluation rows) for every run of a published folder."""
    path = Path(folder) / EVALS
    for n, row in enumerate(read_rows(path), 1):
        run, rows = row.get("run"), row.get("evals")
        if not isinstance(run, str) or run.count("/") != 3 or not isinstance(rows, list) \
                or not all(isinstance(r, dict) for r in rows):
            raise InputError(f"{path} line {n}: not a run's evaluations ({{\"run\": TASK/RANKING/UNIT/RUN, "
                             f"\"evals\": [rows]}}); {_AGAIN}")
        yield run, rows


def probes(folder: str | Path) -> dict[str, dict]:
    """{TASK/RANKING/UNIT: its probe report} of a published or a sweep folder."""
    folder = Path(folder)
    if not is_published(folder):
        return {p.parent.parent.relative_to(folder).as_posix(): json_object(p, "delete that unit's probe/ folder "
                                                                              "and run the sweep again to redo it")
                for p in sorted(folder.glob("*/*/*/probe/probe.json"))}
    out = {}
    for n, row in enumerate(read_rows(folder / PROBES), 1):
        unit, probe = row.get("unit"), row.get("probe")
        if not isinstance(unit, str) or unit.count("/") != 2 or not isinstance(probe, dict):
            raise InputError(f"{folder / PROBES} line {n}: not a unit's probe ({{\"unit\": TASK/RANKING/UNIT, "
                             f"\"probe\": report}}); {_AGAIN}")
        out[unit] = probe
    return out


def unit_path(task: str, ranking: str, student: str, seed) -> str:
    """TASK/RANKING/UNIT of a unit of `advisor calibrate` as a publication names it: UNIT is the
    unit's folder (`STUDENT-sSEED`, a `/` in the student's name written `--`)."""
    return f"{task}/{ranking}/{student.replace('/', '--')}-s{seed}"


def path_order(name: str) -> tuple[str, ...]:
    """The order of a run's or unit's path among its folder's: part by part, as sorted paths are."""
    return tuple(name.split("/"))
