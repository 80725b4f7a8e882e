"""``callgate bench costs --statements``: what each of a call's statements costs PostgreSQL.

pg_stat_statements needs ``shared_preload_libraries``, a server restart, so the bench starts
a PostgreSQL of its own (``replicated.Replicated``'s primary: initdb into a temporary folder,
a free port, PostgreSQL's own programs) with the extension loaded, ``track = all`` and
``track_io_timing``, runs ``costs``' workload on it, and stops and removes it afterwards.
Redis stays the configured one (each run has its own queue).

Three database users tell the statements apart, since pg_stat_statements keys its counters
by user: callgate's (the producer, workers and relayer), the demo tools' own tables (the
workers' downstream connection, ``CALLGATE_DOWNSTREAM_DATABASE_URL``) and the bench's (its
sampling, the refunds' payments, VACUUM, these readings), which is left out.

The readings are taken at ``costs``' moments (``costs.MOMENTS``): pg_stat_statements is
reset before the submit and read at every moment, and a figure is the difference of two
readings divided by the calls between them: the submit and the collect over all N calls, the
workers' and relayer's statements over the same steady-state window the CPU figures use
(from the sample where 10% of the calls had completed to the one where every result was
published), divided by the calls completed in it.

pg_stat_user_tables and pg_stat_wal are different: a backend sends its counts to them at
most once a second while busy, ten seconds after it goes idle, and when it exits, so a
reading inside a run misses an unknown share of the work. Their figures therefore span the
whole run, between two moments where no backend holds counts it has not sent: the submit's
start (the bench's setup connections closed and gone; the producer's has written nothing
yet) and the moment every process has stopped (the bench's connections closed too). That
run includes the workers' and relayer's start-up and the bench's VACUUM, so ``wal_check``
sets pg_stat_wal's figure beside the per-statement WAL of the same run, callgate's and the
demo tools' statements and every user's (the bench's VACUUM included), and the WAL
position's advance.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from callgate.core.errors import CallgateError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.lab import replicated
from callgate.ops.lab.bench import costs
from callgate.ops.lab.bench.costs import BENCH_APP
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services

# The private server: pg_stat_statements loaded, and otherwise as the shared server the rest
# of the bench measures (PostgreSQL's defaults): commits wait for the disk, the buffers hold
# a run, and no autovacuum worker writes WAL inside a run (the bench vacuums before one).
SERVER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.max": "10000",
    "track_io_timing": "on",
    "fsync": "on",
    "shared_buffers": "'128MB'",
    "autovacuum": "off",
}
DOWNSTREAM_USER = "callgate_downstream"
BENCH_USER = "callgate_bench"
# Who ran a statement, by database user (replicated.RUN_AS is the superuser initdb made).
WHO = {replicated.RUN_AS: "callgate", DOWNSTREAM_USER: "downstream"}
GONE_TIMEOUT = 15.0
# The modules whose SQL constants name statements: callgate's store and the demo tools'.
NAMED_IN = ("callgate.store", "callgate.ops.lab.demo.downstream")
# Two texts whose tokens overlap this much are one statement written another way (a VALUES
# list of another length, a constant pg_stat_statements kept).
SIMILAR = 0.8
LABEL_WORDS = 6
LABEL_CHARS = 60

STATEMENTS_SQL = """
SELECT userid::regrole::text AS who, toplevel, queryid, query, calls, rows,
       total_exec_time, wal_records, wal_fpi, wal_bytes, shared_blks_hit, shared_blks_read,
       shared_blks_dirtied, shared_blks_written, blk_read_time, blk_write_time
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
TABLES_SQL = """
SELECT schemaname || '.' || relname AS name, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
  FROM pg_stat_user_tables
"""
WAL_SQL = """
SELECT w.wal_records, w.wal_fpi, w.wal_bytes,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') AS lsn
  FROM pg_stat_wal AS w
"""
PROGRESS_SQL = """
SELECT (SELECT count(*) FROM callgate.calls) AS submitted,
       (SELECT count(*) FROM callgate.calls WHERE completed_at IS NOT NULL) AS completed,
       (SELECT count(*) FROM callgate.outbox WHERE published_at IS NOT NULL) AS published
"""
INDEXES_SQL = """
SELECT n.nspname || '.' || t.relname AS table_name, i.relname AS index_name,
       pg_get_expr(x.indpred, x.indrelid) AS predicate
  FROM pg_index AS x
  JOIN pg_class AS i ON i.oid = x.indexrelid
  JOIN pg_class AS t ON t.oid = x.indrelid
  JOIN pg_namespace AS n ON n.oid = t.relnamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
"""
# The backends a boundary waits for: every other client's, or the bench's (by its
# application_name) but for the one asking.
OTHERS_SQL = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
   AND pid <> pg_backend_pid() AND (application_name = :app OR NOT :only_app)
