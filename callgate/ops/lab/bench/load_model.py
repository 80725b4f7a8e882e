"""Which tier a fleet saturates first, from the per-call costs ``callgate bench costs``
measured. Pure: no I/O; ``callgate bench model`` reads the file and prints ``render``.

Each tier's capacity, in calls per second, for a call mix (the costs of each kind weighted
by its share):

- Postgres: its cores / the Postgres CPU of one call (submit, worker, relayer, collect).
- workers: the lesser of their CPU (N processes × their cores, at most one each: one Python
  process runs its calls on one core) / a worker's CPU per call, and their slots
  (N × K calls in flight) / the time a call holds a slot (the handler's latency plus the
  worker's own CPU per call, the least it can add).
- relayer: relayers × one core / the relayer's CPU per call.
- Redis: one core per Redis server (it runs commands on one thread) / Redis CPU per call;
  queues spread over ``redis_servers`` servers divide the calls between them.
- connections: not a rate but a wall: N × a worker's connections + the relayers' must fit
  in Postgres' max_connections, or the fleet never reaches its rate.

A capacity assumes the tier has those cores to itself and scales linearly up to them; the
measured costs are from one machine under its own load, so treat the figures as the order
of magnitude and the ranking of the tiers, not a promise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from callgate.core.errors import InputError

KINDS = ("reads", "writes")
# The costs the model reads from each kind of a costs file.
COSTS = (
    "pg_cpu_ms_per_call",
    "worker_cpu_ms_per_call",
    "relayer_cpu_ms_per_call",
    "redis_cpu_ms_per_call",
    "redis_commands_per_call",
    "pg_connections_per_worker",
    "pg_connections_per_relayer",
)
SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Fleet:
    workers: int
    concurrency: int
    pg_cores: float
    worker_cores: float = 1.0  # per worker process
    relayers: int = 1
    redis_servers: int = 1
    pg_max_connections: int | None = None  # None: the one of the measured server


@dataclass(frozen=True)
class Tier:
    name: str
    capacity: float  # calls per second
    bound: str  # what bounds it, in words


@dataclass(frozen=True)
class Prediction:
    fleet: Fleet
    mix: dict[str, float]
    handler_ms: float
    per_call: dict[str, float]  # the mix's costs
    tiers: list[Tier]  # by capacity, least first
    connections: float
    max_connections: int

    @property
    def connections_fit(self) -> bool:
        return self.connections <= self.max_connections

    @property
    def first(self) -> Tier:
        return self.tiers[0]


def parse_mix(raw: str) -> dict[str, float]:
    """``reads=0.8,writes=0.2`` → shares; each kind known, each share in [0, 1], summing to 1."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise InputError(
                f"--mix {raw!r}: expected kind=share pairs such as reads=0.8,writes=0.2"
            )
        if name not in KINDS:
            raise InputError(f"--mix {raw!r}: unknown kind {name!r} (known: {', '.join(KINDS)})")
        if name in mix:
            raise InputError(f"--mix {raw!r}: {name} given twice")
        try:
            share = float(value)
        except ValueError:
            raise InputError(f"--mix {raw!r}: {name}={value!r} is not a number") from None
        if not 0.0 <= share <= 1.0:
            raise InputError(f"--mix {raw!r}: {name}={value} is outside 0..1")
        mix[name] = share
    if not mix:
        raise InputError(f"--mix {raw!r}: expected kind=share pairs such as reads=0.8,writes=0.2")
    if abs(sum(mix.values()) - 1.0) > SUM_TOLERANCE:
        raise InputError(f"--mix {raw!r}: the shares sum to {sum(mix.values()):g}, not 1")
    return mix


