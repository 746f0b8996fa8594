"""A writer killed, or a second writer on the same folder: a torn last line of a run's evaluations
is dropped and the rerun ends as the run did, a killed write leaves no temporary after the rerun,
and a folder in use is refused in one line while a killed writer's lock does not block the rerun."""

import json
import signal
import subprocess
import sys

from helpers import HANG_S, advisor, answer_pool, one_error_line, race_manifest, run, tear


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def test_a_torn_last_line_of_a_runs_evaluations_is_dropped_and_the_rerun_ends_as_the_run_did(tmp_path, tiny_llama):
    path = race_manifest(tmp_path / "rec", tiny_llama)
    out = tmp_path / "race"
    first = run("train", path, "--out", out, "--race", 0.5, "--records", tmp_path / "r.jsonl", "--json")
    assert first.exit_code == 0, first.stderr
    evals = {s: (out / "race" / s / "eval.jsonl").read_text() for s in ("high", "low")}
    race = (out / "race.json").read_text()
    for s in ("high", "low"):  # the winner's and the loser's last evaluation, each cut 40 bytes short
        tear(out / "race" / s / "eval.jsonl")
    again = run("train", path, "--out", out, "--race", 0.5, "--records", tmp_path / "r.jsonl", "--json")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout) and (out / "race.json").read_text() == race
    for s in ("high", "low"):  # each row put back from its checkpoint's marker
        assert (out / "race" / s / "eval.jsonl").read_text() == evals[s]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 1

    # a run killed after its last checkpoint, before its record, with its last row torn: the rerun
    # finishes from that checkpoint and records what the whole run measured
    plain, store = tmp_path / "plain", tmp_path / "plain.jsonl"
    assert run("train", path, "--out", plain, "--records", store, "--max-steps", 4).exit_code == 0
    record = json.loads((plain / "record.json").read_text())
    (plain / "record.json").unlink()
    store.write_bytes(store.read_bytes()[:-40])  # the store's append cut short too
    tear(plain / "eval.jsonl")
    rerun = run("train", path, "--out", plain, "--records", store, "--max-steps", 4)
    assert rerun.exit_code == 0, rerun.stderr
    again = json.loads((plain / "record.json").read_text())
    assert without(again, "provenance") == without(record, "provenance")
    assert [json.loads(line) for line in store.read_text().splitlines()] == [again]  # the torn line cut off


DIES_WRITING_SCORES = """
import os, signal, sys
import capacity_advisor.advisor.scoring.score as scoring

real = scoring.write_jsonl

def dying(path, rows):
    def rows_then_kill():
        for i, row in enumerate(rows):
            if i == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            yield row
    return real(path, rows_then_kill())

scoring.write_jsonl = dying
from capacity_advisor.advisor.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_run_leaves_no_temporary_after_the_rerun(tiny_llama, tmp_path, capsys):
    out = tmp_path / "score"
    args = ["score", "-m", tiny_llama, "-p", answer_pool(tmp_path / "pool.jsonl"), "-o", out]
    killed = subprocess.run([sys.executable, "-c", DIES_WRITING_SCORES, *map(str, args)], capture_output=True,
                            text=True, timeout=HANG_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert list(out.glob(".scores.jsonl.*.tmp"))  # killed while writing scores.jsonl
    code, _, err = advisor(capsys, *args)
    assert code == 0, err
    assert (out / "scores.jsonl").is_file() and not list(out.glob(".*.tmp"))


HOLD = """
import sys
from capacity_advisor.core.files import folder_lock

with folder_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_folder_in_use_is_refused_in_one_line_and_a_killed_writers_lock_does_not_block_the_rerun(
        tmp_path, tiny_llama):
    path = race_manifest(tmp_path / "rec", tiny_llama)
    out = tmp_path / "out"
    # another process writing into OUT (the lock every writing verb takes), stopped dead at a known point
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for args in (["train", path, "--out", out, "--race", 0.5], ["train", path, "--out", out],
                     ["recommend", "-m", "lab:xs", "-b", 1, "--out", out]):
            line = one_error_line(run(*args), f"is in use by process {holder.pid}")
            assert str(out) in line
        assert sorted(p.name for p in out.iterdir()) == [".advisor.lock"]
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the lock file stays, holding its PID
        holder.wait()
    assert (out / ".advisor.lock").read_text().strip() == str(holder.pid)
    r = run("train", path, "--out", out, "--max-steps", 2, "--records", tmp_path / "r.jsonl")
    assert r.exit_code == 0, r.stderr
    assert (out / "record.json").is_file() and not (out / ".advisor.lock").exists()
