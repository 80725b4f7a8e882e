"""``callgate``: run the stack, submit and collect turns, read traces.

Every option has a ``CALLGATE_…`` environment variable. Expected errors print one line
(``callgate: <code>: <what to do>``) and exit 2; there is no traceback for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import click

from callgate.core import logs, values
from callgate.core.errors import (
    CallgateError,
    ConfigurationError,
    ErrorCode,
    InputError,
    JSONValueError,
)
from callgate.core.settings import MAX_WORKER_CONCURRENCY, Settings, metrics_port
from callgate.store import db
from callgate.store import migrate as migrations

EXIT_ERROR = 2


def _settings() -> Settings:
    return Settings.from_env()


def _port_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    # Parsed here rather than by click so a bad port is callgate's invalid_configuration,
    # like a bad CALLGATE_METRICS_PORT.
    return None if value is None else metrics_port(value, "--metrics-port")


_METRICS_PORT = click.option(
    "--metrics-port",
    default=None,
    callback=_port_option,
    metavar="PORT",
    help="Serve Prometheus metrics on http://CALLGATE_METRICS_HOST:PORT/metrics; 0: off "
    "(env CALLGATE_METRICS_PORT, default 0). See docs/metrics.md.",
)


def _state_metrics_option(
    default: bool,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--state-metrics/--no-state-metrics",
        default=None,
        help="Also serve the gauges read from Postgres and Redis (open calls, outbox lag, "
        "reconciliation, approvals, queue depth); serve them from one kind of process only "
        f"(env CALLGATE_STATE_METRICS; default {'on' if default else 'off'} for this "
        "command).",
    )


def _with_metrics(settings: Settings, port: int | None, state: bool | None) -> Settings:
    changes: dict[str, Any] = {}
    if port is not None:
        changes["metrics_port"] = port
    if state is not None:
        changes["state_metrics"] = state
    return dataclasses.replace(settings, **changes) if changes else settings


def _serve_metrics(settings: Settings, *, state_default: bool) -> None:
    """Serve /metrics if a port is set; with the state gauges if asked (or by default)."""
    if not settings.metrics_port:
        return
    from callgate.observe import metrics

    if settings.state_metrics if settings.state_metrics is not None else state_default:
        from prometheus_client import REGISTRY

        from callgate.observe import gauges
        from callgate.queue import transport

        connection = transport.connect(settings.require_redis())
        REGISTRY.register(
            gauges.StateCollector(
                db.create(
                    settings.require_database(), pool_size=1, application_name="callgate-metrics"
                ),
                connection,
                queue_key=transport.job_queue(connection, settings.queue).key,
                window_seconds=gauges.recovery_window(settings),
            )
        )
    metrics.serve(settings.metrics_port, settings.metrics_host)


def _setup_logging(level: str, fmt: logs.LogFormat = "auto") -> None:
    from callgate.tools import redaction

    logs.configure(level, fmt)
    # Every record of every callgate process (RQ's included) is redacted as it is made: a
    # handler's exception text is tool output and may hold a password or a token.
    redaction.install_log_redaction()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    envvar="CALLGATE_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    help="Python log level (env CALLGATE_LOG_LEVEL).",
)
@click.option(
    "--log-format",
    envvar="CALLGATE_LOG_FORMAT",
    type=click.Choice(["auto", "json", "text"]),
    default="auto",
    show_default=True,
    help="Logs on stderr: one JSON object per line, readable text, or auto (JSON unless "
    "stderr is a terminal) (env CALLGATE_LOG_FORMAT).",
)
def cli(log_level: str, log_format: logs.LogFormat) -> None:
    """callgate: a queue-driven, multi-worker executor for LLM tool calls.

    Services come from CALLGATE_DATABASE_URL and CALLGATE_REDIS_URL; 'demo' and 'up' start
    embedded ones when those are unset.
    """
    _setup_logging(log_level, log_format)


# --- the stack --------------------------------------------------------------------------


@cli.command("migrate")
@click.option(
    "--demo-downstream/--no-demo-downstream",
    default=False,
    show_default=True,
    help="Also create and seed the demo tools' downstream schema `downstream` (payments, "
    "mail), only where callgate's demo created it or no such schema exists.",
)
def migrate_cmd(demo_downstream: bool) -> None:
    """Apply callgate's migrations to CALLGATE_DATABASE_URL (safe to repeat).

    Touches only callgate's own schema; the demo tools' downstream is installed only with
    --demo-downstream (the demo, and `up` with the demo tools, install it themselves).
    """
    settings = _settings()
    _migrate(settings, demo_downstream=demo_downstream, reset_demo=False)
    click.echo("migrated")


def _migrate(settings: Settings, *, demo_downstream: bool, reset_demo: bool) -> None:
    engine = db.create(settings.require_database())
    try:
        with db.translate_errors("migrate"):
            migrations.upgrade(engine)
            if demo_downstream:
                from callgate.ops.lab.demo import downstream

                downstream.install(
                    db.create(settings.downstream_url())
                    if settings.downstream_database_url
                    else engine,
                    reset=reset_demo,
                )
    finally:
        engine.dispose()


def _runs_demo_tools(settings: Settings) -> bool:
    """The stack runs the demo tools, so it needs their downstream schema."""
    return (settings.tools or "").startswith("callgate.ops.lab.demo.")


@cli.command("worker")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option("--name", default=None, help="Worker name shown by RQ.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_WORKER_CONCURRENCY),
    default=None,
    help="Calls this process runs at once (env CALLGATE_WORKER_CONCURRENCY, default 8).",
)
@_METRICS_PORT
@_state_metrics_option(False)
def worker_cmd(
    burst: bool,
    name: str | None,
    concurrency: int | None,
    metrics_port: int | None,
    state_metrics: bool | None,
) -> None:
    """Run one worker process on CALLGATE_QUEUE (start several to scale out).

    Runs the tools of the registry CALLGATE_TOOLS names (module:attribute; required), up to
    --concurrency calls at once. SIGTERM stops taking calls and waits for those in flight
    (CALLGATE_WORKER_GRACE_SECONDS).
    """
    from callgate.worker import process

    settings = _with_metrics(_settings(), metrics_port, state_metrics)
    if concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=concurrency)
    _serve_metrics(settings, state_default=False)
    with _quiet_interrupt():
        process.run(settings, burst=burst, name=name)


@cli.command("relayer")
@_METRICS_PORT
@_state_metrics_option(False)
def relayer_cmd(metrics_port: int | None, state_metrics: bool | None) -> None:
    """Publish committed results from the outbox to Redis (several may run at once).

    CALLGATE_RELAYER_MARK_DELAY_MS widens the publish-to-mark window (chaos tests).
    """
    from callgate.daemons import relayer
    from callgate.queue import transport

    settings = _with_metrics(_settings(), metrics_port, state_metrics)
    url = settings.require_database()
    _serve_metrics(settings, state_default=False)
    delay = float(os.environ.get("CALLGATE_RELAYER_MARK_DELAY_MS") or 0) / 1000
    with _quiet_interrupt(), _stop_on_term() as stop:
        relayer.run(
            db.create(url, application_name="callgate-relayer"),
            transport.connect(settings.require_redis()),
            url,
            queue=settings.queue,
            batch=settings.relayer_batch,
            mark_delay=delay,
            stop=stop,
        )


@cli.command("sweeper")
@_METRICS_PORT
@_state_metrics_option(True)
def sweeper_cmd(metrics_port: int | None, state_metrics: bool | None) -> None:
    """Re-dispatch calls whose worker died or whose job Redis lost; end calls dispatched
    CALLGATE_MAX_DISPATCHES times that are still open.

    With a metrics port it also serves the gauges read from Postgres and Redis, unless
    --no-state-metrics.
    """
    from callgate.daemons import sweeper
    from callgate.observe import metrics
    from callgate.queue import transport

    settings = _with_metrics(_settings(), metrics_port, state_metrics)
    metrics.declare_sweeper()
    _serve_metrics(settings, state_default=True)
    connection = transport.connect(settings.require_redis())
    with _quiet_interrupt(), _stop_on_term() as stop:
        sweeper.run(
            db.create(settings.require_database(), application_name="callgate-sweeper"),
            transport.job_queue(connection, settings.queue),
            interval=settings.sweep_seconds,
            stale_seconds=settings.stale_seconds,
            successor_grace=settings.successor_grace_seconds,
            job_timeout=settings.job_timeout_seconds,
            max_dispatches=settings.max_dispatches,
            stop=stop,
        )


@cli.command("up")
@click.option(
    "--workers",
    default=2,
    show_default=True,
    envvar="CALLGATE_WORKERS",
    help="Worker processes (env CALLGATE_WORKERS).",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    envvar="CALLGATE_DATA_DIR",
    default=Path(".callgate"),
    show_default=True,
    help="Where embedded services keep their data (env CALLGATE_DATA_DIR).",
)
@click.option(
    "--metrics-port",
    default=None,
    callback=_port_option,
    metavar="PORT",
    help="Serve /metrics from every process on its own port: the sweeper on PORT, the "
    "relayer on PORT+1, worker i on PORT+1+i; 0: off (env CALLGATE_METRICS_PORT).",
)
def up_cmd(workers: int, data_dir: Path, metrics_port: int | None) -> None:
    """Run migrations, workers, relayer and sweeper in the foreground until Ctrl-C.

    Needs CALLGATE_TOOLS (callgate.ops.lab.demo.tools:demo_registry for the demo tools): this
    is the stack an application uses, so it never picks tools on its own.
    """
    from callgate.ops.stack import Stack, check_ports_free
    from callgate.tools import registry

    # Refuse before any service starts, rather than leave children failing one by one.
    registry.from_settings(_settings())
    base = _with_metrics(_settings(), metrics_port, None).metrics_port
    stack = Stack(env={}, workers=workers, metrics_port=base)
    check_ports_free(stack.metrics_ports(), _settings().metrics_host)
    with _services(_settings(), data_dir) as settings:
        _migrate(settings, demo_downstream=_runs_demo_tools(settings), reset_demo=False)
        env = _service_env(settings)
        click.echo("callgate is up. In another shell:")
        for key, value in env.items():
            click.echo(f"  export {key}='{value}'")
        for name, port in stack.metrics_ports().items():
            click.echo(f"  {name}: http://127.0.0.1:{port}/metrics")
        click.echo("Ctrl-C stops it.")
        stack.env = env
        with stack, _quiet_interrupt(), _stop_on_term() as stop:
            stop.wait()


@cli.command("demo")
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep embedded data here (default: a temporary folder).",
)
def demo_cmd(workers: int, data_dir: Path | None) -> None:
    """Run the worked examples end to end and check their invariants.

    Always uses the demo tools (callgate.ops.lab.demo.tools:demo_registry), whatever CALLGATE_TOOLS
    says.
    """
    from callgate.ops.lab.demo import run as demo

    with (
        tempfile.TemporaryDirectory(prefix="callgate-demo-") as tmp,
        _services(_settings(), data_dir or Path(tmp)) as settings,
    ):
        _migrate(settings, demo_downstream=True, reset_demo=True)
        ok = demo.run(settings, workers=workers, out=sys.stdout)
    sys.exit(0 if ok else 1)


@contextmanager
def _services(settings: Settings, data_dir: Path) -> Iterator[Settings]:
    """Embedded PostgreSQL / Redis for whichever URL is unset."""
    if settings.database_url and settings.redis_url:
        yield settings
        return
    from callgate.ops import embedded

    need_db, need_redis = not settings.database_url, not settings.redis_url
    with embedded.services(data_dir.resolve(), need_db=need_db, need_redis=need_redis) as (d, r):
        yield settings.with_services(
            d or settings.require_database(), r or settings.require_redis()
        )


def _service_env(settings: Settings) -> dict[str, str]:
    env = {
        "CALLGATE_DATABASE_URL": settings.require_database(),
        "CALLGATE_REDIS_URL": settings.require_redis(),
        "CALLGATE_QUEUE": settings.queue,
        "CALLGATE_TOOLS": settings.tools or "",
    }
    if settings.allowlist:
        env["CALLGATE_ALLOWLIST"] = settings.allowlist
    return env


@cli.command("bench")
@click.option(
    "--quick",
    is_flag=True,
    envvar="CALLGATE_BENCH_QUICK",
    help="Fewer calls, W = 1,2, one repeat: under two minutes (env CALLGATE_BENCH_QUICK).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    envvar="CALLGATE_BENCH_OUT",
    default=Path("bench-results"),
    show_default=True,
    help="Folder for bench.json, bench.md and the PNG plots (env CALLGATE_BENCH_OUT).",
)
@click.option(
    "--workers",
    envvar="CALLGATE_BENCH_WORKERS",
    default=None,
    help="Worker counts to compare, e.g. 1,2,4 (default 1,2,4; --quick 1,2) "
    "(env CALLGATE_BENCH_WORKERS).",
)
@click.option(
    "--calls",
    type=click.IntRange(min=20),
    envvar="CALLGATE_BENCH_CALLS",
    default=None,
    help="Calls per throughput run (default 1000; --quick 60) (env CALLGATE_BENCH_CALLS).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    envvar="CALLGATE_BENCH_REPEAT",
    default=None,
    help="Repeats; figures are medians (default 3; --quick 1) (env CALLGATE_BENCH_REPEAT).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    envvar="CALLGATE_BENCH_CONCURRENCY",
    default=32,
    show_default=True,
    help="Calls in flight per worker for the 100 ms tools and the memory figure, passed to "
    "the workers as CALLGATE_WORKER_CONCURRENCY (env CALLGATE_BENCH_CONCURRENCY).",
)
def bench_cmd(
    quick: bool,
    out: Path,
    workers: str | None,
    calls: int | None,
    repeat: int | None,
    concurrency: int,
) -> None:
    """Measure callgate against bare RQ on CALLGATE_DATABASE_URL and CALLGATE_REDIS_URL.

    No-op reads, writes and 100 ms tools with W workers beside bare RQ with the same W;
    fan-in of three reads; the same writes delivered 3×; traffic, latency per stage and
    memory per in-flight call. Migrates what it needs and uses queues of its own. Exits 1
    if a correctness check inside it fails (a call that never ended, a write applied other
    than once).
    """
    from callgate.ops.lab import bench
    from callgate.ops.lab.bench.config import FULL, QUICK

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "callgate bench draws its plots with matplotlib: pip install 'callgate[bench]'"
        ) from None
    preset = QUICK if quick else FULL
    config = bench.Config(
        workers=_worker_counts(workers) if workers else preset["workers"],  # type: ignore[arg-type]
        calls=calls or preset["calls"],  # type: ignore[arg-type]
        repeat=repeat or preset["repeat"],  # type: ignore[arg-type]
        concurrency=concurrency,
        quick=quick,
    )
    command = " ".join(["callgate", *sys.argv[1:]])
    try:
        _, paths = bench.run(_settings(), config, out, command)
    except bench.BenchError as exc:
        click.echo(f"callgate bench: FAILED: {exc}", err=True)
        sys.exit(1)
    click.echo((out / "bench.md").read_text())
    click.echo("wrote " + ", ".join(str(p) for p in paths))


def _worker_counts(raw: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise InputError(f"--workers {raw!r}: expected counts such as 1,2,4")
    return counts


# --- turns ---------------------------------------------------------------------------------


_SURFACES = (
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "gemini-generate-content",
    "gemini-interactions",
)


@cli.command("submit")
@click.option(
    "--context",
    "context_file",
    required=True,
    type=click.File("r"),
    help="JSON file: {request_id, tenant_id, user_id, roles[, conversation_id]}.",
)
@click.option(
    "--provider",
    type=click.Choice(_SURFACES),
    default=None,
    help="FILE is this API surface's raw response (or, with --stream, its list of stream "
    "events); without it, FILE is a JSON list of {call_id, tool_name, arguments}.",
)
@click.option("--stream", is_flag=True, help="With --provider: FILE is a JSON list of events.")
@click.option(
    "--submit-key",
    default=None,
    help="Make the submit idempotent: the same key and proposals again print the turn the "
    "first recorded, and record nothing; the same key with other proposals is "
    "idempotency_conflict. Without it, a submit whose outcome is unknown names the key "
    "to repeat with.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("proposals_file", type=click.File("r"), default="-")
def submit_cmd(
    context_file: TextIO,
    provider: str | None,
    stream: bool,
    submit_key: str | None,
    as_json: bool,
    proposals_file: TextIO,
) -> None:
    """Record and enqueue a turn: proposals, or a provider's response (file or stdin).

    A provider response is read completely before anything is recorded: a malformed one
    is refused with its adapter code and nothing is written. A final answer with no tool
    calls records nothing.
    """
    from callgate.core.errors import ServiceUnavailable
    from callgate.producer import Producer, intake

    context = _read_json(context_file, "context")
    raw = _read_json(proposals_file, "provider response" if provider else "proposals")
    if not isinstance(context, dict):
        raise InputError("context must be a JSON object {request_id, tenant_id, user_id, roles}")
    if stream and not provider:
        raise InputError("--stream needs --provider SURFACE")
    producer = Producer.from_env()
    try:
        proposals = intake.proposals_from(
            raw, provider=provider, stream=stream, known_tools=producer.registry.tools.keys()
        )
        if provider and not proposals:
            _report_no_calls(as_json)
            return
        try:
            turn = producer.submit(proposals, context, submit_key=submit_key)
        except ServiceUnavailable as exc:
            if exc.recorded is None and exc.submit_key is not None:
                # The producer's words name its own parameter; a shell user repeats with
                # the option.
                raise ServiceUnavailable(
                    "submit: cannot reach PostgreSQL while committing the turn: outcome "
                    "unknown, the turn may be recorded. Run the same command again with "
                    f"--submit-key {exc.submit_key}: it prints that turn, or records it once",
                    code=exc.code,
                    submit_key=exc.submit_key,
                    recorded=None,
                ) from exc
            raise
    finally:
        producer.close()
    answer = intake.submitted(turn)
    if as_json:
        click.echo(json.dumps(answer))
        return
    click.echo(f"turn {turn.turn_id}")
    _table(["call_id", "tool_name", "operation_id"], answer["calls"])


def _report_no_calls(as_json: bool) -> None:
    from callgate.producer.intake import NO_CALLS

    if as_json:
        click.echo(json.dumps(NO_CALLS))
    else:
        click.echo("no tool calls: a final answer; nothing recorded")


@cli.command("collect")
@click.argument("turn_id")
@click.option(
    "--timeout", default=10.0, show_default=True, help="Seconds to wait for the last result."
)
@click.option(
    "--provider",
    type=click.Choice(_SURFACES),
    default=None,
    help="Print the results as this API surface's tool-result message (JSON), ready to "
    "append to the conversation. Needs every result.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def collect_cmd(turn_id: str, timeout: float, provider: str | None, as_json: bool) -> None:
    """Wait for a turn's results, joined by call id; name the calls still pending."""
    from callgate.producer import Producer
    from callgate.producer.validation import check_timeout

    check_timeout(timeout, "--timeout")
    producer = Producer.from_env()
    try:
        collected = producer.collect(turn_id, timeout)
    finally:
        producer.close()
    if provider:
        click.echo(json.dumps(collected.provider_message(provider)))
        return
    doc = collected.as_json()
    if as_json:
        click.echo(json.dumps(doc))
        return
    click.echo(f"turn {doc['turn_id']}: {'complete' if doc['complete'] else 'INCOMPLETE'}")
    rows = [
        {
            "call_id": r["call_id"],
            "tool_name": r["tool_name"],
            "status": r["status"],
            "data | error": json.dumps(r.get("data") or r.get("error"))[:80],
        }
        for r in doc["results"]
    ]
    waiting = doc["awaiting_approval"]
    rows += [
        {
            "call_id": c,
            "tool_name": "",
            "status": "awaiting_approval" if c in waiting else "pending",
            "data | error": f"callgate approvals show {waiting[c]}" if c in waiting else "",
        }
        for c in doc["pending"]
    ]
    _table(["call_id", "tool_name", "status", "data | error"], rows)


