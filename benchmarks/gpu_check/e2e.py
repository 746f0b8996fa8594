"""gpu_check's end-to-end part: one real `advisor recommend` at a student's shape, each stage timed.

The student is the random-weight model the student part built, saved as a model folder
(`save_student`); the pool is generated here (`write_pool`: grouped rows in OpenR1's layout, every
candidate marked correct, responses of EndToEnd.response_tokens under the student's tokenizer).
`run_recommend` makes the library call the `advisor recommend` verb makes
(advisor.recommendation.recommend.recommend) with the settings its flags would give, and times it by stage:
the named steps of advisor/recommendation/recommend.py (check_inputs, measure, advise, write_outputs), each wrapped
for this one call; `measure` split by the status messages it reports (loading the student, scoring
the pool, probing); the probe's evaluations summed from each probe run's eval.jsonl (eval_seconds),
the rest of the probe being its training, checkpoints and set-up.

Where matplotlib is not installed, the three figure writers (probe.png, each run's curve.png,
report.png) are replaced by no-ops for this call and the result says so: drawing costs nothing
that matters here, and the rest of the path is what is timed.
"""

import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.gpu_check.measure import PeakMemory, filler, free, prompt_text

STEPS = ("check_inputs", "measure", "advise", "write_outputs")  # advisor/recommendation/recommend.py's named steps
STATUS_STAGES = {"loading": "load_student", "scoring": "score_pool", "probing": "probe"}


def save_student(lm, folder: Path) -> float:
    """The student's weights, config and tokenizer as a model folder; returns the seconds it took."""
    t = time.perf_counter()
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return time.perf_counter() - t


def write_pool(path: Path, tokenizer, e) -> None:
    """`e.problems` grouped rows with `e.candidates` distinct correct responses each."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(e.problems):
            a, b = rng.randrange(100), rng.randrange(100)
            gens = [filler(tokenizer, e.response_tokens, 1000 * i + k) + f" So the answer is \\boxed{{{a + b}}}."
                    for k in range(e.candidates)]
            row = {"uuid": f"p{i}", "problem": f"Problem {i}: what is {a} + {b}? " + prompt_text(tokenizer, e.prompt_tokens, i),
                   "answer": str(a + b), "generations": gens, "correctness_math_verify": [True] * e.candidates}
            f.write(json.dumps(row) + "\n")


def _flags(e) -> dict:
    recipe = {"eval_problems": e.eval_problems, "max_new_tokens": e.max_new_tokens}
    if e.steps is not None:
        recipe.update(steps=e.steps, eval_every=e.steps)
    return recipe


def command(e, device: str) -> str:
    """The `advisor recommend` command line this part runs as a library call."""
    from capacity_advisor.probes.recipe import flag

    flags = " ".join(f"{flag(k)} {v}" for k, v in _flags(e).items())
    return (f"advisor recommend --model STUDENT --pool pool.jsonl --budget {e.budget:g} {flags} --out rec"
            + (" --device cpu" if device == "cpu" else ""))


def _no_figures() -> tuple[list, str]:
    """(what to restore, what the result says): the figure writers replaced where matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401

        return [], "drawn"
    except ImportError:
        pass
    import capacity_advisor.advisor.recommendation.figure as report_figure
    import capacity_advisor.probes.run as probe_run
    import capacity_advisor.training.record as record

    saved = [(report_figure, "write_figure"), (probe_run, "plot"), (record, "plot_curve")]
    saved = [(mod, name, getattr(mod, name)) for mod, name in saved]
    for mod, name, _ in saved:
        setattr(mod, name, lambda *a, **kw: None)
    return saved, "not drawn: matplotlib is not installed (probe.png, curve.png and report.png skipped)"


def _eval_seconds(probe_dir: Path) -> float:
    from capacity_advisor.training.callbacks import read_curve

    return sum(r.get("eval_seconds") or 0.0 for run in sorted(probe_dir.iterdir()) if run.is_dir()
               for r in read_curve(run / "eval.jsonl"))


def run_recommend(folder: Path, pool: Path, out: Path, home: Path, e, device: str) -> dict:
    """`advisor recommend` on `pool` with the student in `folder`: seconds per stage, peak memory."""
    import capacity_advisor.advisor.recommendation.recommend as rec_mod

    spent: dict[str, float] = {}
    ended: dict[str, float] = {}
    marks: list[tuple[str, float]] = []

    def clocked(name, fn):
        def step(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                ended[name] = time.perf_counter()
                spent[name] = ended[name] - t
        return step

    def status(message: str) -> None:
        marks.append((STATUS_STAGES.get(message.split()[0], message.split()[0]), time.perf_counter()))

    cfg = rec_mod.RecommendConfig(model=str(folder), budget=e.budget, out=str(out), pool=str(pool), recipe=_flags(e),
                                  device=device, dtype="auto", seed=0)
    originals = {name: getattr(rec_mod, name) for name in STEPS}
    figures, drawn = _no_figures()
    old_home = os.environ.get("ADVISOR_HOME")
    os.environ["ADVISOR_HOME"] = str(home)  # its caches stay in the scratch folder
    try:
        for name in STEPS:
            setattr(rec_mod, name, clocked(name, originals[name]))
        t0 = time.perf_counter()
        with PeakMemory(device) as mem:
            rec = rec_mod.recommend(cfg, status=status)
        total = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(rec_mod, name, fn)
        for mod, name, fn in figures:
            setattr(mod, name, fn)
        if old_home is None:
            os.environ.pop("ADVISOR_HOME", None)
        else:
            os.environ["ADVISOR_HOME"] = old_home
    stages = {"check_inputs": spent.get("check_inputs")}
    # each status opens a stage of `measure`, which the next one (or measure's end) closes
    for (name, t), t_next in zip(marks, [t for _, t in marks[1:]] + [ended["measure"]]):
        stages[name] = t_next - t
    if "probe" in stages:
        stages["probe_evaluations"] = _eval_seconds(out / "probe")
        stages["probe_training"] = stages["probe"] - stages["probe_evaluations"]
    stages.update(advise=spent.get("advise"), write_outputs=spent.get("write_outputs"))
    return {"stages": stages, "total_seconds": total, "peak_memory_mb": mem.mb, "peak_reserved_mb": mem.reserved_mb,
            "strategy": rec.schedule.strategy, "answered_by": rec.answered_by, "train_rows": rec.train_rows,
            "figures": drawn, "written": sorted(p.name for p in out.iterdir())}


def end_to_end(name: str, folder: Path, save_seconds: float, tokenizer, e, device: str, workdir: Path) -> dict:
    """The part: the pool written, recommend run and timed; the student folder and pool removed after."""
    t = time.perf_counter()
    pool = workdir / "pool.jsonl"
    write_pool(pool, tokenizer, e)
    out = {"student": name, "pool": asdict(e), "command": command(e, device), "save_student_seconds": save_seconds,
           "write_pool_seconds": time.perf_counter() - t}
    out.update(run_recommend(folder, pool, workdir / "rec", workdir / "home", e, device))
    free(device)
    return out
