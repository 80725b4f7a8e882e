"""The redactor on the shapes a hostile tool author uses (issue: detection gaps), and on the
ordinary values that must survive. Every case counts what is left, never a flag."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any
from urllib.parse import quote

import pytest

from callgate.tools.registry import Tool
from callgate.tools.results import TRUST_LABEL, safe_error, safe_result
from tests.acceptance.corpus_tools import CORPUS, registry

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1c2VyLTQyIiwic2NvcGUiOiJhZG1pbiJ9"
    ".Zm9vYmFyYmF6cXV4UXVpY2tCcm93bkZveEp1bXBzT3Zlcg"
)
SIG = "Zm9vYmFyYmF6cXV4UXVpY2tCcm93bkZveEp1bXBzT3Zlcg"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY1"

# (result, the secret that must not be left anywhere in the safe result)
GAPS: list[tuple[str, Any, str]] = [
    ("jwt alone", {"v": JWT}, SIG),
    ("jwt under a key", {"session_blob": JWT}, SIG),
    ("aws temporary key", {"v": "ASIAQWERTYUIOPASDFGH"}, "QWERTYUIOPASDFGH"),
    ("aws secret in text", {"v": f"the secret is {AWS_SECRET} ok"}, "K7MDENG"),
    ("github_pat_", {"v": "github_pat_11ABCDEFG0123456789_abcdefghijKLMNOPQRST"}, "11ABCDEFG0"),
    ("ghs_", {"v": "ghs_abcdefghijklmnopqrstuvwxyz0123456789"}, "abcdefghijklmnop"),
    ("xapp-", {"v": "xapp-1-A0123ABCD-1234567890123-abcdef0123456789abcdef"}, "abcdef0123"),
    ("whsec_", {"v": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, "MfKQ9r8GKYqr"),
    ("AIza", {"v": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"}, "9tSrke72Pou"),
    (
        "slack webhook",
        {"v": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"},
        "XXXXXXXXXXXXXXXX",
    ),
    (
        "pem without END",
        {"v": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq1w2e3r"},
        "q1w2e3r",
    ),
    (
        "pgp private key block",
        {
            "v": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBFq9w8e7r6t5\n-----END PGP PRIVATE"
            " KEY BLOCK-----"
        },
        "lQOYBFq9w8e7r6t5",
    ),
    ("redis empty user", {"v": "redis://:Hunter2Hunter2@cache:6379/0"}, "Hunter2Hunter2"),
    ("https token@host", {"v": "https://s3cr3tT0k3nValue@git.example.com/a.git"}, "s3cr3tT0k3n"),
    ("key pwd", {"pwd": "correct-horse"}, "correct-horse"),
    ("key auth", {"auth": "correct-horse"}, "correct-horse"),
    ("key key", {"key": "correct-horse"}, "correct-horse"),
    ("key access_key", {"access_key": "correct-horse"}, "correct-horse"),
    ("key signing_key", {"signing_key": "correct-horse"}, "correct-horse"),
    ("key pin", {"pin": 482913}, "482913"),
    ("name/value dict", {"h": {"name": "Authorization", "value": "opaque-77"}}, "opaque-77"),
    ("name/value list", {"h": ["X-Api-Key", "opaque-78"]}, "opaque-78"),
    ("secret as a dict key", {"ghp_abcdefghijklmnopqrstuvwxyz0123456789": "owner"}, "abcdefghij"),
    (
        "base64 credential",
        {"v": base64.b64encode(b"password=opaque-79").decode()},
        base64.b64encode(b"password=opaque-79").decode(),
    ),
    ("base64 user:pass", {"v": base64.b64encode(b"admin:opaque-80").decode()}, "YWRtaW46"),
    ("url-encoded credential", {"v": quote("token=opaque-81&x=1", safe="")}, "opaque-81"),
    ("cookie in text", {"v": "sent Cookie: sid=opaque-82; theme=dark"}, "opaque-82"),
    (
        "java 9+ frames",
        {"v": "boom\n\tat app.mod/com.acme.HiddenSvc.run(HiddenSvc.java:42)"},
        "HiddenSvc",
    ),
    (
        "node stack",
        {"v": "TypeError: x\n    at HiddenFn (/srv/app/hidden.js:10:15)"},
        "hidden.js",
    ),
    (
        "go stack",
        {"v": "panic: x\n\ngoroutine 1 [running]:\nmain.hiddenFn()\n\t/srv/hidden.go:12 +0x1d"},
        "hiddenFn",
    ),
    (
        "traceback with literal \\n",
        {"v": 'Traceback (most recent call last):\\n  File "/srv/hidden.py", line 3'},
        "hidden.py",
    ),
]


# A trace is its header (exception class and message, which may hold anything the failing
# code had in hand) as well as its frames: (text, what must go, what must stay).
TRACES: list[tuple[str, str, tuple[str, ...], str]] = [
    (
        "java thread header, causes, suppressed",
        'Exception in thread "main" java.lang.IllegalStateException: card HdrA1 declined\n'
        "\tat com.acme.Svc.run(Svc.java:42)\n"
        "\tSuppressed: java.io.IOException: HdrA2\n"
        "\t\tat com.acme.Svc.close(Svc.java:50)\n"
        "Caused by: java.sql.SQLException: HdrA3\n"
        "\t... 1 more",
        ("HdrA1", "HdrA2", "HdrA3", "IllegalStateException", "Exception in thread"),
        "",
    ),
    (
        "java header after ordinary text on its line",
        "charge O-17 failed: java.lang.IllegalStateException: HdrB1\n"
        "\tat app.payments/com.acme.Svc.charge(Svc.java:42)",
        ("HdrB1", "IllegalStateException"),
        "charge O-17 failed: ",
    ),
    (
        "java multi-line message",
        "before\n\ncom.acme.PaymentDeclined: HdrC1\nsecond line HdrC2\n"
        "\tat com.acme.Svc.charge(Svc.java:42)",
        ("HdrC1", "HdrC2", "PaymentDeclined"),
        "before\n\n",
    ),
    (
        "node",
        "TypeError: Cannot read HdrD1\n    at Hidden.run (/srv/app/hidden.js:10:15)",
        ("HdrD1", "TypeError"),
        "",
    ),
    (
        "node uncaught, anonymous frame",
        "Uncaught Error: HdrE1\n    at Object.<anonymous> (/srv/a.js:1:7)",
        ("HdrE1",),
        "",
    ),
    (
        "go panic",
        "panic: HdrF1 [recovered]\n\tpanic: HdrF2\n\ngoroutine 1 [running]:\n"
        "main.f()\n\t/srv/x.go:12 +0x1d",
        ("HdrF1", "HdrF2", "panic"),
        "",
    ),
    (
        "go fatal error",
        "fatal error: HdrG1\n\ngoroutine 1 [running]:\nmain.f()",
        ("HdrG1",),
        "",
    ),
    (
        ".NET unhandled, inner exception",
        "Unhandled exception. System.InvalidOperationException: HdrH1\n"
        " ---> System.IO.IOException: HdrH2\n"
        "   at Acme.Svc.Run() in /src/Svc.cs:line 42\n"
        "   at Acme.Program.Main(String[] args)",
        ("HdrH1", "HdrH2", "InvalidOperationException"),
        "",
    ),
    (
        "python, message after the frames",
        "lookup failed\nTraceback (most recent call last):\n"
        '  File "/srv/x.py", line 3, in h\n    run()\nValueError: HdrI1',
        ("HdrI1", "ValueError", "x.py"),
        "lookup failed\n",
    ),
    (
        "java header with literal \\n separators",
        "java.lang.IllegalStateException: HdrJ1\\n\\tat com.acme.Svc.run(Svc.java:42)",
        ("HdrJ1",),
        "",
    ),
]


@pytest.mark.parametrize(
    ("text", "hidden", "kept"), [t[1:] for t in TRACES], ids=[t[0] for t in TRACES]
)
def test_a_stack_trace_goes_with_its_header(text: str, hidden: tuple[str, ...], kept: str) -> None:
    envelope, notes = safe_result(_tool(), {"v": text})
    shown = envelope["content"]["v"]
    assert [m for m in hidden if m in shown] == [], shown
    assert shown == kept + "[stack trace redacted]"
    assert notes == ["stack_trace_redacted"]


@pytest.mark.parametrize(
    "plain",
    [
        "java.lang.IllegalStateException: no frames, so not a trace",
        "Error: the order O-17 was not found",
        "ValueError: bad amount",
    ],
)
def test_an_exception_line_without_frames_is_not_a_trace(plain: str) -> None:
    envelope, notes = safe_result(_tool(), {"v": plain})
    assert (envelope["content"]["v"], notes) == (plain, [])


def _tool(**kw: Any) -> Tool:
    return Tool("t", "test tool", {"type": "object"}, "read", lambda a, c: {}, **kw)


@pytest.mark.parametrize(("result", "secret"), [g[1:] for g in GAPS], ids=[g[0] for g in GAPS])
def test_each_detection_gap_is_closed(result: Any, secret: str) -> None:
    envelope, notes = safe_result(_tool(), result)
    shown = json.dumps(envelope)
    assert shown.count(secret) == 0, shown
    assert envelope["trust"] == TRUST_LABEL
    assert notes.count("secret_redacted") + notes.count("stack_trace_redacted") >= 1


def test_a_declared_schema_does_not_let_a_secret_through_a_free_form_field() -> None:
    tool = registry().tools["corpus_schema"]
    envelope, _ = safe_result(tool, CORPUS.schema_result)
    shown = json.dumps(envelope)
    leaked = [p.id for p in CORPUS.plants if p.id.startswith("schema/") and _seen(p.markers, shown)]
    assert leaked == []
    assert envelope["content"]["order_id"] == "ORD-2024-000123"


def _seen(markers: tuple[str, ...], text: str) -> bool:
    return any(m in text for m in markers)


def test_the_whole_corpus_leaks_nothing_and_keeps_every_ordinary_value() -> None:
    """The corpus through the pure path (results and failure details), counted."""
    reg = registry()
    shown = [
        json.dumps(safe_result(reg.tools["corpus_values"], r)[0]) for r in CORPUS.results.values()
    ]
    shown.append(json.dumps(safe_result(reg.tools["corpus_audit"], CORPUS.audit)[0]))
    shown += [json.dumps(safe_error("not_found", d)) for d in CORPUS.failures.values()]
    text = "\n".join(shown)
    leaked = [p.id for p in [*CORPUS.plants, *CORPUS.audit_plants] if _seen(p.markers, text)]
    missing = [p.id for p in CORPUS.ordinary if not _seen(p.markers, text)]
    assert (len(leaked), len(missing)) == (0, 0), (leaked, missing)


@pytest.mark.parametrize(
    "plain",
    [
        "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b",
        "ORD-2024-000123",
        "2024-05-01T10:20:30.123456+09:00",
        "1,299.00 KRW",
        "9fceb02d0ae598e95dc970b74767f19372d61af8",
        "order O-17 shipped to Seoul at 2024-05-01T10:20:30Z for $19.99",
        "max_tokens: 512",
        "the password is strong",
        "primary_key: 42",
    ],
)
def test_ordinary_values_survive(plain: str) -> None:
    envelope, notes = safe_result(_tool(), {"v": plain, "max_tokens": 512, "primary_key": 42})
    assert envelope["content"] == {"v": plain, "max_tokens": 512, "primary_key": 42}
    assert notes == []
    if ":" not in plain and "password" not in plain:  # a key, not a sentence about one
        keyed, notes = safe_result(_tool(), {plain: "k"})
        assert (keyed["content"], notes) == ({plain: "k"}, [])


def test_log_records_are_redacted_with_their_exception_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from callgate.tools import redaction

    log = logging.getLogger("callgate.test")
    record_filter = redaction.RedactingFilter()
    caplog.handler.addFilter(record_filter)
    try:
        try:
            raise RuntimeError("connect postgresql://admin:opaque-90@db/x token=opaque-91")
        except RuntimeError:
            log.exception("handler %s failed with password=%s", "t", "opaque-92")
    finally:
        caplog.handler.removeFilter(record_filter)
    text = caplog.text
    assert [text.count(s) for s in ("opaque-90", "opaque-91", "opaque-92")] == [0, 0, 0]
    assert text.count("Traceback") == 1  # the frames stay, for the operator
