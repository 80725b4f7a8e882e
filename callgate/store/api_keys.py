"""API keys of the HTTP API (``callgate api``), and the answers of idempotent submissions.

A key names one principal: a tenant, a user and roles. It reads ``cgk.KEY_ID.SECRET``; only
the SHA-256 of the secret is stored (the secret is 32 random bytes, so a slow password hash
would add nothing), and the key is shown once, when it is made. A revoked key is refused
from the next request on: every request reads its row.

An ``Idempotency-Key`` on ``POST /v1/turns`` is claimed in one statement per (key, value);
the first request's answer is stored on the claim and replayed to every repeat. A claim
left without an answer (its API process died mid-request) may be taken over after
``STALE_CLAIM_SECONDS``; the turn's operation ids are derived from the idempotency key, so
the takeover's writes reuse the first attempt's operations and never run twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from callgate.core.errors import AccessError, ConfigurationError, ErrorCode, InputError
from callgate.store import db

KEY_PREFIX = "cgk"
KEY_ID = re.compile(r"ak[0-9a-f]{16}")  # what ``create`` makes: never a secret
APPROVER_ROLE = "approver"
# Reads every trace of its tenant (an auditor decides nothing); approvers do too, since they
# judge requests of the whole tenant. Every other key reads only its own user's traces.
AUDITOR_ROLE = "auditor"
STALE_CLAIM_SECONDS = 60.0

CREATE_SQL = """
INSERT INTO callgate.api_keys (key_id, tenant_id, user_id, roles, secret_hash, rate, burst)
VALUES (:key_id, :tenant, :user, :roles, :secret_hash, :rate, :burst)
"""

# The row of a key that is not revoked; the secret is compared in constant time afterwards.
AUTHENTICATE_SQL = """
SELECT key_id, tenant_id, user_id, roles, secret_hash, rate, burst
  FROM callgate.api_keys
 WHERE key_id = :key_id AND revoked_at IS NULL
"""

ACTIVE_KEYS_SQL = "SELECT count(*) FROM callgate.api_keys WHERE revoked_at IS NULL"

REVOKE_SQL = """
UPDATE callgate.api_keys SET revoked_at = now()
 WHERE key_id = :key_id AND revoked_at IS NULL
RETURNING key_id
"""

# Claim (key, Idempotency-Key) for this request, or take over a claim whose request died
# before answering. No row back: another request holds it, or has answered it.
CLAIM_SQL = """
INSERT INTO callgate.api_idempotency (key_id, idempotency_key, request_hash)
VALUES (:key_id, :idem, :request_hash)
ON CONFLICT (key_id, idempotency_key) DO UPDATE SET claimed_at = now()
 WHERE callgate.api_idempotency.response IS NULL
   AND callgate.api_idempotency.request_hash = :request_hash
   AND callgate.api_idempotency.claimed_at < now() - make_interval(secs => :stale)
RETURNING key_id
"""

ANSWER_SQL = """
UPDATE callgate.api_idempotency SET response = CAST(:response AS jsonb)
 WHERE key_id = :key_id AND idempotency_key = :idem AND response IS NULL