"""

COUNTERS = (
    "calls",
    "rows",
    "total_exec_time",
    "wal_records",
    "wal_fpi",
    "wal_bytes",
    "shared_blks_hit",
    "shared_blks_read",
    "shared_blks_dirtied",
    "shared_blks_written",
    "blk_read_time",
    "blk_write_time",
)
TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
# Each phase: its name, the moments it spans, and how it counts its calls.
PHASES = (
    ("submit", "submit", "submitted", "submitted"),
    ("run", "window", "drained", "completed"),
    ("collect", "collect", "collected", "submitted_all"),
)
# The whole run: between these moments no backend holds counts it has not sent (see above).
WHOLE = ("submit", "stopped")


# -- the private server ---------------------------------------------------------------------


@dataclass(frozen=True)
class Private:
    """The private server's URLs: callgate's, the demo tools' and the bench's users."""

    url: str
    downstream_url: str
    bench_url: str
    version: str


@contextlib.contextmanager
def private_postgres() -> Iterator[Private]:
    """A PostgreSQL of the bench's own with pg_stat_statements; stopped and removed after."""
    programs = replicated.server_programs()
    if programs is None:
        raise _failed(
            "bench costs --statements starts a PostgreSQL of its own and found no server "
            "programs (initdb, pg_ctl): install the postgresql package, or pip install "
            "'callgate[demo]'"
        )
    if not _has_pg_stat_statements(programs):
        raise _failed(
            f"bench costs --statements needs the pg_stat_statements extension beside "
            f"{programs} (Debian/Ubuntu: the postgresql package; elsewhere postgresql-contrib)"
        )
    with replicated.Replicated(settings=SERVER_SETTINGS) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for user in (DOWNSTREAM_USER, BENCH_USER):
                # Superusers: the demo tools' user owns nothing, and the bench's resets
                # pg_stat_statements and vacuums callgate's tables.
                conn.execute(f"CREATE ROLE {user} LOGIN SUPERUSER")
            conn.execute("CREATE EXTENSION pg_stat_statements")
            row = conn.execute("SHOW server_version").fetchone()
        url = pg.url.replace("postgresql://", "postgresql+psycopg://", 1)
        yield Private(
            url=url,
            downstream_url=url.replace(f"//{replicated.RUN_AS}@", f"//{DOWNSTREAM_USER}@", 1),
            bench_url=url.replace(f"//{replicated.RUN_AS}@", f"//{BENCH_USER}@", 1),
            version=str(row[0]) if row else "",
        )


def _has_pg_stat_statements(programs: Path) -> bool:
    """The extension's library, where a Debian package (``lib``) or pgserver
    (``lib/postgresql``) keeps it, beside the server programs."""
    root = programs.parent
    return any(
        (root / sub / "pg_stat_statements.so").is_file() for sub in ("lib", "lib/postgresql")
    )


