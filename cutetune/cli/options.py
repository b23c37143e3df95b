"""The command line's shared arguments and options, and how their values are read and checked:
each bad value one line naming the option, what it got and what it accepts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import click
from click.core import ParameterSource

from cutetune.cli.context import Context
from cutetune.kernels.names import KERNEL_NAMES
from cutetune.spaces.buckets import DEFAULT_TUNE_TOKENS, MAX_BUCKET, bucket_of
from cutetune.spaces.models import PRESET_NAMES

DTYPES = ("bfloat16", "float16", "float32")

# What --help lists below the options of the commands that take a kernel or a model, from
# lists that import neither the kernels nor torch, so that --help stays fast.
KERNELS_HELP = f"Kernels: {', '.join(KERNEL_NAMES)}."
PRESETS_HELP = (f"Presets for --model: {', '.join(PRESET_NAMES)}; or the path of a Hugging "
                "Face config.json (or of its folder).")
CATALOG_HELP = f"{KERNELS_HELP}\n\n{PRESETS_HELP}"


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange less nan and inf: a nan compares false with both bounds, so the range
    alone lets it through, and inf passes a range open above."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number ({self._describe_range()})", param, ctx)
        return number


class KernelName(click.ParamType):
    """A registered kernel's name. The kernels are imported (and CuTeDSL with them) only when a
    name is checked, so that --help and the commands that need no kernel start fast."""

    name = "kernel"

    def convert(self, value, param, ctx) -> str:
        from cutetune.kernels.registry import UnknownKernelError, get_kernel

        try:
            return get_kernel(value).name
        except UnknownKernelError as err:
            self.fail(str(err), param, ctx)


class DeviceName(click.ParamType):
    """A GPU of the device table (cutetune.device.specs.DEVICE_SPECS), by its name there in any case
    or by the name CUDA gives it ('NVIDIA H100 80GB HBM3'); the value is its DeviceSpec. The
    table is imported when a value is checked or the option's help is shown, not before."""

    name = "device"

    def get_metavar(self, param, ctx=None) -> str:  # click before 8.2 passes no ctx
        from cutetune.device.specs import DEVICE_SPECS

        return f"[{'|'.join(DEVICE_SPECS)}]"

    def convert(self, value, param, ctx):
        from cutetune.device.specs import DEVICE_SPECS, DeviceSpec, device_spec_for

        if isinstance(value, DeviceSpec):
            return value
        try:
            return device_spec_for(value)
        except ValueError:
            self.fail(f"unknown device {value!r}: known are {', '.join(DEVICE_SPECS)}", param,
                      ctx)


def parse_tokens(ctx, param, value: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token counts, "
                                 "e.g. 1,8,64") from None
    if not tokens or min(tokens) < 1 or max(tokens) > MAX_BUCKET:
        raise click.BadParameter(f"token counts must be integers from 1 to {MAX_BUCKET}, "
                                 f"got {value!r}")
    return tuple(dict.fromkeys(tokens))  # a count given twice is one count


def token_buckets(tokens: Sequence[int]) -> tuple[int, ...]:
    """The buckets that serve `tokens`, each once, in order; a count that is not a bucket is
    said on stderr with the bucket that serves it, so that --tokens 3 planning bucket 4 is no
    surprise."""
    note = bucket_note(tokens)
    if note:
        click.echo(note, err=True)
    return tuple(sorted({bucket_of(n) for n in tokens}))


def bucket_note(tokens: Sequence[int]) -> str | None:
    """One line naming the bucket that serves each count that is not a bucket, e.g. "token
    count 3 is served by bucket 4; 5 and 7 by bucket 8"; None where every count is one."""
    served: dict[int, list[int]] = {}
    for n in sorted(set(tokens)):
        if bucket_of(n) != n:
            served.setdefault(bucket_of(n), []).append(n)
    if not served:
        return None
    (bucket, counts), *rest = served.items()
    plural = len(counts) > 1
    first = (f"token count{'s' if plural else ''} {_listed(counts)} "
             f"{'are' if plural else 'is'} served by bucket {bucket}")
    return "; ".join([first, *(f"{_listed(more)} by bucket {b}" for b, more in rest)])


def _listed(counts: list[int]) -> str:
    names = [str(n) for n in counts]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def parse_gpus(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        gpus = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of GPU numbers, "
                                 "e.g. 0,1") from None
    if min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise click.BadParameter(f"GPU numbers must be distinct and at least 0, got {value!r}")
    return gpus


def fingerprint_or_none(all_devices: bool):
    """The fingerprint of this GPU, whose winners a command reads; None (every device's) where
    --all-devices asks or where there is no GPU."""
    import torch

    if all_devices or not torch.cuda.is_available():
        return None
    from cutetune.results_db import DeviceFingerprint

    return DeviceFingerprint.current()


def device_option(help: str, default: str | None = "H200"):
    return click.option("--device", type=DeviceName(), default=default,
                        show_default=default is not None, help=help)


def _use_db(ctx: click.Context, param: click.Parameter, url: str | None) -> None:
    # A command's own --db replaces the group's only where it is given on the command line:
    # CUTETUNE_DB or the default, read again there, would undo a --db given to the group.
    if ctx.parent is None or ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
        ctx.obj = Context.for_url(url)


# Declared once: the group takes it, and so does `report` (`cutetune report --db URL`, as the
# report's own help has always shown it).
db_option = click.option("--db", "db_url", envvar="CUTETUNE_DB", show_envvar=True,
                         expose_value=False, callback=_use_db,
                         help="SQLAlchemy URL of the results DB [default: cutetune.db in "
                              "$CUTETUNE_CACHE_DIR or ~/.cache/cutetune]")
kernel_argument = click.argument("kernel", type=KernelName())
model_option = click.option("--model", "-m", required=True,
                            help="a preset (listed below) or the path of a HF config.json")
dtype_option = click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16",
                            show_default=True, help="activation dtype")
tokens_option = click.option(
    "--tokens", default=",".join(map(str, DEFAULT_TUNE_TOKENS)), callback=parse_tokens,
    help="token counts, each served by its bucket: the power of two at or above it "
         f"[default: every power of two from {DEFAULT_TUNE_TOKENS[0]} to "
         f"{DEFAULT_TUNE_TOKENS[-1]}]")
kernel_filter = click.option("--kernel", type=KernelName(), default=None,
                             help="only this kernel")
all_devices_option = click.option("--all-devices", is_flag=True,
                                  help="winners of every device, not only this GPU")
