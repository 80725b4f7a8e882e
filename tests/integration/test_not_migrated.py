"""A database `callgate migrate` never ran on (or ran with another callgate) is refused at
start by every process and by the producer: one line, `not_migrated`, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from callgate.core.errors import CallgateError, ErrorCode
from callgate.core.settings import Settings
from callgate.producer import AsyncProducer, Producer
from callgate.store import db, migrate, schema_version

TOOLS = "callgate.ops.lab.demo.tools:demo_registry"
COMMANDS = {
    "worker": ["worker"],
    "relayer": ["relayer"],
    "sweeper": ["sweeper"],
    "api": ["api", "--port", "1"],
    "trace": ["trace", "call_1"],
    "tools": ["tools", "--role", "support"],
}


def _env(url: str, redis_url: str, queue: str) -> dict[str, str]:
    return {
        **os.environ,
        "CALLGATE_DATABASE_URL": url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": queue,
        "CALLGATE_TOOLS": TOOLS,
    }


def _run(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callgate", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    "process", ["worker", "relayer", "sweeper", "api", "submit", "trace", "tools"]
)
def test_a_process_on_an_unmigrated_database_exits_with_one_line(
    process: str, make_database: Callable[..., str], redis_url: str, tmp_path: Path
) -> None:
    url = make_database()
    env = _env(url, redis_url, f"t-{uuid.uuid4().hex[:8]}")
    if process == "submit":
        context = tmp_path / "context.json"
        context.write_text('{"tenant_id": "t1", "user_id": "u1", "request_id": "r1"}')
        proposals = '[{"call_id": "c1", "tool_name": "get_order", "arguments": {}}]'
        done = _run(["submit", "--context", str(context), "-"], env, proposals)
    elif process == "tools":
        # Without CALLGATE_TOOLS, `tools` reads the catalogue workers published in Postgres.
        del env["CALLGATE_TOOLS"]
        done = _run(COMMANDS[process], env)
    else:
        done = _run(COMMANDS[process], env)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "not_migrated" in lines[0] and "callgate migrate" in lines[0]
    assert "revision none" in lines[0] and "Traceback" not in done.stderr


def _producer_settings(url: str, redis_url: str, queue: str) -> Settings:
    return Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue,
            "CALLGATE_TOOLS": TOOLS,
        }
    )


def test_producers_refuse_an_unmigrated_database_and_write_nothing(
    make_database: Callable[..., str], redis_url: str
) -> None:
    url = make_database()
    queue = f"t-{uuid.uuid4().hex[:8]}"
    settings = _producer_settings(url, redis_url, queue)
    for build in (Producer.from_env, AsyncProducer.from_env):
        with pytest.raises(CallgateError) as caught:
            build(settings)
        assert caught.value.code == ErrorCode.NOT_MIGRATED
    engine = db.create(url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(
                text("SELECT count(*) FROM pg_tables WHERE schemaname = 'callgate'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert tables == 0
    assert redis.Redis.from_url(redis_url).keys(f"*{queue}*") == []


def test_an_older_revision_is_refused_and_a_newer_one_told_apart(
    make_database: Callable[..., str], redis_url: str
) -> None:
    url = make_database()
    engine = db.create(url)
    head = schema_version.shipped()[-1]
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE callgate.alembic_version SET version_num = '0010'"))
        env = _env(url, redis_url, f"t-{uuid.uuid4().hex[:8]}")
        older = _run(["worker"], env)
        assert older.returncode != 0 and "Traceback" not in older.stderr
        assert older.stderr.strip().splitlines() == [
            f"callgate: not_migrated: the database is at revision 0010, this callgate needs "
            f"{head}: run callgate migrate"
        ]
        with engine.begin() as conn:
            conn.execute(text("UPDATE callgate.alembic_version SET version_num = '9999'"))
        newer = _run(["sweeper"], env)
        assert newer.returncode != 0
        assert newer.stderr.strip().splitlines() == [
            f"callgate: not_migrated: the database is at revision 9999, this callgate knows "
            f"up to {head}: upgrade callgate"
        ]
        with pytest.raises(CallgateError) as caught:
            Producer.from_env(_producer_settings(url, redis_url, "q"))
        assert caught.value.code == ErrorCode.NOT_MIGRATED
    finally:
        engine.dispose()


def test_the_shipped_head_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migrate.alembic_config(db.create("postgresql://x/y")))
    assert scripts.get_current_head() == schema_version.shipped()[-1]
    assert len(scripts.get_revisions("heads")) == 1
