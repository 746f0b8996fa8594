"""`advisor`: one verb per stage. Each verb parses its flags, builds the library's config from
them, calls one library function, and prints what it returns (`report`). Nothing here decides.

    advisor score  --model M --pool P --out DIR
    advisor select --pool P --scores DIR/scores.jsonl --strategy high --out train.jsonl
"""

from __future__ import annotations

import errno
from pathlib import Path

import click

from capacity_advisor.models.errors import InputError, one_line
from capacity_advisor.probes.run import DEFAULT_EVAL_PROBLEMS as PROBE_EVAL_PROBLEMS, DEFAULT_STEPS as PROBE_STEPS
from capacity_advisor.advisor.predictor import FEATURE_SETS, FITTABLE, SPLITS


class UsageLine(click.ClickException):
    """A click usage error shown as the same one `error:` line as any other mistake (click's own
    shows four: usage, hint, blank, error)."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _usage_line(e: click.UsageError) -> UsageLine:
    where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
    return UsageLine(one_line(e.format_message()).rstrip(".") + where)


class AdvisorGroup(click.Group):
    """Turns a user mistake (InputError, a usage error, an unwritable path) into one `error:` line
    and exit code 2, never a traceback. It wraps every verb, subgroups' verbs included."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare `advisor`: the help text is the answer
        except click.UsageError as e:
            raise _usage_line(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            raise _usage_line(e) from None
        except InputError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)
        except OSError as e:
            if e.errno not in _FILESYSTEM_ERRNOS:
                raise
            # The last line of defence; verbs check their outputs up front (models.files.check_writable_*).
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {one_line(where + (e.strerror or str(e)))}; check the path and its permissions", err=True)
            ctx.exit(2)


# Faults of the user's filesystem (a path under a file, no permission, a read-only or full disk),
# not of this program.
_FILESYSTEM_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC,
                      errno.EDQUOT, errno.ENAMETOOLONG, errno.EEXIST}


@click.group(cls=AdvisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="capacity-advisor")
def cli():
    """Which teacher responses should this student train on: high-, low-likelihood, or a mix?"""


from capacity_advisor.advisor.cli import report  # noqa: E402  (below the group it renders for)
from capacity_advisor.advisor.cli.options import (  # noqa: E402
    checker_option, dataset_options, device_options, dp_options, floats, ints, json_option, model_option, names, pool_options,
    pool_settings,
    score_option, seed_option, skip_tokens_option, vllm_options,
)


@cli.command()
@model_option
@click.option("--pool", "-p", "pool_path", required=True, help="Pool file or datasets folder.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output folder (scores.jsonl, config.json).")
@pool_options
@device_options
@click.option("--backend", default="hf", type=click.Choice(["hf", "vllm"]), show_default=True,
              help="hf: transformers, any device. vllm: GPUs, in its own environment (docs/vllm.md).")
@click.option("--max-length", default=4096, show_default=True, help="Max prompt+response tokens; longer responses are cut and flagged.")
@click.option("--token-budget", default=None, type=int,
              help="Padded tokens per forward batch (default: 1,024 on CPU, 8,192 on GPU; vllm: max_num_batched_tokens).")
@click.option("--shard-size", default=512, show_default=True, help="Candidates per cached shard (the unit of resume).")
@skip_tokens_option
@click.option("--local-window", default=0, show_default=True,
              help="Also score each step with only this many tokens of context (for --score local; 0: off).")
@click.option("--compute-budgets", default=None,
              help="SHORT,LONG new tokens: also measure which problems the student solves only with the long budget "
                   "(OUT/compute.jsonl, for select --problems).")
