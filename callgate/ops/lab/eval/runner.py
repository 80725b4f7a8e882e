"""``callgate eval run``: every fixture through the real pipeline, on a scratch database.

The recorded answer is read by the surface's adapter; its calls are submitted by a
``Producer``, checked by the gate and run by real worker processes against the suite's test
doubles; the relayer publishes the results and the producer's fan-in collects them. A call
parked for approval has its request read (the impact the server computed) and, when the
fixture says so, is approved and collected again. Handler runs and effects are counted in the
doubles' ledger. The checks are ``scoring``'s; this module only observes.
"""

from __future__ import annotations

import importlib
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO, cast

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from callgate.core.errors import CallgateError, ConfigurationError, InputError
from callgate.core.settings import Settings
from callgate.core.types import ProposedCall
from callgate.ops.cli.common import apply_migrations, dispatch_after_decision, embedded_services
from callgate.ops.lab.eval import ledger, leftovers, scoring, suite_modules
from callgate.ops.lab.eval.fixture import AWAITING_APPROVAL, SUCCEEDED, Fixture, Suite, Turn
from callgate.ops.lab.eval.live import Conversation, client_for
from callgate.ops.lab.eval.stubs import ENV as STUBS_ENV
from callgate.ops.lab.eval.surfaces import mentioned_names, text_of
from callgate.ops.lab.settings import EvalSettings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer, adapters
from callgate.producer.adapters import AdapterError
from callgate.producer.producer import Collected
from callgate.queue import transport
from callgate.store import approvals, db

COLLECT_SECONDS = 30.0
START_ENV = EvalSettings.env_name("start_seconds")
MAX_BYTES_ENV = EvalSettings.env_name("max_file_bytes")
APPROVER = "callgate-eval"


@dataclass(frozen=True)
class Options:
    answers: Sequence[str] = ("good",)
    surfaces: frozenset[str] | None = None  # None: every surface a fixture has
    workers: int = 2
    tools: str | None = None  # another registry for the suite's tools (a broken double)
    log_path: str | None = None  # the worker, relayer and sweeper logs (default: discarded)
    keep: Path | None = None  # keep the scratch data (embedded: in this folder) for tracing
    live: str | None = None  # ask this model on the one surface given, instead of recordings
    live_client: Any = None  # the SDK client for --live (tests: one over a mock transport)
    start_seconds: float | None = None  # the wait for the workers (None: the setting)
    max_bytes: int | None = None  # the file size cap (None: the setting), passed to workers


@dataclass(frozen=True)
class Run:
    """One answer set's turns, as run."""

    answer: str
    turns: list[scoring.TurnRun]
    seconds: float


def run_suite(settings: Settings, suite: Suite, options: Options, progress: TextIO) -> list[Run]:
    """Run ``suite`` once per answer set on a scratch database and queue of its own."""
    if options.live and (options.surfaces is None or len(options.surfaces) != 1):
        raise InputError("--live asks one surface: give exactly one --surface")
    for answer in () if options.live else options.answers:
        if not any(answer in f.answer_sets() for f in suite.fixtures):
            raise InputError(f"no fixture of suite {suite.config.name!r} has answers {answer!r}")
    tools = options.tools or suite.config.tools
    doubles_module = suite.config.doubles or suite.config.tools.split(":")[0]
    # Before anything of the suite is imported: it names only code of its own folder.
    suite_modules.check(
        suite.path,
        tools=None if options.tools else suite.config.tools,
        doubles=doubles_module,
        stubs_file=suite.config.stubs,
    )
    stubs = (
        {STUBS_ENV: str((suite.path / suite.config.stubs).resolve())} if suite.config.stubs else {}
    )
    if stubs and options.max_bytes is not None:
        stubs[MAX_BYTES_ENV] = str(options.max_bytes)
    with _environ(stubs):
        doubles = _doubles(doubles_module)
    if options.live and options.live_client is None and options.surfaces:
        # Before any service starts: a missing SDK or key is one line, not a stack trace later.
        options = replace(options, live_client=client_for(next(iter(options.surfaces))))
    with scratch(settings, options.keep, progress) as scratch_settings, _environ(stubs):
        engine = db.create(scratch_settings.require_database(), application_name="callgate-eval")
        try:
            doubles.install(engine)
            return _run(scratch_settings, engine, suite, options, tools, doubles, progress)
        finally:
            engine.dispose()


@contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in this process's environment for the block: the producer loads the suite's
    registry here, and the workers inherit it (an imported suite's stubs file)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _doubles(module: str) -> Any:
    """The suite's doubles module: ``install(engine)`` and ``seed(engine, setup)``."""
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"the suite's doubles module {module!r} cannot be imported: {exc}"
        ) from None
    missing = [name for name in ("install", "seed") if not callable(getattr(found, name, None))]
    if missing:
        raise ConfigurationError(
            f"the suite's doubles module {module!r} has no {' or '.join(missing)}()"
        )
    return found


@contextmanager
def scratch(
    settings: Settings, keep: Path | None = None, out: TextIO | None = None
) -> Iterator[Settings]:
    """Migrated scratch services: embedded ones (in a temporary folder, or in ``keep``) when
    no URL is set; with CALLGATE_DATABASE_URL, a database created beside it (dropped at the
    end unless ``keep`` is given) and with CALLGATE_REDIS_URL, queue names of their own.
    Nothing of the configured ones is touched. What is kept is named on ``out``, so the
    report's trace ids can be read with ``callgate trace``."""
    name = leftovers.token()
    queue = f"{leftovers.QUEUE_PREFIX}{name}"
    if settings.database_url:
        scratch_prefix()  # refused before anything is created
    with (
        tempfile.TemporaryDirectory(prefix="callgate-eval-") as tmp,
        _own_queue(settings.redis_url, queue),
    ):
        folder = keep or Path(tmp)
        if settings.database_url:
            with (
                _scratch_database(settings.database_url, name, drop=keep is None) as url,
                embedded_services(settings.replace(database_url=url), folder) as ready,
            ):
                if keep is not None and out is not None:
                    out.write(f"callgate eval: the scratch database is kept: {_shown(url)}\n")
                yield _migrated(ready.replace(queue=queue))
        else:
            with embedded_services(settings, folder) as ready:
                if keep is not None and out is not None:
                    out.write(f"callgate eval: the embedded services' data is kept in {keep}\n")
                yield _migrated(ready.replace(queue=queue))


@contextmanager
def _own_queue(redis_url: str | None, queue: str) -> Iterator[None]:
    """On a configured Redis, first forget the queues of runs that were killed, then remove
    the run's own keys afterwards (its queue name is new, so nothing else has keys under it);
    an embedded Redis goes with its folder."""
    if redis_url:
        connection = transport.connect(redis_url)
        try:
            leftovers.forget_stale_queues(connection)
        finally:
            connection.close()
    try:
        yield
    finally:
        if redis_url:
            connection = transport.connect(redis_url)
            try:
                leftovers.forget_queue(connection, queue)
            finally:
                connection.close()


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _migrated(settings: Settings) -> Settings:
    apply_migrations(settings, downstream=None)
    return settings


# A database name prefix Postgres takes unquoted, leaving room for the 12 hex digits that follow
# (a name is at most 63 bytes).
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")


def scratch_prefix() -> str:
    """CALLGATE_EVAL_SCRATCH_PREFIX, checked: ``invalid_configuration`` naming what it may be."""
    prefix = EvalSettings.from_env().scratch_prefix
    if not _PREFIX.fullmatch(prefix):
        raise ConfigurationError(
            f"{EvalSettings.env_name('scratch_prefix')}={prefix!r}: a database name prefix is "
            "lower-case letters, digits and _ (not starting with a digit), at most 40 characters"
        )
    return prefix


@contextmanager
def _scratch_database(url: str, token: str, *, drop: bool) -> Iterator[str]:
    prefix = scratch_prefix()
    name = f"{prefix}{token}"
    admin = db.create(url, pool_size=1, application_name="callgate-eval")
    try:
        leftovers.drop_stale_databases(admin, prefix)  # runs killed before they could
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        raise ConfigurationError(
            f"callgate eval creates a scratch database beside CALLGATE_DATABASE_URL and "
            f"could not ({type(exc).__name__}); grant CREATEDB, or unset the URL to use "
            "embedded services"
        ) from None
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        if drop:
            _drop(admin, name)
        admin.dispose()


