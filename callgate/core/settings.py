"""Settings, each mirrored by a ``CALLGATE_…`` environment variable.

Read once per process. A bad value is a ``ConfigurationError`` naming the variable.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Self

from callgate.core.errors import ConfigurationError

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _float(env: dict[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise ConfigurationError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _int(
    env: dict[str, str], name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigurationError(f"{name}={raw!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(f"{name}={raw!r} must be at most {maximum}")
    return value


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _bool(env: dict[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")


MAX_PORT = 65535


def metrics_port(raw: str, name: str = "CALLGATE_METRICS_PORT") -> int:
    """A TCP port for /metrics, 0 for none; anything else is a ConfigurationError."""
    return _int({name: raw}, name, 0, minimum=0, maximum=MAX_PORT)


# Submit's caps (see producer/validation.py). A call's arguments are stored as one jsonb
# value, and PostgreSQL's jsonb holds at most 255 MB; a tool call anywhere near that is not
# one, so the cap itself is capped.
DEFAULT_MAX_CALL_BYTES = 256 * 1024
MAX_CALL_BYTES_CEILING = 64 * 1024 * 1024
DEFAULT_MAX_TURN_CALLS = 128
# Each call in flight holds a thread and up to two Postgres connections.
MAX_WORKER_CONCURRENCY = 256


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    redis_url: str | None
    downstream_database_url: str | None
    queue: str = "callgate"
    lease_seconds: float = 30.0
    sweep_seconds: float = 5.0
    stale_seconds: float = 60.0
    # How long the next write of a turn may go undispatched after its previous write ended
    # before a sweeper looks for its job in Redis (its dispatcher may have died).
    successor_grace_seconds: float = 5.0
    relayer_batch: int = 100
    job_timeout_seconds: float = 300.0
    turn_call_budget: int = 32
    conversation_call_budget: int = 256
    max_dispatches: int = 10
    # A delivery's retry budget for its handler: attempts, and seconds of retrying.
    retry_attempts: int = 3
    retry_budget_seconds: float = 10.0
    worker_concurrency: int = 8
    worker_grace_seconds: float = 30.0
    # Each worker process also sweeps, on a thread: recovery does not hang on one process.
    worker_sweep: bool = True
    # ``module:attribute`` of the tool registry and the allowlist override; loaded (and
    # required) only by the processes that run or plan tools: workers and producers.
    tools: str | None = None
    allowlist: str | None = None
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES
    max_turn_calls: int = DEFAULT_MAX_TURN_CALLS
    # /metrics: the port this process serves it on (0: not served) and the address it binds.
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"
    # Serve the gauges read from Postgres and Redis; None: the command's default (the
    # sweeper serves them, other processes do not).
    state_metrics: bool | None = None
    # CALLGATE_MCP_CONFIG: a JSON file of MCP servers whose tools join the registry.
    mcp_config: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Self:
        env = dict(os.environ if env is None else env)
        queue = env.get("CALLGATE_QUEUE") or "callgate"
        if not _QUEUE_NAME.match(queue):
            raise ConfigurationError(
                f"CALLGATE_QUEUE={queue!r}: use 1-64 letters, digits, '_', '-' or '.'"
            )
        lease = _float(env, "CALLGATE_LEASE_SECONDS", 30.0, minimum=0.5)
        return cls(
            database_url=env.get("CALLGATE_DATABASE_URL") or None,
            redis_url=env.get("CALLGATE_REDIS_URL") or None,
            downstream_database_url=env.get("CALLGATE_DOWNSTREAM_DATABASE_URL") or None,
            queue=queue,
            lease_seconds=lease,
            sweep_seconds=_float(env, "CALLGATE_SWEEP_SECONDS", 5.0, minimum=0.05),
            stale_seconds=_float(env, "CALLGATE_STALE_SECONDS", 60.0, minimum=0.1),
            successor_grace_seconds=_float(
                env, "CALLGATE_SUCCESSOR_GRACE_SECONDS", 5.0, minimum=0.1
            ),
            relayer_batch=_int(env, "CALLGATE_RELAYER_BATCH", 100, minimum=1),
            job_timeout_seconds=_float(env, "CALLGATE_JOB_TIMEOUT_SECONDS", 300.0, minimum=1),
            turn_call_budget=_int(env, "CALLGATE_TURN_CALL_BUDGET", 32, minimum=1),
            conversation_call_budget=_int(env, "CALLGATE_CONVERSATION_CALL_BUDGET", 256, minimum=1),
            max_dispatches=_int(env, "CALLGATE_MAX_DISPATCHES", 10, minimum=1),
            retry_attempts=_int(env, "CALLGATE_RETRY_ATTEMPTS", 3, minimum=1, maximum=100),
            retry_budget_seconds=_float(env, "CALLGATE_RETRY_BUDGET_SECONDS", 10.0, minimum=0),
            worker_concurrency=_int(
                env, "CALLGATE_WORKER_CONCURRENCY", 8, minimum=1, maximum=MAX_WORKER_CONCURRENCY
            ),
            worker_grace_seconds=_float(env, "CALLGATE_WORKER_GRACE_SECONDS", 30.0, minimum=0),
            worker_sweep=_bool(env, "CALLGATE_WORKER_SWEEP") is not False,
            tools=env.get("CALLGATE_TOOLS") or None,
            allowlist=env.get("CALLGATE_ALLOWLIST") or None,
            max_call_bytes=_int(
                env,
                "CALLGATE_MAX_CALL_BYTES",
                DEFAULT_MAX_CALL_BYTES,
                minimum=64,
                maximum=MAX_CALL_BYTES_CEILING,
            ),
            max_turn_calls=_int(
                env, "CALLGATE_MAX_TURN_CALLS", DEFAULT_MAX_TURN_CALLS, minimum=1, maximum=10_000
            ),
            metrics_port=_int(env, "CALLGATE_METRICS_PORT", 0, minimum=0, maximum=MAX_PORT),
            metrics_host=(env.get("CALLGATE_METRICS_HOST") or "0.0.0.0").strip(),
            state_metrics=_bool(env, "CALLGATE_STATE_METRICS"),
            mcp_config=env.get("CALLGATE_MCP_CONFIG") or None,
        )

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                "CALLGATE_DATABASE_URL is not set (e.g. postgresql://127.0.0.1:5432/test); "
                "'callgate demo' and 'callgate up' start an embedded one when it is unset"
            )
        return self.database_url

    def require_redis(self) -> str:
        if not self.redis_url:
            raise ConfigurationError(
                "CALLGATE_REDIS_URL is not set (e.g. redis://127.0.0.1:6379/0); "
                "'callgate demo' and 'callgate up' start an embedded one when it is unset"
            )
        return self.redis_url

    def downstream_url(self) -> str:
        return self.downstream_database_url or self.require_database()

    def with_services(self, database_url: str, redis_url: str) -> Settings:
        return replace(self, database_url=database_url, redis_url=redis_url)
