"""Submit keys: a turn carries the key it was submitted under and a hash of its request,
unique per tenant, so a repeated submit (after a lost COMMIT reply) finds its turn.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"

S = "callgate"


def upgrade() -> None:
    # Nullable: turns recorded before this revision have no key (and need none).
    op.add_column("turns", sa.Column("submit_key", sa.Text), schema=S)
    op.add_column("turns", sa.Column("submit_hash", sa.Text), schema=S)
    op.create_index("turns_submit_key", "turns", ["tenant_id", "submit_key"], unique=True, schema=S)


def downgrade() -> None:
    op.drop_index("turns_submit_key", table_name="turns", schema=S)
    op.drop_column("turns", "submit_hash", schema=S)
    op.drop_column("turns", "submit_key", schema=S)
