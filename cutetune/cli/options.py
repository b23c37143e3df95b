"""The command line's shared arguments and options, and how their values are read and checked:
each bad value one line naming the option, what it got and what it accepts."""

from __future__ import annotations

import click

from cutetune.spaces.buckets import MAX_BUCKET

DEFAULT_TOKENS = "1,8,64,512,4096,32768"
DTYPES = ("bfloat16", "float16", "float32")


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


def parse_tokens(ctx, param, value: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of token counts, "
                                 "e.g. 1,8,64") from None
    if not tokens or min(tokens) < 1 or max(tokens) > MAX_BUCKET:
        raise click.BadParameter(f"token counts must be integers from 1 to {MAX_BUCKET}, "
                                 f"got {value!r}")
    return tokens


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


kernel_argument = click.argument("kernel", type=KernelName())
model_option = click.option("--model", "-m", required=True,
                            help="preset name (e.g. qwen3-8b) or path of a HF config.json")
dtype_option = click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16",
                            show_default=True, help="activation dtype")
tokens_option = click.option("--tokens", default=DEFAULT_TOKENS, show_default=True,
                             callback=parse_tokens, help="token counts (one bucket each)")
kernel_filter = click.option("--kernel", type=KernelName(), default=None,
                             help="only this kernel")
