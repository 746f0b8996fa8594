"""Read a pool of teacher responses in any of the layouts people keep them in.

    pool = read_pool("openr1.parquet", PoolOptions())
    pool.summary()  # problems, candidates, what was skipped and why

Layouts (auto-detected from the field names, overridable by flags):
- grouped: one problem per row with a list of candidates (OpenR1-Math-220k: `problem`,
  `generations`, `correctness_math_verify`, `answer`, `uuid`);
- flat: one response per row, grouped by an id field, else by identical prompt text;
  the response in a plain field, `messages`, ShareGPT `conversations`, Alpaca
  `instruction`/`input`/`output`, or TRL `prompt`/`completion`.
Files: JSONL, JSON (an array of rows), Parquet, or a `datasets.save_to_disk` folder.

Structural faults (bad JSON, a missing or mistyped field) are errors naming the row. Candidates
that cannot be used (marked incorrect, empty) are dropped, and problems left with fewer than two
are skipped; both are counted and reported. `strict=True` turns any skip into an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from capacity_advisor.models.errors import InputError, one_line
from capacity_advisor.models.files import JSONLError, iter_jsonl, read_jsonl, stable_hash_of_list

PROMPT_KEYS = ("problem", "prompt", "question", "instruction", "query", "input")
RESPONSES_KEYS = ("generations", "responses", "candidates", "completions", "outputs")
RESPONSE_KEYS = ("response", "completion", "output", "generation", "solution")
ANSWER_KEYS = ("answer", "reference_answer", "ground_truth", "final_answer", "gold", "target")
CORRECT_KEYS = ("correctness_math_verify", "correctness", "correct", "is_correct", "correctness_llama")
ID_KEYS = ("id", "uuid", "unique_id", "problem_id", "question_id", "prompt_id", "idx")


@dataclass
class PoolOptions:
    """Field overrides and filtering rules; each field is also a CLI flag of the same name."""

    prompt_field: str | None = None  # --prompt-field: the problem text
    responses_field: str | None = None  # --responses-field: list of candidates (grouped) or one response (flat)
    answer_field: str | None = None  # --answer-field: reference answer, for accuracy
    correct_field: str | None = None  # --correct-field: correctness marks, list or per row
    id_field: str | None = None  # --id-field: problem id (flat rows are grouped by it)
    all_candidates: bool = False  # --all-candidates: keep candidates marked incorrect
    strict: bool = False  # --strict: any skipped candidate or problem is an error
    split: str | None = None  # --split: of a hub dataset or dataset folder (default: train, or its only split)
    subset: str | None = None  # --subset: the dataset's configuration name
    revision: str | None = None  # --revision: a hub dataset's branch, tag or commit
    min_candidates: int = 2

    @property
    def source(self) -> "DatasetSource":
        return DatasetSource(self.split, self.subset, self.revision)


@dataclass(frozen=True)
class DatasetSource:
    """Which part of a hub dataset id (or of a dataset repository folder) to read."""

    split: str | None = None
    subset: str | None = None
    revision: str | None = None


@dataclass
class Candidate:
    k: int  # index among the problem's candidates as given in the file (stable across filters)
    text: str
    correct: bool | None = None


@dataclass
class Problem:
    id: str
    prompt: str
    candidates: list[Candidate]
    answer: str | None = None
    task: str | None = None  # the row's `task` field, when present (the lab's pools have one)


@dataclass
class Pool:
    problems: list[Problem]
    source: str
    layout: str
    fields: dict[str, str | None]
    n_rows: int
    skipped_candidates: Counter = field(default_factory=Counter)  # reason -> count
    skipped_problems: Counter = field(default_factory=Counter)
    skipped_examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> first few ids
    whole_problems: int | None = None  # usable problems of the whole pool, when this is a sample of it

    def __len__(self) -> int:
        return len(self.problems)

    @property
    def n_candidates(self) -> int:
        return sum(len(p.candidates) for p in self.problems)

    @property
    def has_answers(self) -> bool:
        return any(p.answer not in (None, "") for p in self.problems)

    @property
    def tasks(self) -> set[str]:
        return {p.task for p in self.problems if p.task}

    def fingerprint(self) -> str:
        """Content hash of what will be scored (ids, prompts, kept candidates), whatever the file format."""
        return stable_hash_of_list([p.id, p.prompt, [[c.k, c.text] for c in p.candidates]] for p in self.problems)

    def get(self, pid: str) -> Problem:
        if not hasattr(self, "_index"):
            self._index = {p.id: p for p in self.problems}
        return self._index[pid]

    def summary(self) -> dict:
        """What the pool holds. Stable for the same content: `source` is the file's name, not its
        path, so outputs that copy this (recommendation.json) do not depend on where it lies;
        `Pool.source` keeps the path as given."""
        return {
            "source": Path(self.source).name,
            "layout": self.layout,
            "fields": self.fields,
            "rows": self.n_rows,
            "problems": len(self.problems),
            "candidates": self.n_candidates,
            "candidates_per_problem": round(self.n_candidates / max(1, len(self.problems)), 2),
            "with_answers": self.has_answers,
            "skipped_candidates": dict(self.skipped_candidates),
            "skipped_problems": dict(self.skipped_problems),
            "fingerprint": self.fingerprint(),
        }


# ---- reading files -----------------------------------------------------------------------------


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
        return _dataset_rows(_load_hub_dataset(str(p), what, source), f"{what} folder {p}")
    suffix = p.suffix.lower()
    if not p.is_dir() and suffix not in FILE_SUFFIXES:
        raise InputError(f"{what} {path}: unknown file type {p.suffix!r}; use .jsonl, .json, .parquet or a datasets.save_to_disk folder")
    if p.is_dir():
        return _dataset_rows(_load_dataset_dir(p, what, source), f"{what} folder {p}", saved=True)
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


def _pick_split(ds, source: DatasetSource, where: str):
    """The requested split of a DatasetDict, else `train`, else its only split."""
    import datasets

    if not isinstance(ds, datasets.DatasetDict):
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

        from capacity_advisor.models.loading import _hub_answers

        if constants.HF_HUB_OFFLINE or not _hub_answers(constants.ENDPOINT):
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
    return _pick_split(ds, source, where)


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


# ---- layout detection and normalisation --------------------------------------------------------


def pick_field(keys: set[str], given: str | None, candidates: tuple[str, ...], flag: str, what: str = "the pool") -> str | None:
    """The field `given` by a flag (it must exist), else the first of `candidates` present."""
    if given is not None:
        if given not in keys:
            raise InputError(f"{flag} {given!r} is not a field of {what} (fields: {', '.join(sorted(keys))})")
        return given
    return next((k for k in candidates if k in keys), None)


def detect_layout(rows: list[dict], opt: PoolOptions) -> tuple[str, dict[str, str | None]]:
    keys: set[str] = set()
    for r in rows[:50]:
        keys |= set(r)
    id_f = pick_field(keys, opt.id_field, ID_KEYS, "--id-field")
    ans_f = pick_field(keys, opt.answer_field, ANSWER_KEYS, "--answer-field")
    cor_f = pick_field(keys, opt.correct_field, CORRECT_KEYS, "--correct-field")
    fields: dict[str, str | None] = {"id": id_f, "answer": ans_f, "correct": cor_f}

    resp_f = pick_field(keys, opt.responses_field, (), "--responses-field")
    if resp_f is None:
        resp_f = next((k for k in RESPONSES_KEYS if k in keys), None)
    grouped = resp_f is not None and (resp_f in RESPONSES_KEYS or isinstance(rows[0].get(resp_f), list))
    if grouped and not _is_messages(rows[0].get(resp_f)):
        prompt_f = pick_field(keys, opt.prompt_field, PROMPT_KEYS, "--prompt-field")
        if prompt_f is None:
            raise InputError(f"grouped pool has candidates in {resp_f!r} but no prompt field: pass --prompt-field")
        return "grouped", {**fields, "prompt": prompt_f, "responses": resp_f}
    if opt.prompt_field is None and opt.responses_field is None:
        if "messages" in keys:
            return "messages", {**fields, "prompt": "messages", "responses": "messages"}
        if "conversations" in keys:
            return "sharegpt", {**fields, "prompt": "conversations", "responses": "conversations"}
        if "instruction" in keys and "output" in keys:
            return "alpaca", {**fields, "prompt": "instruction", "responses": "output"}
        if "prompt" in keys and "completion" in keys:
            return "trl", {**fields, "prompt": "prompt", "responses": "completion"}
    prompt_f = pick_field(keys, opt.prompt_field, PROMPT_KEYS, "--prompt-field")
    resp_f = resp_f or pick_field(keys, None, RESPONSE_KEYS, "--responses-field")
    if prompt_f is None or resp_f is None:
        raise InputError(
            f"cannot tell the pool layout from its fields ({', '.join(sorted(keys))}): "
            "pass --prompt-field and --responses-field"
        )
    return "flat", {**fields, "prompt": prompt_f, "responses": resp_f}


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "content" in value[0]


def utf8_text(value: str, where: str, what: str) -> str:
    """`value`, if it is text UTF-8 can hold: JSON escapes can carry half a surrogate pair, which
    no tokenizer and no output file accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{where}: {what} holds an unpaired surrogate ({value[e.start]!r}, character {e.start}); "
                         "fix that escape in the file") from None
    return value


