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
    ("key ssn, nine bare digits", {"customer_ssn": "123456789"}, "123456789"),
    ("key cvv", {"cvv": "737"}, "737"),
    ("key iban, cut short", {"payee_iban": "DE89 3704 0044"}, "3704 0044"),
    ("key card number, not Luhn", {"cardNumber": "4111111111111112"}, "4111111111111112"),
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


# --- payment cards, national ids, IBANs, JSON inside strings (issue 35, finding 3) ----------
#
# Every exit of tool output and of a call's arguments: a result, a failure detail, a span's
# recorded arguments, a trace detail and a log record. They share one redactor; each case runs
# through all five, so an exit that skipped a detector would show here.


def _through_result(text: str) -> str:
    envelope, _ = safe_result(_tool(), {"v": text})
    return str(envelope["content"]["v"])


def _through_failure(text: str) -> str:
    return str(safe_error("not_found", [{"message": text}])["details"][0]["message"])


def _through_span(text: str) -> str:
    from callgate.observe.tracing import redacted_arguments

    return str(json.loads(redacted_arguments({"v": text}))["v"])


def _through_trace(text: str) -> str:
    from callgate.tools import redaction

    return str(redaction.redact_value({"detail": text}, names=False)["detail"])


def _through_log(text: str) -> str:
    from callgate.tools import redaction

    record = logging.LogRecord("callgate.test", logging.INFO, __file__, 1, "%s", (text,), None)
    return str(redaction.redact_record(record).getMessage())


EXITS = {
    "result": _through_result,
    "failure": _through_failure,
    "span": _through_span,
    "trace": _through_trace,
    "log": _through_log,
}

# (id, the text as planted, what every exit must show instead)
NUMBERS: list[tuple[str, str, str]] = [
    ("visa spaced", "card 4111 1111 1111 1111 on file", "card [redacted] on file"),
    ("visa bare", "4012888888881881", "[redacted]"),
    ("mastercard dashed", "paid with 5500-0000-0000-0004.", "paid with [redacted]."),
    ("mastercard 2-series", "pan=2223000048400011&x=1", "pan=[redacted]&x=1"),
    ("amex 4-6-5", "amex 3782 822463 10005 exp 12/27", "amex [redacted] exp 12/27"),
    ("diners 14 digits", "30569309025904", "[redacted]"),
    ("discover", "6011111111111117", "[redacted]"),
    ("visa 13 digits", "old card 4222222222222", "old card [redacted]"),
    ("unionpay 19 digits", "6304 0000 0000 0000 000", "[redacted]"),
    ("card after a short number", "order 12 4111 1111 1111 1111", "order 12 [redacted]"),
    ("us ssn", "ssn on file: 123-45-6789", "ssn on file: [redacted]"),
    ("us ssn spaced", "SSN 536 90 4399.", "SSN [redacted]."),
    ("us itin", "ITIN 912-70-1234", "ITIN [redacted]"),
    ("iban grouped", "pay GB82 WEST 1234 5698 7654 32 today", "pay [redacted] today"),
    ("iban compact", "DE89370400440532013000", "[redacted]"),
    ("iban with letters in the bban", "FR14 2004 1010 0505 0001 3M02 606", "[redacted]"),
    ("iban then a word", "to NL91ABNA0417164300 SENT", "to [redacted] SENT"),
]


@pytest.mark.parametrize("exit_", list(EXITS), ids=list(EXITS))
@pytest.mark.parametrize(("text", "shown"), [n[1:] for n in NUMBERS], ids=[n[0] for n in NUMBERS])
def test_cards_national_ids_and_ibans_are_redacted_at_every_exit(
    exit_: str, text: str, shown: str
) -> None:
    assert EXITS[exit_](text) == shown


# Numbers of the same shapes that are not one: each fails the check its kind carries (Luhn
# and the card ranges, the SSA's never-issued ranges, the IBAN's mod-97 check digits and
# country format), or has a shape that is not looked for.
LOOKALIKES = [
    "4111111111111112",  # a card's shape, fails Luhn
    "order 4929123456789012 shipped",  # a 16-digit order number, fails Luhn
    "1715000000002",  # a timestamp in ms, passes Luhn: no card starts with 1
    "1715000000123456",  # a timestamp in µs
    "2051222360000008",  # one at the end of 2034, passing Luhn: no card network starts 2051
    "5512345678911",  # 13 digits pass Luhn, but only Visa issued 13-digit cards
    "0.30000000000000004",  # a float's digits
    "4111111111111111.5",
    "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b",
    "12345678-1234-1234-1234-123456789012",
    "+1 415 555 2671",
    "+82 10-1234-5678",
    "call 010-1234-5678 or 02-123-4567",
    "000-12-3456",  # area 000 is never issued
    "666-12-3456",
    "123456789",  # nine bare digits: too many ordinary numbers have the shape
    "2024-05-01 10:20:30",
    "GB83 WEST 1234 5698 7654 32",  # wrong check digits
    "DE89370400440532013001",
    "XX82WEST12345698765432",  # no such country
    "1,299.00 KRW and 4,111,111,111,111,111 points",
]


@pytest.mark.parametrize("exit_", list(EXITS), ids=list(EXITS))
@pytest.mark.parametrize("plain", LOOKALIKES)
def test_lookalike_numbers_survive_at_every_exit(exit_: str, plain: str) -> None:
    assert EXITS[exit_](plain) == plain


