"""Small file helpers every room needs: atomic writes, JSONL, fingerprints, the cache home.

Outputs are written to a temporary name beside the target and renamed into place, so a killed run
never leaves a half-written file under the final name, and the next write of that file removes
the temporaries killed writers left. A verb checks its outputs can be written
before it starts any work, so a bad `--out` costs nothing:

    check_writable_dir(out, "--out")        # a folder to create or write into
    check_writable_file(out, "--out")       # a file to create or replace
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import re
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from capacity_advisor.core.errors import InputError

FORMAT_VERSION = 2  # 2: score rows carry n_scored, rank_mean and first_tokens


def advisor_home() -> Path:
    """Cache root: `$ADVISOR_HOME`, else `~/.cache/capacity-advisor`."""
    home = os.environ.get("ADVISOR_HOME")
    path = Path(home).expanduser() if home else Path.home() / ".cache" / "capacity-advisor"
    link = _broken_link(path)
    if link is not None:
        raise InputError(f"ADVISOR_HOME {path}: {link} is a symbolic link to nothing (a missing target or a loop of "
                         "links); remove it or set ADVISOR_HOME to a folder")
    return path


def _broken_link(path: Path) -> Path | None:
    """The first of `path` and its ancestors that is a symbolic link leading nowhere (a missing
    target, a loop), or None: nothing can be created through it."""
    for p in (path, *path.parents):
        try:
            if os.path.islink(p) and not os.path.exists(p):
                return p
        except (OSError, ValueError):
            return p
    return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    The rename replaces whatever is at `path`, a symbolic link included, so a link planted there
    is never written through. The file gets the mode a plain `open()` would give it (0666 less
    the umask), or the mode of the regular file it replaces."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{_HOST}-{os.getpid()}-", suffix=".tmp", dir=target.parent)
    except OSError:
        check_writable_file(target, "output")  # says in one line which part of the path is in the way
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _mode_for(target))
        os.replace(tmp_path, target)
        _clear_dead_writers(target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


# Temporaries are named by machine and process, so a later write can tell which ones a killed
# writer left (no `finally` runs on SIGKILL); another machine's, on a shared disk, it cannot judge.
_HOST = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def _clear_dead_writers(target: Path) -> None:
    """Remove the temporaries of `target` left by writers on this machine that are no longer alive."""
    prefix = f".{target.name}.{_HOST}-"
    for p in target.parent.glob(glob.escape(prefix) + "*.tmp"):
        pid = p.name[len(prefix):].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                p.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def write_text(path: str | os.PathLike, text: str) -> None:
    """`text` written atomically as UTF-8 (see atomic_path)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def give_umask_modes(folder: str | os.PathLike) -> None:
    """Give every regular file under `folder` the mode a plain `open()` would (0666 less the
    umask): some libraries' writers (transformers' safetensors saving) make their files 0600
    whatever the umask, so a model the tool saves would be unreadable to the user's group."""
    mode = 0o666 & ~_umask()
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(p).st_mode):
                    os.chmod(p, mode)


def _mode_for(target: Path) -> int:
    try:
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where the system says it (Linux), else by setting it back at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def refuse_overwrite(inputs: Iterable, outputs: Iterable, what: str = "output") -> None:
    """Raise InputError when an output would replace an input, or be written inside an input folder,
    or two outputs are the same file.

    `inputs` and `outputs` are paths (None entries are skipped; a hub id that names no local path
    never matches). Paths are compared after following symbolic links, and existing files by
    identity as well, so a link or a hard link to an input counts as the input:

        refuse_overwrite([pool_path, scores_path], [out, config_path])
    """
    ins = [(str(i), _real(i)) for i in inputs if i is not None and str(i) != ""]
    seen: list[tuple[str, str]] = []
    for o in outputs:
        if o is None or str(o) == "":
            continue
        real_o = _real(o)
        # a write replaces a link at the output's name (atomic_path), so outputs are the same
        # file only when their names are: compare them with their folders' links followed
        named = os.path.join(_real(os.path.dirname(os.path.abspath(os.path.expanduser(str(o))))), os.path.basename(str(o)))
        for given, other in seen:
            if named == other:
                raise InputError(f"{what} {o} and {given} are the same file: one would replace the other; give each "
                                 "output its own path")
        seen.append((str(o), named))
        for given, real_i in ins:
            if real_o == real_i or _same_file(real_o, real_i):
                raise InputError(f"{what} {o} is the input {given}: writing it would destroy what it is made from; "
                                 "choose another output path")
            if os.path.isdir(real_i) and real_o.startswith(real_i.rstrip(os.sep) + os.sep):
                raise InputError(f"{what} {o} lies inside the input folder {given}: writing there would change an "
                                 "input; choose an output path outside it")


