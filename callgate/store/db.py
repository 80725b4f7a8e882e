"""Connections to Postgres, and the one place driver errors become callgate errors."""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection as Connection
from sqlalchemy import Engine as Engine
from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from callgate.core.errors import ConfigurationError, InputError, ServiceUnavailable

_T = TypeVar("_T")


# ``?pgbouncer=true`` on the database URL (the convention Prisma made familiar): a pooler in
# transaction mode (PgBouncer, or any like it) sits in front of Postgres, so consecutive
# transactions of one client connection may run on different server connections. Nothing
# may then outlive a transaction on the server: no prepared statements (psycopg prepares a
# statement on its sixth run, and the raw path on its first) and no LISTEN.
POOLER_PARAMETER = "pgbouncer"
_TRUE = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parsed(url: str) -> tuple[URL, bool]:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(f"not a database URL: {url!r}") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(f"callgate needs PostgreSQL, got {parsed.drivername!r}")
    flag = parsed.query.get(POOLER_PARAMETER)
    if flag is None:
        return parsed, False
    value = _TRUE.get(flag.lower()) if isinstance(flag, str) else None
    if value is None:
        raise ConfigurationError(
            f"{POOLER_PARAMETER}={flag!r} in the database URL: use {POOLER_PARAMETER}=true when "
            "a pooler in transaction mode (PgBouncer) is in front of PostgreSQL, or leave it out"
        )
    return parsed.difference_update_query([POOLER_PARAMETER]), value


def sqlalchemy_url(url: str) -> str:
    """Accept libpq-style ``postgresql://`` URLs and pin the psycopg 3 driver."""
    parsed, _ = _parsed(url)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL in the form psycopg.connect() takes (for LISTEN connections)."""
    parsed, _ = _parsed(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def behind_transaction_pooler(url: str) -> bool:
    """Whether the URL says a pooler in transaction mode is in front (``?pgbouncer=true``)."""
    return _parsed(url)[1]


def create(
    url: str,
    *,
    pool_size: int = 2,
    max_overflow: int | None = None,
    application_name: str = "callgate",
) -> Engine:
    connect_args: dict[str, Any] = {"application_name": application_name, "connect_timeout": 5}
    pooled = behind_transaction_pooler(url)
    if pooled:
        connect_args["prepare_threshold"] = None  # never prepare: see POOLER_PARAMETER
    engine = create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max(4, pool_size) if max_overflow is None else max_overflow,
        # No pre-ping: it would cost a round trip per checkout on the hot path. A connection
        # broken by a Postgres restart fails its statement and is discarded; the job is
        # re-run by the sweeper.
        pool_recycle=600,
        connect_args=connect_args,
    )
    if not pooled:
        event.listen(engine, "connect", _generic_plans)
    return engine


def _generic_plans(driver: Any, _record: Any) -> None:
    """Prepared statements use their generic plan from the first run. Left to itself
    (``auto``), Postgres plans a statement again on every run while it estimates a plan for
    the values at hand cheaper: a statement over ``unnest`` of array parameters (a batch of
    endings) is then re-planned every time, about 1 ms of server CPU for a CTE that runs in
    0.2 ms. Every statement callgate prepares is an index lookup whose plan does not depend
    on the values."""
    # Outside a transaction: one statement on a new connection, no BEGIN or COMMIT.
    driver.autocommit = True
    try:
        driver.execute("SET plan_cache_mode = force_generic_plan")
    finally:
        driver.autocommit = False


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn "cannot reach Postgres" into one actionable ServiceUnavailable, and a value
    Postgres refuses into an InputError.

    A refused value (a DataError such as a NUL in text, an IntegrityError, a key past the
    index's row size) is not an outage: retrying it can never succeed. Its message names
    the kind of refusal only, never the statement or the value.
    """
    try:
        yield
    except (DataError, IntegrityError) as exc:
        raise _refused(what, exc.orig) from exc
    except UnicodeEncodeError as exc:  # the driver cannot send a lone surrogate as UTF-8
        raise _refused(what, exc) from exc
    except OperationalError as exc:
        if isinstance(exc.orig, psycopg.errors.ProgramLimitExceeded):
            raise _refused(what, exc.orig) from exc
        raise ServiceUnavailable(f"{what}: cannot reach PostgreSQL ({_first_line(exc)})") from exc
    except (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded) as exc:
        raise _refused(what, exc) from exc
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"{what}: cannot reach PostgreSQL ({_first_line(exc)})") from exc
    except (DBAPIError, psycopg.DatabaseError) as exc:
        if is_history_changed(exc):
            raise ServiceUnavailable(
                f"{what}: PostgreSQL's history changed (a failover to a replica, or a "
                "restore) and callgate has not reconciled it yet; a running worker or "
                "sweeper does within a sweep"
            ) from exc
        if isinstance(exc, psycopg.DatabaseError):
            raise
        if exc.connection_invalidated:
            raise ServiceUnavailable(f"{what}: lost the PostgreSQL connection") from exc
        if isinstance(exc.orig, _POOLED_PREPARE_ERRORS):
            raise pooler_misconfigured(what) from exc
        raise


