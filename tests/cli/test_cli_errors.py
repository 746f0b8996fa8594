"""Every mistake on the command line ends the same way: exit code 2, exactly one `error:` line on
stderr with nothing before it, nothing on stdout, no traceback, nothing left where outputs go."""

import os
import re

import pytest
from click.testing import CliRunner
from helpers import one_error_line, run

from capacity_advisor.advisor.cli.main import cli

# (arguments, a fragment of the one error line); OUT is replaced by a fresh path that must stay absent.
USAGE = [
    (["score"], "Missing option '--model'"),
    (["score", "-m", "m", "-p", "p", "-o", "OUT", "--shard-size", "abc"], "'abc' is not a valid integer"),
    (["score", "-m", "m", "-p", "p", "-o", "OUT", "--device", "tpu"], "Invalid value for '--device'"),
    (["select", "--pool", "p"], "Missing option '--scores'"),
    (["generate", "-t", "t", "-p", "p", "-o", "OUT", "--n", "four"], "'four' is not a valid integer"),
    (["fit", "--bogus"], "No such option"),
    (["nosuch"], "No such command 'nosuch'"),
    (["--bogus"], "No such option"),
    (["lab", "pool", "--n", "x", "--out", "OUT"], "'x' is not a valid integer"),
    (["lab", "nosuch"], "No such command 'nosuch'"),
    (["recommend", "-m", "lab:xs", "-o", "OUT"], "Missing option '--budget'"),
    (["probe", "-m", "m", "-p", "p", "-o", "OUT", "--probe-steps", "many"], "'many' is not a valid integer"),
    (["probe", "-m", "m", "-p", "p", "-o", "OUT", "--steps", "5"], "--steps is no longer a flag of `advisor probe`: use --probe-steps"),
    (["probe", "-m", "m", "-p", "p", "-o", "OUT", "--max-length", "5"], "use --train-length"),
    (["recommend", "-m", "m", "-b", "2", "-o", "OUT", "--max-length", "5"], "use --score-length"),
    (["recommend", "-m", "m", "-b", "2", "-o", "OUT", "--probe-max-length", "5"], "use --train-length"),
    (["score", "-m", "m", "-p", "p", "-o", "OUT", "--max-length", "5"], "`advisor score`: use --score-length"),
    (["train"], "Missing argument 'MANIFEST'"),
    (["lab", "calibrate", "--epochs", "x"], "'x' is not a valid integer"),
    (["fit", "-r", "POOL", "-o", "OUT", "--jobs", "0"], "Invalid value for '--jobs'"),
    (["fit", "-r", "POOL", "-o", "OUT", "--tie-margin", "nan"], "'nan' is not a finite number"),
    (["fit", "-r", "POOL", "-o", "OUT", "--tie-margin", "2"], "2 is not from 0 to 1"),
    (["fit", "-r", "POOL", "-o", "OUT", "--seed", "-1"], "Invalid value for '--seed'"),
    (["fit", "-r", "POOL", "-o", "OUT", "--members", "0"], "Invalid value for '--members'"),
    (["fit", "-r", "POOL", "-o", "OUT", "--cv-members", "0"], "Invalid value for '--cv-members'"),
    (["fit", "-r", "POOL", "-o", "OUT", "--gate-draws", "0"], "Invalid value for '--gate-draws'"),
    (["recommend", "-m", "lab:xs", "-b", "nan", "-o", "OUT"], "'nan' is not a finite number"),
    (["probe", "-m", "m", "-p", "p", "-o", "OUT", "--learning-rate", "inf"], "'inf' is not a finite number"),
]


FIXTURES = {"afile", "pool.jsonl", "empty", "bad.jsonl", "scores.jsonl", "no-model.json", "no-lab.json", "lab.json"}


