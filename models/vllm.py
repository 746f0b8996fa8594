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
is imported only when this backend is built; without it, or without a CUDA GPU and without vLLM's
CPU build, the user gets one line saying what to do (`ADVISOR_VLLM_ALLOW_CPU=1` skips that check,
for the tests' stand-in engine).

On vLLM's CPU build the backend picks the settings that let the engine start there (a share of
system memory, `VLLM_CPU_KVCACHE_SPACE`) unless the user gave them, and refuses at once a model
whose head size the CPU attention kernels lack (vLLM itself would start and fail at the first
request). `chosen` holds every setting it picked with its source, for the "Settings chosen"
table. `start()` starts the engine and sends it one two-token request, so that an engine which
cannot run the model fails there, before any work is counted.

vLLM's own output (its log records, its engine processes' warnings, progress bars and tracebacks)
goes to one log file per process under `$ADVISOR_HOME/logs/`, never to stdout or the terminal,
unless the user configured vLLM's logging (`VLLM_LOGGING_CONFIG_PATH`, `VLLM_CONFIGURE_LOGGING`).
When the engine fails, the root cause is read back from that log and reaches the user as one
InputError line: a known failure (unsupported head size or architecture, not enough memory) says
what to do; any other names the exception and the log.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

from capacity_advisor.models.backends import NEW_TOKENS, SCORE_LENGTH, VLLM_DEFAULTS, Progress
from capacity_advisor.core.errors import InputError, one_line
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.models.hf import score_row
from capacity_advisor.models.template import Encoded, encode_pair, prompt_ids
from capacity_advisor.models.vllm_engine import (
    HF_HINT, KV_ENV, cpu_head_sizes, cpu_kv_cache_gib, engine_errors, engine_output, explain, generic_message, log_path,
    log_size, log_to, model_config, on_cpu_build, own_logging, read_log, root_cause, set_kv_space, shape, users_kv_space,
)


INSTALL_HINT = "install it in its own environment (`make vllm-env`, see docs/vllm.md), or use --backend hf"


