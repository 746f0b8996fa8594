"""Wall time of `advisor probe` and `advisor recommend` against the full training run they advise on.

    .venv/bin/python -m benchmarks.wall_time                  # lab:m, 3 rounds, ~2 minutes on 2 CPU cores
    .venv/bin/python -m benchmarks.wall_time --sizes xs,m     # more lab students (~3.5 minutes)
    .venv/bin/python -m benchmarks.wall_time --json           # machine-readable

Each step is the CLI a user runs, in a fresh subprocess (interpreter start and imports count),
measured in one run; the figures that matter are the ratios to the full run:
  (a) `advisor lab pool --n 1000`                 a 1,000-problem modchain pool P (6 candidates each)
  (b) `advisor score --model lab:S --pool P`      every candidate scored, score cache cold
  (c) `advisor probe --model lab:S --pool P`      default probe (100 steps on D_high and D_low),
                                                   score cache cold, so it includes scoring P
  (d) `advisor recommend --model lab:S --budget B` the whole flow: writes its own 1,000-problem lab
                                                   pool, scores (cold), selects, probes, predicts
  (e) `advisor train D/recommendation.json`        the full SFT run (B epochs) that (d) recommends
Caches: lab students live under `$ADVISOR_HOME/lab/<name>-<recipe hash>/` and score shards under
`$ADVISOR_HOME/scores/<key>/`. Each of (b)-(e) runs with ADVISOR_HOME set to a new empty folder
whose `lab/` holds symlinks to the already built students of the user's home: student builds
(a one-time cost per student, not what is measured here) are done beforehand and not counted,
while every score cache is cold and the RunRecord of (e) lands in the private home. Rounds
repeat (a)-(e) for every size, interleaved; the best time of each step over the rounds is kept
(a shared machine is noisy), and the per-round ratios are reported beside it. For
reference each round also times `python -c "import torch, transformers"`, the fixed start-up that
every step but (a) pays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("pool", "score", "probe", "recommend", "train")


def real_home() -> Path:
    return Path(os.environ.get("ADVISOR_HOME") or Path.home() / ".cache" / "capacity-advisor").expanduser()


def ensure_built(size: str) -> dict:
    """Build lab student `size` in the user's home if needed (not timed as a step)."""
    code = ("import json, time; from models.lab.ladder import is_built, student_path; "
            f"b = is_built({size!r}); t = time.perf_counter(); p = student_path({size!r}); "
            "print(json.dumps({'path': str(p), 'was_built': b, 'seconds': time.perf_counter() - t}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"building lab:{size} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh_home(base: Path, name: str) -> Path:
    """An empty ADVISOR_HOME whose lab/ links to every built student of the user's home."""
    home = base / name
    (home / "lab").mkdir(parents=True)
    for d in sorted((real_home() / "lab").iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / "build.json").exists():
            (home / "lab" / d.name).symlink_to(d.resolve(), target_is_directory=True)
    return home


def _json_tail(text: str):
    """The JSON object a command printed with --json (the last top-level one on stdout)."""
    dec = json.JSONDecoder()
    found = None
    for i, line in enumerate(text.splitlines(keepends=True)):
        if line.startswith("{"):
            start = sum(len(x) for x in text.splitlines(keepends=True)[:i])
            try:
                found, _ = dec.raw_decode(text[start:])
            except json.JSONDecodeError:
                continue
    return found


def run_step(argv: list[str], home: Path | None, cwd: Path, timeout: float) -> dict:
    env = dict(os.environ)
    if home is not None:
        env["ADVISOR_HOME"] = str(home)
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "capacity_advisor.advisor.cli.main", *argv]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise SystemExit(f"`advisor {' '.join(argv)}` failed ({proc.returncode}):\n{tail}")
    return {"wall_s": wall, "report": _json_tail(proc.stdout), "argv": ["advisor", *argv]}


def one_round(base: Path, r: int, sizes: list[str], args) -> dict:
    rdir = base / f"round{r}"
    rdir.mkdir()
    out: dict = {}
    pool = run_step(["lab", "pool", "--task", "modchain", "--n", str(args.n), "--seed", "0", "--out", "P.jsonl", "--json"],
                    None, rdir, args.timeout)
    out["pool"] = pool
    # the fixed cost every torch step pays: interpreter start plus the torch / transformers imports
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, transformers; from transformers import LlamaForCausalLM"],
                   cwd=rdir, check=True, capture_output=True, timeout=args.timeout)
    out["imports"] = {"wall_s": time.perf_counter() - t}
    for s in sizes:
        res = {}
        res["score"] = run_step(["score", "--model", f"lab:{s}", "--pool", "P.jsonl", "--out", f"{s}-score", "--json"],
                                fresh_home(rdir, f"home-{s}-score"), rdir, args.timeout)
        res["probe"] = run_step(["probe", "--model", f"lab:{s}", "--pool", "P.jsonl", "--out", f"{s}-probe", "--json"],
                                fresh_home(rdir, f"home-{s}-probe"), rdir, args.timeout)
        rec_home = fresh_home(rdir, f"home-{s}-recommend")
        res["recommend"] = run_step(["recommend", "--model", f"lab:{s}", "--budget", f"{args.budget:g}",
                                     "--lab-n", str(args.n), "--out", f"{s}-rec", "--json"], rec_home, rdir, args.timeout)
        res["train"] = run_step(["train", f"{s}-rec/recommendation.json", "--out", f"{s}-run",
                                 "--records", str(rdir / f"{s}-records.jsonl"), "--json"],
                                fresh_home(rdir, f"home-{s}-train"), rdir, args.timeout)
        out[s] = res
    return out


