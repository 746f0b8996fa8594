"""How a (prompt, response) pair becomes token ids — the one rule scoring, probes and SFT share.

With a chat template: the prompt is rendered as one user turn with the generation prompt appended
(the template supplies BOS and role markers). Without one: the prompt is tokenized with the
tokenizer's own special tokens (usually BOS) and the response follows directly, as TRL does for
prompt/completion data. The response is always tokenized on its own (`add_special_tokens=False`)
and appended, so the boundary between the two is exact. `add_eos=True` (for training) appends EOS
so the student learns to stop; scoring leaves it off and scores only the response's own tokens.

A chat template is Jinja code from the model folder. Transformers renders it in Jinja's sandbox;
whatever it does wrong there (reach for `__class__`, raise, divide by zero, recurse) becomes one
InputError, and `check_chat_template` renders it once at load under a time limit, so a broken or
endless template stops the run before any work.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import stable_hash

TEMPLATE_SECONDS = 10.0  # a real chat template renders in milliseconds


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


def template_id(tokenizer) -> str:
    """Names the rendering rule in cache keys: the chat template's hash, or 'plain'."""
    if has_chat_template(tokenizer):
        return "chat-" + stable_hash(tokenizer.chat_template, 12)
    return "plain"


class TemplateTimeout(Exception):
    pass


def render_prompt(tokenizer, prompt: str) -> str:
    """The prompt as one user turn with the generation prompt, through the model's chat template."""
    try:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    except Exception as e:  # the template is the model folder's code: any fault in it is the folder's
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise InputError(f"the chat template of {name} cannot be rendered ({type(e).__name__}: {e}); "
                         "fix or remove chat_template (tokenizer_config.json or chat_template.jinja)") from None


def check_chat_template(tokenizer) -> None:
    """Render one prompt now, within TEMPLATE_SECONDS, so a failing or endless template fails at load."""
    if has_chat_template(tokenizer):
        with _time_limit(TEMPLATE_SECONDS):
            render_prompt(tokenizer, "What is 1 + 1?")


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
