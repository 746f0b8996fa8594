"""The package layout, in one place: each of the design's folders (and the ground floor, `core`) is
installed as `capacity_advisor.<folder>`, so a user's environment gains no generic `models` or
`training` package, and the packages are found below them (every folder holding an __init__.py),
not listed: a new subpackage is in the wheel as it is in the tests. Everything else about the
distribution is in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = ("advisor", "core", "models", "probes", "training")  # each installed as capacity_advisor.<root>

setup(
    package_dir={f"capacity_advisor.{root}": root for root in ROOTS},
    packages=[f"capacity_advisor.{root}" + (f".{sub}" if sub else "") for root in ROOTS
              for sub in ("", *find_packages(root))],
)
