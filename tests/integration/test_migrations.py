"""Migrations produce exactly store.schema (needs the real Postgres of tests/conftest.py)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from callgate.core.errors import ReconciliationError
from callgate.store import db, gauge_reads, migrate, reconciliation, sweeps
from callgate.store.schema import SCHEMA, metadata

pytestmark = pytest.mark.services

EXPECTED_TABLES = {
    "turns",
    "operations",
    "approvals",
    "calls",
    "outbox",
    "histories",
    "lost_turns",
    "trace_events",
    "mcp_tools",
    "tool_catalog",
    "api_keys",
    "api_idempotency",
    "console_sessions",
    "redis_epochs",
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
    assert head == "0019"
    with migrated.connect() as conn:
        assert _current_revision(conn) == "0019"
        rows = conn.execute(text(f"SELECT version_num FROM {SCHEMA}.alembic_version")).all()
    assert [tuple(r) for r in rows] == [("0019",)]


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


# --- 0012 → 0013 on a database with live history -------------------------------------------
#
# Migration 0013 replaces three state predicates by stored generated columns and rebuilds the
# partial indexes on them. Every reader of those indexes (the sweeper, the state gauges, the
# reconciliation listing) now trusts the columns: a row whose column disagrees with the
# predicate it replaced is a call the sweeper never recovers (it never ends) or one it
# recovers twice, and a write nobody reconciles. So: history written at 0012, upgraded, and
# every row and every query compared with the old predicates.

IS_OPEN = "state IN ('proposed', 'started')"
IS_AWAITING = "state = 'awaiting_approval'"
AWAITS_RECONCILIATION = (
    "(state = 'failed' AND (result #>> '{error,code}') = 'reconciliation_pending') IS TRUE"
)

_T = uuid.UUID("00000000-0000-0000-0000-0000000000aa")

# name: (state, operation, after_call, dispatched_at, approval); the operation's state decides
# what the sweeper does with the call.
_CALLS: dict[str, tuple[str, str, str | None, str | None, str | None]] = {
    # nothing heard of it yet: due (stale rule) and lost
    "proposed_new": ("proposed", "op_pending_1", None, None, None),
    # dispatched a moment ago: not due; lost (Redis emptied since)
    "proposed_fresh": ("proposed", "op_pending_2", None, "now()", None),
    # its predecessor still runs: neither
    "proposed_blocked": ("proposed", "op_pending_3", "started_live", None, None),
    # its predecessor ended: due and lost
    "proposed_after_done": ("proposed", "op_pending_4", "succeeded", None, None),
    # dispatched ten minutes ago, its owner's lease expired since: due (lease rule), not lost
    "started_expired": ("started", "op_expired", None, "now() - interval '10 minutes'", None),
    # its owner holds a live lease: neither
    "started_live": ("started", "op_live", None, "now()", None),
    # parked on a request someone decided: due (back to the gate)
    "awaiting_decided": ("awaiting_approval", "op_parked_1", None, None, "approved"),
    # parked on a pending request: neither
    "awaiting_pending": ("awaiting_approval", "op_parked_2", None, None, "pending"),
    # terminal, never dispatched, operations not held: due and lost if taken for open
    "succeeded": ("succeeded", "op_succeeded", None, None, None),
    "failed_retryable": ("failed_retryable", "op_failed", None, None, None),
    "failed_terminal": ("failed_terminal", "op_recon_1", None, None, None),
}

_ERROR = {"status": "failed_terminal", "error": {"code": "execution_failed"}}
_RECON = {"status": "failed_terminal", "error": {"code": "reconciliation_pending"}}

# name: (tenant, state, result, lease): every shape of ``result`` the code path can meet
# (a str is JSON text as it is, the rest is serialised).
_OPERATIONS: dict[str, tuple[str, str, Any, str | None]] = {
    "op_pending_1": ("t", "pending", None, None),
    "op_pending_2": ("t", "pending", None, None),
    "op_pending_3": ("t", "pending", None, None),
    "op_pending_4": ("t", "pending", None, None),
    "op_expired": ("t", "in_progress", None, "now() - interval '1 minute'"),
    "op_live": ("t", "in_progress", None, "now() + interval '1 minute'"),
    "op_parked_1": ("t", "pending", None, None),
    "op_parked_2": ("t", "pending", None, None),
    "op_succeeded": ("t", "succeeded", {"status": "succeeded", "data": {}}, None),
    "op_failed": ("t", "failed", _ERROR, None),
    "op_recon_1": ("t", "failed", _RECON, None),
    "op_recon_2": ("u", "failed", _RECON, None),
    "op_failed_no_result": ("t", "failed", None, None),
    "op_failed_json_null": ("t", "failed", "null", None),
    "op_failed_json_string": ("t", "failed", '"reconciliation_pending"', None),
    "op_failed_array": ("t", "failed", [{"error": {"code": "reconciliation_pending"}}], None),
    "op_failed_code_as_error": ("t", "failed", {"error": "reconciliation_pending"}, None),
    "op_failed_other_case": ("t", "failed", {"error": {"code": "Reconciliation_Pending"}}, None),
    "op_failed_code_number": ("t", "failed", {"error": {"code": 7}}, None),
    "op_succeeded_with_code": ("t", "succeeded", _RECON, None),
    "op_in_progress_with_code": ("t", "in_progress", _RECON, "now() + interval '1 minute'"),
}

_SWEEP = {"stale_seconds": 60, "successor_grace": 5, "job_timeout": 300, "batch": 100}
_LOST = {"refs": None, "since": None, "max_dispatches": 10, "batch": 100}


def _upgrade_to(engine: Engine, revision: str) -> None:
    """store.migrate.upgrade, stopped at ``revision``."""
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        cfg = migrate.alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def _ref(name: str) -> uuid.UUID:
    return uuid.uuid5(_T, name)


def _write_history_at_0012(conn: Connection) -> None:
    """A turn with a call in every state, written with SQL valid at revision 0012."""
    conn.execute(
        text(
            f"INSERT INTO {SCHEMA}.turns (turn_id, request_id, tenant_id, user_id, roles,"
            " submit_key, submit_hash, trace_context)"
            " VALUES (:turn, 'r', 't', 'u', ARRAY['agent'], 'k', 'h', CAST(:trace AS jsonb))"
        ),
        {
            "turn": _T,
            "trace": json.dumps({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}),
        },
    )
    for op_id, (tenant, state, result, lease) in _OPERATIONS.items():
        held = state == "in_progress"
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.operations (operation_id, tenant_id, tool_name,"
                " idempotency_key, state, owner_token, generation, lease_expires_at, result,"
                " completed_at)"
                f" VALUES (:op, :tenant, 'send_email', :key, :state, :owner, :generation,"
                f" {lease or 'NULL'}, CAST(:result AS jsonb),"
                " CASE WHEN :terminal THEN now() END)"
            ),
            {
                "op": op_id,
                "tenant": tenant,
                "key": f"key-{op_id}",
                "state": state,
                "owner": uuid.uuid4() if held else None,
                "generation": 1 if held or state in ("succeeded", "failed") else 0,
                "result": result
                if result is None or isinstance(result, str)
                else json.dumps(result),
                "terminal": state in ("succeeded", "failed"),
            },
        )
    # Predecessors first (calls.after_call is a foreign key).
    for name in sorted(_CALLS, key=lambda n: _CALLS[n][2] is not None):
        state, op_id, after, dispatched, approval = _CALLS[name]
        approval_id = None
        if approval is not None:
            approval_id = _ref(f"approval-{name}")
            conn.execute(
                text(
                    f"INSERT INTO {SCHEMA}.approvals (approval_id, operation_id, version,"
                    " tool_name, tenant_id, requested_by, intent_hash, policy_version, impact,"
                    " state, decided_by)"
                    " VALUES (:id, :op, 1, 'send_email', 't', 'u', 'ih', 'p1', '{}', :state,"
                    " CASE WHEN :state = 'pending' THEN NULL ELSE 'approver' END)"
                ),
                {"id": approval_id, "op": op_id, "state": approval},
            )
        terminal = state in ("succeeded", "failed_retryable", "failed_terminal")
        body = _RECON if op_id == "op_recon_1" else {"status": state}
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.calls (id, turn_id, call_id, position, tool_name,"
                " arguments, kind, operation_id, after_call, args_hash, approval_id, state,"
                " result, dispatches, dispatched_at, completed_at)"
                " VALUES (:id, :turn, :call_id, :position, 'send_email', '{}', 'write', :op,"
                " :after, 'ah', :approval, :state, CAST(:result AS jsonb), :dispatches,"
                f" {dispatched or 'NULL'},"
                " CASE WHEN :terminal THEN now() - interval '1 minute' END)"
            ),
            {
                "id": _ref(name),
                "turn": _T,
                "call_id": name,
                "position": list(_CALLS).index(name),
                "op": op_id,
                "after": None if after is None else _ref(after),
                "approval": approval_id,
                "state": state,
                "result": json.dumps(body) if terminal else None,
                "dispatches": 0 if dispatched is None else 1,
                "terminal": terminal,
            },
        )


def _predicates_disagree(conn: Connection) -> list[tuple[Any, ...]]:
    """Every row whose generated column is not the predicate it replaced (none expected);
    also asserts each column is seen both true and false, so the comparison is not empty."""
    calls_rows = conn.execute(
        text(
            f"SELECT call_id, state, is_open, {IS_OPEN}, is_awaiting, {IS_AWAITING}"
            f" FROM {SCHEMA}.calls"
        )
    ).all()
    ops_rows = conn.execute(
        text(
            f"SELECT operation_id, state, awaits_reconciliation, {AWAITS_RECONCILIATION}"
            f" FROM {SCHEMA}.operations"
        )
    ).all()
    assert len(calls_rows) == len(_CALLS) and len(ops_rows) == len(_OPERATIONS)
    assert {r[2] for r in calls_rows} == {r[4] for r in calls_rows} == {True, False}
    assert {r[2] for r in ops_rows} == {True, False}
    return [tuple(r) for r in calls_rows if r[2] != r[3] or r[4] != r[5]] + [
        tuple(r) for r in ops_rows if r[2] != r[3]
    ]


def _with_old_predicates(sql: str) -> str:
    """``sql`` as it read before 0013: each generated column replaced by its predicate."""
    old = re.sub(r"\b(\w+\.)?is_open\b", lambda m: f"{m[1] or ''}{IS_OPEN}", sql)
    old = re.sub(r"\b(\w+\.)?is_awaiting\b", lambda m: f"{m[1] or ''}{IS_AWAITING}", old)
    old = re.sub(
        r"\b(\w+\.)?awaits_reconciliation\b",
        lambda m: (
            f"({m[1] or ''}state = 'failed' AND"
            f" ({m[1] or ''}result #>> '{{error,code}}') = 'reconciliation_pending')"
        ),
        old,
    )
    assert old != sql
    return old


def _ids(conn: Connection, sql: str, params: dict[str, Any]) -> set[str]:
    names = {_ref(n): n for n in _CALLS}
    return {names[row.id] for row in conn.execute(text(sql), params)}


def _invalid_indexes(conn: Connection) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in conn.execute(
            text(
                "SELECT i.indexrelid::regclass::text, i.indisvalid, i.indisready, i.indislive"
                " FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid"
                " JOIN pg_namespace n ON n.oid = t.relnamespace"
                " WHERE n.nspname = :schema AND t.relname IN ('calls', 'operations')"
                "   AND NOT (i.indisvalid AND i.indisready AND i.indislive)"
            ),
            {"schema": SCHEMA},
        )
    ]


def _through_index(conn: Connection, table: str, column: str, index: str) -> set[str]:
    """The rows the partial index ``index`` holds, read through it (no sequential scan)."""
    key = "call_id" if table == "calls" else "operation_id"
    sql = f"SELECT {key} FROM {SCHEMA}.{table} WHERE {column}"
    with conn.begin_nested():
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN {sql}")))
        assert index in plan, plan
        return set(conn.execute(text(sql)).scalars())


def test_upgrade_from_0012_keeps_every_call_and_operation_where_it_was(
    new_engine: Callable[[], Engine],
) -> None:
    engine = new_engine()
    _upgrade_to(engine, "0012")
    with engine.begin() as conn:
        assert _current_revision(conn) == "0012"
        _write_history_at_0012(conn)
        open_sql = f"SELECT call_id FROM {SCHEMA}.calls WHERE {IS_OPEN}"
        before = {
            "open": set(conn.execute(text(open_sql)).scalars()),
            "due": _ids(conn, _with_old_predicates(sweeps.DUE_SQL), _SWEEP),
            "lost": _ids(conn, _with_old_predicates(sweeps.LOST_SQL), _LOST),
        }
        # The odd shapes of result are really there (JSON null, not SQL NULL; a scalar).
        shapes = conn.execute(
            text(
                f"SELECT operation_id, jsonb_typeof(result) FROM {SCHEMA}.operations"
                " WHERE operation_id IN ('op_failed_json_null', 'op_failed_json_string',"
                " 'op_failed_no_result')"
            )
        ).all()
        assert sorted(tuple(r) for r in shapes) == [
            ("op_failed_json_null", "null"),
            ("op_failed_json_string", "string"),
            ("op_failed_no_result", None),
        ]

    migrate.upgrade(engine)

    with engine.begin() as conn:
        assert _current_revision(conn) == "0019"
        assert conn.execute(text(f"SELECT count(*) FROM {SCHEMA}.calls")).scalar() == len(_CALLS)
        assert _predicates_disagree(conn) == []
        assert _invalid_indexes(conn) == []

        # The indexes the rewrite built hold exactly the rows of the old predicates.
        assert (
            _through_index(conn, "calls", "is_open", "calls_open")
            == before["open"]
            == {
                "proposed_new",
                "proposed_fresh",
                "proposed_blocked",
                "proposed_after_done",
                "started_expired",
                "started_live",
            }
        )
        assert _through_index(conn, "calls", "is_awaiting", "calls_awaiting") == {
            "awaiting_decided",
            "awaiting_pending",
        }
        assert _through_index(
            conn, "operations", "awaits_reconciliation", "operations_reconciliation"
        ) == {"op_recon_1", "op_recon_2"}

        # The sweeper finds the calls it found before the upgrade, and only those.
        due = _ids(conn, sweeps.DUE_SQL, _SWEEP)
        assert (
            due
            == before["due"]
            == {
                "proposed_new",
                "proposed_after_done",
                "started_expired",
                "awaiting_decided",
            }
        )
        lost = _ids(conn, sweeps.LOST_SQL, _LOST)
        assert lost == before["lost"] == {"proposed_new", "proposed_fresh", "proposed_after_done"}

        # The gauges count what the old predicates count (now() is the transaction's: equal).
        window = {"window": 0}
        by_state = sorted(tuple(r) for r in conn.execute(text(gauge_reads.CALLS_SQL), window))
        old_by_state = sorted(
            tuple(r)
            for r in conn.execute(text(_with_old_predicates(gauge_reads.CALLS_SQL)), window)
        )
        assert by_state == old_by_state
        assert {r[0]: r[1] + r[2] + r[3] + r[4] + r[5] for r in by_state} == {
            "proposed": 4,
            "started": 2,
            "awaiting_approval": 2,
        }
        recon = tuple(conn.execute(text(gauge_reads.RECONCILIATION_SQL)).one())
        old_recon = conn.execute(text(_with_old_predicates(gauge_reads.RECONCILIATION_SQL))).one()
        assert recon == tuple(old_recon) and recon[0] == 2

        listing = {"tenant": None, "operation_id": None, "limit": 100}
        old_listing = _with_old_predicates(reconciliation.PENDING_SQL)
        assert [tuple(r) for r in conn.execute(text(reconciliation.PENDING_SQL), listing)] == [
            tuple(r) for r in conn.execute(text(old_listing), listing)
        ]

    assert [p["operation_id"] for p in reconciliation.pending(engine)] == [
        "op_recon_1",
        "op_recon_2",
    ]
    assert [p["operation_id"] for p in reconciliation.pending(engine, tenant="u")] == ["op_recon_2"]


def test_generated_columns_follow_state_changes_after_upgrade_from_0012(
    new_engine: Callable[[], Engine],
) -> None:
    engine = new_engine()
    _upgrade_to(engine, "0012")
    with engine.begin() as conn:
        _write_history_at_0012(conn)
    migrate.upgrade(engine)

    def columns(call: str) -> tuple[bool, bool]:
        with engine.connect() as conn:
            row = conn.execute(
                text(f"SELECT is_open, is_awaiting FROM {SCHEMA}.calls WHERE id = :id"),
                {"id": _ref(call)},
            ).one()
        return row.is_open, row.is_awaiting

    with engine.begin() as conn:
        # proposed → started (a reservation): still open
        conn.execute(
            text(f"UPDATE {SCHEMA}.calls SET state = 'started' WHERE id = :id"),
            {"id": _ref("proposed_new")},
        )
        # started → succeeded (a completion): closed
        conn.execute(
            text(
                f"UPDATE {SCHEMA}.calls SET state = 'succeeded', completed_at = now(),"
                """ result = '{"status": "succeeded"}' WHERE id = :id"""
            ),
            {"id": _ref("started_expired")},
        )
        # awaiting_approval → proposed: the sweeper's own mark of a decided request
        marked = conn.execute(text(sweeps.MARK_SQL), {"refs": [_ref("awaiting_decided")]})
        assert marked.rowcount == 1
    assert columns("proposed_new") == (True, False)
    assert columns("started_expired") == (False, False)
    assert columns("awaiting_decided") == (True, False)

    with engine.begin() as conn:
        assert _predicates_disagree(conn) == []
        assert _through_index(conn, "calls", "is_open", "calls_open") == {
            "proposed_new",
            "proposed_fresh",
            "proposed_blocked",
            "proposed_after_done",
            "started_live",
            "awaiting_decided",
        }
        assert _through_index(conn, "calls", "is_awaiting", "calls_awaiting") == {
            "awaiting_pending"
        }
        # The completed call left the sweeper's view; the unparked one was just dispatched
        # (MARK_SQL), so it is open but not due.
        due = _ids(conn, sweeps.DUE_SQL, _SWEEP)
        assert due == _ids(conn, _with_old_predicates(sweeps.DUE_SQL), _SWEEP)
        assert due == {"proposed_new", "proposed_after_done"}

    # An operation ends reconciliation_pending, then a person settles it, once.
    with engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE {SCHEMA}.operations SET state = 'failed', completed_at = now(),"
                " result = CAST(:body AS jsonb) WHERE operation_id = 'op_pending_4'"
            ),
            {"body": json.dumps(_RECON)},
        )
        assert _predicates_disagree(conn) == []
        assert _through_index(
            conn, "operations", "awaits_reconciliation", "operations_reconciliation"
        ) == {"op_recon_1", "op_recon_2", "op_pending_4"}
    assert "op_pending_4" in {p["operation_id"] for p in reconciliation.pending(engine)}

    reconciliation.resolve(engine, "op_pending_4", outcome="failed", by="person")
    with pytest.raises(ReconciliationError):
        reconciliation.resolve(engine, "op_pending_4", outcome="succeeded", by="other")

    with engine.begin() as conn:
        row = conn.execute(
            text(
                f"SELECT state, result #>> '{{error,code}}' AS code, awaits_reconciliation"
                f" FROM {SCHEMA}.operations WHERE operation_id = 'op_pending_4'"
            )
        ).one()
        # Still 'failed': only the result's code changed, and the column followed it.
        assert tuple(row) == ("failed", "execution_failed", False)
        settled = conn.execute(
            text(
                f"SELECT count(*) FROM {SCHEMA}.trace_events"
                " WHERE operation_id = 'op_pending_4' AND event = 'reconciled'"
            )
        ).scalar()
        assert settled == 1
        assert _predicates_disagree(conn) == []
        assert _through_index(
            conn, "operations", "awaits_reconciliation", "operations_reconciliation"
        ) == {"op_recon_1", "op_recon_2"}
    assert "op_pending_4" not in {p["operation_id"] for p in reconciliation.pending(engine)}
