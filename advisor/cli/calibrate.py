"""`advisor calibrate`: the lab sweep, or with --students the same protocol on the user's own pool.

The flags of both are declared here; each path checks that the other's flags were not given, then
calls one library function (`advisor.lab.calibrate.run_calibration`,
`advisor.calibrate_pool.run_pool_calibration`) and prints what it returns.
"""

from __future__ import annotations

from dataclasses import fields, replace

import click

from capacity_advisor.advisor.cli import report
from capacity_advisor.advisor.cli.options import (
    checker_option, device_options, field_option, floats, ints, json_option, names, pool_options, pool_settings, take,
)
from capacity_advisor.advisor.calibrate_pool import PoolCalibrateConfig
from capacity_advisor.training.launch import LAUNCHERS
from capacity_advisor.advisor.lab.units import CalibrateConfig
from capacity_advisor.models.errors import InputError


@click.command()
@field_option(CalibrateConfig, "out", "--out", "-o", type=click.Path(file_okay=False))
@field_option(CalibrateConfig, "sizes", help="Comma-separated ladder students (default: the whole ladder).")
@field_option(CalibrateConfig, "seeds", help="Pool draws and data orders, ranked by summed log-prob.")
@field_option(CalibrateConfig, "builds",
              help="Each student's pretraining builds: 0 is the ladder's own, B pretrains lab:NAME+bB from seed B (e.g. 1,2).")
@field_option(CalibrateConfig, "mean_seeds", help="Seeds that also run the mean-ranked (GRAPE) arm; empty for none.")
@field_option(CalibrateConfig, "tasks")
@field_option(CalibrateConfig, "epochs", help="The longest budget.")
@field_option(CalibrateConfig, "n_train", help="Problems per teacher pool.")
@field_option(CalibrateConfig, "n_eval", help="Held-out problems of the full runs' evaluations.")
@field_option(CalibrateConfig, "candidates", help="Teacher samples per problem.")
@field_option(CalibrateConfig, "probe_steps", help="The longest probe; shorter ones are replayed from its prefix.")
@field_option(CalibrateConfig, "jobs", help="Units in parallel, one torch thread each.")
@field_option(CalibrateConfig, "measure_every",
              help="The full runs' scoring measures (answer log-likelihood, teacher NLL, base drift, teacher view) at every "
                   "Nth evaluation and at whole epochs; accuracy at every one. 1: all of them at every evaluation.")
@field_option(CalibrateConfig, "teacher",
              help="The lab model that samples the pools (lab:teacher, lab:teacher-xl), or 'program' for the scripted teacher's candidates.")
@field_option(CalibrateConfig, "temperature", help="The teacher model's sampling temperature.")
@field_option(CalibrateConfig, "budget_runs", help="Also train each set of the first seed as runs of just these epochs, e.g. 1,2.")
@field_option(CalibrateConfig, "schedules", help="Options beyond D_high / D_low / D_mixed, e.g. mixed@0.25,mixed@0.75,curriculum@2.")
@field_option(CalibrateConfig, "quick",
              help="Tiny settings (one small student, one seed, one epoch, the scripted teacher) for tests; the flags "
                   "given beside it replace theirs.")
@click.option("--students", default=None,
              help="Your own proxies (model folders or hub ids, comma-separated): calibrate on --pool instead of the lab.")
@click.option("--pool", "-p", "own_pool", default=None, help="With --students: your pool (any layout `advisor score` reads).")
@click.option("--pool-teacher", default="unknown", show_default=True,
              help="With --students: what wrote the pool's candidates (names the pool source in the records).")
@click.option("--task-name", default=None, help="With --students: the pool source's name in the records (default: its content hash).")
@click.option("--target", default=None, help="With --students: the large student this is for; the plan states its cost against one full run of it.")
@click.option("--dry-run", is_flag=True,
              help="With --students: print the plan and its cost (the pool's tokens measured, FLOPs, GPU-hours), run nothing.")
@field_option(PoolCalibrateConfig, "gpu_tflops",
              help="With --dry-run: one GPU's peak TFLOP/s (default: an H100 SXM's dense bf16); set your cluster's.")
@field_option(PoolCalibrateConfig, "mfu",
              help="With --dry-run: the share of that peak training and forward passes reach (an assumption; set yours).")
@field_option(PoolCalibrateConfig, "decode_mfu",
              help="With --dry-run: the share of that peak generation reaches, far below training's (an assumption).")
@click.option("--nproc", default=1, show_default=True, type=click.IntRange(1, 1024),
              help="With --students: processes per full run (torchrun; accelerate with --launcher), as `advisor train`.")
@field_option(PoolCalibrateConfig, "launcher", type=click.Choice(LAUNCHERS),
              help="With --students and --nproc > 1: the launcher of each full run.")
@click.option("--predictor", default=None, help="With --students: the predictor whose probe recipe the probes follow (default: the shipped one).")
@click.option("--probe-batch", "own_probe_batch", default=None, type=int, help="With --students: sequences per probe step.")
@click.option("--probe-eval-problems", "own_probe_eval", default=None, type=int,
              help="With --students: held-out problems the probe generates on.")
@click.option("--max-new-tokens", "own_new_tokens", default=None, type=int,
              help="With --students: new tokens per evaluation generation (probe and full runs).")
