"""How a page shows a value: the Jinja filters and globals every template uses, and the redaction of
secret-looking keys (a page and a download hide the same ones).

Plain functions of a value, with no state: the templates get them through `Web`'s environment, a
page module that must show or hide a value the same way imports them from here.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from markupsafe import Markup, escape

from ledger.store.browse import Count

# Keys whose values a page never shows (a header or a parameter a stage may have passed along):
# these names, or names ending in one of them (`x-api-key`, `openai_api_key`, `client_secret`).
SECRET_KEYS = ("authorization", "api_key", "api-key", "apikey", "secret", "password", "access_token", "auth_token")


def url(path: str, **params: Any) -> str:
    """One of our own URLs with its query string encoded (values a stage wrote included): the
    only way a page builds an href from data."""
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return path + ("?" + urlencode(kept) if kept else "")


def segment(value: Any) -> str:
    """A value as one URL path segment (a job id with a slash stays one segment)."""
    return quote(str(value), safe="")


# Where an identifier may break across lines: after these separators (browsers break after a
# hyphen or a space by themselves), never inside a word (`error_handling` is one).
IDENT_BREAKS = re.compile(r"(?<=[:/.@|])(?=.)")


def breakable(value: Any) -> Markup:
    """An identifier (custom_id, job, pool) as text a narrow column can wrap at its separators
    (`openai:` `gpt-` `4o-mini`) instead of mid-word: escaped, with <wbr> between the pieces."""
    return Markup("<wbr>").join(escape(piece) for piece in IDENT_BREAKS.split(str(value)))


def when(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)[:19]


def money(value: Any) -> str:
    return "" if value is None else f"${float(value):.4f}"


def number(value: Any) -> str:
    return "" if value is None else f"{int(value):,}"


def seconds_text(value: Any) -> str:
    if value is None:
        return ""
    s = int(value)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def count_text(value: Count) -> str:
    return f"{value.n:,}+" if value.capped else f"{value.n:,}"


def pretty(value: Any) -> str:
    """A JSON value as indented text, with secret-looking keys' values hidden."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(redact(value), indent=2, ensure_ascii=False, default=str)


def secret_key(key: object) -> bool:
    name = str(key).lower()
    return name in ("token", "bearer", "cookie") or name.endswith(SECRET_KEYS)


def redact(value: Any) -> Any:
    """A JSON value with the values of secret-looking keys, at any depth, replaced."""
    if isinstance(value, dict):
        return {k: "[hidden]" if secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value
