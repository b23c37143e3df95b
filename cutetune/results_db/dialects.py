"""INSERT ... ON CONFLICT, for the backends the results database supports.

Several tuning processes may write to one PostgreSQL database at once. ON CONFLICT settles a race
for the same row inside the database; a read followed by an insert would let both processes see
no row and the slower one fail on the unique constraint.
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}

BACKENDS: tuple[str, ...] = tuple(sorted(_INSERTS))
"""The backend names (`URL.get_backend_name()`) that `Database.open` accepts."""


def insert_for(session: Session, entity: type) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into `entity` with `on_conflict_do_*`, for the session's backend."""
    return _INSERTS[session.get_bind().dialect.name](entity)
