"""models/gguf.py on a tiny Llama GGUF file (helpers.write_tiny_gguf: written with the gguf package's
GGUFWriter as llama.cpp writes one, a byte-level BPE tokenizer and a ChatML template in its metadata):
the converted folder loads as any model folder with the logits of transformers' own GGUF load, keeps
the chat template and EOS, is converted once, and every file that is not a readable GGUF is one
`error:` line of the CLI with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from capacity_advisor.models import gguf
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.loading import describe_config, load_model
from helpers import CHAT_TEMPLATE, Ran, addition_pool, advisor, build_tiny, one_error_line, write_tiny_gguf

PROMPT = "Question: what is 12 + 35? Answer: 47. Let us think step by step."
SMALL = ["--probe-steps", "2", "--probe-batch", "4", "--probe-eval-problems", "4", "--max-new-tokens", "8",
         "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny GGUF files: `q4` (the real student's Q4_1), `f32` (unquantized) and `source` (the
    Hugging Face folder `f32` was written from), each GGUF alone in its folder."""
    root = tmp_path_factory.mktemp("gguf")
    q4 = write_tiny_gguf(root / "q4" / "tiny.gguf")
    f32 = write_tiny_gguf(root / "f32" / "tiny-f32.gguf", qtype="F32", source=root / "source")
    return {"q4": q4, "f32": f32, "source": root / "source"}


def home() -> Path:
    return Path(os.environ["ADVISOR_HOME"])


