"""callgate's tables, declared once. Migrations must produce exactly this (tests/integration).

State columns are checked in the database, not only in Python:
- ``operations.state``: pending → in_progress → succeeded | failed; ``generation`` grows by one
  on every reservation and is the fencing token the downstream sees.
- ``calls.state``: proposed → started → succeeded | failed_retryable | failed_terminal; a call
  whose risk policy asks for approval waits in ``awaiting_approval`` (no job, no reservation)
  until an approver decides.
- ``approvals.state``: pending → approved | denied | superseded. A request is bound to the
  operation, the intent hash and the policy version it was computed for.
"""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

SCHEMA = "callgate"

metadata = MetaData(schema=SCHEMA)


turns = Table(
    "turns",
    metadata,
    Column("turn_id", Uuid, primary_key=True),
    Column("request_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("roles", ARRAY(Text), nullable=False),
    Column("conversation_id", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The submit's own key (the caller's, or one the producer chose) and a hash of what was
    # submitted under it: a repeat finds its turn; the same key with other proposals is
    # refused. NULL only on turns recorded before keys existed.
    Column("submit_key", Text),
    Column("submit_hash", Text),
    # The submitter's W3C trace context (``traceparent``, ``tracestate``): the parent of the
    # worker's spans (callgate/observe/tracing.py). NULL when the submit was not traced.
    Column("trace_context", JSONB),
)
Index("turns_conversation", turns.c.conversation_id)
# One turn per key and tenant: the guard that makes submit idempotent (turns.record).
Index("turns_submit_key", turns.c.tenant_id, turns.c.submit_key, unique=True)
Index("turns_created", turns.c.created_at)  # retention, oldest first

operations = Table(
    "operations",
    metadata,
    Column("operation_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("tool_name", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False, unique=True),
    Column("intent_hash", Text),
    # The canonical resource the intent was admitted for (e.g. the payment behind an order).
    Column("canonical", JSONB),
    Column("state", Text, nullable=False, server_default="pending"),
    Column("owner_token", Uuid),
    Column("generation", Integer, nullable=False, server_default="0"),
    Column("reserved_from", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("result", JSONB),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("completed_at", DateTime(timezone=True)),
    # When its first reservation sent the idempotency key (a downstream keeps keys for a
    # limited time: Downstream.keys_kept_seconds).
    Column("first_sent_at", DateTime(timezone=True)),
    # The reconciliation index's filter, in place of ``state`` and ``result``: see calls.
    Column(
        "awaits_reconciliation",
        Boolean,
        Computed(
            "coalesce(state = 'failed'"
            " AND (result #>> '{error,code}') = 'reconciliation_pending', false)",
            persisted=True,
        ),
        nullable=False,
    ),
    CheckConstraint(
        "state IN ('pending', 'in_progress', 'succeeded', 'failed')", name="operations_state"
    ),
    CheckConstraint(
        "(state = 'in_progress') = (owner_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="operations_owner_iff_in_progress",
    ),
    # Room on each page for a row's next version: a state change then stays on its page
    # and adds no index entry (a HOT update).
    postgresql_with={"fillfactor": 80},
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", Uuid, primary_key=True),
    Column("operation_id", Text, ForeignKey("callgate.operations.operation_id"), nullable=False),
    Column("version", Integer, nullable=False),
    Column("tool_name", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("requested_by", Text, nullable=False),
    Column("intent_hash", Text, nullable=False),
    Column("policy_version", Text, nullable=False),
    Column("impact", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default="pending"),
    Column("decided_by", Text),
    Column("decided_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("operation_id", "version", name="approvals_operation_version"),
    CheckConstraint(
        "state IN ('pending', 'approved', 'denied', 'superseded')", name="approvals_state"
    ),
    CheckConstraint(
        "state NOT IN ('approved', 'denied') OR decided_by IS NOT NULL",
        name="approvals_decided_has_approver",
    ),
)
Index("approvals_pending", approvals.c.created_at, postgresql_where=text("state = 'pending'"))

calls = Table(
    "calls",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("turn_id", Uuid, ForeignKey("callgate.turns.turn_id"), nullable=False),
    Column("call_id", Text, nullable=False),
    Column("position", Integer, nullable=False),
    Column("tool_name", Text, nullable=False),
    Column("arguments", JSONB, nullable=False),
    Column("kind", Text, nullable=False),
    Column("operation_id", Text, ForeignKey("callgate.operations.operation_id"), nullable=False),
    Column("after_call", Uuid, ForeignKey("callgate.calls.id")),
    Column("args_hash", Text, nullable=False),
    Column("approval_id", Uuid, ForeignKey("callgate.approvals.approval_id")),
    Column("state", Text, nullable=False, server_default="proposed"),
    Column("result", JSONB),
    Column("dispatches", Integer, nullable=False, server_default="0"),
    Column("dispatched_at", DateTime(timezone=True)),
    # When a sweeper last found this call's job still waiting in Redis (a backlog, not a
    # loss): the next look waits another stale period, and nothing is counted.
    Column("queued_seen_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("completed_at", DateTime(timezone=True)),
    # A read's audit (verdicts, hashes, duration), written with its result: reads end
    # without a trace_events row. See migration 0014 and ``callgate.store.endings``.
    Column("audit", JSONB),
    # What the partial indexes filter on instead of ``state`` (which every call changes
    # twice): an update that leaves these alone touches no index. See migration 0013.
    Column(
        "is_open",
        Boolean,
        Computed("state IN ('proposed', 'started')", persisted=True),
        nullable=False,
    ),
    Column(
        "is_awaiting",
        Boolean,
        Computed("state = 'awaiting_approval'", persisted=True),
        nullable=False,
    ),
    UniqueConstraint("turn_id", "call_id", name="calls_turn_call_id"),
    CheckConstraint("kind IN ('read', 'write')", name="calls_kind"),
    CheckConstraint(
        "state IN ('proposed', 'started', 'awaiting_approval',"
        " 'succeeded', 'failed_retryable', 'failed_terminal')",
        name="calls_state",
    ),
    CheckConstraint(
        "state <> 'awaiting_approval' OR approval_id IS NOT NULL", name="calls_awaiting_has_request"
    ),
    CheckConstraint(
        "(result IS NOT NULL) = (state IN ('succeeded', 'failed_retryable', 'failed_terminal'))",
        name="calls_result_iff_terminal",
    ),
    postgresql_with={"fillfactor": 80},
)
Index("calls_operation", calls.c.operation_id)
# NULL for almost every call: left out, so inserting a call adds no entry for it.
Index("calls_after_call", calls.c.after_call, postgresql_where=text("after_call IS NOT NULL"))
Index("calls_approval", calls.c.approval_id, postgresql_where=text("approval_id IS NOT NULL"))
Index("calls_call_id", calls.c.call_id)
# The open calls (the sweeper's and the gauges' first half), by their last dispatch. Keyed
# and filtered on columns a reservation leaves alone (``proposed`` → ``started`` keeps
# ``is_open``), so it stays a heap-only update: see migration 0013.
Index("calls_open", calls.c.dispatched_at, postgresql_where=text("is_open"))
# The sweeper's other half: parked calls only, so its cost never grows with history.
Index("calls_awaiting", calls.c.approval_id, postgresql_where=text("is_awaiting"))

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("turn_id", Uuid, nullable=False),
    Column("call_ref", Uuid, ForeignKey("callgate.calls.id"), nullable=False),
    # NULL since migration 0015: the relayer publishes the call's own result (one copy).
    Column("payload", JSONB),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True)),
)
Index("outbox_unpublished", outbox.c.id, postgresql_where=text("published_at IS NULL"))
# Retention deletes calls; the foreign-key check looks their outbox rows up by call.
Index("outbox_call", outbox.c.call_ref)

# Write operations a person must reconcile: the state gauges count them without reading
# history (callgate/daemons/gauges.py and store/reconciliation.py filter on exactly this).
Index(
    "operations_reconciliation",
    operations.c.operation_id,
    postgresql_where=text("awaits_reconciliation"),
)

trace_events = Table(
    "trace_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("turn_id", Uuid),
    Column("call_ref", Uuid),
    Column("operation_id", Text),
    Column("event", Text, nullable=False),
    Column("generation", Integer),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("trace_events_call", trace_events.c.call_ref)
Index("trace_events_turn", trace_events.c.turn_id)

# Each MCP tool's definition as its server published it, one row per version: a changed
# input schema, output schema, annotations or server version is a new version, and a call's
# intent names the version it was admitted under.
mcp_tools = Table(
    "mcp_tools",
    metadata,
    Column("server", Text, primary_key=True),
    Column("tool", Text, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("digest", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("input_schema", JSONB, nullable=False),
    Column("output_schema", JSONB),
    Column("annotations", JSONB),
    Column("server_name", Text),
    Column("server_version", Text),
    Column("protocol_version", Text),
    Column("discovered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("server", "tool", "digest", name="mcp_tools_digest"),
    CheckConstraint("version > 0", name="mcp_tools_version_positive"),
)

# The tool catalogue workers publish (callgate.store.tool_catalog): one row per definition,
# named by (tool, version, schema_version); ``revision`` counts a tool's definitions in the
# order they were first published. A producer reads specs from here, never handler code.
tool_catalog = Table(
    "tool_catalog",
    metadata,
    Column("tool", Text, primary_key=True),
    Column("revision", Integer, primary_key=True),
    Column("version", Text, nullable=False),
    Column("schema_version", Text, nullable=False),
    Column("digest", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("roles", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("published_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_published_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("tool", "version", "schema_version", name="tool_catalog_definition"),
    CheckConstraint("revision > 0", name="tool_catalog_revision_positive"),
    CheckConstraint("kind IN ('read', 'write')", name="tool_catalog_kind"),
)

# Keys of the HTTP API, one principal each. Only the SHA-256 of the secret is kept: the key
# is shown once, when made. ``rate``/``burst`` override the API's default token bucket.
api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("roles", ARRAY(Text), nullable=False),
    Column("secret_hash", Text, nullable=False),
    Column("rate", Float),
    Column("burst", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
    CheckConstraint("rate IS NULL OR rate > 0", name="api_keys_rate_positive"),
    CheckConstraint("burst IS NULL OR burst >= 1", name="api_keys_burst_positive"),
)

# POST /v1/turns under an Idempotency-Key: the first request's answer, replayed to a repeat.
api_idempotency = Table(
    "api_idempotency",
    metadata,
    Column("key_id", Text, ForeignKey("callgate.api_keys.key_id"), primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("request_hash", Text, nullable=False),
    Column("response", JSONB),
    Column("claimed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The console's sessions: one per key (a new sign-in replaces it, signing out deletes it),
# so a copied cookie stops working on sign-out. Only the SHA-256 of the cookie's nonce.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("key_id", Text, ForeignKey("callgate.api_keys.key_id"), primary_key=True),
    Column("session_hash", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("session_hash", name="console_sessions_session_hash_key"),
)

# The Redis history (epoch key and replication id) each queue's sweepers saw last, and when
# it replaced another one (``replaced``): a loss of Redis data is recovered once, from this
# moment, whichever process notices it, even one that just started (callgate.store.sweeps).
redis_epochs = Table(
    "redis_epochs",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("epoch", Text, nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("replaced", Boolean, nullable=False, server_default=text("false")),
)

# One row per PostgreSQL history callgate ran on (migration 0018: the function and statement
# triggers that keep anything from being recorded on a history not yet reconciled).
histories = Table(
    "histories",
    metadata,
    Column("epoch", Integer, primary_key=True, autoincrement=False),
    Column("system_identifier", BigInteger),  # None: the server does not tell (never checked)
    Column("timeline", BigInteger),
    Column("began_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("reconciled_at", DateTime(timezone=True)),
    Column("doubted", Integer, nullable=False, server_default=text("0")),
    Column("adopted", Integer, nullable=False, server_default=text("0")),
)

# Turns a submit returned that a reconciled history lacks (a failover lost them).
lost_turns = Table(
    "lost_turns",
    metadata,
    Column("turn_id", Uuid, primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("operation_ids", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("found_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Whose it was (migration 0019), so the API answers turn_lost to its owner alone; None
    # for a turn lost (or remembered by Redis) before the owner was kept.
    Column("tenant_id", Text),
    Column("user_id", Text),
)
