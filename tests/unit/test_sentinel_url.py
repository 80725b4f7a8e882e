"""The ``redis+sentinel://`` URL: what it names, and a refusal that says what is wrong."""

from __future__ import annotations

import pytest
import redis.asyncio.sentinel
import redis.sentinel

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.logs import address
from callgate.queue import sentinel, transport


def test_the_sentinels_service_database_and_credentials() -> None:
    where = sentinel.parse(
        "redis+sentinel://app:pa%3Ass@s1:26380,s2,[::1]:26381/mymaster/3"
        "?sentinel_password=sp&sentinel_username=su"
    )
    assert where.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (where.service, where.db) == ("mymaster", 3)
    assert (where.username, where.password) == ("app", "pa:ss")
    assert (where.sentinel_username, where.sentinel_password) == ("su", "sp")


def test_the_database_defaults_to_0_and_a_password_may_come_alone() -> None:
    where = sentinel.parse("REDIS+SENTINEL://:secret@s1:26379/mymaster/")
    assert (where.db, where.username, where.password) == (0, None, "secret")


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+sentinel://s1:26379", "service name"),
        ("redis+sentinel://s1:26379/", "service name"),
        ("redis+sentinel:///mymaster", "at least one Sentinel"),
        ("redis+sentinel://s1,,s2/mymaster", "at least one Sentinel"),
        ("redis+sentinel://s1:port/mymaster", "'s1:port' has no valid port"),
        ("redis+sentinel://s1:0/mymaster", "'s1:0' has no valid port"),
        ("redis+sentinel://:26379/mymaster", "has no host"),
        ("redis+sentinel://s1/mymaster/zero", "'zero' is not a number"),
        ("redis+sentinel://s1/mymaster/0/x", "/SERVICE or /SERVICE/DB"),
        ("redis+sentinel://s1/mymaster?ssl=true", "unknown option 'ssl'"),
        ("redis+sentinel://s1/mymaster#x", "fragment"),
    ],
)
def test_a_bad_sentinel_url_names_what_is_wrong(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        transport.connect(url)
    message = info.value.message
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    assert named in message and "CALLGATE_REDIS_URL" in message and sentinel.FORM in message
    with pytest.raises(ConfigurationError):
        transport.connect_async(url)


def test_a_password_is_never_echoed() -> None:
    with pytest.raises(ConfigurationError) as info:
        transport.connect("redis+sentinel://u:s3cret@s1/mymaster/x?sentinel_password=t0p")
    assert "s3cret" not in info.value.message and "t0p" not in info.value.message


def test_the_clients_are_redis_pys_own_sentinel_clients() -> None:
    url = "redis+sentinel://:pw@s1:26380,s2/mymaster/2?sentinel_password=sp"
    client = transport.connect(url)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 2 and pool.connection_kwargs["password"] == "pw"
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26380, 26379]
    assert sentinels[0].connection_pool.connection_kwargs["password"] == "sp"
    # A worker's own small pool with short reads stays on the same service and Sentinels.
    own = transport.own_client(client, socket_timeout=1.5)
    own_pool = own.connection_pool
    assert isinstance(own_pool, redis.sentinel.SentinelConnectionPool)
    assert own_pool.sentinel_manager is pool.sentinel_manager
    assert own_pool.connection_kwargs["socket_timeout"] == 1.5
    assert own_pool.connection_kwargs["password"] == "pw"
    assert isinstance(
        transport.connect_async(url).connection_pool,
        redis.asyncio.sentinel.SentinelConnectionPool,
    )


def test_a_plain_url_is_its_own_primary_url() -> None:
    assert sentinel.primary_url("redis://h:6379/1") == "redis://h:6379/1"


def test_a_log_line_shows_the_sentinels_never_the_password() -> None:
    assert (
        address("redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0")
        == "s1:26379,s2:26379/mymaster/0"
    )
