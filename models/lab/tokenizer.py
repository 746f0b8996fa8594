"""The lab's character-level tokenizer, as an ordinary Hugging Face `PreTrainedTokenizerFast`.

One token per character of `tasks.ALPHABET`, plus <pad> <s> </s> <unk>. Decoding concatenates
characters (no spaces). Encoding with special tokens prepends BOS (as most HF tokenizers do), so `models.template`'s
plain prompt/response join gives `<s> prompt response [</s>]`.
"""

from __future__ import annotations

from capacity_advisor.models.lab.tasks import ALPHABET

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def vocab() -> dict[str, int]:
    toks = list(SPECIALS) + list(ALPHABET)
    return {t: i for i, t in enumerate(toks)}


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    bos = vocab()["<s>"]
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=128,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
