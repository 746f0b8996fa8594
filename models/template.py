"""How a (prompt, response) pair becomes token ids — the one rule scoring, probes and SFT share.

With a chat template: the prompt is rendered as one user turn with the generation prompt appended
(the template supplies BOS and role markers). Without one: the prompt is tokenized with the
tokenizer's own special tokens (usually BOS) and the response follows directly, as TRL does for
prompt/completion data. The response is always tokenized on its own (`add_special_tokens=False`)
and appended, so the boundary between the two is exact. `add_eos=True` (for training) appends EOS
so the student learns to stop; scoring leaves it off and scores only the response's own tokens.

A chat template is Jinja code from the model folder. Transformers renders it in Jinja's sandbox;
whatever it does wrong there (reach for `__class__`, raise, divide by zero, recurse) becomes one
InputError. Every rendering, of every prompt, is bounded: it must end within TEMPLATE_SECONDS and
write at most TEMPLATE_EXTRA_CHARS characters beyond the prompt's own (counted as the template
writes, so a template that loops or balloons on some prompts only is stopped at the first one,
before it holds the memory). `check_chat_template` renders one prompt at load, so a template
broken on every prompt stops the run before any work.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import stable_hash

TEMPLATE_SECONDS = 10.0  # a real chat template renders in milliseconds
TEMPLATE_EXTRA_CHARS = 100_000  # role markers and a default system prompt take hundreds; tool texts a few thousand


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    n_prompt: int  # tokens before the first response token
    truncated: bool

    @property
    def n_response(self) -> int:
        return len(self.input_ids) - self.n_prompt


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


TOKENIZER_CONFIG_BYTES = 64 << 20  # a real tokenizer_config.json is kilobytes; a larger one is not read for this


def declared_chat_template(folder) -> bool | None:
    """Whether a model folder's tokenizer files declare a chat template, read without loading the
    tokenizer (a config-only description, `models.loading.describe_config`): a chat_template.jinja
    or .json file, or a `chat_template` in tokenizer_config.json. None where the folder holds no
    tokenizer config to tell, or that config is not readable JSON (loading the tokenizer says why)."""
    import json
    from pathlib import Path

    root = Path(folder)
    if any((root / n).is_file() and (root / n).stat().st_size > 0 for n in ("chat_template.jinja", "chat_template.json")):
        return True
    text = _bounded_read(root / "tokenizer_config.json", TOKENIZER_CONFIG_BYTES)
    if text is None:
        return None
    try:
        obj = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return bool(obj.get("chat_template")) if isinstance(obj, dict) else None


def _bounded_read(path, limit: int) -> bytes | None:
    """A regular file's bytes, read without blocking (a FIFO swapped in is refused, not waited on)
    and at most `limit` of them whatever its size says (a /proc file says 0); None otherwise."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None  # longer than a tokenizer config is
    except OSError:
        return None
    finally:
        os.close(fd)


def template_id(tokenizer) -> str:
    """Names the rendering rule in cache keys: the chat template's hash, or 'plain'."""
    if has_chat_template(tokenizer):
        return "chat-" + stable_hash(tokenizer.chat_template, 12)
    return "plain"


class TemplateTimeout(Exception):
    pass


class TemplateTooLong(Exception):
    pass


def render_prompt(tokenizer, prompt: str) -> str:
    """The prompt as one user turn with the generation prompt, through the model's chat template,
    within TEMPLATE_SECONDS and len(prompt) + TEMPLATE_EXTRA_CHARS characters."""
    limit = len(prompt) + TEMPLATE_EXTRA_CHARS
    try:
        with _time_limit(TEMPLATE_SECONDS), _length_limit(tokenizer, limit):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=False)
        if not isinstance(text, str):
            raise TypeError(f"rendered a {type(text).__name__}, not text")
        if len(text) > limit:
            raise TemplateTooLong(f"wrote {len(text):,} characters for a prompt of {len(prompt):,}")
        return text
    except Exception as e:  # the template is the model folder's code: any fault in it is the folder's
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise InputError(f"the chat template of {name} cannot be rendered ({type(e).__name__}: {e}); "
                         "fix or remove chat_template (tokenizer_config.json or chat_template.jinja)") from None


def check_chat_template(tokenizer) -> None:
    """Render one prompt now, so a template that fails or never ends on every prompt fails at load."""
    if has_chat_template(tokenizer):
        render_prompt(tokenizer, "What is 1 + 1?")


RENDER_SECONDS_EACH = 0.05  # the mean time per prompt a check of many prompts allows (real templates: < 1 ms)