"""


@dataclass(frozen=True)
class KeyHolder:
    """Who an API request acts for: read from its key, never from its body."""

    key_id: str
    tenant_id: str
    user_id: str
    roles: tuple[str, ...]
    rate: float | None = None
    burst: int | None = None

    @property
    def approver(self) -> bool:
        return APPROVER_ROLE in self.roles

    @property
    def reads_tenant_traces(self) -> bool:
        return self.approver or AUDITOR_ROLE in self.roles


@dataclass(frozen=True)
class NewKey:
    key_id: str
    key: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse(key: str) -> tuple[str, str]:
    """(key id, secret) of a presented key; ``unauthenticated`` when it is not one."""
    parts = key.strip().split(".")
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        raise AccessError("the API key is malformed (expected cgk.KEY_ID.SECRET)")
    return parts[1], parts[2]


def create(
    engine: Engine,
    *,
    tenant: str,
    user: str,
    roles: list[str],
    rate: float | None = None,
    burst: int | None = None,
) -> NewKey:
    """Make a key for one principal. The returned key is the only copy of its secret."""
    tenant, user = tenant.strip(), user.strip()
    cleaned = sorted({r.strip() for r in roles if r.strip()})
    if not tenant or not user or not cleaned:
        raise InputError("a key needs a tenant, a user and at least one role")
    if rate is not None and not rate > 0:
        raise InputError("--rate must be more than 0 requests per second")
    if burst is not None and burst < 1:
        raise InputError("--burst must be at least 1")
    key_id = "ak" + secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    with db.translate_errors("keys create"), db.autocommit(engine) as conn:
        conn.execute(
            text(CREATE_SQL),
            {
                "key_id": key_id,
                "tenant": tenant,
                "user": user,
                "roles": cleaned,
                "secret_hash": _hash(secret),
                "rate": rate,
                "burst": burst,
            },
        )
    return NewKey(key_id=key_id, key=f"{KEY_PREFIX}.{key_id}.{secret}")


def key_id_of(key_or_id: str) -> str:
    """The key id of a key id or of a whole key (``cgk.KEY_ID.SECRET``); ``unknown_api_key``
    for anything else. A message never repeats what it was given: an operator may paste a
    whole key, or a piece of one, and the error goes to terminals, logs and tickets."""
    value = key_or_id.strip()
    if KEY_ID.fullmatch(value):
        return value
    parts = value.split(".")
    if len(parts) == 3 and parts[0] == KEY_PREFIX and KEY_ID.fullmatch(parts[1]) and parts[2]:
        return parts[1]
    raise AccessError(
        "not a key id (ak followed by 16 hex digits) nor a whole key (cgk.KEY_ID.SECRET); "
        "the value is not repeated here, as it may hold a secret",
        code=ErrorCode.UNKNOWN_API_KEY,
    )


def revoke(engine: Engine, key_or_id: str) -> str:
    """Revoke a key, named by its id or given whole: every request with it is refused from
    now on. Returns the key id."""
    key_id = key_id_of(key_or_id)
    with db.translate_errors("keys revoke"), db.autocommit(engine) as conn:
        row = conn.execute(text(REVOKE_SQL), {"key_id": key_id}).first()
    if row is None:
        raise AccessError(
            f"no key {key_id} that is not already revoked", code=ErrorCode.UNKNOWN_API_KEY
        )
    return key_id


def authenticate(engine: Engine, key: str) -> KeyHolder:
    """The principal of a presented key; ``unauthenticated`` for an unknown, revoked or
    wrong one (the same words for each: no oracle)."""
    key_id, secret = parse(key)
    with db.translate_errors("authenticate"), db.autocommit(engine) as conn:
        row = conn.execute(text(AUTHENTICATE_SQL), {"key_id": key_id}).first()
    if row is None or not hmac.compare_digest(row.secret_hash, _hash(secret)):
        raise AccessError("the API key is unknown or revoked")
    return KeyHolder(
        key_id=row.key_id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        roles=tuple(row.roles),
        rate=row.rate,
        burst=row.burst,
    )


# --- console sessions ------------------------------------------------------------------------

# One session per key: a sign-in replaces the key's session (the primary key is the key id),
# so an earlier session, or a cookie copied from it, stops working.
OPEN_SESSION_SQL = """
INSERT INTO callgate.console_sessions (key_id, session_hash, expires_at)
VALUES (:key_id, :session_hash, now() + make_interval(secs => :lifetime))
ON CONFLICT (key_id) DO UPDATE
   SET session_hash = EXCLUDED.session_hash, created_at = now(), expires_at = EXCLUDED.expires_at
"""

# The principal of a live session: the session's row exists and has not expired, and its
# key is not revoked. Signing out deleted the row; revoking the key ends it too.
SESSION_PRINCIPAL_SQL = """
SELECT k.key_id, k.tenant_id, k.user_id, k.roles, k.rate, k.burst
  FROM callgate.console_sessions s
  JOIN callgate.api_keys k USING (key_id)
 WHERE s.key_id = :key_id AND s.session_hash = :session_hash
   AND s.expires_at > now() AND k.revoked_at IS NULL
