"""What the test files share, defined once: the CLI run in this process and the check that a refused
input is one `error:` line; JSONL, pool and tiny-model writers; cache homes with lab builds; the
stored-number store; killing a started process tree; the committed records' subset the fit tests
fit on; and the tiny teacher stored in tests/data/lab/.

conftest.py holds the fixtures, and imports from here the names some test files import from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from capacity_advisor.training.manifest import EvalSpec, Manifest, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
RECORDS = ROOT / "calibration" / "records.jsonl"  # the committed records the shipped predictor is fitted on


# ---- the CLI --------------------------------------------------------------------------------------


class Ran(NamedTuple):
    """A finished `advisor` command run through `main(argv)`: unpacks as (code, out, err)."""

    exit_code: int
    stdout: str
    stderr: str


def advisor(capsys, *args) -> Ran:
    """`advisor ARGS` through `main(argv)`, the console script's own path (stdout and stderr as the
    process writes them, caught by pytest's `capsys`)."""
    from capacity_advisor.advisor.cli.main import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    got = capsys.readouterr()
    return Ran(code, got.out, got.err)


def run(*args, catch: bool = False):
    """`advisor ARGS` in this process (click's CliRunner); an exception the CLI does not turn into an
    exit code is raised here unless `catch` (then it is the result's `exception`)."""
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch)


def one_error_line(result, fragment: str = "", *absent: Path, quiet: bool = False) -> str:
    """The line a refused input ends in, checked: exit code 2, no traceback, exactly one stderr line,
    starting `error: ` and holding `fragment`, none of the paths `absent` there (not even as a
    link); with `quiet`, nothing on stdout either. `result`: a CliRunner result, a `Ran` of
    `advisor(capsys, ...)` or a finished subprocess (text mode)."""
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


def no_loading(monkeypatch) -> None:
    """Loading a model fails the test: what is refused must be refused before any model loads."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("capacity_advisor.models.loading.load_model", refuse)


def lab_pool(path: Path, n: int, *more) -> Path:
    """`advisor lab pool --n N --out PATH [MORE]`: a pool of the lab's tasks sampled by its teacher."""
    r = run("lab", "pool", "--n", n, "--out", path, *more)
    assert r.exit_code == 0, r.stderr
    return path


# ---- files ----------------------------------------------------------------------------------------


def checkout_copy(dest: Path, left_out: tuple[str, ...] = ()) -> Path:
    """The checkout's files as a fresh clone holds them (tracked, and new ones git does not ignore),
    without the paths starting with one of `left_out`, copied to `dest`: no build folder, egg-info
    or cache comes along."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout: the copy is made from git's list of files")
    for rel in filter(None, listed.stdout.split("\0")):
        src = ROOT / rel
        if rel.startswith(left_out) or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    return dest


def read_jsonl(path: Path) -> list:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def write_jsonl(path: Path, rows) -> Path:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


def tear(path: Path, n: int = 40) -> None:
    """What a kill or a full disk during a write leaves: the file without its last `n` bytes."""
    data = path.read_bytes()
    path.write_bytes(data[:-n])


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


def real_pool(path, n=40, empty_first=True):
    """Sums with two boxed answers each; with `empty_first`, the first problem also has an empty
    candidate (skipped, and counted)."""
    return addition_pool(path, n, lambda a, b, i: [
        f"The answer is \\\\boxed{{{a + b}}}.", f"Let us think. {a} + {b} = {a + b}. The answer is \\\\boxed{{{a + b}}}.",
        *([""] if empty_first and i == 0 else [])])


def answer_pool(path) -> Path:
    """48 problems "what is a + b?", each with two right candidates: the proxies' pool of the
    calibration tests (run with CALIBRATE_SMALL)."""
    return addition_pool(path, 48, lambda a, b, i: [f"{a + b}", f"the answer is {a + b}"])


# `advisor calibrate`'s flags for a run of seconds on a CPU
CALIBRATE_SMALL = ["--epochs", "1", "--n-eval", "8", "--probe-steps", "2", "--probe-batch", "4", "--probe-eval-problems",
                   "4", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32"]


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
    from capacity_advisor.models.lab.ladder import student_path

    home = tmp_path_factory.mktemp(name)
    with advisor_home(home):
        for m in models:
            student_path(m)
    return home


# ---- the tiny teacher -------------------------------------------------------------------------------

# The lab teacher's recipe (its corpus: every procedure of every family; its rate and batch) at the
# shape of student `s` and a 40-step budget: 27,744 parameters, 113 kB of weights. Its build is kept in
# tests/data/lab/ (made by `pretrain_tiny_teacher`; tests/unit/test_tiny_teacher.py pretrains it again and
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

# The `timeout` of every process a test starts and waits for: a guard that ends a test which would
# never end (a hung launcher), not a measure of speed, so it lies far beyond what any of them takes
# on a loaded machine; a test asserts what a process did, never how long it took.
HANG_S = 1800


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


# sitecustomize for the processes of a run a test kills: right after a file whose path matches
# ADVISOR_TEST_FREEZE_AT (a regular expression) is renamed into place (a checkpoint's marker, written last), rank 0 writes
# ADVISOR_TEST_FREEZE_FLAG and stops there for good, so the test kills the run at that exact point,
# however fast or slow the machine, instead of wherever its polling happens to catch it.
FREEZE = """
import os, re, time

