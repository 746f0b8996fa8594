"""Reading JSONL files a user may hand over: line by line, regular files only, each bad line one
error naming the file and line; strictly (every number finite) where a reader computes with them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Iterator

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.numbers import strict_loads


class JSONLError(ValueError):
    """A line of a JSONL file that is not one JSON object; the message names the file and line."""


def read_jsonl(path: str | os.PathLike, strict: bool = False, torn: list | None = None) -> list[dict]:
    """Read a JSONL file; a bad line raises JSONLError naming the file and line (with `strict`, a
    number that is not finite too: `numbers.strict_loads`). `torn`: see iter_jsonl."""
    return list(iter_jsonl(path, strict, torn))


MAX_LINE_BYTES = 256 << 20  # no line of any file the tool reads is longer


def iter_jsonl(path: str | os.PathLike, strict: bool = False, torn: list | None = None) -> Iterator[dict]:
    """The rows of a JSONL file one at a time (a large file is never held whole); a bad line raises
    JSONLError naming the file and line when the reader reaches it. Only regular files are read (a
    FIFO or a device would block or never end), and no line longer than MAX_LINE_BYTES. `strict`:
    NaN, Infinity, floats that overflow and huge integers are bad lines too (`numbers.strict_loads`).

    `torn` (a list), for a file the tool appends to: a last line cut short (no newline, and not one
    JSON object: what a kill or a full disk leaves of an append) is dropped, its line number put in
    `torn`, where otherwise it would be a bad line."""
    loads = strict_loads if strict else json.loads
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # a missing file: open() below says so
    if not stat.S_ISREG(mode):  # the file as it is, not a damaged line: no caller's advice on lines applies
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise InputError(f"{path} is {kind}, not a regular file: pass a JSONL file")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise JSONLError(f"{path} line {lineno}: longer than {MAX_LINE_BYTES >> 20} MiB")
            try:
                row = _row(raw, lineno, loads, path)
            except JSONLError:
                if torn is not None and not raw.endswith(b"\n"):  # the last line, cut short
                    torn.append(lineno)
                    return
                raise
            if row is not None:
                yield row


def _row(raw: bytes, lineno: int, loads, path) -> dict | None:
    """One line's object, None for a blank line, or JSONLError."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise JSONLError(f"{path} line {lineno}: not valid UTF-8 (byte {e.start} of the line)") from None
    if not line.strip():
        return None
    try:
        row = loads(line)
    except json.JSONDecodeError as e:
        raise JSONLError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise JSONLError(f"{path} line {lineno}: nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts, or NaN when strict
        raise JSONLError(f"{path} line {lineno}: not readable JSON ({e})") from None
    if not isinstance(row, dict):
        raise JSONLError(f"{path} line {lineno}: expected a JSON object, got {type(row).__name__}")
    return row


def read_jsonl_input(path: str | os.PathLike, missing: str | None = None, damaged: str = "") -> list[dict]:
    """`read_jsonl` for a file the user hands over: one InputError if it is absent (`missing`) or a
    line is bad (the line's problem, then `damaged`: how to make the file again)."""
    if missing is not None and not Path(path).exists():
        raise InputError(missing)
    try:
        return read_jsonl(path)
    except ValueError as e:
        raise InputError(f"{e}{damaged}") from None
