"""The HTTP API's pure pieces: the approval notices, the console's session and CSRF token,
the key format, problem statuses, settings, the long-poll slots and the framing checks."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import h11
import pytest

from callgate.core.errors import AccessError, ConfigurationError, ErrorCode
from callgate.ops import http_framing
from callgate.ops.http import auth, problems, views
from callgate.ops.http.settings import ApiSettings
from callgate.store import api_keys

SECRET = b"s" * 32


def _request(version: int, state: str, decided_by: str | None = None) -> dict[str, Any]:
    return {
        "approval_id": f"a{version}",
        "operation_id": "op-1",
        "version": version,
        "state": state,
        "decided_by": decided_by,
        "created_at": "2026-01-01T10:00:00+00:00",
    }


def test_a_new_version_after_an_approval_says_a_new_decision_is_needed() -> None:
    old, new = _request(1, "superseded", "user-5"), _request(2, "pending")
    shown = views.approval_views([old, new], datetime(2026, 1, 1, 10, 1, tzinfo=UTC))
    assert shown[1]["notice"].startswith("The intent changed after version 1 was decided by user-5")
    assert "needs a new decision" in shown[1]["notice"]
    assert shown[0]["notice"].startswith("Superseded by version 2")
    assert [v["age_seconds"] for v in shown] == [60.0, 60.0]


def test_a_first_request_has_no_notice() -> None:
    (shown,) = views.approval_views([_request(1, "pending")], datetime.now(UTC))
    assert shown["notice"] is None


def test_a_version_superseded_before_a_decision_is_named() -> None:
    notice = views.notice(
        _request(2, "pending"), [_request(1, "superseded"), _request(2, "pending")]
    )
    assert notice is not None and "before anyone decided" in notice


def test_a_session_cookie_names_the_key_id_and_is_signed() -> None:
    cookie, nonce = auth.new_session(SECRET, "ak1", 60)
    assert auth.session_of(SECRET, cookie) == ("ak1", nonce)
    with pytest.raises(AccessError):
        auth.session_of(b"t" * 32, cookie)  # another secret
    forged = cookie.replace("ak1", "ak2", 1)
    with pytest.raises(AccessError):
        auth.session_of(SECRET, forged)
    with pytest.raises(AccessError):
        auth.session_of(SECRET, None)


def test_an_expired_session_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    cookie, _ = auth.new_session(SECRET, "ak1", 60)
    monkeypatch.setattr(time, "time", lambda: 10**11)
    with pytest.raises(AccessError, match="expired"):
        auth.session_of(SECRET, cookie)


def test_csrf_token_is_bound_to_the_session() -> None:
    (a, _), (b, _) = auth.new_session(SECRET, "ak1", 60), auth.new_session(SECRET, "ak1", 60)
    auth.check_csrf(SECRET, a, auth.csrf_token(SECRET, a))
    for cookie, token in ((a, auth.csrf_token(SECRET, b)), (a, None), (None, "x")):
        with pytest.raises(AccessError) as caught:
            auth.check_csrf(SECRET, cookie, token)
        assert caught.value.code == ErrorCode.CSRF_FAILED


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "bearer"], ids=repr)
def test_a_request_without_a_bearer_key_is_unauthenticated(header: str | None) -> None:
    with pytest.raises(AccessError) as caught:
        auth.bearer_key(header)
    assert caught.value.code == ErrorCode.UNAUTHENTICATED


@pytest.mark.parametrize("key", ["", "cgk.", "cgk.a", "xyz.a.b", "cgk..b", "cgk.a.b.c"])
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(AccessError):
        api_keys.parse(key)


def test_a_key_parses_into_its_id_and_secret() -> None:
    assert api_keys.parse("cgk.ak12.s3cr-t_") == ("ak12", "s3cr-t_")


def test_statuses_of_codes() -> None:
    assert problems.status_of(ErrorCode.UNAUTHENTICATED) == 401
    assert problems.status_of(ErrorCode.APPROVAL_FORBIDDEN) == 403
    assert problems.status_of(ErrorCode.RATE_LIMITED) == 429
    assert problems.status_of(ErrorCode.UNKNOWN_TOOL) == 400


def test_rate_limited_problem_carries_retry_after() -> None:
    resp = problems.from_error(AccessError("x", code=ErrorCode.RATE_LIMITED, retry_after=2.2))
    assert resp.status_code == 429 and resp.headers["retry-after"] == "3"
    assert resp.media_type == "application/problem+json"


def test_api_settings_from_env() -> None:
    s = ApiSettings.from_env({"CALLGATE_API_RATE": "2.5", "CALLGATE_API_PORT": "9001"})
    assert (s.rate, s.burst, s.port, len(s.session_secret)) == (2.5, 20, 9001, 32)
    with pytest.raises(ConfigurationError):
        ApiSettings.from_env({"CALLGATE_API_SESSION_SECRET": "short"})
    with pytest.raises(ConfigurationError):
        ApiSettings.from_env({"CALLGATE_API_BURST": "0"})


def test_the_waits_bound_is_below_the_redis_pool() -> None:
    assert ApiSettings.from_env({}).wait_bound == 90  # redis-py's pool of 100, less a tenth
    assert ApiSettings.from_env({"CALLGATE_API_REDIS_POOL": "6"}).wait_bound == 5
    assert ApiSettings.from_env({"CALLGATE_API_REDIS_POOL": "2"}).wait_bound == 1
    assert ApiSettings.from_env({"CALLGATE_API_MAX_WAITS": "99"}).wait_bound == 99
    for env in (
        {"CALLGATE_API_MAX_WAITS": "100"},
        {"CALLGATE_API_MAX_WAITS": "10", "CALLGATE_API_REDIS_POOL": "10"},
        {"CALLGATE_API_REDIS_POOL": "1"},
    ):
        with pytest.raises(ConfigurationError, match="CALLGATE_API_"):
            ApiSettings.from_env(env)


def _refusal(slots: auth.WaitSlots, key_id: str, tenant: str = "t") -> AccessError:
    with pytest.raises(AccessError) as refused:
        slots.take(key_id, tenant)
    assert refused.value.code == ErrorCode.TOO_MANY_WAITS and refused.value.retry_after
    return refused.value


def test_wait_slots_bound_each_key_and_the_whole_process() -> None:
    slots = auth.WaitSlots(per_key=2, per_process=3, tenant_share=1.0)
    slots.take("ak1", "t")
    slots.take("ak1", "t")
    assert _refusal(slots, "ak1").details[0]["scope"] == "key"
    slots.take("ak2", "t")  # the process's third
    refused = _refusal(slots, "ak3")  # a key with none of its own, past the process's bound
    assert refused.details == [{"code": "wait_limit", "scope": "process", "limit": 3}]
    assert problems.from_error(refused).status_code == 429
    slots.give("ak1", "t")
    slots.take("ak3", "t")  # a slot given back is the next key's
    for key in ("ak1", "ak2", "ak3"):
        slots.give(key, "t")
    for key in ("ak4", "ak5", "ak6"):
        slots.take(key, "t")  # every slot came back
    _refusal(slots, "ak7")


def test_a_tenant_holds_at_most_its_share_and_another_tenant_is_served() -> None:
    slots = auth.WaitSlots(per_key=10, per_process=10, tenant_share=0.5)
    for i in range(5):
        slots.take(f"a{i}", "tenant-a")  # five keys, each inside its own cap
    refused = _refusal(slots, "a9", "tenant-a")
    assert refused.details == [{"code": "wait_limit", "scope": "tenant", "limit": 5}]
    assert "CALLGATE_API_TENANT_WAIT_SHARE" in refused.message
    slots.take("b0", "tenant-b")  # the other tenant's first wait, while tenant-a is full
    slots.give("a0", "tenant-a")
    slots.take("a9", "tenant-a")  # the share frees as the tenant's waits end


@pytest.mark.parametrize(
    ("per_process", "share", "per_tenant"), [(90, 0.5, 45), (10, 0.3, 3), (1, 0.5, 1), (3, 0.01, 1)]
)
def test_a_tenants_share_is_at_least_one_wait(
    per_process: int, share: float, per_tenant: int
) -> None:
    assert auth.WaitSlots(10, per_process, share).per_tenant == per_tenant


def test_wait_slots_hold_their_bounds_on_real_threads() -> None:
    """48 threads of three tenants take and give slots as fast as they can: no tenant ever
    holds more than its share, the process never more than its bound, every slot comes back;
    then, with one tenant's share held by its threads, another tenant's thread is served."""
    slots = auth.WaitSlots(per_key=3, per_process=10, tenant_share=0.5)
    seen = {"tenant-a": 0, "tenant-b": 0, "tenant-c": 0}
    worst = dict.fromkeys(seen, 0)
    worst_total = 0
    lock = threading.Lock()
    start = threading.Barrier(48)

    def churn(key: str, tenant: str) -> None:
        nonlocal worst_total
        start.wait()
        for _ in range(300):
            try:
                slots.take(key, tenant)
            except AccessError:
                continue
            with lock:
                seen[tenant] += 1
                worst[tenant] = max(worst[tenant], seen[tenant])
                worst_total = max(worst_total, sum(seen.values()))
            time.sleep(0)
            with lock:
                seen[tenant] -= 1
            slots.give(key, tenant)

    threads = [
        threading.Thread(target=churn, args=(f"{t}-k{i % 4}", t)) for t in seen for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert max(worst.values()) <= 5 and worst_total <= 10, (worst, worst_total)
    assert max(worst.values()) == 5, worst  # the share was reached, not merely never tried
    assert slots.held() == {}

    held = threading.Barrier(6)
    release = threading.Event()

    def hold(key: str) -> None:
        slots.take(key, "tenant-a")
        held.wait()
        release.wait(10)
        slots.give(key, "tenant-a")

    holders = [threading.Thread(target=hold, args=(f"a{i}",)) for i in range(5)]
    for t in holders:
        t.start()
    held.wait(10)
    _refusal(slots, "a9", "tenant-a")
    other: list[str] = []

    def another_tenant() -> None:
        slots.take("b0", "tenant-b")
        other.append("ok")

    served = threading.Thread(target=another_tenant)
    served.start()
    served.join(10)
    release.set()
    for t in holders:
        t.join(10)
    assert other == ["ok"]


GOOD_HEAD = b"GET /v1/tools HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\n"
AMBIGUOUS = {
    "two Authorization": GOOD_HEAD + b"Authorization: Bearer other\r\n\r\n",
    "Content-Length and chunked": b"POST /v1/turns HTTP/1.1\r\nHost: a\r\n"
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "HTTP/1.0 chunked": b"POST /v1/turns HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    "bare LF throughout": (GOOD_HEAD + b"\r\n").replace(b"\r\n", b"\n"),
    "one bare LF": GOOD_HEAD + b"Accept: */*\n\r\n",
    "bare LF ending the head": GOOD_HEAD + b"\n",
    "obs-fold by a space": GOOD_HEAD + b"Accept: a,\r\n b\r\n\r\n",
    "obs-fold by a tab": GOOD_HEAD + b"Accept: a,\r\n\tb\r\n\r\n",
}


def _first_event(raw: bytes) -> Any:
    conn = http_framing.StrictConnection(h11.SERVER)
    conn.receive_data(raw)
    return conn.next_event()


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_ambiguous_framing_is_refused_with_its_reason(name: str) -> None:
    conn = http_framing.StrictConnection(h11.SERVER)
    conn.receive_data(AMBIGUOUS[name])
    with pytest.raises(http_framing.Refused) as refused:
        conn.next_event()
    assert conn.refused is refused.value
    head, _, body = http_framing.answer_400(conn).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower()
    problem = problems.Problem.model_validate_json(body)
    assert (problem.code, problem.status, problem.detail) == (
        "invalid_input",
        400,
        str(refused.value),
    )


def test_plain_requests_pass_the_framing_checks() -> None:
    for raw in (
        GOOD_HEAD + b"\r\n",
        b"POST /v1/turns HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /v1/turns HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n[]",
        b"GET / HTTP/1.0\r\n\r\n",
    ):
        assert isinstance(_first_event(raw), h11.Request), raw
    # A head not yet whole is left to arrive, even with a bare LF so far.
    assert _first_event(GOOD_HEAD + b"Accept: */*\n") is h11.NEED_DATA
