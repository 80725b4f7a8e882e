"""A partial index of write operations awaiting reconciliation, so the metrics gauges that
count them (and the oldest one's age) never read the operations' history.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

S = "callgate"


def upgrade() -> None:
    op.create_index(
        "operations_reconciliation",
        "operations",
        ["completed_at"],
        schema=S,
        postgresql_where=sa.text(
            "state = 'failed' AND (result #>> '{error,code}') = 'reconciliation_pending'"
        ),
    )
