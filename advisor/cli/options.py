"""Options more than one verb takes, each declared once, with the choices the library knows; and
the two helpers that let a verb state each of its settings once: `field_option` (a flag for a
field of the library's config: its default and type come from the field) and `take` (that config
built from the parsed flags, by field name).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Callable

import click

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.backends import VLLM_DEFAULTS
from capacity_advisor.models.loading import DEVICES, DTYPES
from capacity_advisor.probes.recipe import OLD_FLAGS, RECIPE_FLAGS, flag
from capacity_advisor.training.manifest_checks import MAX_SEED
from capacity_advisor.training.ranking import DEFAULT_RANKING, RANKINGS
from capacity_advisor.training.text_metrics import CHECKER_CHOICES, CHECKER_DEFAULT

SEEDS = click.IntRange(0, MAX_SEED)  # what every seeded library takes


def field_option(cls, name: str, *decls: str, **extra) -> Callable:
    """A click option for field `name` of dataclass `cls`: `--NAME-WITH-DASHES` unless `decls`
    say otherwise, stored under the field's name, with the field's default and type."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, tuple):  # a list setting: given as comma-separated text, parsed by the verb
        default, extra["type"] = ",".join(map(str, default)), str
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(hint, types.UnionType) else [hint]
    kind = args[0] if len(args) == 1 else None
    if kind is bool:
        extra.setdefault("is_flag", True)
    elif kind in (int, float, str) and "type" not in extra:
        extra["type"] = FINITE if kind is float else kind
    if f.metadata.get("help"):  # the help kept beside the field
        extra.setdefault("help", f.metadata["help"])
    if default is not None:
        extra.setdefault("default", default)
        extra.setdefault("show_default", kind is not bool)
    return click.option(*(decls or (f"--{name.replace('_', '-')}",)), name, **extra)


def given_on_command_line(ctx: click.Context) -> frozenset:
    """The names of the parameters given on the command line (not left at their defaults)."""
    return frozenset(p.name for p in ctx.command.params
                     if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE)


def take(cls, kw: dict, **given):
    """`cls` built from the parsed flags named after its fields (removed from `kw`), and `given`."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: kw.pop(k) for k in list(kw) if k in names}, **given)


class TwinCommand(click.Command):
    """A verb with a twin that takes other flags (`advisor calibrate` and `advisor lab calibrate`):
    a flag only the twin takes is refused as one line from `refusal(flags)` (the twin's flags given,
    in the order given), in place of click's "No such option". The twin is found by its path under
    the command line's root (`twin`, e.g. ("lab", "calibrate")) when the mistake is made: neither
    command declares a flag of the other."""

    def __init__(self, *args, twin: tuple[str, ...], refusal: Callable[[list[str]], str], **kwargs):
        super().__init__(*args, **kwargs)
        self.twin, self.refusal = twin, refusal

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            theirs = self.twin_flags(ctx)
            if e.option_name not in theirs:
                raise
            flags = given[:given.index("--")] if "--" in given else given
            shown = [f for f in dict.fromkeys(a.partition("=")[0] for a in flags) if f in theirs]
            raise InputError(self.refusal(shown)) from None

    def twin_flags(self, ctx: click.Context) -> set[str]:
        """The long flags the twin takes and this command does not (none when the twin is not found)."""
        twin, root = ctx.find_root().command, ctx.find_root()
        for name in self.twin:
            twin = twin.get_command(root, name) if isinstance(twin, click.Group) else None
        if twin is None or twin is self:
            return set()
        mine = {opt for param in self.params for opt in param.opts}
        return {opt for param in twin.params if isinstance(param, click.Option) and not param.hidden
                for opt in param.opts if opt.startswith("--") and opt not in mine}


class Finite(click.ParamType):
    """A float that is a number: click's own float takes 'nan' and 'inf'."""

    name = "float"

    def __init__(self, low: float | None = None, high: float | None = None):
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a valid number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if (self.low is not None and x < self.low) or (self.high is not None and x > self.high):
            where = f"from {self.low:g} to {self.high:g}" if self.low is not None and self.high is not None else \
                f"at least {self.low:g}" if self.low is not None else f"at most {self.high:g}"
            self.fail(f"{value} is not {where}", param, ctx)
        return x


FINITE = Finite()


def recipe_options(verb: str) -> Callable:
    """The probe-recipe flags (probes.recipe.RECIPE_FLAGS, the same in every verb that probes), each
    stored under its recipe setting's name; unset, each comes from the predictor's recipe or the
    student's kind. The names `verb` took before (`OLD_FLAGS`) are refused with the one to use."""
    return stack(*(click.option(flag, setting, default=None, type=int,
                                 help=f"{help_text} Default: the recipe (the predictor's, else by kind of student).")
                    for setting, (flag, help_text) in RECIPE_FLAGS.items()), retired_flags(verb))