_replace = os.replace


def _replace_then_freeze(src, dst, *args, **kwargs):
    _replace(src, dst, *args, **kwargs)
    flag = os.environ["ADVISOR_TEST_FREEZE_FLAG"]
    if (re.fullmatch(os.environ["ADVISOR_TEST_FREEZE_AT"], os.fspath(dst)) and os.environ.get("RANK", "0") == "0"
            and not os.path.exists(flag)):
        with open(flag + ".tmp", "w") as f:
            f.write(os.fspath(dst))
        _replace(flag + ".tmp", flag)
        while True:
            time.sleep(3600)


os.replace = _replace_then_freeze
"""


def frozen_at(folder: Path, pattern: str, env: dict) -> tuple[dict, Path]:
    """(`env` for a run that stops for good right after rank 0 writes a file whose whole path matches
    `pattern` (a regular expression), the flag file that says it has): the sitecustomize FREEZE in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(FREEZE)
    flag = folder / "frozen"
    path = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "ADVISOR_TEST_FREEZE_AT": pattern, "ADVISOR_TEST_FREEZE_FLAG": str(flag)}, flag


def kill_when_frozen(proc, flag: Path) -> str:
    """Wait for a run started with `frozen_at`'s env to reach its point (or fail: the run ended first),
    then kill it whole (kill_tree); the path it stopped after."""
    import time

    try:
        while not flag.exists():
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else "")[-3000:]
            time.sleep(0.05)
    finally:
        kill_tree(proc)
    return flag.read_text()


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
# seconds where the whole table takes minutes; tests/stored/test_stored_cv.py checks the whole table.
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


# ---- synthetic records with a known rule (the predictor's and recommend's tests) -------------------

# capacity in "lab units": students below 6 cannot use low-likelihood data; at 6 and above they can
SIZES = {f"s{i}": 10 ** lp for i, lp in enumerate((4.0, 4.5, 5.0, 5.5, 6.5, 7.0, 7.5, 8.0))}


def rule_curve(strategy, capable, rng, epochs=5):
    """Accuracy per quarter epoch. High: fast rise to a ceiling. Low: slow start, higher ceiling when capable."""
    out = [{"epoch": 0.0, "step": 0, "accuracy": 0.0}]
    for q in range(1, 4 * epochs + 1):
        e = q / 4
        if strategy == "high":
            acc = 0.5 * (1 - math.exp(-2.0 * e))
        elif strategy == "low":
            acc = (0.8 if capable else 0.3) * (1 - math.exp(-0.45 * e))
        else:
            acc = 0.45 * (1 - math.exp(-1.0 * e))
        out.append({"epoch": e, "step": q * 10, "accuracy": round(acc + rng.uniform(-0.005, 0.005), 4)})
    return out


def probe_features(lp, rng):
    """What a probe would see: low data moves capable students' answers, small ones repeat."""
    c = lp - 4
    return {"gap_answer_logprob_area_gain": 0.3 * (c - 2) + rng.uniform(-0.05, 0.05),
            "low_repetition_area": max(0.0, 0.6 - 0.15 * c) + rng.uniform(0, 0.02),
            "low_teacher_nll_drop_rel": 0.05 * c + rng.uniform(-0.01, 0.01),
            "likelihood_gap_per_token": 0.5 + rng.uniform(-0.1, 0.1)}


def make_records(seeds=(0, 1)):
    recs = []
    for name, n in SIZES.items():
        lp = math.log10(n)
        for seed in seeds:
            rng = random.Random(f"{name}-{seed}")
            feats = probe_features(lp, rng)
            for s in ("high", "low", "mixed"):
                recs.append({"model": {"spec": f"lab:{name}", "n_params": int(n), "hidden_size": 64, "n_layers": 2},
                             "pool": {"fingerprint": "p", "task": "synthetic", "score": "sum"},
                             "settings": {"seed": seed}, "strategy": s, "features": feats,
                             "evals": rule_curve(s, lp >= 6, rng)})
    return recs


# ---- manifests: one set; D_high against D_low; races' curves -------------------------------------

def write_data(folder: Path, n_train: int = 16, n_eval: int = 4) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for i in range(n_train):
            f.write(json.dumps({"id": str(i), "k": 0, "prompt": f"Question: what is 12 + {i}? Answer:",
                                "completion": f" Let us think step by step. \\boxed{{{12 + i}}}"}) + "\n")
    with open(folder / "eval.jsonl", "w") as f:
        for i in range(n_eval):
            f.write(json.dumps({"prompt": f"Question: what is 35 + {i}? Answer:", "answer": str(35 + i)}) + "\n")


