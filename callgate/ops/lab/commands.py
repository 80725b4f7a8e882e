"""The lab's commands, ``callgate demo`` and ``callgate bench`` (``callgate chaos`` is
``callgate.ops.lab.chaos.cli``), registered on the CLI as entry points of the group
``callgate.commands``: the product's CLI never imports them."""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from callgate.core.errors import ConfigurationError, InputError
from callgate.ops.cli.common import apply_migrations, embedded_services, load_settings
from callgate.ops.flags import setting_option
from callgate.ops.lab.bench.config import FULL, QUICK, Config
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.demo import run as demo
from callgate.ops.lab.demo.tools import DEMO_SCHEMA
from callgate.ops.lab.settings import BenchSettings  # noqa: F401  # declares the bench's variables


@click.command("demo")
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep embedded data here (default: a temporary folder).",
)
def demo_cmd(workers: int, data_dir: Path | None) -> None:
    """Run the worked examples end to end and check their invariants.

    Always uses the demo tools (callgate.ops.lab.demo.tools:demo_registry), whatever CALLGATE_TOOLS
    says.
    """
    with (
        tempfile.TemporaryDirectory(prefix="callgate-demo-") as tmp,
        embedded_services(load_settings(), data_dir or Path(tmp)) as settings,
    ):
        apply_migrations(settings, downstream=DEMO_SCHEMA, reset_downstream=True)
        ok = demo.run(settings, workers=workers, out=sys.stdout)
    sys.exit(0 if ok else 1)


