"""``callgate``: run the stack, submit and collect turns, read traces.

Every option has a ``CALLGATE_…`` environment variable. Expected errors print one line
(``callgate: <code>: <what to do>``) and exit 2; there is no traceback for them.

The commands live in the modules beside this one, one module per concern; the lab's
commands (``demo``, ``chaos``, ``bench``) are entry points of the group ``callgate.commands``,
loaded only when one of them is asked for, so the product never imports the lab.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import metadata

import click
import redis

from callgate.core import logs
from callgate.core.errors import CallgateError, ErrorCode
from callgate.ops import lifeline, telemetry
from callgate.ops.cli import approvals, maintenance, processes, turns
from callgate.ops.cli.common import EXIT_ERROR, setup_logging
from callgate.ops.flags import setting_option
from callgate.ops.http.serve import api_cmd, keys_group
from callgate.ops.mcp_gateway import mcp_gateway_cmd
from callgate.store import db

PLUGINS = "callgate.commands"


class _Commands(click.Group):
    """The built-in commands, and those of installed plugins (entry points), loaded when
    asked for."""

    def _plugins(self) -> dict[str, metadata.EntryPoint]:
        return {ep.name: ep for ep in metadata.entry_points(group=PLUGINS)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and (plugin := self._plugins().get(cmd_name)) is not None:
            loaded = plugin.load()
            if not isinstance(loaded, click.Command):
                raise TypeError(f"entry point {plugin.value} is not a click command")
            command = loaded
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="callgate", message="%(prog)s %(version)s")
@setting_option("--log-level", variable="CALLGATE_LOG_LEVEL")
@setting_option(
    "--log-format", variable="CALLGATE_LOG_FORMAT", type=click.Choice(["auto", "json", "text"])
)
@click.option(
    "--path",
    "paths",
    multiple=True,
    default=["."],
    show_default=True,
    type=click.Path(file_okay=False),
    help="A directory to import your tools' module (CALLGATE_TOOLS) from; repeatable. Put "
    "first on the import path of this command and of the processes it starts.",
)
def cli(log_level: str, log_format: logs.LogFormat, paths: tuple[str, ...]) -> None:
    """callgate: a queue-driven, multi-worker executor for LLM tool calls.

    Services come from CALLGATE_DATABASE_URL and CALLGATE_REDIS_URL; 'demo' and 'up' start
    embedded ones when those are unset. Your tools' module (CALLGATE_TOOLS=module:attribute)
    is imported from the current directory, or from the directories --path names.
    """
    lifeline.die_with_parent()  # started by a Stack: end with it
    setup_logging(log_level, log_format)
    use_paths(paths)
    # Traces when the OTEL_* variables ask for them (docs/tracing.md); service.name
    # callgate-<command> unless OTEL_SERVICE_NAME says otherwise.
    telemetry.setup(click.get_current_context().invoked_subcommand or "cli")


def use_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` first on the import path, as RQ's ``--path`` does: a console script's
    sys.path holds its own bin directory, not the current one, so ``CALLGATE_TOOLS=mytools:…``
    would not find ./mytools.py. PYTHONPATH carries them to the worker, relayer and sweeper
    processes ``up`` starts, which import the same module."""
    resolved = [os.path.abspath(p) for p in paths]
    for directory in reversed(resolved):
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*resolved, *(p for p in inherited if p not in resolved)]
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: expected errors become one line and exit code 2."""
    try:
        cli.main(args=argv, prog_name="callgate", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CallgateError as exc:
        click.echo(f"callgate: {exc.code}: {exc.message}", err=True)
        sys.exit(EXIT_ERROR)
    except Exception as exc:
        translated = _translate(exc)
        if translated is None:
            raise
        click.echo(f"callgate: {translated.code}: {translated.message}", err=True)
        sys.exit(EXIT_ERROR)


def _translate(exc: Exception) -> CallgateError | None:
    """Driver errors that escaped a narrower translation still get one clear line."""
    if db.is_operational_error(exc):
        return CallgateError(
            f"cannot reach PostgreSQL: {str(exc).splitlines()[0]}",
            code=ErrorCode.DATABASE_UNAVAILABLE,
        )
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return CallgateError(f"cannot reach Redis: {exc}", code=ErrorCode.REDIS_UNAVAILABLE)
    return None


for command in (
    processes.migrate_cmd,
    processes.worker_cmd,
    processes.relayer_cmd,
    processes.sweeper_cmd,
    processes.up_cmd,
    turns.submit_cmd,
    turns.collect_cmd,
    turns.trace_cmd,
    turns.tools_cmd,
    approvals.approvals_group,
    maintenance.reconcile_group,
    maintenance.prune_cmd,
    api_cmd,
    keys_group,
    mcp_gateway_cmd,
):
    cli.add_command(command)
