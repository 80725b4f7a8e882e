"""The redactor's fast path (short plain runs, ISO-8601 timestamps) and its cache of clean
dict keys change nothing: what they let through, the full rules let through unchanged and
unremarked. And a string with no candidate for a card, an SSN, an RRN, an IBAN or a JSON
document pays for no check digit and no JSON decode."""

from __future__ import annotations

import json
import string
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.tools import redaction, redaction_json, redaction_numbers

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
    for secret in [
        "xoxb-1-abc",
        "pwd=hunter2",
        "AKIAABCDEFGHIJKLMNOP",
        "sk-abcdefghijklmn",
        "4111111111111111",
        "123-45-6789",
        "DE89370400440532013000",
        '{"name": "token", "value": "x"}',
    ]:
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


# What a typical result's strings look like: none holds a candidate for a card, an SSN, an
# RRN, an IBAN or a JSON document, so none pays for a check digit or a JSON decode (a
# timestamp in ms is no RRN candidate).
ORDINARY = [
    "ORD-2024-000123",
    "order O-17 shipped to Seoul at 2024-05-01T10:20:30Z for $19.99",
    "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b",
    "9fceb02d0ae598e95dc970b74767f19372d61af8",
    "1,299.00 KRW",
    "+82 10-1234-5678",
    "1715000000000",
    "1714521600000",
    "refund of 12000 KRW approved [ticket 42] {see notes}",
    'Alice\'s order, "quoted" once',
]


def test_only_candidates_pay_for_a_check_or_a_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)

        return wrapper

    for module, attr in [
        (redaction_numbers.luhn, "checksum"),
        (redaction_numbers.iban, "is_valid"),
        (redaction_numbers.ssn, "is_valid"),
        (redaction_numbers.itin, "is_valid"),
        (redaction_numbers.rrn, "is_valid"),
    ]:
        monkeypatch.setattr(module, attr, counted(attr, getattr(module, attr)))
    decoder = redaction_json._DECODER
    monkeypatch.setattr(decoder, "raw_decode", counted("raw_decode", decoder.raw_decode))
    monkeypatch.setattr(decoder, "decode", counted("decode", decoder.decode))

    for text in ORDINARY:
        assert redaction.redact_secrets(text) == text
    assert calls == []
    # The same counters hear a candidate of each kind.
    for text in [
        "4111 1111 1111 1111",
        "123-45-6789",
        "GB82 WEST 1234 5698 7654 32",
        "900101-1234568",
    ]:
        assert redaction.redact_secrets(text) == "[redacted]"
    redaction.redact_secrets('{"name": "token", "value": "x"}')
    assert sorted(set(calls)) == ["checksum", "is_valid", "raw_decode"]


def _every_detector(text: str) -> set[str]:
    return {m for plugin in redaction._LIBRARY for m in plugin.analyze_string(text)}


# Pieces of what the library's detectors look for, for text that comes close to a match.
DETECTOR_PIECES = [
    *["AKIA", "ASIA", "ghp_", "glpat-", "eyJ", "xoxb-", "sk_live_", "SG.", "AC", "SK", "AKC"],
    *["password", "Secret", "api_key", "PWD", "contraseña", "=", ":", '"', "'", " ", "\n"],
    *["://", "@", "-----BEGIN RSA PRIVATE KEY-----", "pypi-", "sq0csp-", "/:_authToken="],
    *["aws", "12345678", "abcdefghijklmnop", "ABCDEFGHIJKLMNOP", "0123456789abcdef", "-us1"],
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(DETECTOR_PIECES), max_size=12).map("".join))
def test_the_detectors_prefilter_changes_nothing_they_find(text: str) -> None:
    assert redaction._library_matches(text) == _every_detector(text)


def test_the_detectors_prefilter_changes_nothing_on_the_corpora() -> None:
    from tests.acceptance.corpus_tools import CORPUS
    from tests.redaction_planted import KEEPS, PLANTS

    texts = [json.dumps(r) for r in CORPUS.results.values()]
    texts += [json.dumps(p.value, ensure_ascii=False) for p in PLANTS]
    texts += [json.dumps(k.value, ensure_ascii=False) for k in KEEPS]
    found = 0
    for text in texts:
        assert redaction._library_matches(text) == _every_detector(text)
        found += bool(_every_detector(text))
    assert found  # the corpora do hold what the detectors find
