"""`advisor calibrate`: calibrate on your own pool with your own small proxy students
(`advisor.calibration.proxies.run_pool_calibration`), with only its own flags.

The lab sweep (`advisor lab calibrate`, cli/sweep.py) takes other flags; given here, each is refused
in one line naming that verb (`options.TwinCommand`: it reads the lab sweep's flags when the
mistake is made).
"""

from __future__ import annotations

import click

from capacity_advisor.advisor.calibration.proxies import OWN_RECIPE, PoolCalibrateConfig, run_pool_calibration
from capacity_advisor.advisor.cli import report
from capacity_advisor.advisor.cli.options import (
    TwinCommand, checker_option, device_options, field_option, floats, given_on_command_line, ints, json_option, names,
    pool_options, pool_settings, stack, take,
)
from capacity_advisor.advisor.cli.ui import console, emit_json, quiet_libraries
from capacity_advisor.probes.recipe import RECIPE_FLAGS
from capacity_advisor.training.launch import LAUNCHERS


def lab_sweep_flags(flags: list[str]) -> str:
    """The line that refuses the lab sweep's flags given to `advisor calibrate`."""
    return (f"{', '.join(flags)} {'belong' if len(flags) > 1 else 'belongs'} to the lab sweep: run it with "
            "`advisor lab calibrate`; `advisor calibrate` takes your proxies (--students), your --pool, --epochs, "
            "--seeds and --n-eval")


own_recipe_options = stack(*[click.option(RECIPE_FLAGS[k][0], k, default=None, type=int,
                                           help=f"{RECIPE_FLAGS[k][1]} Default: the predictor's recipe at the proxy's kind.")
                              for k in OWN_RECIPE])


@click.command(cls=TwinCommand, twin=("lab", "calibrate"), refusal=lab_sweep_flags)
@field_option(PoolCalibrateConfig, "students", help="Your proxies (model folders or hub ids, comma-separated).")
@field_option(PoolCalibrateConfig, "pool", "--pool", "-p", help="Your pool (any layout `advisor score` reads).")
@field_option(PoolCalibrateConfig, "out", "--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder (resumable); records go to OUT/records.jsonl.")
@field_option(PoolCalibrateConfig, "epochs", help="The full runs' budget.")
@field_option(PoolCalibrateConfig, "seeds", help="Held-out slice of the probe, mixed set and data order, one unit each.")
@field_option(PoolCalibrateConfig, "n_eval", help="Held-out problems of the full runs' evaluations (never trained on).")
@field_option(PoolCalibrateConfig, "evals_per_epoch", type=click.IntRange(1, 100),
              help="Evaluations of each full run per epoch (the budgets its records are labelled at).")
@field_option(PoolCalibrateConfig, "eval_at",
              help="More evaluations of each full run, at these epochs (comma-separated, e.g. 0.25,0.75), beside the "
                   "schedule: a race stopped early can then be replayed where it stops.")
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
@json_option
@click.pass_context
def calibrate(ctx, as_json, dry_run, **kw):
    """Calibrate on your own pool with your own small proxy students: probes and full high/low/mixed
    runs, RunRecords for `advisor fit` (the lab sweep: `advisor lab calibrate`)."""
    quiet_libraries()
    recipe = {k: v for k, v in ((k, kw.pop(k)) for k in OWN_RECIPE) if v is not None}
    cfg = take(PoolCalibrateConfig, kw, students=names(kw.pop("students") or "", "--students"),
               seeds=ints(kw.pop("seeds"), "--seeds"), eval_at=floats(kw.pop("eval_at") or "", "--eval-at"),
               recipe=recipe, pool_options=vars(pool_settings(kw)))
    # soft_wrap: a message stays one line however long (rich would break a note at the console's width)
    result = run_pool_calibration(cfg, log=lambda m: console.print(m, highlight=False, soft_wrap=True),
                                  dry_run=dry_run, given=given_on_command_line(ctx))
    if as_json:
        emit_json(result)
        return
    report.calibration_plan(result["cost"])
    if not result.get("dry_run"):
        console.print(f"{result['records']} records in {result['path']} ({result['seconds']}s); next: advisor fit "
                      f"--records calibration/records.jsonl --records {result['path']} --out PREDICTOR", highlight=False)
