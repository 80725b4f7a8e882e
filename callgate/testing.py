"""Unit-test your own tools without services: ``LocalRunner`` (see docs/testing.md)."""

from callgate.worker.local import AwaitingApproval, LocalResult, LocalRunner

__all__ = ["AwaitingApproval", "LocalResult", "LocalRunner"]