@cli.command("trace")
@click.argument("turn_or_call")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def trace_cmd(turn_or_call: str, as_json: bool) -> None:
    """Print the audit trace of a turn or a call (by its ref)."""
    from callgate.producer.intake import redacted_trace
    from callgate.store import trace

    settings = _settings()
    engine = db.create(settings.require_database())
    with db.translate_errors("trace"):
        events = redacted_trace(trace.events(engine, turn_or_call))
    if as_json:
        click.echo(json.dumps(events, default=str))
        return
    _table(
        ["at", "call_id", "tool_name", "event", "generation", "detail"],
        [{**e, "detail": json.dumps(e["detail"])} for e in events],
    )


# --- approvals and tools -----------------------------------------------------------------


@cli.group("approvals")
def approvals_group() -> None:
    """List, show, approve or deny approval requests of one tenant.

    A request shows the impact the server computed (never the model's summary) and is bound
    to one intent: if the arguments or the canonical resource change, a new one is asked.
    An approver acts for one tenant (--tenant) and sees only its requests; the person who
    asked for a request can never approve or deny it (four eyes).
    """


# The operator commands' connections (approvals here; reconcile and prune in
# ops/maintenance.py) go by this name, so they can be told apart in pg_stat_activity.
OPS_APPLICATION = "callgate-ops"