def _failed(message: str) -> CallgateError:
    return CallgateError(message, code=ErrorCode.EMBEDDED_SERVICE_FAILED)


# -- readings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment."""

    statements: dict[tuple[str, bool, int], dict[str, Any]]  # (user, toplevel, queryid) →
    tables: dict[str, dict[str, int]]
    wal: dict[str, float]
    progress: dict[str, int]


def read(engine: Engine) -> Reading:
    with engine.connect() as conn:
        statements = {
            (str(r["who"]), bool(r["toplevel"]), int(r["queryid"])): dict(r)
            for r in conn.execute(text(STATEMENTS_SQL)).mappings()
        }
        tables = {
            str(r["name"]): {k: int(r[k]) for k in TABLE_COUNTERS}
            for r in conn.execute(text(TABLES_SQL)).mappings()
        }
        wal = {k: float(v) for k, v in conn.execute(text(WAL_SQL)).mappings().one().items()}
        progress = {k: int(v) for k, v in conn.execute(text(PROGRESS_SQL)).mappings().one().items()}
    return Reading(statements, tables, wal, progress)


@dataclass
class Recorder:
    """A ``costs.Watch``: reads the private server at each of the run's moments."""

    engine: Engine  # the bench user's
    calls: int
    # Whose pooled connections a boundary of the whole run closes: the bench's engines.
    pools: Sequence[Engine] = ()
    readings: dict[str, Reading] = field(default_factory=dict)

    def mark(self, moment: str) -> None:
        if moment == "submit":
            with self.engine.connect() as conn:
                conn.execute(text("SELECT pg_stat_statements_reset()"))
                conn.commit()
        if moment in WHOLE:
            self._flushed(everyone=moment == "stopped")
        self.readings[moment] = read(self.engine)

    def _flushed(self, *, everyone: bool) -> None:
        """Close the bench's pooled connections and wait until they (``everyone``: every
        other client's too) have exited: a backend sends its counts before it leaves
        pg_stat_activity."""
        for engine in {*self.pools, self.engine}:
            engine.dispose()
        deadline = time.monotonic() + GONE_TIMEOUT
        while True:
            with self.engine.connect() as conn:
                left = conn.execute(
                    text(OTHERS_SQL), {"app": BENCH_APP, "only_app": not everyone}
                ).scalar_one()
            if not left:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"bench costs --statements: {left} backends did not exit")
            time.sleep(0.05)
        # The connection that asked is one of them now: close it too.
        self.engine.dispose()

    def report(self) -> dict[str, Any]:
        with self.engine.connect() as conn:
            indexes = [tuple(r) for r in conn.execute(text(INDEXES_SQL))]
        return reduce(self.readings, calls=self.calls, indexes=indexes)


# -- labels ---------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"'(?:[^']|'')*'"  # a string literal
    r"|\$\d+"  # a parameter as PostgreSQL sees it
    r"|%\(\w+\)s"  # as psycopg writes it
    r"|::"  # a cast, before the :name below
    r"|:\w+"  # as SQLAlchemy writes it
    r"|\b\d+(?:\.\d+)?\b"  # a number (pg_stat_statements replaces constants)
    r"|\w+(?:\.\w+)*"
    r"|[^\s\w]"
)
_SQL_START = ("select", "insert", "update", "delete", "with")


def tokens(sql: str) -> tuple[str, ...]:
    """A statement's tokens, lower-cased, every parameter and constant one ``?``: the same
    for callgate's text (``:name``) and pg_stat_statements' (``$1``)."""
    out = []
    for tok in _TOKEN.findall(sql):
        if tok[0] in "'$%" or (tok[0] == ":" and tok != "::") or tok[0].isdigit():
            out.append("?")
        else:
            out.append(tok.lower())
    return tuple(out)


