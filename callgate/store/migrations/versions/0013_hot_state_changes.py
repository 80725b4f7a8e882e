"""Let a call's and an operation's state changes be HOT updates.

Every call changes state twice on its way (``proposed`` → ``started`` → terminal) and its
operation twice (``pending`` → ``in_progress`` → ``succeeded``). PostgreSQL can update a row
in place on its page, without a new entry in any index (a heap-only tuple), only when no
column any index reads changed and the page has room. Until now ``state`` appeared in the
predicates of three partial indexes (calls_open, calls_awaiting, operations_reconciliation),
so each of those four updates wrote a new entry into every index of its table (eight on
calls), and each index entry is WAL and later vacuum work.

The partial indexes now read stored generated columns instead: ``calls.is_open``,
``calls.is_awaiting``, ``operations.awaits_reconciliation``. Their value is unchanged by
most state changes (``proposed`` → ``started`` keeps a call open), so those updates no longer
touch any index. Index keys a reservation or a completion leaves alone, partial indexes of
``after_call`` and ``approval_id`` that leave out the NULLs almost every call has, and
fillfactor 80 (room on each page for the updated row) do the rest.

Adding a stored generated column rewrites both tables under an exclusive lock: on a large
history, run this migration in a maintenance window.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"

S = "callgate"

STATEMENTS = (
    f"""ALTER TABLE {S}.calls
        SET (fillfactor = 80),
        ADD COLUMN is_open boolean NOT NULL
            GENERATED ALWAYS AS (state IN ('proposed', 'started')) STORED,
        ADD COLUMN is_awaiting boolean NOT NULL
            GENERATED ALWAYS AS (state = 'awaiting_approval') STORED""",
    f"DROP INDEX {S}.calls_open",
    f"CREATE INDEX calls_open ON {S}.calls (dispatched_at) WHERE is_open",
    f"DROP INDEX {S}.calls_awaiting",
    f"CREATE INDEX calls_awaiting ON {S}.calls (approval_id) WHERE is_awaiting",
    f"DROP INDEX {S}.calls_after_call",
    f"CREATE INDEX calls_after_call ON {S}.calls (after_call) WHERE after_call IS NOT NULL",
    f"DROP INDEX {S}.calls_approval",
    f"CREATE INDEX calls_approval ON {S}.calls (approval_id) WHERE approval_id IS NOT NULL",
    f"""ALTER TABLE {S}.operations
        SET (fillfactor = 80),
        ADD COLUMN awaits_reconciliation boolean NOT NULL
            GENERATED ALWAYS AS (
                coalesce(state = 'failed'
                         AND (result #>> '{{error,code}}') = 'reconciliation_pending', false)
            ) STORED""",
    f"DROP INDEX {S}.operations_reconciliation",
    f"""CREATE INDEX operations_reconciliation ON {S}.operations (operation_id)
        WHERE awaits_reconciliation""",
)


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)
