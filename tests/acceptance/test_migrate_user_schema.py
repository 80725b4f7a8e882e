"""`callgate migrate` touches only callgate's own schema: a user's database may already hold a
schema named ``downstream`` (the demo's name), and migrate must leave it as it was. The demo's
downstream is installed only on request (``--demo-downstream``, ``callgate demo``), and never
over a schema callgate cannot prove it created."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import text

from callgate.store import db
from tests.acceptance.conftest import callgate, scalar


def _user_downstream(url: str, *, table: str = "customers") -> None:
    engine = db.create(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA downstream"))
        conn.execute(text(f"CREATE TABLE downstream.{table} (id int PRIMARY KEY, name text)"))
        conn.execute(text(f"INSERT INTO downstream.{table} VALUES (1, 'kept')"))
    engine.dispose()


def _tables(url: str) -> list[str]:
    engine = db.create(url)
    with engine.connect() as conn:
        names = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = 'downstream' ORDER BY 1")
        ).scalars()
        found = list(names)
    engine.dispose()
    return found


def test_migrate_keeps_a_user_schema_named_downstream(
    make_database: Callable[..., str],
) -> None:
    url = make_database()
    _user_downstream(url)
    done = callgate("migrate", env={"CALLGATE_DATABASE_URL": url})
    assert done.returncode == 0, done.stderr
    engine = db.create(url)
    assert scalar(engine, "SELECT name FROM downstream.customers WHERE id = 1") == "kept"
    assert scalar(engine, "SELECT to_regclass('callgate.calls') IS NOT NULL") is True
    engine.dispose()
    assert _tables(url) == ["customers"]  # nothing of the demo's was added either


def test_the_demo_downstream_is_installed_only_when_asked(
    make_database: Callable[..., str],
) -> None:
    url = make_database()
    done = callgate("migrate", env={"CALLGATE_DATABASE_URL": url})
    assert done.returncode == 0, done.stderr
    assert _tables(url) == []
    for _ in range(2):  # asked twice: the second finds its own schema and keeps it
        done = callgate("migrate", "--demo-downstream", env={"CALLGATE_DATABASE_URL": url})
        assert done.returncode == 0, done.stderr
    assert "orders" in _tables(url) and "side_effects" in _tables(url)
    engine = db.create(url)
    assert scalar(engine, "SELECT count(*) FROM downstream.orders") == 2  # seeded once
    engine.dispose()


def test_the_demo_refuses_a_downstream_schema_it_did_not_create(
    make_database: Callable[..., str],
) -> None:
    """Even asked for, the demo's install neither drops nor fills a user's schema: with an
    ``orders`` table of the user's own it would have seeded its orders into it."""
    for table in ("customers", "orders"):
        url = make_database()
        _user_downstream(url, table=table)
        done = callgate("migrate", "--demo-downstream", env={"CALLGATE_DATABASE_URL": url})
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("callgate: invalid_configuration: "), done.stderr
        assert "Traceback" not in done.stderr
        assert "downstream" in done.stderr
        assert _tables(url) == [table]
        engine = db.create(url)
        assert scalar(engine, f"SELECT count(*) FROM downstream.{table}") == 1
        engine.dispose()
