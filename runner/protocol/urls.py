"""URLs as messages, logs, status and the web page may show them: with their credentials as ``***``.

A URL may carry a secret: the password of its user (``sftp://user:PASSWORD@host/path``,
``postgresql://u:PASSWORD@h/db``), a user name with no password, which is how a token is often written
(``https://ghp_TOKEN@host/repo``, ``s3://ACCESS_KEY@bucket``), or a query parameter whose name says it is one (a
presigned or SAS URL's ``X-Amz-Signature``/``sig``, a driver's ``?token=``/``?secret=``/``?key=``, libpq's
``?password=``), and so may a libpq ``key=value`` string (``host=h password=...``). The controller (database
URLs), the agent and the checkpoint library (a job's ``checkpoint.durable_url``) hide them with the same function,
so this module is in runner.protocol: standard library only, importable from every side.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

HIDDEN = "***"
# Schemes whose user name is an account's name, never a secret of its own: shown as written when it has no password.
# Under every other scheme a user name without a password is taken for a token and hidden whole.
ACCOUNT_SCHEMES = frozenset({"ssh", "sftp", "scp", "ftp", "ftps", "smb", "postgres", "postgresql"})
TOKEN_LEAST = 8  # the shortest such user name that is also taken out of a message repeating it (hide_secrets)
# A parameter whose name suggests a secret, in a query string (``?token=...&sig=...``) or a libpq key=value string
# (``host=h password='...'``): the value runs to the next ``&``, ``#`` or white space (or the closing quote).
_SECRET_PARAMETER = re.compile(
    r"(?P<key>(?:^|[?&;\s])[A-Za-z0-9_.-]*(?:password|passwd|secret|token|key|signature|credential|sig)"
    r"[A-Za-z0-9_.-]*\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^&#\s]*)",
    re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` with its user's password, a user name that stands alone where it may be a token (see
    ``ACCOUNT_SCHEMES``) and its secret parameters shown as ``***``; everything else as written."""
    text = _SECRET_PARAMETER.sub(lambda m: f"{m['key']}{HIDDEN}" if m["value"] else m[0], url)
    try:
        parts = urlsplit(text)
        if parts.password is None and not _token_user(parts):
            return text
    except ValueError:  # not a URL (a bracket that opens no IPv6 host): its parameters are already hidden
        return text
    userinfo, _, host = parts.netloc.rpartition("@")
    if parts.password is None:
        return parts._replace(netloc=f"{HIDDEN}@{host}").geturl()
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:{HIDDEN}@{host}").geturl()


def _token_user(parts) -> str | None:
    """The user name of a URL that has no password, where its scheme does not make it an account's name."""
    if parts.password is not None or not parts.username:
        return None
    if set(parts.scheme.lower().split("+")) & ACCOUNT_SCHEMES:  # git+ssh:// too
        return None
    return parts.username


def secrets(url: str) -> set[str]:
    """The secrets ``url`` holds, as written and decoded, to take out of a message that may repeat them (a driver's
    error text)."""
    found = {m["value"].strip("'") for m in _SECRET_PARAMETER.finditer(url)}
    try:
        parts = urlsplit(url)
        found.add(parts.password or "")
        user = _token_user(parts) or ""
        if len(user) >= TOKEN_LEAST:  # a short one (``https://git@host``) would hide common words of the message
            found.add(user)
    except ValueError:
        pass
    found |= {unquote(value) for value in found}
    return {value for value in found if value}


def hide_secrets(text: str, url: str | None) -> str:
    """``text`` (a message that may quote ``url`` or repeat its secrets) with ``url``'s secrets shown as ``***``."""
    if not url:
        return text
    text = text.replace(url, redact(url))
    for secret in sorted(secrets(url), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text
