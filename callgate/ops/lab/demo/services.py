"""The demo tools' per-process clients of their downstreams, and the demo's knobs."""

from __future__ import annotations

import os
import time
from functools import cached_property

from sqlalchemy import Engine

from callgate.core.errors import ConfigurationError
from callgate.core.settings import Settings
from callgate.ops.lab.demo import delays as demo_delays
from callgate.ops.lab.demo.downstream import Mail, Mailbox, Payments
from callgate.store import db

DEFAULT_APPROVAL_AMOUNT = 100_000


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
        return db.create(
            self.settings.downstream_url(),
            pool_size=self.settings.worker_concurrency + 1,
            application_name="callgate-downstream",
        )

    @cached_property
    def delays(self) -> demo_delays.Delays:
        return demo_delays.parse(os.environ.get("CALLGATE_DEMO_DELAY_MS"))

    @cached_property
    def payments(self) -> Payments:
        return Payments(self.engine)

    @cached_property
    def mail(self) -> Mail:
        return Mail(self.engine)

    @cached_property
    def mailbox(self) -> Mailbox:
        return Mailbox(self.engine)

    @cached_property
    def approval_amount(self) -> int:
        raw = os.environ.get("CALLGATE_DEMO_APPROVAL_AMOUNT", "").strip()
        if not raw:
            return DEFAULT_APPROVAL_AMOUNT
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigurationError(
                f"CALLGATE_DEMO_APPROVAL_AMOUNT={raw!r}: expected a whole number >= 1"
            )
        return int(raw)

    def pause(self, tool: str, which: int) -> None:
        seconds = self.delays.get(tool, (0.0, 0.0))[which]
        if seconds:
            time.sleep(seconds)
