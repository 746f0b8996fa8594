"""Load a student (local folder, hub id, or `lab:NAME`) and describe it.

    from capacity_advisor.models.loading import load_model
    lm = load_model("lab:tiny", device="cpu")
    lm.description["n_params"]

Model folders are data, never code: `trust_remote_code` is always off, so a config.json whose
`auto_map` points at Python files loads the stock transformers class for its `model_type`, or is
refused in one line when transformers has none. A hub id is fetched only if the hub answers within
HUB_PROBE_SECONDS; otherwise it loads from the local Hugging Face cache (as with HF_HUB_OFFLINE=1)
or fails at once, saying how to use a local folder, instead of retrying for a minute.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import cached_file_digest, file_digest, stable_hash
from capacity_advisor.core.numbers import number, whole
from capacity_advisor.models.gguf import check_gguf, gguf_folder, is_gguf_path as named
from capacity_advisor.models.lab.ladder import parse_name, recipe_hash, spec as lab_spec, student_path
from capacity_advisor.models.lab.pretrained import check_available, path as pretrained_path, pretrained_name
from capacity_advisor.models.template import check_chat_template, declared_chat_template

# transformers 5 reads `dtype=` when loading and a fractional `warmup_steps` as a share of all
# steps; under 4.x the latter would silently mean almost no warm-up. pyproject.toml says the same.
MIN_TRANSFORMERS = (5, 0)
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
HUB_PROBE_SECONDS = 2.0


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, the device it sits on, and a JSON-ready description."""

    model: Any
    tokenizer: Any
    device: Any
    spec: str
    path: str | None
    description: dict = field(default_factory=dict)


def check_transformers() -> None:
    """One clear error instead of silently different training under an older transformers."""
    from importlib.metadata import version

    found = version("transformers")
    parts = tuple(int(x) for x in found.split(".")[:2] if x.isdigit())
    if parts < MIN_TRANSFORMERS:
        need = ".".join(map(str, MIN_TRANSFORMERS))
        raise InputError(f"transformers {found} is installed; capacity-advisor needs {need} or newer "
                         f"(pip install 'transformers>={need}')")


def resolve_device(device: str = "auto"):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or auto")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InputError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, device) -> Any:
    import torch

    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def resolve_model_path(spec: str) -> str:
    """Map a model spec to something `from_pretrained` takes: a local folder or a hub id."""
    if (name := pretrained_name(spec)) is not None:
        return str(pretrained_path(name))  # converted from its GGUF file on first use
    if spec.startswith("lab:"):
        return str(student_path(spec[len("lab:"):]))
    if is_gguf_path(spec):
        return str(gguf_folder(spec))  # converted on first use
    return _local_or_hub(spec)


def check_model_spec(spec: str) -> None:
    """What resolve_model_path refuses, refused without building a lab student or using the network:
    for verbs that must reject a bad --model before they print or start anything. A pretrained lab
    student or a .gguf file is checked as far as it can be without converting it."""
    if (name := pretrained_name(spec)) is not None:
        check_available(name)
    elif is_gguf_path(spec):
        check_gguf(spec)
    elif spec.startswith("lab:"):
        lab_spec(parse_name(spec[len("lab:"):]).name)
    else:
        _local_or_hub(spec)


def check_loadable(spec: str, flag: str = "--model") -> None:
    """What loading a local model folder needs beyond its config (`describe_config` reads that
    alone), refused before a run writes anything: weight files and a tokenizer that loads. A lab
    student is built (a pretrained one or a .gguf file converted) when first loaded; a hub id is fetched then."""
    if spec.startswith("lab:") or is_gguf_path(spec):
        check_model_spec(spec)
        return
    path = _local_or_hub(spec)
    if not os.path.isdir(path):
        return
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in Path(path).iterdir()):
        suffixes = ", ".join("*" + s for s in _WEIGHT_SUFFIXES)
        raise InputError(f"{flag} {spec}: the folder holds no weights (no {suffixes} file): point it at a whole model "
                         "folder, with its weights and tokenizer")
    load_tokenizer(path, {"trust_remote_code": False})


def is_gguf_path(spec: str) -> bool:
    return named(spec)


def _local_or_hub(spec: str) -> str:
    expanded = os.path.expanduser(spec)
    if os.path.isdir(expanded):
        if not os.path.exists(os.path.join(expanded, "config.json")):
            raise InputError(f"model folder {spec} has no config.json: point --model at a Hugging Face model folder")
        return expanded
    if os.path.exists(expanded):
        raise InputError(f"model path {spec} is a file, not a model folder: point --model at the folder holding config.json")
    looks_like_path = spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or os.sep + os.sep in spec
    if looks_like_path:
        raise InputError(f"model path {spec} does not exist: check the path, or pass a hub id like org/name or lab:NAME")
    return spec  # a hub id; hub_options checks the hub can be reached


