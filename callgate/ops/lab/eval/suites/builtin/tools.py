"""The built-in suite's tools: test doubles over tables of the scratch database.

No double reaches anything outside the scratch database. Every handler writes one ledger row
per run and one per effect (``callgate.ops.lab.eval.ledger``); the runner counts those. The
downstream doubles keep the idempotency keys they applied and replay them, as a real payments
provider does; ``registry(honour_keys=False)`` builds the broken double the tests use.

A fixture's ``setup`` (handed to ``seed``) may say:
- ``faults: {TOOL: down}``: the tool's upstream refuses every request (nothing applied);
- ``faults: {TOOL: timeout_after_apply}``: the first request applies, then its answer is lost
  (a timeout); the executor's retry with the same key must not apply it twice;
- ``mailbox: {account, tenant_id, subject, count}``: e-mails to seed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, Engine, text

from callgate.core.errors import ErrorCode, ToolError
from callgate.ops.lab.eval import ledger
from callgate.tools.decorator import tool
from callgate.tools.registry import (
    Downstream,
    ExecutionContext,
    Facts,
    Principal,
    Registry,
    SideEffect,
    Tool,
)

SCHEMA = "eval_doubles"
READS = ("get_weather", "get_stock")
WRITES = ("cancel_order", "refund_payment", "delete_emails", "change_address", "create_shipment")
ALLOWLIST = {"support": READS + WRITES, "viewer": READS}
APPROVAL_AT = 5  # deleting this many e-mails or more waits for a person

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (
    order_id text PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
    address text NOT NULL, version int NOT NULL, currency text NOT NULL, remaining int NOT NULL
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.mailbox (
    email_id text PRIMARY KEY, tenant_id text NOT NULL, account text NOT NULL,
    subject text NOT NULL, deleted boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.applied (
    idempotency_key text PRIMARY KEY, tool text NOT NULL, response jsonb NOT NULL
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.faults (
    tool text PRIMARY KEY, kind text NOT NULL, remaining int NOT NULL
);
"""

ORDERS = [
    # order, tenant, address, currency, refundable
    ("O-17", "tenant-a", "서울시 강남구 테헤란로 1", "KRW", 50_000),
    ("O-18", "tenant-a", "서울시 마포구 월드컵로 2", "KRW", 30_000),
    ("O-99", "tenant-b", "부산시 해운대구 1", "KRW", 80_000),
]


def install(engine: Engine) -> None:
    ledger.install(engine)
    with engine.begin() as conn:
        conn.execute(text(_DDL))


def seed(engine: Engine, setup: dict[str, Any]) -> None:
    """Reset every double and the ledger, then apply a fixture's ``setup``."""
    ledger.reset(engine)
    with engine.begin() as conn:
        conn.execute(
            text(f"TRUNCATE {SCHEMA}.orders, {SCHEMA}.mailbox, {SCHEMA}.applied, {SCHEMA}.faults")
        )
        for order_id, tenant, address, currency, remaining in ORDERS:
            conn.execute(
                text(f"INSERT INTO {SCHEMA}.orders VALUES (:o, :t, 'placed', :a, 1, :c, :r)"),
                {"o": order_id, "t": tenant, "a": address, "c": currency, "r": remaining},
            )
        for name, kind in (setup.get("faults") or {}).items():
            conn.execute(
                text(f"INSERT INTO {SCHEMA}.faults VALUES (:t, :k, :n)"),
                {"t": name, "k": kind, "n": 1 if kind == "timeout_after_apply" else 1_000_000},
            )
        box = setup.get("mailbox")
        if box:
            for i in range(int(box["count"])):
                conn.execute(
                    text(f"INSERT INTO {SCHEMA}.mailbox VALUES (:e, :t, :a, :s, false)"),
                    {
                        "e": f"M-{i + 1:03d}",
                        "t": box["tenant_id"],
                        "a": box["account"],
                        "s": f"{box['subject']} #{i + 1}",
                    },
                )


# The arguments' types.
OrderId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.-]*$")]
Symbol = Annotated[str, Field(min_length=1, max_length=12, pattern=r"^[A-Z0-9.]+$")]


