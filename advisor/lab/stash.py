"""`advisor lab stash --sources` / `advisor lab restore`: what a source of the sweep has finished,
carried in the repository to the machine that goes on with it.

    advisor lab stash --sources NAME --stash-dir calibration/in-progress      # while it runs
    advisor lab restore --sources NAME --stash-dir calibration/in-progress    # on the next machine
    advisor lab sweep --sources NAME --restore calibration/in-progress        # the same, then run on

A stash is DIR/NAME.tar.gz (replaced each time; under a megabyte): the source's config.json, its
teacher pools and every finished unit's records, evaluations and probe report, nothing else (no
checkpoints, datasets or score caches, and no pool summary's cache folder, which names the
machine). The source folder's own path, which its config, records and probe reports name, is written
as SOURCE_MARK, so the archive holds no machine's path; restoring unpacks it into WORK/NAME when
WORK/NAME does not exist yet, that folder's path put back, so the sweep skips the finished units.
It is whole or not at all: every member is checked from its header (a plain file whose normalised
path lies inside NAME/, of at most MEMBER_BYTES, STASH_BYTES in all, at most MAX_MEMBERS of them,
the whole archive read through once first to bound what it unpacks to) and the archive is unpacked
into a temporary folder renamed into place, so an archive refused or damaged part way leaves nothing
a later run would take for a restored source.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import posixpath
import shutil
import tarfile
import zlib
from pathlib import Path

from capacity_advisor.advisor.calibration.grid import CalibrateConfig, cells, run_names
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import check_writable_dir, special_kind

# A stash is under a megabyte packed, its largest file (a pool) a megabyte or two unpacked; far
# larger members are a damaged or hostile archive, refused before their bytes are read.
MEMBER_BYTES = 64 << 20
STASH_BYTES = 256 << 20
# The archive unpacked, headers included, is read through once in small pieces before tarfile sees
# it: tarfile reads a long-name (GNU or pax) header whole into memory, before any member's size can be
# checked, so only this bound keeps a small hostile archive from taking gigabytes. And a stash holds
# a few files per finished unit, so more members than this is not one.
ARCHIVE_BYTES = STASH_BYTES + (16 << 20)
MAX_MEMBERS = 20_000


def stash_files(work: Path, cfg: CalibrateConfig, name: str) -> tuple[list[Path], int]:
    """(the files a stash of source `name` holds, how many units are finished)."""
    src = work / name
    files = [src / "config.json"] + sorted(p for t in cfg.tasks for p in (src / t / "pools").glob("*") if p.is_file())
    done = 0
    for c in cells(cfg):
        folder = c.folder(src)
        runs = run_names(cfg, c)
        if all((folder / r / "record.json").is_file() and (folder / r / "eval.jsonl").is_file() for r in runs) \
                and (folder / "probe" / "probe.json").is_file():
            files += [folder / r / f for r in runs for f in ("record.json", "eval.jsonl")] + [folder / "probe" / "probe.json"]
            done += 1
    return files, done


# What stands for a sweep source's folder (WORK/NAME) in a stashed file: put back on restore.
SOURCE_MARK = "<sweep source folder>"


def stash(work: Path, cfg: CalibrateConfig, name: str, dest: Path) -> dict:
    """DEST/NAME.tar.gz from WORK/NAME, the source `cfg` describes (see the module doc); what was kept."""
    files, done = stash_files(work, cfg, name)
    here = str((work / name).resolve()).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for f in files:
            data = f.read_bytes()
            if f.name.endswith(".config.json"):  # a pool's summary names this machine's cache folder
                summary = json.loads(data)
                for part in (summary, summary.get("summary") or {}):
                    part.pop("cache", None)
                data = (json.dumps(summary, indent=2) + "\n").encode()
            data = data.replace(here, SOURCE_MARK.encode())
            info = tarfile.TarInfo(str(f.relative_to(work)))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{name}.tar.gz.tmp"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(dest / f"{name}.tar.gz")
    return {"source": name, "units_done": done, "units": len(cells(cfg)), "bytes": len(buf.getvalue())}


def restore(stashed: Path, work: Path, name: str) -> bool:
    """Unpack STASHED/NAME.tar.gz into WORK when WORK/NAME does not exist; True if it did (see the
    module doc: whole or not at all), the folder's own path put back where the stash marks it."""
    return unpack(Path(stashed) / f"{name}.tar.gz", Path(work), name, "the source again (`advisor lab stash`)",
                  "to start the source over", put_back(SOURCE_MARK, Path(work) / name))


