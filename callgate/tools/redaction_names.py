"""Names that say a secret follows, and the shapes of text where a name precedes its value.
Pure: no I/O.

``is_secret_name`` answers for a key, a header, a parameter, a flag or an element:
English names (``pwd``, ``api_key``, ``X-Auth-Token``), and the words users write in
Korean (``비밀번호``, ``암호``, ``패스워드``, ``토큰``, ``비밀키``, ``인증키``,
``주민등록번호`` …), Japanese (``パスワード``, ``暗証番号`` …) and Chinese (``密码``,
``密钥``, ``令牌`` …).

Text rules built on it, each returning the text with the values replaced:

- ``keyword_values``: a Korean, Japanese or Chinese keyword, then its value, the way prose
  and labels put it (``비밀번호: x``, ``비밀번호는 x 입니다``, ``パスワード：x``, ``密码: x``);
- ``flag_values``: command lines (``--password=x``, ``--token x``, ``mysql -px``,
  ``sshpass -p x``, ``redis-cli -a x``, ``curl -u user:x``, ``docker login -p x``);
- ``element_values``: XML elements whose tag (or ``key``/``name`` attribute) is a secret's
  name (``<password>x</password>``, ``<db:Password>``, ``<entry key="db.password">``,
  CDATA included).
"""

from __future__ import annotations

import functools
import re

