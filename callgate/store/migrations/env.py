"""Alembic environment: runs on the connection store.migrate hands it."""

from __future__ import annotations

from alembic import context

from callgate.store.schema import SCHEMA, metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table_schema=SCHEMA,
    include_schemas=True,
)
with context.begin_transaction():
    context.run_migrations()