def mixed_costs(costs: Mapping[str, Any], mix: Mapping[str, float]) -> dict[str, float]:
    """The costs of one call of the mix, from a costs document (``callgate bench costs``)."""
    kinds = costs.get("kinds")
    if not isinstance(kinds, Mapping):
        raise InputError("costs file: no 'kinds' (write one with `callgate bench costs`)")
    out = dict.fromkeys(COSTS, 0.0)
    for kind, share in mix.items():
        measured = kinds.get(kind)
        if not isinstance(measured, Mapping):
            raise InputError(
                f"costs file: {kind} were not measured (measured: {', '.join(kinds) or 'none'}); "
                f"run `callgate bench costs --kind {kind}`"
            )
        for name in COSTS:
            value = measured.get(name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise InputError(
                    f"costs file: {kind}.{name} is {value!r}, not a positive number "
                    "(measure again, on a quieter machine)"
                )
            out[name] += share * float(value)
    return out


def predict(
    costs: Mapping[str, Any], fleet: Fleet, mix: Mapping[str, float], handler_ms: float
) -> Prediction:
    _check_fleet(fleet, handler_ms)
    c = mixed_costs(costs, mix)
    max_connections = fleet.pg_max_connections
    if max_connections is None:
        measured = costs.get("machine", {}).get("pg_max_connections")
        if not isinstance(measured, int) or measured <= 0:
            raise InputError("costs file: no machine.pg_max_connections; pass --pg-max-connections")
        max_connections = measured
    n, k = fleet.workers, fleet.concurrency
    worker_cores = min(fleet.worker_cores, 1.0)
    slot_ms = handler_ms + c["worker_cpu_ms_per_call"]
    cpu_bound = n * worker_cores * 1000 / c["worker_cpu_ms_per_call"]
    slot_bound = n * k * 1000 / slot_ms
    if cpu_bound <= slot_bound:
        workers = Tier(
            "workers",
            cpu_bound,
            f"CPU: {n} × {worker_cores:g} core / {c['worker_cpu_ms_per_call']:.2f} ms",
        )
    else:
        workers = Tier(
            "workers",
            slot_bound,
            f"slots: {n}×{k} in flight / ({handler_ms:g} + {c['worker_cpu_ms_per_call']:.2f} ms)",
        )
    tiers = [
        Tier(
            "postgres",
            fleet.pg_cores * 1000 / c["pg_cpu_ms_per_call"],
            f"CPU: {fleet.pg_cores:g} cores / {c['pg_cpu_ms_per_call']:.2f} ms",
        ),
        workers,
        Tier(
            "relayer",
            fleet.relayers * 1000 / c["relayer_cpu_ms_per_call"],
            f"CPU: {fleet.relayers} × 1 core / {c['relayer_cpu_ms_per_call']:.2f} ms",
        ),
        Tier(
            "redis",
            fleet.redis_servers * 1000 / c["redis_cpu_ms_per_call"],
            f"CPU: {fleet.redis_servers} × 1 thread / {c['redis_cpu_ms_per_call']:.3f} ms",
        ),
    ]
    tiers.sort(key=lambda t: t.capacity)
    connections = (
        n * c["pg_connections_per_worker"] + fleet.relayers * c["pg_connections_per_relayer"]
    )
    return Prediction(
        fleet=fleet,
        mix=dict(mix),
        handler_ms=handler_ms,
        per_call=c,
        tiers=tiers,
        connections=connections,
        max_connections=max_connections,
    )


def _check_fleet(fleet: Fleet, handler_ms: float) -> None:
    for name, value in (
        ("--workers", fleet.workers),
        ("--concurrency", fleet.concurrency),
        ("--pg-cores", fleet.pg_cores),
        ("--worker-cores", fleet.worker_cores),
        ("--relayers", fleet.relayers),
        ("--redis-servers", fleet.redis_servers),
    ):
        if value <= 0:
            raise InputError(f"{name} {value}: must be positive")
    if handler_ms < 0:
        raise InputError(f"--handler-ms {handler_ms}: must be 0 or more")


def render(p: Prediction) -> str:
    f, c = p.fleet, p.per_call
    mix = ", ".join(f"{k} {v:.0%}" for k, v in p.mix.items())
    lines = [
        f"fleet: {f.workers} workers × K={f.concurrency} ({min(f.worker_cores, 1.0):g} core each), "
        f"{f.relayers} relayer(s), Postgres {f.pg_cores:g} cores, "
        f"{f.redis_servers} Redis server(s)",
        f"mix: {mix}; handler {p.handler_ms:g} ms",
        f"per call: Postgres {c['pg_cpu_ms_per_call']:.2f} ms CPU, worker "
        f"{c['worker_cpu_ms_per_call']:.2f} ms, relayer {c['relayer_cpu_ms_per_call']:.2f} ms, "
        f"Redis {c['redis_cpu_ms_per_call']:.3f} ms ({c['redis_commands_per_call']:.1f} commands)",
        "",
        f"{'tier':<10} {'calls/s':>9}  {'load':>5}  bound by",
    ]
    top = p.first.capacity
    for t in p.tiers:
        lines.append(f"{t.name:<10} {t.capacity:>9,.0f}  {top / t.capacity:>5.0%}  {t.bound}")
    fit = "fits" if p.connections_fit else "DOES NOT FIT"
    lines.append(
        f"{'conns':<10} {p.connections:>9.0f}  {p.connections / p.max_connections:>5.0%}  "
        f"{f.workers} × {c['pg_connections_per_worker']:.1f} + {f.relayers} × "
        f"{c['pg_connections_per_relayer']:.1f} of max_connections {p.max_connections}: {fit}"
    )
    lines.append("")
    if not p.connections_fit:
        lines.append(
            "saturates first: Postgres connections (the fleet needs more than max_connections:"
            " fewer workers, a pooler such as PgBouncer, or a higher max_connections)"
        )
    else:
        lines.append(
            f"saturates first: {p.first.name} at {p.first.capacity:,.0f} calls/s "
            f"(predicted throughput; {p.first.capacity * c['redis_commands_per_call']:,.0f} "
            "Redis commands/s)"
        )
    return "\n".join(lines)
