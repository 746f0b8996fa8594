"""The lab's pools: the scripted teacher's candidates written in the grouped layout `pools.read` reads.

One JSONL row per problem: `id`, `task`, `problem` (the prompt, ending in `=`), `generations`
(the teacher's candidates), `correctness` (all True: the teacher only writes correct ones),
`answer` (reference), and `styles` (which procedure wrote each candidate; for reports only).
"""

from __future__ import annotations

import os

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_file, write_jsonl
from capacity_advisor.models.lab import tasks


def pool_rows(task: str = "modchain", n: int = 100, difficulty: int | None = None, candidates: int = 6,
              seed: int = 0, problems: list | None = None, teacher: str = "program") -> list[dict]:
    """The grouped rows of a scripted teacher's pool (`tasks.SCRIPTED_TEACHERS`)."""
    probs = problems if problems is not None else tasks.make_problems(task, n, difficulty, seed)
    rows = []
    for i, p in enumerate(probs):
        cands = tasks.teacher_candidates(p, candidates, seed, teacher)
        for _style, text in cands:  # the teacher's promise, checked rather than assumed
            assert tasks.check(text, p.answer), (p.prompt, text)
        rows.append({
            "id": f"{p.task}-{seed}-{i}",
            "task": p.task,
            "problem": p.prompt,
            "generations": [t for _, t in cands],
            "correctness": [True] * len(cands),
            "answer": p.answer,
            "styles": [s for s, _ in cands],
        })
    return rows


MAX_PROBLEMS = 1_000_000  # problems of one lab pool (the sweep's hold 3,000)


def write_pool(path: str | os.PathLike, task: str = "modchain", n: int = 100, difficulty: int | None = None,
               candidates: int = 6, seed: int = 0, teacher: str = "program") -> int:
    """Write `n` problems with `candidates` teacher responses each (`advisor lab pool`); returns the
    row count."""
    check_writable_file(path, "--out")
    if not 4 <= candidates <= 8:
        raise InputError(f"--candidates must be between 4 and 8, got {candidates}")
    if not 1 <= n <= MAX_PROBLEMS:
        raise InputError(f"--n must be from 1 to {MAX_PROBLEMS:,} problems, got {n}")
    if teacher not in tasks.SCRIPTED_TEACHERS:
        raise InputError(f"--teacher {teacher!r} is no scripted teacher: use {' or '.join(tasks.SCRIPTED_TEACHERS)}")
    tasks.family(task)  # an unknown task: one error before the file is opened
    return write_jsonl(path, pool_rows(task, n, difficulty, candidates, seed, teacher=teacher))
