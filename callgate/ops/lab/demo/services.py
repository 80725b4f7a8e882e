"""The demo tools' per-process clients of their downstreams, and the demo's knobs."""

from __future__ import annotations

import time
from functools import cached_property

from sqlalchemy import Engine

from callgate.core.settings import Settings
from callgate.ops.lab.demo import delays as demo_delays
from callgate.ops.lab.demo.downstream import Mail, Mailbox, Payments
from callgate.ops.lab.settings import DemoSettings
from callgate.store import db

DEFAULT_APPROVAL_AMOUNT: int = DemoSettings.model_fields["approval_amount"].default


class DemoServices:
    """Per-process clients of the demo downstreams, connected on first use."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings

    @cached_property
    def settings(self) -> Settings:
        return self._settings or Settings.from_env()

    @cached_property
    def knobs(self) -> DemoSettings:
        """The demo's variables, read on first use (tests set them per process)."""
        return DemoSettings.from_env()

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
        return demo_delays.parse(self.knobs.delay_ms)

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
        return self.knobs.approval_amount

    def pause(self, tool: str, which: int) -> None:
        seconds = self.delays.get(tool, (0.0, 0.0))[which]
        if seconds:
            time.sleep(seconds)