def make_manifest(folder: Path, model: str, **training) -> Path:
    write_data(folder)
    t = dict(epochs=2, learning_rate=1e-3, batch_size=4, evals_per_epoch=4, save_total_limit=2, warmup_ratio=0.0)
    t.update(training)
    m = Manifest(model={"spec": model}, dataset="train.jsonl", strategy="high",
                 eval=EvalSpec(path="eval.jsonl", checker="math", max_new_tokens=8),
                 training=TrainingSpec(**t), features={"probe_feature": 1.0}, pool={"problems": 16})
    return m.to_json(folder / "recommendation.json")


def write_set(path: Path, answer: int, n: int = 16) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": str(i), "k": 0, "prompt": f"Question: what is 12 + {i}? Answer:",
                                "completion": f" \\boxed{{{answer}}}"}) + "\n")


def race_manifest(folder: Path, model: str, high: int = 7, low: int = 3, **changes) -> Path:
    """A manifest of D_high (dataset, strategy high) that names D_low under sets; 2 epochs of 4 steps."""
    folder.mkdir(parents=True, exist_ok=True)
    write_set(folder / "train-high.jsonl", high)
    write_set(folder / "train-low.jsonl", low)
    with open(folder / "eval.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"Question: what is 35 + {i}? Answer:", "answer": "7"}) + "\n")
    m = Manifest(model={"spec": model}, dataset="train-high.jsonl", strategy="high", sets={"low": "train-low.jsonl"},
                 eval=EvalSpec(path="eval.jsonl", checker="math", max_new_tokens=8),
                 training=TrainingSpec(epochs=2, learning_rate=3e-3, batch_size=4, evals_per_epoch=4,
                                       save_total_limit=2, warmup_ratio=0.0))
    for key, value in changes.items():
        setattr(m, key, value)
    return m.to_json(folder / "recommendation.json")


def race_curve(correct: list[list[int]]) -> list[dict]:
    rows = [{"step": 0, "epoch": 0.0, "accuracy": 0.0}]
    for i, c in enumerate(correct, 1):
        rows.append({"step": i, "epoch": i / 4, "accuracy": sum(c) / len(c), "per_problem": {"correct": [bool(x) for x in c]}})
    return rows


RACE_MANIFEST = Manifest(model={"spec": "lab:s"}, dataset="train.jsonl", training=TrainingSpec(epochs=2, evals_per_epoch=4))


# ---- prompt/response pairs the scorers are checked on ---------------------------------------------

PAIRS = [
    ("what is 12 + 35?", "Answer: 47."),
    ("Let us think", " step by step. First add the tens, then the units. " * 4),
    ("Question: 1", "0123456789"),
    ("quick brown fox", "jumps over the lazy dog"),
    ("x", "y"),
]


# ---- predictor files ------------------------------------------------------------------------------


def resign(raw: dict) -> dict:
    """A predictor file's body (any `sha256` in it dropped) with the checksum Predictor.load checks,
    so that a test's change to the body is refused for what it changed, not for the checksum."""
    body = {k: v for k, v in raw.items() if k != "sha256"}
    return {"sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(), **body}


# ---- a tiny GGUF model file (models.gguf, the pretrained students) ----------------------------------


def write_tiny_gguf(path, seed: int = 0, qtype: str = "Q4_1", hidden: int = 32, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, source=None) -> Path:
    """A tiny Llama GGUF file at `path`, written with the gguf package's GGUFWriter as llama.cpp writes
    one: random weights (seed `seed`), the query and key projections in llama.cpp's rotary order, the
    2-D weights quantized to `qtype` ("F32" keeps them as they are; "Q4_1" is the real pretrained
    student's type), and in the metadata a byte-level BPE tokenizer (tokenizer.ggml.model "gpt2":
    tokens, token types, merges, BOS <|im_start|>, EOS <|im_end|>, pad) with the ChatML template
    CHAT_TEMPLATE. `source`: a folder to save the Hugging Face model and tokenizer it was written from
    (the same logits as the file, exactly when `qtype` is "F32"). Everything transformers' GGUF reader
    needs for a llama file (the llama.* shape keys, the tensor names of gguf's own name map) is there."""
    import gguf
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, quants
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tok = make_tokenizer(chat=True)
    state = json.loads(tok.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "the tokenizer's ids have gaps"
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    specials = {a["content"] for a in state["added_tokens"] if a["special"]}

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<pad>"])
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms of ones would hide a norm read wrongly
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)

    def rotary_order(w, n_head):  # llama.cpp's convert_hf_to_gguf permute; transformers reverses it
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    qt = getattr(GGMLQuantizationType, qtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<pad>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for hf_name, t in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        a = t.numpy().astype(np.float32)
        if hf_name.endswith("self_attn.q_proj.weight"):
            a = rotary_order(a, heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            a = rotary_order(a, kv_heads)
        name = f"{names.get_name(base)}.{suffix}"
        if a.ndim == 2 and qt != GGMLQuantizationType.F32:
            w.add_tensor(name, quants.quantize(a, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if source is not None:
        model.save_pretrained(source)
        tok.save_pretrained(source)
    return path
