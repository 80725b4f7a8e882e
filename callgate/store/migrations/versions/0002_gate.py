"""Approvals bound to intent, calls awaiting approval, conversations and argument hashes.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"

S = "callgate"
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("operations", sa.Column("canonical", JSONB), schema=S)
    op.add_column("turns", sa.Column("conversation_id", sa.Text), schema=S)
    op.create_index("turns_conversation", "turns", ["conversation_id"], schema=S)
    op.create_table(
        "approvals",
        sa.Column("approval_id", sa.Uuid, primary_key=True),
        sa.Column(
            "operation_id",
            sa.Text,
            sa.ForeignKey(f"{S}.operations.operation_id"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("requested_by", sa.Text, nullable=False),
        sa.Column("intent_hash", sa.Text, nullable=False),
        sa.Column("policy_version", sa.Text, nullable=False),
        sa.Column("impact", JSONB, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="pending"),
        sa.Column("decided_by", sa.Text),
        sa.Column("decided_at", TZ),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("operation_id", "version", name="approvals_operation_version"),
        sa.CheckConstraint(
            "state IN ('pending', 'approved', 'denied', 'superseded')", name="approvals_state"
        ),
        sa.CheckConstraint(
            "state NOT IN ('approved', 'denied') OR decided_by IS NOT NULL",
            name="approvals_decided_has_approver",
        ),
        schema=S,
    )
    op.create_index(
        "approvals_pending",
        "approvals",
        ["created_at"],
        schema=S,
        postgresql_where=sa.text("state = 'pending'"),
    )
    # Rows recorded before this revision hash to '' and so never match a repeated call.
    op.add_column(
        "calls", sa.Column("args_hash", sa.Text, nullable=False, server_default=""), schema=S
    )
    op.alter_column("calls", "args_hash", server_default=None, schema=S)
    op.add_column(
        "calls",
        sa.Column("approval_id", sa.Uuid, sa.ForeignKey(f"{S}.approvals.approval_id")),
        schema=S,
    )
    op.create_index("calls_approval", "calls", ["approval_id"], schema=S)
    op.create_index("calls_call_id", "calls", ["call_id"], schema=S)
    op.drop_constraint("calls_state", "calls", schema=S)
    op.create_check_constraint(
        "calls_state",
        "calls",
        "state IN ('proposed', 'started', 'awaiting_approval',"
        " 'succeeded', 'failed_retryable', 'failed_terminal')",
        schema=S,
    )
    op.create_check_constraint(
        "calls_awaiting_has_request",
        "calls",
        "state <> 'awaiting_approval' OR approval_id IS NOT NULL",
        schema=S,
    )
