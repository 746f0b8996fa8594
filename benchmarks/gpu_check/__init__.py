"""The GPU check: the hf backend at the paper's student sizes, one real `advisor recommend`, their cost
in GPU-hours, and vllm beside hf (`python -m benchmarks.gpu_check`; a bare checkout on a GPU machine:
`python -m benchmarks.gpu_check.bare OUT`, docs/gpu-check.md).

`run` holds the command line and the order of work; the parts lie beside it: `args` (flags and
their checks), `shapes` (the students, pool assumption and sizes), `measure` (scoring, steps,
generation), `roofline`, `projection`, `hours`, `e2e` (one real recommend), `agreement` (hf against
vllm), `report` (the JSON and Markdown), and `bare` (the check from a bare checkout).
"""
