"""The hot path's statements on the pooled driver connection (``db.raw_autocommit``) fail
the way SQLAlchemy's would: a lost connection is transient and retried on a fresh one, a
refused value is a ``DataError``, and the pool's connections keep opening transactions."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DataError, OperationalError

from callgate.store import db

PID = db.Statement("SELECT pg_backend_pid() AS pid, CAST(:tag AS text) AS tag")
BAD_JSON = db.Statement("SELECT CAST(:body AS jsonb) AS body")


def _terminate(admin_url: str, pid: int) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_statement_keeps_the_sql_text_and_names_its_parameters() -> None:
    s = db.Statement("SELECT :a, CAST(:b AS jsonb), x::text, 5 % 2 WHERE y = :c_d")
    assert s.driver_sql == "SELECT %(a)s, CAST(%(b)s AS jsonb), x::text, 5 %% 2 WHERE y = %(c_d)s"


def test_rows_are_named_and_each_statement_commits(engine: Engine) -> None:
    with db.raw_autocommit(engine) as conn:
        row = conn.one(PID, {"tag": "x"})
        assert row.tag == "x"
        assert conn.driver.autocommit
    # The connection went back to the pool opening transactions, as SQLAlchemy expects.
    with engine.begin() as c:
        assert c.connection.driver_connection.autocommit is False  # type: ignore[union-attr]


def test_a_lost_connection_is_transient_and_the_retry_gets_a_fresh_one(
    engine: Engine, database_url: str
) -> None:
    with db.raw_autocommit(engine) as conn:
        first = conn.one(PID, {"tag": "a"}).pid
    _terminate(database_url, first)
    attempts: list[int] = []

    def attempt() -> int:
        with db.raw_autocommit(engine) as conn:
            attempts.append(1)
            return int(conn.one(PID, {"tag": "b"}).pid)

    with pytest.raises(OperationalError) as caught:
        attempt()
    assert caught.value.connection_invalidated and db.is_transient(caught.value)
    _terminate(database_url, db.retry_transient(attempt))
    assert db.retry_transient(attempt) != first


def test_a_value_postgres_refuses_is_a_data_error_not_an_outage(engine: Engine) -> None:
    with pytest.raises(DataError) as caught, db.raw_autocommit(engine) as conn:
        conn.one(BAD_JSON, {"body": '{"a": "\\u0000"}'})
    assert not db.is_transient(caught.value)
    with engine.connect() as c:  # the connection is still good
        assert c.execute(text("SELECT 1")).scalar_one() == 1
