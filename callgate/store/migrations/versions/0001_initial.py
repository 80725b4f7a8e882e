"""Turns, calls, operations, outbox and trace events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None

S = "callgate"
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "turns",
        sa.Column("turn_id", sa.Uuid, primary_key=True),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("roles", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "operations",
        sa.Column("operation_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("intent_hash", sa.Text),
        sa.Column("state", sa.Text, nullable=False, server_default="pending"),
        sa.Column("owner_token", sa.Uuid),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column("reserved_from", sa.Text),
        sa.Column("lease_expires_at", TZ),
        sa.Column("result", JSONB),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("completed_at", TZ),
        sa.CheckConstraint(
            "state IN ('pending', 'in_progress', 'succeeded', 'failed')", name="operations_state"
        ),
        sa.CheckConstraint(
            "(state = 'in_progress') = (owner_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="operations_owner_iff_in_progress",
        ),
        schema=S,
    )
    op.create_table(
        "calls",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("turn_id", sa.Uuid, sa.ForeignKey(f"{S}.turns.turn_id"), nullable=False),
        sa.Column("call_id", sa.Text, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("arguments", JSONB, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column(
            "operation_id",
            sa.Text,
            sa.ForeignKey(f"{S}.operations.operation_id"),
            nullable=False,
        ),
        sa.Column("after_call", sa.Uuid, sa.ForeignKey(f"{S}.calls.id")),
        sa.Column("state", sa.Text, nullable=False, server_default="proposed"),
        sa.Column("result", JSONB),
        sa.Column("dispatches", sa.Integer, nullable=False, server_default="0"),
        sa.Column("dispatched_at", TZ),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("completed_at", TZ),
        sa.UniqueConstraint("turn_id", "call_id", name="calls_turn_call_id"),
        sa.CheckConstraint("kind IN ('read', 'write')", name="calls_kind"),
        sa.CheckConstraint(
            "state IN ('proposed', 'started', 'succeeded', 'failed_retryable', 'failed_terminal')",
            name="calls_state",
        ),
        sa.CheckConstraint(
            "(result IS NOT NULL) = "
            "(state IN ('succeeded', 'failed_retryable', 'failed_terminal'))",
            name="calls_result_iff_terminal",
        ),
        schema=S,
    )
    op.create_index("calls_operation", "calls", ["operation_id"], schema=S)
    op.create_index("calls_after_call", "calls", ["after_call"], schema=S)
    op.create_index(
        "calls_open",
        "calls",
        ["dispatched_at"],
        schema=S,
        postgresql_where=sa.text("state IN ('proposed', 'started')"),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("turn_id", sa.Uuid, nullable=False),
        sa.Column("call_ref", sa.Uuid, sa.ForeignKey(f"{S}.calls.id"), nullable=False),
        sa.Column("payload", JSONB, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("published_at", TZ),
        schema=S,
    )
    op.create_index(
        "outbox_unpublished",
        "outbox",
        ["id"],
        schema=S,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "trace_events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("turn_id", sa.Uuid),
        sa.Column("call_ref", sa.Uuid),
        sa.Column("operation_id", sa.Text),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("generation", sa.Integer),
        sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("at", TZ, nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_index("trace_events_call", "trace_events", ["call_ref"], schema=S)
    op.create_index("trace_events_turn", "trace_events", ["turn_id"], schema=S)