def direct(path: Path):
    """transformers' own load of the GGUF file (dequantized to float32): (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def logits(model, tokenizer, text: str = PROMPT) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def nothing_converted() -> None:
    """No folder, finished or temporary, under $ADVISOR_HOME/gguf."""
    where = home() / "gguf"
    assert not where.exists() or not list(where.iterdir()), sorted(p.name for p in where.iterdir())


# ---- the tiny file itself -------------------------------------------------------------------------


def test_the_tiny_file_is_a_llama_gguf_transformers_reads_as_written(files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = direct(files["q4"])
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.model_type == "llama"
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (2, 32, 4, 2)
    assert c.quantization_config is not None  # the flag the conversion drops
    assert "<|endoftext|>" not in {t for t in tok.get_vocab() if tok.convert_tokens_to_ids(t) < c.vocab_size}
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>"
    # unquantized, the file is the model it was written from: the rotary order written as llama.cpp
    # writes it (and undone by transformers), the tokenizer the same tokens
    f32, f32_tok = direct(files["f32"])
    source = AutoModelForCausalLM.from_pretrained(files["source"], dtype=torch.float32).eval()
    source_tok = AutoTokenizer.from_pretrained(files["source"])
    assert f32_tok(PROMPT).input_ids == source_tok(PROMPT).input_ids
    assert torch.equal(logits(f32, f32_tok), logits(source, source_tok))
    # quantized to 4 bits it is near, not equal
    assert not torch.equal(logits(model, tok), logits(source, source_tok))


# ---- the converted folder -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["q4", "f32"])
def test_the_converted_folder_loads_with_the_logits_of_transformers_gguf_load(files, kind):
    path = files[kind]
    folder = gguf.gguf_folder(path)
    assert folder == home() / "gguf" / f"{path.stem}-{gguf.sha256(path)[:12]}"
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.gguf"))
    assert json.loads((folder / "source.json").read_text()) == {"gguf": path.name, "sha256": gguf.sha256(path)}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    ref, ref_tok = direct(path)
    for spec in (str(path), str(folder)):  # the .gguf spec resolves to the folder; the folder loads as any other
        lm = load_model(spec, device="cpu", dtype="float32")
        assert lm.description["path"] == str(folder) and lm.description["model_type"] == "llama"
        assert lm.description["n_params"] == sum(p.numel() for p in ref.parameters())
        assert lm.tokenizer(PROMPT).input_ids == ref_tok(PROMPT).input_ids
        torch.testing.assert_close(logits(lm.model, lm.tokenizer), logits(ref, ref_tok), rtol=1e-5, atol=1e-6)
    # transformers' own tokenizer adds GPT-2's <|endoftext|> past the embedding (the file's vocabulary
    # lacks it, as Llama 3's does); the converted one keeps to the model's vocabulary
    assert len(lm.tokenizer) == lm.model.config.vocab_size == ref.config.vocab_size
    text = "a <|endoftext|> b <|im_end|>"
    assert max(lm.tokenizer(text).input_ids) < lm.model.config.vocab_size
    assert logits(lm.model, lm.tokenizer, text).isfinite().all()
    if kind == "f32":  # and, unquantized, those of the model the file was written from
        source = load_model(str(files["source"]), device="cpu", dtype="float32")
        torch.testing.assert_close(logits(lm.model, lm.tokenizer), logits(source.model, source.tokenizer),
                                   rtol=1e-5, atol=1e-6)


def test_the_chat_template_and_eos_survive_the_conversion(files):
    lm = load_model(str(files["q4"]), device="cpu", dtype="float32")
    tok, model = lm.tokenizer, lm.model
    assert tok.chat_template == CHAT_TEMPLATE and lm.description["chat_template"] is True
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == eos
    assert model.config.eos_token_id == eos and model.generation_config.eos_token_id == eos
    assert model.config.bos_token_id == tok.convert_tokens_to_ids("<|im_start|>")
    text = tok.apply_chat_template([{"role": "user", "content": "what is 1 + 1?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nwhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids.count(eos) == 1  # no BOS added; specials whole


@pytest.mark.parametrize("kind", ["q4", "source"])
def test_the_config_only_description_says_what_the_loaded_tokenizer_says_of_its_template(files, kind, tmp_path):
    """`describe_config` (what `advisor recommend` writes into recommendation.json's model) reads the
    template's presence from the folder's files; a recommendation of the real student said null."""
    spec = str(files[kind])
    assert describe_config(spec)["chat_template"] is load_model(spec, device="cpu").description["chat_template"]
    plain = tmp_path / "plain"  # the same folder without its template: False, as the loaded tokenizer says
    shutil.copytree(gguf.gguf_folder(files["q4"]) if kind == "q4" else files["source"], plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert describe_config(str(plain))["chat_template"] is False
    assert load_model(str(plain), device="cpu").description["chat_template"] is False
    (plain / "tokenizer_config.json").write_text("{not json")  # unreadable: unknown, never a crash
    assert describe_config(str(plain))["chat_template"] is None
    from capacity_advisor.models.template import declared_chat_template

    (plain / "tokenizer_config.json").unlink()
    os.mkfifo(plain / "tokenizer_config.json")  # a FIFO is not waited on
    assert declared_chat_template(plain) is None


def test_a_tokenizer_beside_the_file_is_not_taken_for_the_files_own(files, tmp_path, monkeypatch):
    """A GGUF file in a folder that also holds another model's tokenizer and generation config
    converts to the same tokenizer as the file alone (transformers prefers the files beside it)."""
    beside = Path(build_tiny(tmp_path / "other-model", "llama", seed=3))  # tokenizer.json: BOS <s>, EOS </s>, no template
    shutil.copy(files["q4"], beside / files["q4"].name)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    lm = load_model(str(beside / files["q4"].name), device="cpu", dtype="float32")
    ref, ref_tok = direct(files["q4"])
    assert lm.tokenizer.chat_template == CHAT_TEMPLATE and lm.tokenizer.eos_token == "<|im_end|>"
    assert lm.tokenizer(PROMPT).input_ids == ref_tok(PROMPT).input_ids
    assert lm.model.generation_config.eos_token_id == ref.generation_config.eos_token_id
    torch.testing.assert_close(logits(lm.model, lm.tokenizer), logits(ref, ref_tok), rtol=1e-5, atol=1e-6)


# ---- converted once ---------------------------------------------------------------------------------


def test_the_conversion_is_cached_by_content(files, tmp_path, monkeypatch):
    said = []
    folder = gguf.gguf_folder(files["q4"], say=said.append)
    assert len(said) == 1 and "converting tiny.gguf" in said[0]
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def no_conversion(src):
        raise AssertionError(f"converted {src} again")

    monkeypatch.setattr(gguf, "_read", no_conversion)
    again = []
    assert gguf.gguf_folder(files["q4"], say=again.append) == folder and again == []
    copy = tmp_path / "elsewhere" / "tiny.gguf"  # the same content, another path: the same folder
    copy.parent.mkdir()
    shutil.copy(files["q4"], copy)
    assert gguf.gguf_folder(copy) == folder
    load_model(str(files["q4"]), device="cpu", dtype="float32")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temporary left beside it


def test_a_half_written_folder_does_not_count_as_converted(files, monkeypatch):
    path = files["q4"]
    dest = home() / "gguf" / f"{path.stem}-{gguf.sha256(path)[:12]}"
    # another process's temporary, killed before its rename (however complete it looks)
    stale = dest.parent / f".{dest.name}.tmp-999999999"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    (stale / "source.json").write_text("{}")
    # the folder itself, left without the source.json written last
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    assert not gguf.is_converted(dest)
    assert gguf.gguf_folder(path) == dest and gguf.is_converted(dest)
    assert (dest / "model.safetensors").is_file() and json.loads((dest / "config.json").read_text())["model_type"] == "llama"
    load_model(str(path), device="cpu", dtype="float32")


def test_an_interrupted_conversion_leaves_nothing_that_looks_finished(files, monkeypatch):
    read = gguf._read

    def dies_saving(src):
        model, tokenizer = read(src)

        def killed(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(tokenizer, "save_pretrained", killed)
        return model, tokenizer

    monkeypatch.setattr(gguf, "_read", dies_saving)
    with pytest.raises(KeyboardInterrupt):
        gguf.gguf_folder(files["q4"])
    nothing_converted()
    monkeypatch.setattr(gguf, "_read", read)
    assert gguf.is_converted(gguf.gguf_folder(files["q4"]))


# ---- files that are not a readable GGUF: one error line ------------------------------------------------


def truncated(files, folder: Path, size: int) -> Path:
    """The Q4_1 file cut to its first `size` bytes (negative: less its last -`size`)."""
    path = folder / "cut.gguf"
    path.write_bytes(files["q4"].read_bytes()[:size])
    return path


BAD = {
    "wrong-magic": (lambda files, d: _write(d / "notes.gguf", b"GGML" + b"\0" * 64), "not a GGUF file"),
    "empty": (lambda files, d: _write(d / "empty.gguf", b""), "not a GGUF file"),
    "directory": (lambda files, d: _mkdir(d / "folder.gguf"), "has no config.json"),
    "missing": (lambda files, d: d / "missing.gguf", "does not exist"),
    "truncated": (lambda files, d: truncated(files, d, files["q4"].stat().st_size // 2), "could not be read as a GGUF model"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("verb", ["probe", "recommend"])
@pytest.mark.parametrize("bad", list(BAD))
def test_a_model_that_is_not_a_readable_gguf_is_one_error_line(files, tmp_path, capsys, bad, verb):
    make, fragment = BAD[bad]
    model = make(files, tmp_path)
    pool = addition_pool(tmp_path / "pool.jsonl", 48, lambda a, b, i: [f"{a + b}", f"the answer is {a + b}"])
    out = tmp_path / "out"
    more = ["-b", "2"] if verb == "recommend" else []
    code, _, err = advisor(capsys, verb, "--model", model, "--pool", pool, *more, "--out", out, *SMALL)
    line = one_error_line(Ran(code, "", err), fragment, out)
    assert str(model) in line
    nothing_converted()


@pytest.mark.parametrize("size", [4, 8, 24, 200, 2000, -1])
def test_a_gguf_cut_anywhere_is_one_input_error_and_leaves_nothing(files, tmp_path, size):
    path = truncated(files, tmp_path, size)
    with pytest.raises(InputError, match="could not be read as a GGUF model") as e:
        gguf.gguf_folder(path)
    assert "\n" not in str(e.value)
    nothing_converted()


def test_a_hidden_gguf_package_is_one_line_naming_what_to_install(files, tmp_path, capsys, monkeypatch):
    import importlib.util

    pool = addition_pool(tmp_path / "pool.jsonl", 48, lambda a, b, i: [f"{a + b}", f"the answer is {a + b}"])
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "gguf", None)  # `import gguf` fails, find_spec finds nothing
        code, _, err = advisor(capsys, "probe", "--model", files["q4"], "--pool", pool, "--out", out, *SMALL)
        line = one_error_line(Ran(code, "", err), "needs the gguf package", out)
        assert "pip install 'gguf>=0.19'" in line
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(InputError, match=r"pip install 'gguf>=0\.19'"):
        gguf.gguf_folder(files["q4"])
    code, _, err = advisor(capsys, "recommend", "--model", files["q4"], "--pool", pool, "-b", "2", "--out", out, *SMALL)
    one_error_line(Ran(code, "", err), "pip install 'gguf>=0.19'", out)
    nothing_converted()