def retired_flags(verb: str) -> Callable:
    """Hidden options for the flags `verb` took before its settings had one name each: given, each
    is one usage error naming the flag that replaced it."""
    def refuse(setting: str):
        def callback(ctx, param, value):
            if value is not None:
                raise click.UsageError(f"{param.opts[0]} is no longer a flag of `advisor {verb}`: use {flag(setting)}")
            return value

        return callback

    return stack(*(click.option(old, f"retired_{setting}", default=None, hidden=True, expose_value=False,
                                 callback=refuse(setting))
                    for setting, old in OLD_FLAGS.get(verb, {}).items()))


def recipe_given(kw: dict) -> dict:
    """The recipe settings the user gave (removed from `kw`): {setting: value}."""
    given = {k: kw.pop(k) for k in RECIPE_FLAGS}
    return {k: v for k, v in given.items() if v is not None}


def stack(*options) -> Callable:
    """One decorator applying `options` in order (the first is the first flag in --help)."""

    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


device_option = click.option("--device", default="auto", type=click.Choice(DEVICES), show_default=True,
                             help="auto: a CUDA GPU when one is visible, else the CPU.")
dtype_option = click.option("--dtype", default="auto", type=click.Choice(DTYPES), show_default=True,
                            help="auto: bf16 on GPUs that support it (else fp16), fp32 on CPUs.")
device_options = stack(device_option, dtype_option)


def seed_option(help_text: str = "Random seed.") -> Callable:
    return click.option("--seed", default=0, show_default=True, type=SEEDS, help=help_text)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (tables go to stderr).")
model_option = click.option("--model", "-m", required=True, help="Student: a local HF folder, a hub id, or lab:NAME.")
score_option = click.option("--score", "score", default=DEFAULT_RANKING, show_default=True, type=click.Choice(RANKINGS),
                            help="Rank candidates by summed log-prob (the paper's), mean per token (GRAPE's), the "
                                 "rank-surprisal ratio (arXiv 2601.14249) or step-local log-prob (arXiv 2510.03988).")
skip_tokens_option = click.option("--skip-tokens", default=0, show_default=True,
                                  help="Leave each response's first N tokens out of its score (response-start cues).")


def checker_option(f):
    return click.option("--checker", default=CHECKER_DEFAULT, show_default=True, type=click.Choice(CHECKER_CHOICES),
                        help="Answer checker: auto = the lab's for lab tasks, math for other problems with answers.")(f)


POOL_FIELDS = ("prompt_field", "responses_field", "answer_field", "correct_field", "id_field", "all_candidates", "strict",
               "split", "subset", "revision")
dataset_options = stack(
    click.option("--split", default=None, help="Hub dataset or dataset folder: the split to read (default: train, or its only one)."),
    click.option("--subset", default=None, help="Hub dataset or dataset folder: its configuration name."),
    click.option("--revision", default=None, help="Hub dataset: a branch, tag or commit."),
)
pool_options = stack(
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
    return PoolOptions(**{k: kw.pop(k) for k in POOL_FIELDS})


vllm_options = stack(
    click.option("--tensor-parallel-size", default=1, show_default=True, help="vllm: GPUs one model is split over."),
    click.option("--gpu-memory-utilization", default=None, type=Finite(0, 1),
                 help=f"vllm: share of each GPU's memory vLLM may take (default {VLLM_DEFAULTS.gpu_memory_utilization:g}; "
                      f"on vLLM's CPU build, {VLLM_DEFAULTS.cpu_memory_utilization:g} of system memory)."),
)
dp_options = stack(
    click.option("--dp-rank", default=0, show_default=True, help="This process's index among --dp-size processes."),
    click.option("--dp-size", default=1, show_default=True,
                 help="Processes sharing the work's shards; the last to finish writes the outputs."),
)


def names(text: str, flag: str) -> tuple[str, ...]:
    out = tuple(s.strip() for s in text.split(",") if s.strip())
    if not out and text:
        raise InputError(f"{flag} {text!r}: give comma-separated names")
    return out


def numbers(text: str, flag: str) -> tuple[float, ...]:
    """Comma-separated finite numbers; InputError otherwise (their range is the setting's to check)."""
    try:
        out = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        out = ()
    if not out or not all(math.isfinite(x) for x in out):
        raise InputError(f"{flag} {text!r}: give comma-separated numbers, e.g. 0,1")
    return out


def ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated integers, e.g. 0,1,2") from None


def floats(text: str, flag: str) -> tuple[float, ...]:
    import math

    try:
        out = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated numbers, e.g. 1,2") from None
    if not all(math.isfinite(x) for x in out):
        raise InputError(f"{flag} {text!r}: give finite numbers")
    return out