def _real(p) -> str:
    return os.path.realpath(os.path.expanduser(str(p)))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Raise InputError unless `path` is, or can be made, a folder this process can write into."""
    _utf8_path(path, flag)
    p = Path(os.path.expanduser(path))
    if _exists(p, flag) and not p.is_dir():
        raise InputError(f"{flag} {path} is a file, not a folder: give a folder path")
    _check_can_create_in(p, path, flag)
    return p


def check_writable_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Raise InputError unless a file can be written (created or replaced) at `path`."""
    _utf8_path(path, flag)
    p = Path(os.path.expanduser(path))
    if _exists(p, flag) and p.is_dir():
        raise InputError(f"{flag} {path} is a folder: give a file path")
    kind = special_kind(p) if _exists(p, flag) else None
    if kind is not None:  # a FIFO, a device or a socket: what is written there never lands in a file
        raise InputError(f"{flag} {path} is {kind}, not a regular file: give a file path")
    _check_can_create_in(p.parent, path, flag)
    return p


def _utf8_path(path, flag: str) -> None:
    """An output path is recorded in the JSON files written beside it, so it must be UTF-8 text."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    at = unpaired_surrogate(text)
    if at is not None:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise InputError(f"{flag} {shown}: character {at} of the path is a byte that is not UTF-8; "
                         "choose a path whose name is UTF-8 text")


def _exists(p: Path, flag: str) -> bool:
    try:
        return p.exists()
    except OSError as e:  # e.g. a name too long for the filesystem
        raise InputError(f"{flag} {p}: {e.strerror}") from None


def _check_can_create_in(folder: Path, given, flag: str) -> None:
    """Writes go through a temporary file beside the target (atomic_path), so probe with one."""
    anc = folder.absolute()
    while not _exists(anc, flag):
        if os.path.islink(anc):
            raise InputError(f"{flag} {given}: {anc} is a symbolic link to nothing (a missing target or a loop of "
                             "links); remove it or choose another path")
        anc = anc.parent
    if not anc.is_dir():
        raise InputError(f"{flag} {given}: {anc} is a file, so nothing can be written under it; choose another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".advisor-write-check-", dir=anc)
    except OSError as e:
        raise InputError(f"{flag} {given}: cannot write in {anc} ({e.strerror}); choose a writable path") from None
    os.close(fd)
    os.unlink(tmp)


def unpaired_surrogate(text: str) -> int | None:
    """Where `text` holds half a surrogate pair (JSON escapes can carry one; no tokenizer and no
    UTF-8 file takes it), or None when UTF-8 can hold all of it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """`obj` as indented JSON, atomically; NaN and infinities become null (`finite`), since strict
    JSON readers refuse them."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(finite(obj), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n",
                       encoding="utf-8")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """One JSON object per line, atomically; NaN and infinities become null, as in write_json."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(finite(row), ensure_ascii=False, allow_nan=False) + "\n")
            n += 1
    return n


def stable_hash(obj: Any, n: int = 16) -> str:
    """A short hex digest of a JSON-serialisable object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:n]


def stable_hash_of_list(items: Iterable, n: int = 16) -> str:
    """`stable_hash(list(items))`, the same digest, hashed an item at a time: a pool's fingerprint
    never holds the whole pool as one JSON text."""
    h = hashlib.sha256(b"[")
    for i, item in enumerate(items):
        if i:
            h.update(b", ")
        h.update(json.dumps(item, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
    h.update(b"]")
    return h.hexdigest()[:n]


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's whole content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_file_digest(path: str | os.PathLike) -> str:
    """`file_digest`, remembered under `$ADVISOR_HOME/digests/` for as long as the file keeps its
    identity: device, inode, size, modification and change times. Any write to the file moves its
    change time (which no user call can set back), so a changed byte anywhere is hashed afresh,
    while multi-GB weights are read once, not at every run."""
    p = Path(path)
    st = os.stat(p)
    ident = {"path": os.path.realpath(p), "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
             "mtime": st.st_mtime_ns, "ctime": st.st_ctime_ns}
    memo = advisor_home() / "digests" / stable_hash(ident, 32)
    try:
        known = memo.read_text(encoding="ascii").strip()
        if re.fullmatch(r"[0-9a-f]{64}", known):
            return known
    except (OSError, UnicodeDecodeError):
        pass
    digest = file_digest(p)
    try:
        with atomic_path(memo) as tmp:
            tmp.write_text(digest + "\n", encoding="ascii")
    except OSError:
        pass  # an unwritable cache home costs only the time to hash again
    return digest


def versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes our numbers, for config.json files."""
    out = {"capacity_advisor": _own_version(), "format": str(FORMAT_VERSION)}
    for name in ("torch", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # pragma: no cover - both are hard dependencies
            out[name] = "missing"
    return out


def _own_version() -> str:
    try:
        from importlib.metadata import version

        return version("capacity-advisor")
    except Exception:
        return "0+unknown"


def finite(obj):
    """`obj` with every NaN or infinity replaced by None: JSON has no NaN, and any reader must take our files."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_object(path: str | os.PathLike, fix: str) -> dict:
    """A JSON object a command of the tool wrote (a record, a probe report, a config.json), read back;
    one InputError naming the file and `fix` (what to do about it) where it is unreadable, not JSON
    or not an object."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"{path} is not readable JSON ({type(e).__name__}): {fix}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path} is not a JSON object: {fix}")
    return obj


