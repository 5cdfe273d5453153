"""The agent's heartbeat, the request every node sends once a second: served below the web framework.

:class:`HeartbeatFrontDoor` is a plain ASGI app in front of FastAPI. A request to the heartbeat's path is
answered here, with no routing, middleware, dependency injection or model validation (at 2,000 nodes those
layers cost more CPU than the beat itself); every other request passes through untouched. Per beat: one
read of the database (``Store.heartbeat_view``: the node, its job and whether its attempt is the running
one, fresh on every beat, so another controller's cancel or release is heard on the next one), the beat
kept in memory for the once-a-second write (runner/controller/heartbeats.py). The rare answers (a gang node
kept after its attempt, a move to spot) take the slower reads they always took. Refusals are the same
``{"detail": ...}`` bodies and status codes FastAPI gives the other agent endpoints.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache

import structlog
from fastapi import HTTPException

from ..costpolicy import observe
from ..scheduler.spot_return import move_request
from ..scheduler.states import TERMINAL
from ..state.store import NODE_DRAINING, NODE_RUNNING
from ..wire import MOVE_TO_SPOT
from . import gang_agent, reports
from .auth import heartbeat_caller

log = structlog.get_logger(__name__)

HEARTBEAT_PATH = "/v1/agent/heartbeat"
MAX_BODY_BYTES = 64 * 1024  # a beat is a few hundred bytes; a larger body is refused before it is parsed
CONTINUE, CANCEL, SHUTDOWN = "continue", "cancel", "shutdown"


class HeartbeatFrontDoor:
    """ASGI: answers the heartbeat itself and hands every other request (and the lifespan) to ``app``."""

    def __init__(self, app, state):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        try:
            if scope["method"] != "POST":
                raise HTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
            body = await _read_body(receive)
            status, payload = 200, {"action": heartbeat(self.state, _header(scope, b"authorization"), body)}
        except HTTPException as refused:
            status, payload, headers = refused.status_code, {"detail": refused.detail}, dict(refused.headers or {})
        except Exception:  # a bug or a database error: a 500 for this beat, the agent beats again in a second
            log.exception("heartbeat failed")
            status, payload = 500, {"detail": "Internal Server Error"}
        await _respond(send, status, payload, headers)


def heartbeat(state, authorization: str, body: bytes) -> str:
    """Record liveness and progress; the answer tells the agent to continue, cancel, move (stop the job with a
    checkpoint for a move to spot: runner/scheduler/spot_return.py), or shut down (or, a gang node whose
    attempt ended while its job still runs, to stop that job and stay). The token is checked before the body."""
    node = heartbeat_caller(authorization, state)
    phase, progress = _beat(body)
    state.heartbeats.record(node["id"], time.time(), {"phase": phase, **(progress or {})})
    return _action(state, node)


async def _read_body(receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPException(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HTTPException(413, f"a heartbeat's body is at most {MAX_BODY_BYTES} bytes")
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


def _beat(body: bytes) -> tuple[str, dict | None]:
    """The body's ``phase`` (default running) and ``progress``, refused (422) naming the field as FastAPI would."""
    if not body.strip():
        raise HTTPException(422, "body: Field required")
    try:
        beat = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise HTTPException(422, "body: JSON decode error") from None
    if not isinstance(beat, dict):
        raise HTTPException(422, "body: Input should be a valid dictionary or object to extract fields from")
    phase, progress = beat.get("phase", "running"), beat.get("progress")
    if not isinstance(phase, str):
        raise HTTPException(422, "body.phase: Input should be a valid string")
    if progress is not None and not isinstance(progress, dict):
        raise HTTPException(422, "body.progress: Input should be a valid dictionary")
    return phase, reports.progress(progress)


def _action(state, node: dict) -> str:
    if node["state"] == NODE_DRAINING:  # handed over: its process is exiting; the exit report releases it
        return CONTINUE
    current = node["attempt_current"]
    is_gang, has_deadline = _spec_flags(node["spec"])
    kept = not current and is_gang and node["job_state"] not in TERMINAL
    if (not current and not kept) or node["state"] != NODE_RUNNING:
        return SHUTDOWN
    if node["cancel_requested"]:
        return CANCEL
    if current and not node["attempt_spot"] and has_deadline \
            and move_request(state.store, node["job_id"], node["attempt"]) is not None:
        return MOVE_TO_SPOT
    if kept:
        return gang_agent.heartbeat_action(state, node)
    return CONTINUE


@lru_cache(maxsize=4096)
def _spec_flags(spec_text: str) -> tuple[bool, bool]:
    """Whether a job is a gang and whether the cost policy may move it (its spec is fixed at submit)."""
    spec = json.loads(spec_text)
    return gang_agent.is_gang({"spec": spec}), observe.has_deadline(spec)
