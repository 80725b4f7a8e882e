"""Which PostgreSQL history callgate's rows belong to, and a guard that nothing is recorded
on a history callgate has not reconciled.

An asynchronous replica that is promoted after a failover lacks the primary's last
transactions: calls reserved, written downstream, ended or even published to Redis may be
back to an earlier state, and an operation's generation (the fencing token) may count again
from a smaller number. A history is a server's system identifier and timeline: promotion
starts a new timeline; a restore into a new cluster has a new system identifier. Each row of
``callgate.histories`` is one history callgate ran on; ``epoch`` counts them (0 for the
history this migration runs on) and becomes the high half of every fencing token.

``callgate.history_epoch()`` returns the epoch of the history the server is on, and raises
SQLSTATE ``CGH01`` when that history is not the last recorded, reconciled one. Statement
triggers call it before every statement that records a call (``calls`` INSERT), ends one
(``outbox`` INSERT: every ending writes its outbox row in its own statement) or reserves,
renews or completes an operation (``operations`` UPDATE): after a failover none of these can
commit until a sweeper has reconciled the new history. The reconciliation itself sets
``callgate.reconciling`` for its own transaction. The check costs about 10 µs per guarded
statement (reading pg_control and the last history row).

A server that cannot tell its identity (``pg_control_system()`` or ``pg_current_wal_lsn()``
refused, as on some managed services) is recorded without one and never checked.

``callgate.lost_turns``: turns a submit returned that a reconciled history lacks (Redis keeps
the turns submitted in the last hour). ``collect`` answers ``turn_lost`` for them, and their
writes' operation ids are kept in doubt, so a submit again under one is taken over, never
run as new.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE callgate.histories (
            epoch integer PRIMARY KEY,
            system_identifier bigint,
            timeline bigint,
            began_at timestamptz NOT NULL DEFAULT now(),
            reconciled_at timestamptz,
            doubted integer NOT NULL DEFAULT 0,
            adopted integer NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        """
        CREATE TABLE callgate.lost_turns (
            turn_id uuid PRIMARY KEY,
            epoch integer NOT NULL,
            submitted_at timestamptz NOT NULL,
            operation_ids text[] NOT NULL DEFAULT '{}',
            found_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE FUNCTION callgate.server_timeline() RETURNS bigint
        LANGUAGE sql VOLATILE AS $$
            SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION callgate.history_epoch() RETURNS integer
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            h callgate.histories;
        BEGIN
            SELECT * INTO h FROM callgate.histories ORDER BY epoch DESC LIMIT 1;
            -- A server that does not tell its identity (see upgrade()) is never checked.
            IF FOUND AND h.reconciled_at IS NOT NULL
               AND (h.timeline IS NULL
                    OR (h.timeline = callgate.server_timeline()
                        AND h.system_identifier
                            = (SELECT system_identifier FROM pg_control_system())))
            THEN
                RETURN h.epoch;
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'CGH01',
                MESSAGE = 'PostgreSQL''s history changed (a failover to a replica, or a '
                          || 'restore) and callgate has not reconciled it yet',
                HINT = 'a running callgate worker or sweeper reconciles it in its next sweep';
        END
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION callgate.guard_history() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF current_setting('callgate.reconciling', true) IS DISTINCT FROM 'on' THEN
                PERFORM callgate.history_epoch();
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    for table, event in (("calls", "INSERT"), ("outbox", "INSERT"), ("operations", "UPDATE")):
        op.execute(
            f"CREATE TRIGGER guard_history BEFORE {event} ON callgate.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION callgate.guard_history()"
        )
    # A server that cannot tell its system identifier or timeline (a managed service that
    # hides pg_control_system() or has no WAL of its own, as storage-replicated services may)
    # is recorded without them: nothing can be checked there, and nothing is refused.
    op.execute(
        """
        DO $$
        BEGIN
            INSERT INTO callgate.histories (epoch, system_identifier, timeline, reconciled_at)
            SELECT 0, system_identifier, callgate.server_timeline(), now()
              FROM pg_control_system();
        EXCEPTION WHEN OTHERS THEN
            INSERT INTO callgate.histories (epoch, reconciled_at) VALUES (0, now());
        END
        $$
        """
    )