def unclaimed_files(folder: str | os.PathLike) -> bool:
    """True where `folder` holds files but no config.json: no resumable command of the tool made it
    (a published calibration, a user's own files), so none may resume into it and replace them. The
    lock a killed command left (`folder_lock`) is no file of anyone's."""
    p = Path(folder)
    return not (p / "config.json").exists() and p.is_dir() and any(x.name != LOCK for x in p.iterdir())


def special_kind(path: str | os.PathLike) -> str | None:
    """What stands at `path` where a regular file (or nothing) is expected: "a folder", "a FIFO", "a
    device", "a socket" or "a link to nothing"; None for a regular file (through links) or nothing.
    Reading a FIFO waits for a writer and a device never ends, so a caller refuses these at once."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(path) else None
    except OSError as e:  # a loop of links, a name too long
        return f"unreadable ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISSOCK(st.st_mode):
        return "a socket"
    return "a device"


def refuse_special(folder: str | os.PathLike, names: Iterable[str], fix: str) -> None:
    """InputError where one of the files `names` a command keeps in `folder` is anything but a regular
    file (`special_kind`); `fix` says what to do (e.g. pass a new --out)."""
    for name in names:
        path = Path(folder) / name
        kind = special_kind(path)
        if kind is not None:
            raise InputError(f"{path} is {kind}, where the command keeps a file: {fix}")


# ---- one writer per folder ----------------------------------------------------------------------

LOCK = ".advisor.lock"  # in a folder a command writes: the process writing there, while it runs
_HELD: dict[str, list] = {}  # folders this process holds: [file descriptor, depth]


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, flag: str = "--out") -> Iterator[Path]:
    """Hold `folder` (created if need be) for this process while the block runs: a second command
    writing there is one InputError naming the process that holds it. The lock is the kernel's
    (flock on FOLDER/.advisor.lock, which holds the PID for the message), so a process that dies,
    even of SIGKILL, holds nothing: a rerun after a kill takes the folder at once, whatever file the
    killed one left. Taken again inside the block by this process, it is the same hold. Folders it
    made are removed again when the block leaves them empty (a command refused inside it leaves
    nothing behind)."""
    import fcntl

    folder = Path(os.path.expanduser(folder))
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield folder
        finally:
            _HELD[key][1] -= 1
        return
    check_writable_dir(folder, flag)
    made = [p for p in (folder.absolute(), *folder.absolute().parents) if not os.path.lexists(p)]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    while True:
        kind = special_kind(path)
        if kind is not None:
            raise InputError(f"{path} is {kind}, where the tool keeps its lock: remove it, or pass another {flag}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as e:  # a link planted there is not followed
            raise InputError(f"{path} cannot be opened as the tool's lock ({e.strerror}): remove it, or pass another "
                             f"{flag}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise InputError(f"{flag} {folder} is in use by {holder} (another command writing there): let it "
                             f"finish, or stop it, or pass another {flag}") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # the file was removed by the holder that just let go: take the one there now
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = [fd, 1]
    try:
        yield folder
    finally:
        _HELD.pop(key, None)
        with contextlib.suppress(OSError):
            os.unlink(path)  # still held, so no other process can have taken this file
        os.close(fd)
        for p in made:  # deepest first; one that holds anything stays, and so do those above it
            try:
                os.rmdir(p)
            except OSError:
                break


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"


def recorded_key(folder: str | os.PathLike, field: str) -> str | None:
    """The key `folder/config.json` records under `field` (what produced the folder), or None when
    there is no such file or it cannot be read: resumable folders compare it with their own. A
    config.json that is no regular file (a FIFO would never end the read) is an InputError."""
    path = Path(folder) / "config.json"
    refuse_special(folder, ["config.json"], "remove it, or pass a new --out")
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(field)
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError, RecursionError):
        return "unreadable"
    return value if isinstance(value, str) else "unreadable"
