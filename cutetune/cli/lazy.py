"""A click group that imports a command's module only when the command is run or its help is
shown (click's documented LazyGroup pattern), so a command's imports cost only that command."""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """`lazy_subcommands` maps each command's name to "module:attribute"."""

    def __init__(self, *args, lazy_subcommands: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is a {type(command).__name__}, not a click command")
        return command
