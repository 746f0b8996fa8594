"""The capacity ladder: small Llama students and their teacher, pretrained by the tool on first use and cached.

    from capacity_advisor.models.lab.ladder import student_path
    path = student_path("xs")        # builds (seconds) on first use, then reuses the folder
    path = student_path("teacher")   # the lab's teacher: larger than every student

Students: ten, from 3.8k to 1.34M parameters (347x). Six are "balanced" (xs .. xxl, layers
growing with width); at two sizes (~105k and ~375k) a deep-narrow and a shallow-wide student
sit beside the balanced one, so capacity is not read off one shape. Each student is pretrained on
a synthetic corpus of all task families in which some reasoning styles are common and others rare
(`CORPUS_STYLES`), with a step budget that grows with its size, so bigger students are better
base models.

Two teachers write the lab's sampled pools, as the paper's pools come from sampling a larger model:
`lab:teacher` (2.26M parameters) is pretrained on every reasoning procedure of every family in
equal shares, and `lab:teacher-xl` (5.4M parameters, 4x the largest student, another shape) on a
mixture that favours the spelled-out procedures (`TEACHER_CORPORA`); neither sees the
answer-only style. A student folder is an ordinary Hugging Face
model folder (config.json, model.safetensors, tokenizer files) plus `build.json` (the recipe,
cost and final loss). The folder name carries a hash of the recipe, so changing the recipe
never reuses stale weights; a build writes into a temporary folder renamed into place when
complete, so a killed build leaves nothing half-made under the final name.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import advisor_home, give_umask_modes, stable_hash, write_json
from capacity_advisor.core.numbers import number, strict_loads
from capacity_advisor.models.lab import committed, tasks
from capacity_advisor.models.lab.tokenizer import build_tokenizer
from capacity_advisor.models.lab.train import train_loop

RECIPE_VERSION = 2  # 2: the carry marker in the alphabet, harder tasks, two-digit lists
DEFAULT_SEED = 0


@dataclass(frozen=True)
class StudentSpec:
    name: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    steps: int  # pretraining optimizer steps: the budget grows with size
    batch: int
    lr: float


# 3.8k to 1.34M parameters (347x); the pretraining budget grows 5x from the smallest to the largest.
# Deep-narrow and shallow-wide students share the budget of the balanced student of their size.
LADDER: dict[str, StudentSpec] = {
    s.name: s
    for s in (
        StudentSpec("xs", hidden=16, layers=1, heads=2, ffn=48, steps=600, batch=64, lr=3e-3),
        StudentSpec("s", hidden=32, layers=2, heads=2, ffn=96, steps=1000, batch=64, lr=3e-3),
        StudentSpec("m-wide", hidden=88, layers=1, heads=4, ffn=264, steps=1400, batch=64, lr=2e-3),
        StudentSpec("m-deep", hidden=40, layers=5, heads=4, ffn=120, steps=1400, batch=64, lr=1.5e-3),
        StudentSpec("m", hidden=64, layers=2, heads=4, ffn=192, steps=1400, batch=64, lr=2e-3),
        StudentSpec("l", hidden=96, layers=3, heads=4, ffn=288, steps=1800, batch=64, lr=1.5e-3),
        StudentSpec("l-wide", hidden=168, layers=1, heads=4, ffn=504, steps=1800, batch=64, lr=1.5e-3),
        StudentSpec("l-deep", hidden=64, layers=7, heads=4, ffn=192, steps=1800, batch=64, lr=1e-3),
        StudentSpec("xl", hidden=128, layers=3, heads=4, ffn=384, steps=2400, batch=64, lr=1.2e-3),
        StudentSpec("xxl", hidden=160, layers=4, heads=4, ffn=480, steps=3000, batch=64, lr=1e-3),
    )
}
TEACHER = StudentSpec("teacher", hidden=208, layers=4, heads=4, ffn=624, steps=3000, batch=64, lr=1e-3)
TEACHER_XL = StudentSpec("teacher-xl", hidden=288, layers=5, heads=4, ffn=864, steps=2400, batch=64, lr=8e-4)
TEACHERS: dict[str, StudentSpec] = {t.name: t for t in (TEACHER, TEACHER_XL)}
LAB_TEACHER = f"lab:{TEACHER.name}"  # the model that samples the lab's pools unless another is named

# Pretraining corpus: family weights, and per family how often each procedure appears.
# Answer-only and terse styles are common, spelled-out procedures rare (a few percent), so the
# teacher's candidates differ in likelihood under each student.
CORPUS_FAMILIES = {"modchain": 0.6, "addition": 0.2, "listmax": 0.2}
CORPUS_STYLES = {
    "modchain": {"direct": 0.30, "skip": 0.40, "running": 0.20, "explicit": 0.06, "full": 0.04},
    "addition": {"direct": 0.30, "digits": 0.45, "columns": 0.20, "places": 0.05},
    "listmax": {"direct": 0.30, "running": 0.45, "compare": 0.20, "sort": 0.05},
}
# The teachers' corpora: every family equally. `teacher`: every reasoning procedure of a family
# equally; `teacher-xl`: the spelled-out procedures (each family's last two) three times as often
# as the terse ones.
PRETRAINED_FAMILIES = {name: tasks.FAMILIES[name] for name in tasks.PRETRAINED}
TEACHER_FAMILIES = {name: 1 / len(PRETRAINED_FAMILIES) for name in PRETRAINED_FAMILIES}
TEACHER_STYLES = {
    name: {p: 1 / (len(f.procedures) - 1) for p in f.procedures if p != "direct"} for name, f in PRETRAINED_FAMILIES.items()
}


def _verbose_styles() -> dict:
    out = {}
    for name, f in PRETRAINED_FAMILIES.items():
        procs = [p for p in f.procedures if p != "direct"]
        weights = [3.0 if i >= len(procs) - 2 else 1.0 for i in range(len(procs))]
        out[name] = {p: w / sum(weights) for p, w in zip(procs, weights)}
    return out


TEACHER_CORPORA = {"teacher": (TEACHER_FAMILIES, TEACHER_STYLES), "teacher-xl": (TEACHER_FAMILIES, _verbose_styles())}
MAX_LENGTH = tasks.MAX_PAIR_TOKENS
CHECKPOINT_EVERY = 200  # pretraining steps between the checkpoints a stopped build resumes from


def ladder_names() -> list[str]:
    return list(LADDER)


def spec(name: str) -> StudentSpec:
    if name in TEACHERS:
        return TEACHERS[name]
    if name not in LADDER:
        raise InputError(f"unknown lab model {name!r}: use one of {', '.join([*LADDER, *TEACHERS])}")
    return LADDER[name]


def shape(s: StudentSpec) -> str:
    """balanced, deep-narrow or shallow-wide: hidden size per layer against the balanced students'."""
    per_layer = s.hidden / s.layers
    return "deep-narrow" if per_layer < 16 else "shallow-wide" if per_layer > 64 else "balanced"


