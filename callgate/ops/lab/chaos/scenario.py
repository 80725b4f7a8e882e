"""A chaos scenario is data: one TOML file in ``scenarios/`` names its workload, its stack
settings, its fault schedule and the outcome it expects.

```toml
summary = "what happens, in one line"
recovery_seconds = 30          # after the last fault, every call must be terminal by then

[stack]                        # passed to every process as CALLGATE_… settings
workers = 1
lease_seconds = 1
delays = "refund_payment=0:1500"   # CALLGATE_DEMO_DELAY_MS

[workload]                     # `turns` turns of these calls; "{turn}" in a string is the
turns = 2                      # turn's number
calls = [{ tool = "get_stock", arguments = { symbol = "NVDA" } }]

[[faults]]                     # injected in order, each once its point is reached
action = "kill_worker"
at = "crash_gap"
tool = "refund_payment"

[expect]
outcomes = { refund_payment = ["succeeded"] }   # allowed outcome per tool
at_least = { takeovers = 1 }                    # bounds on measured counts (a number, or
at_most = { invocations = "calls" }             # the name of another count)
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from callgate.core.errors import InputError

ACTIONS = {
    "duplicate": "enqueue the target calls' jobs again `copies` times",
    "kill_worker": "SIGKILL a worker process (the call's owner, a random one, or all)",
    "stop_worker": "SIGSTOP a worker past its lease; SIGCONT after the new owner finished",
    "kill_relayer": "SIGKILL the relayer between publish and mark",
    "kill_sweeper": "SIGKILL the sweeper process",
    "flush_redis": "FLUSHALL on the runner's own Redis",
    "restart_redis": "SIGKILL the runner's own Redis and start it again, empty",
    "terminate_backends": "pg_terminate_backend every session of the scenario's database",
    "restart_postgres": "stop the runner's own PostgreSQL (immediate) and start it again",
    "outage": "the tool's downstream answers upstream_unavailable for `seconds`, or to its"
    " next `requests` requests",
    "approve": "a person of the tenant approves the parked call",
    "freeze_replica": "wait until the streaming replica has everything, then stop it: what"
    " the primary commits from now on is lost by the failover",
    "fail_over": "kill the primary (immediate) and promote the frozen replica on its port",
}
# A replicated scenario keeps callgate's rows and the downstream's on two servers, so its
# faults can only wait for points that read callgate's rows alone.
REPLICATED_POINTS = ("start", "submitted", "progress", "published")
POINTS = {
    "start": "before the workload is submitted",
    "submitted": "as soon as the workload is submitted",
    "started": "the target call's handler started, before its downstream call",
    "crash_gap": "the target write applied downstream, its call not yet completed",
    "completed": "the target call has its terminal result",
    "published": "the relayer published a result and has not marked it yet",
    "parked": "the target call waits for an approval",
    "progress": "`fraction` of the calls are terminal",
}
VICTIMS = ("owner", "random", "all")
COUNTS = (
    "calls",
    "turns",
    "writes",
    "faults",
    "side_effects",
    "requests",
    "invocations",
    "write_invocations",
    "reservations",
    "takeovers",
    "fence_rejections",
    "stale_completions",
    "duplicates",
    "outage_refusals",
    "approvals_granted",
    "reconciliation_pending",
    "failovers",
    "doubted",
    "adopted",
    "lost_turns",
)
_STACK_KEYS = {
    "workers": int,
    "lease_seconds": float,
    "sweep_seconds": float,
    "stale_seconds": float,
    "delays": str,
    "replacement_delays": bool,
    "relayer_mark_delay_ms": int,
    "approval_amount": int,
    "own_redis": bool,
    "own_postgres": bool,
    "replicated": bool,
    "sweeper": bool,
}


@dataclass(frozen=True)
class StackSpec:
    """The processes a scenario runs and the settings they get."""

    workers: int = 2
    lease_seconds: float = 1.0
    sweep_seconds: float = 0.2
    stale_seconds: float = 1.0
    delays: str = ""
    replacement_delays: bool = False
    relayer_mark_delay_ms: int = 0
    approval_amount: int = 100_000
    own_redis: bool = False
    own_postgres: bool = False
    # callgate's database on a primary with an asynchronous streaming replica of the
    # runner's own; the downstreams and the invocation ledger stay on the run's server.
    replicated: bool = False
    sweeper: bool = True


@dataclass(frozen=True)
class CallSpec:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Workload:
    turns: int
    calls: tuple[CallSpec, ...]


@dataclass(frozen=True)
class FaultSpec:
    """One fault: what to do (``action``) once the named point is reached (``at``)."""

    action: str
    at: str = "submitted"
    tool: str | None = None
    call: int | str = 0
    victim: str = "owner"
    restart: bool = True
    copies: int = 1
    seconds: float = 1.0
    requests: int = 0
    fraction: float = 0.3
    jitter_ms: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Expect:
    outcomes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    at_least: dict[str, int | str] = field(default_factory=dict)
    at_most: dict[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    stack: StackSpec
    workload: Workload
    faults: tuple[FaultSpec, ...]
    expect: Expect
    recovery_seconds: float = 30.0

    @property
    def fault_names(self) -> str:
        return ", ".join(f.action for f in self.faults if f.action != "approve") or "none"


def names() -> list[str]:
    """Every scenario of the catalogue, sorted."""
    folder = resources.files("callgate.ops.lab.chaos").joinpath("scenarios")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load(name: str) -> Scenario:
    """The catalogue's scenario ``name``; an unknown name is an ``InputError``."""
    known = names()
    if name not in known:
        raise InputError(f"unknown chaos scenario {name!r}; known: {', '.join(known)}")
    path = resources.files("callgate.ops.lab.chaos").joinpath("scenarios", f"{name}.toml")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"scenario {name}: not valid TOML ({exc})") from None
    return parse(name, doc)


