"""`python -m benchmarks.gpu_check`: the GPU check (`run.main`); exit 1 when a part failed."""

import sys

from benchmarks.gpu_check.run import main

sys.exit(1 if main().get("errors") else 0)
