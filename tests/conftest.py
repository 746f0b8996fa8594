"""Tiny random-init models of two architectures, built in fixtures (no download).

`tiny_llama`: Llama, no chat template (plain prompt/response join, BOS added by the tokenizer).
`tiny_qwen`: Qwen2, with a chat template.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# The tests' models are tiny: a second torch thread buys nothing, and on shared cores the threads of
# one process spin against each other (a lab probe took twice as long). OMP_NUM_THREADS overrides.
os.environ.setdefault("OMP_NUM_THREADS", "1")

CORPUS = [
    "Question: what is 12 + 35? Answer: 47.",
    "Let us think step by step. First add the tens, then the units.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "<think> reasoning </think> so the final answer is \\boxed{42}",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(chat: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    if not chat:  # Llama-style: the tokenizer adds BOS
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    kwargs = dict(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>" if not chat else "<|im_end|>")
    if not chat:
        kwargs["bos_token"] = "<s>"
    fast = PreTrainedTokenizerFast(**kwargs)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def addition_pool(path, n: int, generations):
    """A pool of `n` problems "what is a + b?" (a, b drawn with seed 0) whose candidates are
    `generations(a, b, i)`; written as JSONL to `path`."""
    import json
    import random

    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"id": f"q{i}", "problem": f"what is {a} + {b}?", "answer": str(a + b), "generations": generations(a, b, i)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def build_tiny(path, arch: str, seed: int = 0, hidden: int = 32, layers: int = 2, context: int = 4096):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tok = make_tokenizer(chat=(arch == "qwen2"))
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(bos_token_id=tok.bos_token_id, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def pytest_collection_modifyitems(config, items):
    """Every test that takes a minute or more on two shared cores carries its own
    `@pytest.mark.slow` (`make test-fast` leaves them out); one that uses a slow fixture without
    the mark is a mistake this catches at collection rather than a fast run that turns slow."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid} uses a slow fixture: mark it @pytest.mark.slow")


SLOW_FIXTURES = {"quick_teacher"}  # a lab teacher pretrained for the test (about a minute)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny-qwen"), "qwen2", seed=1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Each test gets its own cache home unless it asks for a shared one."""
    if "ADVISOR_HOME" not in os.environ or os.environ.get("ADVISOR_TEST_KEEP_HOME") != "1":
        monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "advisor-home"))


def home_with(tmp_path_factory, name: str, *models: str):
    """A cache home in which the lab `models` (NAME or NAME@STEPS) are built, once."""
    from capacity_advisor.models.lab import student_path

    home = tmp_path_factory.mktemp(name)
    with advisor_home(home):
        for m in models:
            student_path(m)
    return home


@contextlib.contextmanager
def advisor_home(home):
    """ADVISOR_HOME set to `home` inside the block, and put back as it was after it."""
    old = os.environ.get("ADVISOR_HOME")
    os.environ["ADVISOR_HOME"] = str(home)
    try:
        yield home
    finally:
        if old is None:
            os.environ.pop("ADVISOR_HOME", None)
        else:
            os.environ["ADVISOR_HOME"] = old


def stored_numbers(path, key: str, got: dict):
    """The numbers stored under `key` in the JSON file `path`, to compare `got` with; with
    ADVISOR_STORE_NUMBERS=1 it stores `got` there instead and skips the test."""
    import json

    import pytest

    stored = json.loads(path.read_text()) if path.exists() else {}
    if os.environ.get("ADVISOR_STORE_NUMBERS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({**stored, key: got}, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"stored the numbers of {key} in {path.name}")
    return stored[key]


@pytest.fixture(scope="session")
def lab_cache(tmp_path_factory):
    """A cache home holding the smallest lab student, built once per test session (seconds)."""
    return home_with(tmp_path_factory, "lab-cache", "xs")


@pytest.fixture
def lab_home(lab_cache, monkeypatch):
    monkeypatch.setenv("ADVISOR_HOME", str(lab_cache))
    return lab_cache


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (torch's elastic launcher starts its workers in sessions of
    their own, so killing the launcher's group leaves them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc) -> None:
    """SIGKILL a started process and everything below it (a kill -9 of the whole run), then reap it."""
    import signal

    for pid in [proc.pid] + descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
