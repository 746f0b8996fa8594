"""The score stage: every kept candidate of a pool scored under the student, cached in shards.

    advisor score --model lab:tiny --pool pool.jsonl --out runs/score

Work is cut into fixed shards of `shard_size` candidates in pool order. Each finished shard is
written atomically under `$ADVISOR_HOME/scores/<key>/`, where the key covers the model
fingerprint, the pool fingerprint, the prompt template, the max length and the dtype; the folder
records them (`producer.json`) and refuses to serve another run. A rerun (after a kill, or with a
new `--out`) skips finished shards; since a shard's contents and its batching depend only on its
own candidates, a resumed run ends with the same file as an uninterrupted one. Shards are named
by their candidate range and checked against it when read, so another `--shard-size` reuses only
what matches. `OUT/scores.jsonl` and `OUT/config.json` appear only once all shards exist.

Data parallelism: `dp_size` processes (one per GPU, say) each score the shards whose index is
`dp_rank` modulo `dp_size`, into the same cache; whichever finishes last finds every shard there
and writes the outputs. The result is the same file a single process writes.

    for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i advisor score ... --backend vllm --dp-rank $i --dp-size 4 & done; wait
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.pools.read import Pool
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    FORMAT_VERSION, check_writable_dir, recorded_key, versions, write_json, write_jsonl,
)
from capacity_advisor.core.shards import ShardPlan, cache_folder
from capacity_advisor.models import loading
from capacity_advisor.models.backends import BACKENDS, VLLM_DEFAULTS, backend_from
from capacity_advisor.models.local import local_logprobs
from capacity_advisor.models.template import check_prompts, template_id
from capacity_advisor.models.vllm import import_vllm
from capacity_advisor.probes.recipe import REAL

# The names a score folder's files give a scoring setting where they differ from ScoreConfig's
# (config.json's settings, the cache key): `max_length`, as every score folder and cache has named it.
SCORE_FILES = {"score_length": "max_length"}


@dataclass
class ScoreConfig:
    model: str  # --model: local folder, hub id, or lab:NAME
    device: str = "auto"  # --device auto|cpu|cuda
    dtype: str = "auto"  # --dtype auto|float32|bfloat16|float16 (auto: bf16 on GPU, fp32 on CPU)
    backend: str = "hf"  # --backend
    score_length: int = REAL.score_length  # --score-length: prompt + response tokens; longer responses are cut and flagged
    token_budget: int | None = None  # --token-budget: padded tokens per forward batch (None: the backend's default, models.backends)
    shard_size: int = 512  # --shard-size: candidates per cached shard (the unit of resume)
    seed: int = 0  # --seed (scoring is deterministic; recorded for provenance)
    tensor_parallel_size: int = VLLM_DEFAULTS.tensor_parallel_size  # --tensor-parallel-size (vllm): GPUs one model is split over
    gpu_memory_utilization: float | None = None  # --gpu-memory-utilization (vllm): share of GPU memory (None: the backend's)
    dp_rank: int = 0  # --dp-rank: this process's index among --dp-size scoring processes
    dp_size: int = 1  # --dp-size: processes sharing the pool's shards (data parallelism)
    skip_tokens: int = 0  # --skip-tokens: leave each response's first N tokens out of its score
    local_window: int = 0  # --local-window: also score every step with only this many tokens of context (LALP)
    def settings(self) -> dict:
        """The settings as the score folder's config.json names them (the scoring length `max_length`,
        `SCORE_FILES`)."""
        return {SCORE_FILES.get(k, k): v for k, v in asdict(self).items()}

    def validate(self) -> None:
        problems = []
        if self.backend not in BACKENDS:
            problems.append(f"--backend {self.backend!r} is not available: use one of {', '.join(BACKENDS)}")
        if self.score_length < 2:
            problems.append(f"--score-length {self.score_length} is too small: it must leave room for prompt and response")
        if self.token_budget is not None and self.token_budget < self.score_length:
            problems.append(f"--token-budget {self.token_budget} is below --score-length {self.score_length}: one sequence must fit a batch")
        if self.shard_size < 1:
            problems.append(f"--shard-size {self.shard_size} must be at least 1")
        if self.skip_tokens < 0:
            problems.append(f"--skip-tokens {self.skip_tokens} must be at least 0")
        elif self.skip_tokens >= self.score_length - 1:  # the prompt takes a token at least
            problems.append(f"--skip-tokens {self.skip_tokens} leaves nothing to score within --score-length "
                            f"{self.score_length}: lower --skip-tokens")
        if self.local_window < 0:
            problems.append(f"--local-window {self.local_window} must be at least 0 (0: no step-local score)")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            problems.append(f"--dp-rank {self.dp_rank} / --dp-size {self.dp_size}: need dp-size >= 1 and 0 <= dp-rank < dp-size")
        if self.tensor_parallel_size < 1:
            problems.append(f"--tensor-parallel-size {self.tensor_parallel_size} must be at least 1")
        if self.backend != "vllm" and self.tensor_parallel_size != 1:
            problems.append("--tensor-parallel-size applies to --backend vllm only; the hf backend uses one device")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"--gpu-memory-utilization {self.gpu_memory_utilization} must be in (0, 1]")
        if problems:
            raise InputError("; ".join(problems))


def backend_for(cfg: ScoreConfig, lm):
    """The scoring backend `cfg` asks for, around an already loaded `lm`."""
    return backend_from(cfg.backend, lm, cfg, skip_tokens=cfg.skip_tokens)


def load_for(cfg: ScoreConfig):
    """The student as `cfg.backend` needs it: vllm loads the weights itself, so only the
    tokenizer and description are loaded here."""

    if cfg.backend == "vllm":
        import_vllm()  # fail fast, before any loading, when vllm or a GPU is missing
    return loading.load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, weights=cfg.backend != "vllm")


def cache_parts(description: dict, pool: Pool, template: str, cfg: ScoreConfig) -> dict:
    """What a cached score depends on; the cache folder is named by its hash and records it."""
    parts = {
        "model": description["fingerprint"],
        "pool": pool.fingerprint(),
        "template": template,
        SCORE_FILES["score_length"]: cfg.score_length,
        "dtype": description["dtype"],
        "format": FORMAT_VERSION,
    }
    if cfg.backend != "hf":  # backends agree only within their dtype's tolerance: keep their caches apart
        parts["backend"] = cfg.backend
    if cfg.skip_tokens:
        parts["skip_tokens"] = cfg.skip_tokens
    if cfg.local_window:
        parts["local_window"] = cfg.local_window
    return parts


def candidate_rows(pool: Pool) -> list[tuple[str, int, str, str]]:
    return [(p.id, c.k, p.prompt, c.text) for p in pool.problems for c in p.candidates]


Advance = Callable[[int], None]
STALE_BESIDE = ("compute.jsonl",)  # measurements `advisor score` writes beside the scores, of the run that wrote them


def score_pool(
    pool: Pool,
    cfg: ScoreConfig,
    out_dir: str | Path | None = None,
    lm=None,
    on_start: Callable[[int, int], None] | None = None,
    advance: Advance | None = None,
    stop_after_shards: int | None = None,
) -> dict:
    """Score every kept candidate; returns a summary. `lm` reuses an already loaded model.

    `on_start(total, already_done)` is called once the cache is inspected; `advance(n)` after
    each batch. `stop_after_shards` ends early (for tests of resume) without writing outputs.
    With `dp_size > 1` this process scores its own shards; if others are still missing it
    returns `{"waiting_for": [...]}` and writes nothing, leaving the outputs to the last one.
    Writing OUT/scores.jsonl of another cache key (another model, pool or setting) removes the
    files beside it that belonged to the old scores (`STALE_BESIDE`).
    """
    cfg.validate()
    if out_dir is not None:
        check_writable_dir(out_dir, "--out")
    lm = lm or load_for(cfg)
    check_prompts(lm.tokenizer, (p.prompt for p in pool.problems))  # a template that fails on some: refused before any work
    tmpl = template_id(lm.tokenizer)
    parts = cache_parts(lm.description, pool, tmpl, cfg)
    cache = cache_folder("scores", parts)
    key = cache.name
    plan = ShardPlan(candidate_rows(pool), cfg.shard_size, cache, cfg.dp_rank, cfg.dp_size)
    plan.claim(parts)
    n_done = plan.my_cached_items()
    backends: dict = {}
    if cfg.backend == "vllm" and plan.todo():
        # vLLM's engine starts (a minute on CPUs) and is checked while the model loads, so a model
        # it cannot run is refused before any work is counted.
        backends["score"] = backend_for(cfg, lm).start()
    if on_start:
        on_start(plan.my_items(), n_done)

    work = shard_scorer(cfg, lm, backends, advance)

    t0 = time.perf_counter()
    computed = plan.run(work, stop_after_shards)
    if computed is None:
        return {"stopped_early": True, "cache": str(cache)}
    elapsed = time.perf_counter() - t0
    missing = plan.missing()
    chosen = getattr(backends.get("score"), "chosen", None)  # the settings the backend picked itself (vllm)
    if missing:  # other data-parallel ranks still at work; the last to finish writes the outputs
        return {"waiting_for": missing, "shards": len(plan.shards), "computed": computed, "cache": str(cache), "key": key,
                "seconds": round(elapsed, 3), "model": lm.description, "template": tmpl,
                **({"chosen": chosen} if chosen else {})}
    same = lambda rows, shard: [(r.get("id"), r.get("k")) for r in rows] == [(pid, k) for pid, k, _, _ in shard]  # noqa: E731
    all_rows = [r for rows in plan.read(same) for r in rows]
    summary = {
        "candidates": len(all_rows),
        "problems": len(pool),
        "response_tokens": sum(r["n_tokens"] for r in all_rows),
        "truncated": sum(bool(r["truncated"]) for r in all_rows),
        "from_cache": n_done,
        "seconds": round(elapsed, 3),
        "cache": str(cache),
        "key": key,
        "template": tmpl,
        "model": lm.description,
    }
    if chosen:
        summary["chosen"] = chosen
    if out_dir is not None:
        summary["scores"] = str(write_scores(Path(out_dir), all_rows, cfg, pool, lm.description, tmpl, key))
    return summary


def shard_scorer(cfg: ScoreConfig, lm, backends: dict, advance: Advance | None):
    """The work of one shard: its candidates' score rows (and step-local log-probs with
    `local_window`); `backends` keeps the backends built on first use."""

    def work(i: int, shard) -> list[dict]:
        if "score" not in backends:
            backends["score"] = backend_for(cfg, lm)
        backend = backends["score"]
        pairs = [(p, r) for _, _, p, r in shard]
        encoded = backend.encode(pairs, cfg.score_length)
        check_skip_tokens(cfg.skip_tokens, shard, encoded)
        results = backend.score_encoded(encoded, progress=advance)
        if cfg.local_window:
            if "local" not in backends:  # steps are scored whole
                backends["local"] = backend_for(ScoreConfig(**{**asdict(cfg), "skip_tokens": 0}), lm)
            for row, lalp in zip(results, local_logprobs(backends["local"], lm.tokenizer, pairs, cfg.score_length,
                                                         cfg.local_window)):
                row["logprob_local"] = lalp
        return [{"id": pid, "k": k, **res} for (pid, k, _, _), res in zip(shard, results)]

    return work


def write_scores(out: Path, rows: list[dict], cfg: ScoreConfig, pool: Pool, description: dict, tmpl, key: str) -> Path:
    """OUT/scores.jsonl and OUT/config.json; files beside them measured under other scores go."""
    if recorded_key(out, "cache_key") not in (None, key):
        for name in STALE_BESIDE:  # measured under the scores being replaced
            (out / name).unlink(missing_ok=True)
    write_jsonl(out / "scores.jsonl", rows)
    write_json(out / "config.json", {
        "stage": "score", "versions": versions(), "settings": cfg.settings(),
        "pool": pool.summary(), "pool_path": pool.source, "model": description, "template": tmpl, "cache_key": key,
    })
    return out / "scores.jsonl"


def check_skip_tokens(skip_tokens: int, items, encoded) -> None:
    """One InputError, before a shard is scored, when `--skip-tokens` leaves a response nothing to
    score (its mean log-prob and rank would be NaN, which no reader takes for a score)."""
    if not skip_tokens:
        return
    short = [(item, e.n_response) for item, e in zip(items, encoded) if e.n_response <= skip_tokens]
    if short:
        (pid, k, _, _), n = short[0]
        raise InputError(f"--skip-tokens {skip_tokens} leaves nothing to score in {len(short)} of {len(items)} responses "
                         f"of this shard (first: problem {pid!r} candidate {k}, {n} response tokens after --score-length): "
                         "lower --skip-tokens")
