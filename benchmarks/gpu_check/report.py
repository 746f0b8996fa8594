"""gpu_check's report: the plain-text summary and the Markdown of docs/results.md section 3 (`table`:
one row per student, the end-to-end `advisor recommend` by stage, the GPU-hours on the assumed pool,
then what the projection assumes), both printed on stdout; the package versions a result records
and which optional packages were importable; `write_files`, which writes the JSON to --out with the
Markdown beside it (the same name with the suffix .md), each through a temporary file so that a run
stopped mid-write leaves the previous whole file; and `write_and_print` at the end of a run.
Every part may be missing (skipped, failed, or not reached yet): its cells then read "—".
"""

import json
import os
import sys
from pathlib import Path

DASH = "—"
# packages the hf-only path must not need; a GPU machine may lack any of them
OPTIONAL = ("lightgbm", "datasets", "math_verify", "trl", "vllm", "matplotlib", "pyarrow")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "peft", "accelerate", "vllm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = getattr(sys.modules.get(pkg), "__version__", None)
    return out


def optional_packages() -> dict:
    """Which of OPTIONAL this process could import (imported already, or found; none is imported here)."""
    from importlib.util import find_spec

    def found(name: str) -> bool:
        if name in sys.modules:  # a stand-in placed there (the tests) has no spec to find
            return True
        try:
            return find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return {name: found(name) for name in OPTIONAL}


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


def _pct(x: float | None) -> str:
    return DASH if x is None else f"{100 * x:.0f} %" if x >= 0.01 else f"{100 * x:.2f} %"


def _roof(part: dict) -> str:
    r = part.get("roofline")
    return f" ({_pct(r['share_of_matmul_ceiling'])} of the matmul ceiling)" if r else ""


def summary(res) -> None:
    for name, m in res.get("students", {}).items():
        if "error" in m:
            print(f"{name}: {m['error']}")
            continue
        sc, st, fr, ge = (m.get(k) for k in ("scoring", "probe_step", "full_run_step", "generation"))
        line = [f"{name} ({_params(m['params'])}, {m['dtype']})" if "params" in m else name]
        if sc:
            line.append(f"scoring {sc['response_tokens_per_s']:.0f} response tok/s ({sc['hf_over_naive']:.2f}x naive)")
        for label, st_ in (("probe step", st), ("full-run step", fr)):
            if st_:
                line.append(f"{label} ({st_['mode']}) {st_['seconds_per_step']:.3f} s, peak {st_['peak_memory_mb']:.0f} MiB")
        if ge:
            line.append(f"generation {ge['new_tokens_per_s']:.0f} new tok/s at batch {ge['batch_rows']}")
        if "hours" in m:
            h = m["hours"]["gpu_hours"]
            line.append(f"GPU-hours: probe {h['probe']:.2f}, run {h['full_run']:.2f}, calibration proxy "
                        f"{h['calibration_proxy']:.2f}")
        print("; ".join(line))
    if "recommend" in res:
        r = res["recommend"]
        print(f"recommend end to end: {r['total_seconds']:.1f} s (" + ", ".join(
            f"{k} {v:.1f}" for k, v in r["stages"].items() if v is not None) + f"), chose D_{r['strategy']}")
    if "agreement" in res:
        a, s = res["agreement"], res["scoring"]
        print(f"agreement model {res['params'] / 1e6:.0f}M: max |Δ mean log-prob| hf-bf16 vs fp32 "
              f"{a['max_abs_diff_mean_hf_bf16_vs_fp32']:.2e}; hf {s['hf_over_naive']:.2f}x the naive loop"
              + (f"; vllm within bf16 tolerance: {a['within_bf16_tolerance']}" if "within_bf16_tolerance" in a else ""))
    for part, why in {**res.get("skipped", {}), **res.get("errors", {})}.items():
        print(f"{part}: {why}")


def _student_row(m: dict, shape: str) -> str:
    if "error" in m:
        return f"| {m['label']}{shape} | {DASH} | {m['error']} | | | | |"
    sc, st, fr, ge, pr = (m.get(k) for k in ("scoring", "probe_step", "full_run_step", "generation", "projection"))
    cells = [f"{m['label']}{shape}, {m.get('dtype', DASH)}", _params(m["params"]) if "params" in m else DASH]
    cells.append(f"{sc['response_tokens_per_s']:,.0f} response tok/s, {sc['hf_over_naive']:.1f}× the naive loop"
                 f"{_roof(sc)}; peak {_gib(sc['peak_memory_mb'])}" if sc else DASH)
    for step in (st, fr):
        fits = " (out of memory as configured; with gradient checkpointing)" if step and step["out_of_memory_as_configured"] else ""
        cells.append(f"{step['mode']}, {step['batch_size']} × {step['max_length']:,} tokens{fits}: "
                     f"{step['seconds_per_step']:.2f} s{_roof(step)}; peak {_gib(step['peak_memory_mb'])}" if step else DASH)
    cells.append(f"{ge['batch_rows']} × {ge['timed_new_tokens']:,} new tokens: {ge['new_tokens_per_s']:,.0f} tok/s"
                 f"{_roof(ge)}; peak {_gib(ge['peak_memory_mb'])}" if ge else DASH)
    if pr:
        ps = pr["seconds"]
        cells.append(f"**{_duration(pr['total_seconds'])}** (scoring {_duration(ps['scoring'])}, probe training "
                     f"{_duration(ps['probe_training'])}, evaluations "
                     f"{_duration(ps['evaluation_generation'] + ps['evaluation_scoring'])}); peak **{_gib(pr['peak_memory_mb'])}**")
    else:
        cells.append(DASH)
    return "| " + " | ".join(cells) + " |"


