"""A read's audit lives on its call row.

A read ends with no reservation, in one statement that flips the call's state, stores its
result and writes its outbox row (``callgate.store.endings``). Its audit (the gate's verdicts,
the intent and key hashes, how long the handler ran) is stored on the same row, in ``audit``,
instead of a ``trace_events`` row with three index entries of its own; `callgate trace` shows
it as the call's ``completed`` event. A nullable column with no default: no table rewrite.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    op.execute("ALTER TABLE callgate.calls ADD COLUMN audit jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE callgate.calls DROP COLUMN audit")
