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

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import JSONLError, read_jsonl, stable_hash

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
        return stable_hash([[p.id, p.prompt, [[c.k, c.text] for c in p.candidates]] for p in self.problems])

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


def read_rows(path: str | Path, what: str = "pool", source: DatasetSource | None = None) -> list[dict]:
    """The rows of a JSONL, JSON or Parquet file, a datasets folder (save_to_disk, or a dataset
    repository laid out as the hub lays it out), or a hub dataset id; any fault is one InputError."""
    source = source or DatasetSource()
    p = Path(path)
    if not p.exists() and HUB_ID.match(str(path)):
        return _read_hub_dataset(str(path), what, source)
    if not p.exists():
        raise InputError(f"{what} {path} does not exist: pass a JSONL, JSON, Parquet file, a datasets folder "
                         "or a hub dataset id (org/name)")
    if p.is_dir() and not _is_saved_dataset(p):
        return _read_hub_dataset(str(p), what, source)
    suffix = p.suffix.lower()
    if not p.is_dir() and suffix not in (".jsonl", ".ndjson", ".json", ".parquet", ".pq"):
        raise InputError(f"{what} {path}: unknown file type {p.suffix!r}; use .jsonl, .json, .parquet or a datasets.save_to_disk folder")
    try:
        if p.is_dir():
            return _read_dataset_dir(p, what)
        if suffix in (".jsonl", ".ndjson"):
            return read_jsonl(p)
        if suffix == ".json":
            return _read_json(p, what)
        return _read_parquet(p)
    except JSONLError as e:
        raise InputError(f"{e}: fix or remove that line") from None
    except RecursionError:
        raise InputError(f"{what} {path} is nested too deeply to read; flatten its fields") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {path} is not valid UTF-8 (byte {e.start}); save it as UTF-8") from None
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"cannot read {what} {path}: {e}") from None


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


def _read_parquet(p: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p).to_pylist()
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
        raise InputError(f"{where} has splits {', '.join(ds)}: pick one with --split")
    return ds[split]


def _read_hub_dataset(spec: str, what: str, source: DatasetSource) -> list[dict]:
    """A hub dataset id or a dataset repository folder, through `datasets.load_dataset` (which
    caches as it always does). Without the hub, the local cache only, or one line saying how to
    bring the dataset here."""
    import datasets

    local = os.path.isdir(spec)
    where = f"{what} {'folder ' if local else ''}{spec}" + (f" ({source.subset})" if source.subset else "")
    if not local:
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
    ds = _pick_split(ds, source, where)
    try:
        return ds.to_list()
    except Exception as e:
        raise InputError(f"cannot read {where} ({type(e).__name__}: {e})") from None


def _read_dataset_dir(p: Path, what: str) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(p))
    except (InputError, RecursionError):
        raise
    except Exception as e:  # a damaged folder fails anywhere inside datasets and pyarrow, with any type
        raise InputError(f"cannot read {what} folder {p} ({type(e).__name__}: {e}); save it again with save_to_disk") from None
    ds = _pick_split(ds, DatasetSource(), f"{what} folder {p}")
    try:
        return ds.to_list()
    except Exception as e:
        raise InputError(f"cannot read {what} folder {p} ({type(e).__name__}: {e}); save it again with save_to_disk") from None


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
    return [utf8_text(str(r[id_field]), f"{what} row {n + 1}", id_field) if id_field and r.get(id_field) is not None else None
            for n, r in enumerate(rows)]


def read_pool(path: str | Path, opt: PoolOptions | None = None) -> Pool:
    opt = opt or PoolOptions()
    rows = read_rows(path, source=opt.source)
    if not rows:
        raise InputError(f"pool {path} is empty")
    try:
        return _normalise(path, rows, opt)
    except RecursionError:  # a field nested just under the parser's limit can still overflow str()
        raise InputError(f"pool {path} is nested too deeply to read; flatten its fields") from None


def _normalise(path, rows: list[dict], opt: PoolOptions) -> Pool:
    layout, f = detect_layout(rows, opt)
    ids = given_ids(rows, f["id"], f"pool {Path(path).name}")
    taken = {pid for pid in ids if pid is not None}
    drafts: dict[tuple[str, str], Problem] = {}
    for n, (row, pid) in enumerate(zip(rows, ids)):
        where = f"pool {Path(path).name} row {n + 1}"
        if layout == "grouped":
            if ("id", pid) in drafts:
                raise InputError(f"{where}: id {pid!r} repeats an earlier row; ids must be unique per problem (or pass --id-field)")
            pid = pid if pid is not None else stand_in_id(n, taken)
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
            drafts[("id", pid)] = Problem(pid, _text(row[f["prompt"]], where, f["prompt"]), cands, _answer(row, f, where), _task(row, where))
            continue
        prompt, response = _flat_pair(row, layout, f, where)
        key = ("id", pid) if pid is not None else ("prompt", prompt)  # rows without an id are grouped by prompt
        mark = _as_bool(row.get(f["correct"]), where) if f["correct"] else None
        if key not in drafts:
            drafts[key] = Problem(pid if pid is not None else stand_in_id(n, taken), prompt, [], _answer(row, f, where),
                                  _task(row, where))
        prob = drafts[key]
        prob.candidates.append(Candidate(len(prob.candidates), response, mark))
    return _filter(path, layout, f, len(rows), list(drafts.values()), opt)


def _filter(path, layout: str, f: dict, n_rows: int, problems: list[Problem], opt: PoolOptions) -> Pool:
    pool = Pool([], str(path), layout, f, n_rows)

    def skip(counter: Counter, reason: str, pid: str) -> None:
        if opt.strict:
            raise InputError(f"problem {pid!r}: {reason} (--strict); fix the pool or drop --strict to skip it")
        counter[reason] += 1
        pool.skipped_examples.setdefault(reason, [])
        if len(pool.skipped_examples[reason]) < 5:
            pool.skipped_examples[reason].append(pid)

    for prob in problems:
        if not prob.prompt.strip():
            skip(pool.skipped_problems, "empty prompt", prob.id)
            continue
        kept = []
        for c in prob.candidates:
            if not c.text.strip():
                skip(pool.skipped_candidates, "empty response", prob.id)
            elif c.correct is False and not opt.all_candidates:
                pool.skipped_candidates["marked incorrect"] += 1  # the documented default, not a fault
            elif c.correct is None and f["correct"] and not opt.all_candidates:
                pool.skipped_candidates["correctness unknown"] += 1
            else:
                kept.append(c)
        if len(kept) < opt.min_candidates:
            skip(pool.skipped_problems, f"fewer than {opt.min_candidates} usable candidates", prob.id)
            continue
        prob.candidates = kept
        pool.problems.append(prob)
    if not pool.problems:
        why = "; ".join(f"{v} {k}" for k, v in {**pool.skipped_problems}.items()) or "no rows"
        raise InputError(
            f"pool {path}: no problem has {opt.min_candidates} usable candidates to rank ({why}); "
            "each problem needs several non-empty responses" + ("" if opt.all_candidates else " (or pass --all-candidates)")
        )
    return pool
