"""Payment card numbers, US social security and taxpayer numbers, Korean resident
registration numbers and IBANs in text. Pure.

A regular expression finds the candidates; a number is redacted only when the check its kind
carries passes (python-stdnum's, a maintained implementation of each standard): Luhn and
the card networks' ranges for a card, the never-issued ranges for an SSN or an ITIN, a birth
date in the past and the check digit for a resident registration number (RRN, a foreign
resident's too), the mod-97 check digits and the country's format for an IBAN. An order
number, a timestamp or a phone number of the same length fails them and survives.
"""

from __future__ import annotations

import re

from stdnum import iban, luhn
from stdnum.kr import rrn
from stdnum.us import itin, ssn

# 13 or more digits, unbroken or in groups joined by single spaces or dashes; not part of a
# word or of a decimal number ("0.30000000000000004"). Each pattern here opens with a
# character class and looks behind only after it: a position that cannot start a match is
# passed over without running the lookbehinds.
_DIGIT_RUN = re.compile(r"[0-9](?<!\w[0-9])(?<![0-9]\.[0-9])(?:[ -]?[0-9]){12,}(?!\w|\.[0-9])")
_GROUP = re.compile(r"[0-9]+")
# A card printed in groups: 4-4-4-4, 4-6-5 (American Express), 4-6-4 (Diners), 4-4-4-4-3.
_CARD_GROUP = range(3, 7)
_CARD_LENGTH = range(13, 20)
# The first digit of every card network's range: Mastercard (2221-2720 and 5), Mir
# (2200-2204), American Express, Diners and JCB (3), Visa (4), Discover, UnionPay and Maestro
# (6). A timestamp in ms or us starts with 1 until 2033, then with 20 or 21 until 2039; only
# Visa issued 13-digit cards.
_CARD_FIRST = "23456"
_CARD_TWO = (range(2200, 2205), range(2221, 2721))

# 123-45-6789 or 123 45 6789, the same separator twice; nine bare digits are left alone (too
# many ordinary numbers have that shape).
_SSN = re.compile(
    r"[0-9](?<!\w[0-9])(?<![0-9][ -][0-9])[0-9]{2}([ -])[0-9]{2}\1[0-9]{4}(?![ -]?[0-9]|\w)"
)

# YYMMDD-SNNNNNN or its 13 digits unbroken. Hangul may touch it ("900101-1234568입니다").
_RRN = re.compile(r"[0-9](?<![0-9A-Za-z][0-9])(?<![0-9][.-][0-9])[0-9]{5}-?[0-9]{7}(?![0-9A-Za-z])")
# Unbroken, an RRN of someone born 2015-2020 (or 1915-1920) has the digits of a timestamp in
# ms between mid-2017 and 2036: there it is taken for the timestamp, and only goes with a
# hyphen or after a keyword (주민번호: …), which the keyword rules catch.
_MS_TIMESTAMPS = range(1_500_000_000_000, 2_100_000_000_000)

# Country, check digits, then the account: unbroken, or in groups of four (the last shorter).
_IBAN = re.compile(
    r"[A-Z](?<!\w[A-Z])[A-Z][0-9]{2}"
    r"(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,4})?)(?!\w)"
)
_IBAN_MIN = 15  # Norway's, the shortest
# What every candidate above holds: three digits in a row (a card's group, an SSN's area) or
# a capital and two digits (an IBAN's country and check digits). One scan for it spares most
# text the three above.
_ANY = re.compile(r"[0-9A-Z][0-9]{2}")


def redact_numbers(text: str, redacted: str) -> tuple[str, bool]:
    """``text`` with every card number, SSN, ITIN and IBAN replaced by ``redacted``."""
    if _ANY.search(text) is None:
        return text, False
    spans: list[tuple[int, int]] = []
    for m in _DIGIT_RUN.finditer(text):
        spans += [(m.start() + s, m.start() + e) for s, e in _cards(m.group())]
    for m in _SSN.finditer(text):
        digits = m.group().replace(m.group(1), "")
        if ssn.is_valid(digits) or itin.is_valid(digits):
            spans.append(m.span())
    for m in _RRN.finditer(text):
        if is_rrn(m.group()):
            spans.append(m.span())
    for m in _IBAN.finditer(text):
        end = _iban_end(m.group())
        if end:
            spans.append((m.start(), m.start() + end))
    if not spans:
        return text, False
    out, pos = [], 0
    for start, end in sorted(spans):
        if start >= pos:
            out += [text[pos:start], redacted]
            pos = end
    out.append(text[pos:])
    return "".join(out), True


def is_rrn(number: str) -> bool:
    """A Korean resident registration number (hyphenated, or 13 digits that are not a
    timestamp in ms): a birth date in the past, a place code and the check digit."""
    if "-" not in number and int(number) in _MS_TIMESTAMPS:
        return False
    return rrn.is_valid(number, allow_future=False)


def redact_json_number(value: int, redacted: str) -> int | str:
    """A JSON number that is a card number or an RRN is ``redacted``; any other is kept (an
    amount, a count, a timestamp, an id fail the checks). Only 13 digits and more are looked
    at: what the checks catch is never shorter."""
    if -(10**12) < value < 10**12:
        return value
    text = str(value)
    return redacted if redact_numbers(text, redacted)[0] != text else value


def is_card(digits: str) -> bool:
    """A payment card number: a network's first digit, its length, and Luhn's check."""
    n = len(digits)
    return (
        n in _CARD_LENGTH
        and digits[0] in _CARD_FIRST
        and (n != 13 or digits[0] == "4")
        and (digits[0] != "2" or any(int(digits[:4]) in r for r in _CARD_TWO))
        and luhn.checksum(digits) == 0
    )


def _cards(run: str) -> list[tuple[int, int]]:
    """Where in a run of digit groups the card numbers are: each window of consecutive groups
    (one unbroken run, or groups of 3 to 6 digits) that passes ``is_card``, the longest first."""
    groups = [(g.start(), g.end()) for g in _GROUP.finditer(run)]
    found: list[tuple[int, int]] = []
    i = 0
    while i < len(groups):
        best, total = -1, 0
        for j in range(i, len(groups)):
            size = groups[j][1] - groups[j][0]
            if j > i and size not in _CARD_GROUP:
                break
            total += size
            if total > _CARD_LENGTH.stop - 1:
                break
            if total in _CARD_LENGTH and is_card(_digits(run, groups[i][0], groups[j][1])):
                best = j
            if j == i and size not in _CARD_GROUP:
                break  # an unbroken run is a card alone or not at all
        if best >= 0:
            found.append((groups[i][0], groups[best][1]))
            i = best + 1
        else:
            i += 1
    return found


def _digits(run: str, start: int, end: int) -> str:
    return run[start:end].replace(" ", "").replace("-", "")


def _iban_end(candidate: str) -> int:
    """How much of ``candidate`` is an IBAN (0: none). A grouped one may have taken the next
    word's characters: its groups are dropped from the end until the rest passes."""
    while len(candidate) - candidate.count(" ") >= _IBAN_MIN:
        if iban.is_valid(candidate):
            return len(candidate)
        if " " not in candidate:
            return 0
        candidate = candidate.rsplit(" ", 1)[0]
    return 0
