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

This module holds the pool's data classes, `read_pool` with its filter, and `pick_checker` (the
answer checker a pool's problems are judged with); reading the files (and checking dataset folders)
is `pools.files`, the layouts `pools.layout`, and the options `pools.options` (below both).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_advisor.core.numbers import whole
from capacity_advisor.advisor.pools.files import iter_rows
from capacity_advisor.advisor.pools.layout import (
    answer_of, as_bool, flat_pair, task_of, text_of, detect_layout, given_id, stand_in_id,
)
from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import stable_hash_of_list
from capacity_advisor.training.text_metrics import CHECKER_DEFAULT, choose_checker



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


def read_pool(path: str | Path, opt: PoolOptions | None = None, sample: int | None = None, seed: int = 0) -> Pool:
    """The pool at `path`, read one row at a time. With `sample`, only `sample` of its usable
    problems, drawn with `seed` (`random.Random(seed).sample` of their ids in pool order): a first
    pass keeps no text, only what the filter needs, a second keeps the drawn problems' text only.
    Row and skip counts describe the whole pool either way. A sample as large as the pool is the pool."""
    opt = opt or PoolOptions()
    if sample is not None and not whole(sample, 1):
        raise InputError(f"--sample {sample!r} must be a whole number of problems, at least 1")
    try:
        if sample is None:
            return _read(path, opt).pool
        full = _read(path, opt, light=True)
        if sample >= len(full.kept):
            return _read(path, opt).pool
        import random

        drawn = set(random.Random(seed).sample([pid for _, pid in full.kept], sample))
        keep = {key: pid for key, pid in full.kept if pid in drawn}
        pool = _read(path, opt, keep=keep).pool
        pool.n_rows = full.pool.n_rows
        pool.skipped_candidates, pool.skipped_problems = full.pool.skipped_candidates, full.pool.skipped_problems
        pool.skipped_examples = full.pool.skipped_examples
        pool.whole_problems = len(full.kept)
        return pool
    except RecursionError:  # a field nested just under the parser's limit can still overflow str()
        raise InputError(f"pool {path} is nested too deeply to read; flatten its fields") from None


def pick_checker(pool: Pool, checker: str = CHECKER_DEFAULT) -> str:
    """The answer checker `pool`'s problems are judged with: `checker`, where `auto` picks the lab's
    for lab tasks and math for other problems with answers."""
    return choose_checker(checker, pool.has_answers, pool.tasks)


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
            cands = [Candidate(k, text_of(g, where, f"candidate {k}"), as_bool(marks[k], where) if marks else None)
                     for k, g in enumerate(gens)]
            prompt = text_of(row[f["prompt"]], where, f["prompt"])
            if pid is None:
                first_row[key] = n
            if light:
                shape = (bool(prompt.strip()), tuple((bool(c.text.strip()), c.correct) for c in cands))
                drafts[key] = shapes.setdefault(shape, shape)
            else:
                drafts[key] = Problem(pid, prompt, cands, answer_of(row, f, where), task_of(row, where))
            continue
        prompt, response = flat_pair(row, layout, f, where)
        # rows without an id are grouped by prompt
        key = ("id", pid) if pid is not None else ("prompt", hashlib.blake2b(prompt.encode("utf-8"), digest_size=16).digest())
        mark = as_bool(row.get(f["correct"]), where) if f["correct"] else None
        if keep is not None and key not in keep:
            continue
        if key not in drafts:
            if pid is None:
                first_row[key] = n
            drafts[key] = [bool(prompt.strip()), []] if light else Problem(pid, prompt, [], answer_of(row, f, where), task_of(row, where))
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
