"""Settings of ``callgate api`` (``CALLGATE_API_HOST`` and the rest of its section), declared
like every other variable (callgate/core/settings.py; docs/configuration.md)."""

from __future__ import annotations

import secrets

from pydantic import FiniteFloat, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from callgate.core.settings import MAX_PORT, Flag, Section, setting

# A request body larger than this is refused before it is parsed (a turn is at most
# CALLGATE_MAX_TURN_CALLS calls; no real one comes near this). CALLGATE_API_MAX_BODY_BYTES
# may lower it.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Every other route's body: a sign-in is one key, the rest take none.
SMALL_BODY_BYTES = 64 * 1024


class ApiSettings(Section):
    model_config = SettingsConfigDict(env_prefix=f"{Section.model_config['env_prefix']}API_")

    host: str = setting("127.0.0.1", "Address the HTTP API listens on.")
    port: int = setting(8000, "Port the HTTP API listens on.", ge=1, le=MAX_PORT)
    # Token bucket per key: ``rate`` requests per second refill, at most ``burst`` at once.
    rate: FiniteFloat = setting(
        10.0, "Requests per second one API key may make on average.", ge=0.001
    )
    burst: int = setting(20, "Requests one API key may make at once.", ge=1)
    # A wait holds no thread (it awaits the turn's Redis stream), but it holds a connection
    # and a Redis read: hence a cap per key and process (429 ``too_many_waits`` past it).
    max_wait: FiniteFloat = setting(
        30.0, "Longest wait, in seconds, of GET /v1/turns/{id}/results.", ge=0
    )
    max_waits_per_key: int = setting(
        10, "Long-polls one key may have waiting at once in one API process.", ge=1
    )
    # A wait's stream read holds one connection of the process's asyncio Redis pool, and
    # redis-py answers a read past the pool "Too many connections", which fan-in would take
    # for Redis being away (a PostgreSQL re-read a second per wait, and a warning each):
    # hence a bound on the process's waits below the pool (429 ``too_many_waits`` past it).
    redis_pool: int = setting(
        100, "Connections of the API process's asyncio Redis pool (long-polls' reads).", ge=2
    )
    max_waits: int | None = setting(
        None,
        "Long-polls one API process may have waiting at once (default: the Redis pool "
        "less a tenth).",
        ge=1,
        accepts="a whole number, at least 1 and below CALLGATE_API_REDIS_POOL (default 100)",
    )
    # One tenant's keys, each inside its own cap, could otherwise hold every wait of the
    # process: below 1, another tenant's first wait always finds a slot.
    tenant_wait_share: FiniteFloat = setting(
        0.5,
        "Fraction of CALLGATE_API_MAX_WAITS one tenant may hold at once (at least one wait).",
        ge=0.01,
        le=1,
    )
    # The largest body of POST /v1/turns (every other route: SMALL_BODY_BYTES).
    max_body_bytes: int = setting(
        MAX_BODY_BYTES,
        "Largest body of POST /v1/turns, in bytes.",
        ge=SMALL_BODY_BYTES,
        le=MAX_BODY_BYTES,
    )
    # Signs console session cookies and CSRF tokens; random per process when unset.
    session_secret: bytes = setting(
        help="Signs the console's sessions; the same on every API process (default: random).",
        default_factory=lambda: secrets.token_bytes(32),
        min_length=32,
        secret=True,
        accepts="at least 32 characters (random)",
    )
    session_seconds: FiniteFloat = setting(
        8 * 3600.0, "How long a console session lasts, in seconds.", ge=60
    )
    # uvicorn itself never times a request head out.
    header_timeout: FiniteFloat = setting(
        10.0, "Seconds a connection has to send a whole request head.", ge=0.1
    )
    # Nor a body: a client trickling one (a key or none) would hold its connection forever.
    body_timeout: FiniteFloat = setting(
        30.0, "Seconds a request has to send its whole body, from its head.", ge=0.1
    )
    keep_alive: int = setting(5, "Seconds an idle keep-alive connection stays open.", ge=1)
    # /docs loads Swagger UI from a public CDN on the console's origin: off unless asked.
    docs: Flag = setting(False, "Serve Swagger UI at /docs (loads its script from a CDN).")

    @field_validator("max_waits")
    @classmethod
    def _below_the_pool(cls, waits: int | None, info: ValidationInfo) -> int | None:
        pool = info.data.get("redis_pool")
        if waits is not None and pool is not None and waits >= pool:
            raise ValueError("not below the Redis pool")
        return waits

    @property
    def wait_bound(self) -> int:
        """Long-polls this process takes at once: CALLGATE_API_MAX_WAITS, or the pool less a
        tenth (at least one connection to spare), so no wait ever finds the pool empty."""
        if self.max_waits is not None:
            return self.max_waits
        return self.redis_pool - max(1, self.redis_pool // 10)

    @property
    def max_body(self) -> int:
        return self.max_body_bytes

    def with_address(self, host: str | None, port: int | None) -> ApiSettings:
        return self.replace(
            host=self.host if host is None else host,
            port=self.port if port is None else port,
        )
