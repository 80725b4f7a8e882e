"""Two demo downstream providers, a payments provider and a mail provider.

They stand in for external services: their own Postgres schema ``downstream``, their own
connection, their own commits. Both honour idempotency keys (same key + same request → the
first response; same key + different request → conflict) and fencing (a write carrying a
smaller token than one already seen for its key is rejected). Every applied side effect is
exactly one row of ``downstream.side_effects``: the ground truth that tests count.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

from store.errors import ErrorCode, StaleFence, ToolError

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS downstream;
CREATE TABLE IF NOT EXISTS downstream.payments (
    payment_id  text PRIMARY KEY,
    order_id    text NOT NULL UNIQUE,
    tenant_id   text NOT NULL,
    merchant_id text NOT NULL,
    amount      bigint NOT NULL CHECK (amount > 0),
    currency    text NOT NULL,
    refunded    bigint NOT NULL DEFAULT 0,
    CHECK (refunded >= 0 AND refunded <= amount)
);
CREATE TABLE IF NOT EXISTS downstream.refunds (
    refund_id       text PRIMARY KEY,
    payment_id      text NOT NULL REFERENCES downstream.payments,
    amount          bigint NOT NULL,
    currency        text NOT NULL,
    idempotency_key text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS downstream.messages (
    message_id      text PRIMARY KEY,
    tenant_id       text NOT NULL,
    recipient       text NOT NULL,
    template        text NOT NULL,
    idempotency_key text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS downstream.idempotency (
    service         text NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint     text NOT NULL,
    max_fence       bigint NOT NULL,
    response        jsonb,
    PRIMARY KEY (service, idempotency_key)
);
CREATE TABLE IF NOT EXISTS downstream.side_effects (
    id              bigserial PRIMARY KEY,
    service         text NOT NULL,
    idempotency_key text NOT NULL,
    resource_id     text NOT NULL,
    action          text NOT NULL,
    fencing_token   bigint NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS downstream.rejections (
    id              bigserial PRIMARY KEY,
    service         text NOT NULL,
    idempotency_key text NOT NULL,
    reason          text NOT NULL,
    fencing_token   bigint NOT NULL,
    at              timestamptz NOT NULL DEFAULT now()
);
"""

SEED_PAYMENTS = [
    # payment_id, order_id, tenant, merchant, amount, currency
    ("pay-O-17", "O-17", "tenant-a", "merchant-a", 12_000, "KRW"),
    ("pay-O-42", "O-42", "tenant-b", "merchant-b", 30_000, "KRW"),
]


