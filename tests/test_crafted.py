"""Crafted artifacts a user might be handed: manifests with wrong types and hostile strings, model
folders whose config points at code, chat templates that try to leave the Jinja sandbox. Each
must end in one InputError line (or load safely): no other exception, no hang, no code run."""

import json

import pytest

from models.errors import InputError
from training.manifest import load_manifest

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
