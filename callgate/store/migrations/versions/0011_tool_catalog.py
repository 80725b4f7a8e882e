"""The tool catalogue: each tool definition workers publish, for producers without handlers.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0011"
down_revision = "0010"

S = "callgate"


def upgrade() -> None:
    op.create_table(
        "tool_catalog",
        sa.Column("tool", sa.Text, primary_key=True),
        sa.Column("revision", sa.Integer, primary_key=True),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("schema_version", sa.Text, nullable=False),
        sa.Column("digest", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("spec", JSONB, nullable=False),
        sa.Column("roles", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column(
            "published_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.Column(
            "last_published_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        # The guard that refuses a second definition under one name and versions.
        sa.UniqueConstraint("tool", "version", "schema_version", name="tool_catalog_definition"),
        sa.CheckConstraint("revision > 0", name="tool_catalog_revision_positive"),
        sa.CheckConstraint("kind IN ('read', 'write')", name="tool_catalog_kind"),
        schema=S,
    )
