"""A lab student in `advisor recommend`: its identity before it is built, its description (pretraining
it on first use), and the lab teacher's pool when no --pool is given.

    from capacity_advisor.advisor.lab.student import lab_pool
    path = lab_pool("modchain", 1000, Path("runs/rec"))

The first 1,000 problems of each task ship with the package; a larger pool is sampled from
`lab:teacher` on demand, the way calibration samples its pools.
"""

from __future__ import annotations

from pathlib import Path

from capacity_advisor.core.files import write_jsonl
from capacity_advisor.models.lab.ladder import LAB_TEACHER
from capacity_advisor.probes.recipe import LAB

TEACHER_SAMPLING = dict(n=8, temperature=1.0, top_p=1.0, max_new_tokens=LAB.max_new_tokens, seed=0)  # as calibration samples pools
# How the lab runs a teacher model's sampling, here and in calibration: float32 on the CPU, lab checker,
# 32k padded tokens per batch.
ON_CPU = dict(device="cpu", dtype="float32", checker="lab", token_budget=32768)


def lab_pool(task: str, n: int, out: Path, say=lambda m: None) -> Path:
    """`n` problems of the lab teacher's pool for `task`, written to OUT/pool.jsonl.

    The first 1,000 problems of each task ship with the package (sampled from `lab:teacher` by
    `advisor generate` with `TEACHER_SAMPLING`); a larger pool is sampled the same way on demand.
    """
    import gzip
    import json
    from importlib import resources

    src = resources.files("capacity_advisor.models.lab") / "data" / f"{task}-teacher-pool.jsonl.gz"
    rows = []
    if src.is_file():
        with gzip.open(src, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line, _ in zip(f, range(n))]
    if len(rows) < n:
        from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
        from capacity_advisor.advisor.pools.lab import write_pool

        say(f"sampling a {n}-problem {task} pool from {LAB_TEACHER} (built on first use)")
        write_pool(out / "problems.jsonl", task=task, n=n, seed=TEACHER_SAMPLING["seed"])
        generate_pool(GenerateConfig(teacher=LAB_TEACHER, problems=str(out / "problems.jsonl"), out=str(out / "pool.jsonl"),
                                     **ON_CPU, **TEACHER_SAMPLING))
        return out / "pool.jsonl"
    write_jsonl(out / "pool.jsonl", rows)
    return out / "pool.jsonl"


def lab_identity(spec: str) -> dict:
    """A lab student's identity without building it: its name and its recipe's hash."""
    from capacity_advisor.models.lab.ladder import parse_name, recipe_hash

    name, steps, build = parse_name(spec[len("lab:"):])
    return {"spec": spec, "recipe_hash": recipe_hash(name, build, steps)}


def describe_student(spec: str, say) -> dict:
    """The student's config (meta device, no weights); a lab student is pretrained here on first use."""
    from capacity_advisor.models.lab.ladder import parse_name, student_dir
    from capacity_advisor.models.loading import describe_config

    from capacity_advisor.models.lab.committed import committed_folder

    name, steps, build = parse_name(spec[len("lab:"):])
    final = student_dir(name, build, steps)
    if not (final / "build.json").exists():
        say(f"copying {spec} from the builds kept in the repository (first use)" if committed_folder(final.name)
            else f"pretraining {spec} (first use; cached after)")
    return describe_config(spec)