def put_back(mark: str, folder: Path):
    """The `fix` of `unpack` that writes FOLDER's path where a stashed file holds MARK."""
    here = str(folder.resolve()).encode()

    def fix(unpacked: Path) -> None:
        for f in unpacked.rglob("*"):
            if f.is_file() and mark.encode() in (data := f.read_bytes()):
                f.write_bytes(data.replace(mark.encode(), here))

    return fix


def unpack(archive: Path, work: Path, name: str, again: str, over: str, fix=None) -> bool:
    """ARCHIVE's members (each checked: `stashed_members`) unpacked into a temporary folder that
    becomes WORK/NAME, when that folder does not exist and the archive does; True if it did.
    `fix(folder)` may rewrite the unpacked files before the rename. `again` / `over` finish the
    error lines: what to stash again, and what deleting the archive does."""
    if (work / name).exists() or not os.path.lexists(archive):
        return False
    kind = special_kind(archive)
    if kind is not None:  # a folder would restore nothing, a FIFO wait for a writer, a device never end
        raise InputError(f"{archive} is {kind}, not a stash archive: delete it, or stash {again}")
    check_writable_dir(work, "the folder to restore into").mkdir(parents=True, exist_ok=True)
    tmp = work / f".{name}.restore-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        check_unpacked_size(archive)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, members=stashed_members(tar, archive, name), filter="data")
        if fix:
            fix(tmp / name)
        os.rename(tmp / name, work / name)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(f"{archive} cannot be unpacked ({type(e).__name__}: {str(e)[:120]}): it is damaged; stash "
                         f"{again}, or delete the archive {over}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def check_unpacked_size(archive: Path) -> None:
    """InputError where the archive unpacks to more than ARCHIVE_BYTES, found by reading it through a
    megabyte at a time (no more is held)."""
    total = 0
    with gzip.open(archive, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > ARCHIVE_BYTES:
                raise InputError(f"{archive} unpacks to more than {ARCHIVE_BYTES >> 20} MiB, far more than a stash "
                                 "is: it is damaged or not a stash; delete it to start the source over")


def stashed_members(tar, archive: Path, name: str) -> list:
    """The members of a stash of source `name`, each checked as its header is read: a plain file
    whose normalised path lies inside NAME/, of at most MEMBER_BYTES (STASH_BYTES in all)."""
    members, total = [], 0
    for m in tar:
        path = posixpath.normpath(m.name)
        if not m.isfile() or path.split("/")[0] != name or path == name:
            kind = ("a file" if m.isfile() else "a link" if m.issym() or m.islnk() else "a pipe" if m.isfifo()
                    else "a device" if m.isdev()
                    else "a folder" if m.isdir() else "an entry")
            raise InputError(f"{archive} holds {kind} {m.name[:120]!r}, not a file inside {name}/: a stash holds only "
                             "the source's plain files; delete it to start the source over")
        total += m.size
        if m.size > MEMBER_BYTES or total > STASH_BYTES:
            raise InputError(f"{archive}: member {m.name[:120]!r} of {m.size:,} bytes makes it larger than a stash is "
                             f"({MEMBER_BYTES >> 20} MiB a file, {STASH_BYTES >> 20} MiB in all); delete it to start "
                             "the source over")
        members.append(m.replace(name=path, deep=False))
        if len(members) > MAX_MEMBERS:
            raise InputError(f"{archive} holds more than {MAX_MEMBERS:,} files, far more than a stash of one source: "
                             "it is damaged or not a stash; delete it to start the source over")
    if not members:
        raise InputError(f"{archive} holds no files of source {name}: delete it to start the source over")
    return members


def restore_sources(stashed: Path, work: Path, names: list[str]) -> list[str]:
    """Restore each source of `names` that has a stash in STASHED and no folder in WORK yet; the
    names restored. STASHED must be a folder (a mistyped one would restore nothing, silently)."""
    if not Path(stashed).is_dir():
        raise InputError(f"{stashed} is not a folder of stashes (NAME.tar.gz): name the folder `advisor lab stash` wrote")
    check_writable_dir(work, "--work")  # where the sources are unpacked: refused before any is
    return [name for name in names if restore(Path(stashed), Path(work), name)]


# ---- a calibration on a pool of one's own (`advisor calibrate --out FOLDER`) ----------------------

# What stands for the folder's own path in a stashed file (its config, manifests and records name
# it): the repository keeps no machine's path, and restoring puts the new folder's path back.
FOLDER_MARK = "<calibration folder>"
LEFT_OUT = (".png",)  # plots are redrawn; checkpoints, locks and temporaries are never kept


def calibration_files(folder: Path) -> tuple[list[Path], int]:
    """(the files a stash of an `advisor calibrate` folder holds, how many full runs are finished):
    its config.json and held-out problems; per unit its scores, selected sets, probe (report, each
    probe run's config, evaluations and record) and each finished run (record, evaluations,
    config and manifest). No checkpoint, plot, lock or unfinished run: a restored folder resumes
    with every finished run kept and an unfinished one started again."""
    def kept(p: Path, under: Path) -> bool:
        parts = p.relative_to(under).parts
        return p.is_file() and not p.name.startswith(".") and p.suffix not in LEFT_OUT \
            and not any(x.startswith("checkpoint-") or x.startswith(".") for x in parts)

    files = [p for p in (folder / "config.json", folder / "eval.jsonl") if p.is_file()]
    done = 0
    units = sorted(p for p in (folder / "units").iterdir() if p.is_dir()) if (folder / "units").is_dir() else []
    for unit in units:
        for stage in ("score", "data"):
            files += sorted(p for p in (unit / stage).rglob("*") if kept(p, unit))
        if (unit / "probe" / "probe.json").is_file():
            files += sorted(p for p in (unit / "probe").rglob("*") if kept(p, unit))
        for run in sorted(p for p in unit.iterdir() if p.is_dir() and p.name not in ("score", "data", "probe")):
            if (run / "record.json").is_file():
                files += sorted(p for p in run.iterdir() if kept(p, unit))
                files += [p for p in (unit / f"{run.name}.manifest.json",) if p.is_file()]
                done += 1
    return files, done


def stash_calibration(folder: Path, dest: Path) -> dict:
    """DEST/NAME.tar.gz (NAME: the folder's name) from an `advisor calibrate` folder (see
    `calibration_files`), its own path written as FOLDER_MARK; what was kept."""
    folder = Path(folder)
    if not (folder / "config.json").is_file() or json.loads((folder / "config.json").read_text()).get("stage") \
            != "calibrate-pool":
        raise InputError(f"{folder} is not an `advisor calibrate` folder (its config.json says how it ran): name the "
                         "folder `advisor calibrate --out` wrote")
    files, done = calibration_files(folder)
    here = str(folder.resolve()).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for f in files:
            data = f.read_bytes().replace(here, FOLDER_MARK.encode())
            info = tarfile.TarInfo(f"{folder.name}/{f.relative_to(folder).as_posix()}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    check_writable_dir(dest, "the stash folder").mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{folder.name}.tar.gz.tmp"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(dest / f"{folder.name}.tar.gz")
    return {"folder": folder.name, "runs_done": done, "files": len(files), "bytes": len(buf.getvalue())}


def restore_calibration(stashed: Path, work: Path, name: str) -> bool:
    """Unpack STASHED/NAME.tar.gz into WORK/NAME when that folder does not exist, the folder's own
    path put back where the stash marks it; True if it did. Whole or not at all, every member
    checked as `restore` checks a sweep's stash."""
    return unpack(Path(stashed) / f"{name}.tar.gz", Path(work), name, "the folder again", "to start over",
                  put_back(FOLDER_MARK, Path(work) / name))
