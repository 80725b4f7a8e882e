"""BFCL's multi-turn functions as callgate tools (``CALLGATE_TOOLS=<this module>:registry``).

Every function of BFCL's function docs becomes a tool of the same name, with the doc's
description and its parameters as JSON Schema. Its handler runs the method on the entry's
instance of the class, loaded from and stored back to ``bfcl_multi_turn_store`` under the
row's lock, and returns BFCL's text for the outcome (``{"response": …}``). Which entry: the
turn's server-trusted context, the tenant being the run and the user the entry id.

Reads are the functions whose BFCL source only looks: they run at once and in parallel,
may be repeated, and never store the instance back (so a "read" that changed anything would
show as a state difference in the executor check). Everything else is a write, including
reads that draw from the instance's random generator, and any function not listed.
Each class is a role: a turn may call only the classes its entry involves.
"""

from __future__ import annotations

import pickle
from typing import Any

from callgate.core.errors import ErrorCode, ToolError
from callgate.ops.lab.eval import bfcl, ledger
from callgate.ops.lab.eval import bfcl_multi_turn_backend as backend
from callgate.ops.lab.eval import bfcl_multi_turn_store as store
from callgate.tools.registry import (
    READ_ONLY,
    ExecutionContext,
    Kind,
    Registry,
    ResultLimits,
    SideEffect,
    Tool,
)

READS: dict[str, frozenset[str]] = {
    "GorillaFileSystem": frozenset(
        {"cat", "diff", "du", "find", "grep", "ls", "pwd", "sort", "tail", "wc"}
    ),
    "MathAPI": frozenset(
        {
            "absolute_value",
            "add",
            "divide",
            "imperial_si_conversion",
            "logarithm",
            "max_value",
            "mean",
            "min_value",
            "multiply",
            "percentage",
            "power",
            "round_number",
            "si_unit_conversion",
            "square_root",
            "standard_deviation",
            "subtract",
            "sum_values",
        }
    ),
    "MessageAPI": frozenset(
        {
            "get_message_stats",
            "get_user_id",
            "list_users",
            "message_get_login_status",
            "search_messages",
            "view_messages_sent",
        }
    ),
    "TwitterAPI": frozenset(
        {
            "get_tweet",
            "get_tweet_comments",
            "get_user_stats",
            "get_user_tweets",
            "list_all_following",
            "posting_get_login_status",
            "search_tweets",
        }
    ),
    "TicketAPI": frozenset({"get_ticket", "get_user_tickets", "ticket_get_login_status"}),
    "TradingBot": frozenset(
        {
            "filter_stocks_by_price",
            "get_account_info",
            "get_available_stocks",
            "get_current_time",
            "get_order_details",
            "get_order_history",
            "get_stock_info",
            "get_symbol_by_name",
            "get_transaction_history",
            "get_watchlist",
            "trading_get_login_status",
        }
    ),
    "TravelAPI": frozenset(
        {
            "compute_exchange_rate",
            "get_all_credit_cards",
            "get_booking_history",
            "get_budget_fiscal_year",
            "get_credit_card_balance",
            "get_flight_cost",
            "get_nearest_airport_by_city",
            "list_all_airports",
            "retrieve_invoice",
            "travel_get_login_status",
        }
    ),
    # get_current_speed and get_outside_temperature_from_google draw from the instance's
    # random generator: writes.
    "VehicleControlAPI": frozenset(
        {
            "check_tire_pressure",
            "displayCarStatus",
            "display_log",
            "estimate_distance",
            "estimate_drive_feasibility_by_mileage",
            "find_nearest_tire_shop",
            "gallon_to_liter",
            "get_outside_temperature_from_weather_com",
            "get_zipcode_based_on_city",
            "liter_to_gallon",
        }
    ),
}

# BFCL's responses (a directory listing, a long-context log) go to the model whole.
LIMITS = ResultLimits(max_string=1_000_000, max_items=10_000, max_depth=6)


def kind_of(class_name: str, function: str) -> Kind:
    return "read" if function in READS.get(class_name, frozenset()) else "write"


def tool_for(class_name: str, doc: dict[str, Any]) -> Tool:
    """One BFCL function doc as a tool whose handler runs it on the entry's instance."""
    name = str(doc["name"])
    kind = kind_of(class_name, name)
    parameters = bfcl.json_schema(doc.get("parameters") or {"type": "dict", "properties": {}})

    def handler(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        key = store.Key(run=ctx.tenant_id, entry=ctx.user_id, class_name=class_name)

        def step(state: bytes) -> tuple[str, bytes]:
            instance = pickle.loads(state)  # written by this run's own handlers
            response = backend.call(instance, name, dict(args))
            return response, pickle.dumps(instance) if kind == "write" else state

        try:
            response = store.run_call(
                ledger.engine(), key, name, ctx.operation_id, kind == "write", step
            )
        except store.NoInstance as exc:
            raise ToolError(str(exc), code=ErrorCode.NOT_FOUND, applied=False) from None
        return {"response": response}

    return Tool(
        name=name,
        description=str(doc.get("description", "")),
        arguments=parameters,
        kind=kind,
        handler=handler,
        effect=READ_ONLY if kind == "read" else SideEffect(),
        limits=LIMITS,
    )


def tools_of(class_name: str) -> list[Tool]:
    return [tool_for(class_name, doc) for doc in backend.function_docs(class_name)]


def registry() -> Registry:
    """Every multi-turn class's functions; each class a role allowed its own functions."""
    backend.use(None)
    tools: list[Tool] = []
    roles: dict[str, list[str]] = {}
    for class_name in backend.CLASSES:
        mine = tools_of(class_name)
        tools.extend(mine)
        roles[class_name] = [t.name for t in mine]
    return Registry.of(tools, roles)
