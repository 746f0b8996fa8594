"""The lab's pool-source sweep: one `advisor calibrate` per pool source, published as each lands.

    .venv/bin/python -m benchmarks.sweep_sources --work runs/sources --publish calibration/lab2 --jobs 2
    .venv/bin/python -m benchmarks.sweep_sources --list          # the sources, in the order they run

A pool source is a task family and the teacher that wrote its candidates: the scripted teacher
(`program`: correct responses by procedures drawn uniformly) or a lab teacher model sampled at a
temperature. Each source runs the ten ladder students on two seeds, summed ranking, 5 epochs of
D_high / D_low / D_mixed (the settings below), into WORK/NAME; when a source is complete it is
published into PUBLISH/NAME by `publish_calibration.publish` (records, per-run evaluations, probe
curves; no checkpoints or machine paths). Everything resumes: rerun the same command after a stop
and finished units, runs and sources are skipped. `--only NAME,...` runs some sources.

A source takes hours, and a later start may be on a fresh machine, so what a source in progress
has finished can travel in the repository:

    .venv/bin/python -m benchmarks.sweep_sources --stash calibration/in-progress --only NAME   # while it runs
    .venv/bin/python -m benchmarks.sweep_sources --work runs/sources --restore calibration/in-progress ...

`--stash DIR` writes DIR/NAME.tar.gz (replaced each time; under a megabyte): the source's teacher
pools and every finished unit's records, evaluations and probe report, nothing else (no
checkpoints, datasets or score caches). `--restore DIR` unpacks it into WORK/NAME before a source
starts, when WORK/NAME does not exist yet, so its finished units are skipped; an archive holding
anything but plain files inside NAME/, a member over MEMBER_BYTES, or damage is refused whole.

Two more entries (`...-builds`) are not new pool sources: they rerun the students `m`, `l`, `xl`
and `xxl` pretrained from two other seeds (`lab:NAME+b1`, `+b2`) on the pools of a source already
swept (the same pool draws: copied from WORK/<that source>/ when there, else sampled again, which
gives the same pools), so that the spread of a student's pattern over its pretraining builds is
measured beside the spread over seeds. Their students are pretrained `--jobs` at a time first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path


from capacity_advisor.advisor.lab.calibrate import run_calibration
from capacity_advisor.advisor.lab.units import CalibrateConfig
from capacity_advisor.models.errors import InputError

COMMON = CalibrateConfig(seeds=(0, 1), mean_seeds=(), epochs=5, n_train=2000, n_eval=200, candidates=8)

# In run order: the scripted sources need no teacher model, so they run while the teachers build.
# Every task family has two sources, every teacher two, every temperature two.
SOURCES: dict[str, dict] = {
    "modchain-program": dict(tasks=("modchain",), teacher="program", budget_runs=(1.0, 2.0)),
    "listmax-program": dict(tasks=("listmax",), teacher="program"),
    "modchain-teacher-xl-t1": dict(tasks=("modchain",), teacher="lab:teacher-xl", temperature=1.0, budget_runs=(1.0, 2.0)),
    "addition-teacher-t1": dict(tasks=("addition",), teacher="lab:teacher", temperature=1.0),
    "listmax-teacher-t0.7": dict(tasks=("listmax",), teacher="lab:teacher", temperature=0.7),
    "addition-teacher-xl-t0.7": dict(tasks=("addition",), teacher="lab:teacher-xl", temperature=0.7),
    "modchain-teacher-t1": dict(tasks=("modchain",), teacher="lab:teacher", temperature=1.0),
    "listmax-teacher-xl-t1": dict(tasks=("listmax",), teacher="lab:teacher-xl", temperature=1.0),
}
BUILD_SIZES = ("m", "l", "xl", "xxl")
# Other pretraining builds of four balanced students, on the pools of a scripted and a neural source.
SOURCES.update({
    f"{name}-builds": {**{k: v for k, v in SOURCES[name].items() if k != "budget_runs"}, "sizes": BUILD_SIZES,
                       "builds": (1, 2), "pools_from": name}
    for name in ("modchain-program", "modchain-teacher-xl-t1")
})


def config(name: str, work: Path, jobs: int) -> CalibrateConfig:
    return replace(COMMON, out=str(work / name), jobs=jobs, **{k: v for k, v in SOURCES[name].items() if k != "pools_from"})


def copy_pools(name: str, work: Path, log) -> None:
    """Copy the pools of the source a `-builds` entry reruns, when that source's folder has them
    and this one has none yet (sampling them again would give the same pools, only slower)."""
    import shutil

    src = SOURCES[name].get("pools_from")
    if not src:
        return
    for task in SOURCES[name]["tasks"]:
        have, want = work / src / task / "pools", work / name / task / "pools"
        if have.is_dir() and not want.exists():
            shutil.copytree(have, want)
            log(f"{name}: copied the pools of {src}/{task}")


def wait_for_build(model: str, log) -> None:
    """If another process is pretraining `model` (its temporary folder names a live process),
    wait for it instead of building it twice."""
    from capacity_advisor.models.lab.ladder import folder_of

    final = folder_of(model)
    said = False
    while not (final / "build.json").exists():
        live = []
        for tmp in final.parent.glob(f".{final.name}.tmp-*"):
            pid = tmp.name.rpartition("-")[2]
            try:
                os.kill(int(pid), 0)
                live.append(pid)
            except (ValueError, ProcessLookupError, PermissionError):
                continue
        if not live:
            return
        if not said:
            log(f"waiting for {model}, being built by process {live[0]}")
            said = True
        time.sleep(30)


def stash(work: Path, name: str, dest: Path) -> dict:
    """DEST/NAME.tar.gz: the source's pools and its finished units (see the module doc)."""
    import gzip
    import io
    import tarfile

    src = work / name
    cfg = config(name, work, 1)
    from capacity_advisor.advisor.lab.units import run_names, units

    files = [src / "config.json"] + sorted(p for t in cfg.tasks for p in (src / t / "pools").glob("*") if p.is_file())
    done = 0
    for u in units(cfg):
        folder = u.folder(src)
        runs = run_names(cfg, u)
        if all((folder / r / "record.json").is_file() and (folder / r / "eval.jsonl").is_file() for r in runs) \
                and (folder / "probe" / "probe.json").is_file():
            files += [folder / r / f for r in runs for f in ("record.json", "eval.jsonl")] + [folder / "probe" / "probe.json"]
            done += 1
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for f in files:
            data = f.read_bytes()
            if f.name.endswith(".config.json"):  # a pool's summary names this machine's cache folder
                summary = json.loads(data)
                for part in (summary, summary.get("summary") or {}):
                    part.pop("cache", None)
                data = (json.dumps(summary, indent=2) + "\n").encode()
            info = tarfile.TarInfo(str(f.relative_to(work)))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{name}.tar.gz.tmp"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(dest / f"{name}.tar.gz")
    return {"source": name, "units_done": done, "units": len(units(cfg)), "bytes": len(buf.getvalue())}


