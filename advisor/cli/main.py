"""`advisor`: one verb per stage. Each verb parses its flags, builds the library's config from
them, calls one library function, and prints what it returns (`report`). Nothing here decides.

    advisor score  --model M --pool P --out DIR
    advisor select --pool P --scores DIR/scores.jsonl --strategy high --out train.jsonl

A flag for a setting of a library config is declared with `field_option` (its default and type
come from the config's field) and stored under the field's name, so `take(Config, kw)` builds the
config: each setting is stated once, where its flag is declared.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import click

from capacity_advisor.advisor.cli import report
from capacity_advisor.advisor.cli.lab import lab
from capacity_advisor.advisor.cli.options import (
    Finite, SEEDS, checker_option, dataset_options, device_options, dp_options, field_option, json_option, model_option,
    names, numbers, pool_options, pool_settings, recipe_given, recipe_options, retired_flags, score_option, seed_option,
    skip_tokens_option, take, vllm_options,
)
from capacity_advisor.advisor.cli.proxies import calibrate
from capacity_advisor.advisor.cli.train import train
from capacity_advisor.advisor.cli.ui import console, emit_json, prepare, quiet_libraries, work, work_progress
from capacity_advisor.advisor.fit import FitSettings, MAX_DRAWS, MAX_JOBS, MAX_MEMBERS, fit_file
from capacity_advisor.advisor.predictor.gate import COSTS, RACE_GRIDS
from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
from capacity_advisor.advisor.predictor import FEATURE_SETS
from capacity_advisor.advisor.probe.stage import ProbeJob, probe_job, progress_label, progress_unit
from capacity_advisor.advisor.recommendation.recommend import RecommendConfig, recommend as run
from capacity_advisor.advisor.scoring.compute import PROBLEM_FILTERS
from capacity_advisor.advisor.scoring.jobs import ScoreJob, SelectJob, score_file, select_file
from capacity_advisor.advisor.scoring.score import ScoreConfig
from capacity_advisor.advisor.scoring.select import FORMATS, SelectConfig
from capacity_advisor.core.errors import InputError, one_line
from capacity_advisor.models.backends import BACKENDS
from capacity_advisor.models.lab.tasks import PRETRAINED
from capacity_advisor.training.manifest import STRATEGIES


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
            # The last line of defence; verbs check their outputs up front (core.files.check_writable_*).
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {one_line(where + (e.strerror or str(e)))}; check the path and its permissions", err=True)
            ctx.exit(2)


# Faults of the user's filesystem (a path under a file, no permission, a read-only or full disk),
# not of this program.
_FILESYSTEM_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC,
                      errno.EDQUOT, errno.ENAMETOOLONG, errno.EEXIST, errno.ELOOP}


@click.group(cls=AdvisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="capacity-advisor")
def cli():
    """Which teacher responses should this student train on: high-, low-likelihood, or a mix?"""
    prepare()



@cli.command()
@model_option
@field_option(ScoreJob, "pool", "--pool", "-p", required=True)
@field_option(ScoreJob, "out", "--out", "-o", required=True, type=click.Path(file_okay=False))
@pool_options
@device_options
@field_option(ScoreConfig, "backend", type=click.Choice(tuple(BACKENDS)),
              help="hf: transformers, any device. vllm: GPUs, in its own environment (docs/vllm.md).")
@field_option(ScoreConfig, "score_length", "--score-length",
              help="Scoring: prompt + response tokens of each candidate; longer ones are cut and flagged.")
@retired_flags("score")
@field_option(ScoreConfig, "token_budget",
              help="Padded tokens per forward batch (default: 1,024 on CPU, 8,192 on GPU; vllm: max_num_batched_tokens).")
@field_option(ScoreConfig, "shard_size", help="Candidates per cached shard (the unit of resume).")
@skip_tokens_option
@field_option(ScoreConfig, "local_window",
              help="Also score each step with only this many tokens of context (for --score local; 0: off).")
@field_option(ScoreJob, "compute_budgets")
@field_option(ScoreJob, "compute_samples")
@checker_option
@vllm_options
@dp_options
@seed_option("Sampling of --compute-samples (scoring itself is deterministic).")
@json_option
def score(as_json, **kw):
    """Score every candidate response under the student (mean and summed log-prob per response)."""
    quiet_libraries()
    pool_opts = pool_settings(kw)
    job = take(ScoreJob, kw)
    cfg = take(ScoreConfig, kw)
    with work() as w:
        task = []
        summary = score_file(job, pool_opts, cfg, say=w.status, on_pool=report.pool,
                             start=lambda d, total, done, unit: task.append(w.start(d, total, done, unit)),
                             advance=lambda n: w.advance(task[-1], n))
    if as_json:
        emit_json(summary)
    if "waiting_for" in summary:
        report.waiting("scored", summary, cfg.dp_rank, cfg.dp_size, Path(job.out) / "scores.jsonl")
    elif not as_json:
        report.scores(summary, cfg.backend)
    if summary.get("compute") and not as_json:
        report.compute(summary["compute"])


@cli.command()
@field_option(SelectJob, "pool", "--pool", "-p", required=True)
@field_option(SelectJob, "scores", "--scores", "-s", required=True)
@field_option(SelectConfig, "strategy", type=click.Choice(STRATEGIES))
@field_option(SelectConfig, "mix", help="mixed: share of problems given their low response.")
@score_option
@field_option(SelectConfig, "switch_epoch", help="curriculum: epoch at which training moves to the low set.")
@field_option(SelectJob, "format", type=click.Choice(FORMATS))
@field_option(SelectJob, "out", "--out", "-o", required=True, type=click.Path(dir_okay=False))
@field_option(SelectJob, "problems", type=click.Choice(PROBLEM_FILTERS))
@field_option(SelectJob, "compute")
@field_option(SelectJob, "candidates", type=click.Path(dir_okay=False))
@pool_options
@seed_option("Which problems take their low response in a mixed set.")
@json_option
def select(as_json, **kw):
    """Build D_high / D_low / D_mixed / curriculum from a scored pool and export it for training."""
    quiet_libraries()
    pool_opts = pool_settings(kw)
    job = take(SelectJob, kw)
    cfg = take(SelectConfig, kw)
    summary = select_file(job, pool_opts, cfg)
    if as_json:
        emit_json(summary)
    else:
        report.selection(summary, cfg.strategy, cfg.score, job.out, job.format)


@cli.command()
@model_option
@field_option(ProbeJob, "pool", "--pool", "-p", required=True, help="Pool file or datasets folder.")
@field_option(ProbeJob, "out", "--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Output folder (probe.json, probe.png).")
@field_option(ProbeJob, "scores", help="scores.jsonl of this pool under this model (else scored now, cached).")
@field_option(ProbeJob, "predictor",
              help="Measure the way this predictor's inputs were measured (a folder from `advisor fit`; default: the shipped one).")
@recipe_options("probe")
@field_option(ProbeJob, "learning_rate", type=Finite(low=0), help="Default: the recipe's rule (the lab's, else by model size).")
@field_option(ProbeJob, "strategies", help="Comma list of high, low, mixed.")
@field_option(ProbeJob, "lora_r", help="0 = full fine-tuning; > 0 = LoRA rank (needs peft).")
@field_option(ProbeJob, "teacher", help="Teacher model, for the teacher's view of the student's generations.")
@checker_option
@score_option
@pool_options
@device_options
@seed_option("Held-out slice and data order.")
@json_option
def probe(strategies, as_json, **kw):
    """Short SFT runs on D_high and D_low from the same base: how does this student take to each?"""
    quiet_libraries()
    job = take(ProbeJob, kw, strategies=names(strategies, "--strategies"), recipe=recipe_given(kw),
               pool_options=vars(pool_settings(kw)))
    with work("steps") as w:
        result = probe_job(job, say=w.status, progress=lambda s, step, total: w.steps(progress_label(s, ""), step, total,
                                                                      unit=progress_unit(s)))
    if as_json:
        emit_json({"features": result["features"], "cost": result["cost"], "chosen": result["chosen"],
                   "notes": result["notes"], "probe": str(Path(job.out) / "probe.json")})
    else:
        report.probe(result, job.out)


@cli.command()
@field_option(GenerateConfig, "teacher", "--teacher", "-t", required=True, help="Teacher: a local HF folder, a hub id, or lab:NAME.")
@field_option(GenerateConfig, "problems", "--problems", "-p", required=True,
              help="Problems file (JSONL, JSON, Parquet) or datasets folder.")
@field_option(GenerateConfig, "out", "--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="Pool to write: .jsonl or .parquet.")
@field_option(GenerateConfig, "n", "--n", "-n", help="Candidates per problem.")
@field_option(GenerateConfig, "temperature", help="Sampling temperature (0 = greedy, with --n 1).")
@field_option(GenerateConfig, "top_p")
@field_option(GenerateConfig, "max_new_tokens", help="Longer candidates are cut and marked unfinished.")
@checker_option
@field_option(GenerateConfig, "prompt_field", help="Field holding the problem text (auto-detected).")
@field_option(GenerateConfig, "answer_field", help="Field holding the reference answer (auto-detected).")
@field_option(GenerateConfig, "id_field", help="Problem id field (auto-detected; else the row number).")
@field_option(GenerateConfig, "limit", help="Only the first N problems.")
@dataset_options
@field_option(GenerateConfig, "backend", type=click.Choice(("auto", *BACKENDS)), help="auto: vllm when it and a GPU are present, else hf.")
@device_options
@field_option(GenerateConfig, "shard_size", help="Problems per cached shard (the unit of resume).")
@field_option(GenerateConfig, "token_budget", help="Prompt + new tokens per generation batch (default: by device).")
@vllm_options
@dp_options
@seed_option("Sampling seed (each shard's draws derive from it).")
@json_option
def generate(as_json, **kw):
    """Sample --n candidate responses per problem from a teacher, check them, write a grouped pool."""
    quiet_libraries()
    cfg = take(GenerateConfig, kw)
    with work_progress("generating", unit="problems", rate_format="{:.2f}/s") as (on_start, advance):
        summary = generate_pool(cfg, on_start=on_start, advance=advance)
    if as_json:
        emit_json(summary)
    if "waiting_for" in summary:
        report.waiting("generated", summary, cfg.dp_rank, cfg.dp_size, cfg.out)
    elif not as_json:
        report.generated(summary, cfg.out)


@cli.command()
@click.option("--records", "-r", "records_path", multiple=True,
              help="RunRecords JSONL (default: the records store); repeat it to fit on several files: the first is the "
                   "calibration, pool sources only later files hold are marked as your own.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Predictor folder to write.")
@field_option(FitSettings, "tie_margin", type=Finite(0, 1))
@field_option(FitSettings, "features", type=click.Choice(tuple(FEATURE_SETS)))
@field_option(FitSettings, "kinds")
@field_option(FitSettings, "cv")
@field_option(FitSettings, "choose_by")
@field_option(FitSettings, "open_cap")
@field_option(FitSettings, "cost", type=click.Choice(COSTS))
@field_option(FitSettings, "race_grid", type=click.Choice(tuple(RACE_GRIDS)))
@field_option(FitSettings, "scout")
@field_option(FitSettings, "high_scout")
@field_option(FitSettings, "gap_scout")
@field_option(FitSettings, "gap_scout_at")
@field_option(FitSettings, "gap_scout_added")
@field_option(FitSettings, "race_hold")
@field_option(FitSettings, "race_hold_added", type=Finite(0, 10))
@field_option(FitSettings, "race_tie_added", type=Finite(0, 1))
@field_option(FitSettings, "n_members", "--members", type=click.IntRange(1, MAX_MEMBERS))
@field_option(FitSettings, "cv_members", "--cv-members", type=click.IntRange(1, MAX_MEMBERS))
@field_option(FitSettings, "gate_draws", "--gate-draws", type=click.IntRange(1, MAX_DRAWS))
@field_option(FitSettings, "jobs", type=click.IntRange(1, MAX_JOBS))
@field_option(FitSettings, "seed", type=SEEDS)
@field_option(FitSettings, "note")
@json_option
def fit(records_path, out, kinds, cv, choose_by, race_hold, as_json, **kw):
    """Fit the predictor on RunRecords; print its cross-validated tables against the baselines."""
    log = None if as_json else (lambda m: console.print(m, highlight=False))
    settings = take(FitSettings, kw, kinds=names(kinds, "--kinds"), cv=names(cv, "--cv"),
                    choose_by=names(choose_by, "--choose-by"), race_hold=numbers(race_hold, "--race-hold"))
    result = fit_file(records_path, out, settings, log=log)
    if as_json:
        emit_json(result)
    else:
        report.cross_validation(result)


@cli.command()
@model_option
@field_option(RecommendConfig, "budget", "--budget", "-b", required=True, help="Epochs of the full run you plan.")
@field_option(RecommendConfig, "pool", "--pool", "-p", help="Pool (default for lab students: the lab teacher's pool).")
@field_option(RecommendConfig, "scores",
              help="scores.jsonl of --pool under --model (e.g. from `advisor score --backend vllm`); else scored now.")
@field_option(RecommendConfig, "out", "--out", "-o", required=True, type=click.Path(file_okay=False))
@field_option(RecommendConfig, "teacher", help="Teacher model, for the teacher's view in the probe.")
@field_option(RecommendConfig, "no_probe",
              help="Advice from the parameter count and budget alone (the lab's or the paper's findings).")
@field_option(RecommendConfig, "predictor", help="Predictor folder from `advisor fit` (default: the shipped one).")
@field_option(RecommendConfig, "sample", help="Rank and probe on N problems drawn with --seed (large pools).")
@recipe_options("recommend")
@field_option(RecommendConfig, "probe_repeats",
              help="Probe N draws (held-out slice and data order from --seed, --seed+1, ...), average their inputs, and "
                   "show each draw's own advice; N times the probe's cost.")
@field_option(RecommendConfig, "backend", type=click.Choice(tuple(BACKENDS)),
              help="Scoring backend (the probe trains with transformers either way).")
@field_option(RecommendConfig, "lab_task", type=click.Choice(PRETRAINED))
@field_option(RecommendConfig, "lab_n", help="Problems of the lab pool.")
@checker_option
@score_option
@skip_tokens_option
@pool_options
@device_options
@seed_option("Held-out slice, --sample draw, mixed set, data order.")
@json_option
def recommend(as_json, **kw):
    """Score, select, probe, predict: train on high, low or mixed for this student and budget?"""
    quiet_libraries()
    cfg = take(RecommendConfig, kw, recipe=recipe_given(kw), pool_options=vars(pool_settings(kw)))
    with work("steps") as w:
        result = run(cfg, status=w.status, progress=lambda s, step, total: w.steps(progress_label(s), step, total,
                                                                 unit=progress_unit(s)))
    if as_json:
        emit_json(result.as_dict())
    else:
        report.recommendation(result, cfg.out)


for command in (calibrate, lab, train):  # the verbs with modules of their own
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """The `advisor` console script: runs one verb on `argv` (default: the command line) and returns
    its exit code (0, or 2 after a mistake's one `error:` line)."""
    try:
        code = cli.main(args=argv, prog_name="advisor", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