def import_vllm():
    """The vllm module, or an InputError a user can act on."""
    if own_logging() and not logging.getLogger("vllm").handlers:
        # Records logged before vLLM configures its logging would reach the terminal through
        # Python's last-resort handler (its CPU build warns about Triton at import).
        logging.getLogger("vllm").addHandler(logging.NullHandler())
    try:
        import vllm
    except ImportError as e:
        raise InputError(f"--backend vllm needs the vllm package, which is not importable here ({e}); {INSTALL_HINT}") from None
    if os.environ.get("ADVISOR_VLLM_ALLOW_CPU") != "1" and not on_cpu_build():
        import torch

        if not torch.cuda.is_available():
            raise InputError("--backend vllm needs a CUDA GPU (or vLLM's CPU build, `make vllm-cpu-env`) and none is "
                             "visible; use --backend hf here")
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
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        engine: Any = None,
        skip_tokens: int = 0,
        min_token_budget: int = 1,
        **engine_kwargs,
    ):
        """`lm` needs only its tokenizer and description (load it with `weights=False`).

        `engine` reuses an existing `vllm.LLM`; otherwise one is built on first use from the
        model's folder or hub id, in the dtype of `lm`'s description. Settings left unset take
        `models.backends.VLLM_DEFAULTS` (on vLLM's CPU build, its CPU defaults); the token budget is
        never below `min_token_budget` (generation: a prompt and all its new tokens).
        """
        self.vllm = import_vllm()
        self.lm = lm
        self.skip_tokens = skip_tokens
        self.on_cpu = on_cpu_build()
        self.token_budget = VLLM_DEFAULTS.budget(token_budget, min_token_budget)
        share = VLLM_DEFAULTS.memory_share(gpu_memory_utilization, self.on_cpu)
        config = model_config(lm)
        budget_source = "--token-budget" if token_budget else "default"
        if self.token_budget > (token_budget or VLLM_DEFAULTS.token_budget):
            budget_source += ", raised to hold a prompt and all its new tokens"
        self.chosen = {
            "platform": {"value": "cpu" if self.on_cpu else "gpu", "source": "the installed vLLM build"},
            "gpu_memory_utilization": {"value": share, "source": "--gpu-memory-utilization" if gpu_memory_utilization is not None
                                       else "default of vLLM's CPU build (a share of system memory)" if self.on_cpu
                                       else "default"},
            "max_num_batched_tokens": {"value": self.token_budget, "source": budget_source},
        }
        self._kv_gib = None  # VLLM_CPU_KVCACHE_SPACE to set when the engine is built
        if self.on_cpu:
            self._check_cpu_head_size(config)
            if users_kv_space():
                kv = {"value": f"{os.environ[KV_ENV]} GiB", "source": f"{KV_ENV} (yours)"}
            elif gpu_memory_utilization is not None:
                kv = {"value": None, "source": "unset: vLLM sizes its cache from --gpu-memory-utilization"}
            else:
                self._kv_gib, why = cpu_kv_cache_gib(config, lm.description.get("dtype"), max_model_len)
                kv = {"value": f"{self._kv_gib} GiB", "source": f"default of vLLM's CPU build ({why})"}
            self.chosen[KV_ENV] = kv
        self.log_path = log_path() if own_logging() else None
        if self.log_path is not None:
            self.chosen["vllm_log"] = {"value": str(self.log_path), "source": "vLLM's own messages, kept off the terminal"}
        self._log_start = 0  # where this engine's part of the log begins
        self._engine = engine
        self._engine_args = dict(
            model=lm.path or lm.spec,  # a local folder (lab students included) or a hub id
            tokenizer=lm.path or lm.spec,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=share,
            dtype=lm.description.get("dtype", "auto"),
            seed=seed,
            trust_remote_code=False,  # model folders are data: never run their auto_map code
            max_num_batched_tokens=self.token_budget,
            enable_chunked_prefill=True,
            **({"max_model_len": max_model_len} if max_model_len else {}),
            **engine_kwargs,
        )

    def _check_cpu_head_size(self, config) -> None:
        """Refuse, before the engine starts, a model whose attention head size vLLM's CPU kernels
        lack (the engine itself would start and die at the first request)."""
        size = shape(config).get("head_size")
        supported = cpu_head_sizes()
        if size and supported and size not in supported:
            raise InputError(f"vLLM's CPU attention does not support head size {size} (this model's); it takes "
                             f"{', '.join(map(str, supported))}; {HF_HINT}")

    @property
    def engine(self):
        if self._engine is None:
            if self._kv_gib is not None and not users_kv_space():  # read by vLLM's CPU platform as the engine is configured
                set_kv_space(self._kv_gib)
            args = dict(self._engine_args)
            if self.log_path is not None:
                args.update(log_to(self.log_path))
                self._log_start = log_size(self.log_path)
            try:
                with engine_output(self.log_path):
                    engine = self.vllm.LLM(**args)
                # One two-token request: vLLM's CPU build, say, starts on a head size its attention
                # kernels lack and fails only when a request runs; this makes that a failure to start.
                probe = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
                engine.generate([_tokens_prompt([0, 1])], probe, use_tqdm=False)
            except engine_errors() as e:
                raise self.engine_error(e, starting=True) from None
            self._engine = engine
        return self._engine

    def start(self) -> "VLLMBackend":
        """Start the engine now (and see it answer a request), rather than at the first score."""
        self.engine
        return self

    def _run(self, requests, params) -> list:
        """One `LLM.generate` call; an engine failure becomes one InputError line."""
        engine = self.engine
        start = log_size(self.log_path)
        try:
            return engine.generate(requests, params, use_tqdm=False)
        except engine_errors() as e:
            self._log_start = start
            raise self.engine_error(e, starting=False) from None

    def engine_error(self, e: BaseException, starting: bool) -> InputError:
        """What the user is told when vLLM's engine fails: the root cause as vLLM logged it (its
        engine runs in other processes, so the exception here rarely carries it), explained."""
        cause = (type(e).__name__, one_line(str(e)))
        if generic_message(cause[1]):  # the engine's processes logged the cause; it is written by the time they die
            for _ in range(20):
                found = root_cause(read_log(self.log_path, self._log_start))
                if found or self.log_path is None:
                    break
                time.sleep(0.1)
            cause = found or cause
        where = f"vLLM's log: {self.log_path}" if self.log_path else "vLLM's log above"
        return InputError(explain(cause, starting, self._engine_args["model"], self.chosen, where))

    def close(self) -> None:
        """Stop the engine's processes now (else they stop when this process ends)."""
        engine, self._engine = self._engine, None
        core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # ---- scoring -------------------------------------------------------------------------
    def encode(self, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Encoded]:
        return [encode_pair(self.lm.tokenizer, p, r, max_length) for p, r in pairs]

    def score(self, pairs: Sequence[tuple[str, str]], max_length: int = SCORE_LENGTH, progress: Progress | None = None) -> list[dict]:
        """Per pair: n_tokens, logprob_sum, logprob_mean (per response token), truncated."""
        return self.score_encoded(self.encode(pairs, max_length), progress)

    def score_encoded(self, encoded: Sequence[Encoded], progress: Progress | None = None) -> list[dict]:
        params = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out: list[dict] = []
        # vLLM schedules the whole list itself; we hand it slices only to report progress.
        step = max(1, min(len(encoded), 256))
        for s in range(0, len(encoded), step):
            chunk = encoded[s:s + step]
            results = self._run([_tokens_prompt(e.input_ids) for e in chunk], params)
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
        max_new_tokens: int = NEW_TOKENS,
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
        # Texts are decoded here, by the rule the hf backend uses: vLLM's incremental detokenizer holds
        # back a last incomplete UTF-8 character (byte-level BPE), so its text could differ at the end.
        params = [self.vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                           max_tokens=max_new_tokens, seed=seed + i, detokenize=False)
                  for i in range(len(prompts))]
        out: list[list] = []
        step = max(1, min(len(prompts), 256))
        for s in range(0, len(prompts), step):
            results = self._run(requests[s:s + step], params[s:s + step])
            for res in results:
                comps = [{"text": tok.decode(list(c.token_ids), skip_special_tokens=True), "n_tokens": len(c.token_ids),
                          "finished": c.finish_reason != "length"} for c in res.outputs]
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
