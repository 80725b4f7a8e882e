"""Indexes retention needs: turns by age, and outbox rows by call.

The outbox index also serves the foreign-key check when a call row is deleted (without it,
every deleted call scans the outbox).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"

S = "callgate"


def upgrade() -> None:
    op.create_index("turns_created", "turns", ["created_at"], schema=S)
    op.create_index("outbox_call", "outbox", ["call_ref"], schema=S)
