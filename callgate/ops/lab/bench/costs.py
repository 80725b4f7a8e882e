"""``callgate bench costs``: what one call costs each tier, measured on real processes.

W ``callgate worker`` processes and one ``callgate relayer`` drain calls submitted through
``Producer.submit`` beforehand (as ``pipeline.burst`` does, but the workers are not burst
workers: they stay up until sampled, so no process exits inside a window). While they run,
the bench samples every ``SAMPLE_SECONDS``: the calls completed and the outbox rows published
(Postgres), each child's CPU (/proc utime + stime), the CPU of each Postgres backend that
serves a child (pg_stat_activity's client_port matched to the child's sockets, see ``cpu``),
Redis' ``INFO cpu`` and ``INFO commandstats``, and the whole Postgres server's CPU (the
postmaster's process tree).

Steady state, not start-up: a worker's costs are the deltas between the first sample with
``WARM_UP`` of the calls completed and the first with every call completed, divided by the
calls completed between them; the relayer's the same over published rows. Start-up
(imports, connections, registration, the pools filling) happens before and is outside both
windows; a backend that connects inside a window counts from the first sample that sees it
(``window.pg_connections_opened`` says how many did).
Redis and the whole server are shared with whatever else runs on them, so their deltas have
an idle baseline subtracted: their rates over ``BASELINE_SECONDS`` before the run, times the
window's length. The producer's side (submit before the workers start, collect after they
stop) is measured around those phases, its own Postgres backend and the Redis deltas.

With a ``Watch`` (``callgate bench costs --statements``, see ``statements``), the run tells it
its moments (``MOMENTS``), so it can read the server's own counters at the same boundaries.

Every figure is measured; none is assumed. Postgres CPU of the demo tools' own tables (the
worker's ``callgate-downstream`` connection) is reported apart from callgate's: a real
tool's database is its own.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import text

from callgate.ops.lab.bench import cpu, measure, procs, workload
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name
from callgate.ops.lab.bench.workload import CONTEXT
from callgate.producer import Producer

SAMPLE_SECONDS = 0.05
BASELINE_SECONDS = 1.0
# The share of the calls a window waits for before it opens: by then every worker has
# imported its tools and filled its connection pool (all K slots are busy from the first
# reservation, the queue holding every call), so what follows is steady state.
WARM_UP = 0.1
# A window spans at least this many samples. Process CPU is read a few milliseconds after
# the progress counts in each sample, so a burst of completions can fall between the two
# reads of one sample; over a window this short the CPU could read as zero.
MIN_WINDOW_SAMPLES = 4
RUN_TIMEOUT_SECONDS = 300.0
KINDS = ("reads", "writes")
# The worker's connection to the demo tools' tables: the tool's database, not callgate's.
DOWNSTREAM_APP = "callgate-downstream"
# The bench's own connection (progress queries, pg_stat_activity): never a cost of a call.
BENCH_APP = "callgate-bench"

PROGRESS_SQL = """
SELECT (SELECT count(*) FROM callgate.calls
         WHERE turn_id = ANY(CAST(:turns AS uuid[])) AND completed_at IS NOT NULL) AS completed,
       (SELECT count(*) FROM callgate.outbox
         WHERE turn_id = ANY(CAST(:turns AS uuid[])) AND published_at IS NOT NULL) AS published,
       (SELECT count(*) FROM callgate.outbox
         WHERE turn_id = ANY(CAST(:turns AS uuid[]))) AS outbox
"""
# What a ``Watch`` is told, in this order: the submit's start and end, the steady-state
# window's first sample (the one ``_reduce``
# opens the worker's window at) and the last (every call completed and published), the
# collect's start and end, and every process stopped and the producer closed.
MOMENTS = ("submit", "submitted", "window", "drained", "collect", "collected", "stopped")


class Watch(Protocol):
    """Something measured around a run's moments (``MOMENTS``), reported with its costs."""

    def mark(self, moment: str) -> None: ...

    def report(self) -> dict[str, Any]: ...


BACKENDS_SQL = """
SELECT pid, client_port, application_name FROM pg_stat_activity
 WHERE datname = current_database() AND client_port IS NOT NULL AND client_port > 0
"""


@dataclass
class Sample:
    at: float
    completed: int
    published: int
    outbox: int
    procs: dict[int, float]  # child pid → CPU seconds
    # backend pid → (pid of the process it serves, application_name, CPU seconds)
    backends: dict[int, tuple[int, str, float]]
    redis_cpu: float
    redis_commands: dict[str, int]
    pg_server: float


