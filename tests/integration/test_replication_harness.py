"""The replication harness models what a failover does: an asynchronous replica loses what
it had not received, a synchronous one loses no commit, and the promoted server is the same
cluster on a new timeline, on the URL clients already have."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest

from callgate.ops.lab.replicated import Replicated

pytestmark = pytest.mark.services


@pytest.fixture
def pg() -> Iterator[Replicated]:
    with Replicated() as replicated:
        replicated.replicate()
        _execute(replicated.url, "CREATE TABLE t (id int PRIMARY KEY)")
        yield replicated


def test_a_failover_loses_what_the_replica_had_not_received(pg: Replicated) -> None:
    cluster = _one(pg.url, "SELECT system_identifier FROM pg_control_system()")
    assert _timeline(pg.url) == 1
    _execute(pg.url, "INSERT INTO t VALUES (1)")
    pg.caught_up()
    pg.freeze()
    _execute(pg.url, "INSERT INTO t VALUES (2)")
    assert _ids(pg.url) == [1, 2]  # committed, on the primary only

    pg.fail_over()

    assert _ids(pg.url) == [1]
    assert _timeline(pg.url) == 2
    assert _one(pg.url, "SELECT system_identifier FROM pg_control_system()") == cluster
    _execute(pg.url, "INSERT INTO t VALUES (2)")  # the promoted server takes writes


def test_a_synchronous_replica_has_every_commit(pg: Replicated) -> None:
    pg.synchronous(True)
    _execute(pg.url, "INSERT INTO t VALUES (1)")
    pg.freeze()  # no caught_up(): the commit returned, so the replica has flushed it

    pg.fail_over()

    assert _ids(pg.url) == [1]
    assert _timeline(pg.url) == 2


def _execute(url: str, sql: LiteralString) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


def _one(url: str, sql: LiteralString) -> Any:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _ids(url: str) -> list[int]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id")]


def _timeline(url: str) -> int:
    walfile = _one(url, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    return int(walfile[:8], 16)
