"""The one redaction of secrets: every message, log line, repr and JSON the engine writes.

Two kinds of secret are taken out, each by one function here that every
backend, command and log formatter uses (none keeps a copy of its own):

* **shapes**, found wherever they stand, whatever the URI scheme, known or not
  (:func:`scrub`, :func:`redact_uri`):

  - the password of a URI's user info (``scheme://user:PASSWORD@host``; a
    list of hosts, as a Kafka bootstrap string has, included);
  - the value of every query parameter, property, ``key=value`` pair, JSON
    or repr entry whose *name* looks secret (:func:`is_secret_name`:
    password, secret, token, credential, any ``...key`` but the bare ``key``
    of key columns, ...): ``credential=``, ``s3.secret-access-key=``,
    ``"password": "..."``, ``sasl.jaas.config=...``;
  - a URI inside a parameter's value, percent-encoded or not (an Iceberg SQL
    catalog's ``uri=postgresql%3A%2F%2Fuser%3Apw%40host``);
  - the credentials after an HTTP authorization scheme (``Bearer ...``,
    ``Basic ...``);

* **values** the engine knows to be secret (a password from the environment,
  a config file's literal password), removed as written and in every form
  text gives them (:class:`Redactor`, :func:`redact`): percent-encoded, as a
  Python repr or a JSON string escapes them, and in base64 (standard and
  URL-safe, at any of the three alignments inside a longer base64 text, such
  as an HTTP Basic header's ``user:password``). A command registers its
  config file's secrets once (:func:`remember`): from then on every
  :func:`scrub` of the process, each log line's included, removes them too.

What is left in place of a secret is ``***``. The rules err on the side of
hiding: a value whose name merely looks secret is hidden too.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterable
from urllib.parse import quote, quote_plus, unquote

__all__ = [
    "REDACTED",
    "Redactor",
    "forms",
    "is_secret_name",
    "redact",
    "redact_uri",
    "remember",
    "scrub",
]

REDACTED = "***"

# Parts of a name that make its value a secret, wherever they stand in it
# (sslpassword, client_secret, refresh_token, s3.session-token, credentials).
_SECRET_PARTS = (
    "password", "passwd", "passphrase", "secret", "token", "credential", "apikey",
    "privatekey", "signature", "authorization", "jaas", "cookie",
)  # fmt: skip
# Whole words of a name that do (pwd, X-Amz-Signature's sig, Azure's sas).
_SECRET_WORDS = frozenset({"pwd", "pass", "sig", "sas", "auth", "pw"})
# A name ending in one of these names where a secret is, not the secret
# itself: password_env holds the name of an environment variable.
_NOT_SECRET_TAILS = frozenset({"env", "file", "path", "var", "type", "name", "url", "uri"})
_WORD = re.compile(r"[a-z0-9]+")


def is_secret_name(name: str) -> bool:
    """Whether a parameter, property or field called ``name`` holds a secret.

    Secret: a name containing password, passwd, passphrase, secret, token,
    credential, apikey, privatekey, signature, authorization, jaas or cookie;
    a name with the word pwd, pass, pw, sig, sas or auth; and a name with a
    word ending in ``key`` (access-key, account_key, sslkey, s3.secret-access-key),
    except the bare ``key`` (a sink's key columns) and its plural. Not secret:
    a name whose last word says it names where a secret is (``password_env``,
    ``sslpassword_file``).
    """
    lowered = name.lower()
    words = _WORD.findall(lowered)
    if not words or (words[-1] in _NOT_SECRET_TAILS and len(words) > 1):
        return False
    if any(part in lowered for part in _SECRET_PARTS):
        return True
    if _SECRET_WORDS.intersection(words):
        return True
    if words == ["key"]:
        return False
    return any(word.endswith("key") for word in words)


# A name and its value: name=value, "name": "value", 'name': 'value', and
# "name: value" (a bare name's colon followed by a space: host:5432 is not a
# pair). The value is a quoted string (its escapes kept) or runs to
# whitespace, '&', a quote, or the end. A bare name starts a word.
_PAIR = re.compile(
    r"""(?P<q>["']?)(?<![\w.\-])(?P<name>[A-Za-z_][\w.\-]*)(?P=q)(?P<sep>\s*=\s*|(?<=["'])\s*:\s*|\s*:\s+)"""
    r"""(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\\"(?:[^"\\]|\\[^"])*\\"|[^\s&'"]+)"""
)
# scheme:// and what follows, up to whitespace or a quote.
_URI = re.compile(r"""(?<![\w+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s'"<>`]*""")
# A percent-encoded URI: scheme%3A%2F%2F...
_ENCODED_URI = re.compile(
    r"""(?<![\w+.\-])[A-Za-z][A-Za-z0-9+.\-]*%3[Aa]%2[Ff]%2[Ff][^\s'"&<>`]*"""
)
# HTTP authorization schemes: their credentials follow after a space. A word
# of letters alone is prose ("Basic authorization"), not a credential.
_AUTH_SCHEME = re.compile(
    r"\b(Bearer|Basic|Digest|Token|Negotiate)\s+"
    r"(?=[A-Za-z0-9._~+/=\-]*[0-9._~+/=\-])([A-Za-z0-9._~+/=\-]{6,})"
)


def _userinfo(match: re.Match[str]) -> str:
    """A URI with its user info's password (the part after the first ':') replaced."""
    uri = match[0]
    start = uri.index("://") + 3
    end = len(uri)
    for stop in "/?#":
        found = uri.find(stop, start)
        if found != -1:
            end = min(end, found)
    # The last '@' of the authority ends the user info: a password with an
    # unencoded '@' is hidden whole, never cut at its first '@'.
    at = uri.rfind("@", start, end)
    # A URI in a parameter's value (an Iceberg SQL catalog's uri=) has its own.
    rest = _URI.sub(_userinfo, uri[end:])
    if at == -1:
        return uri[:end] + rest
    user, colon, _password = uri[start:at].partition(":")
    if not colon:
        return uri[:end] + rest
    return f"{uri[:start]}{user}:{REDACTED}{uri[at:end]}{rest}"


def _pair(match: re.Match[str]) -> str:
    value = match["value"]
    head = match[0][: match.start("value") - match.start()]
    if not is_secret_name(match["name"]):
        if value[:1] in ("'", '"') and len(value) > 1:
            # A quoted value may hold pairs of its own ({"error": "... password=x"}).
            return f"{head}{value[0]}{_PAIR.sub(_pair, value[1:-1])}{value[-1]}"
        return match[0]
    quote_char = value[0] if value[:1] in ("'", '"') else ""
    if value.startswith('\\"'):
        shown = f'\\"{REDACTED}\\"'
    elif quote_char:
        shown = f"{quote_char}{REDACTED}{quote_char}"
    else:
        shown = REDACTED
    return head + shown


def _encoded(match: re.Match[str]) -> str:
    decoded = unquote(match[0])
    cleaned = scrub(decoded)
    return match[0] if cleaned == decoded else quote(cleaned, safe="*")


# The forms of the secrets a command was given (its config file's): every
# scrub removes them too, so that a log line or an error of any code in the
# process, an app's or a driver's included, never carries them. Longest first.
_REMEMBERED: list[str] = []
_LOCK = threading.Lock()


def remember(*secrets: str | None) -> None:
    """Make every :func:`scrub` of this process remove ``secrets`` too, in every form.

    For a command, with its config file's secrets, once loaded: the log
    formatters, the one-line errors and every sink's redaction end with
    ``scrub``. A library caller's own secrets stay with the objects that hold
    them (a sink's target redacts its password from its own messages).
    """
    found = {f for secret in secrets if secret for f in forms(secret)}
    with _LOCK:
        _REMEMBERED[:] = sorted(found.union(_REMEMBERED), key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` with every secret-shaped part replaced by ``***`` (see the module's text),
    and every secret this process was told to :func:`remember`.

    Safe on any text: a log line, an error, a connection string of any scheme.
    """
    if not text:
        return text
    for form in _REMEMBERED:
        if form in text:
            text = text.replace(form, REDACTED)
    text = _ENCODED_URI.sub(_encoded, text)
    text = _URI.sub(_userinfo, text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m[1]} {REDACTED}", text)
    return _PAIR.sub(_pair, text)


def redact_uri(uri: str) -> str:
    """A connection string as it may be shown: any scheme (or none), its secrets replaced.

    The user info's password, every secret-named parameter or property (in
    the query, the path's ``;params`` or a libpq ``key=value`` string) and
    every URI nested in a parameter's value, percent-encoded or not.
    """
    return scrub(uri)


def forms(secret: str) -> set[str]:
    """The ways ``secret`` can appear in text: as written, percent-encoded, as a
    Python repr or a JSON string escapes it, and the parts of base64 text that
    only its bytes decide (see the module's text). Empty for an empty secret.
    """
    if not secret:
        return set()
    found = {secret, quote(secret, safe=""), quote(secret), quote(secret, safe=":"),
             quote_plus(secret), json.dumps(secret)[1:-1],
             json.dumps(secret, ensure_ascii=False)[1:-1]}  # fmt: skip
    # A repr escapes the backslash, non-printables and, when both quote kinds
    # are in the whole string, the quote it is delimited by.
    escaped = repr("\"'" + secret)[4:-1]
    found |= {escaped, escaped.replace("\\'", "'"), repr(secret)[1:-1]}
    found |= _base64_cores(secret.encode())
    return {f for f in found if f}


def _base64_cores(data: bytes) -> set[str]:
    """The base64 characters that only ``data``'s bytes decide, at each alignment.

    ``data`` inside a longer text starts at an offset 0, 1 or 2 of a 3-byte
    group; the characters that encode bits of ``data`` alone are the same
    whatever stands around it. Shorter than 4 characters: too common to hide.
    """
    cores: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data).decode()
        first = -(-8 * offset // 6)  # ceil: the characters the padding touches
        last = (8 * (offset + len(data))) // 6
        core = encoded[first:last]
        if len(core) >= 4:
            cores |= {core, core.replace("+", "-").replace("/", "_")}
    return cores


class Redactor:
    """Removes known secrets (in every form) and then every secret shape from text.

    Built once per set of secrets (a connection's, a command's): each call is
    a few ``str.replace`` and the shapes' regular expressions.
    """

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        found: set[str] = set()
        for secret in secrets:
            if secret:
                found |= forms(secret)
        # Longest first, so that a secret holding another is removed whole.
        self._forms = sorted(found, key=len, reverse=True)

    def with_secrets(self, secrets: Iterable[str | None]) -> Redactor:
        """A redactor of these secrets and ``secrets``."""
        joined = Redactor(secrets)
        joined._forms = sorted({*self._forms, *joined._forms}, key=len, reverse=True)
        return joined

    def __call__(self, text: str) -> str:
        """``text`` without the secrets, in any of their forms, nor any secret shape."""
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return scrub(text)


def redact(text: str, *secrets: str | None) -> str:
    """``text`` without ``secrets`` (in every form) and without any secret shape."""
    return Redactor(secrets)(text)
