"""The agent requests every node sends all the time, answered in front of the web framework.

At 2,000 nodes the controller serves about 2,500 agent requests a second, and FastAPI's routing, middleware,
dependency injection and thread-pool hop cost more CPU than the work of a heartbeat or a log chunk.
:class:`FrontDoor` is a plain ASGI app in front of FastAPI: a request to one of its paths is answered by a
plain function ``handler(state, authorization, body) -> payload``; every other request, and the lifespan,
passes through untouched. Refusals are the ``{"detail": ...}`` bodies and status codes the framework gives
the other endpoints (``HTTPException`` raised by a handler is answered as FastAPI would answer it).

Where a handler runs (``LeanRoute.runs``): all three agent routes are coroutines that do their own waiting.
The heartbeat awaits a read that, on Postgres, is batched with the other beats' (runner/controller/heartbeat_reads.py);
a report, and a log chunk kept in a shared database, await the commit of the transaction they share with the
others that arrived meanwhile (runner/controller/group_commit.py); a log chunk kept in files (SQLite) is
appended at once on the loop, where it takes microseconds.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

import structlog
from fastapi import HTTPException

from ..state.errors import DatabaseUnreachable

log = structlog.get_logger(__name__)


# Where a route's handler runs.
AWAITED = "awaited"            # a coroutine that does its own waiting (the heartbeat)
NEAR_THE_DATA = "near"         # quick reads and appends: on the loop with SQLite, on a thread with a shared database
ON_A_THREAD = "thread"         # a write transaction: waiting for the write lock must not hold up the loop


@dataclass(frozen=True)
class LeanRoute:
    """A POST answered by ``handler(state, authorization header, body bytes)``, run as ``runs`` says; a body
    larger than ``max_body`` is a 413."""

    handler: Callable[[Any, str, bytes], Any]
    max_body: int
    runs: str = NEAR_THE_DATA


class FrontDoor:
    """ASGI: answers ``routes`` itself and hands every other request (and the lifespan) to ``app``."""

    def __init__(self, app, state, routes: dict[str, LeanRoute]):
        self.app = app
        self.state = state
        self.routes = routes
        self._shared_database = bool(state.store.db.shared)

    async def __call__(self, scope, receive, send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        try:
            if scope["method"] != "POST":
                raise HTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
            body = await _read_body(receive, route.max_body)
            status, payload = 200, await self._answer(route, _header(scope, b"authorization"), body)
        except HTTPException as refused:
            status, payload, headers = refused.status_code, {"detail": refused.detail}, dict(refused.headers or {})
        except DatabaseUnreachable as exc:  # a 503 for this request; the agent sends it again
            log.warning("agent request not answered: the database cannot be reached", path=scope["path"],
                        error=str(exc))
            status, payload = 503, {"detail": str(exc)}
        except Exception:  # a bug or a database error: a 500 for this request; the agent sends it again
            log.exception("agent request failed", path=scope["path"])
            status, payload = 500, {"detail": "Internal Server Error"}
        await _respond(send, status, payload, headers)

    async def _answer(self, route: LeanRoute, authorization: str, body: bytes) -> dict:
        if route.runs == AWAITED:
            return await route.handler(self.state, authorization, body)
        if route.runs == ON_A_THREAD or self._shared_database:
            return await asyncio.get_running_loop().run_in_executor(None, route.handler, self.state, authorization,
                                                                    body)
        return route.handler(self.state, authorization, body)


def json_object(body: bytes) -> dict:
    """The body as a JSON object, or the 422 FastAPI gives a body that is missing, not JSON or not an object."""
    if not body.strip():
        raise HTTPException(422, "body: Field required")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise HTTPException(422, "body: JSON decode error") from None
    if not isinstance(value, dict):
        raise HTTPException(422, "body: Input should be a valid dictionary or object to extract fields from")
    return value


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPException(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"this request's body is at most {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:  # ASGI servers give header names in lower case
            return value.decode("latin-1")
    return ""


async def _respond(send, status: int, payload: dict, headers: dict[str, str]) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
