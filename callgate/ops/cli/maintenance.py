"""Operator commands: ``callgate reconcile`` (writes a person must settle) and
``callgate prune`` (retention). Registered on the main CLI in ``callgate.ops.cli.main``."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from callgate.ops.cli.common import OPS_APPLICATION, checked_engine, load_settings, table
from callgate.ops.flags import setting_option
from callgate.store import db, reconciliation, retention
from callgate.store.db import Engine


def _engine() -> Engine:
    return checked_engine(load_settings().require_database(), OPS_APPLICATION)


@click.group("reconcile")
def reconcile_group() -> None:
    """Writes callgate cannot know the outcome of, for a person to settle.

    A write ends reconciliation_pending when its worker died after the request left and
    its downstream neither takes an idempotency key nor answers a status lookup: running
    it again could apply it twice, so callgate never does. Check the downstream by the
    operation's idempotency key, then record what you found with `resolve`. The calls keep
    the result they were given; a retry of the same write (same operation id) then gets
    your outcome instead of reconciliation_pending.
    """


@reconcile_group.command("list")
@click.option("--tenant", default=None, help="Only this tenant's writes.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reconcile_list_cmd(tenant: str | None, limit: int, as_json: bool) -> None:
    """Writes awaiting a person's decision, oldest first."""
    with db.translate_errors("reconcile"):
        found = reconciliation.pending(_engine(), tenant=tenant, limit=limit)
    if as_json:
        click.echo(json.dumps(found))
        return
    table(
        ["operation_id", "tenant_id", "tool_name", "idempotency_key", "age_seconds", "calls"],
        found,
    )


@reconcile_group.command("show")
@click.argument("operation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reconcile_show_cmd(operation_id: str, as_json: bool) -> None:
    """One write awaiting reconciliation: its resource, idempotency key, calls and trace."""
    with db.translate_errors("reconcile"):
        found = reconciliation.show(_engine(), operation_id)
    if as_json:
        click.echo(json.dumps(found))
        return
    for key, value in found.items():
        if key in ("calls", "trace"):
            click.echo(f"{key}:")
            for row in value:
                click.echo("  " + json.dumps(row))
        else:
            click.echo(f"{key}: {json.dumps(value) if isinstance(value, dict) else value}")


@reconcile_group.command("resolve")
@click.argument("operation_id")
@click.option(
    "--outcome",
    type=click.Choice(["succeeded", "failed"]),
    required=True,
    help="succeeded: the write applied downstream; failed: it did not.",
)
@setting_option("--by", "by", variable="CALLGATE_RECONCILER", required=True)
@click.option("--note", default="", help="What you checked, kept with the outcome.")
def reconcile_resolve_cmd(operation_id: str, outcome: str, by: str, note: str) -> None:
    """Record what the downstream shows for one write; once only."""
    with db.translate_errors("reconcile"):
        settled = reconciliation.resolve(_engine(), operation_id, outcome=outcome, by=by, note=note)
    click.echo(f"reconciled {settled.operation_id} as {settled.outcome} by {settled.by}")


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Remove finished turns created longer ago than this: 90s, 30m, 12h, 7d, 2w.",
)
@click.option("--batch", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option("--dry-run", is_flag=True, help="Count what would go; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def prune_cmd(older_than: str, batch: int, dry_run: bool, as_json: bool) -> None:
    """Remove finished turns with their calls, outbox rows and trace events, and the HTTP
    API's kept answers to Idempotency-Key repeats.

    A turn goes only when all its calls are terminal and all its results are published;
    an operation goes with the last call that used it, never while a write awaits
    reconciliation. A write retried with the same operation id after the window runs
    again as a new write: keep the window longer than any retry your application makes.
    """
    seconds = retention.parse_duration(older_than)
    with db.translate_errors("prune"):
        pruned = retention.prune(_engine(), older_than=seconds, batch=batch, dry_run=dry_run)
    counts = asdict(pruned)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **counts}))
        return
    verb = "would remove" if dry_run else "removed"
    unknown = counts.pop("unknown_batches")
    shown = counts if not dry_run else {k: counts[k] for k in ("turns", "calls", "api_idempotency")}
    names = {"api_idempotency": "API idempotency answers"}
    click.echo(
        f"{verb} "
        + ", ".join(f"{n} {names.get(k, k.replace('_', ' '))}" for k, n in shown.items())
        + (
            f"; {unknown} batch(es) were sent again after a lost connection: one whose reply "
            "was lost may have removed more rows than counted here"
            if unknown
            else ""
        )
    )
