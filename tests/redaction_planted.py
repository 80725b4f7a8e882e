"""Planted secrets in the shapes a security review found the redactor missing, and ordinary
values of the same look that must survive it. Deterministic (a seeded generator): every run
plants the same values, so a leak can be named.

A ``Plant`` is one secret in one shape: ``value`` is what a tool returns (or a client sends as
an id), ``markers`` are the parts of the secret whose presence anywhere in an output is a leak.
A ``Keep`` is an ordinary value: every one of its ``parts`` must come out unchanged.
"""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass
from typing import Any

from stdnum.kr import rrn

ALNUM = string.ascii_letters + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"


@dataclass(frozen=True)
class Plant:
    id: str
    value: Any
    markers: tuple[str, ...]


@dataclass(frozen=True)
class Keep:
    id: str
    value: Any
    parts: tuple[str, ...]


_rng = random.Random(46)


def _r(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _pw(prefix: str) -> str:
    """A password: mixed case and digits, no shape a token detector knows."""
    return f"{prefix}{_r(ALNUM, 10)}"


def _rrn(birth: str, seventh: str) -> str:
    """A checksum-valid resident registration number for ``birth`` (YYMMDD)."""
    body = f"{birth}{seventh}{_rng.randrange(0, 97):02d}{_r(string.digits, 3)}"
    number = body + rrn.calc_check_digit(body)
    assert rrn.is_valid(number), number
    return number


def _hyphen(number: str) -> str:
    return f"{number[:6]}-{number[6:]}"


def _plants() -> list[Plant]:
    out: list[Plant] = []

    def plant(id_: str, value: Any, *markers: str) -> None:
        out.append(Plant(id_, value, markers))

    # Korean, Japanese and Chinese keywords: in text, as a key, in JSON in a string.
    pw = _pw("Kr")
    plant("ko/비밀번호_colon", f"계정 비밀번호: {pw}", pw)
    pw = _pw("Kr")
    plant("ko/비밀번호_particle", f"비밀번호는 {pw} 입니다", pw)
    pw = _pw("Kr")
    plant("ko/비밀번호_copula", f"새 비밀번호는 {pw}입니다", pw)
    pw = _pw("Kr")
    plant("ko/비밀번호_fullwidth_colon", f"비밀번호：{pw}", pw)
    pw = _pw("Kr")
    plant("ko/암호_equals", f"암호={pw}", pw)
    pw = _pw("Kr")
    plant("ko/암호_quoted", f"암호 = '{pw}'", pw)
    tok = _r(ALNUM, 18)
    plant("ko/토큰_colon", f"발급된 토큰: {tok}", tok)
    pw = _pw("Kr")
    plant("ko/패스워드_particle", f"패스워드가 {pw}로 바뀌었습니다", pw)
    key = _r(ALNUM, 16)
    plant("ko/인증키_colon", f"인증키 : {key}", key)
    for word in ("비밀번호", "암호", "토큰", "패스워드", "비밀키", "인증키", "API키"):
        pw = _pw("Kj")
        plant(f"ko/key:{word}", {word: pw}, pw)
    pw = _pw("Kj")
    plant("ko/key:계좌 비밀번호", {"계좌 비밀번호": pw}, pw)
    pw = _pw("Kd")
    plant(
        "ko/json_in_string", json.dumps({"사용자": "kim", "비밀번호": pw}, ensure_ascii=False), pw
    )
    pw = _pw("Kn")
    plant("ko/name_value", {"name": "비밀번호", "value": pw}, pw)
    pw = _pw("Jp")
    plant("ja/パスワード", f"パスワード：{pw}", pw)
    pw = _pw("Zh")
    plant("zh/密码", f"密码: {pw}", pw)

    # Korean resident registration numbers: valid check digit, every way they are written.
    number = _rrn("900101", "1")
    plant("rrn/hyphen", f"고객 {_hyphen(number)} 확인", _hyphen(number), number)
    number = _rrn("850715", "2")
    plant("rrn/bare", f"resident {number} on file", number)
    number = _rrn("020304", "3")
    plant("rrn/after_주민번호", f"주민번호:{_hyphen(number)}", _hyphen(number), number)
    number = _rrn("781122", "1")
    plant("rrn/after_주민등록번호_bare", f"주민등록번호 {number}", number)
    number = _rrn("951231", "2")
    plant("rrn/json_number", {"holder": "kim", "id_no": int(number)}, number)
    number = _rrn("880808", "1")
    plant("rrn/json_number_in_list", {"ids": [7, int(number)]}, number)
    number = _rrn("770101", "5")  # a foreign resident's registration number, same scheme
    plant("rrn/foreigner", _hyphen(number), _hyphen(number), number)
    number = _rrn("991111", "2")
    plant("rrn/key_주민번호", {"주민번호": _hyphen(number)}, _hyphen(number), number)

    # Encoded forms of known token shapes: hex (any case, 0x), base64 inside text.
    secret = f"sk_live_{_r(ALNUM, 24)}"
    encoded = secret.encode().hex()
    plant("hex/stripe", encoded, encoded, secret)
    secret = f"ghp_{_r(ALNUM, 36)}"
    encoded = secret.encode().hex().upper()
    plant("hex/github_upper_in_text", f"blob: {encoded} end", encoded[:40], encoded[40:])
    secret = f"AKIA{_r(UPPER_ALNUM, 16)}"
    encoded = "0x" + secret.encode().hex()
    plant("hex/aws_0x", encoded, encoded[2:])
    secret = f"password={_pw('Hx')}"
    encoded = secret.encode().hex()
    plant("hex/password_assignment", {"payload": encoded}, encoded)
    secret = f"xoxb-1234567890-{_r(ALNUM, 24)}"
    encoded = base64.b64encode(secret.encode()).decode().rstrip("=")
    plant("base64/slack_in_text", f"cfg={encoded};", encoded)

    # Command lines: a password or token given as a flag.
    pw = _pw("My")
    plant("cli/mysql_-p", f"mysql -h db -uroot -p{pw} shop", pw)
    pw = _pw("My")
    plant("cli/mysqldump_-p_quoted", f"mysqldump -u admin -p'{pw}' --all-databases", pw)
    pw = _pw("Cl")
    plant("cli/--password=", f"psql --password={pw} -h db", pw)
    tok = _r(ALNUM, 20)
    plant("cli/--token_space", f"deploy --token {tok} --env prod", tok)
    key = _r(ALNUM, 20)
    plant("cli/--api-key_space", f"tool --api-key {key}", key)
    pw = _pw("Cl")
    plant("cli/--password_space", f"vault login --password {pw}", pw)
    pw = _pw("Ss")
    plant("cli/sshpass_-p", f"sshpass -p '{pw}' ssh ops@host", pw)
    pw = _pw("Rd")
    plant("cli/redis-cli_-a", f"redis-cli -h cache -a {pw} ping", pw)
    pw = _pw("Cu")
    plant("cli/curl_-u", f"curl -u admin:{pw} https://api.example.com", pw)

    # XML elements whose tag (or key attribute) names a secret.
    pw = _pw("Xm")
    plant("xml/password", f"<user><name>kim</name><password>{pw}</password></user>", pw)
    pw = _pw("Xm")
    plant("xml/namespaced_attrs", f'<db:Password type="plain">{pw}</db:Password>', pw)
    key = _r(ALNUM, 20)
    plant("xml/apiKey", f"<config><apiKey>{key}</apiKey></config>", key)
    pw = _pw("Xm")
    plant("xml/entry_key", f'<entry key="db.password">{pw}</entry>', pw)
    pw = _pw("Xm")
    plant("xml/cdata", f"<password><![CDATA[{pw}]]></password>", pw)
    pw = _pw("Xm")
    plant("xml/비밀번호", f"<비밀번호>{pw}</비밀번호>", pw)

    # A secret split across two fields.
    pw = _pw("Sp")
    plant("split/type_password", {"type": "password", "value": pw}, pw)
    pw = _pw("Sp")
    plant("split/label_text", {"label": "Password", "text": pw}, pw)
    body = _r(UPPER_ALNUM, 16)
    plant("split/aws_prefix_and_body", {"p1": "AKIA", "p2": body}, body)
    body = _r(ALNUM, 24)
    plant("split/stripe_prefix_and_body", {"prefix": "sk_live_", "rest": body}, body)
    body = _r(ALNUM, 36)
    plant("split/github_list", ["ghp_", body], body[:18], body[18:])
    return out


def _keeps() -> list[Keep]:
    out: list[Keep] = []

    def keep(id_: str, value: Any, *parts: str) -> None:
        out.append(Keep(id_, value, parts or (value,)))

    for v in ("call_abc123", "call_8xYz2Qw3RtL0pVbN4mKs9JdE", "toolu_01A09q90qw90lq917835lq9"):
        keep(f"id/{v}", v)
    keep("id/uuid", "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b")
    keep("id/order", "ORD-2024-000123")
    keep("id/refund", "rf-3f2b9c1e8a7d")
    # Content ids: hashes whose bytes are not text.
    keep("hash/sha1", "9fceb02d0ae598e95dc970b74767f19372d61af8")
    keep("hash/sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    keep("hash/md5", "d41d8cd98f00b204e9800998ecf8427e")
    keep("hash/in_text", "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae")
    # Hex and base64 of ordinary text: decoded, nothing found, kept.
    keep("hex/plain_text", b"Hello, world! order 17".hex())
    keep("base64/plain_text", base64.b64encode(b"shipped to Seoul on time").decode())
    # Korean prose, keywords included, with no value after them.
    for text in (
        "주문이 배송되었습니다",
        "비밀번호를 변경했습니다",
        "비밀번호는 8자 이상이어야 합니다",
        "비밀번호를 5회 틀렸습니다",
        "암호화폐 시세가 3% 올랐습니다",
        "토큰 사용량: 1234",
        "토큰 3개가 남았습니다",
        "2024년 5월 1일 오후 3시",
        "12,500원",
        "₩12,500",
        "서울특별시 강남구 테헤란로 123",
    ):
        keep(f"ko/{text}", text)
    keep("ko/key:토큰 사용량", {"토큰 사용량": 1234}, "1234")
    keep("ko/key:암호화 방식", {"암호화 방식": "AES-256-GCM"}, "AES-256-GCM")
    keep("ko/key:키", {"키": "175cm"}, "175cm")
    # Dates, amounts, phone and business numbers.
    for text in ("2024-05-01", "1,299.00 KRW", "$19.99", "010-1234-5678", "02-123-4567"):
        keep(f"number/{text}", text)
    keep("number/business_registration", "사업자등록번호 123-45-67890")
    # Timestamps in ms, as text and as JSON numbers; some read as a valid RRN too.
    for ts in _rrn_shaped_timestamps():
        keep(f"number/ms_timestamp_{ts}", str(ts))
        keep(f"number/ms_timestamp_json_{ts}", {"at": ts}, str(ts))
    keep("number/order_json_number", {"order_no": 202405011234}, "202405011234")
    # An RRN with a wrong check digit is a number, not an RRN.
    bad = _rrn("900101", "1")
    bad = bad[:-1] + str((int(bad[-1]) + 1) % 10)
    keep("number/rrn_bad_check", _hyphen(bad))
    # Command lines whose flags carry no secret.
    for text in (
        "ssh -p 2222 ops@host",
        "ssh -p2222 ops@host",
        "mkdir -p /tmp/out",
        "cp -pr src dst",
        "mysql -u root -p shop",
        "git commit -m 'fix token refresh'",
        "pytest -k test_tokens --maxfail=1",
    ):
        keep(f"cli/{text}", text)
    # XML with ordinary elements.
    keep("xml/ordinary", "<order><id>O-17</id><status>shipped</status></order>")
    keep("xml/keyboard", "<keyboard>us</keyboard>")
    # Pairs whose name is ordinary.
    keep("pair/type_text", {"type": "text", "value": "hello"}, "hello")
    keep("pair/label_order", {"label": "Order", "text": "O-17"}, "O-17")
    keep("split/currency", {"currency": "KRW", "amount": "12500"}, "KRW", "12500")
    keep("split/sku", {"p1": "SKU", "p2": "ABCD1234"}, "SKU", "ABCD1234")
    return out


def _rrn_shaped_timestamps() -> list[int]:
    """Milliseconds since the epoch (2017, 2024, 2025, 2033) that also pass the RRN check."""
    found = []
    for ts in (1_500_000_000_000, 1_714_521_600_000, 1_750_000_000_000, 2_000_000_000_000):
        while not rrn.is_valid(str(ts)):
            ts += 1_000_003
        found.append(ts)
    return found


PLANTS = _plants()
KEEPS = _keeps()


def _id_plants() -> list[Plant]:
    """Secrets a client put in a call id, an operation id or a tool name."""
    ghp = f"ghp_{_r(ALNUM, 36)}"
    sk = f"sk_live_{_r(ALNUM, 24)}"
    pw = _pw("Id")
    xox = f"xoxb-1234567890-{_r(ALNUM, 24)}"
    number = _hyphen(_rrn("900101", "1"))
    kpw = _pw("Ik")
    hexed = b"password=Hx12ab!".hex()  # callgate's operation id shape, with text inside
    return [
        Plant("operation_id/hex_in_made_shape", f"op-{hexed}", (hexed,)),
        Plant("call_id/github", ghp, (ghp[4:22], ghp[22:])),
        Plant("call_id/password", f"call-password={pw}", (pw,)),
        Plant("call_id/rrn", f"call {number}", (number,)),
        Plant("operation_id/stripe", f"op-{sk}", (sk[8:20], sk[20:])),
        Plant("operation_id/korean", f"비밀번호:{kpw}", (kpw,)),
        Plant("tool_name/slack", xox, (xox[16:28], xox[28:])),
    ]


ID_PLANTS = _id_plants()
ID_KEEPS = [
    "call_abc123",
    "call_8xYz2Qw3RtL0pVbN4mKs9JdE",
    "toolu_01A09q90qw90lq917835lq9",
    "fc_68a1b2c3d4e5f60718293a4b5c6d7e8f",
    "op-9f2c4e1a7b3d4c5e8f6a0b1c2d3e4f5a",  # the shape of the operation ids callgate makes
    "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b",
    "refund-O-17-2024-05-01",
    "get_weather",
    "refund_payment",
]