def corpus(name: str) -> tuple[dict, dict]:
    """(family weights, procedure weights per family) of a model's pretraining corpus."""
    return TEACHER_CORPORA.get(name, (CORPUS_FAMILIES, CORPUS_STYLES))


def recipe(name: str, seed: int = DEFAULT_SEED, steps: int | None = None) -> dict:
    """Everything that determines a model's weights (hashed into its folder name)."""
    s = asdict(spec(name))
    if steps is not None:
        s["steps"] = int(steps)
    families, styles = corpus(name)
    return {
        "version": RECIPE_VERSION,
        "student": s,
        "seed": seed,
        "alphabet": tasks.ALPHABET,
        "families": families,
        "styles": styles,
        "difficulty": {k: list(f.difficulty_range) for k, f in PRETRAINED_FAMILIES.items()},
        "max_length": MAX_LENGTH,
    }


def recipe_hash(name: str, seed: int = DEFAULT_SEED, steps: int | None = None) -> str:
    return stable_hash(recipe(name, seed, steps), 8)


def lab_dir() -> Path:
    return advisor_home() / "lab"


def student_dir(name: str, seed: int = DEFAULT_SEED, steps: int | None = None) -> Path:
    return lab_dir() / f"{name}-{recipe_hash(name, seed, steps)}"


def is_built(name: str, seed: int = DEFAULT_SEED) -> bool:
    return (student_dir(name, seed) / "build.json").exists()


class LabName(NamedTuple):
    """A lab model named `NAME[+bBUILD][@STEPS]`: its ladder name, its pretraining build (the
    seed of its init and corpus; 0 is the ladder's own) and a step budget other than the ladder's."""

    name: str
    steps: int | None
    build: int


