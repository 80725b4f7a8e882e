"""The pure parts of ``callgate bench costs --statements``: naming a statement from the text
pg_stat_statements keeps, the per-call arithmetic, the index-entry formula. No services."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest

from callgate.core.errors import CallgateError
from callgate.ops.lab import replicated
from callgate.ops.lab.bench import statements
from callgate.ops.lab.bench.statements import Reading
from callgate.store import completions, db, endings, outbox, reservations, turns


def as_postgres_keeps_it(sql: str) -> str:
    """The text pg_stat_statements shows for a callgate statement: psycopg numbers the
    parameters ($1, $2, ...) and the server replaces each constant by the next number."""
    n = 0

    def number(_: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    sent = db.Statement(sql).driver_sql
    return re.sub(r"%\(\w+\)s|'(?:[^']|'')*'|(?<![\w$])\d+\b", number, sent).replace("%%", "%")


@pytest.mark.parametrize(
    ("sql", "name"),
    [
        (endings.END_READS_SQL, "endings.END_READS"),
        (reservations.RESERVE_SQL, "reservations.RESERVE"),
        (completions.COMPLETE_SQL, "completions.COMPLETE"),
        (completions.COMPLETE_MANY_SQL, "completions.COMPLETE_MANY"),
        (outbox.MARK_SQL, "outbox.MARK"),
        (turns.INSERT_OPERATIONS_SQL, "turns.INSERT_OPERATIONS"),
    ],
)
def test_a_statement_as_postgres_keeps_it_is_named_by_its_constant(sql: str, name: str) -> None:
    kept = as_postgres_keeps_it(sql)
    assert kept != sql  # the test's own premise: the texts differ
    assert statements.label(kept, statements.named()) == name


def test_parameters_and_constants_tokenize_alike_but_casts_do_not() -> None:
    assert statements.tokens("SELECT * FROM t WHERE a = :a AND b = 'x' LIMIT 5") == (
        statements.tokens("select *  from t where a = $1 and b = $2 limit $3")
    )
    assert "::" in statements.tokens("SELECT '{}'::text[]")
    assert statements.tokens("SELECT :a") != statements.tokens("SELECT ::a")


def test_a_statement_written_another_way_is_named_as_near() -> None:
    near = as_postgres_keeps_it(endings.END_READS_SQL).replace("ORDER BY c.id", "")
    assert statements.label(near, statements.named()) == "endings.END_READS (~)"


def test_unnamed_statements_get_their_first_words() -> None:
    names = statements.named()
    assert statements.label("commit", names) == "COMMIT"
    assert statements.label("BEGIN ISOLATION LEVEL READ COMMITTED", names) == (
        "BEGIN ISOLATION LEVEL READ COMMITTED"
    )
    long = "INSERT INTO downstream.requests (service, idempotency_key, fencing_token) VALUES ($1)"
    assert (
        statements.label(long, names)
        == "INSERT INTO downstream.requests (service, idempotency_key, …"
    )


def test_constants_come_from_sql_strings_and_statements_first_public_name() -> None:
    module = types.ModuleType("pkg.things")
    module.__dict__.update(
        FETCH_SQL="SELECT a FROM t WHERE id = :id",
        _FETCH=db.Statement("SELECT a FROM t WHERE id = :id"),
        _DROP=db.Statement("DELETE FROM t"),
        TAIL=", x AS (SELECT 1)",  # a fragment: not a statement
        lower_sql="SELECT 1",  # not a constant
    )
    found = statements.constants([module])
    assert sorted(found.values()) == ["things.DROP", "things.FETCH"]


def test_delta_counts_new_entries_from_zero_and_leaves_out_unchanged_ones() -> None:
    before = {"a": {"n": 3}, "b": {"n": 5}}
    after = {"a": {"n": 7}, "b": {"n": 5}, "c": {"n": 2}}
    assert statements.delta(before, after, ["n"]) == {"a": {"n": 4.0}, "c": {"n": 2.0}}


def test_per_call_divides_and_refuses_zero_calls() -> None:
    assert statements.per_call({"wal_bytes": 3000.0, "calls": 50.0}, 100) == {
        "wal_bytes": 30.0,
        "calls": 0.5,
    }
    with pytest.raises(ValueError, match="no calls"):
        statements.per_call({"calls": 1.0}, 0)


def test_index_entries_count_inserts_and_non_hot_updates_once_per_index() -> None:
    # 10 inserts and 5 updates of which 2 HOT: 13 rows need entries in 3 full indexes and
    # at most in 1 partial one.
    assert statements.index_entries(10, 5, 2, full=3, partial=1) == (39, 13)
    assert statements.index_entries(0, 4, 4, full=5, partial=2) == (0, 0)


def _row(who: str, query: str, calls: int, wal: int, exec_ms: float = 0.0) -> dict[str, Any]:
    counters: dict[str, float] = dict.fromkeys(statements.COUNTERS, 0.0)
    counters.update(calls=calls, rows=calls, wal_bytes=wal, total_exec_time=exec_ms)
    return {"who": who, "query": query, **counters}


def _reading(
    step: int, completed: int, published: int, submitted: int, *, ins: int = 0, wal: float = 0
) -> Reading:
    end = as_postgres_keeps_it(endings.END_READS_SQL)
    return Reading(
        statements={
            ("postgres", True, 1): _row("postgres", end, 10 * step, 1000 * step, 2.0 * step),
            ("postgres", True, 2): _row("postgres", "COMMIT", 10 * step, 0),
            ("callgate_bench", True, 3): _row("callgate_bench", "SELECT 1", 99 * step, 50 * step),
            ("callgate_downstream", True, 4): _row("callgate_downstream", "BEGIN", step, 0),
        },
        tables={
            "callgate.calls": {
                "n_tup_ins": ins,
                "n_tup_upd": ins,
                "n_tup_hot_upd": 0,
                "n_tup_del": 0,
            }
        },
        wal={"wal_records": wal / 100, "wal_fpi": 0.0, "wal_bytes": wal, "lsn": wal},
        progress={"completed": completed, "published": published, "submitted": submitted},
    )


def test_reduce_divides_each_phase_by_its_own_calls_and_leaves_the_bench_out() -> None:
    readings = {
        "submit": _reading(0, 0, 0, 0),
        "submitted": _reading(1, 0, 0, 100),
        "window": _reading(2, 10, 5, 100),
        "drained": _reading(6, 100, 100, 100),  # 90 calls completed in the window
        "collect": _reading(6, 100, 100, 100),
        "collected": _reading(7, 100, 100, 100),
        "stopped": _reading(8, 100, 100, 100, ins=100, wal=9000.0),
    }
    indexes = [
        ("callgate.calls", "calls_pkey", None),
        ("callgate.calls", "calls_turn", None),
        ("callgate.calls", "calls_open", "(state = 'proposed'::text)"),
    ]
    found = statements.reduce(readings, calls=100, indexes=indexes)

    run = found["phases"]["run"]
    assert run["calls"] == 90 and run["published"] == 95
    by_name = {r["statement"]: r for r in run["statements"]}
    assert set(by_name) == {"endings.END_READS", "COMMIT", "BEGIN"}  # not the bench's SELECT 1
    assert by_name["endings.END_READS"]["executions"] == pytest.approx(40 / 90, abs=1e-3)
    assert by_name["endings.END_READS"]["wal_bytes"] == pytest.approx(4000 / 90, abs=0.1)
    assert by_name["endings.END_READS"]["mean_exec_ms"] == pytest.approx(8.0 / 40)
    assert by_name["BEGIN"]["who"] == "downstream"
    assert found["phases"]["submit"]["calls"] == 100
    assert found["phases"]["collect"]["per_call"]["callgate"]["wal_bytes"] == 10.0

    calls = found["tables"]["callgate.calls"]
    assert (calls["inserted"], calls["updated"], calls["indexes"]) == (1.0, 1.0, 3)
    assert (calls["index_entries"], calls["partial_index_entries_at_most"]) == (4.0, 2.0)
    assert found["written_per_call"]["callgate"] == {
        "rows": 2.0,
        "index_entries": 4.0,
        "partial_index_entries_at_most": 2.0,
    }
    check = found["wal_check"]
    assert check["statements_wal_bytes_per_call"] == 80.0  # 8000 B of END_READS, 100 calls
    assert check["every_users_statements_wal_bytes_per_call"] == 84.0  # and the bench's 400 B
    assert check["pg_stat_wal_bytes_per_call"] == 90.0


def test_render_shows_each_phase_and_table() -> None:
    readings = {
        m: _reading(i, min(100, 10 * i * i), min(100, 10 * i * i), 100 if i else 0, ins=i)
        for i, m in enumerate(
            ("submit", "submitted", "window", "drained", "collect", "collected", "stopped")
        )
    }
    text = statements.render("reads", statements.reduce(readings, calls=100, indexes=[]))
    assert "| run | callgate | `endings.END_READS` |" in text
    assert "| callgate.calls |" in text
    assert "WAL per call over the whole run" in text


def test_no_server_programs_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replicated, "server_programs", lambda: None)
    with pytest.raises(CallgateError, match="found no server programs") as caught:
        statements.private_postgres().__enter__()
    assert "\n" not in caught.value.message


def test_no_pg_stat_statements_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()  # a server's folders, without the extension's library
    monkeypatch.setattr(replicated, "server_programs", lambda: tmp_path / "bin")
    with pytest.raises(CallgateError, match="needs the pg_stat_statements extension") as caught:
        statements.private_postgres().__enter__()
    assert "\n" not in caught.value.message
