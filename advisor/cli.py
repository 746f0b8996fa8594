"""`advisor`: one verb per stage (DESIGN.md). Each verb parses flags and calls one library function.

    advisor score  --model M --pool P --out DIR
    advisor select --pool P --scores DIR/scores.jsonl --strategy high --out train.jsonl
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from models.errors import InputError


class AdvisorGroup(click.Group):
    """Turns a user mistake (InputError) into one line and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=AdvisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="capacity-advisor")
def cli():
    """Which teacher responses should this student train on: high-, low-likelihood, or a mix?"""


def pool_options(f):
    """Flags that say how to read a pool; `score` and `select` must be given the same ones."""
    opts = [
        click.option("--prompt-field", default=None, help="Field holding the problem text (auto-detected)."),
        click.option("--responses-field", default=None, help="Field holding the candidates: a list (grouped) or one response per row (flat)."),
        click.option("--answer-field", default=None, help="Field holding the reference answer."),
        click.option("--correct-field", default=None, help="Field marking candidates correct (list or per row)."),
        click.option("--id-field", default=None, help="Problem id field; flat rows are grouped by it."),
        click.option("--all-candidates", is_flag=True, help="Keep candidates marked incorrect."),
        click.option("--strict", is_flag=True, help="Fail on any skipped candidate or problem instead of reporting it."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _pool_opts(kw: dict):
    from advisor.pool import PoolOptions

    return PoolOptions(**{k: kw.pop(k) for k in ("prompt_field", "responses_field", "answer_field",
                                                   "correct_field", "id_field", "all_candidates", "strict")})


def _show_pool(pool) -> None:
    from advisor.ui import console, kv_table

    s = pool.summary()
    rows = {"pool": s["source"], "layout": s["layout"], "problems": s["problems"], "candidates": s["candidates"],
            "per problem": s["candidates_per_problem"], "with answers": s["with_answers"]}
    if s["skipped_candidates"]:
        rows["skipped candidates"] = s["skipped_candidates"]
    if s["skipped_problems"]:
        rows["skipped problems"] = s["skipped_problems"]
        rows["e.g."] = "; ".join(f"{k}: {', '.join(v)}" for k, v in pool.skipped_examples.items())
    console.print(kv_table("Pool", rows))


@cli.command()
@click.option("--model", "-m", required=True, help="Student: a local HF folder, a hub id, or lab:NAME.")
@click.option("--pool", "-p", "pool_path", required=True, help="Pool file or datasets folder.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output folder (scores.jsonl, config.json).")
@pool_options
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), show_default=True)
@click.option("--dtype", default="auto", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), show_default=True)
@click.option("--backend", default="hf", type=click.Choice(["hf"]), show_default=True)
@click.option("--max-length", default=4096, show_default=True, help="Max prompt+response tokens; longer responses are cut and flagged.")
@click.option("--token-budget", default=8192, show_default=True, help="Padded tokens per forward batch.")
@click.option("--shard-size", default=512, show_default=True, help="Candidates per cached shard (the unit of resume).")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def score(model, pool_path, out, device, dtype, backend, max_length, token_budget, shard_size, seed, as_json, **kw):
    """Score every candidate response under the student (mean and summed log-prob per response)."""
    from advisor.pool import read_pool
    from advisor.scoring import ScoreConfig, score_pool
    from advisor.ui import console, emit_json, kv_table, progress, quiet_libraries
    from models.loading import load_model

    quiet_libraries()
    cfg = ScoreConfig(model, device, dtype, backend, max_length, token_budget, shard_size, seed)
    cfg.validate()
    pool = read_pool(pool_path, _pool_opts(kw))
    _show_pool(pool)
    with console.status(f"loading {model}"):
        lm = load_model(model, device=device, dtype=dtype)
    with progress("scoring", unit="candidates") as bar:
        task = bar.add_task("scoring", total=None, rate="")
        t0 = [time.perf_counter(), 0]

        def on_start(total, done):
            bar.update(task, total=total, completed=done)
            t0[1] = done

        def advance(n):
            bar.advance(task, n)
            done = bar.tasks[0].completed - t0[1]
            bar.update(task, rate=f"{done / max(1e-9, time.perf_counter() - t0[0]):.1f}/s")

        summary = score_pool(pool, cfg, out, lm=lm, on_start=on_start, advance=advance)
    summary["pool"] = pool.summary()
    if as_json:
        emit_json(summary)
    else:
        m = summary["model"]
        console.print(kv_table("Scores", {
            "model": f"{m['spec']} ({m['architecture']}, {m['n_params']:,} params, {m['dtype']})",
            "template": summary["template"], "candidates": summary["candidates"],
            "response tokens": summary["response_tokens"], "truncated": summary["truncated"],
            "reused from cache": summary["from_cache"], "seconds": summary["seconds"], "written": summary["scores"],
        }))


