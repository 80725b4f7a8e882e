"""Every ``CALLGATE_…`` environment variable, declared once: its name, type, bounds, default
and the one line that CLI help and docs/configuration.md show (``describe``).

A section is a pydantic-settings class whose fields are the variables with its prefix. It is
read once per process by ``from_env``; building one with keyword arguments never reads the
environment, so a value is exactly what its caller passed. A bad value is a
``ConfigurationError`` (``invalid_configuration``) naming the variable and what it accepts:
pydantic's own ``ValidationError`` never reaches a user.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Self, get_args, get_origin

import annotated_types
from pydantic import BeforeValidator, Field, FiniteFloat, StringConstraints, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from callgate.core.errors import ConfigurationError

MAX_PORT = 65535
# Submit's caps (see producer/validation.py). A call's arguments are stored as one jsonb
# value, and PostgreSQL's jsonb holds at most 255 MB; a tool call anywhere near that is not
# one, so the cap itself is capped.
DEFAULT_MAX_CALL_BYTES = 256 * 1024
MAX_CALL_BYTES_CEILING = 64 * 1024 * 1024
DEFAULT_MAX_TURN_CALLS = 128
# Each call in flight holds a thread and up to two Postgres connections.
MAX_WORKER_CONCURRENCY = 256

FLAG_WORDS = "1/true/yes/on or 0/false/no/off"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _flag(value: object) -> object:
    # Only the documented words: pydantic's own bool also takes t/f/y/n, which no doc promises.
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(FLAG_WORDS)
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]
QueueName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def setting(
    default: Any = None,
    help: str = "",
    *,
    ge: float | None = None,
    le: float | None = None,
    accepts: str | None = None,
    secret: bool = False,
    default_factory: Any = None,
    min_length: int | None = None,
) -> Any:
    """One variable's declaration: ``help`` is its one line; ``accepts`` overrides the phrase
    derived from its type and bounds; a ``secret`` is never echoed in an error."""
    extra: dict[str, Any] = {"secret": secret}
    if accepts is not None:
        extra["accepts"] = accepts
    if default_factory is not None:
        return Field(
            default_factory=default_factory,
            description=help,
            min_length=min_length,
            json_schema_extra=extra,
            repr=not secret,
        )
    return Field(
        default,
        description=help,
        ge=ge,
        le=le,
        min_length=min_length,
        json_schema_extra=extra,
        repr=not secret,
    )


class Described(NamedTuple):
    """What CLI help and the docs show of one variable."""

    env: str
    default: Any  # None: unset, or computed when read (see help)
    help: str
    accepts: str


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def accepts(field: FieldInfo) -> str:
    """The values a variable accepts, in words: the tail of its error and of its help."""
    said = _extra(field).get("accepts")
    if isinstance(said, str):
        return said
    kind: Any = field.annotation
    if get_origin(kind) is not Literal and type(None) in get_args(kind):
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Annotated:  # Flag | None
        kind = get_args(kind)[0]
    if kind is bool:
        return FLAG_WORDS
    if get_origin(kind) is Literal:
        return " or ".join(str(a) for a in get_args(kind))
    if kind not in (int, float):
        return "text"
    noun = "a whole number" if kind is int else "a number"
    low = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
    if low is not None and high is not None:
        return f"{noun} from {_show(low)} to {_show(high)}"  # type: ignore[arg-type]
    if low is not None:
        return f"{noun}, at least {_show(low)}"  # type: ignore[arg-type]
    return noun


class Section(BaseSettings):
    """A group of ``CALLGATE_…`` variables (its ``env_prefix``). Subclasses declare fields with
    ``setting(...)`` and are listed by ``sections()``; see ``Settings``."""

    model_config = SettingsConfigDict(
        env_prefix="CALLGATE_",
        # pydantic-settings matches lower-cased names then; from_env hands it only the exact
        # upper-case names, so CALLGATE_QUEUE is read and callgate_queue is not.
        case_sensitive=False,
        frozen=True,
        extra="forbid",
        str_strip_whitespace=True,
    )

    # By qualified name, so a module imported twice (a reload) declares its section once.
    _sections: ClassVar[dict[str, type[Section]]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        Section._sections[f"{cls.__module__}.{cls.__qualname__}"] = cls

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments only: the environment is read by from_env, once per process.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Read from ``env`` (default: this process's environment), and only from it."""
        env = os.environ if env is None else env
        source = EnvSettingsSource(cls)
        # An empty (or blank) value means unset, as the docs promise.
        source.env_vars = {
            name.lower(): env[name]
            for name in map(cls.env_name, cls.model_fields)
            if env.get(name, "").strip()
        }
        return cls._checked(source())

    @classmethod
    def _checked(cls, values: Mapping[str, Any]) -> Self:
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigurationError(cls._explain(exc)) from None

    @classmethod
    def _explain(cls, exc: ValidationError, label: str | None = None) -> str:
        said: list[str] = []
        for error in exc.errors(include_url=False):
            name = str(error["loc"][0]) if error["loc"] else ""
            field = cls.model_fields.get(name)
            if field is None:
                said.append(f"{name}: not a setting of {cls.__name__}")
                continue
            shown = label or cls.env_name(name)
            if not _extra(field).get("secret"):
                shown = f"{shown}={error['input']!r}"
            said.append(f"{shown}: expected {accepts(field)}")
        return "; ".join(dict.fromkeys(said))

    @classmethod
    def env_name(cls, field: str) -> str:
        if field not in cls.model_fields:
            raise KeyError(f"{cls.__name__} has no setting {field!r}")
        return f"{cls.model_config.get('env_prefix', '')}{field.upper()}"

    @classmethod
    def describe(cls, field: str) -> Described:
        """The variable, default, help line and accepted values of ``field``."""
        info = cls.model_fields[field]
        default = None if info.default_factory is not None else info.default
        return Described(cls.env_name(field), default, info.description or "", accepts(info))

    @classmethod
    def parse(cls, field: str, raw: str, *, label: str | None = None) -> Any:
        """``raw`` checked as ``field``'s variable is; errors name ``label`` (a CLI flag, say)
        instead of the variable."""
        try:
            checked = cls.model_validate({field: raw})
        except ValidationError as exc:
            raise ConfigurationError(cls._explain(exc, label)) from None
        return getattr(checked, field)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes``, checked as the variables are."""
        return self._checked({**{n: getattr(self, n) for n in type(self).model_fields}, **changes})


def sections() -> tuple[type[Section], ...]:
    """Every section declared so far (importing a face's module declares its own)."""
    return tuple(Section._sections.values())


def variables() -> dict[str, tuple[type[Section], str]]:
    """Each ``CALLGATE_…`` variable of the sections declared so far: its section and field."""
    found: dict[str, tuple[type[Section], str]] = {}
    for section in sections():
        for field in section.model_fields:
            env = section.env_name(field)
            if env in found:
                raise RuntimeError(f"{env} is declared twice ({found[env][0].__name__})")
            found[env] = (section, field)
    return found


def describe(variable: str) -> Described:
    """``describe("CALLGATE_WORKER_CONCURRENCY")``: what CLI help and the docs show of it."""
    try:
        section, field = variables()[variable]
    except KeyError:
        raise KeyError(f"{variable} is not declared") from None
    return section.describe(field)


class Settings(Section):
    """The engine's settings, shared by every process: services, tools, execution, recovery."""

    # Services
    database_url: str | None = setting(
        None, "PostgreSQL URL (postgresql://…); 'demo' and 'up' start an embedded one when unset."
    )
    redis_url: str | None = setting(
        None, "Redis URL (redis://, rediss://, unix://, redis+sentinel://); 'demo'/'up' start one."
    )
    direct_database_url: str | None = setting(
        None,
        "PostgreSQL itself, around a ?pgbouncer=true pooler: the relayer's LISTEN.",
    )
    downstream_database_url: str | None = setting(
        None, "Where the demo downstreams keep their schema; default: the database URL."
    )
    queue: QueueName = setting(
        "callgate",
        "RQ queue name, also the prefix of the result streams; one per deployment.",
        accepts="1-64 letters, digits, '_', '-' or '.'",
    )
    # Execution and recovery
    lease_seconds: FiniteFloat = setting(
        30.0, "A reservation's lease; the heartbeat renews it every third of this.", ge=0.5
    )
    sweep_seconds: FiniteFloat = setting(
        5.0, "How often the sweeper looks for calls to dispatch again.", ge=0.05
    )
    stale_seconds: FiniteFloat = setting(
        60.0, "A call nobody holds is dispatched again after waiting this long.", ge=0.1
    )
    # How long the next write of a turn may go undispatched after its previous write ended
    # before a sweeper looks for its job in Redis (its dispatcher may have died).
    successor_grace_seconds: FiniteFloat = setting(
        5.0, "A turn's next write is dispatched again this long after its previous one.", ge=0.1
    )
    relayer_batch: int = setting(100, "Outbox rows the relayer publishes per batch.", ge=1)
    # A wake-up comes with the first completion's commit; the ones committing beside it
    # join its batch if the relayer waits a moment (a batch of 2 costs 12× per row what a
    # batch of 100 does).
    relayer_debounce_ms: FiniteFloat = setting(
        10.0, "Milliseconds the relayer waits after a wake-up before it publishes.", ge=0, le=1000
    )
    # Chaos knob: widens the relayer's publish-to-mark window so a test can kill it there.
    relayer_mark_delay_ms: FiniteFloat = setting(
        0.0, "Milliseconds the relayer waits between publishing and marking (tests).", ge=0
    )
    job_timeout_seconds: FiniteFloat = setting(
        300.0, "How long one handler may hold its lease; also each RQ job's timeout.", ge=1
    )
    max_dispatches: int = setting(10, "Dispatches of one call before the sweeper ends it.", ge=1)
    # A delivery's retry budget for its handler: attempts, and seconds of retrying.
    retry_attempts: int = setting(
        3, "Attempts of a handler per delivery, where a repeat is safe.", ge=1, le=100
    )
    retry_budget_seconds: FiniteFloat = setting(
        10.0, "Seconds a delivery may spend retrying its handler.", ge=0
    )
    worker_concurrency: int = setting(
        8, "Calls one worker process runs at once.", ge=1, le=MAX_WORKER_CONCURRENCY
    )
    # A call that finished waits this long at most for the ones running beside it in its
    # process, so they end in one statement (reads in one, writes' completions in another).
    worker_commit_window_ms: FiniteFloat = setting(
        2.0,
        "Milliseconds a finished call waits for those running beside it, to end them together.",
        ge=0,
        le=60_000,
    )
    worker_grace_seconds: FiniteFloat = setting(
        30.0, "On SIGTERM, how long a worker waits for its calls in flight.", ge=0
    )
    # Each worker process also sweeps, on a thread: recovery does not hang on one process.
    worker_sweep: Flag = setting(True, "Every worker process also sweeps, on a thread.")
    # Tools and policy. ``module:attribute`` of the tool registry and the allowlist override;
    # loaded (and required) only by the processes that run or plan tools.
    tools: str | None = setting(
        None, "module:attribute of your tool Registry (or of a callable returning one)."
    )
    allowlist: str | None = setting(
        None, "Role → tools, as a JSON object or the path of a file holding one."
    )
    mcp_config: str | None = setting(
        None, "Path of a JSON file of MCP servers whose tools join the registry."
    )
    turn_call_budget: int = setting(32, "Calls one turn may propose.", ge=1)
    conversation_call_budget: int = setting(256, "Calls one conversation may propose.", ge=1)
    max_call_bytes: int = setting(
        DEFAULT_MAX_CALL_BYTES,
        "Largest arguments one call may carry, in bytes.",
        ge=64,
        le=MAX_CALL_BYTES_CEILING,
    )
    max_turn_calls: int = setting(
        DEFAULT_MAX_TURN_CALLS, "Most proposals one submit accepts.", ge=1, le=10_000
    )
    # /metrics: the port this process serves it on (0: not served) and the address it binds.
    metrics_port: int = setting(
        0, "Serve Prometheus metrics on this port; 0: off.", ge=0, le=MAX_PORT
    )
    metrics_host: str = setting("0.0.0.0", "The address /metrics binds.")
    # None: the command's default (the sweeper serves them, other processes do not).
    state_metrics: Flag | None = setting(
        None, "Also serve the gauges read from Postgres and Redis (default: sweeper only)."
    )
    # Traces: a call's arguments on its execute_tool span, only redacted, only when asked.
    trace_arguments: Literal["off", "redacted"] = setting(
        "off", "Record each call's arguments on its span, redacted: off or redacted."
    )

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                "CALLGATE_DATABASE_URL is not set (e.g. postgresql://127.0.0.1:5432/test); "
                "'callgate demo' and 'callgate up' start an embedded one when it is unset"
            )
        return self.database_url

    def require_redis(self) -> str:
        if not self.redis_url:
            raise ConfigurationError(
                "CALLGATE_REDIS_URL is not set (e.g. redis://127.0.0.1:6379/0); "
                "'callgate demo' and 'callgate up' start an embedded one when it is unset"
            )
        return self.redis_url

    def downstream_url(self) -> str:
        return self.downstream_database_url or self.require_database()

    def with_services(self, database_url: str, redis_url: str) -> Self:
        return self.replace(database_url=database_url, redis_url=redis_url)


