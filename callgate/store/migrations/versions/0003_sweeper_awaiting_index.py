"""A partial index of parked calls, so the sweeper never scans terminal history.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

S = "callgate"


def upgrade() -> None:
    op.create_index(
        "calls_awaiting",
        "calls",
        ["approval_id"],
        schema=S,
        postgresql_where=sa.text("state = 'awaiting_approval'"),
    )