@dataclass
class Probe:
    """What the bench samples with: its own connection, Redis, the server's postmaster."""

    services: Services
    turns: list[str] = field(default_factory=list)
    owners: dict[int, str] = field(default_factory=dict)  # pid → role

    def __post_init__(self) -> None:
        with self.services.engine.connect() as conn:
            backend, self.server_port = conn.execute(
                text("SELECT pg_backend_pid(), inet_server_port()")
            ).one()
        parent = _ppid(int(backend))
        if parent is None or self.server_port is None:
            raise BenchError(
                "bench costs reads Postgres' CPU from /proc: it runs on the database's "
                "machine, over TCP (not a Unix socket)"
            )
        self.postmaster = parent

    def sample(self) -> Sample:
        redis = self.services.redis
        with self.services.engine.connect() as conn:
            progress = conn.execute(text(PROGRESS_SQL), {"turns": self.turns}).one()
            rows = conn.execute(text(BACKENDS_SQL)).all()
        pids = [*self.owners]
        ports = cpu.local_ports(pids, int(self.server_port))
        backends: dict[int, tuple[int, str, float]] = {}
        for pid, port, app in rows:
            owner = ports.get(int(port))
            used = cpu.cpu_seconds(int(pid), reaped=False)
            if owner is not None and used is not None and app != BENCH_APP:
                backends[int(pid)] = (owner, str(app), used)
        own = {pid: cpu.tree_cpu_seconds(pid) for pid in pids if pid != os.getpid()}
        info_cpu = redis.info("cpu")
        stats = redis.info("commandstats")
        return Sample(
            at=time.monotonic(),
            completed=int(progress.completed),
            published=int(progress.published),
            outbox=int(progress.outbox),
            procs=own,
            backends=backends,
            redis_cpu=float(info_cpu["used_cpu_sys"]) + float(info_cpu["used_cpu_user"]),
            # INFO is the bench's own sampling, never a call's.
            redis_commands={
                k.removeprefix("cmdstat_"): int(v["calls"])
                for k, v in stats.items()
                if k != "cmdstat_info"
            },
            pg_server=cpu.tree_cpu_seconds(self.postmaster),
        )


