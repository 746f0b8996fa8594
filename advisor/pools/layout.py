"""Which layout a pool's rows are in, and each row's prompt, response, marks and id as text.

`detect_layout` reads the field names of the first rows, and the --*-field overrides of
`PoolOptions`, and names the layout (`grouped`: a list of candidates per row; `messages`,
`sharegpt`, `alpaca`, `trl`; `flat`: one response per row in plain fields) with the field that
holds each part. The helpers below turn a row of a layout into text, refusing in one line that
names the row a value of the wrong type, a chat without the turns it needs, or text UTF-8
cannot hold. `advisor.pools.generate` reads problems files with the same field names and helpers.
"""

from __future__ import annotations

from typing import Any

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import unpaired_surrogate

PROMPT_KEYS = ("problem", "prompt", "question", "instruction", "query", "input")
RESPONSES_KEYS = ("generations", "responses", "candidates", "completions", "outputs")
RESPONSE_KEYS = ("response", "completion", "output", "generation", "solution")
ANSWER_KEYS = ("answer", "reference_answer", "ground_truth", "final_answer", "gold", "target")
CORRECT_KEYS = ("correctness_math_verify", "correctness", "correct", "is_correct", "correctness_llama")
ID_KEYS = ("id", "uuid", "unique_id", "problem_id", "question_id", "prompt_id", "idx")


def pick_field(keys: set[str], given: str | None, candidates: tuple[str, ...], flag: str, what: str = "the pool") -> str | None:
    """The field `given` by a flag (it must exist), else the first of `candidates` present."""
    if given is not None:
        if given not in keys:
            raise InputError(f"{flag} {given!r} is not a field of {what} (fields: {', '.join(sorted(keys))})")
        return given
    return next((k for k in candidates if k in keys), None)


def detect_layout(rows: list[dict], opt: PoolOptions) -> tuple[str, dict[str, str | None]]:
    keys: set[str] = set()
    for r in rows[:50]:
        keys |= set(r)
    id_f = pick_field(keys, opt.id_field, ID_KEYS, "--id-field")
    ans_f = pick_field(keys, opt.answer_field, ANSWER_KEYS, "--answer-field")
    cor_f = pick_field(keys, opt.correct_field, CORRECT_KEYS, "--correct-field")
    fields: dict[str, str | None] = {"id": id_f, "answer": ans_f, "correct": cor_f}

    resp_f = pick_field(keys, opt.responses_field, (), "--responses-field")
    if resp_f is None:
        resp_f = next((k for k in RESPONSES_KEYS if k in keys), None)
    grouped = resp_f is not None and (resp_f in RESPONSES_KEYS or isinstance(rows[0].get(resp_f), list))
    if grouped and not _is_messages(rows[0].get(resp_f)):
        prompt_f = pick_field(keys, opt.prompt_field, PROMPT_KEYS, "--prompt-field")
        if prompt_f is None:
            raise InputError(f"grouped pool has candidates in {resp_f!r} but no prompt field: pass --prompt-field")
        return "grouped", {**fields, "prompt": prompt_f, "responses": resp_f}
    if opt.prompt_field is None and opt.responses_field is None:
        if "messages" in keys:
            return "messages", {**fields, "prompt": "messages", "responses": "messages"}
        if "conversations" in keys:
            return "sharegpt", {**fields, "prompt": "conversations", "responses": "conversations"}
        if "instruction" in keys and "output" in keys:
            return "alpaca", {**fields, "prompt": "instruction", "responses": "output"}
        if "prompt" in keys and "completion" in keys:
            return "trl", {**fields, "prompt": "prompt", "responses": "completion"}
    prompt_f = pick_field(keys, opt.prompt_field, PROMPT_KEYS, "--prompt-field")
    resp_f = resp_f or pick_field(keys, None, RESPONSE_KEYS, "--responses-field")
    if prompt_f is None or resp_f is None:
        raise InputError(
            f"cannot tell the pool layout from its fields ({', '.join(sorted(keys))}): "
            "pass --prompt-field and --responses-field"
        )
    return "flat", {**fields, "prompt": prompt_f, "responses": resp_f}


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "content" in value[0]


