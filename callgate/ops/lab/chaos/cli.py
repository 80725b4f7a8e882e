"""``callgate chaos``: replay the catalogue's faults, or a soak, against real processes.

Exit code 0 when every scenario that applies passes, 1 on any violation, 2 (with one line,
``callgate: <code>: <message>``) on bad input such as an unknown scenario or a bad seed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from callgate.core.errors import CallgateError, InputError
from callgate.core.settings import Settings

if TYPE_CHECKING:
    from callgate.ops.lab.chaos.scenario import Scenario

EXIT_VIOLATION = 1
EXIT_ERROR = 2
MAX_SEED = 2**63 - 1


def _seed(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise InputError(f"--seed {raw!r}: expected a whole number from 0 to {MAX_SEED}") from None
    if not 0 <= value <= MAX_SEED:
        raise InputError(f"--seed {raw!r}: expected a whole number from 0 to {MAX_SEED}")
    return value


def _positive(raw: str | None, option: str, *, maximum: int) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise InputError(f"{option} {raw!r}: expected a whole number from 1 to {maximum}") from None
    if not 1 <= value <= maximum:
        raise InputError(f"{option} {raw!r}: expected a whole number from 1 to {maximum}")
    return value


@click.command("chaos")
@click.argument("names", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Run every scenario of the catalogue.")
@click.option(
    "--seed",
    "seed_text",
    default="1",
    show_default=True,
    help="Seed of the fault schedule; the same seed replays it.",
)
@click.option(
    "--workers",
    "workers_text",
    default=None,
    help="Worker processes (default: each scenario's own; 4 for --soak).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--soak", is_flag=True, help="Mixed reads and writes with random faults throughout.")
@click.option(
    "--calls",
    "calls_text",
    default=None,
    help="Calls of a --soak run (default 2000).",
)
@click.option("--list", "list_only", is_flag=True, help="List the catalogue and exit.")
@click.option(
    "--keep-databases",
    is_flag=True,
    help="Keep each scenario's database (and the children's logs) for inspection.",
)
def chaos_command(
    names: tuple[str, ...],
    run_all: bool,
    seed_text: str,
    workers_text: str | None,
    as_json: bool,
    soak: bool,
    calls_text: str | None,
    list_only: bool,
    keep_databases: bool,
) -> None:
    """Replay redelivery and crash scenarios with real worker, relayer and sweeper processes.

    callgate chaos [NAME ...|--all] [--seed N] [--workers N] [--json]
    callgate chaos --soak --calls N --workers W --seed S

    Each scenario gets its own database and queue on CALLGATE_DATABASE_URL /
    CALLGATE_REDIS_URL (embedded ones when unset); scenarios that flush or restart Redis use
    a redis-server of the runner's own. Invariants are read from the database afterwards.
    """
    from callgate.ops.lab.chaos import report, runner, scenario, services
    from callgate.ops.lab.chaos import soak as soak_run

    seed = _seed(seed_text)
    workers = _positive(workers_text, "--workers", maximum=32)
    calls = _positive(calls_text, "--calls", maximum=1_000_000)
    catalogue = scenario.names()
    if list_only:
        for name in catalogue:
            click.echo(f"{name:34}{scenario.load(name).summary}")
        return
    if soak:
        if names or run_all:
            raise InputError("--soak runs its own mix; give no scenario names and no --all")
    elif calls is not None:
        raise InputError("--calls is for --soak")
    elif run_all and names:
        raise InputError("give scenario names or --all, not both")
    elif not run_all and not names:
        raise InputError(f"name scenarios or pass --all; known: {', '.join(catalogue)}")
    chosen = [] if soak else [scenario.load(n) for n in (catalogue if run_all else names)]

    log_dir = Path(tempfile.mkdtemp(prefix="callgate-chaos-logs-"))
    settings = Settings.from_env()
    with services.open_services(settings, keep=keep_databases) as svc:
        if soak:
            results = [
                soak_run.run_soak(
                    svc, calls=calls or 2000, workers=workers or 4, seed=seed, log_dir=log_dir
                )
            ]
        else:
            results = []
            for sc in _progress(chosen):
                results.append(
                    runner.run_scenario(sc, svc, seed=seed, workers=workers, log_dir=log_dir)
                )
    extra: dict[str, Any] = {"logs": str(log_dir)}
    if as_json:
        click.echo(json.dumps(report.as_json(results, seed=seed, extra=extra), indent=2))
    else:
        report.write_table(results, sys.stdout)
        click.echo(f"seed {seed}; process logs in {log_dir}")
    if any(r.failed for r in results):
        sys.exit(EXIT_VIOLATION)


def _progress(chosen: list[Scenario]) -> Iterator[Scenario]:
    """A progress bar on a terminal; one line per scenario on stderr otherwise."""
    if sys.stderr.isatty():
        with click.progressbar(
            chosen,
            label="chaos",
            file=sys.stderr,
            item_show_func=lambda s: s.name if s is not None else "",
        ) as bar:
            yield from bar
        return
    for i, sc in enumerate(chosen, 1):
        click.echo(f"chaos [{i}/{len(chosen)}] {sc.name}", err=True)
        yield sc


def main(argv: list[str] | None = None) -> None:
    """``python -m callgate.ops.lab.chaos``: expected errors become one line and exit code 2."""
    try:
        chaos_command.main(args=argv, prog_name="callgate chaos", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CallgateError as exc:
        click.echo(f"callgate: {exc.code}: {exc.message}", err=True)
        sys.exit(EXIT_ERROR)