def parse(name: str, doc: dict[str, Any]) -> Scenario:
    """Check a scenario document and build it; every mistake is an ``InputError``."""
    where = f"scenario {name}"
    _only(doc, {"summary", "recovery_seconds", "stack", "workload", "faults", "expect"}, where)
    stack = _stack(doc.get("stack", {}), f"{where} [stack]")
    workload = _workload(doc.get("workload"), f"{where} [workload]")
    faults = tuple(
        _fault(f, f"{where} [[faults]] #{i + 1}") for i, f in enumerate(doc.get("faults", []))
    )
    expect = _expect(doc.get("expect", {}), f"{where} [expect]")
    _check_replicated(stack, faults, where)
    return Scenario(
        name=name,
        summary=_typed(doc.get("summary", ""), str, f"{where}: summary"),
        stack=stack,
        workload=workload,
        faults=faults,
        expect=expect,
        recovery_seconds=float(
            _typed(doc.get("recovery_seconds", 30.0), (int, float), f"{where}: recovery_seconds")
        ),
    )


def _check_replicated(stack: StackSpec, faults: tuple[FaultSpec, ...], where: str) -> None:
    replica_faults = [f for f in faults if f.action in ("freeze_replica", "fail_over")]
    if replica_faults and not stack.replicated:
        raise InputError(f"{where}: {replica_faults[0].action} needs replicated = true in [stack]")
    if not stack.replicated:
        return
    if stack.own_postgres:
        raise InputError(f"{where}: [stack] replicated and own_postgres exclude each other")
    for f in faults:
        if f.at not in REPLICATED_POINTS:
            raise InputError(
                f"{where}: a replicated scenario's faults wait for {', '.join(REPLICATED_POINTS)}"
                f" (the point {f.at!r} reads the downstream, which is on another server)"
            )
    actions = [f.action for f in faults]
    if "fail_over" in actions and "freeze_replica" not in actions[: actions.index("fail_over")]:
        raise InputError(f"{where}: fail_over needs a freeze_replica before it")


def _only(doc: Any, keys: set[str], where: str) -> None:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected a table")
    unknown = sorted(set(doc) - keys)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise InputError(f"{where}: expected {kind}, got a boolean")
    if not isinstance(value, kind):
        raise InputError(f"{where}: expected {kind}, got {type(value).__name__}")
    return value


def _stack(doc: Any, where: str) -> StackSpec:
    _only(doc, set(_STACK_KEYS), where)
    values: dict[str, Any] = {}
    for key, kind in _STACK_KEYS.items():
        if key in doc:
            accepted: type | tuple[type, ...] = (int, float) if kind is float else kind
            values[key] = kind(_typed(doc[key], accepted, f"{where} {key}"))
    spec = StackSpec(**values)
    if spec.workers < 1 or spec.lease_seconds < 0.5:
        raise InputError(f"{where}: needs workers >= 1 and lease_seconds >= 0.5")
    return spec


