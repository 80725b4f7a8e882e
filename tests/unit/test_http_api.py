"""The HTTP API's pure pieces: the approval notices, the console's session and CSRF token,
the key format, problem statuses and settings."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from callgate.core.errors import AccessError, ConfigurationError, ErrorCode
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
