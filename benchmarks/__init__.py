"""Performance benchmarks: what scoring, a CLI call and the GPU path cost, measured side by side.

Each module runs from the repository root as `python -m benchmarks.NAME` (its docstring gives the
command and the machine it needs); the tests import them as `benchmarks.NAME`. The analyses behind
the docs' tables live in `experiments/`, the lab's data pipeline in `advisor lab`.
"""
