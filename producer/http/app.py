"""The ASGI app of ``callgate api`` and the services its routes share."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine

from callgate.producer import Producer
from callgate.producer.http import console, problems, routes
from callgate.producer.http.auth import RateLimiter
from callgate.producer.http.settings import ApiSettings
from callgate.store import transport
from callgate.store.errors import CallgateError
from callgate.store.settings import Settings

log = logging.getLogger("callgate.api")

DESCRIPTION = """\
Submit a model's proposed tool calls, collect their correlated results, list the tools a
principal may be shown, decide approval requests and read audit traces.

Every request carries `Authorization: Bearer KEY` (`callgate keys create`); its tenant, user
and roles come from the key, never from the body. Errors are RFC 9457 problem details
(`application/problem+json`) with callgate's stable `code`.
"""


@dataclass
class Services:
    """One producer (its engine and Redis connection are shared by every request), the
    rate limiter and the API's settings."""

    producer: Producer
    limiter: RateLimiter
    api: ApiSettings

    @property
    def engine(self) -> Engine:
        return self.producer.engine

    def dispatch(self, refs: list[uuid.UUID]) -> None:
        """Enqueue calls a decision made runnable. The decision is committed already: if
        Redis fails here, the sweeper dispatches them (as for ``callgate approvals``)."""
        if not refs:
            return
        try:
            transport.enqueue_calls(
                self.producer.queue, refs, timeout=self.producer.settings.job_timeout_seconds
            )
        except CallgateError as exc:
            log.warning(
                "api: %s: %d call(s) decided but not enqueued; the sweeper dispatches them",
                exc.code,
                len(refs),
            )


def create_app(settings: Settings, api: ApiSettings) -> FastAPI:
    """The API and the console on ``settings``' Postgres, Redis and registry."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        producer = Producer.from_env(settings)
        app.state.services = Services(
            producer=producer,
            limiter=RateLimiter(producer.redis, settings.queue, api.rate, api.burst),
            api=api,
        )
        try:
            yield
        finally:
            producer.close()

    app = FastAPI(
        title="callgate",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    problems.install(app)
    app.include_router(routes.router)
    app.include_router(console.router)
    make_document = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = problems.tidy_openapi(make_document())
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    return app
