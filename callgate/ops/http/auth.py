"""Who a request acts for, how often it may, and the console's session and CSRF token.

- ``Authorization: Bearer KEY``: the principal (tenant, user, roles) is read from the key's
  row on every request (a revoked key is refused at once); nothing in a body names it.
- Rate limit: a token bucket per key, kept in Redis and moved by one Lua script. Redis, so
  every ``callgate api`` process behind a load balancer draws on the same bucket (a limit
  per process would multiply with the processes), and the script makes read-refill-take
  atomic on Redis' own clock. Losing Redis loses only the buckets (they refill full); it
  never touches a guarantee, which all live in Postgres. While Redis is down, requests are
  refused with ``redis_unavailable`` rather than let through unlimited.
- The console's session is a signed cookie holding the key id, an expiry and a nonce,
  never the key; HttpOnly, SameSite=Strict. The server keeps the nonce's hash, one session
  per key: signing out deletes it and a new sign-in replaces it, so a copied cookie dies.
  Its CSRF token is an HMAC of the cookie, sent back in the ``X-CSRF-Token`` header of
  every state-changing request.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass

import redis

from callgate.core.errors import AccessError, ErrorCode
from callgate.queue import transport
from callgate.store.api_keys import KeyHolder

# KEYS[1] the bucket; ARGV rate (tokens/s), burst. Returns {allowed, seconds to wait}.
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring(wait)}
"""


def bearer_key(authorization: str | None) -> str:
    """The key of an ``Authorization: Bearer KEY`` header; ``unauthenticated`` otherwise."""
    if not authorization:
        raise AccessError("send the API key as Authorization: Bearer KEY")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AccessError("send the API key as Authorization: Bearer KEY")
    return key.strip()


def require_approver(principal: KeyHolder, doing: str = "deciding approvals") -> None:
    """``role_required`` unless the key may see and decide its tenant's approvals; ``doing``
    names what was asked (listing, reading, deciding, signing in to the console)."""
    if not principal.approver:
        raise AccessError(
            f"{doing} needs a key with the approver role for {principal.tenant_id}",
            code=ErrorCode.ROLE_REQUIRED,
        )


@dataclass
class RateLimiter:
    connection: redis.Redis
    queue: str
    rate: float
    burst: int

    def __post_init__(self) -> None:
        self._script = self.connection.register_script(TOKEN_BUCKET_LUA)

    def take(self, principal: KeyHolder) -> None:
        """Take one token of the key's bucket, or refuse with ``rate_limited``."""
        rate = principal.rate or self.rate
        burst = principal.burst or self.burst
        with transport.translate_errors("rate limit"):
            allowed, wait = self._script(
                keys=[transport.api_bucket(self.queue, principal.key_id)], args=[rate, burst]
            )
        if not int(allowed):
            seconds = float(wait)
            raise AccessError(
                f"key {principal.key_id} is over its rate ({rate:g}/s, burst {burst}); "
                f"retry in {seconds:.1f}s",
                code=ErrorCode.RATE_LIMITED,
                retry_after=seconds,
            )


# --- console sessions --------------------------------------------------------------------

SESSION_COOKIE = "callgate_session"


def _sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def new_session(secret: bytes, key_id: str, lifetime: float) -> tuple[str, str]:
    """A cookie value naming the key id (never the key), valid for ``lifetime`` seconds,
    and its nonce: the server keeps the nonce's hash, and the session lives as long as
    that row (``api_keys.open_session``), so signing out ends it."""
    nonce = secrets.token_hex(16)
    body = f"{key_id}.{int(time.time() + lifetime)}.{nonce}"
    return f"{body}.{_sign(secret, 'session|' + body)}", nonce


def session_of(secret: bytes, cookie: str | None) -> tuple[str, str]:
    """The key id and nonce of a well-signed, unexpired session cookie; ``unauthenticated``
    otherwise. Whether the session is still open is the server's row's to say."""
    if not cookie:
        raise AccessError("sign in with an approver's key")
    body, _, signature = cookie.rpartition(".")
    parts = body.split(".")
    if len(parts) != 3 or not hmac.compare_digest(signature, _sign(secret, "session|" + body)):
        raise AccessError("the session is not valid; sign in again")
    key_id, expires, nonce = parts
    if not expires.isdigit() or int(expires) < time.time():
        raise AccessError("the session expired; sign in again")
    return key_id, nonce