"""

END_SESSION_SQL = """
DELETE FROM callgate.console_sessions WHERE key_id = :key_id AND session_hash = :session_hash
"""


def open_session(engine: Engine, key_id: str, nonce: str, lifetime: float) -> None:
    """Record the key's console session (ending its earlier one), for ``lifetime`` seconds."""
    with db.translate_errors("console session"), db.autocommit(engine) as conn:
        conn.execute(
            text(OPEN_SESSION_SQL),
            {"key_id": key_id, "session_hash": _hash(nonce), "lifetime": lifetime},
        )


def session_principal(engine: Engine, key_id: str, nonce: str) -> KeyHolder:
    """The principal of a live console session; ``unauthenticated`` once it was signed out,
    replaced by a newer sign-in, expired, or its key revoked."""
    with db.translate_errors("console session"), db.autocommit(engine) as conn:
        row = conn.execute(
            text(SESSION_PRINCIPAL_SQL), {"key_id": key_id, "session_hash": _hash(nonce)}
        ).first()
    if row is None:
        raise AccessError("the session has ended (signed out, or signed in again); sign in")
    return KeyHolder(
        key_id=row.key_id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        roles=tuple(row.roles),
        rate=row.rate,
        burst=row.burst,
    )


def end_session(engine: Engine, key_id: str, nonce: str) -> None:
    """Sign out: the session's row is deleted, so its cookie, wherever it was copied, is
    refused from the next request on."""
    with db.translate_errors("console session"), db.autocommit(engine) as conn:
        conn.execute(text(END_SESSION_SQL), {"key_id": key_id, "session_hash": _hash(nonce)})


# --- idempotent submissions ------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """``claimed``: this request runs the submission. Otherwise ``response`` is the first
    request's answer, or None while that request is still running."""

    claimed: bool
    response: dict[str, Any] | None = None


def request_hash(body: bytes, query: str) -> str:
    return hashlib.sha256(query.encode() + b"\n" + body).hexdigest()


def claim(engine: Engine, key_id: str, idem: str, digest: str) -> Claim:
    """Claim an Idempotency-Key for one request. The same key with another body is
    ``idempotency_conflict``."""
    with db.translate_errors("idempotency"), db.autocommit(engine) as conn:
        if conn.execute(
            text(CLAIM_SQL),
            {"key_id": key_id, "idem": idem, "request_hash": digest, "stale": STALE_CLAIM_SECONDS},
        ).first():
            return Claim(claimed=True)
        row = conn.execute(
            text(
                "SELECT request_hash, response FROM callgate.api_idempotency"
                " WHERE key_id = :key_id AND idempotency_key = :idem"
            ),
            {"key_id": key_id, "idem": idem},
        ).one()
    if row.request_hash != digest:
        raise InputError(
            f"Idempotency-Key {idem!r} was used with another request; use a new key",
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
        )
    return Claim(claimed=False, response=row.response)


def answer(engine: Engine, key_id: str, idem: str, response: dict[str, Any]) -> None:
    """Store the claimed request's answer for its repeats."""
    with db.translate_errors("idempotency"), db.autocommit(engine) as conn:
        conn.execute(
            text(ANSWER_SQL),
            {"key_id": key_id, "idem": idem, "response": json.dumps(response)},
        )


def release(engine: Engine, key_id: str, idem: str) -> None:
    """Drop an unanswered claim after a refusal, so the client may send a corrected request."""
    with db.translate_errors("idempotency"), db.autocommit(engine) as conn:
        conn.execute(
            text(
                "DELETE FROM callgate.api_idempotency WHERE key_id = :key_id"
                " AND idempotency_key = :idem AND response IS NULL"
            ),
            {"key_id": key_id, "idem": idem},
        )


def active_keys(engine: Engine) -> int:
    """Keys not revoked. Refuses (``invalid_configuration``) when the keys' table is missing:
    a server that authenticates with keys must not start on a database that cannot hold any."""
    try:
        with db.translate_errors("api keys"), db.autocommit(engine) as conn:
            return int(conn.execute(text(ACTIVE_KEYS_SQL)).scalar_one())
    except ProgrammingError as exc:
        raise ConfigurationError(
            "callgate.api_keys is missing: run callgate migrate before serving with API keys"
        ) from exc