# A stash is under a megabyte packed, its largest file (a pool) a megabyte or two unpacked; far
# larger members are a damaged or hostile archive, refused before their bytes are read.
MEMBER_BYTES = 64 << 20
STASH_BYTES = 256 << 20


def restore(stashed: Path, work: Path, name: str) -> bool:
    """Unpack DIR/NAME.tar.gz into WORK when WORK/NAME does not exist; True if it did. Whole or not
    at all: it is unpacked into a temporary folder renamed into place, so an archive refused or
    damaged part way leaves nothing that a later run would take for a restored source."""
    import gzip
    import shutil
    import tarfile
    import zlib

    archive = stashed / f"{name}.tar.gz"
    if (work / name).exists() or not archive.is_file():
        return False
    tmp = work / f".{name}.restore-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = stashed_members(tar, archive, name)
            tar.extractall(tmp, members=members, filter="data")
        os.rename(tmp / name, work / name)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(f"{archive} cannot be unpacked ({type(e).__name__}: {str(e)[:120]}): it is damaged; stash the "
                         "source again, or delete the archive to start the source over") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def stashed_members(tar, archive: Path, name: str) -> list:
    """The members of a stash of source `name`, each checked as its header is read: a plain file
    whose normalised path lies inside NAME/, of at most MEMBER_BYTES (STASH_BYTES in all)."""
    import posixpath

    members, total = [], 0
    for m in tar:
        path = posixpath.normpath(m.name)
        if not m.isfile() or path.split("/")[0] != name or path == name:
            kind = ("a file" if m.isfile() else "a link" if m.issym() or m.islnk() else "a device" if m.isdev()
                    else "a folder" if m.isdir() else "an entry")
            raise InputError(f"{archive} holds {kind} {m.name[:120]!r}, not a file inside {name}/: a stash holds only "
                             "the source's plain files; delete it to start the source over")
        total += m.size
        if m.size > MEMBER_BYTES or total > STASH_BYTES:
            raise InputError(f"{archive}: member {m.name[:120]!r} of {m.size:,} bytes makes it larger than a stash is "
                             f"({MEMBER_BYTES >> 20} MiB a file, {STASH_BYTES >> 20} MiB in all); delete it to start "
                             "the source over")
        members.append(m.replace(name=path, deep=False))
    if not members:
        raise InputError(f"{archive} holds no files of source {name}: delete it to start the source over")
    return members


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/sources"))
    ap.add_argument("--publish", type=Path, default=None, help="publish each finished source into PUBLISH/NAME")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated source names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--stash", type=Path, default=None, help="write DIR/NAME.tar.gz for each --only source and exit")
    ap.add_argument("--restore", type=Path, default=None, help="unpack DIR/NAME.tar.gz into WORK before a source starts")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    names = [n for n in args.only.split(",") if n] or list(SOURCES)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        print(f"error: unknown source {', '.join(unknown)}: use {', '.join(SOURCES)}", file=sys.stderr)
        return 2
    if args.list:
        for n in names:
            print(json.dumps({"name": n, **{k: v for k, v in asdict(config(n, args.work, args.jobs)).items()
                                           if k in ("tasks", "teacher", "temperature", "seeds", "budget_runs", "sizes", "builds")}}))
        return 0
    if args.stash:
        for n in names:
            if (args.work / n / "config.json").is_file():
                print(json.dumps(stash(args.work, n, args.stash)))
        return 0
    from benchmarks.publish_calibration import publish

    for name in names:
        cfg = config(name, args.work, args.jobs)
        try:
            if args.restore and restore(args.restore, args.work, name):
                log(f"{name}: restored the finished units stashed in {args.restore}")
            cfg.validate()
            copy_pools(name, args.work, log)
            for model in cfg.models:
                wait_for_build(model, log)
            log(f"{name}: start")
            result = run_calibration(cfg, log=lambda m, n=name: log(f"{n}: {m}"))
            log(f"{name}: {result['records']} records [{result['seconds']}s]")
            if args.publish:
                log(f"{name}: published {publish(Path(cfg.out), args.publish / name)}")
        except InputError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
