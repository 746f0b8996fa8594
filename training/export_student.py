"""The student as the exported launchers see it (`training.export`): what they load (a local
folder or a hub id), its tokenizer when it can be read here, chat or plain, the LLaMA-Factory
template that matches its chat template, and the BOS / EOS text a plain student's rows carry.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from capacity_advisor.models.loading import resolve_model_path
from capacity_advisor.models.template import check_chat_template, prompt_ids, render_prompt
from capacity_advisor.training.manifest import Manifest


@dataclass(frozen=True)
class Student:
    ref: str  # what the launchers load: a local folder or a hub id
    tokenizer: object | None  # None: not readable here
    model_type: str | None
    chat: bool


def read_student(m: Manifest) -> Student:
    spec, path = m.model_spec, m.model.get("path")
    if isinstance(path, str) and os.path.isdir(path):
        ref = path
    elif spec.startswith("lab:"):
        ref = resolve_model_path(spec)  # builds the lab student if needed, as `advisor train` would
    else:
        ref = os.path.expanduser(spec) if os.path.isdir(os.path.expanduser(spec)) else spec
    model_type = m.model.get("model_type")
    tok, model_type = None, model_type if isinstance(model_type, str) else None
    try:
        from transformers import AutoConfig, AutoTokenizer

        # never the folder's code
        tok = AutoTokenizer.from_pretrained(ref, local_files_only=True, trust_remote_code=False)
        model_type = AutoConfig.from_pretrained(ref, local_files_only=True, trust_remote_code=False).model_type
    except (OSError, ValueError):
        pass  # a hub id not cached here, or a folder of another machine: the manifest's description decides
    if tok is not None:
        check_chat_template(tok)  # a template the sandbox refuses, or that never ends, is one InputError
    chat = bool(getattr(tok, "chat_template", None)) if tok is not None else bool(m.model.get("chat_template"))
    return Student(ref, tok, model_type, chat)


# LLaMA-Factory's names for chat templates, recognised by a marker the student's template writes.
_LF_BY_MARKER = (
    ("<｜Assistant｜>", lambda t, mt: "deepseekr1" if "<think>" in t else "deepseek3"),  # also R1's distilled Qwen/Llama
    ("<|start_header_id|>", lambda t, mt: "llama3"),
    ("<start_of_turn>", lambda t, mt: {"gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3"}.get(mt, "gemma")),
    ("<|im_sep|>", lambda t, mt: "phi4"),
    ("<|im_start|>", lambda t, mt: "qwen3" if "<think>" in t else "qwen" if (mt or "").startswith("qwen") else "chatml"),
    ("<|assistant|>", lambda t, mt: "phi"),
    ("[INST]", lambda t, mt: "llama2" if "<<SYS>>" in t else "mistral"),
)
# When the tokenizer cannot be read here, the model type is the only clue (R1's distilled Qwen would be misnamed).
_LF_BY_MODEL_TYPE = {"qwen2": "qwen", "qwen3": "qwen3", "llama": "llama3", "mistral": "mistral", "gemma": "gemma",
                     "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "phi3": "phi"}
_CHATML_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>\n<\|im_start\|>user\n", re.S)


def llamafactory_template(st: Student) -> tuple[str | None, str | None, str]:
    """(template name or None, default system prompt or None, a comment line saying where it came from)."""
    if not st.chat:
        return "empty", None, ("# template: empty (the student has no chat template; BOS and EOS are in the rows)"
                               if st.tokenizer is not None else
                               "# template: empty; the tokenizer could not be read where this was exported, so the "
                               "rows lack the BOS and EOS advisor trains with")
    text = getattr(st.tokenizer, "chat_template", None)
    if isinstance(text, str):
        for marker, name_of in _LF_BY_MARKER:
            if marker in text:
                name = name_of(text, st.model_type)
                system = None
                if marker == "<|im_start|>":
                    # ChatML templates differ only in their default system prompt: carry the student's exactly.

                    shown = render_prompt(st.tokenizer, "x")  # bounded like every other rendering
                    found = _CHATML_SYSTEM.search(shown)
                    system = found.group(1) if found else ""
                return name, system, (f"# template: {name}, LLaMA-Factory's copy of the student's chat template "
                                      f"({marker} turns)")
        return None, None, ("# template: not set: the student's chat template matches none that advisor can name, so "
                            "LLaMA-Factory parses the tokenizer's own (or set `template: NAME`)")
    if st.model_type in _LF_BY_MODEL_TYPE:
        name = _LF_BY_MODEL_TYPE[st.model_type]
        return name, None, (f"# template: {name}, from the student's model type (its tokenizer could not be read where "
                            "this was exported): check it matches the student's chat template")
    return None, None, ("# template: not set: the tokenizer could not be read where this was exported and the model "
                        "type is not one advisor can name; LLaMA-Factory then parses the tokenizer's chat template "
                        "(or set `template: NAME`, e.g. qwen, llama3)")


def bos_eos_text(tok) -> tuple[str, str]:
    """The text of the special tokens the tokenizer puts before a prompt, and its EOS (scoring's rule)."""
    ids = prompt_ids(tok, "x")
    lead = ids[: len(ids) - len(tok("x", add_special_tokens=False)["input_ids"])]
    return tok.decode(lead), tok.eos_token or ""
