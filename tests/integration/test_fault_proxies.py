"""The fault injector's own proxies, against the real Postgres and Redis: each fault does
what it says (the server did or did not execute; the client saw an error or a delay)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
import redis

from tests.faults.core import CUT, LOSE_REPLY, REFUSE, STALL
from tests.faults.pgproxy import PgProxy, sql_fault
from tests.faults.redisproxy import RedisProxy, command_fault, script_fault


@pytest.fixture
def table(make_database: Callable[..., str]) -> str:
    url = make_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE marks (id serial PRIMARY KEY, note text)")
    return url


def _count(url: str, note: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM marks WHERE note = %s", (note,)).fetchone()
        assert row is not None
        return int(row[0])


def test_a_commit_whose_reply_is_lost_is_committed(pg_proxy: PgProxy, table: str) -> None:
    fault = pg_proxy.arm(sql_fault(LOSE_REPLY, r"^\s*COMMIT"))
    with psycopg.connect(pg_proxy.url(table)) as conn:
        conn.execute("INSERT INTO marks (note) VALUES ('a')")
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    assert fault.fired.is_set()
    assert _count(table, "a") == 1  # the client saw an error; the row IS in the table


def test_a_statement_cut_before_send_never_runs(pg_proxy: PgProxy, table: str) -> None:
    pg_proxy.arm(sql_fault(CUT, r"INSERT INTO marks"))
    with (
        psycopg.connect(pg_proxy.url(table), autocommit=True) as conn,
        pytest.raises(psycopg.OperationalError),
    ):
        conn.execute("INSERT INTO marks (note) VALUES ('b')")
    assert _count(table, "b") == 0


def test_a_prepared_statement_is_matched_on_its_sql_when_executed_by_name(
    pg_proxy: PgProxy, table: str
) -> None:
    # prepare=True: the first run sends Parse (named) then Bind/Execute; the second only
    # Bind/Execute of the name. The fault must still see the SQL on the second.
    fault = pg_proxy.arm(sql_fault(LOSE_REPLY, r"INSERT INTO marks", nth=2))
    with psycopg.connect(pg_proxy.url(table), autocommit=True) as conn:
        conn.execute("INSERT INTO marks (note) VALUES (%s)", ("c",), prepare=True)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO marks (note) VALUES (%s)", ("c",), prepare=True)
    assert fault.hit is not None and fault.hit.phase == "execute"
    assert _count(table, "c") == 2


def test_only_the_named_application_is_hit(pg_proxy: PgProxy, table: str) -> None:
    pg_proxy.arm(sql_fault(CUT, r"INSERT INTO marks", application="victim"))
    url = pg_proxy.url(table)
    with psycopg.connect(url, autocommit=True, application_name="bystander") as conn:
        conn.execute("INSERT INTO marks (note) VALUES ('d')")
    with (
        psycopg.connect(url, autocommit=True, application_name="victim") as conn,
        pytest.raises(psycopg.OperationalError),
    ):
        conn.execute("INSERT INTO marks (note) VALUES ('d')")
    assert _count(table, "d") == 1


def test_refused_connections_come_back_after_the_window(pg_proxy: PgProxy, table: str) -> None:
    fault = pg_proxy.arm(sql_fault(REFUSE, r"INSERT INTO marks", seconds=1.5))
    url = pg_proxy.url(table)
    with (
        psycopg.connect(url, autocommit=True) as conn,
        pytest.raises(psycopg.OperationalError),
    ):
        conn.execute("INSERT INTO marks (note) VALUES ('e')")
    assert fault.wait(5)
    with pytest.raises(psycopg.OperationalError, match=r"(?i)refused"):
        psycopg.connect(url, connect_timeout=2)
    deadline = time.monotonic() + 10
    while True:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("INSERT INTO marks (note) VALUES ('e')")
            break
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "the proxy never listened again"
            time.sleep(0.1)
    assert _count(table, "e") == 1


def test_a_stalled_round_trip_arrives_late(pg_proxy: PgProxy, table: str) -> None:
    pg_proxy.arm(sql_fault(STALL, r"INSERT INTO marks", seconds=1.0, stall_reply=True))
    with psycopg.connect(pg_proxy.url(table), autocommit=True) as conn:
        started = time.monotonic()
        conn.execute("INSERT INTO marks (note) VALUES ('f')")
        assert time.monotonic() - started >= 1.0
        # The connection is still usable after a stall.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _count(table, "f") == 1


# --- Redis --------------------------------------------------------------------------------


@pytest.fixture
def key() -> str:
    return f"faults-test:{uuid.uuid4().hex}"


def test_redis_lost_reply_after_the_command_applied(
    redis_proxy: RedisProxy, redis_url: str, key: str
) -> None:
    direct = redis.Redis.from_url(redis_url)
    client = redis.Redis.from_url(redis_proxy.url(redis_url), retry_on_error=[])
    client.ping()
    redis_proxy.arm(command_fault(LOSE_REPLY, "RPUSH", args=f"^{key}"))
    with pytest.raises(redis.exceptions.ConnectionError):
        client.rpush(key, "x")
    assert direct.llen(key) == 1
    direct.delete(key)


def test_redis_pipeline_cut_before_send_applies_nothing(
    redis_proxy: RedisProxy, redis_url: str, key: str
) -> None:
    direct = redis.Redis.from_url(redis_url)
    client = redis.Redis.from_url(redis_proxy.url(redis_url), retry_on_error=[])
    client.ping()
    redis_proxy.arm(command_fault(CUT, "XADD"))
    pipe = client.pipeline(transaction=False)
    pipe.set(f"{key}:a", 1)
    pipe.xadd(f"{key}:s", {"f": "v"})
    pipe.set(f"{key}:b", 1)
    with pytest.raises(redis.exceptions.ConnectionError):
        pipe.execute()
    assert direct.exists(f"{key}:a", f"{key}:s", f"{key}:b") == 0


def test_redis_pipeline_replies_are_counted(
    redis_proxy: RedisProxy, redis_url: str, key: str
) -> None:
    # A lost reply of the second of two pipelines: the first's replies still arrive whole.
    client = redis.Redis.from_url(redis_proxy.url(redis_url), retry_on_error=[])
    pipe = client.pipeline(transaction=True)
    pipe.rpush(key, "a", "b")
    pipe.lrange(key, 0, -1)
    pipe.hset(f"{key}:h", mapping={"x": "1", "y": "2"})
    pipe.hgetall(f"{key}:h")
    assert pipe.execute() == [2, [b"a", b"b"], 2, {b"x": b"1", b"y": b"2"}]
    redis_proxy.arm(command_fault(LOSE_REPLY, "HSET"))
    with pytest.raises(redis.exceptions.ConnectionError):
        client.hset(f"{key}:h", "z", "3")
    assert client.hget(f"{key}:h", "z") == b"3"  # reconnected; it applied
    client.delete(key, f"{key}:h")


def test_redis_script_lost_reply(redis_proxy: RedisProxy, redis_url: str, key: str) -> None:
    lua = "return redis.call('INCR', KEYS[1])"
    client = redis.Redis.from_url(redis_proxy.url(redis_url), retry_on_error=[])
    script = client.register_script(lua)
    assert script(keys=[key]) == 1
    redis_proxy.arm(script_fault(LOSE_REPLY, lua))
    with pytest.raises(redis.exceptions.ConnectionError):
        script(keys=[key])
    assert int(client.get(key) or 0) == 2
    client.delete(key)


def test_redis_refuse_and_stall(redis_proxy: RedisProxy, redis_url: str, key: str) -> None:
    url = redis_proxy.url(redis_url)
    client = redis.Redis.from_url(url, retry_on_error=[])
    redis_proxy.arm(command_fault(REFUSE, "SET", seconds=1.0))
    with pytest.raises(redis.exceptions.ConnectionError):
        client.set(key, 1)
    with pytest.raises(redis.exceptions.ConnectionError, match=r"(?i)refused"):
        redis.Redis.from_url(url, retry_on_error=[]).ping()
    time.sleep(1.3)
    redis_proxy.arm(command_fault(STALL, "SET", seconds=0.8))
    started = time.monotonic()
    assert client.set(key, 2)
    assert time.monotonic() - started >= 0.8
    assert client.get(key) == b"2"
    client.delete(key)


def test_a_fault_can_target_bound_values(pg_proxy: PgProxy, table: str) -> None:
    fault = pg_proxy.arm(sql_fault(CUT, r"INSERT INTO marks", params=r"^target$"))
    with psycopg.connect(pg_proxy.url(table), autocommit=True) as conn:
        conn.execute("INSERT INTO marks (note) VALUES (%s)", ("other",), prepare=True)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO marks (note) VALUES (%s)", ("target",), prepare=True)
    assert fault.hit is not None and fault.hit.params == "target"
    assert _count(table, "other") == 1 and _count(table, "target") == 0
