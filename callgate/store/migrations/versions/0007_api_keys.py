"""HTTP API keys (hashed) and the answers of idempotent turn submissions.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0007"
down_revision = "0006"

S = "callgate"


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("roles", ARRAY(sa.Text), nullable=False),
        sa.Column("secret_hash", sa.Text, nullable=False),
        sa.Column("rate", sa.Float),
        sa.Column("burst", sa.Integer),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("rate IS NULL OR rate > 0", name="api_keys_rate_positive"),
        sa.CheckConstraint("burst IS NULL OR burst >= 1", name="api_keys_burst_positive"),
        schema=S,
    )
    op.create_table(
        "api_idempotency",
        sa.Column("key_id", sa.Text, sa.ForeignKey(f"{S}.api_keys.key_id"), primary_key=True),
        sa.Column("idempotency_key", sa.Text, primary_key=True),
        sa.Column("request_hash", sa.Text, nullable=False),
        sa.Column("response", JSONB),
        sa.Column(
            "claimed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=S,
    )
