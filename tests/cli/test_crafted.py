"""Crafted artifacts a user might be handed: manifests with wrong types and hostile strings, model
folders whose config points at code, chat templates that try to leave the Jinja sandbox. Each
must end in one InputError line (or load safely): no other exception, no hang, no code run."""

import contextlib
import json
import signal

import pytest

from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import load_manifest

GOOD = {"version": 1, "model": {"spec": "lab:xs"}, "dataset": "train.jsonl", "strategy": "high",
        "eval": {"path": None, "checker": "none"}, "training": {"epochs": 2}}

# (where the bad value goes, the value, the field the error must name)
BAD_FIELDS = [
    ("dataset", 123, "dataset"), ("dataset", ["a"], "dataset"), ("dataset", {"a": 1}, "dataset"), ("dataset", True, "dataset"),
    ("dataset", "a" * 5000, "dataset"), ("dataset", "x\x00y", "dataset"), ("dataset", "/" + "a/" * 3000, "dataset"),
    ("eval", {"path": ["a"]}, "eval.path"), ("eval", {"path": 7}, "eval.path"), ("eval", {"path": {"x": 1}}, "eval.path"),
    ("eval", ["a"], "eval"), ("eval", "none", "eval"),
    ("eval", {"checker": ["lab"]}, "eval.checker"), ("eval", {"checker": {"x": 1}}, "eval.checker"),
    ("eval", {"max_new_tokens": "5"}, "eval.max_new_tokens"), ("eval", {"max_new_tokens": True}, "eval.max_new_tokens"),
    ("eval", {"temperature": "0"}, "eval.temperature"), ("eval", {"limit": 1.5}, "eval.limit"),
    ("eval", {"limit": False}, "eval.limit"),
    ("model", 123, "model"), ("model", ["lab:xs"], "model"), ("model", {"spec": 5}, "model.spec"),
    ("model", {"spec": ["lab:xs"]}, "model.spec"), ("model", {"spec": {"a": 1}}, "model.spec"),
    ("strategy", ["high"], "strategy"), ("strategy", {"high": 1}, "strategy"), ("strategy", 5, "strategy"),
    ("mix", "0.5", "mix"), ("mix", [0.5], "mix"), ("mix", 10 ** 400, "mix"),
    ("training", {"epochs": "3"}, "training.epochs"), ("training", {"epochs": 10 ** 400}, "training.epochs"),
    ("training", {"epochs": None}, "training.epochs"), ("training", {"learning_rate": None}, "training.learning_rate"),
    ("training", {"batch_size": True}, "training.batch_size"), ("training", {"max_length": True}, "training.max_length"),
    ("training", {"save_total_limit": True}, "training.save_total_limit"), ("training", {"seed": "0"}, "training.seed"),
    ("training", {"seed": 1.5}, "training.seed"), ("training", {"gradient_checkpointing": "yes"}, "training.gradient_checkpointing"),
    ("training", {"lr_scheduler": ["cosine"]}, "training.lr_scheduler"), ("training", {"lr_scheduler": {"a": 1}}, "training.lr_scheduler"),
    ("training", {"switch_epoch": "1"}, "training.switch_epoch"), ("training", {"weight_decay": None}, "training.weight_decay"),
    ("training", {"warmup_ratio": [0]}, "training.warmup_ratio"),
    ("training", {"eval_at": 0.5}, "training.eval_at"), ("training", {"eval_at": [0]}, "training.eval_at"),
    ("training", {"eval_at": ["0.5"]}, "training.eval_at"), ("training", {"eval_at": [0.5] * 17}, "training.eval_at"),
    ("training", {"lora": []}, "training.lora"), ("training", {"lora": {"r": True}}, "training.lora"),
    ("training", {"lora": {"r": 8, "alpha": "16"}}, "training.lora.alpha"),
    ("training", {"lora": {"r": 8, "dropout": [0]}}, "training.lora.dropout"),
    ("training", {"lora": {"r": 8, "target_modules": 5}}, "training.lora.target_modules"),
    ("training", ["epochs"], "training"), ("training", 3, "training"),
    ("probabilities", [0.5], "probabilities"), ("reasons", "because", "reasons"), ("features", 5, "features"),
    ("pool", "pool.jsonl", "pool"), ("crossover_epoch", "2", "crossover_epoch"), ("confidence", 5, "confidence"),
    ("version", "1", "version"), ("version", [1], "version"),
    # strings that would smuggle lines into the exported YAML configs or the terminal
    ("model", {"spec": "lab:xs\nlearning_rate: 1"}, "model.spec"), ("dataset", "train.jsonl\nx", "dataset"),
    ("eval", {"path": ""}, "eval.path"), ("eval", {"path": "\x1b[2Jeval.jsonl"}, "eval.path"),
]