def _ppid(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def _commands(a: Sample, b: Sample) -> dict[str, int]:
    return {k: n - a.redis_commands.get(k, 0) for k, n in b.redis_commands.items()}


def _proc_delta(window: Sequence[Sample], pick: Callable[[int], bool]) -> float:
    """CPU of the picked children from the window's first sample to its last."""
    first, last = window[0], window[-1]
    return sum(v - first.procs.get(p, 0.0) for p, v in last.procs.items() if pick(p))


def _backend_delta(window: Sequence[Sample], pick: Callable[[int, str], bool]) -> float:
    """CPU of the picked backends over the window: each backend's last value seen in it less
    its first. A pool opens connections lazily, when statements overlap, so some connect
    inside a window; counting each from the first sample that saw it leaves out most of its
    start-up (a new backend's caches, ~9 ms of CPU), a one-off a long-running worker does
    not pay per call."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for s in window:
        for b, (owner, app, v) in s.backends.items():
            if pick(owner, app):
                first.setdefault(b, v)
                last[b] = v
    return sum(v - first[b] for b, v in last.items())


@dataclass(frozen=True)
class Rates:
    """Shared servers' background work per second, measured idle before a run."""

    redis_cpu: float
    redis_commands: float
    pg_server: float


def _baseline(probe: Probe) -> Rates:
    a = probe.sample()
    time.sleep(BASELINE_SECONDS)
    b = probe.sample()
    seconds = b.at - a.at
    return Rates(
        redis_cpu=(b.redis_cpu - a.redis_cpu) / seconds,
        redis_commands=sum(_commands(a, b).values()) / seconds,
        pg_server=(b.pg_server - a.pg_server) / seconds,
    )


def _first(samples: Sequence[Sample], ok: Callable[[Sample], bool], what: str) -> int:
    for i, s in enumerate(samples):
        if ok(s):
            return i
    raise BenchError(f"bench costs: no sample where {what}")


def measure_kind(
    services: Services,
    kind: str,
    *,
    calls: int,
    workers: int,
    concurrency: int,
    watch: Watch | None = None,
    observer: Services | None = None,
    env_extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One run of ``calls`` calls of ``kind`` (``reads``: no-op get_stock; ``writes``:
    refund_payment on the demo's payments) through ``workers`` workers of ``concurrency``.

    ``observer``: the services the bench's own statements (sampling, the refunds' payments,
    VACUUM, the checks) go through, when they must be told apart from the calls' (by the
    database user); ``env_extra``: more variables for the producer, workers and relayer."""
    bench = observer or services
    turns = workload.reads(calls) if kind == "reads" else workload.refunds(bench.engine, calls)
    queue = queue_name("costs")
    env = services.env(queue, CALLGATE_WORKER_CONCURRENCY=str(concurrency), **(env_extra or {}))
    producer = Producer.from_env(services.settings(env))
    probe = Probe(bench)

    def mark(moment: str) -> None:
        if watch is not None:
            watch.mark(moment)

    probe.owners[os.getpid()] = "producer"
    children: list[procs.Child] = []
    try:
        with producer.engine.connect():  # its connection made before the submit is measured
            pass
        producer.redis.ping()
        background = _baseline(probe)

        before = probe.sample()
        mark("submit")
        for proposals in turns:
            probe.turns.append(producer.submit(proposals, CONTEXT).turn_id)
        mark("submitted")
        submitted = probe.sample()
        bench.tidy()  # as the bench does before every measured run

        children.append(procs.callgate(["relayer"], env))
        children += [procs.callgate(["worker"], env) for _ in range(workers)]
        for child in children:
            probe.owners[child.pid] = "relayer" if child is children[0] else "worker"
        samples = _run(probe, children, calls, mark)
        procs.stop(children)
        procs.forget(children)

        collect_start = probe.sample()
        mark("collect")
        for turn_id in probe.turns:
            if not producer.collect(turn_id, timeout=30).complete:
                raise BenchError(f"bench costs: turn {turn_id} did not fan in")
        mark("collected")
        collected = probe.sample()
        window = measure.window(bench.engine, probe.turns)
        if window.terminal != calls or window.unpublished:
            raise BenchError(f"bench costs: {calls - window.terminal} of {calls} calls did not end")
        overhead = statistics.median(
            measure.stages(bench.engine, probe.turns)["reserved→completed"]
        )
    finally:
        procs.stop(children)
        delete_keys(producer.redis, f"callgate:{queue}:*")
        delete_keys(producer.redis, f"rq:*{queue}*")
        producer.close()
    mark("stopped")
    me = os.getpid()
    return _reduce(
        kind=kind,
        calls=calls,
        workers=workers,
        concurrency=concurrency,
        background=background,
        submit=(before, submitted),
        collect=(collect_start, collected),
        samples=samples,
        roles=probe.owners,
        me=me,
        overhead_ms=overhead,
    )


def _warm(calls: int) -> int:
    """The calls completed when the worker's window opens."""
    return max(1, int(calls * WARM_UP))


def _run(
    probe: Probe, children: list[procs.Child], calls: int, mark: Callable[[str], None]
) -> list[Sample]:
    samples: list[Sample] = []
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    opened = False
    while True:
        s = probe.sample()
        samples.append(s)
        if not opened and s.completed >= _warm(calls):
            mark("window")  # the sample _reduce opens the worker's window at
            opened = True
        if s.completed == calls and s.published == s.outbox > 0:
            mark("drained")
            return samples
        for child in children:
            if child.proc.poll() is not None:
                raise BenchError(f"callgate exited {child.proc.returncode}: {child.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(
                f"bench costs: {s.completed} of {calls} calls after {RUN_TIMEOUT_SECONDS:g}s"
            )
        time.sleep(SAMPLE_SECONDS)


def _reduce(
    *,
    kind: str,
    calls: int,
    workers: int,
    concurrency: int,
    background: Rates,
    submit: tuple[Sample, Sample],
    collect: tuple[Sample, Sample],
    samples: list[Sample],
    roles: dict[int, str],
    me: int,
    overhead_ms: float,
) -> dict[str, Any]:
    warm = _warm(calls)
    w0 = _first(samples, lambda s: s.completed >= warm, f"{warm} calls had completed")
    w1 = _first(samples, lambda s: s.completed == calls, "every call had completed")
    r0 = _first(
        samples, lambda s: s.published >= s.outbox * WARM_UP > 0, "results had been published"
    )
    r1 = len(samples) - 1
    done = calls - samples[w0].completed
    rows = samples[r1].outbox
    published = (rows - samples[r0].published) * calls / rows  # in calls
    short = min(w1 - w0, r1 - r0) + 1 < MIN_WINDOW_SAMPLES
    if short or done <= 0 or published <= 0:
        raise BenchError(
            f"bench costs: {calls} calls ran within fewer than {MIN_WINDOW_SAMPLES} samples "
            f"{SAMPLE_SECONDS:g}s apart, too few to measure; run more calls (--calls)"
        )
    worker_win, relayer_win = samples[w0 : w1 + 1], samples[r0 : r1 + 1]

    def is_(role: str) -> Callable[[int], bool]:
        return lambda pid: roles.get(pid) == role

    worker_cpu = _proc_delta(worker_win, is_("worker")) / done
    relayer_cpu = _proc_delta(relayer_win, is_("relayer")) / published
    pg = {
        "submit": _backend_delta(submit, lambda o, a: o == me) / calls,
        "worker": _backend_delta(worker_win, lambda o, a: is_("worker")(o) and a != DOWNSTREAM_APP)
        / done,
        "relayer": _backend_delta(relayer_win, lambda o, a: is_("relayer")(o)) / published,
        "collect": _backend_delta(collect, lambda o, a: o == me) / calls,
    }
    downstream = (
        _backend_delta(worker_win, lambda o, a: is_("worker")(o) and a == DOWNSTREAM_APP) / done
    )

    # The shared servers over the whole pipeline: from the first completion to the last
    # publish, progress being the mean of the two stages' (each in calls).
    def progress(s: Sample) -> float:
        return (s.completed + s.published * calls / rows) / 2

    a, b = samples[w0], samples[r1]
    run_calls = progress(b) - progress(a)
    seconds = b.at - a.at
    redis_cmds = {
        "submit": _net_commands(*submit, background) / calls,
        "run": _net_commands(a, b, background) / run_calls,
        "collect": _net_commands(*collect, background) / calls,
    }
    redis_cpu = {
        "submit": _net(submit[1].redis_cpu - submit[0].redis_cpu, submit, background.redis_cpu)
        / calls,
        "run": (b.redis_cpu - a.redis_cpu - background.redis_cpu * seconds) / run_calls,
        "collect": _net(collect[1].redis_cpu - collect[0].redis_cpu, collect, background.redis_cpu)
        / calls,
    }
    top = sorted(_commands(submit[0], collect[1]).items(), key=lambda kv: -kv[1])[:8]
    conns = _connections(samples, roles)
    opened = set().union(*(s.backends for s in worker_win)) - set(worker_win[0].backends)
    ms = 1000.0
    return {
        "kind": kind,
        "calls": calls,
        "workers": workers,
        "concurrency": concurrency,
        "pg_cpu_ms_per_call": round(sum(pg.values()) * ms, 3),
        "pg_cpu_ms_per_call_by_stage": {k: round(v * ms, 3) for k, v in pg.items()},
        "downstream_pg_cpu_ms_per_call": round(downstream * ms, 3),
        "pg_server_cpu_ms_per_call": round(
            (b.pg_server - a.pg_server - background.pg_server * seconds) / run_calls * ms, 3
        ),
        "worker_cpu_ms_per_call": round(worker_cpu * ms, 3),
        "relayer_cpu_ms_per_call": round(relayer_cpu * ms, 3),
        "redis_cpu_ms_per_call": round(sum(redis_cpu.values()) * ms, 4),
        "redis_cpu_ms_per_call_by_stage": {k: round(v * ms, 4) for k, v in redis_cpu.items()},
        "redis_commands_per_call": round(sum(redis_cmds.values()), 2),
        "redis_commands_per_call_by_stage": {k: round(v, 2) for k, v in redis_cmds.items()},
        "redis_top_commands": dict(top),
        **conns,
        "call_overhead_ms_p50": round(overhead_ms, 2),
        "window": {
            "worker_seconds": round(worker_win[-1].at - worker_win[0].at, 3),
            "worker_calls": done,
            "calls_per_s": round(done / max(worker_win[-1].at - worker_win[0].at, 1e-6), 1),
            "relayer_seconds": round(relayer_win[-1].at - relayer_win[0].at, 3),
            "relayer_calls": round(published, 1),
            "samples": len(samples),
            "pg_connections_opened": len(opened),
        },
        "background_per_s": {
            "redis_commands": round(background.redis_commands, 1),
            "redis_cpu_ms": round(background.redis_cpu * ms, 2),
            "pg_server_cpu_ms": round(background.pg_server * ms, 1),
        },
    }


def _net(delta: float, phase: tuple[Sample, Sample], rate: float) -> float:
    return delta - rate * (phase[1].at - phase[0].at)


def _net_commands(a: Sample, b: Sample, background: Rates) -> float:
    return sum(_commands(a, b).values()) - background.redis_commands * (b.at - a.at)


def _connections(samples: Sequence[Sample], roles: dict[int, str]) -> dict[str, Any]:
    """Peak connections each child held to Postgres over the run, averaged over the workers.
    A connection is a level, not a rate, so start-up counts. The demo tools' own pool
    (``DOWNSTREAM_APP``) is reported apart: a real tool's database is its own."""
    peak: dict[int, int] = {}
    by_app: dict[tuple[int, str], int] = {}
    for s in samples:
        count: dict[int, int] = {}
        apps: dict[tuple[int, str], int] = {}
        for owner, app, _ in s.backends.values():
            if app != DOWNSTREAM_APP:
                count[owner] = count.get(owner, 0) + 1
            apps[(owner, app)] = apps.get((owner, app), 0) + 1
        for k, n in count.items():
            peak[k] = max(peak.get(k, 0), n)
        for key, n in apps.items():
            by_app[key] = max(by_app.get(key, 0), n)
    workers = [p for p, r in roles.items() if r == "worker"]
    relayers = [p for p, r in roles.items() if r == "relayer"]
    apps_seen = sorted({app for (p, app) in by_app if p in workers})
    return {
        "pg_connections_per_worker": round(sum(peak.get(p, 0) for p in workers) / len(workers), 2),
        "pg_connections_per_worker_by_application": {
            app: round(sum(by_app.get((p, app), 0) for p in workers) / len(workers), 2)
            for app in apps_seen
        },
        "pg_connections_per_relayer": round(
            sum(peak.get(p, 0) for p in relayers) / max(len(relayers), 1), 2
        ),
    }


def round_trips(services: Services, kind: str, calls: int) -> dict[str, float]:
    """Postgres round trips and Redis commands per call, counted inside one process by
    ``roundtrips`` (every stage: submit, worker, relayer, collect)."""
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": services.database_url,
        "CALLGATE_REDIS_URL": services.redis_url,
    }
    argv = [sys.executable, "-m", "callgate.ops.lab.bench.roundtrips", "--json"]
    argv += ["--kind", kind.removesuffix("s"), "--calls", str(calls)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"round trips ({kind}): {done.stderr.strip().splitlines()[-1:]}")
    phases = json.loads(done.stdout.splitlines()[-1])["phases"]
    return {
        "calls": calls,
        "pg_round_trips_per_call": round(sum(p["pg_round_trips"] for p in phases.values()), 2),
        "pg_commits_per_call": round(sum(p["pg_commits"] for p in phases.values()), 2),
        "redis_commands_per_call": round(sum(p["redis_commands"] for p in phases.values()), 2),
        "redis_round_trips_per_call": round(
            sum(p["redis_round_trips"] for p in phases.values()), 2
        ),
    }