def invoke(args, tmp_path):
    """OUT: a fresh path; FILE: a regular file (so FILE/x cannot be made); POOL: a good pool;
    EMPTY: a folder with no model in it; BAD: a file with a broken JSON line; MISSING: no such file;
    NOMODEL, NOLAB, MANIFEST: manifests whose model is a missing folder, an unknown or a good lab student;
    SCORES: a scores file with values of the wrong type."""
    out = tmp_path / "out"
    (tmp_path / "afile").write_text("not a folder")
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"id": "a", "problem": "1+1?", "generations": ["2", "two"], "answer": "2"}\n')
    (tmp_path / "empty").mkdir(exist_ok=True)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "problem": \n')
    (tmp_path / "scores.jsonl").write_text('{"id": "a", "k": "0", "n_tokens": 1, "logprob_sum": -1.0, "logprob_mean": "high", '
                                           '"truncated": false}\n')
    for name, spec in (("no-model.json", str(tmp_path / "no-model")), ("no-lab.json", "lab:nosuch"), ("lab.json", "lab:xs")):
        (tmp_path / name).write_text(f'{{"version": 1, "model": {{"spec": "{spec}"}}, "dataset": "pool.jsonl"}}')
    names = {"OUT": out, "FILE": tmp_path / "afile", "POOL": pool, "EMPTY": tmp_path / "empty",
             "BAD": tmp_path / "bad.jsonl", "MISSING": tmp_path / "missing.jsonl", "NOMODEL": tmp_path / "no-model.json",
             "NOLAB": tmp_path / "no-lab.json", "MANIFEST": tmp_path / "lab.json", "SCORES": tmp_path / "scores.jsonl"}
    args = [re.sub(r"^(OUT|FILE|POOL|EMPTY|BAD|MISSING|NOMODEL|NOLAB|MANIFEST|SCORES)", lambda m: str(names[m[1]]), a) for a in args]
    return run(*args, catch=True), out


