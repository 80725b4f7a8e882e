"""The ledger the suites' test doubles write and the runner counts: one row per handler run
and one per downstream effect, by operation id, in the scratch database's ``eval_ledger``
schema. The counts come from these rows, never from what a handler returned."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.store import db

SCHEMA = "eval_ledger"

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.runs (
    id bigserial PRIMARY KEY,
    tool text NOT NULL,
    operation_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.effects (
    id bigserial PRIMARY KEY,
    tool text NOT NULL,
    operation_id text NOT NULL,
    item text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS runs_op ON {SCHEMA}.runs (operation_id);
CREATE INDEX IF NOT EXISTS effects_op ON {SCHEMA}.effects (operation_id);
"""


def install(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(_DDL))


def reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {SCHEMA}.runs, {SCHEMA}.effects"))


def counts(engine: Engine, operation_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """operation id → (handler runs, effects)."""
    ops = list(operation_ids)
    found = {op: (0, 0) for op in ops}
    with engine.connect() as conn:
        for table, index in (("runs", 0), ("effects", 1)):
            rows = conn.execute(
                text(
                    f"SELECT operation_id, count(*) FROM {SCHEMA}.{table} "
                    "WHERE operation_id = ANY(:ops) GROUP BY operation_id"
                ),
                {"ops": ops},
            )
            for op, n in rows:
                pair = list(found[op])
                pair[index] = int(n)
                found[op] = (pair[0], pair[1])
    return found


@cache
def engine() -> Engine:
    """The doubles' own engine in a worker process (they commit apart from the worker)."""
    return db.create(
        Settings.from_env().require_database(),
        pool_size=4,
        application_name="callgate-eval-doubles",
    )


def record_run(tool: str, operation_id: str) -> None:
    with engine().begin() as conn:
        conn.execute(
            text(f"INSERT INTO {SCHEMA}.runs (tool, operation_id) VALUES (:t, :o)"),
            {"t": tool, "o": operation_id},
        )
