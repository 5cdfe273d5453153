"""Signing a browser in: a one-time link (minted with the admin token) that becomes an expiring cookie.

Links and sessions live in the database (runner/state/web_sessions.py), not in signed cookies: a link must
work exactly once even when several controllers share the database, and a session can be ended (sign out)
on every controller at once. Only the sha256 of a link or session secret is stored.
"""

from __future__ import annotations

import secrets
import time

from fastapi import Request, Response

from ..controller.auth import Principal, hash_token
from ..state import web_sessions

LINK_SECONDS = 5 * 60
SESSION_SECONDS = 12 * 3600
COOKIE = "runner_session"
SIGNIN_PATH = "/signin"


def _store(request: Request):
    return request.app.state.controller.store


def new_link(request: Request) -> tuple[str, float]:
    """A fresh one-time sign-in code and when it expires (unix seconds)."""
    code = secrets.token_urlsafe(32)
    now = time.time()
    with _store(request).db.transaction() as tx:
        web_sessions.add(tx, hash_token(code), web_sessions.LINK, now, now + LINK_SECONDS)
    return code, now + LINK_SECONDS


def redeem(request: Request, code: str) -> str | None:
    """Spend a sign-in code; the new session's secret, or None when the code is unknown, used or expired."""
    now = time.time()
    session = secrets.token_urlsafe(32)
    with _store(request).db.transaction() as tx:
        if not web_sessions.spend_link(tx, hash_token(code), now):
            return None
        web_sessions.add(tx, hash_token(session), web_sessions.SESSION, now, now + SESSION_SECONDS)
    return session


def page_principal(request: Request) -> Principal | None:
    """Who the browser is: a signed-in session grants what the admin token grants; anything else nothing.

    The page reads only its cookie: a bearer token (an admin's or a node's) opens no page.
    """
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    if web_sessions.session_expires_at(_store(request).db, hash_token(secret), time.time()) is None:
        return None
    return Principal("admin")


def end_session(request: Request) -> None:
    secret = request.cookies.get(COOKIE)
    if secret:
        with _store(request).db.transaction() as tx:
            web_sessions.remove(tx, hash_token(secret))


def set_cookie(response: Response, request: Request, secret: str) -> None:
    response.set_cookie(COOKIE, secret, max_age=SESSION_SECONDS, path="/", httponly=True, samesite="lax",
                        secure=request.url.scheme == "https")


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https")