def summarise(rounds: list[dict], sizes: list[str], args) -> dict:
    res = {"rounds": len(rounds), "n_problems": args.n, "budget_epochs": args.budget, "sizes": {}}
    res["pool_wall_s"] = min(r["pool"]["wall_s"] for r in rounds)
    res["imports_wall_s"] = min(r["imports"]["wall_s"] for r in rounds)
    for s in sizes:
        walls = {k: [r[s][k]["wall_s"] for r in rounds] for k in STEPS[1:]}
        best = {k: min(v) for k, v in walls.items()}
        last = rounds[-1][s]
        rec = last["recommend"]["report"] or {}
        run = last["train"]["report"] or {}
        rec_json = json.loads((Path(args.workdir) / f"round{len(rounds) - 1}" / f"{s}-rec" / "recommendation.json").read_text()) \
            if args.workdir else {}
        per_round = {k: [r[s][k]["wall_s"] / r[s]["train"]["wall_s"] for r in rounds] for k in ("score", "probe", "recommend")}
        res["sizes"][s] = {
            "model": f"lab:{s}",
            "params": (rec.get("model") or {}).get("n_params"),
            "walls_s": walls,
            "best_wall_s": best,
            "ratio_to_full_run": {k: best[k] / best["train"] for k in ("score", "probe", "recommend")},
            "per_round_ratio_to_full_run": per_round,
            "strategy": rec.get("strategy"),
            "train_rows": rec.get("train_rows"),
            "recommend_reported_seconds": rec.get("seconds"),
            "probe_cost": rec.get("probe_cost"),
            "train_reported_seconds": run["provenance"]["seconds"],
            "train_evaluations": run.get("evaluations"),
            "train_epochs": (rec_json.get("training") or {}).get("epochs"),
        }
    return res


def git_state() -> dict:
    def out(*a):
        p = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return p.stdout.strip()

    return {"head": out("rev-parse", "--short", "HEAD"),
            "modified_files": len([x for x in out("status", "--short", "--untracked-files=no").splitlines() if x.strip()])}


def report(res: dict) -> None:
    g = res["git"]
    print(f"code: HEAD {g['head']}, {g['modified_files']} tracked files modified in the working tree; "
          f"{res['rounds']} interleaved rounds, best wall time of each step kept; commands run as "
          f"`{Path(sys.executable).name} -m capacity_advisor.advisor.cli.main ...` (interpreter start and imports included)")
    for s, b in res["built"].items():
        how = "already built" if b["was_built"] else f"built now in {b['seconds']:.0f} s"
        print(f"lab:{s}: {how} (student builds are not counted below)")
    print(f"(a) advisor lab pool --n {res['n_problems']}: {res['pool_wall_s']:.2f} s")
    print(f"(reference) `python -c 'import torch, transformers'`, the fixed start-up of every step below: "
          f"{res['imports_wall_s']:.2f} s")
    for s, r in res["sizes"].items():
        b, w = r["best_wall_s"], r["walls_s"]
        pr = r["per_round_ratio_to_full_run"]
        print(f"lab:{s} ({r['params']:,} params), {res['n_problems']} problems x 6 candidates, budget {res['budget_epochs']:g} "
              f"epochs; recommendation: {r['strategy']} ({r['train_rows']} training rows)")
        rows = [("(b) advisor score (cold cache)", "score"), ("(c) advisor probe (cold cache, default 100 steps)", "probe"),
                ("(d) advisor recommend (cold cache, full flow)", "recommend"),
                (f"(e) advisor train: full {r['train_epochs']:g}-epoch SFT", "train")]
        for label, k in rows:
            rounds = ", ".join(f"{x:.1f}" for x in w[k])
            line = f"  {label:<52} {b[k]:7.1f} s  (rounds: {rounds})"
            if k != "train":
                lo, hi = min(pr[k]), max(pr[k])
                line += f"   = {r['ratio_to_full_run'][k]:.2f}x the full run (per round {lo:.2f}-{hi:.2f}x)"
            print(line)
        pc = r["probe_cost"] or {}
        share = (pc.get("share_of_full_run") or {}).get(f"{res['budget_epochs']:g}")
        print(f"  in-process figures of the last round: recommend reports {r['recommend_reported_seconds']} s of compute; "
              f"train's RunRecord {r['train_reported_seconds']} s ({r['train_evaluations']} evaluations)"
              + (f"; recommend's own estimate: probe tokens = {100 * share:.0f}% of the full run's training tokens" if share else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="m", help="comma list of lab students (default m)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1000, help="problems in the lab pool")
    ap.add_argument("--budget", type=float, default=3.0, help="epochs of the full run (recommend --budget)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per command")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    built = {s: ensure_built(s) for s in sizes}
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="advisor-walltime-"))
    base.mkdir(parents=True, exist_ok=True)
    args.workdir = str(base)
    try:
        rounds = []
        for r in range(args.rounds):
            rounds.append(one_round(base, r, sizes, args))
            if not args.json:
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        res = summarise(rounds, sizes, args)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    res["built"] = built
    res["git"] = git_state()
    res["commands"] = {k: " ".join(v["argv"]) for k, v in [("pool", rounds[-1]["pool"])] +
                       [(f"{s}:{k}", rounds[-1][s][k]) for s in sizes for k in STEPS[1:]]}
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        report(res)


if __name__ == "__main__":
    main()
