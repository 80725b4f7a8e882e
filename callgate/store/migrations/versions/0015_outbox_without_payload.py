"""One copy of a result: the outbox row points at its call instead of carrying the result.

Until now a call's result was stored on the call row, on its operation (for a write) and in
its outbox row's ``payload``: the same document written three times, in one statement, on
every call. The outbox row now holds only which call to publish; the relayer reads the
result from the call row it publishes (a terminal call's result never changes). Rows written
before this migration keep their payload and are published from it.

Upgrade the relayers with the workers: a relayer older than this migration publishes only
rows that carry a payload, and stops at the first that does not (nothing is lost; it
publishes them once upgraded).

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    op.execute("ALTER TABLE callgate.outbox ALTER COLUMN payload DROP NOT NULL")


def downgrade() -> None:
    op.execute(
        "UPDATE callgate.outbox AS o SET payload = c.result FROM callgate.calls AS c"
        " WHERE c.id = o.call_ref AND o.payload IS NULL"
    )
    op.execute("ALTER TABLE callgate.outbox ALTER COLUMN payload SET NOT NULL")
