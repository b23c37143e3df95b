"""A kernel's problems in the model a command names, each way that can fail as one line."""

from __future__ import annotations

import click


def checked_model(model: str):
    """The model's shape (spaces.models.ModelShape); one line naming --model if there is none."""
    from cutetune.spaces.models import UnknownModelError, load_model

    try:
        return load_model(model)
    except UnknownModelError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None


def model_problems(kernel, model: str, dtype: str, skip_if_absent: bool = False):
    """The kernel's problems in the model; none, said on stderr, if it does not apply and
    `skip_if_absent`."""
    from cutetune.kernels.registry import NotApplicableError

    try:
        return kernel.problems_for_model(checked_model(model), dtype)
    except NotApplicableError as err:
        if skip_if_absent:
            click.echo(f"skipping {kernel.name}: {err}", err=True)
            return []
        raise click.UsageError(str(err)) from None
    except ValueError as err:  # a size or dtype outside what the kernel's problem accepts
        raise click.UsageError(f"{kernel.name} cannot serve {model}: {err}") from None
