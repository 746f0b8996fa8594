"""`advisor lab`: the embedded lab — build the capacity ladder, write pools, run the experiment.

    advisor lab list
    advisor lab build --sizes xs,s
    advisor lab pool --task modchain --n 200 --out pool.jsonl
    advisor lab experiment --out lab-exp --sizes xs,s,m,l,xl --seeds 0,1 --threads 1

Students are then addressable as `--model lab:NAME` in every verb.
"""

from __future__ import annotations

import time

import click

from models.errors import InputError


def _sizes(text: str | None, teacher: bool = False) -> list[str]:
    from models.lab import LADDER, TEACHER

    known = [*LADDER, *([TEACHER.name] if teacher else [])]
    if not text:
        return known
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise InputError(f"--sizes {text!r}: unknown {', '.join(bad) or '(none)'}; use names from {', '.join(known)}")
    return names


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"--seeds {text!r}: give comma-separated integers, e.g. 0,1") from None
    if not seeds:
        raise InputError("--seeds must name at least one seed, e.g. 0,1")
    return seeds


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab():
    """The embedded lab: synthetic tasks, a programmatic teacher, a ladder of small students."""


@lab.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the ladder as JSON on stdout.")
def list_cmd(as_json):
    """Ladder students: name, parameters, built or not."""
    from advisor.ui import console, emit_json
    from models.lab import list_students

    rows = list_students()
    if as_json:
        emit_json(rows)
        return
    from rich.table import Table

    t = Table(title="Lab students (use as --model lab:NAME)", title_justify="left")
    for col in ("name", "parameters", "built", "build s", "final loss", "folder"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], f"{r['n_params']:,}", "yes" if r["built"] else "no",
                  f"{r['build_seconds']:.0f}" if r.get("build_seconds") else "—",
                  f"{r['final_loss']:.3f}" if r.get("final_loss") else "—", r["path"])
    console.print(t)


@lab.command()
@click.option("--sizes", default=None, help="Comma-separated ladder names (default: all).")
@click.option("--threads", default=None, type=int, help="Torch threads (default: torch's own choice).")
@click.option("--json", "as_json", is_flag=True, help="Print the built students as JSON on stdout.")
def build(sizes, threads, as_json):
    """Pretrain the ladder students that are not built yet (cached; a rebuild is a no-op)."""
    from advisor.ui import console, emit_json, progress, quiet_libraries
    from models.lab import is_built, list_students, student_path
    from models.lab.train import set_threads

    quiet_libraries()
    set_threads(threads)
    names = _sizes(sizes, teacher=True)
    for name in names:
        if is_built(name):
            console.print(f"{name}: already built")
            continue
        t0 = time.time()
        with progress(f"pretraining {name}", unit="steps") as bar:
            task = bar.add_task(f"pretraining {name}", total=None, rate="")

            def cb(step, total, loss):
                bar.update(task, total=total, completed=step, rate=f"loss {loss:.3f}")

            student_path(name, progress=cb)
        console.print(f"{name}: built in {time.time() - t0:.0f}s")
    rows = [r for r in list_students() if r["name"] in names]
    if as_json:
        emit_json(rows)


@lab.command()
@click.option("--task", "-t", default="modchain", show_default=True, help="modchain | addition | listmax.")
@click.option("--n", "n", default=200, show_default=True, help="Number of problems.")
@click.option("--difficulty", default=None, type=int, help="Task difficulty (operands, digits or list length; default: the task's own).")
@click.option("--candidates", default=6, show_default=True, help="Teacher responses per problem (4-8).")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Pool JSONL to write.")
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON on stdout.")
def pool(task, n, difficulty, candidates, seed, out, as_json):
    """Write a grouped pool: problem, teacher candidates (all correct), reference answer."""
    from advisor.ui import console, emit_json, kv_table
    from models.lab import write_pool

    rows = write_pool(out, task=task, n=n, difficulty=difficulty, candidates=candidates, seed=seed)
    summary = {"written": str(out), "problems": rows, "candidates_per_problem": candidates, "task": task,
               "difficulty": difficulty, "seed": seed}
    if as_json:
        emit_json(summary)
    else:
        console.print(kv_table("Lab pool", summary))


@lab.command()
@click.option("--out", "-o", default="lab-experiment", show_default=True, type=click.Path(file_okay=False),
              help="Folder for pools, scores, runs/, results.json and curves.png (a rerun resumes).")
@click.option("--sizes", default=None, help="Comma-separated ladder names (default: all).")
@click.option("--seeds", default="0,1", show_default=True, help="Comma-separated seeds (pool draw and data order).")
@click.option("--task", default="modchain", show_default=True)
@click.option("--difficulty", default=None, type=int, help="Task difficulty (default: the task's own).")
@click.option("--n-train", default=3000, show_default=True, help="Problems in the pool (= rows of D_high and D_low).")
@click.option("--n-eval", default=300, show_default=True, help="Held-out problems for greedy pass@1.")
@click.option("--epochs", default=5, show_default=True)
@click.option("--evals-per-epoch", default=4, show_default=True)
@click.option("--score", "score_kind", default="mean", show_default=True, help="Selection score: mean (per token) or sum.")
@click.option("--threads", default=1, show_default=True, help="Torch threads (1 leaves a core free).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary per size as JSON on stdout.")
def experiment(out, sizes, seeds, task, difficulty, n_train, n_eval, epochs, evals_per_epoch, score_kind, threads, as_json):
    """D_high vs D_low (chosen by each student's own scores), SFT with 4 evals per epoch, per size."""
    from advisor.lab_experiment import ExperimentConfig, run_experiment
    from advisor.ui import console, emit_json, quiet_libraries

    quiet_libraries()
    cfg = ExperimentConfig(out=out, sizes=tuple(_sizes(sizes)), seeds=_seeds(seeds), task=task,
                           difficulty=difficulty, n_train=n_train, n_eval=n_eval, epochs=epochs,
                           evals_per_epoch=evals_per_epoch, score=score_kind, threads=threads)
    results = run_experiment(cfg, log=lambda m: console.print(m, highlight=False))
    if as_json:
        emit_json(results["summary"])
        return
    from rich.table import Table

    t = Table(title=f"Lab experiment ({out}/curves.png)", title_justify="left")
    for col in ("size", "params", "acc ep1 high/low", "acc last ep high/low", "repetition high/low", "teacher NLL drop high/low"):
        t.add_column(col)
    for size, s in results["summary"].items():
        t.add_row(size, f"{s['n_params']:,}", f"{s['acc_epoch1_high']:.2f} / {s['acc_epoch1_low']:.2f}",
                  f"{s['acc_last_epoch_high']:.2f} / {s['acc_last_epoch_low']:.2f}",
                  f"{s['mean_repetition_high']:.2f} / {s['mean_repetition_low']:.2f}",
                  f"{s['teacher_nll_drop_high']:.2f} / {s['teacher_nll_drop_low']:.2f}")
    console.print(t)