def constants(modules: Iterable[Any]) -> dict[tuple[str, ...], str]:
    """Every module-level SQL string of ``modules``, by its tokens → ``module.NAME`` (without
    ``_SQL``); of two names for one text the first public one."""
    found: dict[tuple[str, ...], str] = {}
    for module in modules:
        short = module.__name__.rsplit(".", 1)[-1]
        names = sorted(vars(module).items(), key=lambda kv: (kv[0].startswith("_"), kv[0]))
        for name, value in names:
            sql = getattr(value, "sql", value)  # db.Statement holds its text
            if not isinstance(sql, str) or not name.lstrip("_").isupper():
                continue
            toks = tokens(sql)
            if toks and toks[0] in _SQL_START:
                found.setdefault(toks, f"{short}.{name.lstrip('_').removesuffix('_SQL')}")
    return found


@cache
def named() -> dict[tuple[str, ...], str]:
    modules: list[Any] = []
    for name in NAMED_IN:
        module = importlib.import_module(name)
        modules.append(module)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            modules.append(importlib.import_module(f"{name}.{info.name}"))
    return constants(modules)


def _similarity(a: Sequence[str], b: Sequence[str]) -> float:
    ca, cb = Counter(a), Counter(b)
    union = sum((ca | cb).values())
    return sum((ca & cb).values()) / union if union else 0.0


def label(query: str, names: Mapping[tuple[str, ...], str]) -> str:
    """The constant whose text ``query`` is (or nearly is: ``SIMILAR``), else its first
    words: ``BEGIN``, ``INSERT INTO downstream.requests (service, …``."""
    toks = tokens(query)
    if toks in names:
        return names[toks]
    best, score = None, SIMILAR
    for candidate, name in names.items():
        if candidate[:1] == toks[:1]:
            s = _similarity(toks, candidate)
            if s >= score:
                best, score = name, s
    if best is not None:
        return f"{best} (~)"
    words = " ".join(query.split()).split(" ")
    if len(words) == 1:
        return words[0].upper()
    head = words[0]
    for word in words[1:LABEL_WORDS]:
        if len(head) + 1 + len(word) > LABEL_CHARS:
            break
        head += " " + word
    return head if len(head) == len(" ".join(words)) else head + " …"


# -- arithmetic ------------------------------------------------------------------------------


def delta(
    before: Mapping[Any, Mapping[str, Any]],
    after: Mapping[Any, Mapping[str, Any]],
    keys: Sequence[str],
) -> dict[Any, dict[str, float]]:
    """``after`` less ``before``, entry by entry (an entry new in ``after`` counts from zero);
    entries that did not change are left out."""
    out: dict[Any, dict[str, float]] = {}
    for key, row in after.items():
        prior = before.get(key, {})
        d = {k: float(row[k]) - float(prior.get(k, 0)) for k in keys}
        if any(d.values()):
            out[key] = d
    return out


def per_call(counts: Mapping[str, float], calls: float) -> dict[str, float]:
    if calls <= 0:
        raise ValueError("no calls to divide by")
    return {k: v / calls for k, v in counts.items()}


def index_entries(
    inserted: float, updated: float, hot: float, full: int, partial: int
) -> tuple[float, float]:
    """Index entries written: each insert and each non-HOT update adds one to every index of
    its table (a HOT update adds none). Exact for full indexes; for partial ones an upper
    bound (a row outside the predicate adds nothing). → (full indexes', partial's bound)."""
    rows = inserted + updated - hot
    return rows * full, rows * partial


def _sum(rows: Iterable[Mapping[str, float]], keys: Sequence[str]) -> dict[str, float]:
    total = dict.fromkeys(keys, 0.0)
    for row in rows:
        for k in keys:
            total[k] += row.get(k, 0.0)
    return total


