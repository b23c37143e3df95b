"""What every command gets through `ctx.obj`: the results database it was pointed at."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Context:
    db_url: str
    # Whether db_url is cutetune's default file rather than a URL given by --db or CUTETUNE_DB.
    db_is_default: bool = False

    @classmethod
    def for_url(cls, db_url: str | None) -> Context:
        """The context of a --db value; None (neither --db nor CUTETUNE_DB) is the default
        file in the cache directory."""
        if db_url is not None:  # an empty URL is kept, to be refused as one
            return cls(db_url)
        from cutetune.settings import load_settings

        settings = load_settings()
        return cls(settings.db_url, settings.db_is_default)

    @property
    def shown_url(self) -> str:
        """The URL with its password masked."""
        from cutetune.results_db.session import shown_url

        return shown_url(self.db_url)

    def open_db(self, writable: bool = False, missing_ok: bool = False):
        """The results database: read-only (nothing created or changed) unless `writable`,
        which also checks now that it takes writes, before any work whose results could not
        be stored. Read-only, a database that does not exist is one line (reading it as empty
        would hide a mistyped path), or None where `missing_ok`."""
        from sqlalchemy.exc import DatabaseError

        from cutetune.results_db import Database
        from cutetune.results_db.session import MissingDatabaseError

        try:
            db = Database.open(self.db_url, read_only=not writable)
            if writable:
                db.check_writable()
            return db
        except MissingDatabaseError as err:
            if missing_ok:
                return None
            raise click.BadParameter(f"{err} (run cutetune tune first, or give --db)",
                                     param_hint="--db") from None
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--db") from None
        except DatabaseError as err:
            verb = "write to" if writable else "open"
            raise click.BadParameter(f"cannot {verb} the database {self.shown_url}: "
                                     f"{_first_line(err.orig)}", param_hint="--db") from None

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Queries of a command that only reads: a database without cutetune's tables (or an
        older one without the newest) is one line, not a traceback."""
        from sqlalchemy.exc import DatabaseError

        try:
            yield
        except DatabaseError as err:
            raise click.BadParameter(f"cannot read the database {self.shown_url}: "
                                     f"{_first_line(err.orig)}", param_hint="--db") from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
