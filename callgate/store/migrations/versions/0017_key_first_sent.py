"""When an operation's idempotency key was first sent downstream.

A downstream may keep idempotency keys for a limited time (``Downstream(keys_kept_seconds=…)``:
24 hours is common); a request repeated after that is a new request to it. The worker sends a
key again (a takeover, a retry, a later attempt of the same operation) only while the key is
younger than that, counted from ``first_sent_at``, which the first reservation sets and later
ones keep. A nullable column with no default: no table rewrite, and the reservation's
update stays on its page (no index covers it).

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    op.execute("ALTER TABLE callgate.operations ADD COLUMN first_sent_at timestamptz")