def utf8_text(value: str, where: str, what: str) -> str:
    """`value`, if it is text UTF-8 can hold: JSON escapes can carry half a surrogate pair, which
    no tokenizer and no output file accepts."""
    at = unpaired_surrogate(value)
    if at is not None:
        raise InputError(f"{where}: {what} holds an unpaired surrogate ({value[at]!r}, character {at}); "
                         "fix that escape in the file")
    return value


def text_of(value: Any, where: str, what: str) -> str:
    if isinstance(value, str):
        return utf8_text(value, where, what)
    if value is None:
        return ""
    raise InputError(f"{where}: {what} must be a string, got {type(value).__name__}")


def _chat_pair(turns: Any, where: str, role_key: str, text_key: str, user: tuple, assistant: tuple) -> tuple[str, str]:
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise InputError(f"{where}: expected a list of chat turns")
    last_assistant = max((i for i, t in enumerate(turns) if t.get(role_key) in assistant), default=None)
    if last_assistant is None:
        raise InputError(f"{where}: no assistant turn to use as the response")
    user_turns = [i for i, t in enumerate(turns[:last_assistant]) if t.get(role_key) in user]
    if not user_turns:
        raise InputError(f"{where}: no user turn before the assistant's response")
    prompt = text_of(turns[user_turns[-1]].get(text_key), where, "the user turn")
    return prompt, text_of(turns[last_assistant].get(text_key), where, "the assistant turn")


def flat_pair(row: dict, layout: str, f: dict, where: str) -> tuple[str, str]:
    if layout == "messages":
        return _chat_pair(row.get("messages"), where, "role", "content", ("user",), ("assistant",))
    if layout == "sharegpt":
        return _chat_pair(row.get("conversations"), where, "from", "value", ("human", "user"), ("gpt", "assistant"))
    if layout == "alpaca":
        instr = text_of(row.get("instruction"), where, "instruction")
        extra = text_of(row.get("input"), where, "input")
        return (f"{instr}\n\n{extra}" if extra.strip() else instr), text_of(row.get("output"), where, "output")
    if layout == "trl":
        prompt, completion = row.get("prompt"), row.get("completion")
        if isinstance(prompt, list):  # conversational prompt/completion
            prompt = _chat_pair(prompt + [{"role": "assistant", "content": ""}], where, "role", "content", ("user",), ("assistant",))[0]
        if isinstance(completion, list):
            completion = completion[-1].get("content") if completion and isinstance(completion[-1], dict) else None
        return text_of(prompt, where, "prompt"), text_of(completion, where, "completion")
    if f["prompt"] not in row:
        raise InputError(f"{where}: missing field {f['prompt']!r}; pass --prompt-field")
    if f["responses"] not in row:
        raise InputError(f"{where}: missing field {f['responses']!r}; pass --responses-field")
    return text_of(row[f["prompt"]], where, f["prompt"]), text_of(row[f["responses"]], where, f["responses"])


def as_bool(v: Any, where: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise InputError(f"{where}: correctness mark {v!r} is not true/false")


def answer_of(row: dict, f: dict, where: str) -> str | None:
    if f["answer"] is None or row.get(f["answer"]) is None:
        return None
    return utf8_text(str(row[f["answer"]]), where, f["answer"])


def task_of(row: dict, where: str) -> str | None:
    task = row.get("task")
    return utf8_text(task, where, "task") if isinstance(task, str) else None


def stand_in_id(n: int, taken: set[str]) -> str:
    """An id for row `n` (0-based), which has none: its number, unless the file already uses that
    as a real id (`taken`), then prefixed until it is free. Adds it to `taken`."""
    pid = str(n)
    while pid in taken:
        pid = "row-" + pid
    taken.add(pid)
    return pid


def given_ids(rows: list[dict], id_field: str | None, what: str = "pool") -> list[str | None]:
    return [given_id(r, id_field, f"{what} row {n + 1}") for n, r in enumerate(rows)]


def given_id(row: dict, id_field: str | None, where: str) -> str | None:
    """The row's own id, as text, or None when it has none."""
    return utf8_text(str(row[id_field]), where, id_field) if id_field and row.get(id_field) is not None else None