class _Result(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Weather(_Result):
    city: str
    temperature: int
    unit: str


class Quote(_Result):
    symbol: str
    price: float
    currency: str


class OrderChange(_Result):
    order_id: str
    status: str
    version: int
    replayed: bool


class Refund(_Result):
    refund_id: str
    order_id: str
    amount: int
    currency: str
    replayed: bool


class Deleted(_Result):
    account: str
    deleted: int
    replayed: bool


class Shipment(_Result):
    shipment_id: str
    order_id: str
    address: str
    replayed: bool


class OrderArgs(Protocol):
    order_id: str


class ShipmentArgs(Protocol):
    order_id: str
    address_version: int


class RefundArgs(Protocol):
    order_id: str
    amount: int
    currency: str


class DeleteArgs(Protocol):
    query: str


def registry(honour_keys: bool = True) -> Registry:
    """The suite's tools. ``honour_keys=False``: every downstream double applies a request
    again even when its idempotency key was applied before (the broken executor double)."""
    apply = _Applier(honour_keys)
    tools = [
        *_reads(),
        _cancel_order(apply),
        _refund_payment(apply),
        _delete_emails(apply),
        _change_address(apply),
        _create_shipment(apply),
    ]
    return Registry.of(tools, ALLOWLIST)


def _stable(text_: str, low: int, high: int) -> int:
    return low + int(hashlib.sha256(text_.encode()).hexdigest()[:8], 16) % (high - low + 1)


def _fault(tool_name: str) -> str | None:
    """The tool's fault, if one is armed; a one-shot fault is used up here."""
    with ledger.engine().begin() as conn:
        row = conn.execute(
            text(
                f"UPDATE {SCHEMA}.faults SET remaining = remaining - 1 "
                "WHERE tool = :t AND remaining > 0 RETURNING kind"
            ),
            {"t": tool_name},
        ).first()
    return None if row is None else str(row[0])


def _down(tool_name: str) -> None:
    if _fault(tool_name) == "down":
        raise ToolError(
            f"the {tool_name} upstream is unavailable",
            code=ErrorCode.UPSTREAM_UNAVAILABLE,
            applied=False,
        )


def _reads() -> list[Tool]:
    @tool
    def get_weather(
        city: Annotated[str, Field(min_length=1, max_length=100)],
        ctx: ExecutionContext,
        unit: Literal["celsius", "fahrenheit"] = "celsius",
    ) -> Weather:
        """Current weather of one city. Not for forecasts.

        Args:
            city: City name in English, e.g. Seoul
        """
        ledger.record_run("get_weather", ctx.operation_id)
        _down("get_weather")
        celsius = _stable(city.lower(), -5, 32)
        temp = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
        return Weather(city=city, temperature=temp, unit=unit)

    @tool
    def get_stock(symbol: Symbol, ctx: ExecutionContext) -> Quote:
        """Latest price of one stock symbol, e.g. NVDA. Not for history or advice."""
        ledger.record_run("get_stock", ctx.operation_id)
        _down("get_stock")
        return Quote(symbol=symbol, price=_stable(symbol, 1_000, 90_000) / 100, currency="USD")

    return [get_weather, get_stock]


class _Applier:
    """A downstream double's write: applied once per idempotency key (unless broken), one
    ledger row per item it changed, and an armed timeout that loses the first answer."""

    def __init__(self, honour_keys: bool) -> None:
        self.honour_keys = honour_keys

    def __call__(
        self,
        tool_name: str,
        ctx: ExecutionContext,
        change: Any,  # (Connection) -> (response, items changed)
    ) -> dict[str, Any]:
        with ledger.engine().begin() as conn:
            if self.honour_keys:
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": ctx.idempotency_key}
                )
                seen = conn.execute(
                    text(f"SELECT response FROM {SCHEMA}.applied WHERE idempotency_key = :k"),
                    {"k": ctx.idempotency_key},
                ).scalar()
                if seen is not None:
                    ctx.report_effect(applied=False)
                    return {**seen, "replayed": True}
            response, items = change(conn)
            for item in items:
                conn.execute(
                    text(
                        f"INSERT INTO {ledger.SCHEMA}.effects (tool, operation_id, item) "
                        "VALUES (:t, :o, :i)"
                    ),
                    {"t": tool_name, "o": ctx.operation_id, "i": item},
                )
            conn.execute(
                text(
                    f"INSERT INTO {SCHEMA}.applied VALUES (:k, :t, CAST(:r AS jsonb)) "
                    "ON CONFLICT (idempotency_key) DO NOTHING"
                ),
                {"k": ctx.idempotency_key, "t": tool_name, "r": json.dumps(response)},
            )
        ctx.report_effect(applied=True)
        if _fault(tool_name) == "timeout_after_apply":
            raise ToolError(
                f"the {tool_name} upstream timed out", code=ErrorCode.UPSTREAM_UNAVAILABLE
            )
        return {**response, "replayed": False}


