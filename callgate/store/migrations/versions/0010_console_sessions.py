"""The approval console's sessions, kept on the server so signing out ends one.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"

S = "callgate"


def upgrade() -> None:
    # One session per key (the key id is the primary key): a new sign-in replaces the
    # key's session, signing out deletes it. Only the SHA-256 of the cookie's nonce is kept.
    op.create_table(
        "console_sessions",
        sa.Column("key_id", sa.Text, sa.ForeignKey(f"{S}.api_keys.key_id"), primary_key=True),
        sa.Column("session_hash", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("session_hash", name="console_sessions_session_hash_key"),
        schema=S,
    )
