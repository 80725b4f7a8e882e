"""``callgate api`` (the HTTP API and the approval console) and ``callgate keys``."""

from __future__ import annotations

import json
import logging

import click

from callgate.core import logs
from callgate.core.errors import ConfigurationError
from callgate.core.settings import Settings, metrics_port
from callgate.observe import metrics, tracing
from callgate.store import api_keys, db, schema_version

log = logging.getLogger("callgate.api")
# The start and stop lines: shown at the default level, as every process's are.
lines = logging.getLogger(f"{logs.PROCESS_LOGGER}.api")


@click.command("api")
@click.option(
    "--host",
    default=None,
    help="Address to listen on (env CALLGATE_API_HOST, default 127.0.0.1).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port to listen on (env CALLGATE_API_PORT, default 8000).",
)
@click.option(
    "--metrics-port",
    "metrics_at",
    default=None,
    # Parsed by callgate, so a bad port is invalid_configuration like a bad variable; the
    # option is declared here, not taken from the CLI's common module, which imports this.
    callback=lambda _ctx, _param, v: None if v is None else metrics_port(v, "--metrics-port"),
    metavar="PORT",
    help="Serve Prometheus metrics on http://CALLGATE_METRICS_HOST:PORT/metrics, a port of "
    "its own, never the API's; 0: off (env CALLGATE_METRICS_PORT, default 0). See "
    "docs/metrics.md.",
)
def api_cmd(host: str | None, port: int | None, metrics_at: int | None) -> None:
    """Serve the HTTP API (/v1, OpenAPI at /openapi.json; Swagger UI at /docs only with
    CALLGATE_API_DOCS=on) and the approval console (/console).

    Every request needs an API key (callgate keys create); its principal comes from the key.
    Needs CALLGATE_DATABASE_URL and CALLGATE_REDIS_URL; the tools come from the catalogue
    workers publish (or CALLGATE_TOOLS when set); rate limits per key from CALLGATE_API_RATE
    and CALLGATE_API_BURST. /metrics is served on its own port (--metrics-port), never on
    the API's. See docs/api.md.
    """
    try:
        import uvicorn  # noqa: F401

        from callgate.ops import http_server
        from callgate.ops.http.app import create_app
        from callgate.ops.http.settings import ApiSettings
    except ImportError as exc:
        raise ConfigurationError(
            f"callgate api needs the api extra: pip install 'callgate[api]' ({exc.name})"
        ) from None
    from callgate.tools import registry

    settings = Settings.from_env()
    if metrics_at is not None:
        settings = settings.replace(metrics_port=metrics_at)
    if settings.tools:  # else the tools come from the catalogue workers publish
        registry.load_catalog(settings.tools)  # refuse a bad one before listening
    settings.require_redis()
    schema_version.require_current_at(settings.require_database(), "api start")
    api = ApiSettings.from_env().with_address(host, port)
    # Its own port, like every other process's: the API's port may face the internet, and
    # /metrics there would need a key or be open to anyone.
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_host, metrics.registry_for("api"))

    def started() -> None:
        lines.info(
            "api listening on http://%s:%d (metrics %s, auth api-key, queue %s; %s)",
            api.host,
            api.port,
            f"on {settings.metrics_host}:{settings.metrics_port}"
            if settings.metrics_port
            else "off",
            settings.queue,
            tracing.described(),
            extra={"event": "api_started"},
        )

    http_server.run(
        create_app(settings, api),
        host=api.host,
        port=api.port,
        header_timeout=api.header_timeout,
        body_timeout=api.body_timeout,
        keep_alive=api.keep_alive,
        on_started=started,
        on_stopped=lambda: lines.info("api stopped", extra={"event": "api_stopped"}),
    )


@click.group("keys")
def keys_group() -> None:
    """Create and revoke API keys. A key names one principal (tenant, user, roles); the
    HTTP API trusts nothing in a request but its key."""


@keys_group.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts for.")
@click.option("--user", required=True, help="The user the key acts as.")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    help="A role (repeatable): the allowlist's roles, and 'approver' to decide approvals.",
)
@click.option(
    "--rate",
    type=float,
    default=None,
    help="Requests per second for this key (default CALLGATE_API_RATE).",
)
@click.option(
    "--burst",
    type=click.IntRange(min=1),
    default=None,
    help="Requests at once for this key (default CALLGATE_API_BURST).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"key_id": ..., "key": ...}.')
def keys_create_cmd(
    tenant: str,
    user: str,
    roles: tuple[str, ...],
    rate: float | None,
    burst: int | None,
    as_json: bool,
) -> None:
    """Make a key and print it once: only its hash is stored, it cannot be shown again."""
    engine = db.create(Settings.from_env().require_database())
    try:
        made = api_keys.create(
            engine, tenant=tenant, user=user, roles=list(roles), rate=rate, burst=burst
        )
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps({"key_id": made.key_id, "key": made.key}))
        return
    click.echo(f"key_id {made.key_id}")
    click.echo(f"key    {made.key}")
    click.echo("Keep the key now: callgate stores only its hash and cannot show it again.")


@keys_group.command("revoke")
@click.argument("key")
def keys_revoke_cmd(key: str) -> None:
    """Revoke a key, named by its id (ak…) or given whole (cgk.ID.SECRET): every request
    with it is refused from now on. Only the id is ever printed."""
    engine = db.create(Settings.from_env().require_database())
    try:
        key_id = api_keys.revoke(engine, key)
    finally:
        engine.dispose()
    click.echo(f"revoked {key_id}")
