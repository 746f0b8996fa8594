"""Every mistake on the command line ends the same way: exit code 2, exactly one `error:` line on
stderr with nothing before it, nothing on stdout, no traceback, nothing left where outputs go."""

import pytest
from click.testing import CliRunner

from advisor.cli import cli

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
    (["probe", "-m", "m", "-p", "p", "-o", "OUT", "--steps", "many"], "'many' is not a valid integer"),
    (["train"], "Missing argument 'MANIFEST'"),
    (["calibrate", "--epochs", "x"], "'x' is not a valid integer"),
]


def check_one_error_line(result, fragment, out=None):
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment in lines[0], lines[0]
    if out is not None:
        assert not out.exists()


def invoke(args, tmp_path):
    out = tmp_path / "out"
    return CliRunner().invoke(cli, [str(out) if a == "OUT" else str(a) for a in args]), out


@pytest.mark.parametrize("args,fragment", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_one_line(tmp_path, args, fragment):
    result, out = invoke(args, tmp_path)
    check_one_error_line(result, fragment, out)
    assert "--help)" in result.stderr  # where to look next


def test_bare_advisor_still_shows_help():
    result = CliRunner().invoke(cli, [])
    assert "Usage:" in result.output and "score" in result.output


def test_a_message_quoting_line_breaks_is_still_one_line(tmp_path):
    # File names, field values and library messages (pyarrow's span lines) end up inside errors.
    result, out = invoke(["select", "--pool", "two\nlines\r\u2028.jsonl", "--scores", "s", "--out", "OUT"], tmp_path)
    check_one_error_line(result, "pool two lines .jsonl does not exist", out)
