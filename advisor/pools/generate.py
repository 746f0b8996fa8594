"""The generate stage: K candidate responses per problem from a teacher, checked, as a grouped pool.

    advisor generate --teacher deepseek-ai/DeepSeek-R1-Distill-Qwen-7B --problems problems.jsonl --n 4 --out pool.jsonl
    advisor generate --teacher lab:xl --problems lab-pool.jsonl --n 6 --temperature 1.0 --out pool.jsonl

This is the paper's first step. Problems come from any file `advisor.pools.read` reads (JSONL, JSON,
Parquet, a datasets folder) with a problem text field and, optionally, an answer, an id and a
`task` (the lab's). Each problem's prompt is rendered with the teacher's chat template, exactly
as the student will later see it when scoring. Candidates are checked against the reference
answer (the lab's checker for lab tasks, math-verify or a `\\boxed{}` match otherwise) and written
in the OpenR1 layout: `id`, `problem`, `answer`, `generations`, `correctness`, plus `finished`
(False when a candidate hit `--max-new-tokens`) and `n_tokens`; every other verb reads it.

Work is cut into shards of `shard_size` problems, each cached under
`$ADVISOR_HOME/generate/<key>/` as it finishes; the key covers the teacher, the problems, the
template, every sampling setting, the batch budget and the device, and the folder records them
(`producer.json`) and refuses to serve another run. Each shard's sampling is seeded from `seed` and its first
problem's index, so a killed run resumes at the first missing shard and ends with the same pool
as an uninterrupted one. With `dp_size` processes, each takes the shards `dp_rank` mod `dp_size`,
and the last to finish writes the pool, as in `advisor score`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from capacity_advisor.advisor.pools.files import DatasetSource, iter_rows
from capacity_advisor.advisor.pools.layout import (
    ANSWER_KEYS, ID_KEYS, PROMPT_KEYS, given_ids, pick_field, stand_in_id, utf8_text,
)
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import (
    FORMAT_VERSION, advisor_home, atomic_path, check_writable_dir, check_writable_file, refuse_overwrite, stable_hash,
    versions, write_json, write_jsonl,
)
from capacity_advisor.core.shards import ShardPlan, cache_folder
from capacity_advisor.models import loading
from capacity_advisor.models.backends import BACKENDS, VLLM_DEFAULTS, backend_from
from capacity_advisor.models.template import check_prompts, template_id
from capacity_advisor.models.vllm import import_vllm
from capacity_advisor.training.text_metrics import CHECKER_DEFAULT, check_answer, choose_checker, math_checker_name

OUT_SUFFIXES = (".jsonl", ".parquet")


@dataclass
class GenerateConfig:
    teacher: str  # --teacher: a local HF folder, a hub id, or lab:NAME
    problems: str  # --problems: file or datasets folder of problems
    out: str  # --out: the pool to write (.jsonl or .parquet)
    n: int = 4  # --n: candidates per problem
    temperature: float = 0.6  # --temperature (0 = greedy, needs --n 1)
    top_p: float = 0.95  # --top-p
    max_new_tokens: int = 4096  # --max-new-tokens: longer candidates are cut and marked unfinished
    backend: str = "auto"  # --backend auto|hf|vllm (auto: vllm when it and a GPU are present)
    device: str = "auto"
    dtype: str = "auto"
    checker: str = CHECKER_DEFAULT  # --checker auto|lab|math|none
    prompt_field: str | None = None
    answer_field: str | None = None
    id_field: str | None = None
    limit: int | None = None  # --limit: only the first N problems
    split: str | None = None  # --split / --subset / --revision: for a hub dataset id or dataset folder
    subset: str | None = None
    revision: str | None = None
    shard_size: int = 64  # --shard-size: problems per cached shard (the unit of resume)
    token_budget: int | None = None  # --token-budget: tokens per generation batch, prompt + new (None: the backend's default)
    tensor_parallel_size: int = VLLM_DEFAULTS.tensor_parallel_size  # --tensor-parallel-size (vllm)
    gpu_memory_utilization: float | None = None  # None: the backend's default (models.backends)
    dp_rank: int = 0
    dp_size: int = 1
    seed: int = 0

    def validate(self) -> None:
        problems = []
        if self.n < 1:
            problems.append(f"--n {self.n} must be at least 1")
        if self.temperature < 0:
            problems.append(f"--temperature {self.temperature} must be >= 0")
        if self.temperature == 0 and self.n > 1:
            problems.append("--temperature 0 is greedy and gives one candidate per problem: set --n 1 or a temperature > 0")
        if not 0 < self.top_p <= 1:
            problems.append(f"--top-p {self.top_p} must be in (0, 1]")
        if self.max_new_tokens < 1:
            problems.append(f"--max-new-tokens {self.max_new_tokens} must be at least 1")
        if self.backend not in ("auto", *BACKENDS):
            problems.append(f"--backend {self.backend!r} is unknown: use auto, {' or '.join(BACKENDS)}")
        if self.shard_size < 1:
            problems.append(f"--shard-size {self.shard_size} must be at least 1")
        if self.limit is not None and self.limit < 1:
            problems.append(f"--limit {self.limit} must be at least 1")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            problems.append(f"--dp-rank {self.dp_rank} / --dp-size {self.dp_size}: need dp-size >= 1 and 0 <= dp-rank < dp-size")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"--gpu-memory-utilization {self.gpu_memory_utilization} must be in (0, 1]")
        if Path(self.out).suffix.lower() not in OUT_SUFFIXES:
            problems.append(f"--out {self.out}: write the pool as .jsonl or .parquet")
        if problems:
            raise InputError("; ".join(problems))


@dataclass
class ProblemRow:
    id: str
    problem: str
    answer: str | None
    task: str | None


def read_problems(cfg: GenerateConfig) -> tuple[list[ProblemRow], dict]:
    """The problems to generate for; with `limit`, only the first rows are read."""
    from itertools import islice

    rows = list(islice(iter_rows(cfg.problems, what="problems file", source=DatasetSource(cfg.split, cfg.subset, cfg.revision)),
                       cfg.limit))
    if not rows:
        raise InputError(f"problems file {cfg.problems} holds no rows")
    keys = set().union(*(r.keys() for r in rows[:100]))

    what = f"problems file {cfg.problems}"
    fields = {"prompt": pick_field(keys, cfg.prompt_field, PROMPT_KEYS, "--prompt-field", what),
              "answer": pick_field(keys, cfg.answer_field, ANSWER_KEYS, "--answer-field", what),
              "id": pick_field(keys, cfg.id_field, ID_KEYS, "--id-field", what)}
    if fields["prompt"] is None:
        raise InputError(f"no problem text field in {cfg.problems} (looked for {', '.join(PROMPT_KEYS)}); "
                         f"name it with --prompt-field (fields: {', '.join(sorted(keys))})")
    try:
        return _problem_rows(cfg, rows, fields), fields
    except RecursionError:  # a field nested just under the parser's limit can still overflow str()
        raise InputError(f"problems file {cfg.problems} is nested too deeply to read; flatten its fields") from None


def _problem_rows(cfg: GenerateConfig, rows: list[dict], fields: dict) -> list[ProblemRow]:
    ids = given_ids(rows, fields["id"], f"problems file {cfg.problems}")
    taken = {pid for pid in ids if pid is not None}
    out, seen = [], set()
    for i, (r, pid) in enumerate(zip(rows, ids)):
        where = f"{cfg.problems} row {i + 1}"
        text = r.get(fields["prompt"])
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: field {fields['prompt']!r} is missing or empty; every problem needs its text")
        text = utf8_text(text, where, fields["prompt"])
        if pid in seen:
            raise InputError(f"{where}: id {pid!r} appears twice; ids must be unique (or pass --id-field)")
        pid = pid if pid is not None else stand_in_id(i, taken)
        seen.add(pid)
        ans = r.get(fields["answer"]) if fields["answer"] else None
        task = utf8_text(r["task"], where, "task") if isinstance(r.get("task"), str) else None
        out.append(ProblemRow(pid, text, None if ans is None else utf8_text(str(ans), where, fields["answer"]), task))
    return out


def resolve_backend(name: str) -> str:
    """`auto`: vllm where it is importable and a GPU is visible, hf everywhere else."""
    if name != "auto":
        return name
    try:
        import vllm  # noqa: F401
        import torch
    except ImportError:
        return "hf"
    return "vllm" if torch.cuda.is_available() else "hf"


def cache_parts(cfg: GenerateConfig, backend: str, lm, template: str, problems: list[ProblemRow]) -> dict:
    """What a cached shard of generations depends on; the cache folder is named by its hash and
    records it. The batch budget and the device change which random draws each prompt gets."""
    return {
        "teacher": lm.description["fingerprint"], "dtype": lm.description["dtype"], "template": template, "backend": backend,
        "problems": stable_hash([[p.id, p.problem] for p in problems]),
        "n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens,
        "shard_size": cfg.shard_size, "seed": cfg.seed, "token_budget": cfg.token_budget,
        "device": getattr(lm.device, "type", str(lm.device)), "format": FORMAT_VERSION,
    }


def check_inputs(cfg: GenerateConfig) -> tuple[list, dict, str, str]:
    """Everything generation refuses, before any model loads: the settings, the output and cache
    folders, the problems; then (problems, their fields, the checker, the backend)."""
    cfg.validate()
    check_writable_file(cfg.out, "--out")
    refuse_overwrite([cfg.problems], [cfg.out, config_path(cfg.out)], "--out")
    check_writable_dir(advisor_home(), "ADVISOR_HOME (the generation cache)")
    problems, fields = read_problems(cfg)
    has_answers = any(p.answer not in (None, "") for p in problems)
    checker = choose_checker(cfg.checker, has_answers, {p.task for p in problems if p.task})
    backend_name = resolve_backend(cfg.backend)
    if backend_name == "hf" and cfg.tensor_parallel_size != 1:
        raise InputError("--tensor-parallel-size applies to --backend vllm only; the hf backend uses one device")
    if backend_name == "vllm":
        import_vllm()
    return problems, fields, checker, backend_name


def generate_pool(
    cfg: GenerateConfig,
    on_start: Callable[[int, int], None] | None = None,
    advance: Callable[[int], None] | None = None,
    stop_after_shards: int | None = None,
    lm=None,
) -> dict:
    """Sample, check and write the pool; returns a summary (see the module docstring)."""

    problems, fields, checker, backend_name = check_inputs(cfg)
    lm = lm or loading.load_model(cfg.teacher, device=cfg.device, dtype=cfg.dtype, weights=backend_name != "vllm")
    check_prompts(lm.tokenizer, (p.problem for p in problems))  # a template that fails on some: refused before any work
    tmpl = template_id(lm.tokenizer)
    parts = cache_parts(cfg, backend_name, lm, tmpl, problems)
    cache = cache_folder("generate", parts)
    key = cache.name
    plan = ShardPlan(problems, cfg.shard_size, cache, cfg.dp_rank, cfg.dp_size)
    plan.claim(parts)
    n_cached = plan.my_cached_items()
    backends: list = []
    if backend_name == "vllm" and plan.todo():  # vLLM's engine started and checked before any work is counted
        backends.append(_make_backend(backend_name, lm, cfg).start())
    if on_start:
        on_start(plan.my_items(), n_cached)

    def work(i: int, shard) -> list[dict]:
        if not backends:
            backends.append(_make_backend(backend_name, lm, cfg))
        comps = backends[0].generate([p.problem for p in shard], max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperature, n=cfg.n, seed=cfg.seed * 1_000_003 + i * cfg.shard_size,
                                     progress=advance, top_p=cfg.top_p, details=True)
        return [{"id": p.id, "candidates": c} for p, c in zip(shard, comps)]

    t0 = time.perf_counter()
    computed = plan.run(work, stop_after_shards)
    if computed is None:
        return {"stopped_early": True, "cache": str(cache)}
    elapsed = time.perf_counter() - t0
    missing = plan.missing()
    if missing:
        return {"waiting_for": missing, "shards": len(plan.shards), "computed": computed, "cache": str(cache), "key": key}

    def same(rows: list[dict], shard) -> bool:
        return [r.get("id") for r in rows] == [p.id for p in shard] and all(isinstance(r.get("candidates"), list) for r in rows)

    generated = {r["id"]: r["candidates"] for rows in plan.read(same) for r in rows}
    rows = [pool_row(p, generated[p.id], checker) for p in problems]
    n_gen = sum(len(r["generations"]) for r in rows)
    summary = {
        "problems": len(rows),
        "generations": n_gen,
        "correct": sum(sum(r.get("correctness", [])) for r in rows) if checker != "none" else None,
        "problems_with_two_correct": sum(sum(r["correctness"]) >= 2 for r in rows) if checker != "none" else None,
        "unfinished": sum(len(r["finished"]) - sum(r["finished"]) for r in rows),
        "mean_tokens": sum(sum(r["n_tokens"]) for r in rows) / max(1, n_gen),
        "checker": math_checker_name() if checker == "math" else checker,
        "backend": backend_name,
        "from_cache": n_cached,
        "seconds": round(elapsed, 3),
        "cache": str(cache),
        "key": key,
        "template": tmpl,
        "teacher": lm.description,
        "fields": fields,
        "out": str(cfg.out),
    }
    if backends and getattr(backends[0], "chosen", None):  # the settings the backend picked itself (vllm)
        summary["chosen"] = backends[0].chosen
    write_pool_file(rows, cfg.out)
    write_json(config_path(cfg.out), {"stage": "generate", "versions": versions(), "settings": asdict(cfg), "summary": summary})
    return summary


def pool_row(p, cands: list[dict], checker: str) -> dict:
    """A problem's line of the pool: its generations, each checked against its answer."""
    row = {"id": p.id, "problem": p.problem}
    if p.answer is not None:
        row["answer"] = p.answer
    if p.task:
        row["task"] = p.task
    row["generations"] = [c["text"] for c in cands]
    if checker != "none":
        row["correctness"] = [bool(check_answer(c["text"], p.answer, checker)) for c in cands]
    row["finished"] = [bool(c["finished"]) for c in cands]
    row["n_tokens"] = [int(c["n_tokens"]) for c in cands]
    return row


def _make_backend(name: str, lm, cfg: GenerateConfig):
    return backend_from(name, lm, cfg, vllm={"min_token_budget": cfg.max_new_tokens + 1})


def config_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".config.json")


def write_pool_file(rows: list[dict], out: str | Path) -> None:
    out = Path(out)
    if out.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        with atomic_path(out) as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
    else:
        write_jsonl(out, rows)