def _order(order_id: str) -> dict[str, Any] | None:
    with ledger.engine().connect() as conn:
        row = (
            conn.execute(
                text(f"SELECT * FROM {SCHEMA}.orders WHERE order_id = :o"), {"o": order_id}
            )
            .mappings()
            .first()
        )
    return dict(row) if row else None


def _resolve_order(args: OrderArgs, principal: Principal) -> Facts:
    order = _order(args.order_id)
    if order is None:
        return Facts(state={"found": False})
    return Facts(canonical={"order_id": order["order_id"]}, state={"found": True, **order})


def _own_order(args: Any, facts: Facts, principal: Principal) -> None:
    # A missing order and another tenant's are refused alike: nothing leaks.
    if not facts.state["found"] or facts.state["tenant_id"] != principal.tenant_id:
        raise ToolError("this account may not act on this order", code=ErrorCode.PERMISSION_DENIED)


def _cancel_order(apply: _Applier) -> Tool:
    @tool(
        kind="write",
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, fencing=False),
        resolve=_resolve_order,
        authorize=_own_order,
    )
    def cancel_order(order_id: OrderId, ctx: ExecutionContext) -> OrderChange:
        """Cancel one order of the signed-in user's company."""
        ledger.record_run("cancel_order", ctx.operation_id)

        def change(conn: Connection) -> tuple[dict[str, Any], list[str]]:
            version = conn.execute(
                text(
                    f"UPDATE {SCHEMA}.orders SET status = 'cancelled', version = version + 1 "
                    "WHERE order_id = :o RETURNING version"
                ),
                {"o": order_id},
            ).scalar_one()
            return {"order_id": order_id, "status": "cancelled", "version": version}, [order_id]

        return OrderChange.model_validate(apply("cancel_order", ctx, change))

    return cancel_order


def _refund_rules(args: RefundArgs, facts: Facts, principal: Principal) -> None:
    if not facts.state["found"] or facts.state["tenant_id"] != principal.tenant_id:
        return  # authorization refuses it, without saying why
    if args.currency != facts.state["currency"]:
        raise ToolError("currency differs from the order's", code=ErrorCode.CURRENCY_MISMATCH)
    if args.amount > facts.state["remaining"]:
        raise ToolError(
            "amount exceeds the remaining refundable amount",
            code=ErrorCode.REFUND_AMOUNT_EXCEEDED,
        )


def _refund_payment(apply: _Applier) -> Tool:
    @tool(
        kind="write",
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, fencing=False),
        resolve=_resolve_order,
        validate=_refund_rules,
        authorize=_own_order,
    )
    def refund_payment(
        order_id: OrderId,
        amount: Annotated[int, Field(gt=0)],
        currency: Literal["KRW", "USD"],
        ctx: ExecutionContext,
    ) -> Refund:
        """Refund part or all of an order's payment.

        Args:
            order_id: Order id, e.g. O-17
            amount: Amount in the currency's minor unit
        """
        ledger.record_run("refund_payment", ctx.operation_id)

        def change(conn: Connection) -> tuple[dict[str, Any], list[str]]:
            conn.execute(
                text(f"UPDATE {SCHEMA}.orders SET remaining = remaining - :a WHERE order_id = :o"),
                {"a": amount, "o": order_id},
            )
            refund_id = f"R-{ctx.operation_id[-8:]}"
            doc = {"refund_id": refund_id, "order_id": order_id, "amount": amount}
            return {**doc, "currency": currency}, [refund_id]

        return Refund.model_validate(apply("refund_payment", ctx, change))

    return refund_payment


