"""The embedded lab: synthetic reasoning tasks, a programmatic teacher, and a ladder of small
Llama students pretrained by the tool on first use (cached under `$ADVISOR_HOME/lab`).

    from capacity_advisor.models.lab import student_path, make_problems, teacher_candidates, check, write_pool
    path = student_path("xs")                       # an ordinary HF model folder
    write_pool("pool.jsonl", task="modchain", n=200) # grouped pool with reference answers

Importing this package is cheap: torch and transformers load only when a student is built.
"""

from capacity_advisor.models.lab.ladder import (
    DEFAULT_SEED,
    LADDER,
    TEACHER,
    TEACHERS,
    build_student,
    is_built,
    ladder_names,
    list_students,
    n_params,
    recipe_hash,
    student_dir,
    student_path,
)
from capacity_advisor.models.lab.tasks import FAMILIES, Problem, check, extract_answer, make_problems, style_of, teacher_candidates

__all__ = [
    "DEFAULT_SEED", "FAMILIES", "LADDER", "Problem", "TEACHER", "TEACHERS", "build_student", "check", "extract_answer",
    "is_built", "ladder_names", "list_students", "make_problems", "n_params",
    "recipe_hash", "student_dir", "student_path", "style_of", "teacher_candidates",
]
