"""A stand-in for the `vllm` package that keeps vLLM's offline API contract, computed with transformers.

It exists so the vllm backend's plumbing (requests, sampling params, token alignment, result
layout) is tested on machines without vLLM or a GPU. It implements only what the contract says:

- `LLM(model=..., **engine_args).generate(prompts, sampling_params, use_tqdm=...)` with prompts as
  `TokensPrompt` dicts and `sampling_params` one `SamplingParams` or one per prompt;
- `RequestOutput.prompt_logprobs`: None at position 0, then per position a dict holding the
  actual token's `Logprob` (plus the top `prompt_logprobs` others);
- `CompletionOutput(text, token_ids, finish_reason)` with finish_reason "stop" or "length".

The log-probs are a plain full-vocabulary log-softmax of one example at a time, independent of
the hf backend's gathered, chunked computation, so agreement between the two is a real check.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import torch

CALLS: list[dict] = []  # every generate call: what the backend asked the engine for
ENGINES: list["LLM"] = []


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    prompt_logprobs: int | None = None
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: None
    finish_reason: str


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


ENGINE_ARGS = {"model", "tokenizer", "tensor_parallel_size", "gpu_memory_utilization", "dtype", "seed",
               "max_num_batched_tokens", "enable_chunked_prefill", "max_model_len", "trust_remote_code"}


class LLM:
    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"unexpected engine arguments {sorted(unknown)}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.args = {"model": model, **kwargs}
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs.get("tokenizer") or model)
        ENGINES.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        assert len(params) == len(prompts), "one SamplingParams per prompt, or one for all"
        CALLS.append({"n_prompts": len(prompts), "params": params})
        return [self._one(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]

    def _one(self, rid: str, prompt: dict, sp: SamplingParams) -> RequestOutput:
        ids = list(prompt["prompt_token_ids"])
        with torch.no_grad():
            logp = self.model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
        plp = None
        if sp.prompt_logprobs is not None:
            plp = [None]
            for t in range(1, len(ids)):
                row = logp[t - 1]
                tok = ids[t]
                entry = {tok: Logprob(row[tok].item(), int((row > row[tok]).sum()) + 1)}
                for j in row.topk(sp.prompt_logprobs).indices.tolist() if sp.prompt_logprobs else []:
                    entry.setdefault(j, Logprob(row[j].item()))
                plp.append(entry)
        gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else 0)
        outs = [self._sample(ids, sp, gen, k) for k in range(sp.n)]
        return RequestOutput(rid, None, ids, plp, outs)

    def _sample(self, ids: list[int], sp: SamplingParams, gen, k: int) -> CompletionOutput:
        eos = self.tokenizer.eos_token_id
        seq, new, reason = list(ids), [], "length"
        with torch.no_grad():
            for _ in range(sp.max_tokens or 16):
                logits = self.model(torch.tensor([seq])).logits[0, -1].float()
                if sp.temperature == 0:
                    nxt = int(logits.argmax())
                else:
                    probs = (logits / sp.temperature).softmax(-1)
                    nxt = int(torch.multinomial(probs, 1, generator=gen))
                seq.append(nxt)
                new.append(nxt)
                if nxt == eos:
                    reason = "stop"
                    break
        text = self.tokenizer.decode(new, skip_special_tokens=sp.skip_special_tokens) if sp.detokenize else ""
        return CompletionOutput(k, text, new, None, None, reason)


def install(monkeypatch) -> types.ModuleType:
    """Put this module in place of `vllm` (and `vllm.inputs`) for one test."""
    CALLS.clear()
    ENGINES.clear()
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    mod.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setenv("ADVISOR_VLLM_ALLOW_CPU", "1")
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_CONFIG_PATH"):  # the backend may set these: undone after the test
        monkeypatch.delenv(name, raising=False)
    return mod
