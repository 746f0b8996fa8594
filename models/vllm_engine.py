"""vLLM's engine start on the backend's behalf (`models.vllm`): the settings its CPU build needs,
read from the model's shape (the head sizes its attention kernels take, the KV cache size), the
log file that takes vLLM's own output, and the root cause of a failed start read back from that
log as one line a user can act on.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import sys
from pathlib import Path

from capacity_advisor.core.errors import InputError, one_line
from capacity_advisor.core.files import advisor_home
from capacity_advisor.models.backends import VLLM_DEFAULTS
from capacity_advisor.models.loading import LoadedModel

HF_HINT = "use --backend hf"
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB of RAM vLLM's CPU build reserves for its KV cache


def on_cpu_build() -> bool:
    """Whether the installed vLLM runs on the CPU (its `vllm-cpu` build): its platform says so."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # no vllm, a stand-in, or a release without platforms: not the CPU build
        return False


_KV_SET = [""]  # the VLLM_CPU_KVCACHE_SPACE this module last set (a later engine may need another)


def set_kv_space(gib) -> None:
    """Set VLLM_CPU_KVCACHE_SPACE for the next engine, remembering that this module set it."""
    os.environ[KV_ENV] = _KV_SET[0] = str(gib)


def users_kv_space() -> bool:
    """Whether VLLM_CPU_KVCACHE_SPACE was set by the user rather than by an earlier engine here."""
    value = os.environ.get(KV_ENV)
    return bool(value) and value != _KV_SET[0]


# ---- the model's shape, for the CPU build's settings --------------------------------------------

