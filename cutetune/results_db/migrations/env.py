"""Alembic's environment: the migrations run on the connection migrate.py passes in, inside its
transaction, with the tables' naming convention and cutetune's own version table."""

from alembic import context

from cutetune.results_db.schema import Base
from cutetune.results_db.schema_version import VERSION_TABLE

context.configure(connection=context.config.attributes["connection"],
                  target_metadata=Base.metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