@click.option("--compute-samples", default=1, show_default=True, help="Attempts per budget (1: greedy).")
@checker_option
@vllm_options
@dp_options
@seed_option("Sampling of --compute-samples (scoring itself is deterministic).")
@json_option
def score(model, pool_path, out, device, dtype, backend, max_length, token_budget, shard_size, skip_tokens, local_window,
          compute_budgets, compute_samples, checker, tensor_parallel_size, gpu_memory_utilization, dp_rank, dp_size, seed,
          as_json, **kw):
    """Score every candidate response under the student (mean and summed log-prob per response)."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries, work_progress
    from capacity_advisor.advisor.pool import read_pool
    from capacity_advisor.advisor.scoring import ScoreConfig, load_for, score_pool
    from capacity_advisor.models.files import advisor_home, check_writable_dir

    quiet_libraries()
    cfg = ScoreConfig(model=model, device=device, dtype=dtype, backend=backend, max_length=max_length,
                      token_budget=token_budget, shard_size=shard_size, seed=seed,
                      tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                      dp_rank=dp_rank, dp_size=dp_size, skip_tokens=skip_tokens, local_window=local_window)
    cfg.validate()
    compute = None
    if compute_budgets:
        from capacity_advisor.advisor.compute import ComputeConfig

        compute = ComputeConfig.parse(compute_budgets, compute_samples, seed)
    check_writable_dir(out, "--out")
    check_writable_dir(advisor_home(), "ADVISOR_HOME (the score cache)")
    pool = read_pool(pool_path, pool_settings(kw))
    with console.status(f"loading {model}"):
        lm = load_for(cfg)
    with work_progress("scoring", unit="candidates") as (on_start, advance):
        def start(total: int, done: int) -> None:  # inputs, model and cache are all usable by now
            report.pool(pool)
            on_start(total, done)

        summary = score_pool(pool, cfg, out, lm=lm, on_start=start, advance=advance)
    summary["pool"] = pool.summary()
    if as_json:
        emit_json(summary)
    if "waiting_for" in summary:
        console.print(f"rank {dp_rank}/{dp_size}: scored {summary['computed']} shard(s); {len(summary['waiting_for'])} of "
                      f"{summary['shards']} shards are still being scored by other ranks. The last rank to finish writes "
                      f"{Path(out) / 'scores.jsonl'}; rerun with --dp-size 1 to score what is missing and write it here.")
    elif not as_json:
        report.scores(summary, backend)
    if compute and "waiting_for" not in summary:
        from capacity_advisor.advisor import compute as compute_mod
        from capacity_advisor.advisor.probe import pick_checker
        from capacity_advisor.models.backends import make_backend
        from capacity_advisor.models.files import write_jsonl

        gen = make_backend("hf", lm, token_budget=token_budget) if backend == "hf" else \
            make_backend("vllm", lm, token_budget=token_budget or 8192, tensor_parallel_size=tensor_parallel_size,
                         gpu_memory_utilization=gpu_memory_utilization, seed=seed)
        with work_progress("short and long attempts", unit="problems") as (on_start, advance):
            on_start(2 * len(pool), 0)
            rows = compute_mod.measure(gen, pool, compute, pick_checker(pool, checker), progress=advance)
        write_jsonl(Path(out) / "compute.jsonl", rows)
        counts = {c: sum(r["class"] == c for r in rows) for c in compute_mod.CLASSES}
        console.print(f"compute-responsive: {counts} (budgets {compute.short} and {compute.long} new tokens); "
                      f"wrote {Path(out) / 'compute.jsonl'}")


@cli.command()
@click.option("--pool", "-p", "pool_path", required=True, help="The pool that was scored.")
@click.option("--scores", "-s", "scores_path", required=True, help="scores.jsonl written by `advisor score`.")
@click.option("--strategy", default="high", show_default=True, type=click.Choice(["high", "low", "mixed", "curriculum"]))
@click.option("--mix", default=0.5, show_default=True, help="mixed: share of problems given their low response.")
@score_option
@click.option("--switch-epoch", default=1, show_default=True, help="curriculum: epoch at which training moves to the low set.")
@click.option("--format", "fmt", default="trl", show_default=True, type=click.Choice(["trl", "messages", "alpaca"]),
              help="trl: prompt/completion JSONL; messages: chat JSONL; alpaca: one JSON array.")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Dataset file to write.")
@click.option("--problems", "problem_class", default="all", show_default=True,
              type=click.Choice(["all", "responsive", "solved", "unsolved"]),
              help="Keep one class of problems (needs `score --compute-budgets`): responsive = solved only with the long budget.")
@click.option("--compute", "compute_path", default=None, help="compute.jsonl (default: beside --scores).")
@click.option("--candidates", "candidates_path", default=None, type=click.Path(dir_okay=False),
              help="Also write every candidate of the selected problems here, for training.rerank.")
@pool_options
@seed_option("Which problems take their low response in a mixed set.")
@json_option
def select(pool_path, scores_path, strategy, mix, score_kind, switch_epoch, fmt, out, problem_class, compute_path,
           candidates_path, seed, as_json, **kw):
    """Build D_high / D_low / D_mixed / curriculum from a scored pool and export it for training."""
    from capacity_advisor.advisor import select as sel_mod
    from capacity_advisor.advisor.cli.ui import emit_json
    from capacity_advisor.advisor.pool import read_pool
    from capacity_advisor.models.files import check_writable_file, versions, write_json

    cfg = sel_mod.SelectConfig(strategy=strategy, mix=mix, score=score_kind, seed=seed, switch_epoch=switch_epoch)
    cfg.validate()
    check_writable_file(out, "--out")
    if candidates_path:
        check_writable_file(candidates_path, "--candidates")
    pool = read_pool(pool_path, pool_settings(kw))
    if problem_class != "all":
        from capacity_advisor.advisor.compute import keep_problems

        pool = keep_problems(pool, compute_path or Path(scores_path).with_name("compute.jsonl"), problem_class)
    selection = sel_mod.select(pool, sel_mod.load_scores(scores_path), cfg)
    n = sel_mod.export(selection, out, fmt)
    if candidates_path:
        from capacity_advisor.models.files import write_jsonl

        ids = {r["id"] for r in selection.rows}
        write_jsonl(candidates_path, ({"id": p.id, "prompt": p.prompt, "responses": [c.text for c in p.candidates]}
                                      for p in pool.problems if p.id in ids))
    summary = {**selection.summary, "format": fmt, "written": str(out), "rows_written": n, "problems_kept": problem_class}
    write_json(Path(out).with_name(Path(out).stem + ".config.json"), {
        "stage": "select", "versions": versions(), "settings": sel_mod.config_dict(cfg), "format": fmt,
        "pool": pool.summary(), "scores": str(scores_path), "summary": summary,
    })
    if as_json:
        emit_json(summary)
    else:
        report.selection(summary, strategy, score_kind, out, fmt)


@cli.command()
@model_option
@click.option("--pool", "-p", "pool_path", required=True, help="Pool file or datasets folder.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output folder (probe.json, probe.png).")
@click.option("--scores", "scores_path", default=None, help="scores.jsonl of this pool under this model (else scored now, cached).")
@click.option("--steps", default=PROBE_STEPS, show_default=True, help="Optimizer steps per strategy.")
@click.option("--batch-size", default=8, show_default=True)
@click.option("--learning-rate", type=float, default=None, help="Default: the lab recipe's, else by model size.")
@click.option("--warmup-steps", default=10, show_default=True, help="Linear warm-up, then a constant rate.")
@click.option("--eval-every", default=25, show_default=True)
@click.option("--eval-problems", default=PROBE_EVAL_PROBLEMS, show_default=True,
              help="Held-out problems for generations and teacher NLL.")
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--max-length", default=2048, show_default=True)
@click.option("--strategies", default="high,low", show_default=True, help="Comma list of high, low, mixed.")
@click.option("--lora-r", default=0, show_default=True, help="0 = full fine-tuning; > 0 = LoRA rank (needs peft).")
@click.option("--teacher", default=None, help="Teacher model, for the teacher's view of the student's generations.")
@checker_option
@score_option
@pool_options
@device_options
@seed_option("Held-out slice and data order.")
@json_option
def probe(model, pool_path, out, scores_path, steps, batch_size, learning_rate, warmup_steps, eval_every, eval_problems,
          max_new_tokens, max_length, strategies, lora_r, teacher, checker, score_kind, device, dtype, seed, as_json, **kw):
    """Short SFT runs on D_high and D_low from the same base: how does this student take to each?"""
    from capacity_advisor.advisor.cli.ui import console, emit_json, progress, quiet_libraries
    from capacity_advisor.advisor.pool import read_pool
    from capacity_advisor.advisor.probe import probe_pool
    from capacity_advisor.advisor.recommend import learning_rate as default_rate
    from capacity_advisor.models.files import check_writable_dir
    from capacity_advisor.models.loading import check_model_spec, load_model
    from capacity_advisor.probes.run import ProbeConfig

    quiet_libraries()
    cfg = ProbeConfig(steps=steps, batch_size=batch_size, learning_rate=learning_rate, warmup_steps=warmup_steps,
                      eval_every=eval_every, eval_problems=eval_problems, max_new_tokens=max_new_tokens,
                      max_length=max_length, strategies=names(strategies, "--strategies"), lora_r=lora_r, seed=seed,
                      device=device, dtype=dtype, teacher=teacher)
    cfg.validate()
    check_model_spec(model)
    check_writable_dir(out, "--out")
    pool = read_pool(pool_path, pool_settings(kw))
    with console.status(f"loading {model}"):
        lm = load_model(model, device=device, dtype=dtype)
    cfg.learning_rate = cfg.learning_rate or default_rate(model, lm.description["n_params"])[0]
    with progress("probe", unit="steps") as bar:
        tasks = {s: bar.add_task(f"D_{s}", total=cfg.steps, rate="") for s in cfg.strategies}
        stage = probe_pool(model, pool, cfg, lm, Path(out) / "score", out, scores_path=scores_path, checker=checker,
                           score=score_kind, max_length=max_length,
                           progress=lambda s, step, total: bar.update(tasks[s], completed=step))
    if as_json:
        emit_json({"features": stage.report["features"], "cost": stage.report["cost"],
                   "probe": str(Path(out) / "probe.json")})
    else:
        report.probe(stage.report, out)


@cli.command()
@click.option("--teacher", "-t", required=True, help="Teacher: a local HF folder, a hub id, or lab:NAME.")
@click.option("--problems", "-p", required=True, help="Problems file (JSONL, JSON, Parquet) or datasets folder.")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Pool to write: .jsonl or .parquet.")
@click.option("--n", "-n", "n", default=4, show_default=True, help="Candidates per problem.")
@click.option("--temperature", default=0.6, show_default=True, help="Sampling temperature (0 = greedy, with --n 1).")
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--max-new-tokens", default=4096, show_default=True, help="Longer candidates are cut and marked unfinished.")
@checker_option
@click.option("--prompt-field", default=None, help="Field holding the problem text (auto-detected).")
@click.option("--answer-field", default=None, help="Field holding the reference answer (auto-detected).")
@click.option("--id-field", default=None, help="Problem id field (auto-detected; else the row number).")
@click.option("--limit", default=None, type=int, help="Only the first N problems.")
@dataset_options
@click.option("--backend", default="auto", type=click.Choice(["auto", "hf", "vllm"]), show_default=True,
              help="auto: vllm when it and a GPU are present, else hf.")
@device_options
@click.option("--shard-size", default=64, show_default=True, help="Problems per cached shard (the unit of resume).")
@click.option("--token-budget", default=None, type=int, help="Prompt + new tokens per generation batch (default: by device).")
@vllm_options
@dp_options
@seed_option("Sampling seed (each shard's draws derive from it).")
@json_option
def generate(teacher, problems, out, n, temperature, top_p, max_new_tokens, checker, prompt_field, answer_field, id_field,
             limit, split, subset, revision, backend, device, dtype, shard_size, token_budget, tensor_parallel_size, gpu_memory_utilization,
             dp_rank, dp_size, seed, as_json):
    """Sample --n candidate responses per problem from a teacher, check them, write a grouped pool."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries, work_progress
    from capacity_advisor.advisor.generate import GenerateConfig, generate_pool

    quiet_libraries()
    cfg = GenerateConfig(teacher=teacher, problems=problems, out=out, n=n, temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, backend=backend, device=device, dtype=dtype, checker=checker,
                         prompt_field=prompt_field, answer_field=answer_field, id_field=id_field, limit=limit,
                         split=split, subset=subset, revision=revision,
                         shard_size=shard_size, token_budget=token_budget, tensor_parallel_size=tensor_parallel_size,
                         gpu_memory_utilization=gpu_memory_utilization, dp_rank=dp_rank, dp_size=dp_size, seed=seed)
    cfg.validate()
    with work_progress("generating", unit="problems", rate_format="{:.2f}/s") as (on_start, advance):
        summary = generate_pool(cfg, on_start=on_start, advance=advance)
    if as_json:
        emit_json(summary)
    if "waiting_for" in summary:
        console.print(f"rank {dp_rank}/{dp_size}: generated {summary['computed']} shard(s); {len(summary['waiting_for'])} "
                      f"of {summary['shards']} shards are with other ranks. The last rank to finish writes {out}.")
    elif not as_json:
        report.generated(summary, out)