CODE_WITH_LITERAL = (
    'import json\ncfg = json.loads("{\\"password\\": \\"Opaque-61x\\"}")\nprint(cfg)'
)

# JSON inside a string: (id, the string, the secret, an ordinary value beside it that stays)
NESTED: list[tuple[str, str, str, str]] = [
    (
        "name/value pair in JSON text",
        json.dumps({"name": "X-Api-Key", "value": "Opaque-51x", "order": "O-17"}),
        "Opaque-51x",
        "O-17",
    ),
    (
        "list pair in JSON text",
        json.dumps({"headers": [["Authorization", "Opaque-52x"]], "order": "O-17"}),
        "Opaque-52x",
        "O-17",
    ),
    (
        "JSON encoded twice",
        json.dumps(json.dumps({"pwd": "Opaque-53x", "order": "O-17"})),
        "Opaque-53x",
        "O-17",
    ),
    (
        "escaped JSON without its quotes",
        json.dumps({"pwd": "Opaque-54x", "order": "O-17"})[0:-1].replace('"', '\\"') + "}",
        "Opaque-54x",
        "O-17",
    ),
    ("code holding a JSON literal", CODE_WITH_LITERAL, "Opaque-61x", "print(cfg)"),
    (
        "code holding a name/value literal",
        'body = "{\\"name\\": \\"api_key\\", \\"value\\": \\"Opaque-62x\\"}"  # O-17',
        "Opaque-62x",
        "O-17",
    ),
    (
        "escaped JSON beside an unescaped quote",
        'got body={\\"pwd\\": \\"Opaque-55x\\"} from "O-17"',
        "Opaque-55x",
        "O-17",
    ),
    (
        "JSON in text after words",
        'request body: {"name": "Authorization", "value": "Opaque-63x"} for O-17',
        "Opaque-63x",
        "O-17",
    ),
    (
        "card in JSON encoded twice",
        json.dumps(json.dumps({"card": "4111 1111 1111 1111", "order": "O-17"})),
        "4111 1111 1111 1111",
        "O-17",
    ),
    (
        "JSON in a JSON string in a JSON string",
        json.dumps({"outer": json.dumps({"name": "token", "value": "Opaque-64x"}), "o": "O-17"}),
        "Opaque-64x",
        "O-17",
    ),
]


@pytest.mark.parametrize("exit_", list(EXITS), ids=list(EXITS))
@pytest.mark.parametrize(
    ("text", "secret", "kept"), [n[1:] for n in NESTED], ids=[n[0] for n in NESTED]
)
def test_json_inside_a_string_is_decoded_and_redacted_at_every_exit(
    exit_: str, text: str, secret: str, kept: str
) -> None:
    shown = EXITS[exit_](text)
    assert (shown.count(secret), shown.count(kept)) == (0, 1), shown
    assert shown.count("[redacted]") >= 1


def test_the_probe_arguments_reach_a_span_redacted() -> None:
    """The two forms issue 35's probe found in clear, as a model sends them."""
    from callgate.observe.tracing import redacted_arguments

    arguments = {
        "x": json.dumps(json.dumps({"pwd": "Opaque-71x"})),
        "code": CODE_WITH_LITERAL.replace("Opaque-61x", "Opaque-72x"),
        "city": "Reykjavik",
    }
    recorded = redacted_arguments(arguments)
    assert [recorded.count(s) for s in ("Opaque-71x", "Opaque-72x", "Reykjavik")] == [0, 0, 1]
    # Still the arguments' JSON, and the code still reads as code around the redaction.
    code = json.loads(recorded)["code"]
    assert code.startswith("import json\ncfg = json.loads(") and code.endswith(")\nprint(cfg)")


@pytest.mark.parametrize(
    "plain",
    [
        json.dumps({"order": "O-17", "amount": 12000, "when": "2024-05-01T10:20:30Z"}),
        json.dumps(json.dumps({"order": "O-17", "items": [1, 2, 3]})),
        '{"order":"O-17","tags":["a","b"]}',
        'print(json.loads("{\\"order\\": \\"O-17\\"}"))',
        'say "hi" and {"unclosed": ',
        "[1, 2, 3] and {} and []",
    ],
)
def test_json_inside_a_string_without_a_secret_is_kept_byte_for_byte(plain: str) -> None:
    for exit_ in EXITS.values():
        assert exit_(plain) == plain


@pytest.mark.parametrize(
    "text",
    [
        '{"a": ' * 5000,  # cut off: each opening reads to the end
        '["' * 20000,  # an opening every two characters
        json.dumps(json.loads('{"a": ' * 900 + "1" + "}" * 900)),  # decodes, too deep to walk
        '{"a": ' * 3000 + "1" + "}" * 3000,  # past the decoder's own limit
        '[["' + "1" * 5000 + '"], ' + "1" * 5000 + "]",  # a number int() refuses
        '\\"' * 20000,
    ],
    ids=["cut off", "many openings", "deep", "deeper", "huge number", "escaped quotes"],
)
def test_pathological_json_is_left_to_the_text_rules(text: str) -> None:
    """Text that looks like JSON but cannot be walked is kept, not an exception."""
    from callgate.tools import redaction

    assert redaction.redact_secrets(text, strip_stacks=False) == text
