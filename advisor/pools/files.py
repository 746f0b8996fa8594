"""The rows of a pool or problems file, one at a time, from wherever they lie.

    for row in iter_rows("openr1.parquet"): ...
    rows = read_rows("org/name", what="problems file", source=DatasetSource(split="test"))

Sources: a JSONL file, a JSON file (an array of rows, or an object holding one under `data`,
`rows` or `train`; a `.json` file of JSON lines is read as JSONL), a Parquet file, a
`datasets.save_to_disk` folder, a dataset repository folder laid out as the hub lays it out, or
a hub dataset id (`datasets.load_dataset`; its local cache only when the hub does not answer).
JSONL, Parquet and datasets folders are read a batch of rows at a time, never whole. Every fault
of a file is one InputError naming it.

A datasets folder may name only what lies inside it: `check_repository_folder` and
`check_saved_folder` refuse one whose card or metadata names files elsewhere (an absolute path,
a `..`, a URL) or that holds a symbolic link leading out of it, before `datasets` reads it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from capacity_advisor.core.errors import InputError, one_line
from capacity_advisor.core.jsonl import JSONLError, iter_jsonl, read_jsonl
from capacity_advisor.models.loading import hub_answers


@dataclass(frozen=True)
class DatasetSource:
    """Which part of a hub dataset id (or of a dataset repository folder) to read."""

    split: str | None = None
    subset: str | None = None
    revision: str | None = None


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".pq")
_FILE_LIKE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")  # .jsonl, .jsonlx, .csv; not a version like -1.5
ROW_BATCH = 1024  # rows converted at a time from Parquet and datasets folders


def read_rows(path: str | Path, what: str = "pool", source: DatasetSource | None = None) -> list[dict]:
    """The rows of a JSONL, JSON or Parquet file, a datasets folder (save_to_disk, or a dataset
    repository laid out as the hub lays it out), or a hub dataset id; any fault is one InputError."""
    return list(iter_rows(path, what, source))


def iter_rows(path: str | Path, what: str = "pool", source: DatasetSource | None = None) -> Iterator[dict]:
    """`read_rows` one row at a time: JSONL, Parquet and datasets folders are never held whole
    (a JSON array is parsed whole, as JSON must be). Which source to read is decided, and a path
    that does not exist refused, before the first row; a fault in a row is one InputError when
    the reader reaches it."""
    return _guarded(_open_rows(path, what, source or DatasetSource()), path, what)


def looks_like_file(path: str) -> bool:
    """Whether a path that does not exist was meant as a local file or folder, not a hub id: it
    has a file-type suffix (`pool.jsonlx`), or a folder part that exists here (`data/pool200`)."""
    p = Path(os.path.expanduser(path))
    if path.startswith(("/", ".", "~")) or _FILE_LIKE_SUFFIX.search(p.name):
        return True
    return str(p.parent) not in ("", ".") and p.parent.is_dir()


def _open_rows(path, what: str, source: DatasetSource) -> Iterator[dict]:
    p = Path(path)
    if not p.exists() and HUB_ID.match(str(path)) and not looks_like_file(str(path)):
        return _dataset_rows(_load_hub_dataset(str(path), what, source), f"{what} {path}")
    if not p.exists():
        raise InputError(f"{what} {path} does not exist (no such file or folder): pass a JSONL, JSON, Parquet file, "
                         "a datasets folder or a hub dataset id (org/name)")
    if p.is_dir() and not _is_saved_dataset(p):
        _refuse_unused(source, ("revision",), f"{what} folder {p}", "a local folder has no revisions")
        return _dataset_rows(_load_hub_dataset(str(p), what, source), f"{what} folder {p}")
    suffix = p.suffix.lower()
    if not p.is_dir() and suffix not in FILE_SUFFIXES:
        raise InputError(f"{what} {path}: unknown file type {p.suffix!r}; use .jsonl, .json, .parquet or a datasets.save_to_disk folder")
    if p.is_dir():
        _refuse_unused(source, ("subset", "revision"), f"{what} folder {p}",
                       "a save_to_disk folder has neither configurations nor revisions")
        return _dataset_rows(_load_dataset_dir(p, what, source), f"{what} folder {p}", saved=True)
    _refuse_unused(source, ("split", "subset", "revision"), f"{what} {path}",
                   "they select within a hub dataset or a dataset folder, not a file")
    if suffix in (".jsonl", ".ndjson"):
        return iter_jsonl(p)
    if suffix == ".json":
        return _json_rows(p, what)
    return _parquet_rows(p)


def _guarded(rows: Iterator[dict], path, what: str) -> Iterator[dict]:
    """`rows`, each fault of the file while reading it turned into one InputError."""
    try:
        yield from rows
    except InputError:
        raise
    except JSONLError as e:
        raise InputError(f"{e}: fix or remove that line") from None
    except RecursionError:
        raise InputError(f"{what} {path} is nested too deeply to read; flatten its fields") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {path} is not valid UTF-8 (byte {e.start}); save it as UTF-8") from None
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"cannot read {what} {path}: {e}") from None


def _json_rows(p: Path, what: str) -> Iterator[dict]:
    yield from _read_json(p, what)  # read when the first row is asked for, inside _guarded


def _read_json(p: Path, what: str) -> list[dict]:
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return read_jsonl(p)  # many ".json" files are really JSON lines
    if isinstance(data, dict):
        for key in ("data", "rows", "train"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise InputError(f"{what} {p}: expected a JSON array of objects (one per row)")
    return data


def _parquet_rows(p: Path) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for batch in pq.ParquetFile(p).iter_batches(batch_size=ROW_BATCH):
            yield from batch.to_pylist()
    except pa.ArrowException as e:  # some (ArrowNotImplementedError) are neither ValueError nor OSError
        raise ValueError(f"not a readable Parquet file ({e})") from None


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists()


def _refuse_unused(source: DatasetSource, names: tuple[str, ...], where: str, why: str) -> None:
    """One InputError when a dataset flag is given that `where` would ignore."""
    given = [f"--{n}" for n in names if getattr(source, n) is not None]
    if given:
        raise InputError(f"{' and '.join(given)} cannot apply to {where} ({why}): leave {' and '.join(given)} out")


def _pick_split(ds, source: DatasetSource, where: str, saved: bool = False):
    """The requested split of a DatasetDict, else `train`, else its only split. A saved single
    Dataset has no splits, so a --split for it is refused, not ignored."""
    import datasets

    if not isinstance(ds, datasets.DatasetDict):
        if saved and source.split is not None:
            raise InputError(f"{where} holds one dataset without splits: leave --split {source.split!r} out")
        return ds
    split = source.split or ("train" if "train" in ds else (next(iter(ds)) if len(ds) == 1 else None))
    if split not in ds:
        asked = f"no split {source.split!r}: " if source.split else ""
        raise InputError(f"{where} has {asked}splits {', '.join(ds)}: pick one with --split")
    return ds[split]


def _load_hub_dataset(spec: str, what: str, source: DatasetSource):
    """A hub dataset id or a dataset repository folder, through `datasets.load_dataset` (which
    caches as it always does). Without the hub, the local cache only, or one line saying how to
    bring the dataset here. A folder may name only files inside itself (`check_repository_folder`)."""
    import datasets

    local = os.path.isdir(spec)
    where = f"{what} {'folder ' if local else ''}{spec}" + (f" ({source.subset})" if source.subset else "")
    if local:
        check_repository_folder(Path(spec), where)
    else:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE or not hub_answers(constants.ENDPOINT):
            # datasets then reads its cache only, instead of retrying the network for a minute
            constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        ds = datasets.load_dataset(spec, name=source.subset, split=source.split, revision=source.revision)
    except (InputError, RecursionError):
        raise
    except Exception as e:  # not found, offline, bad config name or split, damaged files: any type, deep inside
        hint = ("" if local else f"; where there is network: `hf download {spec} --repo-type dataset --local-dir DIR`, "
                "then pass --pool DIR")
        raise InputError(f"cannot read {where}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                         f"{hint}") from None
    return _pick_split(ds, source, where)


def _load_dataset_dir(p: Path, what: str, source: DatasetSource):
    import datasets

    where = f"{what} folder {p}"
    check_saved_folder(p, where)
    try:
        ds = datasets.load_from_disk(str(p))
    except (InputError, RecursionError):
        raise
    except Exception as e:  # a damaged folder fails anywhere inside datasets and pyarrow, with any type
        raise InputError(f"cannot read {where} ({type(e).__name__}: {e}); save it again with save_to_disk") from None
    return _pick_split(ds, source, where, saved=True)


def _dataset_rows(ds, where: str, saved: bool = False) -> Iterator[dict]:
    """The rows of a `datasets.Dataset` (memory-mapped Arrow), a batch at a time."""
    again = "; save it again with save_to_disk" if saved else ""
    try:
        for batch in ds.iter(batch_size=ROW_BATCH):
            columns = list(batch)
            yield from (dict(zip(columns, values)) for values in zip(*(batch[c] for c in columns)))
    except (InputError, RecursionError):
        raise
    except Exception as e:
        raise InputError(f"cannot read {where} ({type(e).__name__}: {e}){again}") from None


# ---- folders may name only what lies inside them -----------------------------------------------

_FOLDER_ENTRIES = 20_000  # entries a folder check looks at; a real dataset folder has a few hundred at most


def check_repository_folder(folder: Path, where: str) -> None:
    """Refuse a dataset repository folder whose card (README.md front matter, .huggingface.yaml)
    names data outside the folder: an absolute path, a `..` that climbs out, a home folder, a URL;
    or that holds a symbolic link leading outside it. `datasets` would read those files."""
    meta: dict = {}
    readme, standalone = folder / "README.md", folder / ".huggingface.yaml"
    try:
        if readme.is_file():
            from huggingface_hub import DatasetCard

            meta.update(DatasetCard.load(readme).data.to_dict())
        if standalone.is_file():
            import yaml

            extra = yaml.safe_load(standalone.read_text(encoding="utf-8"))
            if isinstance(extra, dict):
                meta.update(extra)
    except InputError:
        raise
    except Exception as e:  # bad YAML, bad UTF-8, a card of the wrong shape
        raise InputError(f"{where}: its dataset card (README.md / .huggingface.yaml) cannot be read "
                         f"({type(e).__name__}: {one_line(str(e))[:200]}); fix its YAML header") from None
    configs = meta.get("configs")
    entries = []
    for config in (configs if isinstance(configs, list) else [configs] if isinstance(configs, dict) else []):
        if isinstance(config, dict):
            entries += _data_file_patterns(config.get("data_files"), where)
            if config.get("data_dir") is not None:
                entries.append(config["data_dir"])
    for entry in entries:
        _check_inside(folder, entry, where, "README data_files")
    _check_links(folder, where)


def check_saved_folder(folder: Path, where: str) -> None:
    """Refuse a `save_to_disk` folder whose dataset_dict.json or state.json names files or splits
    outside it (datasets joins those names to the folder, so an absolute one is read as it is)."""
    splits = _small_json(folder / "dataset_dict.json", where)
    if isinstance(splits, dict):
        names = splits.get("splits")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InputError(f"{where}: dataset_dict.json must list its splits by name; save it again with save_to_disk")
        for name in names:
            if not name or "/" in name or "\\" in name or name in (".", ".."):
                raise InputError(f"{where}: dataset_dict.json names a split {name[:60]!r} that is not a plain folder "
                                 "name; save it again with save_to_disk")
            check_saved_folder(folder / name, where)
    state = _small_json(folder / "state.json", where)
    if isinstance(state, dict):
        files = state.get("_data_files")
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files):
            raise InputError(f"{where}: state.json does not list its data files; save it again with save_to_disk")
        for f in files:
            _check_inside(folder, f["filename"], where, "state.json")
    _check_links(folder, where)


def _small_json(path: Path, where: str):
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > 16 << 20:
            raise ValueError("larger than any datasets metadata file")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"{where}: {path.name} cannot be read ({one_line(str(e))[:200]}); save it again with save_to_disk") from None


def _data_file_patterns(value, where: str) -> list:
    """Every path or pattern in a `data_files` value: a string, a list of them, a list of
    {split, path} entries, or a {split: path(s)} mapping."""
    out: list = []
    stack = [value]
    while stack:
        v = stack.pop()
        if len(out) + len(stack) > _FOLDER_ENTRIES:
            raise InputError(f"{where}: its README data_files lists more than {_FOLDER_ENTRIES:,} entries")
        if isinstance(v, dict):
            stack.extend([v["path"]] if "path" in v else v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif v is not None:
            out.append(v)
    return out


def _check_inside(folder: Path, entry, where: str, source: str) -> None:
    text = entry if isinstance(entry, str) else str(entry)
    shown = text if len(text) <= 80 else text[:80] + "…"
    parts = re.split(r"[/\\]", text)
    if ("://" in text or text.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", text) or ".." in parts
            or os.path.isabs(text)):
        raise InputError(f"{where}: {source} names {shown!r}, outside the folder; a dataset folder may only name "
                         "files inside itself (relative paths, no '..')")
    base = os.path.realpath(folder)
    literal = re.split(r"[*?\[{]", text, maxsplit=1)[0]  # the part before any glob character
    target = os.path.realpath(os.path.join(base, literal))
    if target != base and not target.startswith(base.rstrip(os.sep) + os.sep):
        raise InputError(f"{where}: {source} names {shown!r}, which leads outside the folder (a symbolic link?); "
                         "a dataset folder may only name files inside itself")


def _check_links(folder: Path, where: str) -> None:
    """No symbolic link inside the folder may lead outside it."""
    base = os.path.realpath(folder)
    seen = 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            seen += 1
            if seen > _FOLDER_ENTRIES:
                return  # datasets reads only what the card or the layout names; those were checked
            path = os.path.join(root, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if target != base and not target.startswith(base.rstrip(os.sep) + os.sep):
                    raise InputError(f"{where}: {os.path.relpath(path, folder)} is a link to {target}, outside the "
                                     "folder; copy the file in instead")
