"""``callgate approvals``: list, show, approve or deny one tenant's approval requests."""

from __future__ import annotations

import json

import click

from callgate.ops.cli.common import (
    BY,
    OPS_APPLICATION,
    TENANT,
    checked_engine,
    dispatch_after_decision,
    load_settings,
    table,
)
from callgate.store import approvals as approval_store
from callgate.store import db


@click.group("approvals")
def approvals_group() -> None:
    """List, show, approve or deny approval requests of one tenant.

    A request shows the impact the server computed (never the model's summary) and is bound
    to one intent: if the arguments or the canonical resource change, a new one is asked.
    An approver acts for one tenant (--tenant) and sees only its requests; the person who
    asked for a request can never approve or deny it (four eyes).
    """


# The operator commands' connections (approvals here; reconcile and prune in
# cli/maintenance.py) go by this name, so they can be told apart in pg_stat_activity.
@approvals_group.command("list")
@click.option(
    "--state",
    type=click.Choice(["pending", "approved", "denied", "superseded", "all"]),
    default="pending",
    show_default=True,
)
@TENANT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def approvals_list_cmd(state: str, tenant: str, as_json: bool) -> None:
    """Approval requests of the tenant, oldest first."""
    engine = checked_engine(load_settings().require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        found = approval_store.requests(
            engine, tenant=tenant, state=None if state == "all" else state
        )
    if as_json:
        click.echo(json.dumps(found))
        return
    table(
        ["approval_id", "version", "state", "tool_name", "requested_by", "impact"],
        [{**a, "impact": json.dumps(a["impact"])[:90]} for a in found],
    )


@approvals_group.command("show")
@click.argument("approval_id")
@TENANT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def approvals_show_cmd(approval_id: str, tenant: str, as_json: bool) -> None:
    """One request of the tenant with its full server-computed impact."""
    engine = checked_engine(load_settings().require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        found = approval_store.show(engine, approval_id, tenant=tenant)
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


@approvals_group.command("approve")
@click.argument("approval_id")
@BY
@TENANT
def approvals_approve_cmd(approval_id: str, by: str, tenant: str) -> None:
    """Grant a pending request; its calls resume through the queue.

    The decision is committed first. If Redis cannot be reached afterwards, the command
    still succeeds and warns: the sweeper dispatches the resumed calls once Redis is back.
    """
    settings = load_settings()
    engine = checked_engine(settings.require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        resumed = approval_store.approve(engine, approval_id, by=by, tenant=tenant)
    click.echo(f"approved {approval_id} by {by.strip()}; {len(resumed)} call(s) resumed")
    dispatch_after_decision(settings, resumed)


@approvals_group.command("deny")
@click.argument("approval_id")
@BY
@TENANT
def approvals_deny_cmd(approval_id: str, by: str, tenant: str) -> None:
    """Refuse a pending request; its calls end with approval_denied."""
    settings = load_settings()
    engine = checked_engine(settings.require_database(), application_name=OPS_APPLICATION)
    with db.translate_errors("approvals"):
        finished = approval_store.deny(engine, approval_id, by=by, tenant=tenant)
    click.echo(
        f"denied {approval_id} by {by.strip()}; {finished.finished} call(s) ended approval_denied"
    )
    dispatch_after_decision(settings, finished.successors)
