"""The analyses behind the tables of docs/results.md and docs/lab.md.

Each module runs from the repository root as `python -m experiments.NAME`; its docstring names the
table it produces and the command that produced it. They read the committed calibration
(`calibration/`, the layout of `advisor.lab.published`) and the shipped predictor, and write
nothing the tool reads back; the tests import them as `experiments.NAME`.
"""
