"""The lab's commands, ``callgate demo`` and ``callgate bench`` (``callgate chaos`` is
``callgate.ops.lab.chaos.cli``), registered on the CLI as entry points of the group
``callgate.commands``: the product's CLI never imports them."""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

import click

from callgate.core.errors import ConfigurationError, InputError
from callgate.ops.cli.common import apply_migrations, embedded_services, load_settings
from callgate.ops.flags import setting_option
from callgate.ops.lab.bench.config import FULL, QUICK, Config
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.demo import run as demo
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
        apply_migrations(settings, demo_downstream=True, reset_demo=True)
        ok = demo.run(settings, workers=workers, out=sys.stdout)
    sys.exit(0 if ok else 1)


@click.command("bench")
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
def bench_cmd(
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
    """
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
