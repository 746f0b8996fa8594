"""The `vllm` backend: response-token log-probs and batched sampling on GPUs with vLLM.

    from capacity_advisor.models.loading import load_model
    from capacity_advisor.models.vllm import VLLMBackend
    lm = load_model("Qwen/Qwen2.5-1.5B", weights=False)          # tokenizer + description only
    be = VLLMBackend(lm, tensor_parallel_size=2)
    rows = be.score([(prompt, response)], max_length=16384)        # same rows as HFBackend.score

Scoring sends each pair as token ids (`TokensPrompt`), encoded by the same rule as the hf backend
(`models/template.py`), with `SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)`:
vLLM returns, for every prompt position, the log-prob of the token actually there, and we sum the
response positions. vLLM batches and chunks the prefill itself (`token_budget` becomes its
`max_num_batched_tokens`), so long traces never hold a (sequence x vocabulary) tensor at once.
Generation renders prompts the same way and returns the same layout as `HFBackend.generate`.

vLLM pins its own torch and transformers, so it lives in its own environment (docs/vllm.md). It
is imported only when this backend is built; without it, or without a CUDA GPU, the user gets one
line saying what to do. `ADVISOR_VLLM_ALLOW_CPU=1` skips the GPU check (vLLM's CPU build; tests).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from capacity_advisor.models.backends import VLLM_DEFAULTS
from capacity_advisor.models.errors import InputError
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.models.hf import score_row
from capacity_advisor.models.template import Encoded, encode_pair, prompt_ids

Progress = Callable[[int], None]

INSTALL_HINT = "install it in its own environment (`make vllm-env`, see docs/vllm.md), or use --backend hf"


def import_vllm():
    """The vllm module, or an InputError a user can act on."""
    try:
        import vllm
    except ImportError as e:
        raise InputError(f"--backend vllm needs the vllm package, which is not importable here ({e}); {INSTALL_HINT}") from None
    if os.environ.get("ADVISOR_VLLM_ALLOW_CPU") != "1":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--backend vllm needs a CUDA GPU and none is visible; use --backend hf here "
                             "(or set ADVISOR_VLLM_ALLOW_CPU=1 with vLLM's CPU build)")
    return vllm


def _tokens_prompt(ids: list[int]):
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # very old releases took a plain dict
        return {"prompt_token_ids": ids}
    return TokensPrompt(prompt_token_ids=ids)


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        lm: LoadedModel,
        token_budget: int | None = None,
        tensor_parallel_size: int = VLLM_DEFAULTS.tensor_parallel_size,
        gpu_memory_utilization: float = VLLM_DEFAULTS.gpu_memory_utilization,
        max_model_len: int | None = None,
        seed: int = 0,
        engine: Any = None,
        skip_tokens: int = 0,
        **engine_kwargs,
    ):
        """`lm` needs only its tokenizer and description (load it with `weights=False`).

        `engine` reuses an existing `vllm.LLM`; otherwise one is built on first use from the
        model's folder or hub id, in the dtype of `lm`'s description. Settings left unset take
        `models.backends.VLLM_DEFAULTS`.
        """
        self.vllm = import_vllm()
        self.lm = lm
        self.skip_tokens = skip_tokens
        self.token_budget = token_budget = VLLM_DEFAULTS.budget(token_budget)
        self._engine = engine
        self._engine_args = dict(
            model=lm.path or lm.spec,  # a local folder (lab students included) or a hub id
            tokenizer=lm.path or lm.spec,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=lm.description.get("dtype", "auto"),
            seed=seed,
            trust_remote_code=False,  # model folders are data: never run their auto_map code
            max_num_batched_tokens=token_budget,
            enable_chunked_prefill=True,
            **({"max_model_len": max_model_len} if max_model_len else {}),
            **engine_kwargs,
        )

    @property
    def engine(self):
        if self._engine is None:
            try:
                self._engine = self.vllm.LLM(**self._engine_args)
            except (OSError, ValueError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise InputError(f"vLLM could not load {self._engine_args['model']!r}: {first}") from None
        return self._engine

    # ---- scoring -------------------------------------------------------------------------
    def encode(self, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Encoded]:
        return [encode_pair(self.lm.tokenizer, p, r, max_length) for p, r in pairs]

    def score(self, pairs: Sequence[tuple[str, str]], max_length: int = 4096, progress: Progress | None = None) -> list[dict]:
        """Per pair: n_tokens, logprob_sum, logprob_mean (per response token), truncated."""
        return self.score_encoded(self.encode(pairs, max_length), progress)

    def score_encoded(self, encoded: Sequence[Encoded], progress: Progress | None = None) -> list[dict]:
        params = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out: list[dict] = []
        # vLLM schedules the whole list itself; we hand it slices only to report progress.
        step = max(1, min(len(encoded), 256))
        for s in range(0, len(encoded), step):
            chunk = encoded[s:s + step]
            results = self.engine.generate([_tokens_prompt(e.input_ids) for e in chunk], params, use_tqdm=False)
            for e, res in zip(chunk, results):
                vals = response_logprobs(e, res.prompt_logprobs, self.skip_tokens)
                out.append(score_row(e, sum(v[0] for v in vals), sum(v[1] for v in vals), len(vals), self.lm.tokenizer))
            if progress:
                progress(len(chunk))
        return out

    # ---- generation ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        n: int = 1,
        seed: int = 0,
        progress: Progress | None = None,
        top_p: float = 1.0,
        details: bool = False,
    ) -> list[list]:
        """n completions per prompt (greedy when temperature == 0); with `details`, dicts of
        text, n_tokens and finished (stopped on its own rather than at `max_new_tokens`)."""
        if temperature == 0 and n > 1:
            raise InputError("greedy decoding (temperature 0) gives one completion per prompt; set a temperature > 0 for n > 1")
        tok = self.lm.tokenizer
        requests = [_tokens_prompt(prompt_ids(tok, p)) for p in prompts]
        # one seed per request, derived from its position: results do not depend on batching
        params = [self.vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                           max_tokens=max_new_tokens, seed=seed + i, skip_special_tokens=True)
                  for i in range(len(prompts))]
        out: list[list] = []
        step = max(1, min(len(prompts), 256))
        for s in range(0, len(prompts), step):
            results = self.engine.generate(requests[s:s + step], params[s:s + step], use_tqdm=False)
            for res in results:
                comps = [{"text": c.text, "n_tokens": len(c.token_ids), "finished": c.finish_reason != "length"}
                         for c in res.outputs]
                out.append(comps if details else [c["text"] for c in comps])
            if progress:
                progress(len(results))
        return out


def response_logprobs(e: Encoded, prompt_logprobs, skip_tokens: int = 0) -> list[tuple[float, float]]:
    """(log-prob, rank) of each response token from vLLM's per-position prompt log-probs, the
    first `skip_tokens` left out.

    `prompt_logprobs[t]` is None for t = 0 and otherwise maps token ids to Logprob objects (or
    floats); with `prompt_logprobs=0` it holds exactly the token at position t, with its rank.
    """
    if prompt_logprobs is None:
        raise RuntimeError("vLLM returned no prompt log-probs; this vLLM build ignores prompt_logprobs")
    if len(prompt_logprobs) != len(e.input_ids):
        raise RuntimeError(f"vLLM returned {len(prompt_logprobs)} prompt log-probs for {len(e.input_ids)} tokens")
    vals = []
    for t in range(max(e.n_prompt, 1) + skip_tokens, len(e.input_ids)):
        lp = prompt_logprobs[t][e.input_ids[t]]
        rank = getattr(lp, "rank", None)
        vals.append((float(getattr(lp, "logprob", lp)), float(rank) if rank is not None else float("nan")))
    return vals