@click.group("bench", invoke_without_command=True)
@setting_option("--quick", variable="CALLGATE_BENCH_QUICK", is_flag=True)
@setting_option(
    "--out", variable="CALLGATE_BENCH_OUT", type=click.Path(path_type=Path, file_okay=False)
)
@setting_option(
    "--workers",
    variable="CALLGATE_BENCH_WORKERS",
    help="Worker counts to compare, e.g. 1,2,4 (default 1,2,4; --quick 1,2).",
)
@setting_option(
    "--calls",
    variable="CALLGATE_BENCH_CALLS",
    type=click.IntRange(min=20),
    help="Calls per throughput run (default 1000; --quick 400).",
)
@setting_option(
    "--repeat",
    variable="CALLGATE_BENCH_REPEAT",
    type=click.IntRange(min=1),
    help="Repeats; figures are medians (default 3; --quick 1).",
)
@setting_option(
    "--concurrency",
    variable="CALLGATE_BENCH_CONCURRENCY",
    type=click.IntRange(min=1),
    help="Calls in flight per worker for the 100 ms tools and the memory figure, passed to "
    "the workers as CALLGATE_WORKER_CONCURRENCY.",
)
@click.pass_context
def bench_cmd(
    ctx: click.Context,
    quick: bool,
    out: Path,
    workers: str | None,
    calls: int | None,
    repeat: int | None,
    concurrency: int,
) -> None:
    """Measure callgate against bare RQ and dramatiq on CALLGATE_DATABASE_URL and
    CALLGATE_REDIS_URL.

    No-op reads, writes and 100 ms tools with W workers beside bare RQ with the same W, and
    beside dramatiq (W processes of K threads) alone and with the minimum durable work per
    call (the threaded ceiling); fan-in of three reads; the same writes delivered 3×;
    traffic, latency per stage and memory per in-flight call. Migrates what it needs and
    uses queues of its own. Exits 1 if a correctness check inside it fails (a call that
    never ended, a write applied other than once).

    `callgate bench costs` measures what one call costs each tier; `callgate bench model`
    says which tier a fleet saturates first.
    """
    if ctx.invoked_subcommand is not None:
        return  # a subcommand: the options above are the whole bench's
    for module, why in (("matplotlib", "draws its plots"), ("dramatiq", "runs its baselines")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigurationError(
                f"callgate bench {why} with {module}: pip install 'callgate[bench]'"
            ) from None
    preset = QUICK if quick else FULL
    config = Config(
        workers=_worker_counts(workers) if workers else preset["workers"],  # type: ignore[arg-type]
        calls=calls or preset["calls"],  # type: ignore[arg-type]
        repeat=repeat or preset["repeat"],  # type: ignore[arg-type]
        concurrency=concurrency,
        quick=quick,
    )
    command = " ".join(["callgate", *sys.argv[1:]])
    try:
        # Imported once its extra is known to be there: the bench's modules import dramatiq,
        # and `callgate demo` (same module, the user's first command) must not need it.
        from callgate.ops.lab.bench.suite import run as run_bench

        _, paths = run_bench(load_settings(), config, out, command)
    except BenchError as exc:
        click.echo(f"callgate bench: FAILED: {exc}", err=True)
        sys.exit(1)
    click.echo((out / "bench.md").read_text())
    click.echo("wrote " + ", ".join(str(p) for p in paths))


def _worker_counts(raw: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise InputError(f"--workers {raw!r}: expected counts such as 1,2,4")
    return counts


@bench_cmd.command("costs")
@click.option(
    "--calls", default=500, show_default=True, type=click.IntRange(min=20), help="Calls per kind."
)
@click.option(
    "--kind",
    type=click.Choice(["reads", "writes"]),
    default=None,
    help="Measure one kind only: no-op get_stock reads or refund_payment writes (default both).",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Calls in flight per worker (default: the worker's own default).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("costs.json"),
    show_default=True,
    help="Where to write the costs (JSON).",
)
@click.option(
    "--statements",
    is_flag=True,
    help="On a PostgreSQL of its own with pg_stat_statements (started and removed here; "
    "needs PostgreSQL's server programs): also each statement's executions, time, WAL and "
    "buffers per call, and each table's rows and index entries written per call.",
)
def bench_costs_cmd(
    calls: int,
    kind: str | None,
    workers: int,
    concurrency: int | None,
    out: Path,
    statements: bool,
) -> None:
    """Measure what one call costs each tier: Postgres, worker, relayer and Redis CPU, Redis
    commands, Postgres connections per worker, in steady state on CALLGATE_DATABASE_URL and
    CALLGATE_REDIS_URL (run it on the database's machine: it reads /proc). Feed the file to
    `callgate bench model`.

    With --statements the PostgreSQL is a private one the command starts (CALLGATE_DATABASE_URL
    is not used), so its CPU figures are that server's."""
    from callgate.core.settings import Settings
    from callgate.ops.lab.bench import costs
    from callgate.ops.lab.bench import statements as per_statement
    from callgate.ops.lab.bench.services import Services

    options: dict[str, Any] = {
        "kinds": [kind] if kind else list(costs.KINDS),
        "calls": calls,
        "workers": workers,
        "concurrency": concurrency or Settings().worker_concurrency,
        "command": " ".join(["callgate", *sys.argv[1:]]),
    }
    try:
        if statements:
            found = per_statement.run(load_settings(), **options)
        else:
            found = costs.run(Services.prepare(load_settings()), **options)
    except BenchError as exc:
        click.echo(f"callgate bench costs: FAILED: {exc}", err=True)
        sys.exit(1)
    out.write_text(json.dumps(found, indent=2) + "\n")
    for name, k in found["kinds"].items():
        click.echo(
            f"{name}: Postgres {k['pg_cpu_ms_per_call']} ms, worker {k['worker_cpu_ms_per_call']}"
            f" ms, relayer {k['relayer_cpu_ms_per_call']} ms, Redis {k['redis_cpu_ms_per_call']}"
            f" ms CPU and {k['redis_commands_per_call']} commands per call; "
            f"{k['pg_connections_per_worker']} connections per worker"
        )
    for name, k in found["kinds"].items():
        if "statements" in k:
            click.echo("\n" + per_statement.render(name, k["statements"]) + "\n")
    click.echo(f"wrote {out}")


@bench_cmd.command("model")
@click.option(
    "--costs",
    "costs_file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="A file `callgate bench costs` wrote.",
)
@click.option("--workers", type=int, required=True, help="Worker processes (N).")
@click.option("--concurrency", type=int, required=True, help="Calls in flight per worker (K).")
@click.option("--pg-cores", type=float, required=True, help="Postgres' cores.")
@click.option(
    "--mix",
    default="reads=1",
    show_default=True,
    help="Shares of each kind, e.g. reads=0.8,writes=0.2.",
)
@click.option("--handler-ms", type=float, default=0.0, show_default=True, help="Tool latency.")
@click.option(
    "--worker-cores",
    type=float,
    default=1.0,
    show_default=True,
    help="Cores per worker process (at most 1 counts: a Python process runs on one).",
)
@click.option("--relayers", type=int, default=1, show_default=True)
@click.option(
    "--redis-servers",
    type=int,
    default=1,
    show_default=True,
    help="Redis servers the queues are spread over (one core each).",
)
@click.option(
    "--pg-max-connections",
    type=int,
    default=None,
    help="Postgres' max_connections (default: the measured server's).",
)
def bench_model_cmd(
    costs_file: Path,
    workers: int,
    concurrency: int,
    pg_cores: float,
    mix: str,
    handler_ms: float,
    worker_cores: float,
    relayers: int,
    redis_servers: int,
    pg_max_connections: int | None,
) -> None:
    """Print each tier's capacity for a fleet and a call mix, and the one that saturates
    first, from the costs `callgate bench costs` measured."""
    from callgate.ops.lab.bench import load_model

    shares = load_model.parse_mix(mix)
    try:
        document = json.loads(costs_file.read_text())
    except FileNotFoundError:
        raise InputError(f"--costs {costs_file}: no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"--costs {costs_file}: not a costs file ({exc})") from None
    if not isinstance(document, dict):
        raise InputError(f"--costs {costs_file}: not a costs file")
    fleet = load_model.Fleet(
        workers=workers,
        concurrency=concurrency,
        pg_cores=pg_cores,
        worker_cores=worker_cores,
        relayers=relayers,
        redis_servers=redis_servers,
        pg_max_connections=pg_max_connections,
    )
    click.echo(load_model.render(load_model.predict(document, fleet, shares, handler_ms)))
