"""MCP tool snapshots: each tool's published definition, one row per version.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"

S = "callgate"


def upgrade() -> None:
    op.create_table(
        "mcp_tools",
        sa.Column("server", sa.Text, primary_key=True),
        sa.Column("tool", sa.Text, primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("digest", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("input_schema", JSONB, nullable=False),
        sa.Column("output_schema", JSONB),
        sa.Column("annotations", JSONB),
        sa.Column("server_name", sa.Text),
        sa.Column("server_version", sa.Text),
        sa.Column("protocol_version", sa.Text),
        sa.Column(
            "discovered_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.UniqueConstraint("server", "tool", "digest", name="mcp_tools_digest"),
        sa.CheckConstraint("version > 0", name="mcp_tools_version_positive"),
        schema=S,
    )
