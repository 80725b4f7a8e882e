"""The state of BFCL's backend instances between calls, in the scratch database.

Each call runs in some worker process, so an entry's instance of a class cannot live in
memory: it is a row (run, entry, class) holding the pickled instance. A handler takes the
row under a lock (``FOR UPDATE`` for a write, ``FOR SHARE`` for a read), runs the method and,
for a write, stores the instance back in the same transaction: parallel calls of one entry
serialize on the row, and a write that did not commit changed nothing. Every handler run is
a row of ``runs`` (``wrote`` for the writes that stored their instance), written in that
transaction too: effects are counted from these rows, never from what a handler returned.

The pickles are written by this module's own callers (the driver's seed, the handlers) into
a scratch database of the run, and read back only from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import Engine, text

SCHEMA = "eval_bfcl"

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.instances (
    run text NOT NULL,
    entry text NOT NULL,
    class_name text NOT NULL,
    state bytea NOT NULL,
    PRIMARY KEY (run, entry, class_name)
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.runs (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    entry text NOT NULL,
    class_name text NOT NULL,
    tool text NOT NULL,
    operation_id text NOT NULL,
    wrote boolean NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS runs_op ON {SCHEMA}.runs (operation_id);
"""


@dataclass(frozen=True)
class Key:
    run: str
    entry: str
    class_name: str

    def params(self) -> dict[str, str]:
        return {"run": self.run, "entry": self.entry, "class_name": self.class_name}


class NoInstance(LookupError):
    """The entry has no instance of the class: it does not involve it."""


def install(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(_DDL))


def seed(engine: Engine, key: Key, state: bytes) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.instances (run, entry, class_name, state) "
                "VALUES (:run, :entry, :class_name, :state)"
            ),
            {**key.params(), "state": state},
        )


def run_call(
    engine: Engine,
    key: Key,
    tool: str,
    operation_id: str,
    write: bool,
    step: Callable[[bytes], tuple[str, bytes]],
) -> str:
    """``step(state) -> (response, new state)`` on the locked row; a write stores the new
    state. Raises ``NoInstance`` when the row does not exist."""
    lock = "FOR UPDATE" if write else "FOR SHARE"
    with engine.begin() as conn:
        state = conn.execute(
            text(
                f"SELECT state FROM {SCHEMA}.instances WHERE run = :run AND entry = :entry "
                f"AND class_name = :class_name {lock}"
            ),
            key.params(),
        ).scalar_one_or_none()
        if state is None:
            raise NoInstance(f"entry {key.entry} has no {key.class_name} instance")
        response, after = step(bytes(state))
        if write:
            conn.execute(
                text(
                    f"UPDATE {SCHEMA}.instances SET state = :state WHERE run = :run "
                    "AND entry = :entry AND class_name = :class_name"
                ),
                {**key.params(), "state": after},
            )
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.runs (run, entry, class_name, tool, operation_id, wrote) "
                "VALUES (:run, :entry, :class_name, :tool, :op, :wrote)"
            ),
            {**key.params(), "tool": tool, "op": operation_id, "wrote": write},
        )
    return response


def states(engine: Engine, run: str, entry: str) -> dict[str, bytes]:
    """class → the pickled instance as the workers left it."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT class_name, state FROM {SCHEMA}.instances "
                "WHERE run = :run AND entry = :entry"
            ),
            {"run": run, "entry": entry},
        )
        return {str(name): bytes(state) for name, state in rows}


def counts(engine: Engine, operation_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """operation id → (handler runs, writes stored), from the ``runs`` rows."""
    ops = list(operation_ids)
    found = dict.fromkeys(ops, (0, 0))
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT operation_id, count(*), count(*) FILTER (WHERE wrote) "
                f"FROM {SCHEMA}.runs WHERE operation_id = ANY(:ops) GROUP BY operation_id"
            ),
            {"ops": ops},
        )
        for op, runs, wrote in rows:
            found[str(op)] = (int(runs), int(wrote))
    return found
