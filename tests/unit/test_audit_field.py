"""audit_field: one result field name; a scalar id is recorded, a non-string name refused."""

from __future__ import annotations

from typing import Any

import pytest

from callgate import tool
from callgate.core.errors import ConfigurationError, ErrorCode


def test_a_scalar_id_is_audited_not_dropped() -> None:
    @tool(audit_field="ticket_id")
    def open_ticket(title: str) -> dict[str, Any]:
        """Open a ticket."""
        return {"ticket_id": 42}

    assert open_ticket.audited({"ticket_id": 42}) == ["42"]
    assert open_ticket.audited({"ticket_id": [1, 2]}) == ["1", "2"]
    assert open_ticket.audited({"other": 1}) is None


def test_a_name_that_is_not_a_string_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as caught:

        @tool(audit_field=["ticket_id"])  # type: ignore[arg-type]
        def open_ticket(title: str) -> dict[str, Any]:
            """Open a ticket."""
            return {"ticket_id": 42}

    assert caught.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "audit_field" in caught.value.message
