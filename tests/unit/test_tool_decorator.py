"""``@tool``: a typed function becomes a Tool the gate and the executor run like any other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from callgate import READ_ONLY, Downstream, ExecutionContext, Registry, SideEffect, Tool, tool
from callgate.core.errors import ConfigurationError, ErrorCode, ToolError
from callgate.tools import gate

Unit = Literal["celsius", "fahrenheit"]


class Weather(BaseModel):
    city: str
    temperature: float
    unit: Unit


@tool
def get_weather(city: str, unit: Unit = "celsius") -> Weather:
    """Current weather for a city.

    Args:
        city: The city's name, e.g. Seoul.
        unit: Temperature unit; celsius
            unless the user asks otherwise.
    """
    return Weather(city=city, temperature=21.5 if unit == "celsius" else 70.7, unit=unit)


CTX = ExecutionContext(
    tenant_id="tenant-a",
    user_id="user-17",
    operation_id="op-1",
    idempotency_key="key-1",
    fencing_token=7,
    request_id="req-1",
)


def _run(t: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    args = gate.validate_arguments(t, arguments)
    result = t.handler(args, CTX)
    if asyncio.iscoroutine(result):
        return asyncio.run(result)  # type: ignore[no-any-return]
    return result


def test_a_read_takes_its_schema_and_descriptions_from_the_signature_and_docstring() -> None:
    assert isinstance(get_weather, Tool)
    assert (get_weather.name, get_weather.kind) == ("get_weather", "read")
    assert get_weather.effect == READ_ONLY
    assert get_weather.description == "Current weather for a city."
    schema = get_weather.parameters()
    assert schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert schema["properties"]["city"]["description"] == "The city's name, e.g. Seoul."
    assert schema["properties"]["unit"]["description"] == (
        "Temperature unit; celsius unless the user asks otherwise."
    )
    assert get_weather.result is Weather


def test_the_handler_runs_the_function_on_validated_arguments_and_dumps_its_result() -> None:
    assert _run(get_weather, {"city": "Seoul"}) == {
        "city": "Seoul",
        "temperature": 21.5,
        "unit": "celsius",
    }


def test_arguments_the_signature_does_not_name_are_refused_by_the_schema_layer() -> None:
    with pytest.raises(ToolError) as refused:
        gate.validate_arguments(get_weather, {"city": "Seoul", "unit": "kelvin"})
    assert refused.value.code == ErrorCode.INVALID_ARGUMENTS
    with pytest.raises(ToolError):
        gate.validate_arguments(get_weather, {"city": "Seoul", "admin": True})


def test_an_execution_context_parameter_is_injected_and_never_shown_to_a_model() -> None:
    @tool(
        kind="write",
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, fencing=True),
    )
    def send_invoice(
        customer: Annotated[str, Field(min_length=1)], ctx: ExecutionContext
    ) -> dict[str, Any]:
        """Send an invoice."""
        return {"customer": customer, "key": ctx.idempotency_key, "fence": ctx.fencing_token}

    assert "ctx" not in send_invoice.parameters()["properties"]
    assert send_invoice.kind == "write"
    assert send_invoice.downstream == Downstream(idempotency_keys=True, fencing=True)
    assert _run(send_invoice, {"customer": "c-1"}) == {
        "customer": "c-1",
        "key": "key-1",
        "fence": 7,
    }


def test_async_functions_stay_async_so_the_worker_awaits_them_on_its_loop() -> None:
    @tool
    async def lookup_order(order_id: str) -> dict[str, str]:
        """Look an order up."""
        await asyncio.sleep(0)
        return {"order_id": order_id, "state": "shipped"}

    assert asyncio.iscoroutinefunction(lookup_order.handler)
    assert _run(lookup_order, {"order_id": "O-17"}) == {"order_id": "O-17", "state": "shipped"}


@dataclass
class Stock:
    symbol: str
    price: float


def test_results_that_are_not_objects_are_wrapped_and_dataclasses_dumped() -> None:
    @tool
    def count_orders(status: str) -> int:
        """Count orders in a status."""
        return 3

    @tool(name="stock_quote")
    def quote(symbol: str) -> Stock:
        """A stock's last price."""
        return Stock(symbol, 101.25)

    assert _run(count_orders, {"status": "open"}) == {"result": 3}
    assert quote.name == "stock_quote"
    assert _run(quote, {"symbol": "NVDA"}) == {"symbol": "NVDA", "price": 101.25}


@pytest.mark.parametrize(
    ("declared", "missing"),
    [
        ({}, "effect or downstream"),
        ({"effect": SideEffect()}, "downstream"),
        ({"downstream": Downstream()}, "effect"),
    ],
)
def test_a_write_that_does_not_state_its_effect_and_downstream_is_refused(
    declared: dict[str, Any], missing: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:

        @tool(kind="write", **declared)
        def refund(order_id: str) -> dict[str, Any]:
            """Refund an order."""
            return {}

    assert refused.value.code == ErrorCode.INVALID_CONFIGURATION
    assert f"does not state {missing}" in str(refused.value)


def test_other_declaration_mistakes_are_configuration_errors_naming_the_tool() -> None:
    def undocumented(x: int) -> dict[str, Any]:
        return {}

    def untyped(x) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        """Has a description."""
        return {}

    def lookup_promised(x: int) -> dict[str, Any]:
        """Has a description."""
        return {}

    cases = [
        (lambda: tool(undocumented), "has no description"),
        (lambda: tool(untyped), "parameter 'x' has no type annotation"),
        (
            lambda: tool(
                kind="write",
                effect=SideEffect(),
                downstream=Downstream(status_lookup=True),
            )(lookup_promised),
            "needs lookup=",
        ),
    ]
    for declare, message in cases:
        with pytest.raises(ConfigurationError) as refused:
            declare()
        assert message in str(refused.value)
        assert "@tool" in str(refused.value)


def test_declared_tools_join_a_registry_like_hand_written_ones() -> None:
    registry = Registry.of([get_weather], {"support": ["get_weather"]})
    (definition,) = registry.definitions_for(["support"])
    assert definition["name"] == "get_weather"
    assert definition["parameters"]["properties"]["city"]["type"] == "string"