@cli.command()
@click.option("--records", "-r", "records_path", default=None, help="RunRecords JSONL (default: the records store).")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Predictor folder to write.")
@click.option("--tie-margin", default=0.01, show_default=True, help="Accuracy gap under which strategies count as tied.")
@click.option("--features", "feature_set", default="probe", show_default=True, type=click.Choice(list(FEATURE_SETS)),
              help="probe: inputs every probe measures; contrast: D_low against D_high only; +teacher: also the teacher view.")
@click.option("--kinds", default=",".join(FITTABLE), show_default=True,
              help="Model kinds to cross-validate; the one whose policy does best leaving a pool source out is kept.")
@click.option("--cv", "cv_splits", default=",".join(SPLITS), show_default=True,
              help="Held-out tables to measure: comma-separated splits.")
@click.option("--choose-by", default="source", show_default=True, type=click.Choice(list(SPLITS)),
              help="The split whose held-out regret chooses the kind and the policy's thresholds.")
@click.option("--members", default=24, show_default=True, help="Ensemble members (bootstrap resamples of the calibration units).")
@click.option("--jobs", default=1, show_default=True, help="Processes fitting members in parallel.")
@seed_option("Bootstrap draws and LightGBM's seed.")
@click.option("--note", default=None, help="A line stored with the predictor (what the records were).")
@json_option
def fit(records_path, out, tie_margin, feature_set, kinds, cv_splits, choose_by, members, jobs, seed, note, as_json):
    """Fit the predictor on RunRecords; print its cross-validated tables against the baselines."""
    from capacity_advisor.advisor.cli.ui import console, emit_json
    from capacity_advisor.advisor.fit import check_settings, fit_and_save
    from capacity_advisor.advisor.predictor import read_records
    from capacity_advisor.models.files import advisor_home, check_writable_dir

    chosen, splits = names(kinds, "--kinds"), names(cv_splits, "--cv")
    check_settings(tie_margin, members, seed, jobs, chosen, splits, choose_by)
    check_writable_dir(out, "--out")
    path = records_path or str(advisor_home() / "records.jsonl")
    records = read_records(path)
    log = None if as_json else (lambda m: console.print(m, highlight=False))
    result = fit_and_save(records, out, tie_margin, feature_set, chosen, members, seed, jobs, note, splits, choose_by,
                          log=log)
    if as_json:
        emit_json(result)
    else:
        report.cross_validation(result)


