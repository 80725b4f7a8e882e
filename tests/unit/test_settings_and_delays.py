"""Settings from CALLGATE_* variables (core/settings.py) and CALLGATE_DEMO_DELAY_MS parsing."""

from __future__ import annotations

import pytest

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.lab.demo import delays

# --- Settings --------------------------------------------------------------------------


def test_defaults_from_an_empty_environment() -> None:
    s = Settings.from_env({})
    assert s == Settings(
        database_url=None,
        redis_url=None,
        downstream_database_url=None,
        queue="callgate",
        lease_seconds=30.0,
        sweep_seconds=5.0,
        stale_seconds=60.0,
        relayer_batch=100,
        job_timeout_seconds=300.0,
    )


def test_empty_strings_mean_unset() -> None:
    env = {"CALLGATE_DATABASE_URL": "", "CALLGATE_QUEUE": "", "CALLGATE_LEASE_SECONDS": ""}
    s = Settings.from_env(env)
    assert s.database_url is None
    assert s.queue == "callgate"
    assert s.lease_seconds == 30.0


def test_values_are_read() -> None:
    s = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": "postgresql://127.0.0.1:5432/test",
            "CALLGATE_REDIS_URL": "redis://127.0.0.1:6379/0",
            "CALLGATE_QUEUE": "t-abc.1_x",
            "CALLGATE_LEASE_SECONDS": "2.5",
            "CALLGATE_RELAYER_BATCH": "7",
        }
    )
    assert s.database_url == "postgresql://127.0.0.1:5432/test"
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.queue == "t-abc.1_x"
    assert s.lease_seconds == 2.5
    assert s.relayer_batch == 7
    assert s.downstream_url() == "postgresql://127.0.0.1:5432/test"


@pytest.mark.parametrize("raw", ["abc", "0", "0.1", "-5"])
def test_bad_lease_seconds_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"CALLGATE_LEASE_SECONDS": raw})
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "CALLGATE_LEASE_SECONDS" in str(info.value)


def test_nan_lease_seconds_is_rejected() -> None:
    with pytest.raises(ConfigurationError):
        Settings.from_env({"CALLGATE_LEASE_SECONDS": "nan"})


def test_infinite_relayer_batch_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Settings.from_env({"CALLGATE_RELAYER_BATCH": "inf"})


@pytest.mark.parametrize("raw", ["a b", "x" * 65, "q/1", "tab\tq"])
def test_bad_queue_name(raw: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"CALLGATE_QUEUE": raw})
    assert "CALLGATE_QUEUE" in str(info.value)


def test_submit_limits_are_read_and_bounded() -> None:
    s = Settings.from_env({"CALLGATE_MAX_CALL_BYTES": "1000", "CALLGATE_MAX_TURN_CALLS": "7"})
    assert (s.max_call_bytes, s.max_turn_calls) == (1000, 7)
    assert (Settings.from_env({}).max_call_bytes, Settings.from_env({}).max_turn_calls) == (
        256 * 1024,
        128,
    )
    for name, raw in [
        ("CALLGATE_MAX_CALL_BYTES", "0"),
        ("CALLGATE_MAX_CALL_BYTES", "1e9"),
        ("CALLGATE_MAX_CALL_BYTES", str(1024**3)),
        ("CALLGATE_MAX_TURN_CALLS", "0"),
        ("CALLGATE_MAX_TURN_CALLS", "100000"),
        ("CALLGATE_MAX_TURN_CALLS", "nan"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env({name: raw})
        assert name in str(info.value)


@pytest.mark.parametrize(
    "url", ["http://x", "postgresql://127.0.0.1/x", "redis://:6379:x:y/abc", "nonsense", ""]
)
def test_a_redis_url_redis_cannot_use_is_a_configuration_error(url: str) -> None:
    from callgate.queue import transport

    with pytest.raises(ConfigurationError) as info:
        transport.connect(url)
    assert "CALLGATE_REDIS_URL" in info.value.message and "\n" not in info.value.message


def test_a_redis_url_with_a_password_is_never_echoed() -> None:
    from callgate.queue import transport

    with pytest.raises(ConfigurationError) as info:
        transport.connect("http://user:s3cret@x")
    assert "s3cret" not in info.value.message


def test_require_database_without_one() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({}).require_database()
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "CALLGATE_DATABASE_URL" in str(info.value)


def test_require_redis_without_one() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({}).require_redis()
    assert "CALLGATE_REDIS_URL" in str(info.value)


def test_downstream_url_falls_back_and_overrides() -> None:
    both = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": "postgresql:///a",
            "CALLGATE_DOWNSTREAM_DATABASE_URL": "postgresql:///b",
        }
    )
    assert both.downstream_url() == "postgresql:///b"
    with pytest.raises(ConfigurationError):
        Settings.from_env({}).downstream_url()


# --- CALLGATE_DEMO_DELAY_MS ------------------------------------------------------------


def test_parse_delays() -> None:
    assert delays.parse("refund_payment=0:300,get_weather=120") == {
        "refund_payment": (0.0, 0.3),
        "get_weather": (0.12, 0.0),
    }


@pytest.mark.parametrize("spec", [None, "", " , ,"])
def test_parse_empty(spec: str | None) -> None:
    assert delays.parse(spec) == {}


def test_parse_tolerates_spaces() -> None:
    assert delays.parse(" get_news = 50 : 10 , ") == {"get_news": (0.05, 0.01)}


@pytest.mark.parametrize("spec", ["x", "a=b", "=5", "a=-1", "a=1:-1", "a=1:z", "ok=1,x"])
def test_parse_malformed(spec: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        delays.parse(spec)
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "CALLGATE_DEMO_DELAY_MS" in str(info.value)