def write(tmp_path, manifest_text):
    (tmp_path / "train.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    path = tmp_path / "recommendation.json"
    path.write_bytes(manifest_text if isinstance(manifest_text, bytes) else manifest_text.encode())
    return path


def test_the_base_manifest_is_good(tmp_path):
    assert load_manifest(write(tmp_path, json.dumps(GOOD))).dataset == "train.jsonl"


@pytest.mark.parametrize("key,value,field", BAD_FIELDS, ids=[f"{k}={str(v)[:30]!r}" for k, v, _ in BAD_FIELDS])
def test_wrong_types_are_one_input_error_naming_the_field(tmp_path, key, value, field):
    d = dict(GOOD)
    if key in ("eval", "training") and isinstance(value, dict):
        value = {**GOOD[key], **value}
    d[key] = value
    with pytest.raises(InputError) as e:
        load_manifest(write(tmp_path, json.dumps(d)))
    msg = str(e.value)
    assert f"{field}:" in msg and "\n" not in msg and len(msg) < 2000, msg


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"version": 1, "mix": ' + "9" * 5000 + "}",
    b'{"version": 1, "dataset": "\xff\xfe"}',
    '{"version": 1, "model": {"spec": "lab:xs"}, "dataset": ',
    "",
    "[]",
    "null",
], ids=["deep", "huge-int", "bad-utf8", "truncated", "empty", "array", "null"])
def test_unreadable_manifests_are_one_input_error(tmp_path, text):
    with pytest.raises(InputError) as e:
        load_manifest(write(tmp_path, text))
    assert "\n" not in str(e.value)


def test_hostile_strings_are_shown_short_and_on_one_line(tmp_path):
    d = {**GOOD, "strategy": "\x1b[2J\nrm -rf /\r" + "x" * 100_000, "evil\nkey": 1}
    with pytest.raises(InputError) as e:
        load_manifest(write(tmp_path, json.dumps(d)))
    msg = str(e.value)
    assert "strategy:" in msg and "\n" not in msg and "\x1b" not in msg and len(msg) < 2000


# ---- model folders whose config points at code -------------------------------------------------

EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("code from the model folder ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilConfig(LlamaConfig):
    model_type = "evil"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def evil_folder(src, dest, marker, model_type=None):
    """A copy of a tiny model whose config.json and tokenizer_config.json map every Auto class to
    evil.py, which leaves `marker` behind when imported."""
    import shutil

    shutil.copytree(src, dest)
    (dest / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    cfg = json.loads((dest / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    if model_type:
        cfg["model_type"] = model_type
    (dest / "config.json").write_text(json.dumps(cfg))
    tok = json.loads((dest / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (dest / "tokenizer_config.json").write_text(json.dumps(tok))
    return dest


@pytest.mark.parametrize("weights", [True, False])
def test_a_known_architecture_with_auto_map_loads_the_stock_class(tiny_llama, tmp_path, monkeypatch, weights):
    from pathlib import Path

    from capacity_advisor.models.loading import load_model

    monkeypatch.setattr("sys.stdin", None)  # transformers would ask "run the custom code? [y/N]" on a terminal
    folder = evil_folder(Path(tiny_llama), tmp_path / "model", tmp_path / "MARKER")
    lm = load_model(str(folder), device="cpu", weights=weights)
    assert type(lm.model).__name__ == "LlamaForCausalLM" and "Evil" not in type(lm.tokenizer).__name__
    assert not (tmp_path / "MARKER").exists()


def test_an_unknown_architecture_with_auto_map_is_refused_in_one_line(tiny_llama, tmp_path):
    from pathlib import Path

    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    folder = evil_folder(Path(tiny_llama), tmp_path / "model", tmp_path / "MARKER", model_type="evil")
    (tmp_path / "pool.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    r = CliRunner().invoke(cli, ["score", "-m", str(folder), "-p", str(tmp_path / "pool.jsonl"), "-o", str(tmp_path / "out")],
                           input="y\ny\n")  # were transformers to ask, it would be told yes
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "never does" in r.stderr, r.stderr
    assert not (tmp_path / "MARKER").exists() and not (tmp_path / "out").exists()


def test_vllm_is_told_not_to_run_model_code(tiny_llama, monkeypatch):
    import fake_vllm
    from capacity_advisor.models.loading import load_model
    from capacity_advisor.models.vllm import VLLMBackend

    fake_vllm.install(monkeypatch)
    assert VLLMBackend(load_model(tiny_llama, device="cpu", weights=False))._engine_args["trust_remote_code"] is False


# ---- chat templates that try to leave the Jinja sandbox ------------------------------------------

TEMPLATES = {
    "class walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler globals": "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "lipsum globals": "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "joiner globals": "{{ joiner.__init__.__globals__.__builtins__.open('MARKER', 'w') }}",
    "attr filter": "{{ (messages|attr('__class__')).__base__.__subclasses__() }}",
    "format escape": "{{ '{0.__class__.__base__.__subclasses__}'.format(messages) }}x{{ raise_exception('no') }}",
    "raise_exception": "{{ raise_exception('this template refuses') }}",
    "syntax error": "{% for m in messages %}",
    "division by zero": "{{ 1 / 0 }}",
    "huge range": "{% for i in range(10 ** 9) %}{% endfor %}",
    "endless recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "endless loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}


@contextlib.contextmanager
def hang_guard(seconds: int):
    """Fail the test (an alarm in the main thread) if the block has not ended after `seconds`:
    a guard against hanging, not a measure of speed."""
    def ring(signum, frame):
        pytest.fail(f"still running after {seconds} s: it hangs")  # not an Exception: nothing swallows it

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_hostile_chat_templates_are_one_input_error(tiny_qwen, tmp_path, monkeypatch, name):
    import shutil

    from capacity_advisor.models.loading import load_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("capacity_advisor.models.template.TEMPLATE_SECONDS", 1.0)
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATES[name])
    with hang_guard(120), pytest.raises(InputError) as e:  # a template that hangs fails here, never hangs the suite
        load_model(str(folder), device="cpu")
    assert "chat template" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "MARKER").exists()
