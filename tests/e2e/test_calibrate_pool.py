"""`advisor calibrate --students A,B --pool P`: the paper's protocol on the user's own pool with
their own proxies (here tiny random-init folders, not lab students), resumable, its records
refitted with `advisor fit --records A --records B` (A: a subset of the committed lab records), and
its bad inputs one error line each."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import HANG_S, build_tiny, frozen_at, kill_when_frozen, lab_pool, read_jsonl, record_subset, run

SMALL = ["--epochs", 1, "--n-eval", 8, "--probe-steps", 2, "--probe-batch", 4, "--probe-eval-problems", 4,
         "--max-new-tokens", 8, "--device", "cpu", "--dtype", "float32"]


@pytest.fixture
def pool(lab_home, tmp_path):
    return lab_pool(tmp_path / "pool.jsonl", 48)


def test_the_dry_run_prints_the_plan_and_its_share_of_a_target_run(pool, tiny_llama, tiny_qwen, tmp_path):
    out = tmp_path / "cal"
    r = run("calibrate", "--students", f"{tiny_llama},{tiny_qwen}", "--pool", pool, "--target", tiny_qwen, "--dry-run",
            "--out", out, "--json", *SMALL)
    assert r.exit_code == 0, r.stderr
    c = json.loads(r.stdout)["cost"]
    assert (c["train_problems"], c["eval_problems"]) == (40, 8)
    assert [s["student"] for s in c["students"]] == [Path(tiny_llama).name, Path(tiny_qwen).name]
    s = c["students"][0]
    assert (s["probe_steps"], s["probe_batch"], s["runs"]) == (2, 4, 3)
    assert s["full_run_steps"] == -(-40 // s["train_batch"])  # one epoch
    assert s["sequences"] == s["full_run_steps"] * s["train_batch"] * 3 + 2 * 4 * 2
    share = sum(x["n_params"] * x["sequences"] for x in c["students"]) / (
        c["target"]["n_params"] * c["target"]["full_run_sequences"])
    assert c["target"]["share_of_one_full_run"] == pytest.approx(share)
    assert not out.exists()  # a dry run writes nothing


def test_the_dry_run_measures_the_pools_tokens_and_prices_them_in_gpu_hours(pool, tiny_qwen, tmp_path):
    """The tokens are counted as training counts them, with each model's own tokenizer (checked here
    against the tokenizer called directly, a short context cutting some sequences); FLOPs are
    6·N·tokens trained, 2·N·tokens passed forward or generated, and GPU-hours FLOPs / (peak x MFU)."""
    from transformers import AutoTokenizer

    from capacity_advisor.advisor.calibration.proxies import PoolCalibrateConfig, make_plan

    short = build_tiny(tmp_path / "short-llama", "llama", context=48)  # no chat template; the recipe's length: 48
    bare = tmp_path / "config-only"  # a target without a tokenizer is counted with the first proxy's
    bare.mkdir()
    shutil.copy(Path(tiny_qwen) / "config.json", bare / "config.json")
    args = ["calibrate", "--students", f"{short},{tiny_qwen}", "--pool", pool, "--dry-run", "--out", tmp_path / "cal",
            "--json", *SMALL, "--gpu-tflops", 100, "--mfu", 0.5, "--decode-mfu", 0.1]
    r = run(*args, "--target", tiny_qwen)
    assert r.exit_code == 0, r.stderr
    c = json.loads(r.stdout)["cost"]
    g = c["gpu"]
    assert (g["peak_tflops"], g["mfu"], g["decode_mfu"]) == (100, 0.5, 0.1)

    plan = make_plan(PoolCalibrateConfig(students=(short,), pool=str(pool), out=str(tmp_path / "cal"), n_eval=8))
    tok = AutoTokenizer.from_pretrained(short)
    seqs, scored = [], 0
    for p in plan.train.problems:
        n_prompt = len(tok(p.prompt)["input_ids"])  # BOS + the prompt
        whole = [n_prompt + len(tok(x.text, add_special_tokens=False)["input_ids"]) for x in p.candidates]
        seqs.append([min(w + 1, 48) for w in whole])  # + EOS, cut at the training length
        scored += sum(min(w, 48) for w in whole)
    s = c["students"][0]
    t = s["tokens"]
    assert t["max_length"] == 48 and t["candidates"] == sum(map(len, seqs)) and 0 < t["truncated_share"] < 1
    assert t["per_epoch"] == pytest.approx(sum(sum(x) / len(x) for x in seqs))
    assert (t["per_epoch_shortest"], t["per_epoch_longest"]) == (sum(map(min, seqs)), sum(map(max, seqs)))
    assert t["score_tokens"] == scored and t["sequence_mean"] == pytest.approx(t["per_epoch"] / len(seqs))

    m, n = s["compute"], s["n_params"]
    assert m["train_tokens"] == pytest.approx(2 * 2 * 4 * t["sequence_mean"] + 3 * 1 * t["per_epoch"])  # probe + 3 sets
    new = 8  # --max-new-tokens: every generation counted in full
    assert m["generated_tokens"] == (1 + 2) * 4 * new + 3 * s["evaluations_per_run"] * 8 * new
    assert m["flops"] == pytest.approx({"train": 6 * n * m["train_tokens"], "forward": 2 * n * m["forward_tokens"],
                                        "generate": 2 * n * m["generated_tokens"]})
    h = m["gpu_hours"]
    for part, mfu in (("train", 0.5), ("forward", 0.5), ("generate", 0.1)):
        assert h[part] == pytest.approx(m["flops"][part] / (100e12 * mfu) / 3600)
    assert h["total"] == pytest.approx(h["train"] + h["forward"] + h["generate"])

    qwen, target = c["students"][1], c["target"]
    assert qwen["tokens"]["max_length"] == 2048 and qwen["tokens"]["truncated_share"] == 0  # its own tokenizer
    assert target["tokens"]["per_epoch"] == qwen["tokens"]["per_epoch"]
    assert target["compute"]["train_tokens"] == pytest.approx(1 * qwen["tokens"]["per_epoch"])  # one run, one epoch
    assert g["proxies_gpu_hours"] == pytest.approx(h["total"] + qwen["compute"]["gpu_hours"]["total"])
    assert g["share_of_one_full_run"] == pytest.approx(g["proxies_gpu_hours"] / target["compute"]["gpu_hours"]["total"])

    r = run(*args, "--target", bare)
    assert r.exit_code == 0, r.stderr
    target = json.loads(r.stdout)["cost"]["target"]
    assert target["tokens"]["tokenizer"] == Path(short).name and "holds no tokenizer" in target["tokens_missing"]
    r = run(*[a for a in args if a != "--json"], "--target", bare)
    assert r.exit_code == 0 and "not measured on a GPU" in r.stderr and "6·N·tokens" in r.stderr, r.stderr


@pytest.mark.slow
def test_calibrate_on_folders_resumes_and_its_records_refit_beside_the_lab(pool, tiny_llama, tiny_qwen, tmp_path):
    out = tmp_path / "cal"
    args = ["calibrate", "--students", f"{tiny_llama},{tiny_qwen}", "--pool", pool, "--pool-teacher", "lab:teacher",
            "--out", out, "--json", *SMALL]
    r = run(*args)
    assert r.exit_code == 0, r.stderr
    records = read_jsonl(out / "records.jsonl")
    assert len(records) == 6 and {r["strategy"] for r in records} == {"high", "low", "mixed"}
    names = {Path(tiny_llama).name, Path(tiny_qwen).name}
    assert {r["model"]["spec"] for r in records} == names
    text = (out / "records.jsonl").read_text()
    assert str(tmp_path) not in text  # no machine path is kept
    for rec in records:
        assert rec["pool"]["teacher"] == "lab:teacher" and rec["settings"]["probe"]["steps"] == 2
        assert rec["features"]["gap_drift_rel"] is not None or "gap_drift_rel" in rec["features"]
        evals = rec["evals"]
        assert evals[0]["step"] == 0 and len(evals) >= 2  # the base, then 4 evaluations per epoch
    eval_rows = (out / "eval.jsonl").read_text().splitlines()
    assert len(eval_rows) == 8
    # every run was evaluated on the same held-out problems, none of them trained on
    held = {json.loads(x)["prompt"] for x in eval_rows}
    for unit in (out / "units").iterdir():
        trained = {json.loads(x)["prompt"] for x in (unit / "data" / "high.jsonl").read_text().splitlines()}
        assert not trained & held
    # the base is evaluated once per unit: its later runs take the first's step-0 row, timings and all
    for unit in (out / "units").iterdir():
        base = [read_jsonl(unit / s / "eval.jsonl")[0] for s in ("high", "low", "mixed")]
        assert base[0]["step"] == 0 and base[0]["eval_seconds"] > 0 and base[1:] == base[:1] * 2
    # a rerun resumes: nothing is trained again; a lost run is trained again, alone
    unit = next((out / "units").iterdir())
    shutil.rmtree(unit / "low")
    r = run(*args)
    assert r.exit_code == 0, r.stderr
    assert (unit / "low" / "record.json").exists() and len((out / "records.jsonl").read_text().splitlines()) == 6
    # the same folder for other inputs is refused
    r = run(*args[:-len(SMALL)], *SMALL[:-2], "--epochs", "2")
    assert r.exit_code == 2 and "other inputs" in r.stderr
    # refit beside lab records (the committed records' subset, here told to state this test's small
    # probe, which both files then share; files probed otherwise are refused): the pool is marked as
    # the user's own
    probe = records[0]["settings"]["probe"]
    base = tmp_path / "lab-records.jsonl"
    with base.open("w") as f:
        for line in record_subset():
            rec = json.loads(line)
            rec["settings"]["probe"] = {**probe, "kind": "lab"}
            f.write(json.dumps(rec) + "\n")
    fit = run("fit", "--records", base, "--records", out / "records.jsonl",
              "--out", tmp_path / "pred", "--kinds", "logistic", "--members", 2, "--cv-members", 2, "--cv", "student", "--json")
    assert fit.exit_code == 0, fit.stderr
    meta = json.loads((tmp_path / "pred" / "predictor.json").read_text())["meta"]
    (own, info), = meta["own_sources"].items()
    assert sorted(info["students"]) == sorted(names) and own.endswith("/lab:teacher")
    from capacity_advisor.advisor.pools.read import read_pool

    assert info["fingerprints"] == [read_pool(pool).fingerprint()]
    # published as a lab sweep is (`advisor lab publish`), and replayed at its own probe: the same records
    dest = tmp_path / "published"
    r = run("lab", "publish", out, dest, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 6 and json.loads((dest / "config.json").read_text())["stage"] == "calibrate-pool"
    assert str(tmp_path) not in (dest / "config.json").read_text()
    r = run("lab", "replay", dest, "--probe-steps", 2, "--probe-eval-problems", 4, "--out", tmp_path / "replayed.jsonl")
    assert r.exit_code == 0, r.stderr
    replayed = read_jsonl(tmp_path / "replayed.jsonl")
    assert [x["run_id"] for x in replayed] == [x["run_id"] for x in records]
    for got, rec in zip(replayed, records):
        assert got["features"] == pytest.approx(rec["features"], nan_ok=True) and got["evals"] == rec["evals"]
        assert got["settings"]["probe"]["kind"] == rec["settings"]["probe"]["kind"] == "real"
    # publishing again into the same DEST replaces its files; another calibration's DEST is refused
    assert run("lab", "publish", out, dest).exit_code == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"stage": "calibrate-pool", "inputs_key": "x", "settings": {}}))
    r = run("lab", "publish", out, other)
    assert r.exit_code == 2 and "another calibration" in r.stderr


def test_more_evaluation_points_are_evaluated_and_keyed(pool, tiny_llama, tmp_path):
    """--eval-at 0.5 with one evaluation an epoch: every full run is also evaluated at the first step at
    or past half its epoch, so a race stopped there can be replayed; the folder is keyed by it."""
    out = tmp_path / "cal"
    args = ["calibrate", "--students", tiny_llama, "--pool", pool, "--out", out, "--evals-per-epoch", 1, *SMALL]
    r = run(*args, "--eval-at", "0.5", "--json")
    assert r.exit_code == 0, r.stderr
    records = read_jsonl(out / "records.jsonl")
    assert len(records) == 3
    for rec in records:
        epochs = [e["epoch"] for e in rec["evals"]]
        assert epochs[0] == 0 and epochs[-1] == pytest.approx(1.0) and len(epochs) == 3 and 0.5 <= epochs[1] < 1
    r = run(*args)  # the same folder without the extra point is another calibration
    assert r.exit_code == 2 and "other inputs" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--students", "nowhere/model"], "nowhere/model"),
    (["--pool", "POOL"], "needs both --students"),
    (["--students", "TINY", "--pool", "POOL", "--sizes", "xs"], "--sizes belongs to the lab sweep"),
    (["--students", "TINY,TINY", "--pool", "POOL"], "names a model twice"),
    (["--students", "TINY", "--pool", "POOL", "--n-eval", 40], "--n-eval 40 holds out more than a quarter"),
    (["--dry-run"], "go with --students"),
    (["--students", "TINY", "--pool", "POOL", "--dry-run", "--mfu", 0], "--mfu 0.0 must be a share of the peak"),
    (["--students", "TINY", "--pool", "POOL", "--dry-run", "--decode-mfu", 1.5], "--decode-mfu 1.5 must be a share"),
    (["--students", "TINY", "--pool", "POOL", "--dry-run", "--gpu-tflops", -1], "--gpu-tflops -1.0 must be"),
    (["--students", "TINY", "--pool", "POOL", "--mfu", 0.3], "--mfu goes with --dry-run"),
    (["--students", "TINY", "--pool", "POOL", "--eval-at", "0.5,4"], "at most --epochs (3)"),
    (["--students", "TINY", "--pool", "POOL", "--eval-at", "half"], "--eval-at 'half': give comma-separated numbers"),
    (["--pool", "POOL", "--eval-at", "0.5"], "--eval-at go with --students"),
])
def test_bad_calibration_inputs_are_one_error_line(args, words, pool, tiny_llama, tmp_path):
    out = tmp_path / "cal"
    args = [str(pool) if a == "POOL" else a.replace("TINY", str(tiny_llama)) if isinstance(a, str) else str(a)
            for a in args]
    if "--pool" not in args and "--students" in args:
        args += ["--pool", str(pool)]
    if "--n-eval" not in args:
        args += ["--n-eval", "8"]
    r = run("calibrate", "--out", out, *args)
    assert r.exit_code == 2 and r.stderr.count("error:") == 1 and words in r.stderr, r.stderr
    assert not out.exists()


def test_a_pool_without_answers_is_refused(tiny_llama, tmp_path):
    pool = tmp_path / "plain.jsonl"
    pool.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"p{i}", "generations": ["a", "bb"]}) + "\n"
                            for i in range(40)))
    r = run("calibrate", "--students", tiny_llama, "--pool", pool, "--out", tmp_path / "cal")
    assert r.exit_code == 2 and "no reference answers" in r.stderr and not (tmp_path / "cal").exists()


@pytest.mark.slow  # torchrun'd full runs, killed with SIGKILL and resumed
def test_calibrate_over_two_processes_resumes_after_kill_9(lab_home, tiny_llama, tmp_path):
    import os
    import re
    import subprocess
    import sys

    # full runs long enough (40 steps, 16 evaluations) that the kill lands inside the first one
    pool = lab_pool(tmp_path / "pool.jsonl", 200)
    out = tmp_path / "cal"
    small = [str(a) for a in SMALL]
    small[small.index("--epochs") + 1] = "4"
    small[small.index("--n-eval") + 1] = "40"
    cmd = [str(Path(sys.executable).parent / "advisor"), "calibrate", "--students", str(tiny_llama), "--pool", str(pool),
           "--out", str(out), "--nproc", "2", *small]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # killed (the CLI, torchrun and its workers) inside the first full run, right after rank 0 has
    # written its first checkpoint's marker, wherever the machine's load puts that moment
    first = re.escape(str(out / "units")) + r"/[^/]+/[^/]+/checkpoint-\d+/advisor_state\.json"
    frozen_env, flag = frozen_at(tmp_path / "freeze", first, env)
    p = subprocess.Popen(cmd, env=frozen_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marker = Path(kill_when_frozen(p, flag))
    # what the kill left: one full run in progress, whose newest complete checkpoint (a checkpoint is
    # complete once its marker is written) is the one it stopped at
    def complete(run):
        steps = [int(c.name.split("-")[1]) for c in run.glob("checkpoint-*")
                 if (c / "advisor_state.json").exists() and (c / "trainer_state.json").exists()]
        return max(steps, default=None)

    killed = {d.name: complete(d) for d in out.glob("units/*/*") if d.name in ("high", "low", "mixed")
              and d.is_dir() and not (d / "record.json").exists() and list(d.glob("checkpoint-*"))}
    assert not (out / "records.jsonl").exists()
    assert killed == {marker.parent.parent.name: int(marker.parent.name.split("-")[1])}, (killed, marker)

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(out / "records.jsonl")
    assert sorted(r["strategy"] for r in records) == ["high", "low", "mixed"]
    for rec in records:
        assert rec["settings"]["processes"] == 2 and rec["settings"]["sharding"] == "ddp"
        assert [e["step"] for e in rec["evals"]][0] == 0 and rec["epochs"] == 4
        assert rec["provenance"]["resumed_from_step"] == killed.get(rec["strategy"]), (rec["strategy"], killed)


def test_a_stashed_calibration_restores_elsewhere_and_resumes_without_training_again(pool, tiny_llama, tmp_path):
    """experiments.real_sweep --stash / --restore (advisor/lab/stash.py): the finished runs of an
    `advisor calibrate` folder travel without weights or this machine's paths, and the folder
    restored under another path is resumed by the same command with nothing trained again."""
    import tarfile

    from capacity_advisor.advisor.lab.stash import restore_calibration, stash_calibration

    out = tmp_path / "here" / "cal"
    args = ["calibrate", "--students", tiny_llama, "--pool", pool, "--json", *SMALL]
    assert run(*args, "--out", out).exit_code == 0
    records = (out / "records.jsonl").read_text()
    kept = stash_calibration(out, tmp_path / "stash")
    assert kept["runs_done"] == 3 and kept["folder"] == "cal"
    with tarfile.open(tmp_path / "stash" / "cal.tar.gz") as tar:
        names = tar.getnames()
        text = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    # the folder's own path is marked (its inputs' paths, the student and pool given, are the command's own)
    assert str(out).encode() not in text and str(out.resolve()).encode() not in text
    assert not any("checkpoint-" in n or n.endswith(".png") for n in names)
    assert any(n.endswith("/probe/probe.json") for n in names) and sum(n.endswith("/record.json") for n in names) >= 3

    moved = tmp_path / "there"
    assert restore_calibration(tmp_path / "stash", moved, "cal")
    assert not restore_calibration(tmp_path / "stash", moved, "cal")  # a folder there already is left alone
    finished = {p: p.stat().st_mtime_ns for p in (moved / "cal" / "units").rglob("record.json")}
    r = run(*args, "--out", moved / "cal")
    assert r.exit_code == 0, r.stderr
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # no run trained again
    assert not list((moved / "cal" / "units").rglob("checkpoint-*"))
    assert (moved / "cal" / "records.jsonl").read_text() == records


def test_a_damaged_or_hostile_calibration_stash_restores_nothing(tmp_path):
    import io
    import tarfile

    from capacity_advisor.advisor.lab.stash import restore_calibration
    from capacity_advisor.core.errors import InputError

    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "cal.tar.gz").write_bytes(b"\x1f\x8b not a gzip stream")
    with pytest.raises(InputError, match="damaged"):
        restore_calibration(stash, tmp_path / "work", "cal")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:  # a member outside the folder it names
        info = tarfile.TarInfo("cal/../../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    (stash / "cal.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="not a file inside cal/"):
        restore_calibration(stash, tmp_path / "work", "cal")
    assert not (tmp_path / "work" / "cal").exists() and not (tmp_path / "escaped.txt").exists()
    assert not [p for p in (tmp_path / "work").iterdir()]  # no temporary left
