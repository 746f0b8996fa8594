"""The backends that score and generate with a student or a teacher, and the one table naming them.

    backend = make_backend("hf", lm, token_budget=4096)
    rows = backend.score([(prompt, response)], max_length=4096)        # response-token log-probs
    outs = backend.generate(prompts, max_new_tokens=256, details=True)  # completions

`hf` (plain transformers, any device, the model already in memory) serves everything, and is
the only one a training process uses, since it works on the weights being trained. `vllm` (GPUs,
its own engine and memory) serves `advisor score` and `advisor generate` at scale. The heavy
import happens only when a backend is chosen.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from capacity_advisor.core.errors import InputError

BACKENDS = {"hf": "capacity_advisor.models.hf:HFBackend", "vllm": "capacity_advisor.models.vllm:VLLMBackend"}
Progress = Callable[[int], None]  # called with the number of items just finished
# Prompt + response tokens a backend scores when its caller names no length (longer pairs are cut
# and flagged); the real probe recipe's scoring length (`probes.recipe.REAL.score_length`) is this.
SCORE_LENGTH = 4096
NEW_TOKENS = 256  # new tokens per completion when a caller names no bound (generation, a manifest's evaluations)


@dataclass(frozen=True)
class VLLMDefaults:
    """vLLM's settings when a caller leaves them unset; the one place they are written."""

    token_budget: int = 8192  # max_num_batched_tokens: tokens per scheduler step (prefill is chunked to it)
    gpu_memory_utilization: float = 0.9  # share of each GPU's memory the engine may take
    tensor_parallel_size: int = 1  # GPUs one model is split over
    # vLLM's CPU build reads gpu_memory_utilization as a share of the machine's RAM, and its worker
    # refuses to start unless that much is free (0.9 seldom is).
    cpu_memory_utilization: float = 0.2
    # ... and sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) when that is set: room for
    # `cpu_kvcache_sequences` sequences of the model's full length, at least `cpu_kvcache_min_gib`.
    cpu_kvcache_min_gib: int = 1
    cpu_kvcache_sequences: float = 1.25

    def budget(self, given: int | None, at_least: int = 1) -> int:
        """The engine's token budget: `given`, else the default; never below `at_least` (generation
        needs room for a prompt and all its new tokens in one step's budget)."""
        return max(given or self.token_budget, at_least)

    def memory_share(self, given: float | None, on_cpu: bool) -> float:
        """gpu_memory_utilization: `given`, else the default of the platform vLLM runs on."""
        if given is not None:
            return given
        return self.cpu_memory_utilization if on_cpu else self.gpu_memory_utilization


VLLM_DEFAULTS = VLLMDefaults()


class Backend(Protocol):
    """What the rest of the code needs from a backend: these two calls, nothing else."""

    name: str

    def score(self, pairs: Sequence[tuple[str, str]], max_length: int = SCORE_LENGTH,
              progress: Progress | None = None) -> list[dict]:
        """Per (prompt, response): n_tokens, logprob_sum, logprob_mean, truncated (the response's tokens only)."""

    def generate(self, prompts: Sequence[str], max_new_tokens: int = NEW_TOKENS, temperature: float = 0.0, n: int = 1,
                 seed: int = 0, progress: Progress | None = None, top_p: float = 1.0,
                 details: bool = False) -> list[list]:
        """`n` completions per prompt; with `details`, dicts of text, n_tokens and finished."""


VLLM_ENGINE_SETTINGS = ("tensor_parallel_size", "gpu_memory_utilization", "seed")  # read from a verb's settings


def backend_from(name: str, lm, cfg, vllm: dict | None = None, **common) -> Backend:
    """The backend `name` around `lm`, built from a verb's settings `cfg` (score, generate,
    recommend): its token budget, and for vllm its engine settings (`VLLM_ENGINE_SETTINGS`, then
    `vllm`'s); `common` goes to either backend. The one place a verb's backend is built."""
    kw = {"token_budget": cfg.token_budget, **common}
    if name == "vllm":
        kw.update({k: getattr(cfg, k) for k in VLLM_ENGINE_SETTINGS}, **(vllm or {}))
    return make_backend(name, lm, **kw)


def make_backend(name: str, lm, **kwargs) -> Backend:
    """The backend `name` around the loaded model `lm` (for vllm: its description and tokenizer)."""
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}: use {' or '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(lm, **kwargs)
