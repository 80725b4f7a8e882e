"""callgate's Prometheus metrics, defined once, and the one function that serves them.

Every process keeps its own registry (prometheus-client's default one) and serves it on its
own port (``--metrics-port``, ``CALLGATE_METRICS_PORT``). That is exact here because a
callgate process never forks per call: a worker is one process running its calls on
threads, so each process's counters are complete, and Prometheus adds processes and hosts
up with ``sum()``. prometheus-client's multiprocess mode (one file per PID, no custom
collectors) would only be needed for a process that forks a child per job.

Labels are bounded: ``tool`` (a registered tool's name; see ``tool_label``), ``kind``
(read, write), ``status`` (the three terminal statuses), ``code`` (an ``ErrorCode``),
``layer`` (a gate layer), ``reason`` and ``outcome`` (fixed sets). Never a tenant, turn,
call or operation id: those belong to the trace and the logs.

Each process serves only the families it moves (``ROLE_FAMILIES``, ``registry_for``): a
sweeper's /metrics has no worker gauge reading 0, so "in flight = concurrency" is never
trivially true on a process that runs no calls. The metric objects themselves are shared and
stay in prometheus-client's default registry (a library producer, and tests, read them there).

The gauges read from Postgres and Redis (open calls, outbox lag, reconciliation,
approvals, queue depth) are in ``callgate.daemons.gauges``; only the processes asked to serve them
do (the sweeper by default).

Each event has a one-line helper below, so a call site reads ``metrics.side_effect(tool)``.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.registry import Collector

from callgate.core.errors import ConfigurationError

# The label value for a tool name nobody registered (a model may propose anything): its
# name never becomes a label value, so the series stay bounded.
UNREGISTERED_TOOL: Final = "unregistered"

# Latency buckets in seconds, from a no-op call on one host to a slow downstream.
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

GATE_LAYERS: Final = (
    "allowlist",
    "parse",
    "schema",
    "business",
    "authorization",
    "risk",
    "approval",
    "idempotency",
)
# The layer of a refusal no gate layer decided (a bug on the gate's own path).
INTERNAL_LAYER: Final = "internal"
TERMINAL_STATUSES: Final = ("succeeded", "failed_retryable", "failed_terminal")
APPROVAL_OUTCOMES: Final = ("requested", "granted", "denied", "superseded")
REDISPATCH_REASONS: Final = (
    "lease_expired",
    "stale",
    "approval_decided",
    "worker_lost",
    "redis_lost",
)

# --- counters --------------------------------------------------------------------------------

CALLS_PROPOSED = Counter(
    "callgate_calls_proposed",
    "Calls recorded by submit (one per proposed call, refused ones included).",
    ["tool"],
)
CALLS_TAKEN = Counter(
    "callgate_calls_taken",
    "Call refs a worker took off the queue (every delivery, duplicates included).",
)
HANDLER_INVOCATIONS = Counter(
    "callgate_handler_invocations",
    "Handler runs: every attempt that reached the tool's handler, retries and takeovers included.",
    ["tool", "kind"],
)
SIDE_EFFECTS = Counter(
    "callgate_side_effects",
    "Downstream side effects: write handler runs the downstream reports as newly applied "
    "(not replayed from an idempotency key).",
    ["tool"],
)
WRITE_OPERATIONS = Counter(
    "callgate_write_operations",
    "Unique write operations that ended succeeded or reconciliation_pending (the write "
    "applied, or may have), counted once by the guarded statement that ended the operation.",
    ["tool"],
)
RESULTS_REUSED = Counter(
    "callgate_results_reused",
    "Calls answered with the stored result of an operation that already finished with the "
    "same intent.",
    ["tool"],
)
IDEMPOTENCY_CONFLICTS = Counter(
    "callgate_idempotency_conflicts",
    "Calls ended because their operation id was registered with a different intent.",
    ["tool"],
)
STALE_FENCE_REJECTIONS = Counter(
    "callgate_stale_fence_rejections",
    "Writes a downstream refused because a newer generation owns the operation.",
    ["tool"],
)
STALE_COMPLETIONS = Counter(
    "callgate_stale_completions",
    "Completions refused because this owner no longer held the operation's generation.",
    ["tool"],
)
LEASE_TAKEOVERS = Counter(
    "callgate_lease_takeovers",
    "Reservations that took an operation over from an owner whose lease expired.",
    ["tool"],
)
RETRIES = Counter(
    "callgate_retries",
    "In-process handler retries after a retryable error (same key, same fence).",
    ["tool"],
)
GATE_REFUSALS = Counter(
    "callgate_gate_refusals",
    "Calls the gate refused, by layer and error code (no handler ran).",
    ["layer", "code"],
)
APPROVALS = Counter(
    "callgate_approvals",
    "Approval requests by outcome: requested, granted, denied, superseded.",
    ["tool", "outcome"],
)
RESULTS = Counter(
    "callgate_results",
    "Terminal results a worker committed after running the handler or refusing the call, by "
    "status and error code ('none' for a success).",
    ["tool", "status", "code"],
)
DUPLICATE_DELIVERIES = Counter(
    "callgate_duplicate_deliveries",
    "Deliveries that changed nothing because another delivery owns or finished the call.",
    ["tool"],
)
SWEEPER_REDISPATCHES = Counter(
    "callgate_sweeper_redispatches",
    "Calls the sweeper dispatched again: lease_expired (the worker died or stalled), stale "
    "(the job was lost), approval_decided (a parked call whose request was decided), "
    "worker_lost (taken by a worker that stopped beating), redis_lost (Redis lost its data).",
    ["reason"],
)
SWEEPER_EXHAUSTED = Counter(
    "callgate_sweeper_exhausted",
    "Calls the sweeper ended after CALLGATE_MAX_DISPATCHES dispatches, by the code it ended "
    "them with (delivery_exhausted, reconciliation_pending).",
    ["code"],
)
OUTBOX_PUBLISHED = Counter(
    "callgate_outbox_published",
    "Outbox rows the relayer published to Redis (each publish, re-publishes included).",
)
OUTBOX_REPUBLISHED = Counter(
    "callgate_outbox_republished",
    "Results published again after a relayer died between publish and mark (fan-in drops "
    "the copy).",
)

# --- histograms ------------------------------------------------------------------------------

GATE_SECONDS = Histogram(
    "callgate_gate_seconds",
    "Time from a worker loading a call to the gate's verdict: the reservation, or the refusal.",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_WAIT_SECONDS = Histogram(
    "callgate_queue_wait_seconds",
    "Time from a call's (last) dispatch to a worker taking it.",
    buckets=LATENCY_BUCKETS,
)
EXECUTION_SECONDS = Histogram(
    "callgate_execution_seconds",
    "Handler execution time (reservation to outcome, retries included).",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
RELAY_SECONDS = Histogram(
    "callgate_relay_seconds",
    "Time from a result's commit (its outbox row) to its publish on Redis.",
    buckets=LATENCY_BUCKETS,
)
FANIN_SECONDS = Histogram(
    "callgate_fanin_seconds",
    "End to end: a turn's submit to its last result collected.",
    buckets=LATENCY_BUCKETS,
)

# --- in-process gauges -----------------------------------------------------------------------

WORKER_CONCURRENCY = Gauge(
    "callgate_worker_concurrency",
    "Calls this worker process may run at once (CALLGATE_WORKER_CONCURRENCY).",
)
WORKER_IN_FLIGHT = Gauge(
    "callgate_worker_calls_in_flight",
    "Calls this worker process is running now (in their handler; not those committing).",
)


# --- which process serves which family ------------------------------------------------------

# What a producer moves, in whichever process it runs (an application embedding it, the API).
_PRODUCER: Final = (CALLS_PROPOSED, FANIN_SECONDS)

# The families each kind of process moves, and so serves. A worker also sweeps by default
# (CALLGATE_WORKER_SWEEP): it then serves the sweeper's families too. The approval requests
# are the worker's (its gate parks a call); the decisions are whoever decides: the API's, or
# the one-shot ``callgate approvals`` command's, which serves nothing.
ROLE_FAMILIES: Final[Mapping[str, tuple[Collector, ...]]] = {
    "producer": _PRODUCER,
    "api": (*_PRODUCER, APPROVALS),
    "worker": (
        CALLS_TAKEN,
        HANDLER_INVOCATIONS,
        SIDE_EFFECTS,
        WRITE_OPERATIONS,
        RESULTS_REUSED,
        IDEMPOTENCY_CONFLICTS,
        STALE_FENCE_REJECTIONS,
        STALE_COMPLETIONS,
        LEASE_TAKEOVERS,
        RETRIES,
        GATE_REFUSALS,
        APPROVALS,
        RESULTS,
        DUPLICATE_DELIVERIES,
        GATE_SECONDS,
        QUEUE_WAIT_SECONDS,
        EXECUTION_SECONDS,
        WORKER_CONCURRENCY,
        WORKER_IN_FLIGHT,
    ),
    "relayer": (OUTBOX_PUBLISHED, OUTBOX_REPUBLISHED, RELAY_SECONDS),
    # A write operation the sweeper ends reconciliation_pending is counted by the sweeper.
    "sweeper": (SWEEPER_REDISPATCHES, SWEEPER_EXHAUSTED, WRITE_OPERATIONS),
}
ROLES: Final = tuple(ROLE_FAMILIES)


def registry_for(*roles: str) -> CollectorRegistry:
    """A registry of the families ``roles`` move (and the process's own: CPU, memory, GC),
    for one process's /metrics. The metric objects are the shared ones: a count made
    anywhere in the process is in every registry that holds its family."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"not a process role: {sorted(unknown)}")
    registry = CollectorRegistry()
    chosen: list[Collector] = [PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR]
    for role in roles:
        chosen += [m for m in ROLE_FAMILIES[role] if m not in chosen]
    for collector in chosen:
        registry.register(collector)
    return registry


# --- one line per event site -----------------------------------------------------------------


def tool_label(name: str, registered: Iterable[str]) -> str:
    """``name`` if it is a registered tool, else ``UNREGISTERED_TOOL``."""
    return name if name in registered else UNREGISTERED_TOOL


def declare_tools(tools: Iterable[tuple[str, str]]) -> None:
    """Create every (tool, kind) series at zero when a process starts, so that a counter's
    first increment is seen by ``rate()`` and ``increase()`` (a series that appears at 1
    loses it) and so that ratio rules have both sides from the start."""
    for name, kind in tools:
        HANDLER_INVOCATIONS.labels(name, kind)
        for counter in (
            RESULTS_REUSED,
            IDEMPOTENCY_CONFLICTS,
            LEASE_TAKEOVERS,
            RETRIES,
            DUPLICATE_DELIVERIES,
            STALE_COMPLETIONS,
        ):
            counter.labels(name)
        RESULTS.labels(name, "succeeded", "none")
        if kind == "write":
            SIDE_EFFECTS.labels(name)
            WRITE_OPERATIONS.labels(name)
            STALE_FENCE_REJECTIONS.labels(name)


def declare_sweeper() -> None:
    """Create the sweeper's series at zero (see ``declare_tools``)."""
    for reason in REDISPATCH_REASONS:
        SWEEPER_REDISPATCHES.labels(reason)
    for code in ("delivery_exhausted", "reconciliation_pending"):
        SWEEPER_EXHAUSTED.labels(code)


def calls_proposed_all(names: Iterable[str], registered: Iterable[str]) -> None:
    """One count per proposed call, labelled by ``tool_label``."""
    known = set(registered)
    for name in names:
        CALLS_PROPOSED.labels(tool_label(name, known)).inc()


def calls_taken(count: int = 1) -> None:
    CALLS_TAKEN.inc(count)


def handler_invoked(tool: str, kind: str) -> None:
    HANDLER_INVOCATIONS.labels(tool, kind).inc()


def side_effect(tool: str) -> None:
    SIDE_EFFECTS.labels(tool).inc()


def write_operation_completed(tool: str) -> None:
    WRITE_OPERATIONS.labels(tool).inc()


def result_reused(tool: str) -> None:
    RESULTS_REUSED.labels(tool).inc()


def idempotency_conflict(tool: str) -> None:
    IDEMPOTENCY_CONFLICTS.labels(tool).inc()


def stale_fence(tool: str) -> None:
    STALE_FENCE_REJECTIONS.labels(tool).inc()


def stale_completion(tool: str) -> None:
    STALE_COMPLETIONS.labels(tool).inc()


def lease_takeover(tool: str) -> None:
    LEASE_TAKEOVERS.labels(tool).inc()


def retry(tool: str) -> None:
    RETRIES.labels(tool).inc()


def gate_refused(layer: str, code: str) -> None:
    GATE_REFUSALS.labels(layer, code).inc()


def approval(tool: str, outcome: str, count: int = 1) -> None:
    """``outcome``: one of ``APPROVAL_OUTCOMES``."""
    if count:
        APPROVALS.labels(tool, outcome).inc(count)


def result(tool: str, status: str, code: str | None = None, count: int = 1) -> None:
    if count:
        RESULTS.labels(tool, status, code or "none").inc(count)


def duplicate_delivery(tool: str) -> None:
    DUPLICATE_DELIVERIES.labels(tool).inc()


def redispatched(reason: str, count: int = 1) -> None:
    """``reason``: one of ``REDISPATCH_REASONS``."""
    if count:
        SWEEPER_REDISPATCHES.labels(reason).inc(count)


def exhausted(code: str, count: int = 1) -> None:
    if count:
        SWEEPER_EXHAUSTED.labels(code).inc(count)


def outbox_published(count: int = 1) -> None:
    OUTBOX_PUBLISHED.inc(count)


def outbox_republished(count: int = 1) -> None:
    OUTBOX_REPUBLISHED.inc(count)


def gate_verdict(tool: str, seconds: float) -> None:
    GATE_SECONDS.labels(tool).observe(seconds)


def queue_waited(seconds: float | None) -> None:
    """``seconds`` from the call's last dispatch (``None``: never dispatched, nothing)."""
    if seconds is not None:
        QUEUE_WAIT_SECONDS.observe(max(0.0, seconds))


def executed(tool: str, seconds: float) -> None:
    EXECUTION_SECONDS.labels(tool).observe(seconds)


def relayed(ages: Iterable[float]) -> None:
    for age in ages:
        RELAY_SECONDS.observe(max(0.0, age))


def fanned_in(seconds: float) -> None:
    FANIN_SECONDS.observe(max(0.0, seconds))


# --- pure decisions behind the counts ---------------------------------------------------------


def refusal_layer(verdicts: Mapping[str, str], code: str) -> str:
    """The gate layer that refused with ``code``: the last layer whose verdict is that code
    (the executor records each layer's verdict in order), else ``INTERNAL_LAYER``."""
    for layer in reversed(list(verdicts)):
        if verdicts[layer] == code and layer in GATE_LAYERS:
            return layer
    return INTERNAL_LAYER


def counts_as_write_operation(kind: str, status: str, code: str | None) -> bool:
    """Does an operation ending with (status, code) count in ``callgate_write_operations``?
    A write that succeeded, or that ended ``reconciliation_pending`` (it may have applied):
    the operations that carry one downstream side effect. A write the downstream refused
    carries none, and counting it would hide a duplicate elsewhere in the ratio."""
    return kind == "write" and (status == "succeeded" or code == "reconciliation_pending")


def side_effects_on_return(kind: str, reports: Sequence[bool]) -> int:
    """Side effects to count when a handler returned normally: one for a write whose handler
    reported nothing (every successful run of an unreporting write counts, so a downstream
    that does not deduplicate shows up), none when it reported (each ``applied=True``
    report was counted when it was made) or for a read."""
    return 1 if kind == "write" and not reports else 0


def effect_reporter(tool: str, kind: str) -> Callable[[bool], None]:
    """What ``ExecutionContext.report_effect`` calls: count a newly applied write at once,
    so a crash right after the downstream's answer loses no count."""

    def report(applied: bool) -> None:
        if applied and kind == "write":
            SIDE_EFFECTS.labels(tool).inc()

    return report


def side_effects_returned(tool: str, kind: str, reports: Sequence[bool]) -> None:
    count = side_effects_on_return(kind, reports)
    if count:
        SIDE_EFFECTS.labels(tool).inc(count)


def serve(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``registry`` on ``http://host:port/metrics`` from a daemon thread.

    A port that is taken (or not ours to bind) is a ``ConfigurationError`` naming it, so the
    process stops with one line instead of running unobserved."""
    # A ``_created`` series per counter and histogram doubles the series for nothing the
    # rules use (they handle resets with rate() and increase()).
    disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        _start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
        raise ConfigurationError(
            f"metrics port {host}:{port} {why}; pick another with --metrics-port or "
            "CALLGATE_METRICS_PORT (0 turns /metrics off)"
        ) from None
