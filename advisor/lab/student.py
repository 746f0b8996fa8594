"""The lab's students as the advisor uses them: in `advisor recommend`, a student's identity before
it is built, its description (pretraining it on first use) and the lab teacher's pool when no
--pool is given; and `advisor lab list`, `fetch` and `build` as one library call each.

    from capacity_advisor.advisor.lab.student import lab_pool
    path = lab_pool("modchain", 1000, Path("runs/rec"))

The first 1,000 problems of each task ship with the package; a larger pool is sampled from
`lab:teacher` on demand, the way calibration samples its pools.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
from capacity_advisor.advisor.pools.lab import write_pool
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import advisor_home, check_writable_dir, write_jsonl
from capacity_advisor.models.lab.committed import committed_folder
from capacity_advisor.models.lab.ladder import (
    LAB_TEACHER, LADDER, TEACHERS, folder_of, list_students, parse_name, recipe_hash, student_dir, student_path,
)
from capacity_advisor.models.lab.pretrained import PRETRAINED, fetch, list_pretrained
from capacity_advisor.models.lab.train import set_threads
from capacity_advisor.models.loading import describe_config
from capacity_advisor.probes.recipe import LAB

Progress = Callable[[str, int, "int | None", float], None]  # (label, step, total, loss)

TEACHER_SAMPLING = dict(n=8, temperature=1.0, top_p=1.0, max_new_tokens=LAB.max_new_tokens, seed=0)  # as calibration samples pools
# How the lab runs a teacher model's sampling, here and in calibration: float32 on the CPU, lab checker,
# 32k padded tokens per batch.
ON_CPU = dict(device="cpu", dtype="float32", checker="lab", token_budget=32768)


def _quiet(message: str) -> None:
    return None


def lab_pool(task: str, n: int, out: Path, say=lambda m: None) -> Path:
    """`n` problems of the lab teacher's pool for `task`, written to OUT/pool.jsonl.

    The first 1,000 problems of each task ship with the package (sampled from `lab:teacher` by
    `advisor generate` with `TEACHER_SAMPLING`); a larger pool is sampled the same way on demand.
    """
    import gzip
    import json
    from importlib import resources

    src = resources.files("capacity_advisor.advisor.pools") / f"{task}-teacher-pool.jsonl.gz"
    rows = []
    if src.is_file():
        with gzip.open(src, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line, _ in zip(f, range(n))]
    if len(rows) < n:
        say(f"sampling a {n}-problem {task} pool from {LAB_TEACHER} (built on first use)")
        write_pool(out / "problems.jsonl", task=task, n=n, seed=TEACHER_SAMPLING["seed"])
        generate_pool(GenerateConfig(teacher=LAB_TEACHER, problems=str(out / "problems.jsonl"), out=str(out / "pool.jsonl"),
                                     **ON_CPU, **TEACHER_SAMPLING))
        return out / "pool.jsonl"
    write_jsonl(out / "pool.jsonl", rows)
    return out / "pool.jsonl"


def lab_identity(spec: str) -> dict:
    """A lab student's identity without building it: its name and its recipe's hash."""
    name, steps, build = parse_name(spec[len("lab:"):])
    return {"spec": spec, "recipe_hash": recipe_hash(name, build, steps)}


def describe_student(spec: str, say) -> dict:
    """The student's config (meta device, no weights); a lab student is pretrained here on first use."""
    name, steps, build = parse_name(spec[len("lab:"):])
    final = student_dir(name, build, steps)
    if not (final / "build.json").exists():
        say(f"copying {spec} from the builds kept in the repository (first use)" if committed_folder(final.name)
            else f"pretraining {spec} (first use; cached after)")
    return describe_config(spec)


def lab_names(text: str | None, teacher: bool = False, flag: str = "--sizes") -> list[str]:
    """The lab models `text` names, comma-separated: ladder names (and with `teacher` the teachers'),
    each optionally `NAME+bB` (pretrained from seed B); all of them when `text` is empty."""
    known = [*LADDER, *(TEACHERS if teacher else [])]
    if not text:
        return known
    names = [s.strip() for s in text.split(",") if s.strip()]

    def fits(name: str) -> bool:
        try:
            n = parse_name(name)
        except InputError:
            return False
        return n.name in known and n.steps is None

    bad = [s for s in names if not fits(s)]
    if bad or not names:
        raise InputError(f"{flag} {text[:200]!r}: unknown {', '.join(bad)[:200] or '(none)'}; use names from "
                         f"{', '.join(known)}, each optionally NAME+bBUILD (another pretraining seed)")
    return names


def list_models() -> list[dict]:
    """`advisor lab list`: every ladder student and teacher (name, shape, built or not), then every
    pretrained student the lab names (where it comes from, whether it is here)."""
    return list_students() + list_pretrained()


def fetch_pretrained(name: str, say: Callable[[str], None] = _quiet) -> dict:
    """`advisor lab fetch NAME`: a pretrained student's weights fetched and converted once under
    $ADVISOR_HOME (`models.lab.pretrained.fetch`); what was done."""
    name = name[len("lab:"):] if name.startswith("lab:") else name
    if name not in PRETRAINED:
        raise InputError(f"NAME {name[:60]!r} is not a pretrained student: use one of {', '.join(PRETRAINED)}")
    check_writable_dir(advisor_home(), "ADVISOR_HOME (where the student is kept)")
    return fetch(name, say=say)


def build_students(sizes: str | None, threads: int | None = None, progress: Progress | None = None,
                   say: Callable[[str], None] = _quiet) -> list[dict]:
    """`advisor lab build`: the lab models `sizes` names (`lab_names`; all of them when empty) that are
    not built yet, pretrained one after another (`progress(label, step, total, loss)` hears each
    one's steps); each model's row of `advisor lab list`."""
    check_writable_dir(advisor_home(), "ADVISOR_HOME (where lab models are cached)")
    set_threads(threads)
    names = lab_names(sizes, teacher=True)
    for name in names:
        if (folder_of(name) / "build.json").exists():
            say(f"{name}: already built")
            continue
        t0 = time.time()
        label = f"pretraining {name}"
        student_path(name, progress=(lambda step, total, loss: progress(label, step, total, loss)) if progress else None)
        say(f"{name}: built in {time.time() - t0:.0f}s")
    return [{**r, "name": name} for name in names for r in list_students(parse_name(name).build)
            if r["name"] == parse_name(name).name]