def _workload(doc: Any, where: str) -> Workload:
    _only(doc, {"turns", "calls"}, where)
    turns = _typed(doc.get("turns", 1), int, f"{where} turns")
    calls = _typed(doc.get("calls", []), list, f"{where} calls")
    if turns < 1 or not calls:
        raise InputError(f"{where}: needs turns >= 1 and at least one call")
    specs = []
    for i, c in enumerate(calls):
        _only(c, {"tool", "arguments"}, f"{where} call #{i + 1}")
        specs.append(
            CallSpec(
                tool=_typed(c.get("tool"), str, f"{where} call #{i + 1} tool"),
                arguments=_typed(c.get("arguments", {}), dict, f"{where} call #{i + 1}"),
            )
        )
    return Workload(turns=turns, calls=tuple(specs))


def _fault(doc: Any, where: str) -> FaultSpec:
    keys = {f for f in FaultSpec.__dataclass_fields__}
    _only(doc, keys, where)
    action = doc.get("action")
    if action not in ACTIONS:
        raise InputError(f"{where}: action must be one of {', '.join(ACTIONS)}")
    at = doc.get("at", "submitted")
    if at not in POINTS:
        raise InputError(f"{where}: at must be one of {', '.join(POINTS)}")
    if at in ("started", "crash_gap", "completed", "parked") and not doc.get("tool"):
        raise InputError(f"{where}: point {at!r} needs the tool whose call it watches")
    victim = doc.get("victim", "owner")
    if victim not in VICTIMS:
        raise InputError(f"{where}: victim must be one of {', '.join(VICTIMS)}")
    watches_call = at in ("started", "crash_gap", "completed", "parked")
    if action == "stop_worker" and not watches_call:
        raise InputError(f"{where}: stop_worker stops a call's owner: use a point that watches it")
    if action == "kill_worker" and victim == "owner" and not watches_call:
        raise InputError(f"{where}: victim 'owner' needs a point that watches a call")
    if action == "approve" and at != "parked":
        raise InputError(f"{where}: approve happens at the point 'parked'")
    if action == "outage" and not doc.get("tool"):
        raise InputError(f"{where}: outage needs the tool whose downstream goes down")
    jitter = doc.get("jitter_ms", [0, 0])
    if (
        not isinstance(jitter, list)
        or len(jitter) != 2
        or not all(isinstance(j, int) and j >= 0 for j in jitter)
        or jitter[0] > jitter[1]
    ):
        raise InputError(f"{where}: jitter_ms must be [low, high] milliseconds")
    call = doc.get("call", 0)
    if not (call == "random" or (isinstance(call, int) and call >= 0)):
        raise InputError(f'{where}: call must be an index (0, 1, ...) or "random"')
    return FaultSpec(
        action=action,
        at=at,
        tool=doc.get("tool"),
        call=call,
        victim=victim,
        restart=bool(_typed(doc.get("restart", True), bool, f"{where} restart")),
        copies=_typed(doc.get("copies", 1), int, f"{where} copies"),
        seconds=float(_typed(doc.get("seconds", 1.0), (int, float), f"{where} seconds")),
        requests=_typed(doc.get("requests", 0), int, f"{where} requests"),
        fraction=float(_typed(doc.get("fraction", 0.3), (int, float), f"{where} fraction")),
        jitter_ms=(jitter[0], jitter[1]),
    )


def _expect(doc: Any, where: str) -> Expect:
    _only(doc, {"outcomes", "at_least", "at_most"}, where)
    outcomes = {
        tool: tuple(_typed(v, list, f"{where} outcomes.{tool}"))
        for tool, v in _typed(doc.get("outcomes", {}), dict, f"{where} outcomes").items()
    }
    bounds: dict[str, dict[str, int | str]] = {}
    for kind in ("at_least", "at_most"):
        table = _typed(doc.get(kind, {}), dict, f"{where} {kind}")
        for metric, bound in table.items():
            if metric not in COUNTS or not (
                (isinstance(bound, int) and not isinstance(bound, bool)) or bound in COUNTS
            ):
                raise InputError(
                    f"{where} {kind}.{metric}: counts are {', '.join(COUNTS)}; a bound is a "
                    "number or another count's name"
                )
        bounds[kind] = table
    return Expect(outcomes=outcomes, at_least=bounds["at_least"], at_most=bounds["at_most"])