def csrf_token(secret: bytes, cookie: str) -> str:
    return _sign(secret, "csrf|" + cookie)


def check_csrf(secret: bytes, cookie: str | None, token: str | None) -> None:
    if not cookie or not token or not hmac.compare_digest(token, csrf_token(secret, cookie)):
        raise AccessError(
            "missing or wrong X-CSRF-Token; reload the console", code=ErrorCode.CSRF_FAILED
        )


# --- long-poll slots -----------------------------------------------------------------------


class WaitSlots:
    """How many long-polls each key, each tenant and the whole process has waiting; capped
    for all three, under one lock (the event loop's thread takes them; the lock keeps the
    counts whole should a thread ever take one too).

    A wait holds no thread, but it holds a connection, a task and a Redis read for up to
    ``CALLGATE_API_MAX_WAIT``: without a cap, one key within its rate could open thousands.
    The process's bound is what its asyncio Redis pool can serve: a key's cap alone does not
    bound it (many keys, each inside its own), and a read past the pool would not wait, it
    would fail as if Redis were away. A tenant's share of that bound keeps one tenant's keys
    from holding every wait: with ``tenant_share`` below 1, another tenant's first wait
    always finds a slot free while one tenant holds its whole share. Counted in the process,
    because what a wait costs is this process's: behind a load balancer each process caps
    its own."""

    def __init__(self, per_key: int, per_process: int, tenant_share: float = 1.0) -> None:
        self.per_key = per_key
        self.per_process = per_process
        # Rounded first so 0.3 of 10 is 3, not 2.999...; at least one wait each.
        self.per_tenant = max(1, math.floor(round(per_process * tenant_share, 9)))
        self._keys: Counter[str] = Counter()
        self._tenants: Counter[str] = Counter()
        self._total = 0
        self._lock = threading.Lock()

    def take(self, key_id: str, tenant_id: str) -> None:
        """One slot of ``key_id`` (of ``tenant_id``), or ``too_many_waits`` naming the limit
        that was hit; give it back with ``give``."""
        with self._lock:
            refusal = self._refusal(key_id, tenant_id)
            if refusal is not None:
                raise refusal
            self._keys[key_id] += 1
            self._tenants[tenant_id] += 1
            self._total += 1

    def give(self, key_id: str, tenant_id: str) -> None:
        with self._lock:
            self._total -= 1
            for counts, name in ((self._keys, key_id), (self._tenants, tenant_id)):
                counts[name] -= 1
                if counts[name] <= 0:
                    del counts[name]

    def held(self) -> dict[str, int]:
        """Each tenant's waits now (tenants with none are left out)."""
        with self._lock:
            return dict(self._tenants)

    def _refusal(self, key_id: str, tenant_id: str) -> AccessError | None:
        if self._keys[key_id] >= self.per_key:
            return _too_many(
                f"key {key_id} already has {self._keys[key_id]} waiting long-polls (at most "
                f"{self.per_key}, CALLGATE_API_MAX_WAITS_PER_KEY); retry when one ends, or ask "
                "with wait=0",
                "key",
                self.per_key,
            )
        # A share of the whole is the process's bound itself: named as that.
        tenant_bound = self.per_tenant < self.per_process
        if tenant_bound and self._tenants[tenant_id] >= self.per_tenant:
            return _too_many(
                f"tenant {tenant_id} already has {self._tenants[tenant_id]} waiting long-polls "
                f"in this API process (at most {self.per_tenant}: CALLGATE_API_TENANT_WAIT_SHARE "
                "of CALLGATE_API_MAX_WAITS); retry when one ends, or ask with wait=0",
                "tenant",
                self.per_tenant,
            )
        if self._total >= self.per_process:
            return _too_many(
                f"this API process already has {self._total} waiting long-polls (at most "
                f"{self.per_process}, CALLGATE_API_MAX_WAITS); retry in a moment, or ask "
                "with wait=0",
                "process",
                self.per_process,
            )
        return None


def _too_many(message: str, scope: str, limit: int) -> AccessError:
    return AccessError(
        message,
        code=ErrorCode.TOO_MANY_WAITS,
        details=[{"code": "wait_limit", "scope": scope, "limit": limit}],
        retry_after=1.0,
    )