NAME_FORM = re.compile(r"(?P<name>[a-z][a-z-]*)(?:\+b(?P<build>\d{1,4}))?(?:@(?P<steps>\d{1,9}))?")
MAX_BUILD = 1000  # pretraining seeds of one student; a lab sweep uses a handful


def parse_name(text: str) -> LabName:
    """`NAME`, `NAME+bBUILD` (pretrained from seed BUILD), `NAME@STEPS` (a shorter or longer
    pretraining budget, e.g. a quick teacher in tests) or `NAME+bBUILD@STEPS`."""
    m = NAME_FORM.fullmatch(text)
    steps = int(m["steps"]) if m and m["steps"] else None
    build = int(m["build"]) if m and m["build"] else DEFAULT_SEED
    if not m or steps == 0 or build > MAX_BUILD:
        raise InputError(f"lab model {text[:60]!r}: write NAME, NAME+bBUILD or NAME@STEPS, with a positive number of "
                         f"pretraining steps and a build from 0 to {MAX_BUILD}")
    return LabName(m["name"], steps, build)


def folder_of(text: str) -> Path:
    """The cache folder of the lab model named `text` (any of `parse_name`'s forms), built or not."""
    n = parse_name(text)
    return student_dir(n.name, n.build, n.steps)


def lab_model(name: str, build: int = DEFAULT_SEED) -> str:
    """The `lab:` model spec of ladder student `name` pretrained as build `build`."""
    return f"lab:{name}" + (f"+b{build}" if build != DEFAULT_SEED else "")


