"""Migrations produce exactly store.schema (needs the real Postgres of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from callgate.store import db, migrate
from callgate.store.schema import SCHEMA, metadata

pytestmark = pytest.mark.services

EXPECTED_TABLES = {
    "turns",
    "operations",
    "approvals",
    "calls",
    "outbox",
    "trace_events",
    "mcp_tools",
    "tool_catalog",
    "api_keys",
    "api_idempotency",
    "console_sessions",
}

_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = :schema AND c.relkind = 'r' AND c.relname <> 'alembic_version'
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attname
"""

_INFO_COLUMNS = """
SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity,
       identity_generation
FROM information_schema.columns
WHERE table_schema = :schema AND table_name <> 'alembic_version'
ORDER BY table_name, column_name
"""

_CONSTRAINTS = """
SELECT c.relname, con.conname, con.contype, pg_get_constraintdef(con.oid)
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relname <> 'alembic_version'
ORDER BY c.relname, con.conname
"""

_INDEXES = """
SELECT tablename, indexname, indexdef
FROM pg_indexes
WHERE schemaname = :schema AND tablename <> 'alembic_version'
ORDER BY tablename, indexname
"""

_SEQUENCES = """
SELECT sequence_name, data_type, start_value, increment
FROM information_schema.sequences
WHERE sequence_schema = :schema
ORDER BY sequence_name
"""


def catalog(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """The callgate schema as Postgres describes it, alembic's own table left out."""
    queries = {
        "columns": _COLUMNS,
        "info_columns": _INFO_COLUMNS,
        "constraints": _CONSTRAINTS,
        "indexes": _INDEXES,
        "sequences": _SEQUENCES,
    }
    with engine.connect() as conn:
        return {
            name: [tuple(row) for row in conn.execute(text(sql), {"schema": SCHEMA})]
            for name, sql in queries.items()
        }


@pytest.fixture
def new_engine(make_database: Callable[[], str]) -> Iterator[Callable[[], Engine]]:
    engines: list[Engine] = []

    def make() -> Engine:
        engine = db.create(make_database())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture
def migrated(new_engine: Callable[[], Engine]) -> Engine:
    engine = new_engine()
    migrate.upgrade(engine)
    return engine


@pytest.fixture
def created(new_engine: Callable[[], Engine]) -> Engine:
    engine = new_engine()
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        metadata.create_all(conn)
    return engine


def test_migrated_catalog_equals_create_all(migrated: Engine, created: Engine) -> None:
    from_migrations = catalog(migrated)
    from_metadata = catalog(created)

    # Not vacuous: the schema is really there, with what store.schema declares.
    assert {row[0] for row in from_migrations["columns"]} == EXPECTED_TABLES
    assert ("calls", "calls_open") in {row[:2] for row in from_migrations["indexes"]}
    assert ("calls", "calls_turn_call_id", "u") in {
        row[:3] for row in from_migrations["constraints"]
    }
    assert ("operations", "operations_owner_iff_in_progress", "c") in {
        row[:3] for row in from_migrations["constraints"]
    }

    for part in from_migrations:
        assert from_migrations[part] == from_metadata[part], part


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "schema":
        return name == SCHEMA
    if type_ == "table":
        return name != "alembic_version"
    return True


def _autogenerate_diff(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": _include_name,
                "version_table_schema": SCHEMA,
            },
        )
        return list(compare_metadata(context, metadata))


def test_autogenerate_finds_no_difference(migrated: Engine) -> None:
    assert _autogenerate_diff(migrated) == []


def test_comparisons_are_not_vacuous(migrated: Engine, created: Engine) -> None:
    """Both checks above see a drifted schema: the filters do not hide callgate."""
    with migrated.begin() as conn:
        conn.execute(text(f"DROP INDEX {SCHEMA}.calls_after_call"))
        conn.execute(text(f"ALTER TABLE {SCHEMA}.turns ADD COLUMN extra text"))
    diff = _autogenerate_diff(migrated)
    kinds = sorted(d[0] if isinstance(d, tuple) else d[0][0] for d in diff)
    assert kinds == ["add_index", "remove_column"]
    drifted, declared = catalog(migrated), catalog(created)
    assert drifted["indexes"] != declared["indexes"]
    assert drifted["columns"] != declared["columns"]


def _current_revision(conn: Connection) -> str | None:
    context = MigrationContext.configure(conn, opts={"version_table_schema": SCHEMA})
    return context.get_current_revision()


def test_upgrade_twice_is_a_no_op_at_head(migrated: Engine) -> None:
    before = catalog(migrated)
    migrate.upgrade(migrated)
    assert catalog(migrated) == before

    head = ScriptDirectory.from_config(migrate.alembic_config(migrated)).get_current_head()
    assert head == "0013"
    with migrated.connect() as conn:
        assert _current_revision(conn) == "0013"
        rows = conn.execute(text(f"SELECT version_num FROM {SCHEMA}.alembic_version")).all()
    assert [tuple(r) for r in rows] == [("0013",)]


def test_upgrade_keeps_data(migrated: Engine) -> None:
    with migrated.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.operations (operation_id, tenant_id, tool_name,"
                " idempotency_key) VALUES ('op-1', 't', 'send_email', 'k-1')"
            )
        )
    migrate.upgrade(migrated)
    with migrated.connect() as conn:
        row = conn.execute(
            text(f"SELECT state, generation FROM {SCHEMA}.operations WHERE operation_id = 'op-1'")
        ).one()
    assert tuple(row) == ("pending", 0)
