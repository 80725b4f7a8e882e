"""Secret detection: the one redactor behind every exit of tool output. Pure: no I/O.

Results, failure details, trace details and log records all pass through here, so no path
can skip it. Detection is Yelp's ``detect-secrets`` plugins (AWS, GitHub, GitLab, JWT, Slack,
Stripe, OpenAI, npm, PyPI, private keys, basic-auth URLs, quoted keyword assignments and
more) plus a Shannon-entropy check for long random tokens, run on values, on dict keys, and
on what base64-, hex- or URL-encoded text decodes to. callgate keeps its own rules on top:
key names that say "secret" in English, Korean, Japanese or Chinese (``pwd``, ``auth``,
``key``, ``비밀번호``, ``토큰``, ``密码``…, also as the name of a name/value pair or a form
field), inline ``name=value`` text and ``비밀번호: value`` prose, command-line flags
(``--token x``, ``mysql -px``), XML elements named for a secret, headers, URL credentials,
token prefixes the library does not know, a token split across two sibling fields, private
key blocks without an END line, and stack traces (cut whole: the header that names the
exception and carries its message goes with the frames). Card numbers, US SSNs/ITINs,
Korean resident registration numbers and IBANs that pass their standard's check go too, as
text or as JSON numbers (``redaction_numbers``); the multilingual names and the text shapes
built on them are ``redaction_names``; and JSON inside a string (encoded twice, or in a
code's string literal) is decoded and searched with all of these rules (``redaction_json``).
Ids a client chose (a call id, an operation id, a tool name) pass ``redact_id`` wherever
they are shown: a log line, a span, the audit trace.

Redaction errs toward hiding: a false positive costs a model one value, a false negative
leaks a credential.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from detect_secrets.filters.heuristic import is_potential_uuid, is_sequential_string
from detect_secrets.plugins import keyword
from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import KeywordDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from callgate.core import logs
from callgate.tools.redaction_json import redact_embedded
from callgate.tools.redaction_names import (
    element_values,
    flag_values,
    is_secret_name,
    keyword_values,
)
from callgate.tools.redaction_numbers import redact_json_number, redact_numbers

REDACTED = "[redacted]"
STACK_REDACTED = "[stack trace redacted]"

# The library's detectors that need no network and no file context. Left out: the IP
# address detector (an address is not a credential) and the IBM/SoftLayer/Cloudant ones,
# whose keyword patterns this module's key-name rules already cover.
_LIBRARY: tuple[BasePlugin, ...] = (
    ArtifactoryDetector(),
    AWSKeyDetector(),
    AzureStorageKeyDetector(),
    BasicAuthDetector(),
    DiscordBotTokenDetector(),
    GitHubTokenDetector(),
    GitLabTokenDetector(),
    JwtTokenDetector(),
    KeywordDetector(),
    MailchimpDetector(),
    NpmDetector(),
    OpenAIDetector(),
    PrivateKeyDetector(),
    PypiTokenDetector(),
    SendGridDetector(),
    SlackDetector(),
    SquareOAuthDetector(),
    StripeDetector(),
    TelegramBotTokenDetector(),
    TwilioKeyDetector(),
)
# Most text holds nothing any detector looks for, yet asking each of them costs ~10 us a
# string (a generator and a search per pattern). One search for any of their patterns, and one
# for any keyword the keyword detector needs, answer that first; a hit asks them all as
# before, so what they find is unchanged. Built from the detectors' own patterns.
_REGEX_PLUGINS = tuple(p for p in _LIBRARY if isinstance(p, RegexBasedDetector))
_OTHER_PLUGINS = tuple(
    p for p in _LIBRARY if not isinstance(p, RegexBasedDetector | KeywordDetector)
)
_SCOPED_FLAGS = (("i", re.IGNORECASE), ("m", re.MULTILINE), ("s", re.DOTALL), ("x", re.VERBOSE))


def _scoped(pattern: re.Pattern[str]) -> str:
    flags = "".join(c for c, flag in _SCOPED_FLAGS if pattern.flags & flag)
    return f"(?{flags}:{pattern.pattern})" if flags else f"(?:{pattern.pattern})"


_ANY_DETECTOR_PATTERN = re.compile("|".join(_scoped(r) for p in _REGEX_PLUGINS for r in p.denylist))
_KEYWORD_PLUGINS = tuple(p for p in _LIBRARY if isinstance(p, KeywordDetector))
_ANY_KEYWORD = re.compile("|".join(keyword.DENYLIST), re.IGNORECASE)


def _library_matches(text: str) -> set[str]:
    """What the library's detectors find in ``text``."""
    found = {m for p in _OTHER_PLUGINS for m in p.analyze_string(text)}
    if _ANY_DETECTOR_PATTERN.search(text):
        found.update(m for p in _REGEX_PLUGINS for m in p.analyze_string(text))
    if _ANY_KEYWORD.search(text):
        found.update(m for p in _KEYWORD_PLUGINS for m in p.analyze_string(text))
    return found


