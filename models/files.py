"""Small file helpers every room needs: atomic writes, JSONL, fingerprints, the cache home.

Outputs are written to a temporary name beside the target and renamed into place, so a killed run
never leaves a half-written file under the final name. A verb checks its outputs can be written
before it starts any work, so a bad `--out` costs nothing:

    check_writable_dir(out, "--out")        # a folder to create or write into
    check_writable_file(out, "--out")       # a file to create or replace
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from capacity_advisor.models.errors import InputError

FORMAT_VERSION = 2  # 2: score rows carry n_scored, rank_mean and first_tokens


def advisor_home() -> Path:
    """Cache root: `$ADVISOR_HOME`, else `~/.cache/capacity-advisor`."""
    home = os.environ.get("ADVISOR_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "capacity-advisor"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError:
        check_writable_file(target, "output")  # says in one line which part of the path is in the way
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Raise InputError unless `path` is, or can be made, a folder this process can write into."""
    p = Path(os.path.expanduser(path))
    if _exists(p, flag) and not p.is_dir():
        raise InputError(f"{flag} {path} is a file, not a folder: give a folder path")
    _check_can_create_in(p, path, flag)
    return p


def check_writable_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Raise InputError unless a file can be written (created or replaced) at `path`."""
    p = Path(os.path.expanduser(path))
    if _exists(p, flag) and p.is_dir():
        raise InputError(f"{flag} {path} is a folder: give a file path")
    _check_can_create_in(p.parent, path, flag)
    return p


def _exists(p: Path, flag: str) -> bool:
    try:
        return p.exists()
    except OSError as e:  # e.g. a name too long for the filesystem
        raise InputError(f"{flag} {p}: {e.strerror}") from None


def _check_can_create_in(folder: Path, given, flag: str) -> None:
    """Writes go through a temporary file beside the target (atomic_path), so probe with one."""
    anc = folder.absolute()
    while not _exists(anc, flag):
        anc = anc.parent
    if not anc.is_dir():
        raise InputError(f"{flag} {given}: {anc} is a file, so nothing can be written under it; choose another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".advisor-write-check-", dir=anc)
    except OSError as e:
        raise InputError(f"{flag} {given}: cannot write in {anc} ({e.strerror}); choose a writable path") from None
    os.close(fd)
    os.unlink(tmp)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


class JSONLError(ValueError):
    """A line of a JSONL file that is not one JSON object; the message names the file and line."""


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file; a bad line raises JSONLError naming the file and line."""
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise JSONLError(f"{path} line {lineno}: not valid UTF-8 (byte {e.start} of the line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise JSONLError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
            except RecursionError:
                raise JSONLError(f"{path} line {lineno}: nested too deeply to read") from None
            except ValueError as e:  # e.g. an integer of more digits than Python converts
                raise JSONLError(f"{path} line {lineno}: not readable JSON ({e})") from None
            if not isinstance(row, dict):
                raise JSONLError(f"{path} line {lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def read_jsonl_input(path: str | os.PathLike, missing: str | None = None, damaged: str = "") -> list[dict]:
    """`read_jsonl` for a file the user hands over: one InputError if it is absent (`missing`) or a
    line is bad (the line's problem, then `damaged`: how to make the file again)."""
    if missing is not None and not Path(path).exists():
        raise InputError(missing)
    try:
        return read_jsonl(path)
    except ValueError as e:
        raise InputError(f"{e}{damaged}") from None


def stable_hash(obj: Any, n: int = 16) -> str:
    """A short hex digest of a JSON-serialisable object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:n]


def file_digest(path: str | os.PathLike, head_tail_bytes: int | None = None) -> str:
    """sha256 of a file; with `head_tail_bytes`, only its size, head and tail (for multi-GB weights)."""
    h = hashlib.sha256()
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        if head_tail_bytes is None or size <= 2 * head_tail_bytes:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(str(size).encode())
            h.update(f.read(head_tail_bytes))
            f.seek(size - head_tail_bytes)
            h.update(f.read(head_tail_bytes))
    return h.hexdigest()


def versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes our numbers, for config.json files."""
    out = {"capacity_advisor": _own_version(), "format": str(FORMAT_VERSION)}
    for name in ("torch", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # pragma: no cover - both are hard dependencies
            out[name] = "missing"
    return out


def _own_version() -> str:
    try:
        from importlib.metadata import version

        return version("capacity-advisor")
    except Exception:
        return "0+unknown"


def finite(obj):
    """`obj` with every NaN or infinity replaced by None: JSON has no NaN, and any reader must take our files."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def recorded_key(folder: str | os.PathLike, field: str) -> str | None:
    """The key `folder/config.json` records under `field` (what produced the folder), or None when
    there is no such file or it cannot be read: resumable folders compare it with their own."""
    path = Path(folder) / "config.json"
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(field)
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError, RecursionError):
        return "unreadable"
    return value if isinstance(value, str) else "unreadable"
