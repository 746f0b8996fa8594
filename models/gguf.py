"""A GGUF file as an ordinary Hugging Face model folder, converted once and cached.

    from capacity_advisor.models.gguf import gguf_folder
    folder = gguf_folder("SmolLM2-135M-Instruct.Q4_1.gguf")   # $ADVISOR_HOME/gguf/<name>-<digest>/

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=NAME)`, with the `gguf`
package installed) by dequantizing its tensors to float32; the model it returns still carries the
GGUF quantization flag, which `save_pretrained` refuses. So the weights are copied into a plain
model of the same config (the flag dropped) and saved as safetensors, beside the tokenizer with
its chat template: every verb then loads the folder as it loads any other. The conversion is
written to a temporary folder and renamed into place, so an interrupted one leaves nothing that
looks finished. A file that is not GGUF, or that transformers cannot read, is one InputError.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from capacity_advisor.core.errors import InputError

MAGIC = b"GGUF"
SOURCE_FILE = "source.json"  # what a converted folder was made from (the GGUF file's name and SHA-256)
GGUF_PACKAGE = "gguf>=0.19"


def is_gguf_path(spec: str) -> bool:
    """Whether `spec` names a GGUF file (by its suffix; the content is checked on use)."""
    return spec.lower().endswith(".gguf") and os.path.isfile(os.path.expanduser(spec))


def check_gguf(path: str | os.PathLike, flag: str = "--model") -> Path:
    """The GGUF file at `path`, checked without converting: a regular file that starts with the GGUF
    magic, and the `gguf` package that transformers reads it with installed."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise InputError(f"{flag} {path}: not a regular file; point it at a .gguf model file")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot be read ({e.strerror or e})") from None
    if head != MAGIC:
        raise InputError(f"{flag} {path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    check_reader()
    return p


def check_reader() -> None:
    """One InputError, saying what to install, when the `gguf` package is missing."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise InputError(f"reading a .gguf model needs the gguf package: pip install '{GGUF_PACKAGE}' "
                         "(or pip install 'capacity-advisor[gguf]')")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_folder(path: str | os.PathLike, say: Callable[[str], None] | None = None) -> Path:
    """The converted folder of the GGUF file at `path` under $ADVISOR_HOME/gguf (converted on
    first use, keyed by the file's content)."""
    from capacity_advisor.core.files import advisor_home

    p = check_gguf(path)
    digest = sha256(p)
    dest = advisor_home() / "gguf" / f"{p.stem}-{digest[:12]}"
    if not is_converted(dest):
        convert(p, dest, digest, say)
    return dest


def is_converted(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def convert(src: Path, dest: Path, digest: str | None = None, say: Callable[[str], None] | None = None) -> Path:
    """Write `dest`, a plain model folder (safetensors, config, tokenizer and chat template), from
    the GGUF file `src`; `digest` is its SHA-256 when already known."""
    check_reader()
    digest = digest or sha256(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    if say:
        say(f"converting {src.name} to a model folder (once; dequantized to float32)")
    try:
        model, tokenizer = _read(src)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": src.name, "sha256": digest}, indent=1) + "\n")
        if dest.is_dir() and not dest.is_symlink() and not is_converted(dest):
            shutil.rmtree(dest)  # an unfinished folder (no source.json): replaced, not renamed onto (ENOTEMPTY)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_converted(dest):  # lost a race to another process's finished conversion: use theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _read(src: Path):
    """(a plain float32 model, its tokenizer) from the GGUF file, every failure one InputError."""
    import logging

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    # transformers reads a tokenizer.json, tokenizer_config.json or generation_config.json it finds
    # beside the file in preference to the GGUF's own: the file is read from a folder of its own.
    alone = Path(tempfile.mkdtemp(prefix="advisor-gguf-"))
    opts = {"gguf_file": src.name, "trust_remote_code": False}

    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    transformers_logging.disable_progress_bar()  # its dequantizing bar would stand among our lines
    try:
        try:
            os.symlink(src.resolve(), alone / src.name)
        except OSError:
            shutil.copyfile(src, alone / src.name)
        tokenizer = AutoTokenizer.from_pretrained(str(alone), **opts)
        read = AutoModelForCausalLM.from_pretrained(str(alone), dtype=torch.float32, **opts)
        settings = {k: v for k, v in read.config.to_dict().items() if k != "quantization_config"}
        config = AutoConfig.for_model(**{k: v for k, v in settings.items() if k != "model_type"},
                                      model_type=settings["model_type"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
        model.load_state_dict(read.state_dict(), strict=True)
        model.generation_config = read.generation_config
        tokenizer = _within_vocabulary(tokenizer, config.vocab_size)
    except InputError:
        raise
    except Exception as e:  # a damaged or unsupported file fails anywhere inside gguf or transformers
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise InputError(f"{src} could not be read as a GGUF model ({type(e).__name__}: {text}); transformers "
                         "reads the GGUF architectures it lists (llama, qwen2, mistral, ...)") from None
    finally:
        quiet.setLevel(level)
        transformers_logging.enable_progress_bar()
        shutil.rmtree(alone, ignore_errors=True)
    return model.eval(), tokenizer


def _within_vocabulary(tokenizer, vocab_size: int):
    """`tokenizer` without the added tokens whose ids lie past the model's `vocab_size`: transformers'
    GPT-2 tokenizer adds its default `<|endoftext|>` to a byte-level GGUF vocabulary that lacks it
    (Llama 3's, say), an id the embedding does not have, which a text holding it would index."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not vocab_size:
        return tokenizer
    state = json.loads(backend.to_str())
    kept = [t for t in state.get("added_tokens", []) if t["id"] < vocab_size]
    if len(kept) != len(state.get("added_tokens", [])):
        tokenizer._tokenizer = Tokenizer.from_str(json.dumps({**state, "added_tokens": kept}))
    return tokenizer
