"""What the test files share, defined once: the CLI run in this process and the check that a refused
input is one `error:` line; JSONL, pool and tiny-model writers; cache homes with lab builds; the
stored-number store; killing a started process tree; the committed records' subset the fit tests
fit on; and the tiny teacher stored in tests/data/lab/.

conftest.py holds the fixtures, and imports from here the names some test files import from it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
RECORDS = ROOT / "calibration" / "records.jsonl"  # the committed records the shipped predictor is fitted on


# ---- the CLI --------------------------------------------------------------------------------------


def run(*args, catch: bool = False):
    """`advisor ARGS` in this process (click's CliRunner); an exception the CLI does not turn into an
    exit code is raised here unless `catch` (then it is the result's `exception`)."""
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch)


def one_error_line(result, fragment: str = "", *absent: Path, quiet: bool = False) -> str:
    """The line a refused input ends in, checked: exit code 2, no traceback, exactly one stderr line,
    starting `error: ` and holding `fragment`, none of the paths `absent` there (not even as a
    link); with `quiet`, nothing on stdout either. `result`: a CliRunner result or a finished
    subprocess (text mode)."""
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    err = result.stderr
    assert code == 2, (code, err[-3000:], getattr(result, "exception", None))
    assert "Traceback" not in err, err[-3000:]
    if quiet:
        assert result.stdout == "", result.stdout[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert fragment in lines[0], lines[0]
    for p in absent:
        assert not os.path.lexists(p), (p, sorted(x.name for x in Path(p).iterdir()) if os.path.isdir(p) else None)
    return lines[0]


def lab_pool(path: Path, n: int, *more) -> Path:
    """`advisor lab pool --n N --out PATH [MORE]`: a pool of the lab's tasks sampled by its teacher."""
    r = run("lab", "pool", "--n", n, "--out", path, *more)
    assert r.exit_code == 0, r.stderr
    return path


# ---- files ----------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def write_jsonl(path: Path, rows) -> Path:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


def doubling_pool(path, n: int = 12) -> Path:
    """A grouped pool (OpenR1's fields) of `n` problems "what is i + i?", each with three right
    candidates in three styles and one marked wrong."""
    rows = [{"uuid": f"u{i}", "problem": f"what is {i} + {i}?",
             "generations": [f"Answer: {2 * i}.", f"Let us think step by step. {i}+{i}={2 * i}. Answer: {2 * i}.",
                             f"{i} plus {i} is {2 * i}", "wrong"],
             "correctness_math_verify": [True, True, True, False], "answer": str(2 * i)} for i in range(n)]
    return write_jsonl(path, rows)


def addition_pool(path, n: int, generations):
    """A pool of `n` problems "what is a + b?" (a, b drawn with seed 0) whose candidates are
    `generations(a, b, i)`; written as JSONL to `path`."""
    import random

    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"id": f"q{i}", "problem": f"what is {a} + {b}?", "answer": str(a + b), "generations": generations(a, b, i)})
    return write_jsonl(path, rows)


# ---- tiny random-init models (no download) ----------------------------------------------------------

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


def build_tiny(path, arch: str, seed: int = 0, hidden: int = 32, layers: int = 2, context: int = 4096):
    """A random-init Llama (no chat template; BOS added by the tokenizer) or Qwen2 (a chat template)
    model folder at `path`."""
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


# ---- cache homes ----------------------------------------------------------------------------------


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


def home_with(tmp_path_factory, name: str, *models: str):
    """A cache home in which the lab `models` (NAME or NAME@STEPS) are built, once."""
    from capacity_advisor.models.lab import student_path

    home = tmp_path_factory.mktemp(name)
    with advisor_home(home):
        for m in models:
            student_path(m)
    return home


# ---- the tiny teacher -------------------------------------------------------------------------------

# The lab teacher's recipe (its corpus: every procedure of every family; its rate and batch) at the
# shape of student `s` and a 40-step budget: 27,744 parameters, 113 kB of weights. Its build is kept in
# tests/data/lab/ (made by `pretrain_tiny_teacher`; tests/test_tiny_teacher.py pretrains it again and
# compares), so a test that needs a teacher loads it instead of pretraining one.
TINY_TEACHER_SHAPE = dict(hidden=32, layers=2, heads=4, ffn=96, steps=40)
TINY_TEACHER_BUILDS = DATA / "lab"


@contextlib.contextmanager
def tiny_teacher_spec():
    """Inside the block, the lab's `teacher` is the tiny teacher (its folder name carries the hash
    of this recipe, so it is never taken for the real teacher's)."""
    from dataclasses import replace

    import pytest

    from capacity_advisor.models.lab import ladder

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ladder.TEACHERS, "teacher", replace(ladder.TEACHER, **TINY_TEACHER_SHAPE))
        yield ladder.student_dir("teacher")


def tiny_teacher_home(home: Path) -> Path:
    """`home` (a cache home) holding the stored tiny teacher, copied in as the lab copies a kept build."""
    from capacity_advisor.models.lab import committed

    with advisor_home(home), tiny_teacher_spec() as final:
        assert committed.adopt(final, TINY_TEACHER_BUILDS), f"no stored build {final.name} in {TINY_TEACHER_BUILDS}"
    return home


def pretrain_tiny_teacher(home: Path) -> Path:
    """The tiny teacher pretrained in cache home `home` (seconds): its build folder."""
    from capacity_advisor.models.lab import ladder

    with advisor_home(home), tiny_teacher_spec():
        return ladder.student_path("teacher")


# ---- stored numbers, processes --------------------------------------------------------------------


def stored_numbers(path, key: str, got: dict):
    """The numbers stored under `key` in the JSON file `path`, to compare `got` with; with
    ADVISOR_STORE_NUMBERS=1 it stores `got` there instead and skips the test."""
    import pytest

    stored = json.loads(path.read_text()) if path.exists() else {}
    if os.environ.get("ADVISOR_STORE_NUMBERS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({**stored, key: got}, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"stored the numbers of {key} in {path.name}")
    return stored[key]


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


# ---- the committed records' subset -------------------------------------------------------------------

# Three pool sources (both recipe generations, a scripted and a sampled teacher) and five students
# (three proxies below the proxy split's cut of 2e5 parameters, two targets above it): 105 of the 906
# committed records, every seed, ranking and budget of those. A fit with cross-validation on them takes
# seconds where the whole table takes minutes; tests/test_stored_cv.py checks the whole table.
SUBSET_SOURCES = ("lab1:modchain/program", "lab2:addition/lab:teacher@T1", "lab2:listmax/program")
SUBSET_STUDENTS = ("lab:xs", "lab:s", "lab:m", "lab:l", "lab:xl")


def record_subset() -> list[str]:
    """The committed records (their lines, unchanged) of SUBSET_SOURCES x SUBSET_STUDENTS."""
    from capacity_advisor.advisor.predictor import unit_of

    lines = []
    for line in RECORDS.read_text().splitlines():
        rec = json.loads(line)
        if unit_of(rec)["source"] in SUBSET_SOURCES and rec["model"]["spec"] in SUBSET_STUDENTS:
            lines.append(line)
    assert lines, "the committed records hold none of the subset's sources and students"
    return lines
