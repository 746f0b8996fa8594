"""Step-local scoring: how natural each reasoning step is to the student, given only what just preceded it.

    rows = local_logprobs(backend, tokenizer, [(prompt, response)], max_length=4096, window=32)

Local Average Log Probability (arXiv 2510.03988): split the response into steps, score each
step's tokens with only the `window` tokens before it as context (the end of the prompt for the
first step), average within each step, then over steps. A response whose every step follows from
its immediate premises scores high even when the whole looks unusual to the student.

Steps end at line breaks; a response with none (the lab's `|3+4=7,7*9=3;A3`) is cut at `,` `/`
and `;`. Token boundaries come from the tokenizer's own offsets over the whole response, so a
step holds exactly the tokens the response is scored and trained with.
"""

from __future__ import annotations

import re
from typing import Sequence

from capacity_advisor.models.template import Encoded, encode_pair

_LINES = re.compile(r"[^\n]*\n|[^\n]+$")
_LAB_STEPS = re.compile(r"[^,/;]*[,/;]|[^,/;]+$")


def step_spans(response: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the response's steps, covering it without gaps."""
    pattern = _LINES if "\n" in response else _LAB_STEPS
    return [m.span() for m in pattern.finditer(response) if m.group()]


def local_logprobs(backend, tokenizer, pairs: Sequence[tuple[str, str]], max_length: int, window: int = 32) -> list[float]:
    """LALP of every (prompt, response): the mean over steps of the step's mean token log-prob."""
    entries: list[Encoded] = []
    owner: list[int] = []
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    for i, (prompt, response) in enumerate(pairs):
        e = encode_pair(tokenizer, prompt, response, max_length)
        prompt_ids, resp_ids = e.input_ids[:e.n_prompt], e.input_ids[e.n_prompt:]
        offsets = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        offsets = offsets[:len(resp_ids)]  # a truncated response keeps its first tokens
        t = 0
        for _, end in step_spans(response):
            first = t
            while t < len(offsets) and offsets[t][0] < end:
                t += 1
            if t == first:
                continue
            context = (prompt_ids + resp_ids[:first])[-window:]
            entries.append(Encoded(bos + context + resp_ids[first:t], len(bos) + len(context), e.truncated))
            owner.append(i)
    scored = backend.score_encoded(entries) if entries else []
    per: list[list[float]] = [[] for _ in pairs]
    for i, row in zip(owner, scored):
        per[i].append(row["logprob_mean"])
    return [sum(v) / len(v) if v else float("nan") for v in per]