def _statements(
    a: Reading, b: Reading, calls: float, names: Mapping[tuple[str, ...], str]
) -> list[dict[str, Any]]:
    """Per statement (by who ran it and its label, nested apart), per call."""
    changed = delta(a.statements, b.statements, COUNTERS)
    merged: dict[tuple[str, str, bool], list[dict[str, float]]] = {}
    for (user, toplevel, _), d in changed.items():
        who = WHO.get(user)
        if who is None:
            continue  # the bench's own
        key = (who, label(str(b.statements[(user, toplevel, _)]["query"]), names), toplevel)
        merged.setdefault(key, []).append(d)
    out = []
    for (who, name, toplevel), parts in merged.items():
        total = _sum(parts, COUNTERS)
        each = per_call(total, calls)
        out.append(
            {
                "who": who,
                "statement": name,
                "toplevel": toplevel,
                "executions": round(each["calls"], 3),
                "rows": round(each["rows"], 3),
                "exec_ms": round(each["total_exec_time"], 4),
                "mean_exec_ms": round(total["total_exec_time"] / total["calls"], 4)
                if total["calls"]
                else 0.0,
                "wal_records": round(each["wal_records"], 2),
                "wal_bytes": round(each["wal_bytes"], 1),
                "wal_fpi": round(each["wal_fpi"], 3),
                "shared_blks_hit": round(each["shared_blks_hit"], 2),
                "shared_blks_read": round(each["shared_blks_read"], 3),
                "shared_blks_dirtied": round(each["shared_blks_dirtied"], 3),
                "shared_blks_written": round(each["shared_blks_written"], 3),
            }
        )
    return sorted(out, key=lambda r: (r["who"], not r["toplevel"], -r["exec_ms"]))


def _totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per call, by who: top-level statements only (a nested statement's work is in the
    statement that ran it too)."""
    keys = ("executions", "rows", "exec_ms", "wal_records", "wal_bytes", "wal_fpi")
    out: dict[str, dict[str, float]] = {}
    for who in sorted({str(r["who"]) for r in rows}):
        top = [r for r in rows if r["who"] == who and r["toplevel"]]
        out[who] = {k: round(v, 3) for k, v in _sum(top, keys).items()}
    return out


def reduce(
    readings: Mapping[str, Reading], *, calls: int, indexes: Sequence[tuple[Any, ...]]
) -> dict[str, Any]:
    """The report of one run from its readings (``Recorder``): per statement and phase, per
    table, and the WAL cross-check, each per call."""
    names = named()
    phases: dict[str, Any] = {}
    for phase, start, end, counted in PHASES:
        a, b = readings[start], readings[end]
        if counted == "completed":
            n = b.progress["completed"] - a.progress["completed"]
        elif counted == "submitted":
            n = b.progress["submitted"] - a.progress["submitted"]
        else:
            n = calls
        if n <= 0:
            raise ValueError(f"{phase}: no calls between {start} and {end}")
        rows = _statements(a, b, n, names)
        phases[phase] = {
            "calls": n,
            "published": b.progress["published"] - a.progress["published"],
            "statements": rows,
            "per_call": _totals(rows),
        }
    a, b = readings[WHOLE[0]], readings[WHOLE[1]]
    whole_rows = _statements(a, b, calls, names)
    table_d = delta(a.tables, b.tables, TABLE_COUNTERS)
    wal = {k: b.wal[k] - a.wal[k] for k in b.wal}
    every_user = delta(a.statements, b.statements, COUNTERS)
    full: Counter[str] = Counter()
    partial: dict[str, list[str]] = {}
    for table, index, predicate in indexes:
        if predicate is None:
            full[table] += 1
        else:
            partial.setdefault(table, []).append(f"{index} WHERE {predicate}")
    tables: dict[str, dict[str, Any]] = {}
    for name, d in sorted(table_d.items()):
        each = per_call(d, calls)
        exact, bound = index_entries(
            each["n_tup_ins"],
            each["n_tup_upd"],
            each["n_tup_hot_upd"],
            full[name],
            len(partial.get(name, [])),
        )
        tables[name] = {
            "inserted": round(each["n_tup_ins"], 3),
            "updated": round(each["n_tup_upd"], 3),
            "hot_updated": round(each["n_tup_hot_upd"], 3),
            "deleted": round(each["n_tup_del"], 3),
            "indexes": full[name] + len(partial.get(name, [])),
            "index_entries": round(exact, 3),
            "partial_index_entries_at_most": round(bound, 3),
            "partial_indexes": partial.get(name, []),
        }
    statement_wal = sum(
        sum(r["wal_bytes"] for r in whole_rows if r["toplevel"] and r["who"] == who)
        for who in WHO.values()
    )
    return {
        "phases": phases,
        "whole_run": {
            "calls": calls,
            "statements": _merge(whole_rows),
            "per_call": _totals(whole_rows),
        },
        "tables": tables,
        "written_per_call": _written(tables),
        "wal_check": {
            "statements_wal_bytes_per_call": round(statement_wal, 1),
            "every_users_statements_wal_bytes_per_call": round(
                sum(d["wal_bytes"] for (_, top, _), d in every_user.items() if top) / calls, 1
            ),
            "pg_stat_wal_bytes_per_call": round(wal["wal_bytes"] / calls, 1),
            "pg_stat_wal_records_per_call": round(wal["wal_records"] / calls, 2),
            "pg_stat_wal_fpi_per_call": round(wal["wal_fpi"] / calls, 3),
            "wal_position_bytes_per_call": round(wal["lsn"] / calls, 1),
        },
    }


def _written(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Rows and index entries written per call, callgate's tables apart from the demo
    tools' (the ``downstream`` schema)."""
    out: dict[str, dict[str, float]] = {}
    for name, t in tables.items():
        who = "downstream" if name.startswith("downstream.") else "callgate"
        into = out.setdefault(
            who, {"rows": 0.0, "index_entries": 0.0, "partial_index_entries_at_most": 0.0}
        )
        into["rows"] += t["inserted"] + t["updated"] + t["deleted"]
        into["index_entries"] += t["index_entries"]
        into["partial_index_entries_at_most"] += t["partial_index_entries_at_most"]
    return {who: {k: round(v, 3) for k, v in d.items()} for who, d in sorted(out.items())}