def _text(value: Any, where: str, what: str) -> str:
    if isinstance(value, str):
        return utf8_text(value, where, what)
    if value is None:
        return ""
    raise InputError(f"{where}: {what} must be a string, got {type(value).__name__}")


def _chat_pair(turns: Any, where: str, role_key: str, text_key: str, user: tuple, assistant: tuple) -> tuple[str, str]:
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise InputError(f"{where}: expected a list of chat turns")
    last_assistant = max((i for i, t in enumerate(turns) if t.get(role_key) in assistant), default=None)
    if last_assistant is None:
        raise InputError(f"{where}: no assistant turn to use as the response")
    user_turns = [i for i, t in enumerate(turns[:last_assistant]) if t.get(role_key) in user]
    if not user_turns:
        raise InputError(f"{where}: no user turn before the assistant's response")
    prompt = _text(turns[user_turns[-1]].get(text_key), where, "the user turn")
    return prompt, _text(turns[last_assistant].get(text_key), where, "the assistant turn")


def _flat_pair(row: dict, layout: str, f: dict, where: str) -> tuple[str, str]:
    if layout == "messages":
        return _chat_pair(row.get("messages"), where, "role", "content", ("user",), ("assistant",))
    if layout == "sharegpt":
        return _chat_pair(row.get("conversations"), where, "from", "value", ("human", "user"), ("gpt", "assistant"))
    if layout == "alpaca":
        instr = _text(row.get("instruction"), where, "instruction")
        extra = _text(row.get("input"), where, "input")
        return (f"{instr}\n\n{extra}" if extra.strip() else instr), _text(row.get("output"), where, "output")
    if layout == "trl":
        prompt, completion = row.get("prompt"), row.get("completion")
        if isinstance(prompt, list):  # conversational prompt/completion
            prompt = _chat_pair(prompt + [{"role": "assistant", "content": ""}], where, "role", "content", ("user",), ("assistant",))[0]
        if isinstance(completion, list):
            completion = completion[-1].get("content") if completion and isinstance(completion[-1], dict) else None
        return _text(prompt, where, "prompt"), _text(completion, where, "completion")
    if f["prompt"] not in row:
        raise InputError(f"{where}: missing field {f['prompt']!r}; pass --prompt-field")
    if f["responses"] not in row:
        raise InputError(f"{where}: missing field {f['responses']!r}; pass --responses-field")
    return _text(row[f["prompt"]], where, f["prompt"]), _text(row[f["responses"]], where, f["responses"])