@checker_option
@pool_options
@device_options
@json_option
@click.pass_context
def calibrate(ctx, as_json, **kw):
    """The lab sweep: teacher pools, probes and full high/low/mixed runs — RunRecords for `advisor fit`;
    with --students, the same on your own pool with your own small proxy students."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
    from capacity_advisor.advisor.lab.calibrate import run_calibration
    from capacity_advisor.models.files import check_writable_dir

    quiet_libraries()
    if kw["students"] is not None or kw["own_pool"] is not None:
        return calibrate_own_pool(ctx, as_json, kw)
    given = [f"--{k.replace('_', '-')}" for k in ("dry_run", "target", "predictor", "own_probe_batch", "own_probe_eval",
                                                  "own_new_tokens", "gpu_tflops", "mfu", "decode_mfu")
             if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise InputError(f"{', '.join(given)} go with --students (calibrating on your own pool)")
    for k in ("students", "own_pool", "pool_teacher", "task_name", "target", "dry_run", "nproc", "launcher", "predictor",
              "own_probe_batch", "own_probe_eval", "own_new_tokens", "gpu_tflops", "mfu", "decode_mfu", "checker", "device",
              "dtype"):
        kw.pop(k)
    pool_settings(kw)
    for name, parse in (("sizes", names), ("seeds", ints), ("builds", ints), ("mean_seeds", ints), ("tasks", names),
                        ("budget_runs", floats), ("schedules", names)):
        kw[name] = parse(kw[name], f"--{name.replace('_', '-')}")
    cfg = take(CalibrateConfig, kw)
    if cfg.quick:  # tiny settings in place of the defaults: a flag given beside --quick still counts, and is checked
        given = {f.name: getattr(cfg, f.name) for f in fields(CalibrateConfig)
                 if ctx.get_parameter_source(f.name) == click.core.ParameterSource.COMMANDLINE}
        cfg = replace(CalibrateConfig.quick_settings(cfg.out), **given)
    cfg.validate()
    check_writable_dir(cfg.out, "--out")
    result = run_calibration(cfg, log=lambda m: console.print(m, highlight=False))
    if as_json:
        emit_json(result)
    else:
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s)")


def calibrate_own_pool(ctx, as_json: bool, kw: dict) -> None:
    """`advisor calibrate --students A,B --pool P`: advisor.calibrate_pool, after its flags are checked."""
    from capacity_advisor.advisor.calibrate_pool import PoolCalibrateConfig, run_pool_calibration
    from capacity_advisor.advisor.cli.ui import console, emit_json

    lab_only = [f"--{k.replace('_', '-')}" for k in ("sizes", "builds", "mean_seeds", "tasks", "n_train", "candidates", "jobs",
                                                     "teacher", "temperature", "budget_runs", "schedules", "quick",
                                                     "measure_every")
                if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE]
    if lab_only:
        raise InputError(f"{', '.join(lab_only)} belong to the lab sweep; with --students name your proxies, --pool, "
                         "--epochs, --seeds and --n-eval")
    if not kw["students"] or not kw["own_pool"]:
        raise InputError("calibrating on your own pool needs both --students (your proxies) and --pool")
    given = lambda k: ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE  # noqa: E731
    gpu_flags = [f"--{k.replace('_', '-')}" for k in ("gpu_tflops", "mfu", "decode_mfu") if given(k)]
    if gpu_flags and not kw["dry_run"]:
        raise InputError(f"{', '.join(gpu_flags)} {'go' if len(gpu_flags) > 1 else 'goes'} with --dry-run (the plan's "
                         "GPU-hours)")
    recipe = {k: v for k, v in (("steps", kw["probe_steps"] if given("probe_steps") else None),
                                ("batch_size", kw["own_probe_batch"]), ("eval_problems", kw["own_probe_eval"]),
                                ("max_new_tokens", kw["own_new_tokens"])) if v is not None}
    cfg = PoolCalibrateConfig(
        students=names(kw["students"], "--students"), pool=kw["own_pool"], out=kw["out"],
        epochs=float(kw["epochs"]) if given("epochs") else PoolCalibrateConfig.epochs,
        seeds=ints(kw["seeds"], "--seeds") if given("seeds") else PoolCalibrateConfig.seeds,
        n_eval=kw["n_eval"] if given("n_eval") else PoolCalibrateConfig.n_eval,
        teacher=kw["pool_teacher"], task=kw["task_name"], checker=kw["checker"], device=kw["device"], dtype=kw["dtype"],
        nproc=kw["nproc"], launcher=kw["launcher"], target=kw["target"], predictor=kw["predictor"], recipe=recipe,
        pool_options=vars(pool_settings(kw)), gpu_tflops=kw["gpu_tflops"], mfu=kw["mfu"], decode_mfu=kw["decode_mfu"])
    # soft_wrap: a message stays one line however long (rich would break a note at the console's width)
    result = run_pool_calibration(cfg, log=lambda m: console.print(m, highlight=False, soft_wrap=True),
                                  dry_run=kw["dry_run"])
    if as_json:
        emit_json(result)
        return
    report.calibration_plan(result["cost"])
    if not result.get("dry_run"):
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s); next: advisor fit "
                      f"--records calibration/records.jsonl --records {result['path']} --out PREDICTOR", highlight=False)
