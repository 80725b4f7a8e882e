"""When a sweeper last found a call's job waiting in Redis, so a backlog is told from a lost
delivery without touching ``dispatched_at`` (the queue-wait histogram reads that).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"

S = "callgate"


def upgrade() -> None:
    # Nullable, no default: adding it rewrites no row.
    op.add_column("calls", sa.Column("queued_seen_at", sa.DateTime(timezone=True)), schema=S)