def run(
    services: Services,
    *,
    kinds: Sequence[str],
    calls: int,
    workers: int,
    concurrency: int,
    command: str,
    watches: Callable[[str], Watch] | None = None,
    observer: Services | None = None,
    env_extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every kind's costs, and the machine they were measured on. ``watches`` makes each
    kind's ``Watch``, whose report goes in the kind's ``statements``; ``observer`` and
    ``env_extra`` are ``measure_kind``'s."""
    found: dict[str, Any] = {}
    for kind in kinds:
        watch = watches(kind) if watches is not None else None
        found[kind] = measure_kind(
            services,
            kind,
            calls=calls,
            workers=workers,
            concurrency=concurrency,
            watch=watch,
            observer=observer,
            env_extra=env_extra,
        )
        if watch is not None:
            found[kind]["statements"] = watch.report()
        found[kind]["counted_in_process"] = round_trips(services, kind, min(calls, 200))
    with services.engine.connect() as conn:
        version, max_connections = conn.execute(
            text("SELECT current_setting('server_version'), current_setting('max_connections')")
        ).one()
    return {
        "command": command,
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "postgres": version,
            "pg_max_connections": int(max_connections),
            "redis": services.redis.info("server")["redis_version"],
        },
        "method": (
            "CPU from /proc (children and the Postgres backends serving them) and Redis INFO, "
            "between the first and last completion (workers) or publish (relayer); Redis and "
            "whole-server figures less an idle baseline; see callgate.ops.lab.bench.costs"
        ),
        "kinds": found,
    }
