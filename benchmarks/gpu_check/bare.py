"""The GPU check from a bare checkout: the project installed without its dependencies into a scratch
folder, then `python -m benchmarks.gpu_check --hf-only`, its files written into one folder.

    python3 -m benchmarks.gpu_check.bare OUT           # one CUDA GPU (H200-class); sized for 8 minutes, untimed yet
    python3 -m benchmarks.gpu_check.bare OUT --quick   # the same path at tiny shapes on a CPU (tests/e2e/test_gpu_check_bare.py)
    make gpu-check-bare OUT=runs/gpu-check             # the first, with the Makefile's python

Needs a python with torch, transformers 5 or newer, accelerate and peft, and one CUDA GPU unless
--quick; nothing else: no network, no virtual environment, no lab weights (models/lab/weights),
no calibration/ and no docs/lab (the check builds every model with random weights from config
numbers). Arguments after `--` go to the check unchanged (e.g. `-- --students qwen2.5-1.5b`).

The four package folders and pyproject.toml are copied to a scratch folder (the checkout is left as
it was, and the lab's weights are not copied) and installed from there with `pip install --no-deps
--no-build-isolation --no-index --target`; where pip cannot build them (a setuptools older than the
77 pyproject.toml asks for), the folders are laid out under capacity_advisor/ as the wheel lays them,
and install.json says which. The check then runs with that folder first on PYTHONPATH, and
only after a first process has shown that the project is imported from there, not from a copy
installed elsewhere. Hugging Face's offline switches are set: nothing is looked up.

OUT receives four files, flat: gpu-check.json and gpu-check.md (gpu_check's results, rewritten as
each measurement ends), gpu-check.log (its progress lines and any traceback) and install.json (how
the project was installed and the check run, and how it ended). Without --quick the check skips a
part expected to end past --budget-s (480: 8 minutes) and is stopped at --kill-after seconds (570),
so that a command limited to 10 minutes still returns what finished. Exit status: gpu_check's;
124 when it was stopped; 2 after one `error:` line for bad input (OUT not writable, a package
missing, no CUDA GPU without --quick, the project imported from elsewhere).
"""

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
def package_folders() -> tuple[str, ...]:
    """The folders setup.py installs as capacity_advisor.<name> (its ROOTS), read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ROOTS")


PACKAGES = package_folders()
NEEDED = ("torch", "transformers", "accelerate", "peft")
BUDGET_S, KILL_AFTER_S = 480.0, 570.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def problem(msg: str) -> None:
    print(f"gpu_check_bare: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def check_out(out: Path) -> None:
    """OUT can be made and written, found by writing in the nearest folder that exists: nothing is
    created until every check has passed (a refused check leaves no empty folders behind)."""
    at = out.absolute()
    try:
        while not os.path.lexists(at):
            at = at.parent
        if not at.is_dir():
            problem(f"{out}: cannot write there ({at} is a file); give a folder that can be written")
        probe = at / f".write-{os.getpid()}.tmp"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        problem(f"{out}: cannot write there ({e.strerror or e}); give a folder that can be written")


def make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        problem(f"{out}: cannot write there ({e.strerror or e}); give a folder that can be written")


def check_python(quick: bool, env: dict) -> None:
    missing = [name for name in NEEDED if find_spec(name) is None]
    if missing:
        problem(f"{', '.join(missing)} not importable by {Path(sys.executable).name}: the check needs "
                f"{', '.join(NEEDED)} installed beside it")
    if not quick:  # asked in a child, so that this process holds no CUDA context during the check
        r = subprocess.run([sys.executable, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"],
                           env=env, capture_output=True, text=True)
        if r.returncode:
            problem("no CUDA GPU is visible: run this on a GPU machine, or pass --quick to check the path on a CPU")


def _skip_weights(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore: caches, and the lab's kept builds (the check never loads them)."""
    skip = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
    if Path(folder).name == "lab" and Path(folder).parent.name == "models":
        skip.add("weights")
    return skip


