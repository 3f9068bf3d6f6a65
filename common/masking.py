# SPDX-License-Identifier: Apache-2.0
"""Secrets kept out of what people and logs read: `jitterscope config` and
`doctor`, error messages (``errors.JitterscopeError`` masks its message),
log lines that name a URL.

Which settings are secret is decided here, in one place:

- ``URL_SETTINGS``: URLs that may carry credentials (``user:pass@``, a token
  in the query): the password, a lone user name, query values and the
  fragment are masked, scheme, host, port and path stay (they say where).
- ``WEBHOOK_SETTINGS``: URLs whose path is the credential (Slack, Teams,
  Discord incoming hooks): only ``scheme://host[:port]/***`` is shown.
- any setting whose name says token, password, secret or key (the Kafka SASL
  password, ...); ``*_file`` settings name where a secret is, not the secret,
  and stay readable. SecretStr values are masked whatever their name.

Masking is idempotent (a masked text masks to itself) and never raises.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

MASK = "***"

#: settings holding a URL that may carry credentials in its user info or query
URL_SETTINGS = frozenset({"clickhouse_url", "alertmanager_url", "alertmanager_generator_url", "kubelet_url"})
#: settings holding a URL whose path or query is itself the credential
WEBHOOK_SETTINGS = frozenset({"webhook_url"})
_SECRET_NAME = re.compile(r"token|passw(or)?d|secret|api_?key|credential", re.IGNORECASE)


def is_secret_setting(name: str) -> bool:
    """A setting whose whole value is a secret (not a ``*_file`` naming one)."""
    return bool(_SECRET_NAME.search(name)) and not name.endswith("_file")


def _userinfo(userinfo: str) -> str:
    """``user:pass`` -> ``user:***``; a lone ``user`` (often a token) -> ``***``."""
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def _netloc(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    userinfo, _, hostport = netloc.rpartition("@")
    return f"{_userinfo(userinfo)}@{hostport}"


def _query(query: str) -> str:
    return "&".join(f"{item.partition('=')[0]}={MASK}" if "=" in item else MASK
                    for item in query.split("&") if item)


# a URL's user info, found without parsing (for text urlsplit refuses)
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#\s@]*)@")


def _userinfo_only(text: str) -> str:
    return _USERINFO.sub(lambda m: f"{m['scheme']}{_userinfo(m['userinfo'])}@", text)


def mask_url(url: str) -> str:
    """``url`` with its password (or lone user name), query values and
    fragment masked: ``http://default:***@ch:8123/?database=***``."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a bad IPv6 literal, say: mask what can be found
        return _userinfo_only(url)
    if not parts.scheme or not parts.netloc:
        return _userinfo_only(url)
    masked = f"{parts.scheme}://{_netloc(parts.netloc)}{parts.path}"
    if parts.query:
        masked += "?" + _query(parts.query)
    if parts.fragment:
        masked += "#" + MASK
    return masked


def mask_webhook_url(url: str) -> str:
    """A webhook URL whose path may be its token (``https://hooks.slack.com/services/T/B/XXXX``):
    ``https://hooks.slack.com/***``. A URL with no path keeps only its user info masked."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return MASK
    if not parts.scheme or not host:
        return MASK
    if parts.path in ("", "/") and not parts.query and not parts.fragment and "@" not in parts.netloc:
        return url
    return f"{parts.scheme}://{host}/{MASK}"


def mask_setting(name: str, value: Any) -> Any:
    """A setting's value as it may be shown (``value`` as model_dump(mode="json") gives it)."""
    if value is None or value == "":
        return value
    if name in WEBHOOK_SETTINGS:
        return mask_webhook_url(str(value))
    if name in URL_SETTINGS:
        return mask_url(str(value))
    if is_secret_setting(name) or type(value).__name__ == "SecretStr":
        return MASK
    return value


def masked_settings(settings) -> dict[str, Any]:
    """Every setting of a pydantic model as JSON-able values, secrets masked."""
    return {name: mask_setting(name, value) for name, value in settings.model_dump(mode="json").items()}


# URLs in free text: up to white space; closing punctuation and quotes around
# them (``(http://...)``, ``'http://...'``, ``url: http://...,``) are not part of them
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_TRAILING = "'\"()[]{}<>,.;:!"
# a token is long: "the Bearer token" in a sentence is not one
_AUTH_HEADER = re.compile(r"\b(Bearer|Authorization:\s*Basic)\s+[A-Za-z0-9._~+/=-]{12,}")
_KEY_VALUE = re.compile(r"\b(password|passwd|pwd|token|access_token|secret|api_?key)=([^\s&'\",;)]+)", re.IGNORECASE)


def _url_in_text(match: re.Match) -> str:
    url = match[0]
    core = url.rstrip(_TRAILING)
    while core.count("[") > core.count("]") and len(core) < len(url):  # keep an IPv6 literal's "]"
        core = url[:len(core) + 1]
    return mask_url(core) + url[len(core):]


def mask_text(text: str) -> str:
    """``text`` (an error message, a log line) with the credentials in its
    URLs, bearer/basic tokens and ``password=...`` pairs masked."""
    if not text:
        return text
    text = _URL.sub(_url_in_text, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m[1]} {MASK}", text)
    return _KEY_VALUE.sub(lambda m: f"{m[1]}={MASK}", text)
