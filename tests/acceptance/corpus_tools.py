"""A registry of hostile tools for the redaction corpus (``tests/redaction_corpus.py``).

Workers load it with ``CALLGATE_TOOLS=tests.acceptance.corpus_tools:registry``. Every tool
is a read; each returns, raises or logs the corpus's planted secrets in one family of shapes:

- ``corpus_values(part)``: a result holding secrets and ordinary values in one shape;
- ``corpus_schema``: a result with a declared schema (a ``dict[str, Any]`` field, ``pwd``);
- ``corpus_fail(part)``: a ``ToolError`` whose details carry secrets and an injection;
- ``corpus_audit``: an ``audit_field`` whose resource ids hold secrets;
- ``corpus_crash``: a handler exception whose text holds a URL password and a token;
- ``corpus_lookup``: a status lookup that fails with a password in its message;
- ``corpus_bytes(kind)``: a result that cannot be serialised (``bytes`` or a ``set``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from callgate.core.errors import ErrorCode, ToolError
from callgate.tools.registry import READ_ONLY, ExecutionContext, Facts, Principal, Registry, Tool
from tests.redaction_corpus import build

CORPUS = build()


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    part: str


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchemaResult(BaseModel):
    model_config = ConfigDict(extra="ignore")
    order_id: str
    pwd: str
    extra: dict[str, Any]


def _values(args: Part, ctx: ExecutionContext) -> dict[str, Any]:
    return CORPUS.results[args.part]


def _schema(args: NoArgs, ctx: ExecutionContext) -> dict[str, Any]:
    return CORPUS.schema_result


def _fail(args: Part, ctx: ExecutionContext) -> dict[str, Any]:
    raise ToolError(
        "the upstream refused", code=ErrorCode.NOT_FOUND, details=CORPUS.failures[args.part]
    )


def _audit(args: NoArgs, ctx: ExecutionContext) -> dict[str, Any]:
    return CORPUS.audit


def _crash(args: NoArgs, ctx: ExecutionContext) -> dict[str, Any]:
    raise RuntimeError(CORPUS.crash_message)


def _resolve(args: NoArgs, principal: Principal) -> Facts:
    raise RuntimeError(CORPUS.lookup_message)


def _bytes(args: Part, ctx: ExecutionContext) -> dict[str, Any]:
    if args.part == "set":
        return {"tags": {"a", "b"}}
    return {"blob": b"\x00\x01 raw"}


def registry() -> Registry:
    def read(name: str, arguments: type[BaseModel], handler: Any, **kw: Any) -> Tool:
        return Tool(name, f"corpus tool {name}", arguments, "read", handler, effect=READ_ONLY, **kw)

    tools = [
        read("corpus_values", Part, _values),
        read("corpus_schema", NoArgs, _schema, result=SchemaResult),
        read("corpus_fail", Part, _fail),
        read("corpus_audit", NoArgs, _audit, audit_field="resources"),
        read("corpus_crash", NoArgs, _crash),
        read("corpus_lookup", NoArgs, _values, resolve=_resolve),
        read("corpus_bytes", Part, _bytes),
    ]
    return Registry.of(tools, {"support": [t.name for t in tools]})
