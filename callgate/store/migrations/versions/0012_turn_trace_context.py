"""The trace context a turn was submitted in (W3C ``traceparent``/``tracestate``), so a
worker's spans continue the submitter's trace across the queue.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"

S = "callgate"


def upgrade() -> None:
    # Nullable, no default: adding it rewrites no row; NULL when nobody traced the submit.
    op.add_column("turns", sa.Column("trace_context", JSONB), schema=S)