@cli.command()
@click.option("--pool", "-p", "pool_path", required=True, help="The pool that was scored.")
@click.option("--scores", "-s", "scores_path", required=True, help="scores.jsonl written by `advisor score`.")
@click.option("--strategy", default="high", show_default=True, help="high | low | mixed | curriculum.")
@click.option("--mix", default=0.5, show_default=True, help="mixed: share of problems given their low response.")
@click.option("--score", "score_kind", default="mean", show_default=True, help="Rank by mean (per-token) or sum log-prob.")
@click.option("--switch-epoch", default=1, show_default=True, help="curriculum: epoch at which training moves to the low set.")
@click.option("--format", "fmt", default="trl", show_default=True, help="trl (prompt/completion JSONL) | messages (JSONL) | alpaca (JSON).")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Dataset file to write.")
@pool_options
@click.option("--seed", default=0, show_default=True, help="Which problems take their low response in a mixed set.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def select(pool_path, scores_path, strategy, mix, score_kind, switch_epoch, fmt, out, seed, as_json, **kw):
    """Build D_high / D_low / D_mixed / curriculum from a scored pool and export it for training."""
    from advisor import select as sel_mod
    from advisor.pool import read_pool
    from advisor.ui import console, emit_json, kv_table
    from models.files import versions, write_json

    cfg = sel_mod.SelectConfig(strategy, mix, score_kind, seed, switch_epoch)
    cfg.validate()
    if fmt not in sel_mod.FORMATS:
        raise InputError(f"--format {fmt!r} is unknown: use one of {', '.join(sel_mod.FORMATS)}")
    pool = read_pool(pool_path, _pool_opts(kw))
    selection = sel_mod.select(pool, sel_mod.load_scores(scores_path), cfg)
    n = sel_mod.export(selection, out, fmt)
    summary = {**selection.summary, "format": fmt, "written": str(out), "rows_written": n}
    write_json(Path(out).with_name(Path(out).stem + ".config.json"), {
        "stage": "select", "versions": versions(), "settings": sel_mod.config_dict(cfg), "format": fmt,
        "pool": pool.summary(), "scores": str(scores_path), "summary": summary,
    })
    if as_json:
        emit_json(summary)
    else:
        s = summary
        console.print(kv_table(f"Selection: {strategy}", {
            "problems": s["problems"], "rows": s["rows"], "rows from the low set": s["rows_from_low"],
            f"log-prob ({score_kind}), high set": s["mean_score_high"],
            f"log-prob ({score_kind}), low set": s["mean_score_low"],
            "likelihood gap (high - low)": s["likelihood_gap"],
            "length ratio (low / high tokens)": s["length_ratio_low_high"],
            "problems where high = low": s["same_candidate"], "written": f"{out} ({fmt})",
        }))


@cli.command()
@click.option("--model", "-m", required=True, help="Student: a local HF folder, a hub id, or lab:NAME.")
@click.option("--pool", "-p", "pool_path", required=True, help="Pool file or datasets folder.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output folder (probe.json, probe.png).")
@click.option("--scores", "scores_path", default=None, help="scores.jsonl of this pool under this model (else scored now, cached).")
@click.option("--steps", default=100, show_default=True, help="Optimizer steps per strategy.")
@click.option("--batch-size", default=8, show_default=True)
@click.option("--learning-rate", type=float, default=None, help="Default: by model size.")
@click.option("--eval-every", default=25, show_default=True)
@click.option("--eval-problems", default=32, show_default=True, help="Held-out problems for generations and teacher NLL.")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--max-length", default=2048, show_default=True)
@click.option("--strategies", default="high,low", show_default=True, help="Comma list of high, low, mixed.")
@click.option("--lora-r", default=0, show_default=True, help="0 = full fine-tuning; > 0 = LoRA rank (needs peft).")
@click.option("--teacher", default=None, help="Teacher model, for the teacher's view of the student's generations.")
@click.option("--checker", default="auto", show_default=True, help="Answer checker: auto | lab | math | none.")
@pool_options
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), show_default=True)
@click.option("--dtype", default="auto", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report's features and cost as JSON on stdout.")
def probe(model, pool_path, out, scores_path, steps, batch_size, learning_rate, eval_every, eval_problems,
          max_new_tokens, max_length, strategies, lora_r, teacher, checker, device, dtype, seed, as_json, **kw):
    """Short SFT runs on D_high and D_low from the same base: how does this student take to each?"""
    from advisor.probe import run_probe_stage
    from advisor.ui import emit_json, quiet_libraries
    from probes.run import ProbeConfig

    quiet_libraries()
    cfg = ProbeConfig(steps=steps, batch_size=batch_size, learning_rate=learning_rate, eval_every=eval_every,
                      eval_problems=eval_problems, max_new_tokens=max_new_tokens, max_length=max_length,
                      strategies=tuple(s.strip() for s in strategies.split(",") if s.strip()), lora_r=lora_r,
                      seed=seed, device=device, dtype=dtype, teacher=teacher)
    report = run_probe_stage(model, pool_path, _pool_opts(kw), cfg, out, scores_path=scores_path, checker=checker)
    if as_json:
        emit_json({"features": report["features"], "cost": report["cost"], "probe": str(Path(out) / "probe.json")})


def main():  # console-script entry point
    cli()


if __name__ == "__main__":
    main()
