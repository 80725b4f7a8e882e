"""The redactor's fast path (short plain runs, ISO-8601 timestamps) and its cache of clean
dict keys change nothing: what they let through, the full rules let through unchanged and
unremarked."""

from __future__ import annotations

import string
from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.tools import redaction

PLAIN = string.ascii_letters + string.digits + "._-"


def _full(text: str) -> tuple[str, list[str]]:
    notes: list[str] = []
    return redaction._redact_secrets(text, notes), notes


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=PLAIN, max_size=7))
def test_short_plain_runs_are_left_alone_by_the_full_rules(text: str) -> None:
    assert redaction._UNCHANGEABLE.fullmatch(text)
    assert _full(text) == (text, [])


# Words the rules and detectors look for, in every short combination the alphabet allows.
WORDS = ["pwd", "pw", "pin", "key", "sk", "pk", "rk", "AKIA", "AP", "AKC", "xoxb", "xapp", "gh"]
PIECES = [*WORDS, "-", "_", ".", "1", "0", "A", "a", "Z", "eyJ", "SG", "AC", "sq0", "glpat"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=5).map("".join))
def test_secret_looking_pieces_take_the_full_path_or_are_left_alone(text: str) -> None:
    fast = redaction.redact_secrets(text)
    assert fast == _full(text)[0]
    if redaction._UNCHANGEABLE.fullmatch(text):
        assert _full(text) == (text, [])


TIMESTAMPS = st.builds(
    lambda dt, sep, frac, zone: dt.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + zone,
    st.datetimes(min_value=datetime(1000, 1, 1)),
    st.sampled_from(["T", " "]),
    st.sampled_from(["", ".1", ".123456", ".123456789"]),
    st.sampled_from(["", "Z", "+00:00", "-05:30", "+0900", "+09"]),
)


@settings(max_examples=2000, deadline=None)
@given(TIMESTAMPS)
def test_timestamps_are_left_alone_by_the_full_rules(text: str) -> None:
    assert redaction._UNCHANGEABLE.fullmatch(text)
    assert _full(text) == (text, [])


def test_the_fast_path_lets_nothing_through_that_the_rules_catch() -> None:
    for secret in ["xoxb-1-abc", "pwd=hunter2", "AKIAABCDEFGHIJKLMNOP", "sk-abcdefghijklmn"]:
        assert not redaction._UNCHANGEABLE.fullmatch(secret)
        assert redaction.redact_secrets(secret) != secret


def test_a_key_is_cached_only_when_the_rules_found_it_clean() -> None:
    notes: list[str] = []
    assert redaction.redact_key("observed_at", {}, notes) == "observed_at"
    assert "observed_at" in redaction._CLEAN_KEYS and notes == []
    secret_key = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    assert redaction.redact_key(secret_key, {}, notes) != secret_key
    assert secret_key not in redaction._CLEAN_KEYS and notes == ["secret_redacted"]
    # A cached key is answered the same way the rules answered it.
    assert redaction.redact_key("observed_at", {}, notes) == "observed_at"
    assert notes == ["secret_redacted"]
