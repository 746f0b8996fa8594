"""The real student's truth: `advisor calibrate` of lab:smollm2-135m on every real-task pool source,
one source after another, each resumable (a killed sweep goes on where it stopped).

    python -m experiments.real_sweep --out runs/real                 # every source, seeds 0 and 1
    python -m experiments.real_sweep --out runs/real --sources linear-scripted --seeds 0
    python -m experiments.real_sweep --out runs/real --per-seed     # SOURCE-s0 for every source, then SOURCE-s1
    python -m experiments.real_sweep --out runs/real --stash calibration/in-progress/real     # carry it (no weights)
    python -m experiments.real_sweep --out runs/real --restore calibration/in-progress/real   # ... and go on with it
    python -m experiments.real_sweep --out runs/real-early --sources poly-scripted --seeds 2 --per-seed --eval-at 0.25,0.75

Each source is one `advisor calibrate` folder, OUT/SOURCE, made exactly as a user's own calibration
is: the student scores every candidate, the probe `advisor recommend` runs measures it, and full
runs of D_high, D_low and D_mixed train `--epochs` epochs, evaluated twice an epoch on 64
held-out problems with each problem's correctness kept (`--eval-at` adds evaluation points, in
epochs: at 0.25 and 0.75 a race stopped at a quarter or three quarters of a one-epoch budget is
replayed where it would stop, not at the next half epoch). `advisor lab publish OUT/SOURCE
calibration/real/SOURCE` then keeps what it measured in the repository.

The pools are calibration/real/pools/TASK-TEACHER.jsonl (`experiments.real_pools`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from capacity_advisor.advisor.lab.stash import restore_calibration, stash_calibration

POOLS = Path("calibration/real/pools")
STUDENT = "lab:smollm2-135m"
SOURCES = ("linear-scripted", "place-scripted", "linear-neural", "place-neural", "arith-scripted", "poly-scripted",
           "place-mixlang", "round-scripted", "round-mixlang", "arith-pycode")
TEACHERS = {"scripted": "scripted", "neural": "smollm2-135m-ft@T1", "mixlang": "mixlang", "pycode": "pycode"}  # the records' name of each teacher
EPOCHS = 3
N_EVAL = 64
EVALS_PER_EPOCH = 2


def folder(source: str, seeds: tuple[int, ...], per_seed: bool) -> str:
    """A source's calibration folder: SOURCE, or SOURCE-sSEED for a folder of one seed."""
    return f"{source}-s{seeds[0]}" if per_seed else source


def config(source: str, out: Path, seeds: tuple[int, ...], device: str = "cpu", per_seed: bool = False,
           eval_at: tuple[float, ...] = ()):
    from capacity_advisor.advisor.calibration.proxies import PoolCalibrateConfig

    task, _, teacher = source.partition("-")
    return PoolCalibrateConfig(students=(STUDENT,), pool=str(POOLS / f"{source}.jsonl"),
                               out=str(out / folder(source, seeds, per_seed)),
                               epochs=EPOCHS, seeds=seeds, n_eval=N_EVAL, evals_per_epoch=EVALS_PER_EPOCH,
                               teacher=TEACHERS[teacher], task=task, device=device, dtype="float32", eval_at=eval_at)


def main(argv: list[str] | None = None) -> int:
    from capacity_advisor.advisor.calibration.proxies import run_pool_calibration

    ap = argparse.ArgumentParser(prog="python -m experiments.real_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--per-seed", action="store_true",
                    help="one folder per source and seed (SOURCE-sSEED), each seed's units run for every source in turn")
    ap.add_argument("--stash", metavar="DIR", help="only stash each folder of OUT that these sources and seeds name "
                    "into DIR/FOLDER.tar.gz (finished runs, no weights), to carry the sweep in the repository")
    ap.add_argument("--eval-at", default="", metavar="EPOCHS",
                    help="more evaluations of every full run at these epochs (e.g. 0.25,0.75: early points a short race "
                         "can be replayed at); a folder made without them is another calibration")
    ap.add_argument("--restore", metavar="DIR", help="first restore each folder missing from OUT from its stash in DIR")
    args = ap.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    eval_at = tuple(float(e) for e in args.eval_at.split(",") if e.strip())
    jobs = [(source, (seed,)) for seed in seeds for source in args.sources.split(",")] if args.per_seed else \
        [(source, seeds) for source in args.sources.split(",")]
    names = list(dict.fromkeys(folder(source, s, args.per_seed) for source, s in jobs))
    if args.stash:
        for name in names:
            if (Path(args.out) / name).is_dir():
                print(json.dumps(stash_calibration(Path(args.out) / name, Path(args.stash))), flush=True)
        return 0
    if args.restore:
        for name in names:
            if restore_calibration(Path(args.restore), Path(args.out), name):
                print(f"{name}: restored from {args.restore}", flush=True)
    for source, unit_seeds in jobs:
        if not (POOLS / f"{source}.jsonl").is_file():
            print(f"{source}: no pool yet ({POOLS / f'{source}.jsonl'}), skipped", flush=True)
            continue
        t0 = time.time()
        result = run_pool_calibration(config(source, Path(args.out), unit_seeds, args.device, args.per_seed, eval_at),
                                      log=lambda m: print(f"{source}: {m}", flush=True))
        print(f"{source}: {result['records']} records in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