# A match shorter than this is not replaced everywhere it occurs (it would eat words).
_MIN_MATCH = 8
# Random tokens: base64/URL-safe runs of 20+ characters whose Shannon entropy (bits per
# character) is above this. Hex (UUIDs, SHA-1 commit ids) stays below 4.0 and survives;
# random 32+ character keys sit near 5.
_ENTROPY = Base64HighEntropyString(limit=4.5)
_ENTROPY_LIMIT = 4.5
_TOKEN = re.compile(r"[A-Za-z0-9+/_=-]{20,}")
# Ids that providers and payment APIs make random on purpose (a tool call's ``call_…`` or
# ``toolu_…``, a response's ``msg_…``, Stripe's ``cus_…``, ``pi_…``, ``re_…``): random, yet no
# secret. Spared the entropy check only; a known token shape in one is still found.
_ORDINARY_ID = re.compile(
    r"(?:call|toolu|srvtoolu|fc|msg|resp|run|thread|asst|file|batch|req|chatcmpl|"
    r"cus|pi|ch|re|pm|in|evt|sub|prod|price|txn|po|acct|seti|src)[_-][A-Za-z0-9]{8,64}"
)

# --- text rules -----------------------------------------------------------------------------

_HEADER = re.compile(
    r"(?<![A-Za-z0-9])((?:proxy-)?authori[sz]ation|set-cookie|cookie|x-api-key|x-auth-token)"
    r"(\\*[\"']?\s*[=:]\s*)"
    # A quoted value (its quotes escaped when it sits in a string's JSON) ends at its quote
    # when a separator follows; any other runs to the end of its line.
    r"((?:\\+\"[^\"]*\"|\"[^\"]*\"|'[^']*')(?=\s*[,;}\]]|\\n|\n|$)|[^\n]*?(?=\\n|\n|\"\s*[,}]|$))",
    re.IGNORECASE,
)
# name=value, name: value, "name": "value" — redacted when the name is a secret's. A value
# already redacted is taken alone (with the quote a header's rule may leave after it), not
# with the code or JSON that follows it.
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9])([A-Za-z_][A-Za-z0-9_.-]{0,60})(\\*[\"']?\s*(?:=>|:=|=|:)\s*)"
    r"(\[redacted\]\"?|\\+\"[^\"]*\"|\"[^\"]*\"|'[^']*'|[^\s;,&]+)"
)
_STACK_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9])(stack(?:trace)?)(\s*[=:]\s*)[^;\n]+", re.IGNORECASE
)
_OWN_PATTERNS = (
    re.compile(r"\b(Bearer|Basic|Token|Digest)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    # URL credentials: scheme://user:password@, scheme://:password@, scheme://token@
    re.compile(r"(?<=://)[^/\s@\"']+@"),
    re.compile(r"(?s)-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----.*?(?:-----END \1-----|\Z)"),
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9_]{20,}"),
    re.compile(r"\b(?:sk|pk|rk|ghp|gho)[-_][A-Za-z0-9_-]{12,}"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bxapp-[A-Za-z0-9-]{20,}"),
    re.compile(r"\bwhsec_[A-Za-z0-9+/=]{16,}"),
    re.compile(r"\bAIza[A-Za-z0-9_-]{30,}"),
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    re.compile(r"https://hooks\.slack\.com/[^\s\"'<>]+"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
)
# Stack traces of any runtime: the first line that looks like one starts the cut, and
# everything after it goes (literal "\n" separators included, and a frame's literal "\t").
_STACK_START = re.compile(
    r"Traceback \(most recent call last\)"
    r"|File [\"'][^\"']+[\"'], line \d+"
    r"|(?:\b|(?<=\\t))at (?:async )?[\w$.<>/@-]+\([^()\n]*"
    r"(?:\.java|\.kt|\.scala|Native Method|Unknown Source)[^()\n]*\)"
    r"|(?:\b|(?<=\\t))at (?:async )?[^\s()]+ \([^()\n]*:\d+:\d+\)"
    r"|(?:\b|(?<=\\t))at (?:/|file:|node:)[^\s()]*:\d+:\d+"
    r"|\bgoroutine \d+ \[[^\]\n]*\]:"
    r"|^\s*at [\w$.<>/@-]+\([^)\n]*\)",
    re.MULTILINE,
)
# Where a runtime opens a trace with its own header rather than with a frame: Python's
# "Traceback (most recent call last):" (its exception line comes after the frames).
_STACK_OPENER = re.compile(r"Traceback \(most recent call last\)")
# A trace's header: the lines above its first frame that name the exception and carry its
# message (which holds whatever the failing code had in hand). Searched anywhere in a line, so
# text before it on that line survives. Java ``Exception in thread "main" pkg.Class: msg``,
# ``pkg.Class: msg`` and ``pkg.Class``; Node ``TypeError: msg`` / ``Uncaught Error: msg``; Go
# ``panic: msg`` and ``fatal error: msg``; .NET ``Unhandled exception. System.X: msg`` and its
# ``---> System.Y: msg`` inner exceptions.
_STACK_HEADER = re.compile(
    r"Exception in thread \""
    r"|\bUnhandled [Ee]xception\b"
    r"|\bUncaught (?=[\w$.]+\b)"
    r"|\b(?:panic|fatal error): "
    r"|(?<![\w$.])(?:[A-Za-z_$][\w$]*\.)*[\w$]*(?:Exception|Error|Throwable)\b"
    r"|^\s*(?:[A-Za-z_$][\w$]*\.)+[A-Z][\w$]*(?::\s|:?\s*$)"
)
# Any name alone on its line, or opening it as "Name: message": the shape of every runtime's
# header, trusted only on the line right above the first frame (where nothing else prints).
_STACK_HEADER_SHAPE = re.compile(r"\s*[A-Za-z_$][\w$.]*(?::\s.*|:)?\s*")
# How far above the first frame a header is looked for (a message may run over lines).
_STACK_HEADER_LINES = 64
# From 15 characters: the shortest text a rule detects (an SSN, 11 characters) encodes to 15
# and a padding "=".
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{15,}={0,2}")
# Hex of 10 bytes or more (any case, ``0x`` or not). Decoded only when it is text: a hash, a
# key id or a content id decodes to random bytes and is kept as it is.
_HEX = re.compile(r"(?<![0-9A-Za-z])(?:0[xX])?[0-9A-Fa-f]{20,}(?![0-9A-Za-z])")
_URL_ENCODED = re.compile(r"[^\s\"']*%[0-9A-Fa-f]{2}[^\s\"']*")
_CREDENTIAL_PAIR = re.compile(r"[^\s:]{1,64}:[^\s]{1,128}")


# Text no rule below can change, so it skips the ~25 patterns and 20 detectors (about 30 us
# a string; a result's every key and value pays it): runs of at most 7 letters, digits, dots,
# dashes and underscores (no separator an assignment, header, URL or key block needs; every
# token pattern needs 15+ characters and a detector's match is only replaced from 8), and
# ISO-8601 timestamps (no letter starts a name after a digit; no run of token characters
# reaches 15). tests/unit/test_redaction_fast_path.py checks both against the full rules.
_UNCHANGEABLE = re.compile(
    r"[A-Za-z0-9._-]{0,7}"
    r"|\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?"
)


def redact_secrets(text: str, notes: list[str] | None = None, *, strip_stacks: bool = True) -> str:
    """``text`` with every secret replaced by ``[redacted]`` and, with ``strip_stacks``, any
    stack trace cut. ``notes`` hears ``secret_redacted`` / ``stack_trace_redacted``."""
    if _UNCHANGEABLE.fullmatch(text):
        return text
    return _redact_secrets(text, notes, strip_stacks=strip_stacks)


def _redact_secrets(
    text: str, notes: list[str] | None = None, *, strip_stacks: bool = True, depth: int = 0
) -> str:
    """The full rules (``redact_secrets`` without its fast path)."""
    notes = notes if notes is not None else []
    cleaned, found = _secrets(text, depth)
    if found:
        notes.append("secret_redacted")
    if strip_stacks:
        cleaned, cut = _strip_stack(cleaned)
        if cut:
            notes.append("stack_trace_redacted")
    return cleaned


# How deep JSON inside a string inside JSON (and literals inside code) is decoded.
_EMBEDDED_DEPTH = 4


def _secrets(text: str, depth: int, *, entropy: bool = True) -> tuple[str, bool]:
    """``entropy=False``: no random-looking run is taken for a token on its entropy alone
    (for ids, which are random on purpose); every other rule applies."""
    found = False
    if depth < _EMBEDDED_DEPTH:
        text, found = redact_embedded(
            text, tree=lambda v: _tree(v, depth + 1), inner=lambda t: _secrets(t, depth + 1)
        )
    for rule in (redact_numbers, element_values, keyword_values, flag_values):
        text, hit = rule(text, REDACTED)
        found = found or hit

    def sub(pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> None:
        nonlocal text, found
        changed = pattern.sub(repl, text)
        found = found or changed != text  # a callback may keep what it matched
        text = changed

    sub(_HEADER, rf"\1\2{REDACTED}")
    text, n = _assignments(text)
    found = found or n
    sub(_STACK_ASSIGNMENT, rf"\1\2{REDACTED}")
    for pattern in _OWN_PATTERNS:
        if pattern.pattern.startswith(r"\b(Bearer"):
            sub(pattern, rf"\1 {REDACTED}")
        elif pattern.pattern.startswith("(?<=://)"):
            sub(pattern, f"{REDACTED}@")
        else:
            sub(pattern, REDACTED)
    matches = _library_matches(text)
    for match in sorted((m for m in matches if len(m) >= _MIN_MATCH), key=len, reverse=True):
        if match in text and REDACTED not in match:
            text = text.replace(match, REDACTED)
            found = True
    if entropy:
        sub(_TOKEN, _entropy)
    if depth < 2:
        sub(_HEX, lambda m: _decoded(m, depth, _hex))
        sub(_BASE64, lambda m: _decoded(m, depth, _b64))
        sub(_URL_ENCODED, lambda m: _decoded(m, depth, _url))
    return text, found


def _assignments(text: str) -> tuple[str, bool]:
    """Redact the value of every ``name=value`` whose name is a secret's. A match whose name
    is not resumes after its separator, so ``said: password=x`` still finds ``password``."""
    out: list[str] = []
    pos, found = 0, False
    while (m := _ASSIGNMENT.search(text, pos)) is not None:
        name, sep, _ = m.groups()
        if is_secret_name(name):
            out.append(text[pos : m.start()] + f"{name}{sep}{REDACTED}")
            pos, found = m.end(), True
        else:
            out.append(text[pos : m.end(2)])
            pos = m.end(2)
    out.append(text[pos:])
    return "".join(out), found


def _entropy(m: re.Match[str]) -> str:
    token = m.group()
    if (
        REDACTED.strip("[]") in token
        or is_potential_uuid(token)
        or _ORDINARY_ID.fullmatch(token)
        or is_sequential_string(token)
        or _ENTROPY.calculate_shannon_entropy(token) <= _ENTROPY_LIMIT
    ):
        return token
    return REDACTED


def _b64(token: str) -> str | None:
    if len(token) % 4 == 1:
        return None
    padded = token + "=" * (-len(token) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(padded)
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if decoded and sum(c.isprintable() or c in "\n\r\t" for c in decoded) == len(decoded):
            return decoded
    return None


def _hex(token: str) -> str | None:
    digits = token[2:] if token[:2] in ("0x", "0X") else token
    if len(digits) % 2:
        return None
    try:
        decoded = bytes.fromhex(digits).decode("utf-8")
    except ValueError:  # UnicodeDecodeError too: random bytes are seldom UTF-8
        return None
    return decoded if decoded.isprintable() else None


def _url(token: str) -> str | None:
    decoded = unquote(token)
    return decoded if decoded != token else None


def _decoded(m: re.Match[str], depth: int, decode: Callable[[str], str | None]) -> str:
    token = m.group()
    plain = decode(token)
    if plain is None:
        return token
    _, found = _secrets(plain, depth + 1)
    if found or _CREDENTIAL_PAIR.fullmatch(plain.strip()):
        return REDACTED
    return token


def _strip_stack(text: str) -> tuple[str, bool]:
    m = _STACK_START.search(text)
    if m is None:
        return text, False
    # A frame matched by ``^\s*at`` may start with the line breaks above it.
    first = m.start() + len(m.group()) - len(m.group().lstrip())
    cut = _line_start(text, first)
    if not _STACK_OPENER.match(text, first):
        cut = _header_start(text, cut)
    return text[:cut] + STACK_REDACTED, True


def _line_start(text: str, pos: int) -> int:
    """Where the line holding ``pos`` starts; literal "\\n" separators count as line breaks."""
    line = text.rfind("\n", 0, pos) + 1
    literal = text.rfind("\\n", 0, pos)
    return max(line, literal + 2 if literal >= 0 else 0)


def _header_start(text: str, frame: int) -> int:
    """Where the trace whose first frame's line starts at ``frame`` really starts: at its
    header, which names the exception and carries its message.

    Walks up the lines above the frame. In the block of lines right above it, the farthest
    header wins (a message may span lines); a blank line ends the block unless a header sits
    above it (Go prints ``panic: …``, a blank line, then ``goroutine 1 [running]:``). With no
    header found, the line right above the frame still goes when it has a header's shape.
    """
    cut, pos, gap = frame, frame, False
    for seen in range(_STACK_HEADER_LINES):
        if pos == 0:
            break
        end = pos - (1 if text[pos - 1] == "\n" else 2)
        start = _line_start(text, end)
        line = text[start:end]
        pos = start
        if not line.strip():
            gap = True
            continue
        header = _STACK_HEADER.search(line)
        if header is not None:
            cut, gap = start + header.start(), False
        elif gap:
            break
        elif seen == 0 and _STACK_HEADER_SHAPE.fullmatch(line):
            cut = start
    return cut


# --- structures -----------------------------------------------------------------------------

# {"name": "Authorization", "value": "…"}: the name fields say what the value fields hold
# (a form's field too: {"type": "password", "value": …}, {"label": "Password", "text": …}).
_PAIR_NAMES = (
    *("name", "key", "header", "field", "param", "parameter", "variable", "var"),
    *("type", "label", "kind"),
)
_PAIR_VALUES = ("value", "val", "values", "v", "content", "data", "text", "secret")


def secret_pair(value: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """Is this a name/value pair whose name is a secret's (its value must go)?"""
    if isinstance(value, Mapping):
        return any(isinstance(value.get(n), str) and is_secret_name(value[n]) for n in _PAIR_NAMES)
    return len(value) == 2 and isinstance(value[0], str) and is_secret_name(value[0])


def pair_value_keys() -> tuple[str, ...]:
    return _PAIR_VALUES


# A token split across two fields: the first ends with a token's known prefix (and maybe the
# start of its body), the second holds the rest: {"p1": "AKIA", "p2": "…"}, ["ghp_", "…"].
_TOKEN_START = re.compile(
    r"(?:AKIA|ASIA|gh[pousr]_|github_pat_|[spr]k_(?:live|test)_|sk-(?:proj-)?|xox[abposr]-|"
    r"xapp-|AIza|glpat-|npm_|pypi-|whsec_|eyJ)[A-Za-z0-9_-]{0,40}\Z"
)
_TOKEN_START_LENGTH = 60


def joined_secrets(values: Sequence[Any]) -> frozenset[int]:
    """The positions of the values that complete a token the value before them starts:
    each holds no secret alone (the rules found none), joined they do."""
    out: set[int] = set()
    for i in range(1, len(values)):
        head, tail = values[i - 1], values[i]
        if not (isinstance(head, str) and isinstance(tail, str)):
            continue
        start = _TOKEN_START.search(head) if len(head) <= _TOKEN_START_LENGTH else None
        if start and _secrets(start.group() + tail, 1)[1] and not _secrets(tail, 1)[1]:
            out.add(i)
    return frozenset(out)


def redact_number(value: int, notes: list[str]) -> int | str:
    """A JSON number: a card number or a resident registration number goes."""
    if isinstance(value, bool):
        return value
    shown = redact_json_number(value, REDACTED)
    if shown != value:
        notes.append("secret_redacted")
    return shown


# Dict keys the rules left unchanged and unremarked: a tool's results repeat the same field
# names, so each is checked once per process. Only names found clean are kept (never a
# secret), short ones, and at most this many.
_CLEAN_KEYS: set[str] = set()
_CLEAN_KEYS_MAX = 4096
_CLEAN_KEY_LENGTH = 64


def redact_key(key: str, taken: Mapping[str, Any], notes: list[str]) -> str:
    """A dict key, redacted if it is (or holds) a secret, kept unique among ``taken``."""
    if key in _CLEAN_KEYS:
        return key
    heard: list[str] = []
    cleaned = redact_secrets(key, heard, strip_stacks=True)
    notes.extend(heard)
    if cleaned == key:
        if not heard and len(key) <= _CLEAN_KEY_LENGTH and len(_CLEAN_KEYS) < _CLEAN_KEYS_MAX:
            _CLEAN_KEYS.add(key)
        return key
    n, candidate = 1, cleaned
    while candidate in taken:
        n += 1
        candidate = f"{cleaned}#{n}"
    return candidate


def redact_value(value: Any, notes: list[str] | None = None, *, names: bool = True) -> Any:
    """Any JSON-like value with secrets redacted in keys, values and name/value pairs.

    ``names=False`` for callgate's own records (trace details), whose keys are callgate's
    names (a verdict called ``authorization``), not a tool's: only text is searched there."""
    return _redact_value(value, notes if notes is not None else [], names, 0)


def _tree(value: Any, depth: int) -> tuple[Any, bool]:
    """A document decoded from text, redacted as a tool's value is (its names count)."""
    notes: list[str] = []
    return _redact_value(value, notes, True, depth), bool(notes)


def _redact_value(value: Any, notes: list[str], names: bool, depth: int) -> Any:
    if isinstance(value, Mapping):
        pair = names and secret_pair(value)
        split = joined_secrets(list(value.values()))
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            name = str(key)
            if i in split or (names and (is_secret_name(name) or (pair and name in _PAIR_VALUES))):
                notes.append("secret_redacted")
                out[redact_key(name, out, notes)] = REDACTED
            else:
                out[redact_key(name, out, notes)] = _redact_value(item, notes, names, depth)
        return out
    if isinstance(value, list | tuple):
        if names and secret_pair(value):
            notes.append("secret_redacted")
            return [_redact_value(value[0], notes, names, depth), REDACTED]
        split = joined_secrets(value)
        if split:
            notes.append("secret_redacted")
        return [
            REDACTED if i in split else _redact_value(v, notes, names, depth)
            for i, v in enumerate(value)
        ]
    if isinstance(value, str):
        if _UNCHANGEABLE.fullmatch(value):
            return value
        return _redact_secrets(value, notes, depth=depth)
    if isinstance(value, int):
        return redact_number(value, notes)
    return value


# --- ids ------------------------------------------------------------------------------------

# An id shown at an exit (a log line, a span, the audit trace) is cut past this many
# characters, the cut marked. Intake already refuses longer ids; this bounds every other path
# (a worker's own log line, an id read back from an older row, a lookup's argument) too.
MAX_ID_SHOWN = 200
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The operation id callgate makes when the application gives none: its hex is random bytes
# (checked: a client may send the same shape with text hex-encoded in it).
_MADE_OPERATION_ID = re.compile(r"op-([0-9a-f]{32})")


@functools.lru_cache(maxsize=4096)
def redact_id(value: str) -> str:
    """A client-chosen id (a call id, an operation id, a tool name) as an exit shows it:
    redacted as a value is, except that looking random is no reason (provider ids are random
    on purpose), then cut to ``MAX_ID_SHOWN`` characters. Cached: one call's ids are shown
    on several log lines and spans."""
    if _UNCHANGEABLE.fullmatch(value) or _UUID.fullmatch(value):
        return value
    made = _MADE_OPERATION_ID.fullmatch(value)
    if made and _hex(made.group(1)) is None:
        return value
    # Read twice the shown length: a secret that starts in the shown part is seen whole.
    cleaned, _ = _secrets(value[: 2 * MAX_ID_SHOWN], 0, entropy=False)
    if len(cleaned) <= MAX_ID_SHOWN and len(value) <= 2 * MAX_ID_SHOWN:
        return cleaned
    return f"{cleaned[:MAX_ID_SHOWN]}…(cut, {len(value)} chars)"


# --- logs -----------------------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """Redacts a record's message, exception text and stack text in place. Frames are kept
    (an operator needs them); secrets in the message and the exception text are not."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    if getattr(record, "_callgate_redacted", False):
        return record
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: show the template, never the arguments
        message = str(record.msg)
    record.msg, record.args = redact_secrets(message, strip_stacks=False), None
    if record.exc_info:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text, record.exc_info = redact_secrets(text, strip_stacks=False), None
    elif record.exc_text:
        record.exc_text = redact_secrets(record.exc_text, strip_stacks=False)
    if record.stack_info:
        record.stack_info = redact_secrets(record.stack_info, strip_stacks=False)
    record._callgate_redacted = True
    return record


def install_log_redaction() -> None:
    """Redact every log record of this process as it is created, whichever logger or
    handler (RQ's own included) writes it, and the ids every JSON or text line carries.
    Safe to call more than once."""
    logs.show_ids_with(redact_id)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "_callgate_redacting", False):
        return

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return redact_record(factory(*args, **kwargs))

    make._callgate_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
