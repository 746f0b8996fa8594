"""The one exception type for user mistakes, shared by every room.

It lives in `models/` because that room imports nothing of ours, so every other room can use it.
The message is one line that says what is wrong and how to fix it; the CLI prints it and exits
non-zero without a traceback.
"""


class InputError(Exception):
    """Something the user gave (a file, a flag, a model path) cannot be used as it is."""