@cli.command()
@click.option("--out", "-o", default="calibration", show_default=True, type=click.Path(file_okay=False))
@click.option("--sizes", default="", help="Comma-separated ladder students (default: the whole ladder).")
@click.option("--seeds", default="0,1,2", show_default=True, help="Pool draws and data orders, ranked by summed log-prob.")
@click.option("--mean-seeds", default="0", show_default=True, help="Seeds that also run the mean-ranked (GRAPE) arm; empty for none.")
@click.option("--tasks", default="modchain,addition", show_default=True)
@click.option("--epochs", default=5, show_default=True, help="The longest budget.")
@click.option("--n-train", default=3000, show_default=True, help="Problems per teacher pool.")
@click.option("--probe-steps", default=50, show_default=True, help="The longest probe; shorter ones are replayed from its prefix.")
@click.option("--jobs", default=1, show_default=True, help="Units in parallel, one torch thread each.")
@click.option("--teacher", default="lab:teacher", show_default=True,
              help="The lab model that samples the pools (lab:teacher, lab:teacher-xl), or 'program' for the scripted teacher's candidates.")
@click.option("--temperature", default=1.0, show_default=True, help="The teacher model's sampling temperature.")
@click.option("--budget-runs", default="", help="Also train each set of the first seed as runs of just these epochs, e.g. 1,2.")
@click.option("--schedules", default="", help="Options beyond D_high / D_low / D_mixed, e.g. mixed@0.25,mixed@0.75,curriculum@2.")
@click.option("--quick", is_flag=True, help="Tiny settings (one small student, one seed, one epoch, the scripted teacher) for tests.")
@json_option
def calibrate(out, sizes, seeds, mean_seeds, tasks, epochs, n_train, probe_steps, jobs, teacher, temperature, budget_runs,
              schedules, quick, as_json):
    """The lab sweep: teacher pools, probes and full high/low/mixed runs — RunRecords for `advisor fit`."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
    from capacity_advisor.advisor.lab.calibrate import CalibrateConfig, run_calibration
    from capacity_advisor.models.files import check_writable_dir

    quiet_libraries()
    if quick:
        cfg = CalibrateConfig.quick_settings(out)
    else:
        cfg = CalibrateConfig(out=out, sizes=names(sizes, "--sizes"), seeds=ints(seeds, "--seeds"),
                              mean_seeds=ints(mean_seeds, "--mean-seeds"), tasks=names(tasks, "--tasks"),
                              epochs=epochs, n_train=n_train, probe_steps=probe_steps, jobs=jobs, teacher=teacher,
                              temperature=temperature, budget_runs=floats(budget_runs, "--budget-runs"),
                              schedules=names(schedules, "--schedules"))
    cfg.validate()
    check_writable_dir(out, "--out")
    result = run_calibration(cfg, log=lambda m: console.print(m, highlight=False))
    if as_json:
        emit_json(result)
    else:
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s)")


@cli.command()
@model_option
@click.option("--budget", "-b", required=True, type=float, help="Epochs of the full run you plan.")
@click.option("--pool", "-p", "pool_path", default=None, help="Pool (default for lab students: the lab teacher's pool).")
@click.option("--scores", "scores_path", default=None,
              help="scores.jsonl of --pool under --model (e.g. from `advisor score --backend vllm`); else scored now.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False))
@click.option("--teacher", default=None, help="Teacher model, for the teacher's view in the probe.")
@click.option("--no-probe", is_flag=True,
              help="Advice from the parameter count and budget alone (the lab's or the paper's findings).")
@click.option("--predictor", default=None, help="Predictor folder from `advisor fit` (default: the shipped one).")
@click.option("--sample", default=None, type=int, help="Rank and probe on N problems drawn with --seed (large pools).")
@click.option("--max-length", default=None, type=int, help="Scoring: prompt + response tokens (default: by kind of student).")
@click.option("--probe-max-length", default=None, type=int, help="Probe training: prompt + response tokens.")
@click.option("--max-new-tokens", default=None, type=int, help="Evaluation generations in the probe and the manifest.")
@click.option("--probe-steps", default=None, type=int, help="Optimizer steps per probed set (default: by kind of student).")
@click.option("--probe-eval-problems", default=None, type=int, help="Held-out problems the probe evaluates on.")
@click.option("--backend", default="hf", show_default=True, type=click.Choice(["hf", "vllm"]),
              help="Scoring backend (the probe trains with transformers either way).")
@click.option("--lab-task", default="modchain", show_default=True, type=click.Choice(["modchain", "addition", "listmax"]))
@click.option("--lab-n", default=1000, show_default=True, help="Problems of the lab pool.")
@checker_option
@score_option
@skip_tokens_option
@pool_options
@device_options
@seed_option("Held-out slice, --sample draw, mixed set, data order.")
@json_option
def recommend(model, budget, pool_path, scores_path, out, teacher, no_probe, predictor, sample, max_length,
              probe_max_length, max_new_tokens, probe_steps, probe_eval_problems, backend, lab_task, lab_n, checker,
              score_kind, skip_tokens, device, dtype, seed, as_json, **kw):
    """Score, select, probe, predict: train on high, low or mixed for this student and budget?"""
    from capacity_advisor.advisor.cli.ui import emit_json, progress, quiet_libraries
    from capacity_advisor.advisor.recommend import RecommendConfig, recommend as run
    from capacity_advisor.models.files import check_writable_dir
    from capacity_advisor.models.loading import check_model_spec

    quiet_libraries()
    cfg = RecommendConfig(model=model, budget=budget, out=out, pool=pool_path, scores=scores_path, teacher=teacher,
                          no_probe=no_probe, predictor=predictor, lab_task=lab_task, lab_n=lab_n, sample=sample,
                          max_length=max_length, probe_max_length=probe_max_length, max_new_tokens=max_new_tokens,
                          probe_steps=probe_steps, probe_eval_problems=probe_eval_problems, backend=backend,
                          checker=checker, score=score_kind, skip_tokens=skip_tokens, device=device, dtype=dtype,
                          seed=seed, pool_options=vars(pool_settings(kw)))
    cfg.validate()
    check_model_spec(model)
    check_writable_dir(out, "--out")
    with progress("recommend", unit="steps") as bar:
        stage = bar.add_task("starting", total=None, rate="")

        def steps(strategy: str, step: int, total: int) -> None:
            bar.update(stage, description=f"probe D_{strategy}", total=total, completed=step)

        result = run(cfg, status=lambda m: bar.update(stage, description=m), progress=steps)
    if as_json:
        emit_json(result)
    else:
        report.recommendation(result, out)


def _register_subgroups() -> None:
    from capacity_advisor.advisor.cli.lab import lab
    from capacity_advisor.advisor.cli.train import train

    cli.add_command(lab)
    cli.add_command(train)


_register_subgroups()


def main():  # console-script entry point
    cli()


if __name__ == "__main__":
    main()
