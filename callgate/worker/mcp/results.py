"""MCP ``tools/call`` responses as correlated results. Pure: no I/O.

The application sends ``tools/call`` under a *new* JSON-RPC request id stored beside the
provider call id. ``normalise_result`` checks the response answers that request, then keys
the outcome back to the provider call id:

- the response id is not the request id → raises ``AdapterError``
  ``mcp_response_id_mismatch`` (the response belongs to some other call; it must not be
  attached to this one);
- a top-level JSON-RPC ``error`` is protocol space and terminal: ``-32602`` →
  ``mcp_invalid_params``, any other code → ``mcp_wire_error``; the server's message stays
  out of the result (it goes to the trace with the raw evidence);
- a response that is not a well-formed JSON-RPC 2.0 result is ``mcp_wire_error``, terminal;
- ``result.isError: true`` is a tool failure, classified by the server's stable
  ``structuredContent.errorCode``: ``invalid_arguments`` terminal (the model may fix its
  arguments in a *new* call), ``upstream_unavailable`` retryable with
  ``structuredContent.retryAfterMs``, anything else ``mcp_tool_execution_failed`` terminal.
  The text content becomes ``mcp_tool_detail`` details with secrets and stack traces
  redacted (``callgate.tools.results.redact_text``, the redactor safe results use) and each message
  capped;
- success → ``Succeeded`` whose ``data`` is ``{"content": [...]}`` plus
  ``"structuredContent"`` when the server sent one (``data`` is an object in callgate's
  result type, while MCP content is a list). Result values are not filtered here: the
  per-tool result schema does that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.core.errors import AdapterError, ErrorCode
from callgate.core.plain import show, to_plain
from callgate.core.types import (
    AppError,
    FailedRetryable,
    FailedTerminal,
    SafeErrorDetail,
    Succeeded,
)
from callgate.tools.results import redact_text

INVALID_PARAMS = -32602
DETAIL_CODE = "mcp_tool_detail"
MAX_DETAIL_LENGTH = 240  # a hard cap on a detail's length
MAX_DETAILS = 8
MAX_RETRY_AFTER_MS = 24 * 60 * 60 * 1000

Result = Succeeded | FailedRetryable | FailedTerminal


def sanitise(message: str, notes: list[str] | None = None) -> str:
    """Redact secrets and stack traces from one line of tool output, then cap its length.

    ``notes`` collects what was redacted or capped, for the trace.
    """
    notes = notes if notes is not None else []
    # redact_text appends a truncation marker past the cap; this cap is a hard one.
    return redact_text(message, MAX_DETAIL_LENGTH, notes)[:MAX_DETAIL_LENGTH]


def _details(content: object) -> tuple[SafeErrorDetail, ...]:
    if not isinstance(content, list):
        return ()
    texts = [
        item["text"]
        for item in content
        if isinstance(item, Mapping)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    return tuple(
        SafeErrorDetail(code=DETAIL_CODE, message=sanitise(text)) for text in texts[:MAX_DETAILS]
    )


def _same_id(response_id: object, request_id: str | int) -> bool:
    # JSON-RPC ids are strings or numbers; 1, 1.0, True and "1" are all different ids here.
    return type(response_id) is type(request_id) and response_id == request_id


def _retry_after(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RETRY_AFTER_MS:
        return value
    return None


def normalise_result(
    response: object, *, provider_call_id: str, tool_name: str, request_id: str | int
) -> Result:
    """The correlated result of one MCP ``tools/call``, keyed to ``provider_call_id``.

    ``response`` is the JSON-RPC response message (a dict, its JSON text, or an object with
    ``model_dump``). Raises ``AdapterError`` only when the response cannot be tied to
    ``request_id``; every response that answers the request becomes a result.
    """
    try:
        message = to_plain(response)
    except AdapterError as exc:
        raise AdapterError(exc.message, code=ErrorCode.MCP_WIRE_ERROR) from exc
    if not isinstance(message, Mapping):
        raise AdapterError("the MCP response is not a JSON object", code=ErrorCode.MCP_WIRE_ERROR)
    if not _same_id(message.get("id"), request_id):
        raise AdapterError(
            f"MCP response id {show(message.get('id'))} does not answer request {show(request_id)}",
            code=ErrorCode.MCP_RESPONSE_ID_MISMATCH,
        )

    def terminal(code: str, details: tuple[SafeErrorDetail, ...] = ()) -> FailedTerminal:
        error = AppError(code=str(code), details=details)
        return FailedTerminal(call_id=provider_call_id, tool_name=tool_name, error=error)

    wire_error = terminal(ErrorCode.MCP_WIRE_ERROR)
    if message.get("jsonrpc") != "2.0" or ("error" in message) == ("result" in message):
        return wire_error
    if "error" in message:
        error = message["error"]
        code = error.get("code") if isinstance(error, Mapping) else None
        if code == INVALID_PARAMS and isinstance(code, int) and not isinstance(code, bool):
            return terminal(ErrorCode.MCP_INVALID_PARAMS)
        return wire_error
    result = message["result"]
    if not isinstance(result, Mapping):
        return wire_error
    content = result.get("content", [])
    structured = result.get("structuredContent")
    flagged = result.get("isError", False)
    if not isinstance(content, list) or not isinstance(flagged, bool):
        return wire_error
    if structured is not None and not isinstance(structured, Mapping):
        return wire_error
    if flagged:
        return _tool_failure(content, structured or {}, provider_call_id, tool_name)
    data: dict[str, Any] = {"content": content}
    if structured is not None:
        data["structuredContent"] = dict(structured)
    return Succeeded(call_id=provider_call_id, tool_name=tool_name, data=data)


def _tool_failure(
    content: list[object], structured: Mapping[str, object], call_id: str, tool_name: str
) -> Result:
    details = _details(content)
    server_code = structured.get("errorCode")
    if server_code == "upstream_unavailable":
        error = AppError(
            code=str(ErrorCode.UPSTREAM_UNAVAILABLE),
            details=details,
            retry_after_ms=_retry_after(structured.get("retryAfterMs")),
        )
        return FailedRetryable(call_id=call_id, tool_name=tool_name, error=error)
    code = str(
        ErrorCode.INVALID_ARGUMENTS
        if server_code == "invalid_arguments"
        else ErrorCode.MCP_TOOL_EXECUTION_FAILED
    )
    return FailedTerminal(
        call_id=call_id, tool_name=tool_name, error=AppError(code=code, details=details)
    )