def student_path(name: str, seed: int = DEFAULT_SEED, progress: Callable[[int, int, float], None] | None = None,
                 steps: int | None = None) -> Path:
    """The folder of lab model `name` (`parse_name`'s forms; a build there overrides `seed`), pretraining it on first use (cached, reused after)."""
    name, at_steps, build = parse_name(name)
    steps = steps if steps is not None else at_steps
    seed = build if build != DEFAULT_SEED else seed
    spec(name)  # validate first: an unknown name must not create folders
    final = student_dir(name, seed, steps)
    if (final / "build.json").exists() or committed.adopt(final):  # built here, or kept in the repository
        return final
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    checkpoint = committed.checkpoint_file(final)  # the pretraining checkpoint a stopped build resumes from
    committed.seed_checkpoint(final)  # a build another machine started, kept in the repository
    try:
        build_student(name, tmp, seed=seed, steps=steps, progress=progress, checkpoint=checkpoint)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "build.json").exists():  # lost a race to a finished build: use theirs
                raise
        shutil.rmtree(checkpoint.parent, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def make_config(s: StudentSpec, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden,
        intermediate_size=s.ffn,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )


def corpus_batches(seed: int, batch: int, name: str = "xs"):
    """An endless, seeded stream of pretraining batches of (prompt, response) pairs for model `name`."""
    families, corpus_styles = corpus(name)
    rng = random.Random(f"corpus:{seed}") if name not in TEACHERS else random.Random(f"{name}-corpus:{seed}")
    fams = list(families)
    fw = [families[f] for f in fams]
    while True:
        out = []
        for _ in range(batch):
            fam = tasks.FAMILIES[rng.choices(fams, fw)[0]]
            lo, hi = fam.difficulty_range
            p = fam.make(rng, rng.randint(lo, hi))
            styles = corpus_styles[fam.name]
            name = rng.choices(list(styles), list(styles.values()))[0]
            out.append((p.prompt, fam.procedures[name](p, rng)))
        yield out


def build_student(
    name: str,
    out: str | os.PathLike,
    seed: int = DEFAULT_SEED,
    steps: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    checkpoint: Path | None = None,
) -> Path:
    """Pretrain student `name` from a seeded random init and save it as a model folder at `out`.

    `steps` overrides the ladder's budget (tests use a few steps). `progress(step, total, loss)`.
    `checkpoint`: a file the pretraining saves to as it goes and resumes from (`train_loop`).
    """
    import torch
    from transformers import LlamaForCausalLM

    s = spec(name)
    total = int(steps if steps is not None else s.steps)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    # One thread: these matmuls are too small to gain much from more, and a fixed thread count
    # keeps the float reductions (so the weights) identical from machine to machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(make_config(s, tok))
        t0 = time.time()
        losses = train_loop(
            model, tok, corpus_batches(seed, s.batch, name), total, s.lr,
            completion_only=False, max_length=MAX_LENGTH, warmup=min(100, max(1, total // 10)),
            on_step=(lambda i, loss: progress(i, total, loss)) if progress else None,
            checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY,
        )
        seconds = time.time() - t0
    finally:
        torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    give_umask_modes(out)
    tail = losses[-50:] or [float("nan")]
    write_json(out / "build.json", {
        "name": name,
        "n_params": sum(p.numel() for p in model.parameters()),
        "recipe": recipe(name, seed, steps),
        "recipe_hash": recipe_hash(name, seed, steps),
        "build_seconds": round(seconds, 2),
        "threads": 1,
        "final_loss": sum(tail) / len(tail),
    })
    return out


BUILD_FILE_BYTES = 1 << 20  # a build.json is a few kilobytes; a larger one is not a lab build
BUILD_RATES = (1e-6, 0.1)  # the pretraining peaks a build.json may state (the ladder's: 8e-4 to 3e-3)


def build_of(folder) -> dict | None:
    """{"name", "lr"} of the lab build a model folder holds (`build.json` written by
    `build_student`: the ladder name and its pretraining peak rate), or None when it holds none
    or its build.json cannot be read (`read_build` says why)."""
    return read_build(folder)[0]


def read_build(folder) -> tuple[dict | None, str | None]:
    """(`build_of`'s answer, why a build.json there was not read: None when it was, or when there
    is none). The folder may be anything a user hands over, so a damaged, large, non-UTF-8 file,
    a NaN or a file of another shape is not read; InputError for a rate no pretraining runs at,
    which would set the probe's learning rate."""
    path = Path(folder) / "build.json"
    try:
        if not path.exists():
            return None, None
        if not path.is_file() or path.stat().st_size > BUILD_FILE_BYTES:
            return None, f"not a regular file of at most {BUILD_FILE_BYTES >> 20} MiB"
        student = strict_loads(path.read_bytes().decode("utf-8"))["recipe"]["student"]
        name, lr = student["name"], student["lr"]
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except (ValueError, RecursionError) as e:
        return None, f"not readable JSON: {str(e)[:80]}"
    except (KeyError, TypeError):
        return None, "it names no recipe.student.name and recipe.student.lr"
    except OSError as e:
        return None, e.strerror or type(e).__name__
    if not (isinstance(name, str) and number(lr)):
        return None, "recipe.student.name is not text or recipe.student.lr not a number"
    if not BUILD_RATES[0] <= lr <= BUILD_RATES[1]:
        raise InputError(f"{path}: recipe.student.lr {lr:g} is no pretraining rate (a lab build's lies from "
                         f"{BUILD_RATES[0]:g} to {BUILD_RATES[1]:g}) and would set the probe's: correct it, or remove "
                         "build.json to probe the folder as a real student")
    return {"name": name, "lr": float(lr)}, None


def n_params(name: str) -> int:
    """Parameter count from the spec alone (no weights needed)."""
    s = spec(name)
    v = len(tasks.ALPHABET) + 4
    per_layer = 4 * s.hidden * s.hidden + 3 * s.hidden * s.ffn + 2 * s.hidden
    return v * s.hidden + s.layers * per_layer + s.hidden


def list_students(seed: int = DEFAULT_SEED, teacher: bool = True) -> list[dict]:
    """Every ladder student (and the teachers): name, role, parameters, layers, hidden size, shape, built."""
    rows = []
    for name in [*LADDER, *(TEACHERS if teacher else [])]:
        d = student_dir(name, seed)
        built = (d / "build.json").exists()
        s = spec(name)
        row = {"name": name, "role": "teacher" if name in TEACHERS else "student", "n_params": n_params(name),
               "layers": s.layers, "hidden": s.hidden, "shape": shape(s), "built": built,
               "recipe_hash": recipe_hash(name, seed), "path": str(d)}
        if built:
            import json

            info = json.loads((d / "build.json").read_text())
            row["build_seconds"] = info.get("build_seconds")
            row["final_loss"] = info.get("final_loss")
        rows.append(row)
    return rows
