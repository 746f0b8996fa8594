"""The two calibrations, one verb each, with only its own flags: `advisor calibrate` (your pool, your
proxy students: `advisor.calibrate_pool.run_pool_calibration`) and `advisor lab calibrate` (the lab
sweep: `advisor.lab.calibrate.run_calibration`, added to the `advisor lab` group by `cli.lab`).

The lab sweep's flags were once `advisor calibrate`'s too; given there, each is refused with the
verb to use instead.
"""

from __future__ import annotations

from dataclasses import fields, replace

import click

from capacity_advisor.advisor.calibration.proxies import PoolCalibrateConfig
from capacity_advisor.advisor.cli import report
from capacity_advisor.advisor.cli.options import (
    checker_option, device_options, field_option, floats, ints, json_option, names, pool_options, pool_settings, stack,
    take,
)
from capacity_advisor.advisor.calibration.grid import CalibrateConfig
from capacity_advisor.core.errors import InputError
from capacity_advisor.probes.recipe import RECIPE_FLAGS
from capacity_advisor.training.launch import LAUNCHERS

# The probe settings a calibration on your own pool may move (the rest follow the predictor's recipe).
OWN_RECIPE = ("steps", "batch_size", "eval_problems", "max_new_tokens")
# The lab sweep's own flags (CalibrateConfig fields), refused by `advisor calibrate` with the verb to use.
LAB_ONLY = ("sizes", "builds", "mean_seeds", "tasks", "n_train", "candidates", "jobs", "measure_every", "teacher",
            "temperature", "budget_runs", "schedules", "quick")
# Flags that only a calibration on your own pool takes ({parameter: flag}), named when --students is missing.
OWN_ONLY = {"dry_run": "--dry-run", "target": "--target", "predictor": "--predictor", "teacher": "--pool-teacher",
            "task": "--task-name", "gpu_tflops": "--gpu-tflops", "mfu": "--mfu", "decode_mfu": "--decode-mfu",
            "nproc": "--nproc", "launcher": "--launcher", "evals_per_epoch": "--evals-per-epoch", **{k: RECIPE_FLAGS[k][0] for k in OWN_RECIPE}}


def _given(ctx, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


own_recipe_options = stack(*[click.option(RECIPE_FLAGS[k][0], k, default=None, type=int,
                                           help=f"{RECIPE_FLAGS[k][1]} Default: the predictor's recipe at the proxy's kind.")
                              for k in OWN_RECIPE])
# Hidden: given, each is one error line naming `advisor lab calibrate` (taken as text, so a value of any kind is)
lab_sweep_flags = stack(*[click.option(_flag(k), f"lab_{k}", hidden=True, expose_value=True,
                                        **({"is_flag": True} if k == "quick" else {"default": None}))
                           for k in LAB_ONLY])


@click.command()
@field_option(PoolCalibrateConfig, "students", help="Your proxies (model folders or hub ids, comma-separated).")
@field_option(PoolCalibrateConfig, "pool", "--pool", "-p", help="Your pool (any layout `advisor score` reads).")
@field_option(PoolCalibrateConfig, "out", "--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder (resumable); records go to OUT/records.jsonl.")
@field_option(PoolCalibrateConfig, "epochs", help="The full runs' budget.")
@field_option(PoolCalibrateConfig, "seeds", help="Held-out slice of the probe, mixed set and data order, one unit each.")
@field_option(PoolCalibrateConfig, "n_eval", help="Held-out problems of the full runs' evaluations (never trained on).")
@field_option(PoolCalibrateConfig, "evals_per_epoch", type=click.IntRange(1, 100),
              help="Evaluations of each full run per epoch (the budgets its records are labelled at).")
@field_option(PoolCalibrateConfig, "teacher", "--pool-teacher",
              help="What wrote the pool's candidates (names the pool source in the records).")
@field_option(PoolCalibrateConfig, "task", "--task-name", help="The pool source's name in the records (default: its content hash).")
@field_option(PoolCalibrateConfig, "target", help="The large student this is for; the plan states its cost against one full run of it.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan and its cost (the pool's tokens measured, FLOPs, GPU-hours), run nothing.")
@field_option(PoolCalibrateConfig, "gpu_tflops",
              help="With --dry-run: one GPU's peak TFLOP/s (default: an H100 SXM's dense bf16); set your cluster's.")
@field_option(PoolCalibrateConfig, "mfu",
              help="With --dry-run: the share of that peak training and forward passes reach (an assumption; set yours).")
@field_option(PoolCalibrateConfig, "decode_mfu",
              help="With --dry-run: the share of that peak generation reaches, far below training's (an assumption).")
@field_option(PoolCalibrateConfig, "nproc", type=click.IntRange(1, 1024),
              help="Processes per full run (torchrun; accelerate with --launcher), as `advisor train`.")
@field_option(PoolCalibrateConfig, "launcher", type=click.Choice(LAUNCHERS), help="With --nproc > 1: the launcher of each full run.")
@field_option(PoolCalibrateConfig, "predictor", help="The predictor whose probe recipe the probes follow (default: the shipped one).")
@own_recipe_options
@checker_option
@pool_options
@device_options
@lab_sweep_flags
@json_option
@click.pass_context
def calibrate(ctx, as_json, dry_run, **kw):
    """Calibrate on your own pool with your own small proxy students: probes and full high/low/mixed
    runs, RunRecords for `advisor fit` (the lab sweep: `advisor lab calibrate`)."""
    import contextlib

    from capacity_advisor.advisor.calibration.proxies import run_pool_calibration
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
    from capacity_advisor.core.files import folder_lock

    quiet_libraries()
    lab_only = [_flag(k) for k in LAB_ONLY if _given(ctx, f"lab_{k}")]
    if lab_only:
        raise InputError(f"{', '.join(lab_only)} {'belong' if len(lab_only) > 1 else 'belongs'} to the lab sweep: "
                         "run it with `advisor lab calibrate`; "
                         "`advisor calibrate` takes your proxies (--students), your --pool, --epochs, --seeds and --n-eval")
    if not kw["students"] or not kw["pool"]:
        own = [flag for k, flag in OWN_ONLY.items() if _given(ctx, k)]
        raise InputError((f"{', '.join(own)} go with --students: " if own and not kw["students"] else "")
                         + "calibrating on your own pool needs both --students (your proxies) and --pool "
                           "(the lab sweep is `advisor lab calibrate`)")
    gpu_flags = [_flag(k) for k in ("gpu_tflops", "mfu", "decode_mfu") if _given(ctx, k)]
    if gpu_flags and not dry_run:
        raise InputError(f"{', '.join(gpu_flags)} {'go' if len(gpu_flags) > 1 else 'goes'} with --dry-run (the plan's "
                         "GPU-hours)")
    for k in LAB_ONLY:
        kw.pop(f"lab_{k}")
    recipe = {k: v for k, v in ((k, kw.pop(k)) for k in OWN_RECIPE) if v is not None}
    cfg = take(PoolCalibrateConfig, kw, students=names(kw.pop("students"), "--students"),
               seeds=ints(kw.pop("seeds"), "--seeds"), recipe=recipe, pool_options=vars(pool_settings(kw)))
    # soft_wrap: a message stays one line however long (rich would break a note at the console's width)
    with contextlib.nullcontext() if dry_run else folder_lock(cfg.out):  # one writer in --out
        result = run_pool_calibration(cfg, log=lambda m: console.print(m, highlight=False, soft_wrap=True),
                                      dry_run=dry_run)
    if as_json:
        emit_json(result)
        return
    report.calibration_plan(result["cost"])
    if not result.get("dry_run"):
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s); next: advisor fit "
                      f"--records calibration/records.jsonl --records {result['path']} --out PREDICTOR", highlight=False)