def _drop(admin: Engine, name: str) -> None:
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _run(
    settings: Settings,
    engine: Engine,
    suite: Suite,
    options: Options,
    tools: str,
    doubles: Any,
    progress: TextIO,
) -> list[Run]:
    env = {
        "CALLGATE_DATABASE_URL": settings.require_database(),
        "CALLGATE_REDIS_URL": settings.require_redis(),
        "CALLGATE_QUEUE": settings.queue,
        "CALLGATE_TOOLS": tools,
        "CALLGATE_ALLOWLIST": "",
        "CALLGATE_METRICS_PORT": "0",
    }
    producer_settings = settings.replace(tools=tools, allowlist=None)
    log_path = options.log_path or os.devnull
    start = options.start_seconds
    if start is None:
        start = EvalSettings.from_env().start_seconds
    logged = f"; their log is {options.log_path}" if options.log_path else ""
    with Stack(env=env, workers=options.workers, log_path=log_path) as stack:
        wait_for_workers(
            settings.require_redis(),
            settings.queue,
            options.workers,
            start,
            stack=stack,
            hint=f"{logged} (the wait: --start-timeout, {START_ENV})",
        )
        producer = Producer.from_env(producer_settings)
        try:
            cases = [
                (answer, fixture, surface)
                for answer in options.answers
                for fixture in suite.fixtures
                for surface in sorted(fixture.surfaces(answer))
                if options.surfaces is None or surface in options.surfaces
            ]
            if options.live and options.surfaces:
                surface = next(iter(options.surfaces))
                cases = [(options.answers[0], f, surface) for f in suite.fixtures]
            if not cases:
                raise InputError("no fixture has a recorded answer on the surfaces asked for")
            runs: dict[str, list[scoring.TurnRun]] = {a: [] for a in options.answers}
            started = {a: 0.0 for a in options.answers}
            for n, (answer, fixture, surface) in enumerate(cases, 1):
                t0 = time.monotonic()
                doubles.seed(engine, dict(fixture.setup))
                model = _conversation(options, producer, fixture, surface)
                turns = _case(producer, settings, engine, fixture, answer, surface, model)
                runs[answer].extend(turns)
                started[answer] += time.monotonic() - t0
                _progress(progress, n, len(cases), fixture, answer, surface, turns, t0)
        finally:
            producer.close()
    return [Run(a, runs[a], started[a]) for a in options.answers]


