"""A turn from the command line: ``submit`` proposals or a provider's response, ``collect``
its results, read its ``trace``; ``tools`` prints what a model may be shown."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import click

from callgate.core import values
from callgate.core.errors import InputError, ServiceUnavailable
from callgate.ops.cli.common import SURFACES, checked_engine, load_settings, read_json, table
from callgate.producer import Producer, intake
from callgate.producer.intake import NO_CALLS, redacted_trace, tool_definitions
from callgate.producer.validation import check_timeout
from callgate.store import audit, db, tool_catalog
from callgate.tools import retrieval

# The table's data | error column: a value longer than this is cut, never silently.
CELL_WIDTH = 80


@click.command("submit")
@click.option(
    "--context",
    "context_file",
    required=True,
    type=click.File("r"),
    help="JSON file: {request_id, tenant_id, user_id, roles[, conversation_id]}.",
)
@click.option(
    "--provider",
    type=click.Choice(SURFACES),
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
    context = read_json(context_file, "context")
    raw = read_json(proposals_file, "provider response" if provider else "proposals")
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
    table(["call_id", "tool_name", "operation_id"], answer["calls"])


def _report_no_calls(as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(NO_CALLS))
    else:
        click.echo("no tool calls: a final answer; nothing recorded")


@click.command("collect")
@click.argument("turn_id")
@click.option(
    "--timeout", default=10.0, show_default=True, help="Seconds to wait for the last result."
)
@click.option(
    "--provider",
    type=click.Choice(SURFACES),
    default=None,
    help="Print the results as this API surface's tool-result message (JSON), ready to "
    "append to the conversation. Needs every result.",
)
@click.option(
    "--full",
    is_flag=True,
    help=f"Show each value whole in the table (default: cut after {CELL_WIDTH} characters, "
    "ending in …(+N chars)). The table shows a result's content, the tool's own data; --json "
    "shows the whole envelope a model sees, never cut.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def collect_cmd(
    turn_id: str, timeout: float, provider: str | None, full: bool, as_json: bool
) -> None:
    """Wait for a turn's results, joined by call id; name the calls still pending.

    Exits 0 when every call has its result, 3 when some are still pending or wait for an
    approval (the results so far are printed either way), and says so when no live worker
    serves the queue."""
    check_timeout(timeout, "--timeout")
    producer = Producer.from_env()
    try:
        collected = producer.collect(turn_id, timeout)
        workers = [] if collected.complete else producer.live_workers()
    finally:
        producer.close()
    if provider:
        click.echo(json.dumps(collected.provider_message(provider)))
        return
    doc = collected.as_json()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(f"turn {doc['turn_id']}: {'complete' if doc['complete'] else 'INCOMPLETE'}")
        rows = collect_rows(doc, dict(collected.proposals), width=None if full else CELL_WIDTH)
        table(["call_id", "tool_name", "status", "data | error"], rows)
    if collected.complete:
        return
    if doc["pending"] and not workers:
        click.echo(
            f"callgate: no live worker serves queue {producer.settings.queue!r}: nothing runs "
            "the pending calls until one starts (`callgate worker`, or `callgate up`)",
            err=True,
        )
    sys.exit(INCOMPLETE_EXIT)


def collect_rows(
    doc: dict[str, Any], tools: dict[str, str], width: int | None
) -> list[dict[str, Any]]:
    """The table's rows: results, then pending calls, then parked ones (a parked call is
    never under ``pending``), each with its tool; with ``width``, longer values are cut."""
    rows = [
        {
            "call_id": r["call_id"],
            "tool_name": r["tool_name"],
            "status": r["status"],
            "data | error": _cut(json.dumps(_shown(r)), width),
        }
        for r in doc["results"]
    ]
    rows += [
        {"call_id": c, "tool_name": tools.get(c, ""), "status": "pending", "data | error": ""}
        for c in doc["pending"]
    ]
    rows += [
        {
            "call_id": c,
            "tool_name": tools.get(c, ""),
            "status": "awaiting_approval",
            "data | error": f"callgate approvals show {approval_id}",
        }
        for c, approval_id in doc["awaiting_approval"].items()
    ]
    return rows


def _shown(result: dict[str, Any]) -> Any:
    """What a result's cell shows: a success's content (the tool's own data, not the trust
    envelope around it), a failure's error."""
    data = result.get("data")
    if isinstance(data, dict) and "content" in data and "trust" in data:
        return data["content"]
    return data if data is not None else result.get("error")