def _recommend_lines(r: dict) -> list[str]:
    e = r["pool"]
    stages = " · ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in r["stages"].items() if v is not None)
    return ["", f"`{r['command']}` at the {r['student']} shape, on {e['problems']} generated problems × "
            f"{e['candidates']} candidates of {e['response_tokens']:,} tokens: **{r['total_seconds']:.0f} s** "
            f"({stages}); peak {_gib(r['peak_memory_mb'])}; chose D_{r['strategy']} ({r['answered_by']}); figures "
            f"{r['figures']}. Saving the student took {r['save_student_seconds'] or 0:.0f} s, writing the pool "
            f"{r['write_pool_seconds']:.0f} s."]


def _hours_lines(res: dict) -> list[str]:
    rows = [(m["label"], m["hours"]) for m in res.get("students", {}).values() if "hours" in m]
    if not rows:
        return []
    h0 = rows[0][1]
    d0 = h0["dry_run"]
    lines = ["", f"GPU-hours on the assumed pool at the measured rates (one GPU; {h0['epochs']:g} epochs; a race stopped "
             f"at {_pct(h0['race_fraction'])} of the budget; a calibration proxy: the probe and a run on each of the "
             f"{h0['calibration_sets']} sets, {h0['calibration_eval_problems']} held-out problems, one seed), beside "
             f"what `advisor calibrate --dry-run` assumes ({d0['peak_tflops']:g} TFLOP/s, MFU {d0['assumed_mfu']:g}, "
             f"decode MFU {d0['assumed_decode_mfu']:g}):", "",
             "| student shape | probe (`recommend`) | one run | race (extra over one run) | calibration proxy | "
             "dry run's assumption for that proxy | MFU measured: train / forward / decode |", "|---|---|---|---|---|---|---|"]
    for label, h in rows:
        g, d, mfu = h["gpu_hours"], h["dry_run"], h["dry_run"]["measured_mfu"]
        lines.append(f"| {label} | {g['probe']:.2f} | {g['full_run']:.2f} | {g['race_total']:.2f} "
                     f"(+{g['race_extra']:.2f}) | **{g['calibration_proxy']:.2f}** | {d['assumed_gpu_hours']:.2f} | "
                     f"{mfu['train']:.2f} / {mfu['forward']:.2f} / {mfu['decode']:.3f} |")
    return lines


def table(res: dict) -> str:
    """The Markdown of docs/results.md section 3, from whatever parts the result holds."""
    inp = res["projection_inputs"]
    r, pool = inp["recipe"], inp["pool_assumed"]
    evals = next((m["projection"]["evaluations"] for m in res["students"].values() if "projection" in m), "the")
    mem = "peak CUDA memory (max_memory_allocated)" if res["device"] != "cpu" else "peak resident memory of the process (CPU, --quick)"
    ceiling = res.get("matmul_ceiling")
    lines = [f"`python -m benchmarks.gpu_check{' --quick' if res['quick'] else ''}` on {res['device']}; random weights at each "
             f"model's shape, {mem}; torch {res['versions']['torch']}, transformers {res['versions']['transformers']}"
             + (f"; matmul ceiling {ceiling['tflops']:,.1f} TFLOP/s ({ceiling['dtype']}, {ceiling['n']:,}² matmuls)" if ceiling else "")
             + ".", "",
             "| student shape | params | scoring (hf) | one probe step | one full-run step | evaluation generation (hf) | "
             f"projected `advisor recommend`, {pool['problems']:,} problems |",
             "|---|---|---|---|---|---|---|"]
    shape = " (--quick shape)" if res["quick"] else ""
    lines += [_student_row(m, shape) for m in res["students"].values()]
    if "recommend" in res:
        lines += _recommend_lines(res["recommend"])
    lines += _hours_lines(res)
    lines += ["", f"Projection inputs: the pool is assumed — {pool['problems']:,} problems × {pool['candidates']} candidates, "
              f"{pool['prompt_tokens']:,}-token prompts and {pool['response_tokens']:,}-token responses, scored up to "
              f"{inp['score_max_length']:,} tokens; the probe is probes/recipe.py's real-student recipe: {inp['sets']} sets × "
              f"{r['steps']} steps of {r['batch_size']} sequences of up to {r['max_length']:,} tokens, and "
              f"{evals} evaluations of {r['eval_problems']} problems × up to {r['max_new_tokens']:,} new "
              f"tokens (every generation assumed to run to the cap); a full run trains {r.get('train_batch', DASH)} "
              "sequences a step. Not included: loading the model, reading the pool, the checkpoint written at each "
              "evaluation, the predictor."]
    for part, why in {**res.get("skipped", {}), **res.get("errors", {})}.items():
        lines.append(f"\nNot measured: {part}: {why}.")
    return "\n".join(lines) + "\n"


def check_out(out: str) -> str | None:
    """Why --out cannot be written (None: it can): its folder made and a file written there."""
    folder = Path(out).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".gpu-check-{os.getpid()}.tmp"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    return None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_files(args, res) -> None:
    """The JSON at --out and the Markdown beside it, as they stand now."""
    if not args.out:
        return
    out = Path(args.out)
    _write(out, json.dumps(res, indent=2) + "\n")
    if res.get("students") is not None and "projection_inputs" in res:
        _write(out.with_suffix(".md"), table(res))


def write_and_print(args, res) -> None:
    write_files(args, res)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    summary(res)
    if res.get("students") is not None and "projection_inputs" in res:
        print()
        print(table(res), end="")
