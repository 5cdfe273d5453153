"""Database URLs as messages and logs may show them."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

# A password given as a parameter: libpq takes any connection keyword in a URL's query string
# (``postgresql://u@h/db?password=...``) and in a ``key=value`` string (``host=h password=...``), ``sslpassword`` too.
_PASSWORD_PARAMETER = re.compile(r"(?P<key>(?:^|[?&\s])[A-Za-z_]*password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^&\s]*)",
                                 re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` without its passwords (of its user, and any ``password=`` parameter), for messages and logs."""
    text = _PASSWORD_PARAMETER.sub(lambda m: f"{m['key']}***", url)
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
    except ValueError:  # not a URL (a bracket that opens no IPv6 host): its parameters are already hidden
        return text
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()


def passwords(url: str) -> set[str]:
    """The passwords ``url`` holds, as written and decoded, to take out of a message that may repeat them."""
    found = {m["value"].strip("'") for m in _PASSWORD_PARAMETER.finditer(url)}
    try:
        found.add(urlsplit(url).password or "")
    except ValueError:
        pass
    found |= {unquote(value) for value in found}
    return {value for value in found if value}
