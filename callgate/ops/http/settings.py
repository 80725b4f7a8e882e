"""Settings of ``callgate api``, each an environment variable (docs/configuration.md)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Self

from callgate.core.errors import ConfigurationError
from callgate.core.settings import MAX_PORT, _bool, _float, _int

# A request body larger than this is refused before it is parsed (a turn is at most
# CALLGATE_MAX_TURN_CALLS calls; no real one comes near this). CALLGATE_API_MAX_BODY_BYTES
# may lower it.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Every other route's body: a sign-in is one key, the rest take none.
SMALL_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class ApiSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Token bucket per key: ``rate`` requests per second refill, at most ``burst`` at once.
    rate: float = 10.0
    burst: int = 20
    # Longest ``wait`` of GET /v1/turns/{id}/results. A wait holds no thread (it awaits the
    # turn's Redis stream), but it holds a connection and a Redis read: each key may have
    # at most ``max_waits_per_key`` at once in one process (429 ``too_many_waits`` past it).
    max_wait: float = 30.0
    max_waits_per_key: int = 10
    # The largest body of POST /v1/turns (every other route: SMALL_BODY_BYTES).
    max_body: int = MAX_BODY_BYTES
    # Signs console session cookies and CSRF tokens; random per process when unset.
    session_secret: bytes = b""
    session_seconds: float = 8 * 3600.0
    # A connection whose request headers are not whole this many seconds after it opened
    # (or after its previous answer) is closed: uvicorn itself never times a head out.
    header_timeout: float = 10.0
    # An idle keep-alive connection is closed after this many seconds.
    keep_alive: int = 5
    # /docs loads Swagger UI from a public CDN on the console's origin: off unless asked.
    docs: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Self:
        secret = env.get("CALLGATE_API_SESSION_SECRET") or ""
        if secret and len(secret) < 32:
            raise ConfigurationError(
                "CALLGATE_API_SESSION_SECRET must be at least 32 characters (random)"
            )
        return cls(
            host=(env.get("CALLGATE_API_HOST") or "127.0.0.1").strip(),
            port=_int(env, "CALLGATE_API_PORT", 8000, minimum=1, maximum=MAX_PORT),
            rate=_float(env, "CALLGATE_API_RATE", 10.0, minimum=0.001),
            burst=_int(env, "CALLGATE_API_BURST", 20, minimum=1),
            max_wait=_float(env, "CALLGATE_API_MAX_WAIT", 30.0, minimum=0),
            max_waits_per_key=_int(env, "CALLGATE_API_MAX_WAITS_PER_KEY", 10, minimum=1),
            max_body=_int(
                env,
                "CALLGATE_API_MAX_BODY_BYTES",
                MAX_BODY_BYTES,
                minimum=SMALL_BODY_BYTES,
                maximum=MAX_BODY_BYTES,
            ),
            session_secret=secret.encode() or secrets.token_bytes(32),
            session_seconds=_float(env, "CALLGATE_API_SESSION_SECONDS", 8 * 3600.0, minimum=60),
            header_timeout=_float(env, "CALLGATE_API_HEADER_TIMEOUT", 10.0, minimum=0.1),
            keep_alive=_int(env, "CALLGATE_API_KEEP_ALIVE", 5, minimum=1),
            docs=bool(_bool(env, "CALLGATE_API_DOCS")),
        )

    def with_address(self, host: str | None, port: int | None) -> ApiSettings:
        return replace(
            self,
            host=self.host if host is None else host,
            port=self.port if port is None else port,
        )
