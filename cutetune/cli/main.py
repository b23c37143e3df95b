"""The `cutetune` command line: the group, its options, and where each command lives.

Each command is a module of this package, imported only when it runs or its help is shown;
`cutetune --help` imports them all for their one-line summaries, so a command module imports
nothing heavy (torch, CuTeDSL, pandas, SQLAlchemy) outside its function.
"""

from __future__ import annotations

import click

from cutetune.cli.lazy import LazyGroup
from cutetune.cli.options import CATALOG_HELP, db_option
from cutetune.version import __version__

COMMANDS = {
    "plan": "cutetune.cli.plan:plan",
    "tune": "cutetune.cli.tune:tune",
    "calibrate": "cutetune.cli.calibrate:calibrate",
    "bench": "cutetune.cli.bench:bench",
    "show": "cutetune.cli.show:show",
    "export": "cutetune.cli.export:export",
    "import": "cutetune.cli.import_:import_",
    "report": "cutetune.cli.report:report",
    "cache": "cutetune.cli.cache:cache",
    "db": "cutetune.cli.db:db",
}


class CutetuneGroup(LazyGroup):
    """The command group; a problem that no point of its kernel's space can serve (an MLP
    width no vector divides, say) is the user's input, so it ends as one line too."""

    def invoke(self, ctx: click.Context):
        from cutetune.spaces.space import EmptySpaceError

        try:
            return super().invoke(ctx)
        except EmptySpaceError as err:
            raise click.UsageError(str(err)) from None


@click.group(cls=CutetuneGroup, lazy_subcommands=COMMANDS, epilog=CATALOG_HELP)
@click.version_option(version=__version__, prog_name="cutetune")
@db_option
def cli() -> None:
    """Autotune CuTeDSL inference kernels and serve the winners."""


def main() -> None:
    cli(prog_name="cutetune")


if __name__ == "__main__":
    main()