def _as_bool(v: Any, where: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise InputError(f"{where}: correctness mark {v!r} is not true/false")


def _answer(row: dict, f: dict, where: str) -> str | None:
    if f["answer"] is None or row.get(f["answer"]) is None:
        return None
    return utf8_text(str(row[f["answer"]]), where, f["answer"])


def _task(row: dict, where: str) -> str | None:
    task = row.get("task")
    return utf8_text(task, where, "task") if isinstance(task, str) else None


def stand_in_id(n: int, taken: set[str]) -> str:
    """An id for row `n` (0-based), which has none: its number, unless the file already uses that
    as a real id (`taken`), then prefixed until it is free. Adds it to `taken`."""
    pid = str(n)
    while pid in taken:
        pid = "row-" + pid
    taken.add(pid)
    return pid


def given_ids(rows: list[dict], id_field: str | None, what: str = "pool") -> list[str | None]:
    return [given_id(r, id_field, f"{what} row {n + 1}") for n, r in enumerate(rows)]


def given_id(row: dict, id_field: str | None, where: str) -> str | None:
    """The row's own id, as text, or None when it has none."""
    return utf8_text(str(row[id_field]), where, id_field) if id_field and row.get(id_field) is not None else None


def read_pool(path: str | Path, opt: PoolOptions | None = None, sample: int | None = None, seed: int = 0) -> Pool:
    """The pool at `path`, read one row at a time. With `sample`, only `sample` of its usable
    problems, drawn with `seed` (`random.Random(seed).sample` of their ids in pool order): a first
    pass keeps no text, only what the filter needs, a second keeps the drawn problems' text only.
    Row and skip counts describe the whole pool either way. A sample as large as the pool is the pool."""
    opt = opt or PoolOptions()
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise InputError(f"--sample {sample!r} must be a whole number of problems, at least 1")
    try:
        if sample is None:
            return _read(path, opt).pool
        whole = _read(path, opt, light=True)
        if sample >= len(whole.kept):
            return _read(path, opt).pool
        import random

        drawn = set(random.Random(seed).sample([pid for _, pid in whole.kept], sample))
        keep = {key: pid for key, pid in whole.kept if pid in drawn}
        pool = _read(path, opt, keep=keep).pool
        pool.n_rows = whole.pool.n_rows
        pool.skipped_candidates, pool.skipped_problems = whole.pool.skipped_candidates, whole.pool.skipped_problems
        pool.skipped_examples = whole.pool.skipped_examples
        pool.whole_problems = len(whole.kept)
        return pool
    except RecursionError:  # a field nested just under the parser's limit can still overflow str()
        raise InputError(f"pool {path} is nested too deeply to read; flatten its fields") from None


@dataclass
class _Read:
    pool: Pool  # in a light pass: no problems, only the counts
    kept: list[tuple[tuple, str]]  # (draft key, problem id) of every problem the filter keeps, in pool order


def _read(path, opt: PoolOptions, light: bool = False, keep: dict | None = None) -> _Read:
    """One pass over the pool's rows. `light`: keep no text, only what the filter needs (the
    candidates' emptiness and marks). `keep`: materialise only these drafts (key -> problem id, from
    a light pass); the others are read past."""
    from itertools import chain, islice

    rows = iter_rows(path, source=opt.source)
    head = list(islice(rows, 50))
    if not head:
        raise InputError(f"pool {path} is empty")
    layout, f = detect_layout(head, opt)
    name = Path(path).name
    taken: set[str] = set()  # every id the file gives: stand-in ids must differ from all of them
    drafts: dict[tuple, Any] = {}  # key -> Problem, or in a light pass (prompt usable, [(text usable, mark), ...])
    first_row: dict[tuple, int] = {}  # key -> first row, for drafts without an id of their own
    passed: set[tuple] = set()  # drafts read past (`keep`), still checked for repeated ids
    shapes: dict[tuple, tuple] = {}  # a light pass shares one object per distinct grouped draft
    n_rows = 0
    for n, row in enumerate(chain(head, rows)):
        n_rows += 1
        where = f"pool {name} row {n + 1}"
        pid = given_id(row, f["id"], where)
        if pid is not None:
            taken.add(pid)
        if layout == "grouped":
            key = ("id", pid) if pid is not None else ("row", n)
            if pid is not None and (key in drafts or key in passed):
                raise InputError(f"{where}: id {pid!r} repeats an earlier row; ids must be unique per problem (or pass --id-field)")
            if keep is not None and key not in keep:
                passed.add(key)
                continue
            if f["prompt"] not in row:
                raise InputError(f"{where}: missing field {f['prompt']!r}; pass --prompt-field")
            gens = row.get(f["responses"])
            if not isinstance(gens, list):
                raise InputError(f"{where}: field {f['responses']!r} must be a list of responses, got {type(gens).__name__}")
            marks = row.get(f["correct"]) if f["correct"] else None
            if marks is not None and (not isinstance(marks, list) or len(marks) != len(gens)):
                raise InputError(f"{where}: {f['correct']!r} must be a list as long as {f['responses']!r} ({len(gens)})")
            cands = [Candidate(k, _text(g, where, f"candidate {k}"), _as_bool(marks[k], where) if marks else None)
                     for k, g in enumerate(gens)]
            prompt = _text(row[f["prompt"]], where, f["prompt"])
            if pid is None:
                first_row[key] = n
            if light:
                shape = (bool(prompt.strip()), tuple((bool(c.text.strip()), c.correct) for c in cands))
                drafts[key] = shapes.setdefault(shape, shape)
            else:
                drafts[key] = Problem(pid, prompt, cands, _answer(row, f, where), _task(row, where))
            continue
        prompt, response = _flat_pair(row, layout, f, where)
        # rows without an id are grouped by prompt
        key = ("id", pid) if pid is not None else ("prompt", hashlib.blake2b(prompt.encode("utf-8"), digest_size=16).digest())
        mark = _as_bool(row.get(f["correct"]), where) if f["correct"] else None
        if keep is not None and key not in keep:
            continue
        if key not in drafts:
            if pid is None:
                first_row[key] = n
            drafts[key] = [bool(prompt.strip()), []] if light else Problem(pid, prompt, [], _answer(row, f, where), _task(row, where))
        draft = drafts[key]
        if light:
            draft[1].append((bool(response.strip()), mark))
        else:
            draft.candidates.append(Candidate(len(draft.candidates), response, mark))
    return _filter(path, layout, f, n_rows, drafts, first_row, taken, opt, keep)


def _filter(path, layout: str, f: dict, n_rows: int, drafts: dict, first_row: dict, taken: set, opt: PoolOptions,
            keep: dict | None) -> _Read:
    """Give every draft its id (its own, else a stand-in), then drop unusable candidates and skip
    problems left with too few, counting both; the same decisions for light and full drafts."""
    pool = Pool([], str(path), layout, f, n_rows)
    kept_keys: list[tuple[tuple, str]] = []
    verdicts: dict = {}  # light passes share one verdict object per distinct outcome
    for key, draft in drafts.items():
        if keep is not None:
            pid = keep[key]
        else:
            pid = key[1] if key[0] == "id" else stand_in_id(first_row[key], taken)
        if isinstance(draft, Problem):
            draft.id = pid
            prompt_ok, marks = bool(draft.prompt.strip()), [(bool(c.text.strip()), c.correct) for c in draft.candidates]
        else:
            prompt_ok, marks = draft
        verdict = _judge(prompt_ok, marks, opt, bool(f["correct"]))
        verdict = verdicts.setdefault(verdict, verdict)
        if not _tally(pool, verdict, pid, opt):
            continue
        kept_keys.append((key, pid))
        if isinstance(draft, Problem):
            draft.candidates = [draft.candidates[i] for i in verdict[1]]
            pool.problems.append(draft)
        drafts[key] = None  # a light pass holds its drafts no longer than needed
    if not kept_keys:
        why = "; ".join(f"{v} {k}" for k, v in {**pool.skipped_problems}.items()) or "no rows"
        raise InputError(
            f"pool {path}: no problem has {opt.min_candidates} usable candidates to rank ({why}); "
            "each problem needs several non-empty responses" + ("" if opt.all_candidates else " (or pass --all-candidates)")
        )
    return _Read(pool, kept_keys)


def _judge(prompt_ok: bool, marks, opt: PoolOptions, has_marks: bool) -> tuple:
    """What the filter does with one problem, before its id is known: (events, kept). `events` are
    (counter, reason, is_skip) in order: a skip is a fault --strict refuses; the others are the
    documented default (marked incorrect, correctness unknown). `kept`: the indices of the kept
    candidates, or None when the problem is skipped."""
    if not prompt_ok:
        return (("problems", "empty prompt", True),), None
    events, kept = [], []
    for i, (usable, correct) in enumerate(marks):
        if not usable:
            events.append(("candidates", "empty response", True))
        elif correct is False and not opt.all_candidates:
            events.append(("candidates", "marked incorrect", False))
        elif correct is None and has_marks and not opt.all_candidates:
            events.append(("candidates", "correctness unknown", False))
        else:
            kept.append(i)
    if len(kept) < opt.min_candidates:
        events.append(("problems", f"fewer than {opt.min_candidates} usable candidates", True))
        return tuple(events), None
    return tuple(events), tuple(kept)


def _tally(pool: Pool, verdict: tuple, pid: str, opt: PoolOptions) -> bool:
    """Count one problem's verdict into the pool's skip counts; whether the problem is kept."""
    events, kept = verdict
    for counter, reason, is_skip in events:
        counts = pool.skipped_problems if counter == "problems" else pool.skipped_candidates
        if is_skip:
            if opt.strict:
                raise InputError(f"problem {pid!r}: {reason} (--strict); fix the pool or drop --strict to skip it")
            examples = pool.skipped_examples.setdefault(reason, [])
            if len(examples) < 5:
                examples.append(pid)
        counts[reason] += 1
    return kept is not None