def hub_options(path: str) -> dict:
    """`from_pretrained` keywords for `path`: never run the folder's code; for a hub id with the
    hub out of reach, the local cache only (or one InputError when it is not there)."""
    opts = {"trust_remote_code": False}
    if os.path.isdir(path):
        return opts
    from huggingface_hub import constants, try_to_load_from_cache

    offline = constants.HF_HUB_OFFLINE or not hub_answers(constants.ENDPOINT)
    if not offline:
        return opts
    if not isinstance(try_to_load_from_cache(path, "config.json"), str):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"the hub at {constants.ENDPOINT} does not answer"
        raise InputError(f"model {path!r} is not in the local Hugging Face cache and {why}: download it where there is "
                         f"network (`hf download {path} --local-dir DIR`) and pass --model DIR")
    # Some lookups (transformers' adapter_config.json probe) ignore local_files_only and would retry
    # for a minute; offline mode, which huggingface_hub reads at each request, stops them at once.
    constants.HF_HUB_OFFLINE = True
    return {**opts, "local_files_only": True}


def hub_answers(endpoint: str) -> bool:
    """Whether the hub answers an HTTP request within HUB_PROBE_SECONDS (a thread bounds DNS too)."""
    import urllib.error
    import urllib.request

    answered = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_PROBE_SECONDS).close()
            answered.append(True)
        except urllib.error.HTTPError:  # an error status is still an answer
            answered.append(True)
        except (OSError, ValueError):  # refused, unresolved, timed out, or a malformed HF_ENDPOINT
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(HUB_PROBE_SECONDS + 0.5)
    return bool(answered)


def load_tokenizer(path: str, opts: dict | None = None):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, **(opts if opts is not None else hub_options(path)))
    except InputError:
        raise
    except Exception as e:  # a damaged tokenizer.json fails deep inside tokenizers with any type (KeyError, ...)
        raise InputError(f"could not load a tokenizer for {path!r}: {_why(e)}") from None
    if tok.pad_token_id is None:
        # Padding positions are masked out everywhere; any id works, EOS is the usual choice.
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.convert_ids_to_tokens(0)
    check_chat_template(tok)
    return tok


def load_model(spec: str, device: str = "auto", dtype: str = "auto", weights: bool = True) -> LoadedModel:
    """Load weights and tokenizer; errors a user can fix become one-line InputErrors.

    `weights=False` builds the model on the meta device from its config (no memory, no weight
    download): enough for the description and the tokenizer, for backends such as vllm that load
    the weights themselves. `device` is then only used to resolve `dtype`.
    """
    from transformers import AutoModelForCausalLM

    check_transformers()
    path = resolve_model_path(spec)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    opts = hub_options(path)
    tok = load_tokenizer(path, opts)
    where = "local folder" if os.path.isdir(path) else "hub id (no local folder of that name)"
    try:
        import torch
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, **opts)
        check_config_size(config, spec)
        if weights:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **opts)
        else:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, trust_remote_code=False)
    except InputError:
        raise
    except Exception as e:  # a bad safetensors header, a config or generation_config of wrong types: any type, deep inside
        raise InputError(f"could not load model {spec!r} as a {where}: {_why(e)}") from None
    check_generation_config(model, spec)
    if weights:
        model.to(dev)
    model.eval()
    local = path if os.path.isdir(path) else None
    return LoadedModel(model, tok, dev, spec, local, describe(model, tok, spec, local))


