"""The processes of a deployment: ``migrate``, ``worker``, ``relayer``, ``sweeper``, and ``up``
(all of them at once, on embedded services where no URL is set)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from callgate.core import logs
from callgate.core.settings import MAX_WORKER_CONCURRENCY, Settings
from callgate.daemons import relayer, sweeper
from callgate.observe import metrics, tracing
from callgate.ops.cli.common import (
    DEMO_DOWNSTREAM,
    METRICS_PORT,
    apply_migrations,
    checked_engine,
    embedded_services,
    load_settings,
    port_option,
    quiet_interrupt,
    serve_metrics,
    service_env,
    state_metrics_option,
    stop_on_term,
    with_metrics,
)
from callgate.ops.flags import setting_option
from callgate.ops.stack import Stack, check_ports_free
from callgate.queue import transport
from callgate.store import histories
from callgate.tools import registry


@click.command("migrate")
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
    settings = load_settings()
    apply_migrations(settings, downstream=DEMO_DOWNSTREAM if demo_downstream else None)
    click.echo("migrated")


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option("--name", default=None, help="Worker name shown by RQ.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_WORKER_CONCURRENCY),
    default=None,
    help="Calls this process runs at once (env CALLGATE_WORKER_CONCURRENCY, default 8).",
)
@METRICS_PORT
@state_metrics_option(False)
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

    settings = with_metrics(load_settings(), metrics_port, state_metrics)
    if concurrency is not None:
        settings = settings.replace(worker_concurrency=concurrency)
    serve_metrics(settings, role="worker", state_default=False)
    with quiet_interrupt():
        process.run(settings, burst=burst, name=name)


@click.command("relayer")
@METRICS_PORT
@state_metrics_option(False)
def relayer_cmd(metrics_port: int | None, state_metrics: bool | None) -> None:
    """Publish committed results from the outbox to Redis (several may run at once).

    CALLGATE_RELAYER_MARK_DELAY_MS widens the publish-to-mark window (chaos tests).
    """
    settings = with_metrics(load_settings(), metrics_port, state_metrics)
    url = settings.require_database()
    engine = checked_engine(url, "callgate-relayer")
    serve_metrics(settings, role="relayer", state_default=False)
    delay = settings.relayer_mark_delay_ms / 1000
    lines = logging.getLogger(f"{logs.PROCESS_LOGGER}.relayer")
    with _stop_line(lines, "relayer"), quiet_interrupt(), stop_on_term() as stop:
        # Once SIGTERM is ours: whoever saw this line may stop the process cleanly.
        lines.info(
            "relayer started on queue %r, batch %d, %s; %s",
            settings.queue,
            settings.relayer_batch,
            "woken by LISTEN"
            if relayer.listen_url(url, settings.direct_database_url)
            else f"polling every {relayer.POLL_WITHOUT_LISTEN_SECONDS:g}s (behind a pooler;"
            " set CALLGATE_DIRECT_DATABASE_URL to LISTEN)",
            _where(settings),
        )
        relayer.run(
            engine,
            transport.connect(settings.require_redis()),
            relayer.listen_url(url, settings.direct_database_url),
            queue=settings.queue,
            batch=settings.relayer_batch,
            mark_delay=delay,
            debounce=settings.relayer_debounce_ms / 1000,
            stop=stop,
        )


@click.command("sweeper")
@METRICS_PORT
@state_metrics_option(True)
def sweeper_cmd(metrics_port: int | None, state_metrics: bool | None) -> None:
    """Re-dispatch calls whose worker died or whose job Redis lost; end calls dispatched
    CALLGATE_MAX_DISPATCHES times that are still open.

    With a metrics port it also serves the gauges read from Postgres and Redis, unless
    --no-state-metrics.
    """
    settings = with_metrics(load_settings(), metrics_port, state_metrics)
    engine = checked_engine(settings.require_database(), "callgate-sweeper")
    metrics.declare_sweeper()
    serve_metrics(settings, role="sweeper", state_default=True)
    connection = transport.connect(settings.require_redis())
    lines = logging.getLogger(f"{logs.PROCESS_LOGGER}.sweeper")
    with _stop_line(lines, "sweeper"), quiet_interrupt(), stop_on_term() as stop:
        # Once SIGTERM is ours: whoever saw this line may stop the process cleanly.
        lines.info(
            "sweeper started on queue %r, every %gs, stale after %gs; %s",
            settings.queue,
            settings.sweep_seconds,
            settings.stale_seconds,
            _where(settings),
        )
        remark = histories.replication_warning(engine)
        if remark:
            lines.warning("%s", remark)
        sweeper.run(
            engine,
            transport.job_queue(connection, settings.queue),
            interval=settings.sweep_seconds,
            stale_seconds=settings.stale_seconds,
            successor_grace=settings.successor_grace_seconds,
            job_timeout=settings.job_timeout_seconds,
            max_dispatches=settings.max_dispatches,
            stop=stop,
        )


def _where(settings: Settings) -> str:
    metrics_at = f"metrics on :{settings.metrics_port}" if settings.metrics_port else "no metrics"
    return (
        f"{metrics_at}; {tracing.described()}; "
        f"postgres {logs.address(settings.require_database())}, "
        f"redis {logs.address(settings.require_redis())}"
    )


@contextmanager
def _stop_line(lines: logging.Logger, what: str) -> Iterator[None]:
    """One line when the process stops, saying why: a signal (SIGTERM, Ctrl-C) or an error."""
    why = "on an error"
    try:
        yield
        why = "on a signal"
    finally:
        lines.info("%s stopped %s", what, why)


@click.command("up")
@setting_option("--workers", variable="CALLGATE_WORKERS", type=click.IntRange(min=1))
@setting_option("--data-dir", variable="CALLGATE_DATA_DIR", type=click.Path(path_type=Path))
@click.option(
    "--metrics-port",
    default=None,
    callback=port_option,
    metavar="PORT",
    help="Serve /metrics from every process on its own port: the sweeper on PORT, the "
    "relayer on PORT+1, worker i on PORT+1+i; 0: off (env CALLGATE_METRICS_PORT).",
)
def up_cmd(workers: int, data_dir: Path, metrics_port: int | None) -> None:
    """Run migrations, workers, relayer and sweeper in the foreground until Ctrl-C.

    Needs CALLGATE_TOOLS (callgate.ops.lab.demo.tools:demo_registry for the demo tools): this
    is the stack an application uses, so it never picks tools on its own.
    """
    # Refuse before any service starts, rather than leave children failing one by one.
    tools = registry.from_settings(load_settings())
    base = with_metrics(load_settings(), metrics_port, None).metrics_port
    stack = Stack(env={}, workers=workers, metrics_port=base)
    check_ports_free(stack.metrics_ports(), load_settings().metrics_host)
    with embedded_services(load_settings(), data_dir) as settings:
        apply_migrations(settings, downstream=tools.downstream_schema)
        env = service_env(settings)
        click.echo("callgate is up. In another shell:")
        for key, value in env.items():
            click.echo(f"  export {key}='{value}'")
        for name, port in stack.metrics_ports().items():
            click.echo(f"  {name}: http://127.0.0.1:{port}/metrics")
        click.echo("Ctrl-C stops it.")
        stack.env = env
        with stack, quiet_interrupt(), stop_on_term() as stop:
            stop.wait()