# Searched in a name lowered, with everything but letters and digits removed ("X-Api-Key" →
# "xapikey", "계좌 비밀번호" → "계좌비밀번호").
_SECRET_NAME = re.compile(
    r"passw|passphrase|passcode|secret|credential|cookie|apikey|accesskey|privatekey|"
    r"secretkey|signingkey|encryptionkey|masterkey|sessionid|sessionkey|authori[sz]ation|"
    r"authtoken|accesstoken|refreshtoken|idtoken|csrftoken|xsrftoken|bearer|jwt|"
    r"connectionstring|clientsecret|cardnumber|"
    # Korean. 암호 alone is a password, 암호화 is encryption (암호화폐: a cryptocurrency),
    # unless a key follows; 토큰 followed by a count or a limit is a model's token usage.
    r"비밀번호|비번|패스워드|패스코드|암호(?!화)|암호화키|복호화키|"
    r"토큰(?!수|개수|사용량|한도|길이|화|수량|비용|제한|단가)|"
    r"비밀키|인증키|개인키|암호키|서명키|액세스키|접근키|보안키|마스터키|세션키|시크릿|api키|"
    r"인증번호|인증코드|보안코드|핀번호|카드번호|자격증명|"
    r"주민등록번호|주민번호|외국인등록번호|"
    # Japanese and Chinese (simplified and traditional).
    r"パスワード|暗証番号|秘密鍵|トークン|アクセスキー|シークレット|認証コード|マイナンバー|"
    r"密码|密碼|口令|密钥|密鑰|令牌|身份证号|身份證號|验证码|驗證碼"
)
# Whole words of a name ("db_pwd", "cardPin", "oauth_token").
_SECRET_WORDS = frozenset(
    {"pwd", "pw", "pass", "token", "auth", "oauth", "otp", "pin", "creds", "cred", "dsn", "sid"}
    | {"ssn", "cvv", "cvc", "iban", "rrn"}  # a person's or an account's number, whatever its shape
)
# "key" as the last word is a secret ("key", "access_key", "signingKey") except for these.
_NOT_SECRET_KEYS = frozenset(
    {
        "primary",
        "foreign",
        "sort",
        "partition",
        "cache",
        "idempotency",
        "public",
        "lookup",
        "routing",
        "row",
        "shard",
        "group",
        "object",
        "map",
        "hash",
        "unique",
        "composite",
        "natural",
    }
)
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_NOT_ALNUM = re.compile(r"[\W_]")


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Does a key, header, flag or parameter called ``name`` hold a secret, whatever its
    value? (Cached: a tool's results repeat the same few field names on every call.)"""
    squashed = _NOT_ALNUM.sub("", name.lower())
    if not squashed:
        return False
    if _SECRET_NAME.search(squashed) or squashed == "session":
        return True
    words = [w.lower() for w in _WORD.findall(name)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words and words[-1] in ("key", "keys"):
        return len(words) == 1 or words[-2] not in _NOT_SECRET_KEYS
    return False


# --- keyword, then value (Korean, Japanese, Chinese) -------------------------------------------

_HANGUL = "\uac00-\ud7a3"
_KANA = "\u3040-\u30ff"
_HIRAGANA = "\u3040-\u309f"
_HAN = "\u3400-\u9fff"
# The keywords as written in text (the name rule's words, and their spaced forms).
_KEYWORD = (
    r"비밀\s?번호|비번|패스워드|패스코드|암호(?!화)|토큰|비밀\s?키|인증\s?키|개인\s?키|"
    r"API\s?키|액세스\s?키|시크릿\s?키|보안\s?코드|인증\s?번호|인증\s?코드|핀\s?번호|"
    r"주민\s?등록\s?번호|주민\s?번호|외국인\s?등록\s?번호|"
    r"パスワード|暗証番号|秘密鍵|トークン|アクセスキー|"
    r"密码|密碼|口令|密钥|密鑰|令牌|身份证号|身份證號|验证码|驗證碼"
)
# What may separate a keyword from its value: a particle (은/는/이/가/을/를/도/로, は/が/を,
# 是/为), a colon (full-width too) or an equals sign (a key's closing quote before it), or
# plain space.
_PARTICLE = r"(?:은|는|이|가|을|를|도|으로|로|は|が|を|是|为|為)?"
_SEPARATOR = r"(?:\\*[\"']?[ \t]*[:：=][ \t]*|[ \t]+)"
# A value: a quoted string, or a run holding no space, no Hangul, kana or Han character and
# not ending on punctuation. Then, to tell "비밀번호는 x 입니다" from "비밀번호를 5회 틀렸습니다",
# only a particle, a copula or hiragana may follow it directly: a counter (회, 자, 개, 回,
# 个) says the number after a keyword is a count, not the secret.
_VALUE = (
    r"(\[redacted\]|\\*\"[^\"\n]*\"|'[^'\n]*'|“[^”\n]*”|"
    rf"[^\s{_HANGUL}{_KANA}{_HAN}\"'“”‘’,;、。，；]*"
    rf"[^\s{_HANGUL}{_KANA}{_HAN}\"'“”‘’,;、。，；.!?)\]」』]"
    rf"(?=$|[\s\"'“”‘’,;、。，；.!?)\]」』{_HIRAGANA}]"
    r"|입니다|이에요|예요|이고|이며|이라|라고|으로|로|를|을|이|가|은|는|도|와|과|였|이었))"
)
_KEYWORD_VALUE = re.compile(rf"({_KEYWORD})({_PARTICLE}{_SEPARATOR})(?:{_VALUE})", re.IGNORECASE)
# Every keyword holds one of these characters: text without any skips the pattern.
_KEYWORD_CHARS = frozenset("비번패암토키코인주외パ暗秘トア密口令身验驗")


def keyword_values(text: str, redacted: str) -> tuple[str, bool]:
    """``text`` with the value after each Korean, Japanese or Chinese secret keyword
    replaced."""
    if _KEYWORD_CHARS.isdisjoint(text):
        return text, False
    found = False

    def value(m: re.Match[str]) -> str:
        nonlocal found
        if m.group(3) == redacted:
            return m.group()
        found = True
        return m.group(1) + m.group(2) + redacted

    return _KEYWORD_VALUE.sub(value, text), found


# --- command lines ----------------------------------------------------------------------------

_ARG = r"('[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)"
# --name=value or --name value, the value not itself a flag.
_LONG_FLAG = re.compile(rf"(?<![\w-])(--([A-Za-z][\w-]{{0,40}})(?:=|[ \t]+))(?!-){_ARG}")
# One command, up to the end of its line or the next command (;, |, &).
_COMMAND = re.compile(
    r"(?<![\w./-])(?:mysql\w*|mariadb[\w-]*|sshpass|redis-cli|curl|(?:docker|podman)\s+login)"
    r"(?![\w-])[^\n;|&]*"
)
# The flags that carry a password on the commands above: mysql's -p takes it attached (a
# space after -p means "ask me", and the next word is the database), sshpass's -p and
# docker login's either way, redis-cli's -a after a space; curl's -u user:password.
_SHORT_FLAGS = (
    (re.compile(r"mysql|mariadb"), re.compile(rf"(?<!\S)(-p){_ARG}")),
    (re.compile(r"sshpass|docker|podman"), re.compile(rf"(?<!\S)(-p\s*){_ARG}")),
    (re.compile(r"redis-cli"), re.compile(rf"(?<!\S)(-a\s+){_ARG}")),
    (
        re.compile(r"curl"),
        re.compile(rf"(?<!\S)((?:-u|-U|--user|--proxy-user)(?:\s+|=)?[^\s:'\"]*:){_ARG}"),
    ),
)


_PROGRAMS = ("mysql", "mariadb", "sshpass", "redis-cli", "curl", "login")


def flag_values(text: str, redacted: str) -> tuple[str, bool]:
    """``text`` with the value of every secret-named long flag, and of the password flags of
    the commands that take one, replaced."""
    found = False

    def long_flag(m: re.Match[str]) -> str:
        nonlocal found
        name = m.group(2)
        if name.startswith("no-") or m.group(3) == redacted or not is_secret_name(name):
            return m.group()
        found = True
        return m.group(1) + redacted

    def command(m: re.Match[str]) -> str:
        nonlocal found
        line = m.group()
        for program, flag in _SHORT_FLAGS:
            if program.match(line):
                line, n = flag.subn(rf"\1{redacted}", line)
                found = found or n > 0
                break
        return line

    if "--" in text:
        text = _LONG_FLAG.sub(long_flag, text)
    if " -" in text and any(p in text for p in _PROGRAMS):
        text = _COMMAND.sub(command, text)
    return text, found


# --- XML elements -----------------------------------------------------------------------------

_ELEMENT = re.compile(
    r"<((?:[\w.-]+:)?([\w.-]+))(\s[^<>]*)?>((?:<!\[CDATA\[.*?\]\]>|[^<])+)</\1\s*>", re.DOTALL
)
_NAME_ATTRIBUTE = re.compile(r"""(?<![\w-])(?:key|name)\s*=\s*["']([^"']*)["']""")


def element_values(text: str, redacted: str) -> tuple[str, bool]:
    """``text`` with the content of every element named for a secret replaced (by its tag,
    or by a ``key``/``name`` attribute: ``<entry key="db.password">``)."""
    if "</" not in text:
        return text, False
    found = False

    def element(m: re.Match[str]) -> str:
        nonlocal found
        tag, local, attributes, content = m.groups()
        named = _NAME_ATTRIBUTE.search(attributes or "")
        if not (is_secret_name(local) or (named and is_secret_name(named.group(1)))):
            return m.group()
        if not content.strip() or content == redacted:
            return m.group()
        found = True
        return f"<{tag}{attributes or ''}>{redacted}</{tag}>"

    return _ELEMENT.sub(element, text), found
