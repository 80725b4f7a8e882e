"""Fixtures for fault tests (``pg_proxy``, ``redis_proxy``) and the fault matrix's summary;
tests/conftest.py registers this module as a plugin, so every test can ask for them by name
(never import it: pytest must rewrite it first)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import ADMIN_URL, REDIS_URL
from tests.faults import sweep
from tests.faults.pgproxy import PgProxy
from tests.faults.redisproxy import RedisProxy


def _upstream(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


@pytest.fixture
def pg_proxy() -> Iterator[PgProxy]:
    """A Postgres proxy in front of the test server; ``pg_proxy.url(database_url)``."""
    proxy = PgProxy(*_upstream(ADMIN_URL, 5432))
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def redis_proxy() -> Iterator[RedisProxy]:
    """A Redis proxy in front of the test server; ``redis_proxy.url(redis_url)``."""
    proxy = RedisProxy(*_upstream(REDIS_URL, 6379))
    proxy.start()
    yield proxy
    proxy.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The fault matrix of the cells this run took (round trip × fault → outcome), also
    written with every cell's evidence to ``<basetemp>/fault-matrix.md``."""
    if not sweep.RESULTS:
        return
    table = sweep.render(sweep.RESULTS)
    terminalreporter.section("fault matrix")
    for line in table.splitlines():
        terminalreporter.write_line(line)
    path = Path(str(config._tmp_path_factory.getbasetemp())) / "fault-matrix.md"  # type: ignore[attr-defined]
    details = "\n\n".join(r.message() for r in sweep.RESULTS)
    path.write_text(f"{table}\n\n{details}\n")
    terminalreporter.write_line(f"(each cell's evidence: {path})")