# callgate never names a prepared statement itself: these come from psycopg's own ones
# reaching another server connection than the one they were prepared on.
_POOLED_PREPARE_ERRORS = (
    psycopg.errors.DuplicatePreparedStatement,
    psycopg.errors.InvalidSqlStatementName,
)


def pooler_misconfigured(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"{what}: a prepared statement is missing or doubled on the server, as happens behind "
        f"a pooler in transaction mode (PgBouncer): add ?{POOLER_PARAMETER}=true to "
        "CALLGATE_DATABASE_URL (nothing was recorded by the statement that failed)"
    )


def _refused(what: str, orig: BaseException | None) -> InputError:
    kind = type(orig).__name__ if orig is not None else "DataError"
    return InputError(
        f"{what}: PostgreSQL refused a value ({kind}); check the input's ids, sizes and characters"
    )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


@contextmanager
def autocommit(engine: Engine) -> Iterator[Connection]:
    """A connection for one self-contained statement: no BEGIN/COMMIT round trips.

    Each guarantee statement (reserve, complete, reject, …) is atomic on its own; wrapping
    it in an explicit transaction would only add two round trips.
    """
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn


class PerEngine(Generic[_T]):
    """One ``make(engine)`` per engine, made on first use and dropped with the engine: the
    process-wide state of a helper every call of one engine shares (a renewal thread, a
    batch of endings)."""

    def __init__(self, make: Callable[[Engine], _T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[Engine, _T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, engine: Engine) -> _T:
        with self._lock:
            made = self._made.get(engine)
            if made is None:
                made = self._made[engine] = self._make(engine)
            return made


def ping(engine: Engine) -> None:
    """One round trip: Postgres answers (readiness checks)."""
    with autocommit(engine) as conn:
        conn.exec_driver_sql("SELECT 1")


def is_operational_error(exc: BaseException) -> bool:
    """A driver error about the server or the connection (through SQLAlchemy or not)."""
    return isinstance(exc, OperationalError | psycopg.OperationalError)


# What callgate.history_epoch() raises (migration 0018): the server is on a history callgate
# has not reconciled yet (a failover to a replica, a restore). Nothing was written.
HISTORY_CHANGED_SQLSTATE = "CGH01"


def is_history_changed(exc: BaseException) -> bool:
    """Whether a statement was refused because PostgreSQL's history changed (a failover):
    transient, since a sweeper reconciles the new history within a sweep."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None) == HISTORY_CHANGED_SQLSTATE


def is_transient(exc: BaseException) -> bool:
    """A failure the same statement may not meet again: a connect refused or failed, a lost
    or terminated connection, a deadlock or serialization abort, a history not reconciled
    yet. Not bad data, not a constraint violation. As SQLAlchemy wraps it or as the driver
    raised it (a connection opened outside the engine, a tool's handler talking to its own
    database)."""
    if is_history_changed(exc):
        return True
    if isinstance(exc, OperationalError):  # includes deadlock_detected, admin_shutdown
        return not isinstance(exc.orig, psycopg.errors.ProgramLimitExceeded)  # a value too big
    if isinstance(exc, psycopg.OperationalError):  # the same errors, unwrapped
        return not isinstance(exc, psycopg.errors.ProgramLimitExceeded)
    if isinstance(exc, PoolTimeout):  # every pooled connection stayed busy: not this call's bug
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def is_connection_failure(exc: BaseException) -> bool:
    """Whether a tool's own downstream connection failed in a way a repeat may not meet."""
    return is_transient(exc)


# Exponential back-off between attempts: 50 ms, 100 ms, 200 ms, 400 ms, then 1 s, for up to
# TRANSIENT_SECONDS in all: long enough to ride out a PostgreSQL restart (a few seconds).
TRANSIENT_WAIT = 0.05
TRANSIENT_MAX_WAIT = 1.0
TRANSIENT_SECONDS = 10.0


def retry_transient(attempt: Callable[[], _T]) -> _T:
    """Run ``attempt`` (one guarded, self-contained statement), again on a transient failure,
    for up to ``TRANSIENT_SECONDS``; the last failure is raised as it is.

    Only for statements that are safe to repeat: each guarantee statement is guarded on the
    state it moves from, so a repeat after a commit whose reply was lost changes nothing
    (and the reservation recognises its own earlier commit by its owner token). A broken
    pooled connection is discarded when it fails, so each attempt after one reconnects.
    (A plain loop: a tenacity ``Retrying`` built per statement cost more CPU than the
    statement's own client side.)
    """
    return retry_until(attempt, seconds=TRANSIENT_SECONDS)


# How long a caller that waits anyway (a producer collecting a turn, recording one) keeps
# reconnecting through an outage: a PostgreSQL restart takes a few seconds.
RECONNECT_SECONDS = 15.0


def retry_until(attempt: Callable[[], _T], *, seconds: float = RECONNECT_SECONDS) -> _T:
    """Run ``attempt`` again on a transient failure until ``seconds`` have passed, with
    exponential back-off (at most 1 s). A broken pooled connection is discarded by the pool
    when it fails, so the next attempt opens a new one: this is the reconnect.

    Only for what is safe to repeat: a read (it changes nothing), or a transaction that a
    failure is known to have rolled back (see ``Producer.submit``).
    """
    deadline = time.monotonic() + seconds
    n = 0
    while True:
        n += 1
        try:
            return attempt()
        except Exception as exc:
            wait = min(TRANSIENT_WAIT * 2 ** (n - 1), TRANSIENT_MAX_WAIT)
            if not is_transient(exc) or time.monotonic() + wait > deadline:
                raise
            time.sleep(wait)


# --- the hot path: guarantee statements on the pooled driver connection ---------------------

# SQLAlchemy's own pattern for :name bind parameters in text() (not ::casts, not \:).
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


class Statement:
    """A SQL text written with SQLAlchemy-style ``:name`` parameters, converted once to
    psycopg's ``%(name)s`` form, so the hot path sends it without building a ``text()``
    construct, compiling it and wrapping its result each time. The SQL Postgres receives
    is the same text with the same parameters."""

    __slots__ = ("driver_sql", "sql")

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.driver_sql = _BIND.sub(r"%(\1)s", sql.replace("%", "%%"))


# Called once per statement sent on the hot path (the round-trip counter listens here: these
# statements do not pass through SQLAlchemy's engine events).
_raw_listeners: weakref.WeakKeyDictionary[Engine, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def on_raw_statement(engine: Engine, listener: Callable[[], None]) -> None:
    _raw_listeners.setdefault(engine, []).append(listener)


class RawConnection:
    """A pooled connection in autocommit mode: each statement is its own transaction."""

    __slots__ = ("_listeners", "driver", "engine")

    def __init__(self, engine: Engine, driver: psycopg.Connection[Any]) -> None:
        self.engine = engine
        self.driver = driver
        self._listeners = _raw_listeners.get(engine, ())

    def execute(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """Every row the statement returns, as named tuples (``row.column``)."""
        for listener in self._listeners:
            listener()
        with self.driver.cursor(row_factory=namedtuple_row) as cur:
            # Prepared on first use on each connection (psycopg's default waits for the
            # sixth): Postgres then parses and plans each guarantee statement once per
            # connection, not on every one of its first five runs. Never behind a
            # transaction pooler (prepare_threshold None): see POOLER_PARAMETER.
            prepare = None if self.driver.prepare_threshold is None else True
            cur.execute(statement.driver_sql, params, prepare=prepare)
            # Not ``cur.description``: it builds a Column object per column on every call,
            # a tenth of a worker's CPU for the 24 columns of a call's load.
            result = cur.pgresult
            returned = result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK
            return cur.fetchall() if returned else []

    def first(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        rows = self.execute(statement, params)
        return rows[0] if rows else None

    def one(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        rows = self.execute(statement, params)
        if len(rows) != 1:
            raise RuntimeError(f"expected one row, got {len(rows)}")
        return rows[0]


@contextmanager
def raw_autocommit(engine: Engine) -> Iterator[RawConnection]:
    """Like ``autocommit``, on the pool's psycopg connection itself, for the guarantee
    statements a worker sends per call: about half the client CPU of a statement through
    SQLAlchemy's ``Connection``. A driver error leaves as the SQLAlchemy exception the
    engine would have raised (``OperationalError``, ``DataError``, …, with
    ``connection_invalidated`` on a lost connection), so ``is_transient``,
    ``translate_errors`` and the retries treat it exactly alike; a lost connection is
    discarded, and so are the pool's other connections older than it (what SQLAlchemy
    does on a disconnect: after a Postgres restart they are all dead)."""
    try:
        fairy = engine.raw_connection()
    except psycopg.Error as exc:
        # A connect refused or cut (a restart, max_connections): the pool hands on the
        # driver's own error here, where ``engine.connect()`` raises SQLAlchemy's
        # OperationalError. Raised as that one, so the retries ride it out like a lost
        # connection and the worker never mistakes it for a bug of its own.
        raise DBAPIError.instance(
            None, None, exc, psycopg.Error, hide_parameters=True, dialect=engine.dialect
        ) from exc
    driver: Any = fairy.driver_connection
    try:
        driver.autocommit = True
        yield RawConnection(engine, driver)
    except psycopg.Error as exc:
        lost = bool(driver.closed or driver.broken)
        if lost:
            engine.pool._invalidate(fairy, exc)
        raise DBAPIError.instance(
            None,
            None,
            exc,
            psycopg.Error,
            hide_parameters=True,
            connection_invalidated=lost,
            dialect=engine.dialect,
        ) from exc
    finally:
        if not (driver.closed or driver.broken):
            # The pool's other users expect a connection that opens transactions.
            driver.autocommit = False
        fairy.close()
