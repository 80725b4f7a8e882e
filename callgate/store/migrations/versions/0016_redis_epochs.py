"""The last Redis history each queue's sweepers saw, kept in Postgres.

Sweepers notice that Redis lost data (a flush, a restart without persistence, a failover to
a replica that lacked the latest writes) by its epoch: a key of random value in Redis and
Redis's replication id. Each process used to remember the epoch only in its own memory, so
every sweeping process (every worker sweeps) dispatched every open call again after one
loss, each counting a dispatch against ``CALLGATE_MAX_DISPATCHES``; and a loss while every
process was starting went unnoticed until the stale rule. One row per queue: the epoch seen
last and when it replaced another one. The sweeper that records a new epoch sets
``changed_at``; every sweeper dispatches again only the calls not dispatched since then, so
one loss costs each open call one dispatch, whoever notices it. A new table: no lock on any
other.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE callgate.redis_epochs (
            queue text PRIMARY KEY,
            epoch text NOT NULL,
            changed_at timestamptz NOT NULL DEFAULT now(),
            replaced boolean NOT NULL DEFAULT false
        )
        """
    )
