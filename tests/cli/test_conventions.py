"""The command line follows click's conventions (issue 37, item 4): each command in its own
module behind a lazily loading group."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from cutetune.cli.main import COMMANDS, cli

# -- the lazy group ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_lives_in_its_own_module_under_its_name(name):
    module, attribute = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command) and command.name == name
    assert module == f"cutetune.cli.{attribute}"


def test_help_lists_every_command_with_its_summary():
    text = CliRunner().invoke(cli, ["--help"], terminal_width=1000).output
    listed = text.split("Commands:\n")[1].split("\n\n")[0].splitlines()
    summaries = {line.split()[0]: line.split(None, 1)[1] for line in listed}
    assert list(summaries) == sorted(COMMANDS)
    context = click.Context(cli)
    for name, summary in summaries.items():
        assert summary == cli.get_command(context, name).get_short_help_str(limit=1000)


def loaded_after(args: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh process has imported after `cutetune ARGS`."""
    script = ("import sys\n"
              "from cutetune.cli.main import cli\n"
              "try:\n"
              f"    cli.main(args={args!r}, prog_name='cutetune')\n"
              "except SystemExit:\n"
              "    pass\n"
              f"print(' '.join(m for m in {modules!r} if m in sys.modules))\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout
    return shown.splitlines()[-1].split()


def test_help_imports_no_library_a_command_imports_when_it_runs():
    heavy = ("torch", "cutlass", "sqlalchemy", "pandas", "optuna", "tqdm",
             "cutetune.tuner.roofline", "cutetune.results_db", "cutetune.kernels.registry")
    assert loaded_after(["--help"], heavy) == []


def test_a_command_imports_no_other_commands_module():
    others = tuple(target.split(":")[0] for name, target in COMMANDS.items() if name != "show")
    assert loaded_after(["show", "--help"], others) == []