def _delete_emails(apply: _Applier) -> Tool:
    def resolve(args: DeleteArgs, principal: Principal) -> Facts:
        with ledger.engine().connect() as conn:
            ids = list(
                conn.execute(
                    text(
                        f"SELECT email_id FROM {SCHEMA}.mailbox WHERE tenant_id = :t "
                        "AND account = :a AND NOT deleted AND subject LIKE :q ORDER BY email_id"
                    ),
                    {"t": principal.tenant_id, "a": principal.user_id, "q": f"%{args.query}%"},
                ).scalars()
            )
        return Facts(
            canonical={"account": principal.user_id, "email_ids": ids}, state={"count": len(ids)}
        )

    def rules(args: DeleteArgs, facts: Facts, principal: Principal) -> None:
        if facts.state["count"] == 0:
            raise ToolError("no e-mail matches the query", code=ErrorCode.NOT_FOUND)

    def risk(args: DeleteArgs, facts: Facts, principal: Principal) -> dict[str, Any] | None:
        if facts.state["count"] < APPROVAL_AT:
            return None
        return {
            "action": "delete_emails",
            "account": facts.canonical["account"],
            "count": facts.state["count"],
            "email_ids": facts.canonical["email_ids"],
        }

    @tool(
        kind="write",
        effect=SideEffect(idempotent=True, reversible=True),
        downstream=Downstream(idempotency_keys=True, fencing=False),
        resolve=resolve,
        validate=rules,
        risk=risk,
    )
    def delete_emails(
        query: Annotated[str, Field(min_length=1, max_length=200)], ctx: ExecutionContext
    ) -> Deleted:
        """Move the signed-in user's e-mails whose subject contains the query to the trash.

        Args:
            query: Text the subjects contain
        """
        ledger.record_run("delete_emails", ctx.operation_id)
        ids = list(ctx.canonical["email_ids"])

        def change(conn: Connection) -> tuple[dict[str, Any], list[str]]:
            conn.execute(
                text(f"UPDATE {SCHEMA}.mailbox SET deleted = true WHERE email_id = ANY(:ids)"),
                {"ids": ids},
            )
            return {"account": ctx.canonical["account"], "deleted": len(ids)}, ids

        return Deleted.model_validate(apply("delete_emails", ctx, change))

    return delete_emails


def _change_address(apply: _Applier) -> Tool:
    @tool(
        kind="write",
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, fencing=False),
        resolve=_resolve_order,
        authorize=_own_order,
    )
    def change_address(
        order_id: OrderId,
        address: Annotated[str, Field(min_length=3, max_length=200)],
        ctx: ExecutionContext,
    ) -> OrderChange:
        """Change the delivery address of one order; returns the order's new version."""
        ledger.record_run("change_address", ctx.operation_id)

        def change(conn: Connection) -> tuple[dict[str, Any], list[str]]:
            version = conn.execute(
                text(
                    f"UPDATE {SCHEMA}.orders SET address = :a, version = version + 1 "
                    "WHERE order_id = :o RETURNING version"
                ),
                {"a": address, "o": order_id},
            ).scalar_one()
            doc = {"order_id": order_id, "status": "address_changed", "version": version}
            return doc, [f"{order_id}@v{version}"]

        return OrderChange.model_validate(apply("change_address", ctx, change))

    return change_address


def _create_shipment(apply: _Applier) -> Tool:
    def current(args: ShipmentArgs, facts: Facts, principal: Principal) -> None:
        if not facts.state["found"] or facts.state["tenant_id"] != principal.tenant_id:
            return  # authorization refuses it
        if args.address_version != facts.state["version"]:
            raise ToolError(
                "the order changed since this address version: read it again",
                code=ErrorCode.STALE_VERSION,
                details=[
                    {"path": "/address_version", "code": "stale", "expected": "the current version"}
                ],
            )

    @tool(
        kind="write",
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, fencing=False),
        resolve=_resolve_order,
        validate=current,
        authorize=_own_order,
    )
    def create_shipment(
        order_id: OrderId, address_version: Annotated[int, Field(ge=1)], ctx: ExecutionContext
    ) -> Shipment:
        """Ship one order to its address as of ``address_version`` (the version the last
        address change returned)."""
        ledger.record_run("create_shipment", ctx.operation_id)

        def change(conn: Connection) -> tuple[dict[str, Any], list[str]]:
            address = conn.execute(
                text(f"SELECT address FROM {SCHEMA}.orders WHERE order_id = :o"), {"o": order_id}
            ).scalar_one()
            shipment_id = f"S-{ctx.operation_id[-8:]}"
            return {"shipment_id": shipment_id, "order_id": order_id, "address": address}, [
                shipment_id
            ]

        return Shipment.model_validate(apply("create_shipment", ctx, change))

    return create_shipment