def check_prompts(tokenizer, prompts) -> None:
    """Render every distinct prompt once, each within render_prompt's bounds and all of them within
    TEMPLATE_SECONDS + RENDER_SECONDS_EACH per prompt, so a template that fails, loops, balloons or
    crawls on some of a pool's prompts is one InputError before any work (and any progress display)."""
    import time

    if not has_chat_template(tokenizer):
        return
    seen: set[str] = set()
    t0 = time.monotonic()
    for prompt in prompts:
        if prompt in seen:
            continue
        seen.add(prompt)
        elapsed = time.monotonic() - t0
        if elapsed > TEMPLATE_SECONDS + RENDER_SECONDS_EACH * len(seen):
            name = getattr(tokenizer, "name_or_path", "") or "this model"
            raise InputError(f"the chat template of {name} renders too slowly ({elapsed:.0f} s for {len(seen) - 1} prompts); "
                             "fix or remove chat_template (tokenizer_config.json or chat_template.jinja)")
        render_prompt(tokenizer, prompt)


_BOUND = threading.local()  # the character limit of the rendering under way in this thread


def _bounded_concat(chunks) -> str:
    """Jinja's final join of a template's output, stopped as soon as it passes the current limit."""
    limit = getattr(_BOUND, "chars", None)
    if limit is None:
        return "".join(chunks)
    out, n = [], 0
    for chunk in chunks:
        n += len(chunk)
        if n > limit:
            raise TemplateTooLong(f"wrote more than {limit:,} characters")
        out.append(chunk)
    return "".join(out)


@contextlib.contextmanager
def _length_limit(tokenizer, chars: int):
    """Count the characters the template writes while it writes them. Transformers compiles each
    template once into a Jinja template whose environment joins the output (`concat`); that join
    is replaced by a counting one. Where transformers is laid out otherwise, the length is still
    checked after rendering (render_prompt)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        text = tokenizer.get_chat_template() if hasattr(tokenizer, "get_chat_template") else tokenizer.chat_template
        env = _compile_jinja_template(text).environment
        if env.concat is not _bounded_concat:
            env.concat = _bounded_concat
    except (ImportError, AttributeError, TypeError, ValueError):
        pass  # the faults of the template itself surface when it is rendered
    previous = getattr(_BOUND, "chars", None)
    _BOUND.chars = chars
    try:
        yield
    finally:
        _BOUND.chars = previous


@contextlib.contextmanager
def _time_limit(seconds: float):
    # SIGALRM exists on POSIX and reaches only the main thread; elsewhere the template runs unbounded.
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TemplateTimeout(f"still rendering after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    if has_chat_template(tokenizer):
        return list(tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    eos = tokenizer.eos_token_id
    if ids and eos is not None and ids[-1] == eos and tokenizer.bos_token_id != eos:
        ids = ids[:-1]  # a tokenizer that appends EOS to every text must not end the prompt with it
    return ids


def response_ids(tokenizer, response: str, add_eos: bool = False) -> list[int]:
    ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    if add_eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_pair(tokenizer, prompt: str, response: str, max_length: int, add_eos: bool = False) -> Encoded:
    """Token ids of prompt + response, cut to `max_length`.

    The response keeps as much of its start as fits. The prompt stays whole unless it alone takes
    more than half the budget; then it keeps its first token (BOS / template start) and its end.
    """
    p = prompt_ids(tokenizer, prompt)
    r = response_ids(tokenizer, response, add_eos=add_eos)
    truncated = False
    if len(p) + len(r) > max_length:
        truncated = True
        half = max_length // 2
        if len(p) > half:
            keep = max(max_length - len(r), half)  # < len(p), since the pair does not fit
            p = p[:1] + p[len(p) - keep + 1:] if keep > 1 else p[:1]
        r = r[: max_length - len(p)]
    return Encoded(p + r, len(p), truncated)


def collate(tokenizer, pairs, max_length: int, completion_only: bool = True, add_eos: bool = True):
    """Right-padded (input_ids, attention_mask, labels) for SFT on (prompt, response) pairs.

    Labels are -100 on padding and, with `completion_only`, on prompt tokens, so the loss covers
    the response (and its EOS) only. Position 0 (BOS / template start) is never a target.
    """
    import torch

    enc = [encode_pair(tokenizer, p, r, max_length, add_eos=add_eos) for p, r in pairs]
    width = max(len(e.input_ids) for e in enc)
    pad = tokenizer.pad_token_id or 0
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    labels = torch.full((len(enc), width), -100, dtype=torch.long)
    for b, e in enumerate(enc):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        mask[b, :n] = 1
        start = e.n_prompt if completion_only else 1
        labels[b, start:n] = ids[b, start:n]
    return ids, mask, labels