# `collect`'s exit status for a turn with calls still pending or parked for an approval.
INCOMPLETE_EXIT = 3


def _cut(value: str, width: int | None) -> str:
    # A cut value says so and by how much: a reader never takes a prefix for the whole.
    if width is None or len(value) <= width:
        return value
    return f"{value[:width]}…(+{len(value) - width} chars)"


@click.command("trace")
@click.argument("turn_or_call")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def trace_cmd(turn_or_call: str, as_json: bool) -> None:
    """Print the audit trace of a turn or a call (its ref, or the provider's call id: one
    section per turn that used it)."""
    settings = load_settings()
    engine = checked_engine(settings.require_database(), application_name="callgate-trace")
    with db.translate_errors("trace"):
        events = redacted_trace(audit.events(engine, turn_or_call))
    if as_json:
        click.echo(json.dumps(events, default=str))
        return
    # A provider's call id may name calls of several turns: one section per turn, so no
    # reader takes two turns' calls for one.
    by_turn: dict[str | None, list[dict[str, Any]]] = {}
    for e in events:
        by_turn.setdefault(e["turn_id"], []).append(e)
    for n, (turn_id, rows) in enumerate(by_turn.items()):
        if n:
            click.echo()
        click.echo(f"turn {turn_id or '-'}")
        table(
            ["at", "call_id", "tool_name", "event", "generation", "detail"],
            [{**e, "detail": json.dumps(e["detail"])} for e in rows],
        )


@click.command("tools")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    help="A role of the principal (repeatable). Only its allowlist is printed.",
)
@click.option(
    "--provider",
    type=click.Choice(SURFACES),
    default=None,
    help="In this API surface's tool-schema form (default: neutral {name, description, "
    "parameters}).",
)
@click.option(
    "--query",
    default=None,
    help="The request's text: print only the allowed tools that best match it, best first "
    "(BM25 over names, descriptions and arguments; needs the retrieval extra).",
)
@click.option(
    "--top",
    type=int,
    default=None,
    help=f"With --query: how many tools to print, 1 to {retrieval.MAX_TOP} "
    f"(default {retrieval.DEFAULT_TOP}).",
)
def tools_cmd(
    roles: tuple[str, ...], provider: str | None, query: str | None, top: int | None
) -> None:
    """Print the tool definitions a model acting for these roles may be shown (JSON): the
    catalogue workers publish in Postgres, or the registry CALLGATE_TOOLS names. With
    --query, only the --top that best match it, best first; never a tool the roles may not
    use."""
    if query is None and top is not None:
        raise InputError("--top needs --query: the request's text to choose tools for")
    if top is not None:
        retrieval.check_top_k(top, retrieval.MAX_TOP, name="--top")
    settings = load_settings()
    url = settings.require_database()
    # Only the published catalogue is read from Postgres; a registry named by CALLGATE_TOOLS
    # alone answers without a database at this revision.
    reads_catalogue = not settings.tools or bool(settings.mcp_config)
    engine = (
        checked_engine(url, application_name="callgate-tools")
        if reads_catalogue
        else db.create(url, application_name="callgate-tools")
    )
    try:
        catalog = tool_catalog.for_producer(engine, settings)
    finally:
        engine.dispose()
    unknown = sorted(set(roles) - set(catalog.allowlist))
    if unknown:
        # A misspelt role would print an empty list, as if the role could call nothing.
        known = ", ".join(sorted(catalog.allowlist)) or "none"
        raise InputError(
            f"no role named {', '.join(repr(values.printable(r)) for r in unknown)} in the "
            f"allowlist (CALLGATE_ALLOWLIST, or the registry's own); its roles: {known}"
        )
    if query is None:
        definitions = catalog.definitions_for(roles)
    else:
        chosen = catalog.select(query, roles, top or retrieval.DEFAULT_TOP)
        definitions = [t.definition() for t in chosen]
    click.echo(json.dumps(tool_definitions(definitions, provider), indent=2))
