"""What `advisor calibrate --students ... --dry-run` states a calibration costs beyond steps and
sequences: the pool's tokens under each model's own tokenizer, as training, scoring and evaluation
count them, and their FLOPs and GPU-hours under a stated peak and MFU.

    t = measure_tokens(tokenizer, problems, held_out, train_length=2048, score_length=4096)
    c["gpu"] = gpu_cost(cfg, plan, c, log)   # cfg, plan: advisor.calibration.proxies's

Training is 6·N·tokens, forward passes and generation 2·N·tokens; GPU-hours = FLOPs / (peak
TFLOP/s × 10^12 × MFU) / 3600, generation at its own (far lower) MFU. Counts are measured; the
FLOPs and hours follow from the formulas and the assumed throughput, not from a run on a GPU.
"""

from __future__ import annotations

from capacity_advisor.models.loading import load_tokenizer, resolve_model_path
from capacity_advisor.models.template import prompt_ids
from capacity_advisor.probes.recipe import file_name
from capacity_advisor.training.manifest import SETS

# The dry run's GPU-hours: assumptions to set for your own cluster, not measurements.
PEAK_TFLOPS = 989.0  # one H100 SXM's dense bf16 peak (NVIDIA's datasheet)
TRAIN_MFU = 0.4  # the share of that peak training and batched forward passes reach
DECODE_MFU = 0.05  # generation, one token at a time, reaches far less
MAX_TFLOPS = 1e6  # no GPU is near a thousand times an H100
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZE_CHUNK = 64  # problems whose candidates are tokenized in one call


def model_tokenizer(spec: str):
    """(the tokenizer training loads for `spec`, None), or (None, why there is none to measure with).
    Local folders only (a lab student's is its build folder), never running the folder's code."""
    import os

    path = resolve_model_path(spec)
    if not os.path.isdir(path):
        return None, "a hub id: tokens are measured with a local folder's tokenizer only (pass the model's folder)"
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        return None, "its folder holds no tokenizer"
    return load_tokenizer(path, {"trust_remote_code": False}), None


