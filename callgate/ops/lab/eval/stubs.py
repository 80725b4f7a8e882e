"""Read-only stub tools for an imported suite (``callgate eval import-bfcl``).

Workers load a registry by ``module:attribute`` with no arguments, so the suite's tool
definitions reach them by path: ``callgate eval run`` sets ``CALLGATE_EVAL_STUBS`` to the
suite's ``stubs`` file (a JSON list of ``{name, description, parameters}``, ``parameters``
a JSON Schema) for the workers and for its own producer, and ``registry`` reads it.

Every stub is ``kind="read"`` with ``READ_ONLY`` effects, and its handler only records the
run in the eval ledger (a handler run, never an effect) and echoes its arguments back: no
stub can write anything, whatever a model proposes.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine

from callgate.core.errors import ConfigurationError
from callgate.ops.lab.eval import inputs, ledger
from callgate.ops.lab.settings import EvalSettings
from callgate.tools.registry import READ_ONLY, ExecutionContext, Registry, Tool

ENV = "CALLGATE_EVAL_STUBS"
ROLE = "bfcl"


def registry() -> Registry:
    """The stubs named in the file ``CALLGATE_EVAL_STUBS`` points to, all allowed to ``bfcl``."""
    path = EvalSettings.from_env().stubs
    if path is None:
        raise ConfigurationError(
            f"{ENV} is not set: it names the imported suite's stub tools file (callgate eval "
            "run sets it from the suite's stubs: field)"
        )
    text = inputs.read_text(path)  # within CALLGATE_EVAL_MAX_FILE_BYTES, which eval run passes on
    inputs.check_json_depth(text, f"{ENV}={path}")
    try:
        docs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{ENV}={path}: not a readable JSON file ({exc})") from None
    if not isinstance(docs, list):
        raise ConfigurationError(f"{ENV}={path}: expected a JSON list of tool definitions")
    tools = [stub(doc) for doc in docs]
    return Registry.of(tools, {ROLE: [t.name for t in tools]})


def stub(doc: dict[str, Any]) -> Tool:
    name = str(doc["name"])

    def echo(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        ledger.record_run(name, ctx.operation_id)
        return {"tool": name, "arguments": dict(args), "stub": True}

    return Tool(
        name=name,
        description=str(doc.get("description", "")),
        arguments=dict(doc.get("parameters") or {"type": "object", "properties": {}}),
        kind="read",
        handler=echo,
        effect=READ_ONLY,
    )


def install(engine: Engine) -> None:
    ledger.install(engine)


def seed(engine: Engine, setup: dict[str, Any]) -> None:
    """Nothing to seed: only the ledger is reset between fixtures."""
    ledger.reset(engine)