def install(engine: Engine, *, reset: bool = False) -> None:
    """Create the demo schema and seed it. ``reset`` empties it first (demo runs)."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('callgate.downstream'))"))
        for statement in SCHEMA_SQL.split(";"):
            if statement.strip():
                conn.execute(text(statement))
        if reset:
            conn.execute(
                text(
                    "TRUNCATE downstream.refunds, downstream.messages, downstream.idempotency,"
                    " downstream.side_effects, downstream.rejections, downstream.payments"
                )
            )
        for row in SEED_PAYMENTS:
            conn.execute(
                text(
                    "INSERT INTO downstream.payments"
                    " (payment_id, order_id, tenant_id, merchant_id, amount, currency)"
                    " VALUES (:p, :o, :t, :m, :a, :c) ON CONFLICT DO NOTHING"
                ),
                dict(zip("potmac", row, strict=True)),
            )


def _fingerprint(request: dict[str, Any]) -> str:
    raw = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


class Provider:
    """The idempotency and fencing contract, shared by both demo services."""

    def __init__(self, engine: Engine, service: str) -> None:
        self.engine = engine
        self.service = service

    def call(
        self,
        *,
        key: str,
        fence: int,
        request: dict[str, Any],
        apply: Callable[[Connection], dict[str, Any]],
    ) -> dict[str, Any]:
        """Run ``apply`` at most once per key, in one downstream transaction.

        The key's row is locked for the whole transaction, so two concurrent calls with one
        key serialise here: the second sees the first's response or its larger fence.
        """
        fingerprint = _fingerprint(request)
        refusal: ToolError | None = None
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO downstream.idempotency"
                    " (service, idempotency_key, fingerprint, max_fence)"
                    " VALUES (:s, :k, :f, :fence) ON CONFLICT DO NOTHING"
                ),
                {"s": self.service, "k": key, "f": fingerprint, "fence": fence},
            )
            seen = conn.execute(
                text(
                    "SELECT fingerprint, max_fence, response FROM downstream.idempotency"
                    " WHERE service = :s AND idempotency_key = :k FOR UPDATE"
                ),
                {"s": self.service, "k": key},
            ).one()
            refusal = self._refusal_of(seen, fence, fingerprint)
            if refusal is not None:
                # The rejection is committed (counted) before it is raised.
                self._reject(conn, key, refusal.code.value, fence)
            else:
                response, replayed = self._apply_once(conn, key, fence, seen.response, apply)
        if refusal is not None:
            raise refusal
        return {**response, "replayed": replayed}

    def _apply_once(
        self,
        conn: Connection,
        key: str,
        fence: int,
        stored: dict[str, Any] | None,
        apply: Callable[[Connection], dict[str, Any]],
    ) -> tuple[dict[str, Any], bool]:
        if stored is not None:
            response, replayed = dict(stored), True
        else:
            response, replayed = apply(conn), False
            conn.execute(
                text(
                    "INSERT INTO downstream.side_effects"
                    " (service, idempotency_key, resource_id, action, fencing_token)"
                    " VALUES (:s, :k, :r, :a, :fence)"
                ),
                {
                    "s": self.service,
                    "k": key,
                    "r": response["resource_id"],
                    "a": response["action"],
                    "fence": fence,
                },
            )
        conn.execute(
            text(
                "UPDATE downstream.idempotency SET max_fence = :fence,"
                " response = CAST(:r AS jsonb)"
                " WHERE service = :s AND idempotency_key = :k"
            ),
            {"s": self.service, "k": key, "fence": fence, "r": json.dumps(response)},
        )
        return response, replayed

    @staticmethod
    def _refusal_of(seen: Any, fence: int, fingerprint: str) -> ToolError | None:
        if fence < seen.max_fence:
            return StaleFence(f"fencing token {fence} < {seen.max_fence} already seen")
        if seen.fingerprint != fingerprint:
            return ToolError(
                "this idempotency key was used for a different request",
                code=ErrorCode.IDEMPOTENCY_CONFLICT,
            )
        return None

    def _reject(self, conn: Connection, key: str, reason: str, fence: int) -> None:
        conn.execute(
            text(
                "INSERT INTO downstream.rejections"
                " (service, idempotency_key, reason, fencing_token)"
                " VALUES (:s, :k, :reason, :fence)"
            ),
            {"s": self.service, "k": key, "reason": reason, "fence": fence},
        )


class Payments(Provider):
    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, "payments")

    def refund(
        self, *, key: str, fence: int, tenant_id: str, order_id: str, amount: int, currency: str
    ) -> dict[str, Any]:
        request = {"tenant": tenant_id, "order": order_id, "amount": amount, "currency": currency}

        def apply(conn: Connection) -> dict[str, Any]:
            # The balance check and the write are one statement: concurrent refunds of one
            # payment can never refund more than it in total.
            row = conn.execute(
                text(
                    "UPDATE downstream.payments SET refunded = refunded + :amount"
                    " WHERE order_id = :order AND tenant_id = :tenant AND currency = :currency"
                    "   AND refunded + :amount <= amount"
                    " RETURNING payment_id, amount - refunded AS remaining"
                ),
                {"amount": amount, "order": order_id, "tenant": tenant_id, "currency": currency},
            ).one_or_none()
            if row is None:
                raise self._refusal(conn, tenant_id, order_id, currency)
            refund_id = f"rf-{uuid.uuid4().hex[:12]}"
            conn.execute(
                text(
                    "INSERT INTO downstream.refunds"
                    " (refund_id, payment_id, amount, currency, idempotency_key)"
                    " VALUES (:r, :p, :a, :c, :k)"
                ),
                {"r": refund_id, "p": row.payment_id, "a": amount, "c": currency, "k": key},
            )
            return {
                "resource_id": row.payment_id,
                "action": "refund",
                "refund_id": refund_id,
                "payment_id": row.payment_id,
                "amount": amount,
                "currency": currency,
                "remaining_refundable": row.remaining,
                "status": "completed",
            }

        return self.call(key=key, fence=fence, request=request, apply=apply)

    @staticmethod
    def _refusal(conn: Connection, tenant_id: str, order_id: str, currency: str) -> ToolError:
        payment = conn.execute(
            text(
                "SELECT currency, amount - refunded AS remaining FROM downstream.payments"
                " WHERE order_id = :o AND tenant_id = :t"
            ),
            {"o": order_id, "t": tenant_id},
        ).one_or_none()
        if payment is None:
            return ToolError(
                "no such order for this account",
                code=ErrorCode.NOT_FOUND,
                details=[{"path": "/order_id", "code": "not_found", "expected": "a known order"}],
            )
        if payment.currency != currency:
            return ToolError(
                "currency differs from the payment's",
                code=ErrorCode.INVALID_ARGUMENTS,
                details=[{"path": "/currency", "code": "mismatch", "expected": payment.currency}],
            )
        return ToolError(
            "amount exceeds the payment's remaining refundable amount",
            code=ErrorCode.REFUND_AMOUNT_EXCEEDED,
            details=[
                {
                    "path": "/amount",
                    "code": "exceeds_remaining",
                    "expected": f"at most {payment.remaining}",
                }
            ],
        )


class Mail(Provider):
    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, "mail")

    def send(
        self, *, key: str, fence: int, tenant_id: str, to: str, template: str
    ) -> dict[str, Any]:
        request = {"tenant": tenant_id, "to": to, "template": template}

        def apply(conn: Connection) -> dict[str, Any]:
            message_id = f"msg-{uuid.uuid4().hex[:12]}"
            conn.execute(
                text(
                    "INSERT INTO downstream.messages"
                    " (message_id, tenant_id, recipient, template, idempotency_key)"
                    " VALUES (:m, :t, :to, :tpl, :k)"
                ),
                {"m": message_id, "t": tenant_id, "to": to, "tpl": template, "k": key},
            )
            return {
                "resource_id": message_id,
                "action": "send",
                "message_id": message_id,
                "status": "sent",
            }

        return self.call(key=key, fence=fence, request=request, apply=apply)