def _merge(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The whole run's two segments' rows, one per statement (their per-call figures add)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r["who"], r["statement"], r["toplevel"])
        if key not in out:
            out[key] = dict(r)
            continue
        total = out[key]
        execs = total["executions"] + r["executions"]
        for k, v in r.items():
            if isinstance(v, float) and k != "mean_exec_ms":
                total[k] = round(total[k] + v, 4)
        total["mean_exec_ms"] = round(total["exec_ms"] / execs, 4) if execs else 0.0
    return sorted(out.values(), key=lambda r: (r["who"], not r["toplevel"], -r["exec_ms"]))


# -- the text output -------------------------------------------------------------------------

# Statements run less often than this per call are summed in one row of the text output.
RARE = 0.01
COLUMNS = (
    ("executions", "runs"),
    ("rows", "rows"),
    ("exec_ms", "exec ms"),
    ("mean_exec_ms", "mean ms"),
    ("wal_records", "WAL rec"),
    ("wal_bytes", "WAL B"),
    ("wal_fpi", "FPI"),
    ("shared_blks_dirtied", "dirtied"),
    ("shared_blks_written", "written"),
)


def render(kind: str, report: Mapping[str, Any], *, rare: float = RARE) -> str:
    """A markdown table per kind: each top-level statement per call, by phase (those run
    less than ``rare`` times a call, such as a process's start-up, summed in one row), then
    per table and the WAL cross-check."""
    head = "| phase | who | statement | " + " | ".join(c for _, c in COLUMNS) + " |"
    lines = [f"#### {kind}: per call", "", head, "|---|---|---|" + "---:|" * len(COLUMNS)]
    for phase, found in report["phases"].items():
        rows = [r for r in found["statements"] if r["toplevel"]]
        for who in sorted({r["who"] for r in rows}):
            mine = [r for r in rows if r["who"] == who]
            few = [r for r in mine if r["executions"] < rare]
            for r in mine:
                if r not in few:
                    cells = " | ".join(_cell(r[k]) for k, _ in COLUMNS)
                    lines.append(f"| {phase} | {who} | `{r['statement']}` | {cells} |")
            if few:
                other = _sum(few, [k for k, _ in COLUMNS])
                other["mean_exec_ms"] = 0.0
                cells = " | ".join(_cell(other[k]) for k, _ in COLUMNS)
                lines.append(f"| {phase} | {who} | {len(few)} others, each < {rare:g} | {cells} |")
        for who, t in found["per_call"].items():
            lines.append(
                f"| {phase} | {who} | **all** | {_cell(t['executions'])} | {_cell(t['rows'])} "
                f"| {_cell(t['exec_ms'])} |  | {_cell(t['wal_records'])} "
                f"| {_cell(t['wal_bytes'])} | {_cell(t['wal_fpi'])} |  |  |"
            )
    lines += [
        "",
        "| table | inserted | updated | HOT | deleted | indexes | index entries |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in report["tables"].items():
        entries = _cell(t["index_entries"])
        if t["partial_index_entries_at_most"]:
            entries += f" + ≤ {_cell(t['partial_index_entries_at_most'])} partial"
        lines.append(
            f"| {name} | {_cell(t['inserted'])} | {_cell(t['updated'])} "
            f"| {_cell(t['hot_updated'])} | {_cell(t['deleted'])} | {t['indexes']} | {entries} |"
        )
    lines.append("")
    for who, t in report["written_per_call"].items():
        lines.append(
            f"{who}: {_cell(t['rows'])} rows and {_cell(t['index_entries'])} index entries "
            f"written per call (+ at most {_cell(t['partial_index_entries_at_most'])} in "
            "partial indexes)"
        )
    w = report["wal_check"]
    lines.append(
        f"WAL per call over the whole run: statements {_cell(w['statements_wal_bytes_per_call'])}"
        f" B, pg_stat_wal {_cell(w['pg_stat_wal_bytes_per_call'])} B, WAL position "
        f"{_cell(w['wal_position_bytes_per_call'])} B"
    )
    return "\n".join(lines)


def _cell(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


# -- the command -----------------------------------------------------------------------------


def run(
    settings: Settings,
    *,
    kinds: Sequence[str],
    calls: int,
    workers: int,
    concurrency: int,
    command: str,
) -> dict[str, Any]:
    """``costs.run`` on a private server with pg_stat_statements, each kind's report in its
    ``statements``."""
    with private_postgres() as pg:
        services = Services.prepare(
            settings.replace(database_url=pg.url, downstream_database_url=pg.downstream_url)
        )
        observer = Services(pg.bench_url, services.redis_url)
        try:
            found = costs.run(
                services,
                kinds=kinds,
                calls=calls,
                workers=workers,
                concurrency=concurrency,
                command=command,
                watches=lambda kind: Recorder(observer.engine, calls, [services.engine]),
                observer=observer,
                env_extra={"CALLGATE_DOWNSTREAM_DATABASE_URL": pg.downstream_url},
            )
        finally:
            services.engine.dispose()
            observer.engine.dispose()
        found["statements_server"] = {
            "postgres": pg.version,
            "settings": {k: v.strip("'") for k, v in SERVER_SETTINGS.items()},
            "method": (
                "pg_stat_statements by database user (callgate's, the demo tools', the "
                "bench's left out): the submit and collect per submitted call, the workers' "
                "and relayer's over the steady-state window per call completed in it; "
                "pg_stat_user_tables and pg_stat_wal over the whole run (start-up included) "
                "per call; see callgate.ops.lab.bench.statements"
            ),
        }
        return found