def describe(model, tokenizer, spec: str, path: str | None) -> dict:
    """Parameter count, family, size and a fingerprint that changes when the weights do.

    A lab student is named by `lab:NAME` and its recipe hash, never by its cache folder, so
    descriptions (and the records and manifests that carry them) hold no machine paths.
    """
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    out = {
        "spec": spec,
        "path": path,
        "architecture": (cfg.architectures or [type(model).__name__])[0],
        "model_type": cfg.model_type,
        "n_params": int(n_params),
        "n_layers": getattr(cfg, "num_hidden_layers", None),
        "hidden_size": getattr(cfg, "hidden_size", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else None,
        "fingerprint": fingerprint(path, model) if path else stable_hash({"spec": spec, "cfg": cfg.to_dict()}),
    }

    if pretrained_name(spec) is not None:
        out["path"] = None  # named `lab:NAME`, never by its cache folder
    elif spec.startswith("lab:"):
        name, steps, build = parse_name(spec[len("lab:"):])
        out["path"] = None
        out["recipe_hash"] = recipe_hash(name, build, steps)
    return out


MAX_PARAMS = 10 ** 13  # ten trillion: beyond any model that exists, and far beyond any one machine
MAX_LAYERS = 4096  # real models have at most a few hundred


def check_config_size(config, spec: str) -> None:
    """Refuse, from the config's numbers alone, a model too large to build: its parameters are
    counted as a decoder's (attention and MLP per layer, embeddings and head), before anything is built."""
    def count(name: str, default: int = 0) -> int:
        v = getattr(config, name, None)
        return v if whole(v, 0) else default

    h, layers, vocab = count("hidden_size"), count("num_hidden_layers"), count("vocab_size")
    inner = count("intermediate_size", 4 * h)
    n = layers * (4 * h * h + 3 * h * inner) + 2 * vocab * h
    if layers > MAX_LAYERS or n > MAX_PARAMS:
        raise InputError(f"model {spec!r}: its config asks for {layers:,} layers of width {h:,} (about {n:.2e} "
                         f"parameters), more than any model can be ({MAX_LAYERS:,} layers, {MAX_PARAMS:.0e} parameters); "
                         "check num_hidden_layers, hidden_size and intermediate_size in config.json")


def describe_config(spec: str) -> dict:
    """`describe()` from the model's config alone, built on the meta device: no weights are read
    and no tokenizer is needed (a folder holding only config.json is enough)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model_path(spec)
    try:
        config = AutoConfig.from_pretrained(path, **hub_options(path))
        check_config_size(config, spec)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except InputError:
        raise
    except Exception as e:  # a config of wrong types fails anywhere inside transformers
        raise InputError(f"could not read a model config for {spec!r}: {_why(e)}") from None
    local = path if os.path.isdir(path) else None
    desc = describe(model, None, spec, local)
    desc["chat_template"] = declared_chat_template(local) if local else None  # what a loaded tokenizer would say
    desc["dtype"] = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "unknown").replace("torch.", "")
    has_weights = local is not None and any(p.suffix in _WEIGHT_SUFFIXES for p in Path(local).iterdir())
    if local and not has_weights:
        desc["fingerprint"] = stable_hash({"config": config.to_dict()})
    return desc


def fingerprint(path: str, model=None) -> str:
    """Hash of config, tokenizer files and weight files, each by its whole content: a changed byte
    anywhere (a middle tensor included) is another model. Weight digests are remembered while a
    file keeps its identity (`files.cached_file_digest`), so multi-GB weights are read once."""
    parts: dict[str, str] = {}
    for p in sorted(Path(path).iterdir()):
        if not p.is_file() or p.name.startswith("."):
            continue
        if p.suffix in _WEIGHT_SUFFIXES:
            parts[p.name] = cached_file_digest(p)
        elif p.suffix in (".json", ".model", ".txt", ".jinja"):
            parts[p.name] = file_digest(p)
    return stable_hash(parts)


# generation_config.json fields generation reads, with the JSON types they must have (None: unset).
_GENERATION_TYPES = {
    **dict.fromkeys(("max_length", "max_new_tokens", "min_length", "min_new_tokens", "top_k", "num_beams",
                     "num_beam_groups", "num_return_sequences", "no_repeat_ngram_size",
                     "encoder_no_repeat_ngram_size"), "int"),
    **dict.fromkeys(("temperature", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
                     "repetition_penalty", "length_penalty", "diversity_penalty", "encoder_repetition_penalty"), "number"),
    **dict.fromkeys(("do_sample", "use_cache", "output_scores", "return_dict_in_generate"), "bool"),
    **dict.fromkeys(("pad_token_id", "bos_token_id", "decoder_start_token_id"), "int"),
    "eos_token_id": "ids",
}


def check_generation_config(model, spec: str) -> None:
    """One InputError when the folder's generation_config.json gives a field generation reads a
    value of the wrong type (`"max_length": "20"` would fail only at the first generation, as a
    TypeError deep inside transformers)."""
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    bad = []
    for name, kind in _GENERATION_TYPES.items():
        v = getattr(gen, name, None)
        if v is None:
            continue
        ok = {"int": whole(v), "number": number(v), "bool": isinstance(v, bool),
              "ids": whole(v) or (isinstance(v, list) and all(whole(x) for x in v))}[kind]
        if not ok:
            bad.append(f"{name} {_short(v)}")
    if bad:
        raise InputError(f"generation_config.json of {spec!r}: {', '.join(bad)} of the wrong type (want "
                         "numbers, true/false or token ids); fix or remove those fields")


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "…"


def _why(e: Exception) -> str:
    if "custom code" in str(e):  # transformers' refusal when trust_remote_code is off
        return ("its config.json or tokenizer_config.json asks to run Python code from the model folder (auto_map), "
                "which this tool never does; use a model whose architecture transformers ships")
    return _first_line(e)


def _first_line(e: Exception) -> str:
    if isinstance(e, KeyError):  # its message is the bare key
        return f"a field it needs is missing ({e})"
    text = str(e).strip().splitlines()
    if not text:
        return type(e).__name__
    return text[0] if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {text[0]}"

