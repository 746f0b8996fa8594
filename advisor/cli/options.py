"""Options more than one verb takes, each declared once, with the choices the library knows."""

from __future__ import annotations

from typing import Callable

import click

from capacity_advisor.models.loading import DEVICES, DTYPES


def _stack(*options) -> Callable:
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


device_option = click.option("--device", default="auto", type=click.Choice(DEVICES), show_default=True,
                             help="auto: a CUDA GPU when one is visible, else the CPU.")
dtype_option = click.option("--dtype", default="auto", type=click.Choice(DTYPES), show_default=True,
                            help="auto: bf16 on GPUs that support it (else fp16), fp32 on CPUs.")
device_options = _stack(device_option, dtype_option)


def seed_option(help_text: str = "Random seed.") -> Callable:
    return click.option("--seed", default=0, show_default=True, help=help_text)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (tables go to stderr).")
model_option = click.option("--model", "-m", required=True, help="Student: a local HF folder, a hub id, or lab:NAME.")
score_option = click.option("--score", "score_kind", default="sum", show_default=True,
                            type=click.Choice(["sum", "mean", "rsr", "local"]),
                            help="Rank candidates by summed log-prob (the paper's), mean per token (GRAPE's), the "
                                 "rank-surprisal ratio (arXiv 2601.14249) or step-local log-prob (arXiv 2510.03988).")
skip_tokens_option = click.option("--skip-tokens", default=0, show_default=True,
                                  help="Leave each response's first N tokens out of its score (response-start cues).")


def checker_option(f):
    from capacity_advisor.models.metrics import CHECKER_CHOICES

    return click.option("--checker", default="auto", show_default=True, type=click.Choice(CHECKER_CHOICES),
                        help="Answer checker: auto = the lab's for lab tasks, math for other problems with answers.")(f)


POOL_FIELDS = ("prompt_field", "responses_field", "answer_field", "correct_field", "id_field", "all_candidates", "strict",
               "split", "subset", "revision")
dataset_options = _stack(
    click.option("--split", default=None, help="Hub dataset or dataset folder: the split to read (default: train, or its only one)."),
    click.option("--subset", default=None, help="Hub dataset or dataset folder: its configuration name."),
    click.option("--revision", default=None, help="Hub dataset: a branch, tag or commit."),
)
pool_options = _stack(
    click.option("--prompt-field", default=None, help="Field holding the problem text (auto-detected)."),
    click.option("--responses-field", default=None,
                 help="Field holding the candidates: a list (grouped) or one response per row (flat)."),
    click.option("--answer-field", default=None, help="Field holding the reference answer."),
    click.option("--correct-field", default=None, help="Field marking candidates correct (list or per row)."),
    click.option("--id-field", default=None, help="Problem id field; flat rows are grouped by it."),
    click.option("--all-candidates", is_flag=True, help="Keep candidates marked incorrect."),
    click.option("--strict", is_flag=True, help="Fail on any skipped candidate or problem instead of reporting it."),
    dataset_options,
)


def pool_settings(kw: dict):
    """The PoolOptions the pool flags describe (removed from `kw`)."""
    from capacity_advisor.advisor.pool import PoolOptions

    return PoolOptions(**{k: kw.pop(k) for k in POOL_FIELDS})


vllm_options = _stack(
    click.option("--tensor-parallel-size", default=1, show_default=True, help="vllm: GPUs one model is split over."),
    click.option("--gpu-memory-utilization", default=0.9, show_default=True, help="vllm: share of each GPU's memory vLLM may take."),
)
dp_options = _stack(
    click.option("--dp-rank", default=0, show_default=True, help="This process's index among --dp-size processes."),
    click.option("--dp-size", default=1, show_default=True,
                 help="Processes sharing the work's shards; the last to finish writes the outputs."),
)


def names(text: str, flag: str) -> tuple[str, ...]:
    from capacity_advisor.models.errors import InputError

    out = tuple(s.strip() for s in text.split(",") if s.strip())
    if not out and text:
        raise InputError(f"{flag} {text!r}: give comma-separated names")
    return out


def ints(text: str, flag: str) -> tuple[int, ...]:
    from capacity_advisor.models.errors import InputError

    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated integers, e.g. 0,1,2") from None


def floats(text: str, flag: str) -> tuple[float, ...]:
    import math

    from capacity_advisor.models.errors import InputError

    try:
        out = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated numbers, e.g. 1,2") from None
    if not all(math.isfinite(x) for x in out):
        raise InputError(f"{flag} {text!r}: give finite numbers")
    return out