@click.command("calibrate")
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
@json_option
@click.pass_context
def lab_calibrate(ctx, as_json, **kw):
    """The lab sweep: teacher pools, probes and full high/low/mixed runs — RunRecords for `advisor fit`."""
    from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
    from capacity_advisor.advisor.calibration.sweep import run_calibration
    from capacity_advisor.core.files import check_writable_dir

    quiet_libraries()
    theirs = sorted(flag for flag in USER_ONLY if kw.pop(USER_ONLY[flag]) not in (None, False))
    if theirs:
        raise InputError(f"{', '.join(theirs)} {'belong' if len(theirs) > 1 else 'belongs'} to `advisor calibrate` "
                         "(your pool, your proxy students): `advisor lab calibrate` is the lab sweep, on the lab's "
                         "teacher pools and students")
    for name, parse in (("sizes", names), ("seeds", ints), ("builds", ints), ("mean_seeds", ints), ("tasks", names),
                        ("budget_runs", floats), ("schedules", names)):
        kw[name] = parse(kw[name], f"--{name.replace('_', '-')}")
    cfg = take(CalibrateConfig, kw)
    if cfg.quick:  # tiny settings in place of the defaults: a flag given beside --quick still counts, and is checked
        given = {f.name: getattr(cfg, f.name) for f in fields(CalibrateConfig) if _given(ctx, f.name)}
        cfg = replace(CalibrateConfig.quick_settings(cfg.out), **given)
    cfg.validate()
    check_writable_dir(cfg.out, "--out")
    result = run_calibration(cfg, log=lambda m: console.print(m, highlight=False))
    if as_json:
        emit_json(result)
    else:
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s)")


# `advisor calibrate`'s own flags, given to the lab sweep: each accepted by a hidden option, then refused
# with a pointer to the verb that takes it (click alone would say "no such option", or guess another).
_LAB_FLAGS = {opt for param in lab_calibrate.params for opt in param.opts}
USER_ONLY = {opt: f"user_{opt[2:].replace('-', '_')}" for param in calibrate.params
             if isinstance(param, click.Option) and not param.hidden for opt in param.opts
             if opt.startswith("--") and opt not in _LAB_FLAGS}
for _param in calibrate.params:
    for _opt in _param.opts:
        if _opt in USER_ONLY:
            lab_calibrate.params.append(click.Option([_opt, USER_ONLY[_opt]], is_flag=getattr(_param, "is_flag", False),
                                                     default=None, hidden=True))
