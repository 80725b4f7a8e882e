"""Connections to Postgres, and the one place driver errors become callgate errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psycopg
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DataError, DBAPIError, IntegrityError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from callgate.store.errors import ConfigurationError, InputError, ServiceUnavailable

_T = TypeVar("_T")


def sqlalchemy_url(url: str) -> str:
    """Accept libpq-style ``postgresql://`` URLs and pin the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(f"not a database URL: {url!r}") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(f"callgate needs PostgreSQL, got {parsed.drivername!r}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL in the form psycopg.connect() takes (for LISTEN connections)."""
    parsed = make_url(sqlalchemy_url(url))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def create(url: str, *, pool_size: int = 2, application_name: str = "callgate") -> Engine:
    return create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max(4, pool_size),
        # No pre-ping: it would cost a round trip per checkout on the hot path. A connection
        # broken by a Postgres restart fails its statement and is discarded; the job is
        # re-run by the sweeper.
        pool_recycle=600,
        connect_args={"application_name": application_name, "connect_timeout": 5},
    )


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
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise ServiceUnavailable(f"{what}: lost the PostgreSQL connection") from exc
        raise


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


def is_transient(exc: BaseException) -> bool:
    """A failure the same statement may not meet again: a lost or terminated connection, a
    deadlock or serialization abort. Not bad data, not a constraint violation."""
    if isinstance(exc, OperationalError):  # includes deadlock_detected, admin_shutdown
        return not isinstance(exc.orig, psycopg.errors.ProgramLimitExceeded)  # a value too big
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


TRANSIENT_ATTEMPTS = 5


def retry_transient(attempt: Callable[[], _T]) -> _T:
    """Run ``attempt`` (one guarded, self-contained statement), again on a transient failure.

    Only for statements that are safe to repeat: each guarantee statement is guarded on the
    state it moves from, so a repeat after a commit whose reply was lost changes nothing.
    """
    retrying = Retrying(
        stop=stop_after_attempt(TRANSIENT_ATTEMPTS),
        wait=wait_exponential(multiplier=0.05, max=1),
        retry=retry_if_exception(is_transient),
        reraise=True,
    )
    return retrying(attempt)