def install(scratch: Path) -> dict:
    """The project under scratch/site: pip --target from a copy of its sources, else laid out by hand."""
    src, site = scratch / "src", scratch / "site"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=_skip_weights)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "--target", str(site), str(src)]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch)
    if r.returncode == 0:
        return {"method": "pip install --no-deps --no-build-isolation --no-index --target", "seconds": time.perf_counter() - t}
    shutil.rmtree(site, ignore_errors=True)
    for name in PACKAGES:  # what the wheel would hold: each folder as capacity_advisor.<name>
        shutil.copytree(src / name, site / "capacity_advisor" / name)
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return {"method": "folders laid out under capacity_advisor/ (pip could not build the project)", "pip_error": tail,
            "seconds": time.perf_counter() - t}


def verify(site: Path, env: dict) -> None:
    """The project must be imported from `site`: a copy installed elsewhere would be measured instead."""
    code = "import capacity_advisor.advisor as a, capacity_advisor.models as m; print(a.__file__); print(m.__file__)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode:
        problem(f"the installed project does not import: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    outside = [f for f in r.stdout.split() if not Path(f).resolve().is_relative_to(site.resolve())]
    if outside:
        problem("the project is imported from another installed copy, not from the scratch install; "
                "run with a python that does not have it installed")


def run_check(cmd: list[str], env: dict, cwd: Path, log: Path, kill_after: float | None) -> tuple[int, bool]:
    """gpu_check's output copied to `log` and to stderr as it comes; stopped at `kill_after` seconds."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

        def copy_lines():
            for line in proc.stdout:
                f.write(line)
                f.flush()
                sys.stderr.write(line)

        reader = threading.Thread(target=copy_lines, daemon=True)
        reader.start()
        try:
            rc, stopped = proc.wait(timeout=kill_after), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # its own session: the check and anything it started
            rc, stopped = 124, True
            proc.wait()
        reader.join(timeout=10)
    return rc, stopped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for gpu-check.json, gpu-check.md, gpu-check.log and install.json")
    ap.add_argument("--quick", action="store_true", help="tiny shapes on a CPU: the path, not a GPU's figures")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"parts expected to end later are skipped (default {BUDGET_S:g}; none with --quick)")
    ap.add_argument("--kill-after", type=float, default=None,
                    help=f"stop the check after this many seconds (default {KILL_AFTER_S:g}; none with --quick)")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    budget = args.budget_s if args.budget_s is not None else (None if args.quick else BUDGET_S)
    kill_after = args.kill_after if args.kill_after is not None else (None if args.quick else KILL_AFTER_S)
    for flag, v in (("--budget-s", budget), ("--kill-after", kill_after)):
        if v is not None and not 0 < v <= 7 * 86400:
            problem(f"{flag} {v:g} must be a positive number of seconds, at most a week")
    out = Path(args.out)
    check_out(out)
    env = {**os.environ, **OFFLINE}
    check_python(args.quick, env)
    make_out(out)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-bare-"))
    try:
        how = install(scratch)
        site = scratch / "site"
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        verify(site, env)
        # the checkout after the install: `benchmarks` comes from it, the project from `site`
        env["PYTHONPATH"] += os.pathsep + str(ROOT)
        shown = ["--hf-only", "--out", "OUT/gpu-check.json", *(["--quick"] if args.quick else []),
                 *(["--budget-s", f"{budget:g}"] if budget else []), *extra]
        cmd = [sys.executable, "-m", "benchmarks.gpu_check",
               *[str(out.resolve() / "gpu-check.json") if a == "OUT/gpu-check.json" else a for a in shown]]
        t = time.perf_counter()
        rc, stopped = run_check(cmd, env, scratch, out / "gpu-check.log", kill_after)
        record = {"install": how, "python": sys.version.split()[0], "check": "python -m benchmarks.gpu_check " + " ".join(shown),
                  "exit": rc, "seconds": time.perf_counter() - t,
                  "stopped": f"at --kill-after {kill_after:g} s; gpu-check.json holds what finished" if stopped else None}
        (out / "install.json").write_text(json.dumps(record, indent=2) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"gpu_check_bare: exit {rc}{' (stopped)' if stopped else ''}; wrote {out}/gpu-check.json, gpu-check.md, "
          "gpu-check.log, install.json", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
