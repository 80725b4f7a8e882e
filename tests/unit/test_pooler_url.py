"""``?pgbouncer=true`` on the database URL: read once, never sent to libpq, checked."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, event

from callgate.core.errors import ConfigurationError
from callgate.daemons import relayer
from callgate.store import db

POOLED = "postgresql://u:p@pgbouncer:6432/app?pgbouncer=true&sslmode=require"


def test_the_flag_is_taken_off_the_url_the_driver_sees() -> None:
    assert db.behind_transaction_pooler(POOLED)
    assert db.sqlalchemy_url(POOLED) == (
        "postgresql+psycopg://u:p@pgbouncer:6432/app?sslmode=require"
    )
    assert db.libpq_url(POOLED) == "postgresql://u:p@pgbouncer:6432/app?sslmode=require"
    assert not db.behind_transaction_pooler("postgresql://u@db/app")
    assert not db.behind_transaction_pooler("postgresql://u@db/app?pgbouncer=false")


def test_engines_behind_the_pooler_never_prepare() -> None:
    pooled = db.create(POOLED)
    direct = db.create("postgresql://u@db/app")
    try:
        assert _connect_args(pooled)["prepare_threshold"] is None
        assert "prepare_threshold" not in _connect_args(direct)
    finally:
        pooled.dispose()
        direct.dispose()


def _connect_args(engine: Engine) -> dict[str, Any]:
    """What the engine would pass to psycopg.connect, seen by the "do_connect" event (which
    then stops the connect: no server is needed)."""
    seen: dict[str, Any] = {}

    def capture(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        seen.update(cparams)
        raise _Captured

    event.listen(engine, "do_connect", capture)
    with pytest.raises(_Captured):
        engine.connect()
    return seen


class _Captured(Exception):
    pass


@pytest.mark.parametrize("value", ["maybe", "transaction"])
def test_an_unknown_value_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"pgbouncer=.*use pgbouncer=true"):
        db.create(f"postgresql://u@db/app?pgbouncer={value}")


def test_the_relayer_listens_around_the_pooler_or_polls() -> None:
    assert relayer.listen_url("postgresql://u@db/app", None) == "postgresql://u@db/app"
    assert relayer.listen_url(POOLED, None) is None
    assert relayer.listen_url(POOLED, "postgresql://u@db/app") == "postgresql://u@db/app"
