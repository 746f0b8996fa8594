"""The command line: click and rich only. `main` is the `advisor` console script."""

from capacity_advisor.advisor.cli.main import cli, main

__all__ = ["cli", "main"]
