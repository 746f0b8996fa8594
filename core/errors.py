"""The one exception type for user mistakes, shared by every room.

It lives in `models/` because that room imports nothing of ours, so every other room can use it.
The message is one line that says what is wrong and how to fix it; the CLI prints it and exits
non-zero without a traceback.

    raise InputError(f"--shard-size {n} must be at least 1")
"""

import re

# Line breaks (str.splitlines' set) and other control characters: a message quoting a file's
# content or a library's error (pyarrow's span lines) must still print as one clean line.
_BREAKS = re.compile(r"\s*[\x00-\x1f\x7f-\x9f\u2028\u2029]+\s*")


def one_line(text: str) -> str:
    return _BREAKS.sub(" ", str(text)).strip()


class InputError(Exception):
    """Something the user gave (a file, a flag, a model path) cannot be used as it is."""

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(message))
