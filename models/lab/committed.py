"""Lab builds kept in the repository, so a fresh clone never pretrains what took hours.

`models/lab/weights/` holds two kinds of thing, both named by a model's folder name
(`NAME-RECIPEHASH`, the recipe hash `ladder.recipe_hash` computes):

- `NAME-HASH/`: a finished build (config, float32 `model.safetensors`, tokenizer, `build.json`).
  `ladder.student_path` copies it into `$ADVISOR_HOME/lab/` instead of pretraining. The small
  students the demo and the tests use (`xs`, `s`, `m`, `l`: 2 MB) are kept in `weights/shipped/`,
  which the wheel carries as package data; the rest are found only in a checkout (the wheel would
  weigh 60 MB with them), and an installed copy pretrains them on first use;
- `NAME-HASH.checkpoint.pt`: the latest pretraining checkpoint of a build that has not finished.
  `ladder.student_path` starts its build from it, so the build resumes where the last machine
  stopped (the checkpoint holds the step count and is refused for another step budget).

Both are matched by the recipe hash alone: a recipe change changes the name, so stale weights are
never used and the model is built instead. `advisor lab stash` copies builds (or their latest
checkpoints) from `$ADVISOR_HOME` into this folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from capacity_advisor.core.errors import InputError

WEIGHTS = Path(__file__).resolve().parent / "weights"
SHIPPED = "shipped"  # WEIGHTS/shipped: the kept builds the wheel carries (pyproject.toml's package data)
FOLDER_FILES = ("build.json", "config.json", "generation_config.json", "model.safetensors",
                "tokenizer.json", "tokenizer_config.json")


def kept_folders(folder_name: str, root: Path | None = None) -> list[Path]:
    """Where a kept build named `folder_name` would be: among the shipped ones, then the others."""
    root = root or WEIGHTS
    return [root / SHIPPED / folder_name, root / folder_name]


def committed_folder(folder_name: str, root: Path | None = None) -> Path | None:
    """The kept finished build named `folder_name`, or None (absent, or its build.json names another
    recipe); InputError when one of its files is a link (read before any of them is)."""
    return next(filter(None, (_kept_build(d) for d in kept_folders(folder_name, root))), None)


def _kept_build(d: Path) -> Path | None:
    """`d` if it is a whole kept build of the recipe its name says, else None."""
    for name in FOLDER_FILES:
        _own_file(d / name, _KEPT_FIX.format(d))
    try:
        info = json.loads((d / "build.json").read_text())
    except (OSError, ValueError):
        return None
    expected = d.name.rpartition("-")[2]
    if not isinstance(info, dict) or info.get("recipe_hash") != expected or not (d / "model.safetensors").is_file():
        return None
    return d


def committed_checkpoint(folder_name: str, root: Path | None = None) -> Path | None:
    f = (root or WEIGHTS) / f"{folder_name}.checkpoint.pt"
    return f if f.is_file() else None


def checkpoint_file(final: Path) -> Path:
    """The resume file of the build whose finished folder is `final` (beside it, hidden)."""
    return final.parent / f".{final.name}.partial" / "checkpoint.pt"


_KEPT_FIX = "put the file itself there, or delete {} to pretrain the model here"


def _own_file(path: Path, fix: str) -> None:
    """Refuse a file of a build that is a symbolic link or no regular file: copying it would copy
    whatever it points at (any file of the machine) into the cache or the repository."""
    if os.path.islink(path) or (os.path.lexists(path) and not path.is_file()):
        raise InputError(f"{path} is a symbolic link or not a regular file; a lab build holds its own files: {fix}")


def _copy_build(src: Path, dest: Path, replace: bool, fix: str) -> None:
    """The files of build folder `src` at `dest`, whole or not at all (a temporary folder, then a rename);
    an existing `dest` is replaced when `replace`, else kept (another process placed it first). A
    file of `src` that is a link is refused first (`fix`: what to do then)."""
    for name in FOLDER_FILES:
        _own_file(src / name, fix)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.copy-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name in FOLDER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        if replace:
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if replace or not (dest / "build.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def adopt(final: Path, root: Path | None = None) -> bool:
    """Copy the kept build of `final`'s name to `final`; False if none is kept."""
    src = committed_folder(final.name, root)
    if src is None:
        return False
    _copy_build(src, final, replace=False, fix=_KEPT_FIX.format(src))
    return True


def seed_checkpoint(final: Path, root: Path | None = None) -> bool:
    """Start the resume file of `final`'s build from the kept one, unless a local one exists (it is newer)."""
    checkpoint = checkpoint_file(final)
    src = committed_checkpoint(final.name, root)
    if src is None or checkpoint.is_file():
        return False
    _own_file(src, "put the file itself there, or delete it to pretrain the model from the start")
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint.with_name(f".{checkpoint.name}.seed-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, checkpoint)
    return True


def stash(final: Path, root: Path | None = None) -> str | None:
    """Keep `final` (a finished build) or else its latest resume file in the repository.

    Returns what was kept ("build" or "checkpoint") or None when there is neither. A kept build
    replaces its kept checkpoint and the kept build of its name (in `shipped/` when that one is);
    a checkpoint replaces the previous one (one file per model)."""
    root = root or WEIGHTS
    rebuild = f"delete {final} and build the model again with `advisor lab build`"
    if (final / "build.json").is_file():
        # a shipped build stays shipped; any other is kept beside the others
        shipped, other = kept_folders(final.name, root)
        _copy_build(final, shipped if shipped.is_dir() else other, replace=True, fix=rebuild)
        (root / f"{final.name}.checkpoint.pt").unlink(missing_ok=True)
        return "build"
    checkpoint = checkpoint_file(final)
    if checkpoint.is_file():
        _own_file(checkpoint, rebuild)
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{final.name}.checkpoint.pt.stash-{os.getpid()}"
        shutil.copyfile(checkpoint, tmp)
        os.replace(tmp, root / f"{final.name}.checkpoint.pt")
        return "checkpoint"
    return None


def kept_at(folder_name: str, kept: str) -> str:
    """Where `stash` kept a build ("build") or its checkpoint ("checkpoint"), under models/lab/."""
    where = (next(d for d in kept_folders(folder_name) if d.is_dir()) if kept == "build"
             else WEIGHTS / f"{folder_name}.checkpoint.pt")
    return str(where.relative_to(WEIGHTS.parent))