def measure_tokens(tokenizer, train: list, held_out: list, train_length: int, score_length: int) -> dict:
    """The pool's tokens as training and scoring count them (`models.template.encode_pair`): every
    candidate of every problem in `train`, as prompt + response + EOS cut at `train_length` (a training
    sequence), and as prompt + response cut at `score_length` (a scoring pass). The result names the
    training length by its files' name (`probes.recipe.file_name`: `max_length`).

    A selected set holds one response per problem, chosen by the student's scores, which a dry run
    does not have: `per_epoch` is each problem's mean over its candidates, summed over problems
    (what a set of one response per problem drawn at random holds), and `per_epoch_shortest` /
    `per_epoch_longest` (each problem's shortest / longest candidate) bound D_high, D_low and
    D_mixed alike."""
    from statistics import mean

    eos = int(tokenizer.eos_token_id is not None)  # training appends EOS to every response
    means, prompts = [], []
    shortest = longest = scored = cut = candidates = 0
    for start in range(0, len(train), TOKENIZE_CHUNK):
        chunk = [p for p in train[start:start + TOKENIZE_CHUNK] if p.candidates]
        texts = [c.text for p in chunk for c in p.candidates]
        lengths = iter(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter(())
        for p in chunk:
            n_prompt = len(prompt_ids(tokenizer, p.prompt))
            prompts.append(n_prompt)
            seqs = []
            for _ in p.candidates:
                whole = n_prompt + next(lengths)
                seqs.append(min(whole + eos, train_length))
                scored += min(whole, score_length)
                cut += whole + eos > train_length
            candidates += len(seqs)
            means.append(mean(seqs))
            shortest += min(seqs)
            longest += max(seqs)
    return {file_name("train_length"): train_length, "score_length": score_length, "problems": len(means), "candidates": candidates,
            "sequence_mean": mean(means) if means else 0.0, "per_epoch": float(sum(means)),
            "per_epoch_shortest": shortest, "per_epoch_longest": longest,
            "truncated_share": cut / candidates if candidates else 0.0, "score_tokens": scored,
            "prompt_mean": mean(prompts) if prompts else 0.0,
            "eval_prompt_mean": mean(len(prompt_ids(tokenizer, p.prompt)) for p in held_out) if held_out else 0.0}


def gpu_hours(flops: float, tflops: float, mfu: float) -> float:
    """Hours of one GPU of peak `tflops` TFLOP/s running at the share `mfu` of it."""
    return flops / (tflops * 1e12 * mfu) / 3600


def flops_and_hours(cfg, n_params: int, trained: float, forward: float, generated: float) -> dict:
    """FLOPs and GPU-hours of tokens trained (6 N per token: forward and backward), passed forward
    without gradients (2 N) and generated (2 N, at the decode share of the peak)."""
    flops = {"train": 6 * n_params * trained, "forward": 2 * n_params * forward, "generate": 2 * n_params * generated}
    hours = {"train": gpu_hours(flops["train"], cfg.gpu_tflops, cfg.mfu),
             "forward": gpu_hours(flops["forward"], cfg.gpu_tflops, cfg.mfu),
             "generate": gpu_hours(flops["generate"], cfg.gpu_tflops, cfg.decode_mfu)}
    hours["total"] = sum(hours.values())
    return {"train_tokens": trained, "forward_tokens": forward, "generated_tokens": generated, "flops": flops,
            "gpu_hours": hours}


def evaluation_tokens(evaluations: int, problems: int, new_tokens: int, prompt_mean: float) -> tuple[float, float]:
    """(generated, forward) tokens of `evaluations` evaluations on `problems` held-out problems, each
    generation taken to run to `new_tokens` (an upper bound): its prompt's prefill, then two teacher-
    forced passes over prompt + generation (the answer's log-probability, the frozen base's drift)."""
    generations = evaluations * problems
    return generations * new_tokens, generations * (prompt_mean + 2 * (prompt_mean + new_tokens))


def gpu_cost(cfg, plan, c: dict, log) -> dict:
    """The dry run's measured tokens of every proxy and of the target's one full run, and their
    FLOPs and GPU-hours under the stated peak and MFU: the rows of `c` gain `tokens` and `compute`,
    or `tokens_missing` saying why a model's tokens could not be measured."""
    from capacity_advisor.training.callbacks import eval_schedule

    seeds, n_eval, sets = len(cfg.seeds), len(plan.eval_ids), len(SETS)
    held_out = [plan.pool.get(i) for i in plan.eval_ids]
    first = None  # (tokens, proxy name) of the first proxy measured: the target's when it has no tokenizer
    for s, row in zip(plan.students, c["students"]):
        r = s["plan"].recipe
        tok, why = model_tokenizer(s["spec"])
        if tok is None:
            row["tokens_missing"] = why
            continue
        log(f"measuring the pool's tokens with {s['name']}'s tokenizer ({plan.train.n_candidates:,} candidates)")
        t = measure_tokens(tok, plan.train.problems, held_out, r.train_length, r.score_length)
        row["tokens"] = t
        first = first or (t, s["name"])
        probe_evals = 1 + 2 * len(eval_schedule(1, r.steps, 1, r.eval_every))  # the base once, then each set's points
        gen_probe, fwd_probe = evaluation_tokens(seeds * probe_evals, r.eval_problems, r.max_new_tokens, t["prompt_mean"])
        gen_full, fwd_full = evaluation_tokens(seeds * sets * row["evaluations_per_run"], n_eval, r.max_new_tokens,
                                               t["eval_prompt_mean"])
        parts = {"scoring": t["score_tokens"],  # one forward pass per candidate, once per proxy (shared by its seeds)
                 "probe_train": seeds * 2 * r.steps * r.batch_size * t["sequence_mean"],
                 "full_runs_train": seeds * sets * cfg.epochs * t["per_epoch"],
                 "evaluation_forward": fwd_probe + fwd_full
                 + seeds * probe_evals * r.eval_problems * 2 * t["sequence_mean"],  # + the probe's 2 teacher references
                 "probe_generated": gen_probe, "full_runs_generated": gen_full}
        row["compute"] = {**flops_and_hours(cfg, row["n_params"], parts["probe_train"] + parts["full_runs_train"],
                                            parts["scoring"] + parts["evaluation_forward"],
                                            gen_probe + gen_full), "parts": parts}
    proxies = [row["compute"]["gpu_hours"]["total"] for row in c["students"] if "compute" in row]
    out = {"peak_tflops": cfg.gpu_tflops, "mfu": cfg.mfu, "decode_mfu": cfg.decode_mfu,
           "formulas": {"train": "6 * N * tokens", "forward": "2 * N * tokens", "generate": "2 * N * tokens",
                        "gpu_hours": "FLOPs / (peak TFLOP/s * 1e12 * MFU) / 3600, generation at the decode MFU"},
           "set_tokens": "each problem's mean tokens over its candidates, summed over problems: D_high, D_low and D_mixed "
                         "hold one response per problem, chosen by the student's scores, which a dry run does not have",
           "measured": "token counts under each model's own tokenizer; FLOPs and GPU-hours follow from the formulas and "
                       "the peak and MFU assumed here, not from a run on a GPU",
           "measured_proxies": len(proxies),
           "proxies_gpu_hours": sum(proxies) if len(proxies) == len(c["students"]) else None}
    if plan.target is not None:
        tg, r = c["target"], plan.target["plan"].recipe
        tok, why = model_tokenizer(cfg.target)
        t = source = None
        if tok is not None:
            log(f"measuring the pool's tokens with {tg['model']}'s tokenizer ({plan.train.n_candidates:,} candidates)")
            t, source = measure_tokens(tok, plan.train.problems, held_out, r.train_length, r.score_length), tg["model"]
        elif first is not None:
            (t, source), tg["tokens_missing"] = first, f"{why}: counted with {first[1]}'s tokenizer instead"
        else:
            tg["tokens_missing"] = why
        if t is not None:
            tg["tokens"] = {**t, "tokenizer": source}
            gen, fwd = evaluation_tokens(c["students"][0]["evaluations_per_run"], n_eval, r.max_new_tokens,
                                         t["eval_prompt_mean"])
            tg["compute"] = flops_and_hours(cfg, tg["n_params"], cfg.epochs * t["per_epoch"], fwd, gen)
            if out["proxies_gpu_hours"] is not None:
                out["share_of_one_full_run"] = out["proxies_gpu_hours"] / tg["compute"]["gpu_hours"]["total"]
    return out
