"""The demo tools. Their names and arguments are a contract later work and external checks use.

Reads: ``get_weather(city, unit)``, ``get_stock(symbol)``, ``get_news(topic)``.
Writes: ``refund_payment(order_id, amount, currency)`` through the payments provider and
``send_email(to, template)`` through the mail provider.
"""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine

from store import db
from store.settings import Settings
from worker.demo import delays as demo_delays
from worker.demo.downstream import Mail, Payments
from worker.registry import ExecutionContext, Registry, Tool

READS = ("get_weather", "get_stock", "get_news")
WRITES = ("refund_payment", "send_email")

# Role allowlists. Users and their roles come from the server-trusted context:
# user-17 (tenant-a) and user-42 (tenant-b) are "support"; user-5 (tenant-a) is "viewer".
ALLOWLIST = {"support": READS + WRITES, "viewer": READS}


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeatherArgs(_Args):
    city: str = Field(min_length=1, max_length=100)
    unit: Literal["celsius", "fahrenheit"]


class StockArgs(_Args):
    symbol: str = Field(min_length=1, max_length=12, pattern=r"^[A-Z0-9.]+$")


class NewsArgs(_Args):
    topic: str = Field(min_length=1, max_length=100)


class RefundArgs(_Args):
    order_id: str = Field(min_length=1, max_length=64)
    amount: int = Field(gt=0)
    currency: Literal["KRW", "USD", "EUR"]


class EmailArgs(_Args):
    to: str = Field(min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")
    template: str = Field(min_length=1, max_length=64)


class DemoServices:
    """Per-process clients of the demo downstreams, connected on first use."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings

    @cached_property
    def settings(self) -> Settings:
        return self._settings or Settings.from_env()

    @cached_property
    def engine(self) -> Engine:
        # Its own engine: the downstream commits independently of the worker's transactions.
        return db.create(self.settings.downstream_url(), application_name="callgate-downstream")

    @cached_property
    def delays(self) -> demo_delays.Delays:
        return demo_delays.parse(os.environ.get("CALLGATE_DEMO_DELAY_MS"))

    @cached_property
    def payments(self) -> Payments:
        return Payments(self.engine)

    @cached_property
    def mail(self) -> Mail:
        return Mail(self.engine)

    def pause(self, tool: str, which: int) -> None:
        seconds = self.delays.get(tool, (0.0, 0.0))[which]
        if seconds:
            time.sleep(seconds)


def _stable_number(text: str, low: int, high: int) -> int:
    digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return low + digest % (high - low + 1)


def _observed() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def demo_registry(services: DemoServices | None = None) -> Registry:
    svc = services or DemoServices()

    def get_weather(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("get_weather", 0)
        celsius = _stable_number(args.city.lower(), -5, 32)
        temp = celsius if args.unit == "celsius" else round(celsius * 9 / 5 + 32)
        svc.pause("get_weather", 1)
        return {
            "city": args.city,
            "temperature": temp,
            "unit": args.unit,
            "observed_at": _observed(),
        }

    def get_stock(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("get_stock", 0)
        price = _stable_number(args.symbol, 1_000, 90_000) / 100
        svc.pause("get_stock", 1)
        return {
            "symbol": args.symbol,
            "price": price,
            "currency": "USD",
            "observed_at": _observed(),
        }

    def get_news(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("get_news", 0)
        n = _stable_number(args.topic.lower(), 1, 99)
        svc.pause("get_news", 1)
        return {
            "topic": args.topic,
            "headlines": [f"{args.topic}: story {n}", f"{args.topic}: story {n + 1}"],
            "observed_at": _observed(),
        }

    def refund_payment(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("refund_payment", 0)
        response = svc.payments.refund(
            key=ctx.idempotency_key,
            fence=ctx.fencing_token,
            tenant_id=ctx.tenant_id,
            order_id=args.order_id,
            amount=args.amount,
            currency=args.currency,
        )
        svc.pause("refund_payment", 1)
        return {
            k: response[k]
            for k in ("refund_id", "payment_id", "amount", "currency", "status", "replayed")
        }

    def send_email(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("send_email", 0)
        response = svc.mail.send(
            key=ctx.idempotency_key,
            fence=ctx.fencing_token,
            tenant_id=ctx.tenant_id,
            to=args.to,
            template=args.template,
        )
        svc.pause("send_email", 1)
        return {k: response[k] for k in ("message_id", "status", "replayed")}

    tools = [
        Tool(
            "get_weather",
            "Current weather of one city. Not for past or forecast weather.",
            WeatherArgs,
            "read",
            get_weather,
        ),
        Tool(
            "get_stock",
            "Latest price of one stock symbol. Not for history or advice.",
            StockArgs,
            "read",
            get_stock,
        ),
        Tool(
            "get_news",
            "Recent headlines about one topic. Not for full articles.",
            NewsArgs,
            "read",
            get_news,
        ),
        Tool(
            "refund_payment",
            "Refund part or all of an order's payment. Not for cancelling orders; "
            "never more than the payment's remaining refundable amount.",
            RefundArgs,
            "write",
            refund_payment,
        ),
        Tool(
            "send_email",
            "Send one templated e-mail to one recipient. Not for bulk mail.",
            EmailArgs,
            "write",
            send_email,
        ),
    ]
    return Registry.of(tools, ALLOWLIST)