def metrics_port(raw: str, name: str = "CALLGATE_METRICS_PORT") -> int:
    """A TCP port for /metrics, 0 for none; anything else is a ConfigurationError."""
    port: int = Settings.parse("metrics_port", raw, label=name)
    return port


class CommandSettings(Section):
    """Options of callgate's commands that the engine does not read: logs, ``up``, the
    approvers' names and the MCP gateway. Each is also a command-line flag."""

    log_level: str = setting("WARNING", "Python log level of every callgate command.")
    log_format: Literal["auto", "json", "text"] = setting(
        "auto", "Logs on stderr: JSON lines, text, or auto (JSON unless stderr is a terminal)."
    )
    workers: int = setting(2, "Worker processes 'callgate up' starts.", ge=1)
    data_dir: Path = setting(Path(".callgate"), "Where embedded services keep their data.")
    approver: str | None = setting(None, "Who decides an approval; never the user who asked.")
    approver_tenant: str | None = setting(None, "The tenant an approver acts for.")
    reconciler: str | None = setting(None, "Who settles a write, recorded in the audit trace.")
    mcp_gateway_port: int | None = setting(
        None,
        "Serve the MCP gateway over streamable HTTP on this port (default: stdio).",
        ge=1,
        le=MAX_PORT,
    )
    mcp_gateway_host: str = setting("127.0.0.1", "Address the MCP gateway's --http listens on.")
    mcp_gateway_allowed_hosts: str = setting(
        "127.0.0.1:*,localhost:*,[::1]:*",
        "Comma-separated Host values the MCP gateway's DNS-rebinding filter accepts.",
    )
    mcp_gateway_allowed_origins: str = setting(
        "http://127.0.0.1:*,http://localhost:*,http://[::1]:*",
        "Comma-separated Origin values the MCP gateway accepts from browsers.",
    )
    mcp_gateway_wait: FiniteFloat = setting(
        30.0,
        "Seconds a tools/call waits for its result before answering it still runs.",
        ge=0,
        le=3600,
    )