def _progress(
    out: TextIO,
    n: int,
    total: int,
    fixture: Fixture,
    answer: str,
    surface: str,
    turns: list[scoring.TurnRun],
    t0: float,
) -> None:
    checks = [c for t in turns for c in scoring.score(t)]
    failed = sum(not c.passed for c in checks)
    width = 20
    bar = "#" * (width * n // total) + "." * (width - width * n // total)
    verdict = "ok" if not failed else f"{failed} check(s) failed"
    took = time.monotonic() - t0
    out.write(f"[{bar}] {n}/{total} {fixture.id} {surface} {answer}: {verdict} ({took:.1f} s)\n")
    out.flush()


def _case(
    producer: Producer,
    settings: Settings,
    engine: Engine,
    fixture: Fixture,
    answer: str,
    surface: str,
    model: Conversation | None = None,
) -> list[scoring.TurnRun]:
    """One fixture's turns on one surface: recorded answers, or ``model``'s live ones."""
    registry = producer.registry
    schemas = {name: t.parameters() for name, t in registry.tools.items()}
    conversation = f"eval-{fixture.id}-{uuid.uuid4().hex[:8]}"
    out = []
    for index, turn in enumerate(fixture.turns):
        if model is None:
            response = cast(dict[str, Any], turn.answers[answer])[surface]
        else:
            response = model.ask(turn.request or fixture.request if index else fixture.request)
        base = scoring.TurnRun(
            fixture_id=fixture.id,
            category=fixture.category,
            turn_index=index,
            answer=answer,
            surface=surface,
            expect=turn,
            exposed=frozenset(fixture.tools),
            schemas=schemas,
            proposed=(),
        )
        known = set(schemas) | set(fixture.tools) | mentioned_names(surface, response)
        try:
            proposals = adapters.read_proposals(surface, response, known)
        except AdapterError as exc:
            out.append(replace(base, read_error=f"{exc.code}: {exc.message}"))
            continue
        proposed = [scoring.Proposed(p.call_id, p.tool_name, p.arguments) for p in proposals]
        observed, collected = _observe(
            producer, settings, engine, fixture, turn, conversation, proposals
        )
        if model is None:
            final = (
                cast(dict[str, Any], turn.final.answers.get(answer, {})).get(surface)
                if turn.final
                else None
            )
        elif collected is not None and collected.complete:
            # The model sees the results before the next turn (or its final answer).
            final = model.answer_results(collected.provider_message(surface))
            final = final if turn.final else None
        else:
            final = None
        out.append(
            replace(
                base,
                proposed=proposed,
                final_text=text_of(surface, final) if final is not None else None,
                **observed,
            )
        )
    return out


def _observe(
    producer: Producer,
    settings: Settings,
    engine: Engine,
    fixture: Fixture,
    turn: Turn,
    conversation: str,
    proposals: list[ProposedCall],
) -> tuple[dict[str, Any], Collected | None]:
    if not proposals:
        return {}, None
    principal = fixture.principal
    tenant = principal.tenant_id
    context = {
        "request_id": f"{conversation}-{uuid.uuid4().hex[:6]}",
        "tenant_id": tenant,
        "user_id": principal.user_id,
        "roles": list(principal.roles),
        "conversation_id": conversation,
    }
    submitted = producer.submit(proposals, context)
    collected = _settle(producer, submitted.turn_id)
    ops = {c.call_id: c.operation_id for c in submitted.calls}
    refs = {c.call_id: c.ref for c in submitted.calls}
    counted = ledger.counts(engine, ops.values())
    results = {r.call_id: r for r in collected.results}
    executed: list[scoring.Executed] = []
    for p in proposals:
        runs, effects = counted.get(ops.get(p.call_id, ""), (0, 0))
        outcome, data = _outcome(results.get(p.call_id), collected, p.call_id)
        approval, after_effects, after_outcome = None, None, None
        if outcome == AWAITING_APPROVAL:
            approval_id = collected.awaiting_approval[p.call_id]
            request = approvals.show(engine, approval_id, tenant=tenant)
            approval = dict(request.get("impact") or {})
            rule = turn.executor.get(p.tool_name)
            if rule and rule.approval and rule.approval.then == "approve":
                after_outcome, after_effects = _approve(
                    producer,
                    settings,
                    engine,
                    approval_id,
                    tenant,
                    submitted.turn_id,
                    p.call_id,
                    ops[p.call_id],
                )
        executed.append(
            scoring.Executed(
                call_id=p.call_id,
                tool_name=p.tool_name,
                outcome=outcome,
                handler_runs=runs,
                effects=effects,
                trace_id=refs.get(p.call_id, submitted.turn_id),
                data=data,
                approval=approval,
                effects_after_approval=after_effects,
                outcome_after_approval=after_outcome,
            )
        )
    observed = {
        "executed": executed,
        "turn_id": submitted.turn_id,
        "joined": _joined(collected, proposals),
    }
    return observed, collected


def _conversation(
    options: Options, producer: Producer, fixture: Fixture, surface: str
) -> Conversation | None:
    if not options.live:
        return None
    client = options.live_client or client_for(surface)
    exposed = [producer.registry.tools[n] for n in fixture.tools if n in producer.registry.tools]
    return Conversation(surface, options.live, client, exposed)


def _settle(producer: Producer, turn_id: str) -> Collected:
    """The turn once every call has a result or waits for a person (collect alone would
    wait out its timeout for a parked call)."""
    deadline = time.monotonic() + COLLECT_SECONDS
    while True:
        left = deadline - time.monotonic()
        collected = producer.collect(turn_id, timeout=max(0.0, min(0.5, left)))
        if collected.complete or not collected.pending or left <= 0:
            return collected


def _outcome(result: Any, collected: Collected, call_id: str) -> tuple[str, dict[str, Any]]:
    if result is None:
        if call_id in collected.awaiting_approval:
            return AWAITING_APPROVAL, {}
        return ("pending" if call_id in collected.pending else "missing"), {}
    if result.status == SUCCEEDED:
        data = dict(result.data)
        content = data.get("content")
        return SUCCEEDED, dict(content) if isinstance(content, dict) else data
    return str(result.error.code), {}


def _joined(collected: Collected, proposals: list[ProposedCall]) -> bool:
    """Every result joined to one proposal by call id and tool name, none twice: the check
    the surface's own result message makes (``write_results``), on what has finished."""
    finished = [p for p in proposals if p.call_id not in collected.awaiting_approval]
    ids = [r.call_id for r in collected.results]
    if len(ids) != len(set(ids)) or set(ids) != {p.call_id for p in finished}:
        return False
    if not finished:
        return True
    try:
        adapters.write_results("openai-chat", finished, collected.results)
    except CallgateError:
        return False
    return True


def _approve(
    producer: Producer,
    settings: Settings,
    engine: Engine,
    approval_id: str,
    tenant: str,
    turn_id: str,
    call_id: str,
    operation_id: str,
) -> tuple[str, int]:
    refs = approvals.approve(engine, approval_id, by=APPROVER, tenant=tenant)
    dispatch_after_decision(settings, refs)
    again = _settle(producer, turn_id)
    found = {r.call_id: r for r in again.results}
    outcome, _ = _outcome(found.get(call_id), again, call_id)
    return outcome, ledger.counts(engine, [operation_id])[operation_id][1]