def model_config(lm: LoadedModel):
    """The model's (text) config, or None."""
    config = getattr(lm.model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return config


def shape(config) -> dict:
    """Layers, KV heads, head size and context length of `config`, where it states them."""
    if config is None:
        return {}
    get = lambda name: getattr(config, name, None)  # noqa: E731
    heads = get("num_attention_heads")
    head_size = get("head_dim") or (get("hidden_size") // heads if isinstance(heads, int) and heads > 0
                                    and isinstance(get("hidden_size"), int) else None)
    out = {"layers": get("num_hidden_layers"), "kv_heads": get("num_key_value_heads") or heads, "head_size": head_size,
           "max_len": get("max_position_embeddings")}
    return {k: v for k, v in out.items() if isinstance(v, int) and v > 0}


def cpu_head_sizes() -> list[int] | None:
    """The head sizes vLLM's CPU attention takes, as the installed release lists them."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return sorted(int(h) for h in CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another layout of vLLM: the engine's own failure is explained instead
        return None


def cpu_kv_cache_gib(config, dtype: str | None, max_model_len: int | None) -> tuple[int, str]:
    """VLLM_CPU_KVCACHE_SPACE for this model: room for `cpu_kvcache_sequences` sequences of its
    full length (K and V of every layer), at least `cpu_kvcache_min_gib`; and why."""
    d = VLLM_DEFAULTS
    s = shape(config)
    length = max_model_len or s.get("max_len")
    if not all(k in s for k in ("layers", "kv_heads", "head_size")) or not length:
        return d.cpu_kvcache_min_gib, f"at least {d.cpu_kvcache_min_gib} GiB; the model's config does not give its size"
    per_token = 2 * s["layers"] * s["kv_heads"] * s["head_size"] * (4 if dtype == "float32" else 2)
    gib = max(d.cpu_kvcache_min_gib, math.ceil(d.cpu_kvcache_sequences * per_token * length / 2**30))
    return gib, f"room for {d.cpu_kvcache_sequences:g} x {length:,} tokens of this model, at least {d.cpu_kvcache_min_gib} GiB"


# ---- vLLM's output and its failures -------------------------------------------------------------

_LOGS: dict[str, Path] = {}  # ADVISOR_HOME -> this process's log file there (truncated at first use)
_OUR_CONFIGS: set[str] = set()  # logging configs this module wrote (not the user's)


def own_logging() -> bool:
    """Whether this backend routes vLLM's output to its log file: the user has not configured
    vLLM's logging (a config file of theirs, or VLLM_CONFIGURE_LOGGING)."""
    path = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    return not os.environ.get("VLLM_CONFIGURE_LOGGING") and (not path or path in _OUR_CONFIGS)


def log_path() -> Path:
    """This process's vLLM log: `$ADVISOR_HOME/logs/vllm-HOST-PID.log` (the temporary folder
    when that cannot be written)."""
    import tempfile

    home = str(advisor_home())
    if home not in _LOGS:
        name = f"vllm-{socket.gethostname()}-{os.getpid()}.log"
        for folder in (Path(home) / "logs", Path(tempfile.gettempdir())):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(b"")
            except OSError:
                continue
            _LOGS[home] = folder / name
            break
        else:
            raise InputError(f"cannot write vLLM's log in {Path(home) / 'logs'} or {tempfile.gettempdir()}; "
                             "check ADVISOR_HOME and its permissions")
    return _LOGS[home]


def log_to(path: Path) -> dict:
    """Engine arguments that send vLLM's log records (all its processes') to `path` only."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(processName)s pid=%(process)d %(levelname)s %(asctime)s "
                                           "[%(filename)s:%(lineno)d] %(message)s", "datefmt": "%m-%d %H:%M:%S"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(path), "mode": "a", "formatter": "plain",
                              "level": level}},
        "loggers": {"vllm": {"handlers": ["file"], "level": level, "propagate": False}},
    }
    config_path = path.with_suffix(".logging.json")
    config_path.write_text(json.dumps(config, indent=1))
    _OUR_CONFIGS.add(str(config_path))
    try:
        from vllm.config.logging import LoggingConfig
    except ImportError:  # releases without the engine argument read the environment
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_path)
        return {}
    return {"logging_config": LoggingConfig(pylogging_config_file=str(config_path))}


def log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def read_log(path: Path | None, start: int) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def engine_output(path: Path | None):
    """While the engine starts, this process's file descriptors 1 and 2 point at `path`, so the
    engine processes it starts inherit them: their warnings, progress bars and tracebacks (printed
    by multiprocessing, not logged) land in the log, never on stdout (where --json writes) or the
    terminal. Python's own sys.stdout / sys.stderr are flushed and then put back as they were."""
    if path is None:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no descriptors 1 and 2 to redirect
        yield
        return
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def engine_errors() -> tuple[type, ...]:
    """The exceptions by which vLLM's engine fails (not TypeError and kin: those are bugs, and
    keep their traceback)."""
    errors: list[type] = [RuntimeError, ValueError, OSError, MemoryError]
    with contextlib.suppress(Exception):
        from vllm.exceptions import VLLMError

        errors.append(VLLMError)
    return tuple(errors)


# the last line of a traceback: "SomeError: message", alone or after a log record's prefix "...] "
_EXCEPTION_LINE = re.compile(r"(?:^|\] )((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")


def root_cause(text: str) -> tuple[str, str] | None:
    """(exception name, message) of the first traceback in `text` (a log): the failure that
    started the others (an engine process's error is re-raised in each process above it)."""
    in_traceback = False
    for line in text.splitlines():
        if "Traceback (most recent call last):" in line:
            in_traceback = True
            continue
        m = _EXCEPTION_LINE.search(line.rstrip())
        if in_traceback and m:
            return m[1].rsplit(".", 1)[-1], m[2].strip()
    return None


def generic_message(message: str) -> bool:
    """vLLM's messages that only point at a root cause logged elsewhere."""
    return not message.strip() or bool(re.search(r"root cause|stack trace", message, re.I))


def explain(cause: tuple[str, str], starting: bool, model: str, chosen: dict, where: str) -> str:
    """One line saying what failed in vLLM's engine and what to do about it."""
    name, message = cause
    text = one_line(message)
    short = text if len(text) <= 300 else text[:297] + "..."
    m = re.search(r"Unsupported CPU attention configuration: head_dim=(\d+)", text)
    if m:
        sizes = cpu_head_sizes()
        takes = f"; it takes {', '.join(map(str, sizes))}" if sizes else ""
        return f"vLLM's CPU attention does not support head size {m[1]} (this model's){takes}; {HF_HINT} ({where})"
    m = re.search(r"architectures? \[([^\]]*)\] (?:are|is) not supported", text)
    if m:
        return (f"vLLM does not support this model's architecture ({m[1].replace(chr(39), '')}); {HF_HINT} "
                f"({where})")
    if re.search(r"out of memory|memory", text, re.I):
        if chosen.get("platform", {}).get("value") == "cpu":
            kv = chosen.get(KV_ENV, {}).get("value")
            hint = (f"vLLM's CPU build reserves {KV_ENV} GiB for its cache ({kv or 'unset'} here): set it to what "
                    "this machine can spare and one sequence of the model needs, or lower --token-budget")
        else:
            hint = "lower --gpu-memory-utilization or --token-budget, free the GPU, or split the model with --tensor-parallel-size"
        return f"vLLM could not get the memory it needs ({short}); {hint}; or {HF_HINT} ({where})"
    when = f"could not start on {model}" if starting else "failed during a request"
    return f"vLLM's engine {when}: {name}: {short}; {HF_HINT} to run without vLLM ({where})"