def read_only_dir():
    """A folder no one may write in, even root (this runs as root in some CI machines)."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir="/sys")
    except OSError:
        return "/sys"
    os.close(fd)
    os.unlink(name)
    return None


UNWRITABLE = [
    (["score", "-m", "lab:xs", "-p", "POOL", "-o", "FILE/scores"], "--out"),
    (["score", "-m", "lab:xs", "-p", "POOL", "-o", "FILE"], "is a file"),
    (["select", "-p", "POOL", "-s", "POOL", "-o", "FILE/train.jsonl"], "--out"),
    (["select", "-p", "POOL", "-s", "POOL", "-o", "OUT"], None),  # a folder where a file goes: set up below
    (["generate", "-t", "lab:xs", "-p", "POOL", "-o", "FILE/pool.jsonl"], "--out"),
    (["fit", "-r", "POOL", "-o", "FILE/predictor"], "--out"),
    (["fit", "-r", "POOL", "-o", "OUT", "--choose-by", "source,seed"], "--choose-by source,seed"),
    (["lab", "pool", "--n", "3", "-o", "FILE/pool.jsonl"], "is a file, so nothing can be written under it"),
]


@pytest.mark.parametrize("args,fragment", UNWRITABLE, ids=[" ".join(a) for a, _ in UNWRITABLE])
def test_unwritable_outputs_fail_before_any_work(tmp_path, args, fragment):
    if fragment is None:  # --out names an existing folder where the verb writes a file
        (tmp_path / "out").mkdir()
        fragment = "is a directory"
    result, _ = invoke(args, tmp_path)
    one_error_line(result, fragment, quiet=True)
    # nothing written, not even a lab student built in the cache home (tmp_path / "advisor-home")
    assert {p.name for p in tmp_path.iterdir()} <= FIXTURES | {"out"}


@pytest.mark.skipif(read_only_dir() is None, reason="no read-only folder to test with")
@pytest.mark.parametrize("verb", [["score", "-m", "lab:xs", "-p", "POOL"], ["select", "-p", "POOL", "-s", "POOL"],
                                  ["generate", "-t", "lab:xs", "-p", "POOL"], ["fit", "-r", "POOL"]])
def test_read_only_outputs_fail_before_any_work(tmp_path, verb):
    out = f"{read_only_dir()}/advisor-test/" + ("out.jsonl" if verb[0] in ("select", "generate") else "out")
    result, _ = invoke(verb + ["-o", out], tmp_path)
    one_error_line(result, "cannot write in", quiet=True)


@pytest.mark.parametrize("args,fragment", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_one_line(tmp_path, args, fragment):
    result, out = invoke(args, tmp_path)
    one_error_line(result, fragment, out, quiet=True)
    assert "--help)" in result.stderr  # where to look next


def test_bare_advisor_still_shows_help():
    result = run()
    assert "Usage:" in result.output and "score" in result.output


def test_a_message_quoting_line_breaks_is_still_one_line(tmp_path):
    # File names, field values and library messages (pyarrow's span lines) end up inside errors.
    result, out = invoke(["select", "--pool", "two\nlines\r\u2028.jsonl", "--scores", "s", "--out", "OUT"], tmp_path)
    one_error_line(result, "pool two lines .jsonl does not exist", out, quiet=True)


SCORE = ["score", "-p", "POOL", "-o", "OUT"]
SELECT = ["select", "-p", "POOL", "-o", "OUT.jsonl"]
GENERATE = ["generate", "-p", "POOL", "-o", "OUT.jsonl"]
BAD_INPUT = [
    (SCORE + ["-m", "EMPTY"], "has no config.json"),
    (SCORE + ["-m", "FILE"], "is a file, not a model folder"),
    (SCORE + ["-m", "MISSING/model"], "does not exist"),
    (SCORE + ["-m", "lab:nosuch"], "unknown lab model 'nosuch'"),
    (["score", "-m", "EMPTY", "-p", "MISSING", "-o", "OUT"], "does not exist"),
    (["score", "-m", "EMPTY", "-p", "BAD", "-o", "OUT"], "line 1: not valid JSON"),
    (["score", "-m", "EMPTY", "-p", "FILE", "-o", "OUT"], "unknown file type"),
    (SCORE + ["-m", "EMPTY", "--token-budget", "10"], "--token-budget 10 is below --score-length"),
    (SCORE + ["-m", "EMPTY", "--dp-rank", "2", "--dp-size", "2"], "--dp-rank 2 / --dp-size 2"),
    (SCORE + ["-m", "EMPTY", "--shard-size", "0"], "--shard-size 0 must be at least 1"),
    (SCORE + ["-m", "EMPTY", "--tensor-parallel-size", "2"], "applies to --backend vllm only"),
    (SCORE + ["-m", "EMPTY", "--prompt-field", "nope"], "--prompt-field 'nope' is not a field"),
    (SELECT + ["-s", "MISSING"], "run `advisor score` first"),
    (SELECT + ["-s", "BAD"], "the scores file is damaged"),
    (SELECT + ["-s", "POOL"], "is this a file written by `advisor score`?"),
    (SELECT + ["-s", "POOL", "--strategy", "hardest"], "Invalid value for '--strategy': 'hardest' is not one of"),
    (SELECT + ["-s", "SCORES"], "line 1: k, logprob_mean of the wrong type"),
    (SELECT + ["-s", "POOL", "--strategy", "curriculum", "--switch-epoch", "0"], "--switch-epoch 0 must be at least 1"),
    (SELECT + ["-s", "POOL", "--mix", "2"], "--mix 2.0 is outside [0, 1]"),
    (SELECT + ["-s", "POOL", "--format", "csv"], "Invalid value for '--format': 'csv' is not one of"),
    (GENERATE + ["-t", "EMPTY"], "has no config.json"),
    (GENERATE + ["-t", "lab:nosuch"], "unknown lab model 'nosuch'"),
    (["generate", "-t", "EMPTY", "-p", "MISSING", "-o", "OUT.jsonl"], "does not exist"),
    (GENERATE + ["-t", "EMPTY", "--top-p", "2"], "--top-p 2.0 must be in (0, 1]"),
    (["generate", "-t", "EMPTY", "-p", "POOL", "-o", "OUT.txt"], "write the pool as .jsonl or .parquet"),
    (["fit", "-r", "MISSING", "-o", "OUT"], "does not exist"),
    (["fit", "-r", "BAD", "-o", "OUT"], "remove the damaged line"),
    (["fit", "-r", "POOL", "-o", "OUT"], "is this a records file written by"),
    (["fit", "-r", "BAD", "-o", "OUT", "--seed", "4294967295", "--gate-draws", "2"], "passes the last seed"),  # before reading
    (["lab", "pool", "--n", "0", "-o", "OUT.jsonl"], "--n must be from 1 to 1,000,000 problems, got 0"),
    (["lab", "pool", "--candidates", "2", "-o", "OUT.jsonl"], "--candidates must be between 4 and 8"),
    # verbs whose modules others own: their argument errors, as far as they reach today
    (["train", "MISSING", "-o", "OUT"], "not found"),
    (["train", "POOL", "-o", "OUT"], "unknown top-level keys"),
    (["train", "NOMODEL", "-o", "OUT"], "does not exist"),
    (["train", "NOLAB", "-o", "OUT", "--nproc", "2"], "unknown lab model 'nosuch'"),
    (["train", "MANIFEST", "-o", "FILE/run"], "--out"),
    (["train", "MANIFEST", "-o", "FILE/run", "--dry-run"], "--out"),
    (["recommend", "-m", "lab:xs", "-b", "-1", "-o", "OUT", "--no-probe"], "--budget -1.0 must be a positive"),
    (["recommend", "-m", "lab:xs", "-b", "10001", "-o", "OUT"], "at most 10,000"),  # before scoring, not at the manifest
    (["recommend", "-m", "EMPTY", "-b", "2", "-o", "OUT", "--no-probe"], "has no config.json"),
    (["probe", "-m", "EMPTY", "-p", "POOL", "-o", "OUT"], "has no config.json"),
    (["recommend", "-m", "lab:xs", "-b", "2", "-o", "OUT", "--predictor", "EMPTY"], "no predictor at"),
    (["recommend", "-m", "lab:xs", "-b", "2", "-o", "OUT", "--predictor", "BAD"], "no predictor at"),
    (["recommend", "-m", "lab:xs", "-b", "2", "-o", "OUT", "-p", "POOL"], "the pool has 1 rankable problems"),
    (["recommend", "-m", "lab:xs", "-b", "2", "-o", "OUT", "--probe-steps", "0"], "--probe-steps 0 must be at least 1"),
    (["recommend", "-m", "lab:xs", "-b", "2", "-o", "OUT", "--probe-steps", "4", "--probe-eval-every", "8"],
     "--probe-eval-every 8 must not exceed the probe's steps (4, --probe-steps)"),
    (["probe", "-m", "lab:xs", "-p", "POOL", "-o", "OUT"], "the pool has 1 rankable problems"),
    (["probe", "-m", "lab:xs", "-p", "POOL", "-o", "OUT", "--probe-eval-every", "0"], "--probe-eval-every 0 must be at least 1"),
]


@pytest.mark.parametrize("args,fragment", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, args, fragment):
    result, out = invoke(args, tmp_path)
    one_error_line(result, fragment, quiet=True)
    assert not list(tmp_path.glob("out*")) and not (tmp_path / "advisor-home").exists()


@pytest.mark.parametrize("args,fragment", [
    (["score", "-m", "lab:xs", "-p", "POOL", "-o", "OUT"], "ADVISOR_HOME (the score cache)"),
    (["generate", "-t", "lab:xs", "-p", "POOL", "-o", "OUT.jsonl"], "ADVISOR_HOME (the generation cache)"),
])
def test_a_cache_home_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, args, fragment):
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "afile" / "home"))
    result, out = invoke(args, tmp_path)
    one_error_line(result, fragment, quiet=True)
    assert {p.name for p in tmp_path.iterdir()} <= FIXTURES


def test_a_filesystem_fault_anywhere_else_is_one_line():
    import errno

    from capacity_advisor.advisor.cli.main import AdvisorGroup

    group = AdvisorGroup()

    @group.command()
    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "/some/where")

    @group.command()
    def bug():
        raise OSError(errno.EBADF, "Bad file descriptor")  # not the user's filesystem: a bug keeps its traceback

    one_error_line(CliRunner().invoke(group, ["denied"]), "/some/where: Permission denied", quiet=True)
    assert isinstance(CliRunner().invoke(group, ["bug"]).exception, OSError)


VERB_ERRORS = [args for args, _ in BAD_INPUT + USAGE if args[0] in ("recommend", "probe")]


@pytest.mark.parametrize("args", VERB_ERRORS, ids=[" ".join(a) for a in VERB_ERRORS])
def test_errors_name_only_flags_the_verb_has(tmp_path, args):
    result, _ = invoke(args, tmp_path)
    assert result.exit_code == 2
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", result.stderr)) - {"--help"}
    flags = {o for p in cli.commands[args[0]].params for o in p.opts}
    assert named <= flags, (named - flags, result.stderr)


def test_main_takes_argv_and_returns_the_exit_code(tmp_path, capsys):
    from capacity_advisor.advisor.cli.main import main

    assert main(["lab", "pool", "--n", "4", "--out", str(tmp_path / "p.jsonl"), "--json"]) == 0
    assert (tmp_path / "p.jsonl").exists()
    assert main(["nosuch"]) == 2 and main(["recommend", "-m", "lab:xs", "-o", str(tmp_path / "o")]) == 2
    assert main(["--version"]) == 0
    err = capsys.readouterr().err
    assert "error: No such command 'nosuch'" in err and "Missing option '--budget'" in err