_TENANT = click.option(
    "--tenant",
    "tenant",
    envvar="CALLGATE_APPROVER_TENANT",
    required=True,
    help="The tenant the approver acts for; other tenants' requests are not shown "
    "(env CALLGATE_APPROVER_TENANT).",
)


@approvals_group.command("list")
@click.option(
    "--state",
    type=click.Choice(["pending", "approved", "denied", "superseded", "all"]),
    default="pending",
    show_default=True,
)
@_TENANT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def approvals_list_cmd(state: str, tenant: str, as_json: bool) -> None:
    """Approval requests of the tenant, oldest first."""
    from callgate.store import approvals

    engine = db.create(_settings().require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        found = approvals.requests(engine, tenant=tenant, state=None if state == "all" else state)
    if as_json:
        click.echo(json.dumps(found))
        return
    _table(
        ["approval_id", "version", "state", "tool_name", "requested_by", "impact"],
        [{**a, "impact": json.dumps(a["impact"])[:90]} for a in found],
    )


@approvals_group.command("show")
@click.argument("approval_id")
@_TENANT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def approvals_show_cmd(approval_id: str, tenant: str, as_json: bool) -> None:
    """One request of the tenant with its full server-computed impact."""
    from callgate.store import approvals

    engine = db.create(_settings().require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        found = approvals.show(engine, approval_id, tenant=tenant)
    if as_json:
        click.echo(json.dumps(found))
        return
    for key, value in found.items():
        if key == "impact":
            click.echo("impact:")
            for k, v in value.items():
                click.echo(f"  {k}: {json.dumps(v)}")
        else:
            click.echo(f"{key}: {value}")


_BY = click.option(
    "--by",
    "by",
    envvar="CALLGATE_APPROVER",
    required=True,
    help="Who decides, recorded with the decision; never the user who asked for the "
    "request (env CALLGATE_APPROVER).",
)


@approvals_group.command("approve")
@click.argument("approval_id")
@_BY
@_TENANT
def approvals_approve_cmd(approval_id: str, by: str, tenant: str) -> None:
    """Grant a pending request; its calls resume through the queue.

    The decision is committed first. If Redis cannot be reached afterwards, the command
    still succeeds and warns: the sweeper dispatches the resumed calls once Redis is back.
    """
    from callgate.store import approvals

    settings = _settings()
    engine = db.create(settings.require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        resumed = approvals.approve(engine, approval_id, by=by, tenant=tenant)
    click.echo(f"approved {approval_id} by {by.strip()}; {len(resumed)} call(s) resumed")
    _dispatch(settings, resumed)


@approvals_group.command("deny")
@click.argument("approval_id")
@_BY
@_TENANT
def approvals_deny_cmd(approval_id: str, by: str, tenant: str) -> None:
    """Refuse a pending request; its calls end with approval_denied."""
    from callgate.store import approvals

    settings = _settings()
    engine = db.create(settings.require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        finished = approvals.deny(engine, approval_id, by=by, tenant=tenant)
    click.echo(
        f"denied {approval_id} by {by.strip()}; {finished.finished} call(s) ended approval_denied"
    )
    _dispatch(settings, finished.successors)


def _dispatch(settings: Settings, refs: list[uuid.UUID]) -> None:
    """Enqueue calls an approver's decision made runnable (resumed, or next in their turn).

    Runs after the decision committed, so a Redis failure here is not the decision's: the
    calls are marked dispatched in Postgres and the sweeper enqueues them again once they
    have waited CALLGATE_STALE_SECONDS. Reporting it as an error would make the approver
    believe the decision was lost, and try again on a request that is no longer pending.
    """
    if not refs:
        return
    from callgate.queue import transport

    try:
        queue = transport.job_queue(transport.connect(settings.require_redis()), settings.queue)
        transport.enqueue_calls(queue, refs, timeout=settings.job_timeout_seconds)
    except CallgateError as exc:  # Redis down or unset: the decision stands either way
        click.echo(
            f"callgate: warning: {exc.code}: the decision is recorded, but its {len(refs)} "
            "call(s) could not be enqueued; the sweeper dispatches them when Redis is back "
            f"(after CALLGATE_STALE_SECONDS={settings.stale_seconds:g}s). {exc.message}",
            err=True,
        )


@cli.command("tools")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    help="A role of the principal (repeatable). Only its allowlist is printed.",
)
@click.option(
    "--provider",
    type=click.Choice(_SURFACES),
    default=None,
    help="In this API surface's tool-schema form (default: neutral {name, description, "
    "parameters}).",
)
def tools_cmd(roles: tuple[str, ...], provider: str | None) -> None:
    """Print the tool definitions a model acting for these roles may be shown (JSON), from
    the registry CALLGATE_TOOLS names."""
    from callgate.producer.intake import tool_definitions
    from callgate.tools import registry

    definitions = registry.from_env().definitions_for(roles)
    click.echo(json.dumps(tool_definitions(definitions, provider), indent=2))


# --- helpers -------------------------------------------------------------------------------


def _read_json(stream: TextIO, what: str) -> Any:
    """Strict JSON: NaN, Infinity, 1e400 and a key twice in one object are refused here
    (Python's json would accept them, and the last of two keys would silently win); what a
    value may hold is checked by submit itself."""
    try:
        raw = stream.read()
    except UnicodeDecodeError:
        raise InputError(f"{what} file is not UTF-8 text") from None
    try:
        return values.loads(raw, check_values=False)
    except JSONValueError as exc:
        name = values.printable(str(getattr(stream, "name", what)))
        raise InputError(f"{what} file {name} is not valid JSON: {exc.message}") from None


def _table(columns: list[str], rows: list[dict[str, Any]]) -> None:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@contextmanager
def _quiet_interrupt() -> Iterator[None]:
    with contextlib.suppress(KeyboardInterrupt):
        yield


@contextmanager
def _stop_on_term() -> Iterator[threading.Event]:
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    previous_int = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: expected errors become one line and exit code 2."""
    try:
        cli.main(args=argv, prog_name="callgate", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CallgateError as exc:
        click.echo(f"callgate: {exc.code}: {exc.message}", err=True)
        sys.exit(EXIT_ERROR)
    except Exception as exc:
        translated = _translate(exc)
        if translated is None:
            raise
        click.echo(f"callgate: {translated.code}: {translated.message}", err=True)
        sys.exit(EXIT_ERROR)


def _translate(exc: Exception) -> CallgateError | None:
    """Driver errors that escaped a narrower translation still get one clear line."""
    import psycopg
    import redis
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError | psycopg.OperationalError):
        return CallgateError(
            f"cannot reach PostgreSQL: {str(exc).splitlines()[0]}",
            code=ErrorCode.DATABASE_UNAVAILABLE,
        )
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return CallgateError(f"cannot reach Redis: {exc}", code=ErrorCode.REDIS_UNAVAILABLE)
    return None


def _operator_commands() -> None:
    from callgate.ops.lab.chaos.cli import chaos_command
    from callgate.ops.maintenance import prune_cmd, reconcile_group

    cli.add_command(reconcile_group)
    cli.add_command(prune_cmd)
    cli.add_command(chaos_command, name="chaos")


_operator_commands()


def _mcp_commands() -> None:
    from callgate.ops.mcp_gateway import mcp_gateway_cmd

    cli.add_command(mcp_gateway_cmd)


_mcp_commands()


def _api_commands() -> None:
    from callgate.ops.http.serve import api_cmd, keys_group

    cli.add_command(api_cmd)
    cli.add_command(keys_group)


_api_commands()

if __name__ == "__main__":
    main()
