"""Bearer tokens: one admin token for the CLI, one token per node that reaches only its own job."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException, Request

from ..state.rows import Node
from ..state.store import NODE_TERMINATED


NODE_ONLY = "only a node's own token can do this"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_token(secret: str, node_id: str) -> str:
    """A node's token: derived from the controller's node secret, so only the hash needs storing."""
    return hmac.new(secret.encode(), node_id.encode(), hashlib.sha256).hexdigest()


def write_secret(path: Path, value: str) -> None:
    """Keep a secret (the admin token) at ``path`` with mode 0600, unless it already holds that value."""
    try:
        if path.read_text().strip() == value:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Principal:
    kind: str  # "admin" or "node"
    node: Node | None = None

    @property
    def job_id(self) -> str | None:
        return self.node.job_id if self.node else None


def _bearer(request: Request) -> str:
    return bearer_token(request.headers.get("authorization", ""))


def bearer_token(header: str) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` header, or the 401 that asks for one."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer TOKEN'",
                            headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def _is_admin(token: str, state) -> bool:
    return hmac.compare_digest(token.encode(), state.admin_token.encode())  # bytes: a non-ASCII token is just wrong


def principal(request: Request) -> Principal:
    """Who is calling: the admin, or a node whose node row is not terminated."""
    return _principal(_bearer(request), request.app.state.controller)


def node_caller(authorization: str, state, tx=None):
    """The calling node's row for an Authorization header, refused with the 401 and 403 of ``require_node``;
    read inside ``tx`` where given."""
    who = _principal(bearer_token(authorization), state, tx)
    if who.kind != "node":
        raise HTTPException(403, NODE_ONLY)
    return who.node


def node_token_hash(authorization: str, state) -> str:
    """The hash of a node's token in an Authorization header, refused at once, as ``require_node`` would, where
    the header holds none or holds the admin token: checked before the request waits for its node's row."""
    token = bearer_token(authorization)
    if _is_admin(token, state):
        raise HTTPException(403, NODE_ONLY)
    return hash_token(token)


def live_node(node: Node | None) -> Node:
    """The node a token hash found, or the 401 of a token that reaches none (unknown, or its node terminated)."""
    if node is None or node.state == NODE_TERMINATED:
        raise HTTPException(401, "invalid token")
    return node


def _principal(token: str, state, tx=None) -> Principal:
    if _is_admin(token, state):
        return Principal("admin")
    return Principal("node", live_node(state.store.node_by_token_hash(hash_token(token), tx)))


async def heartbeat_caller(authorization: str, state) -> dict:
    """The calling node's ``Store.heartbeat_views`` for an Authorization header, read fresh, refused with the 401
    and 403 of ``require_node``."""
    token = bearer_token(authorization)
    if _is_admin(token, state):
        raise HTTPException(403, NODE_ONLY)
    view = await state.heartbeat_reads.get(hash_token(token))  # runner/controller/heartbeat_reads.py
    if view is None or view["state"] == NODE_TERMINATED:
        raise HTTPException(401, "invalid token")
    return view


# The checks are coroutines, so FastAPI runs them on the event loop (the node's row is read by its key): as
# plain functions each, and ``principal`` under it, would be a trip to the thread pool and back before the
# endpoint's own, three for every agent request. On a shared database (Postgres) that read is a round trip, and
# may wait for a pooled connection: there it is made on a thread, never on the loop that answers every node's
# heartbeat (profiled at 2,000 nodes: registrations' token reads held the loop up to hundreds of ms).
async def caller(request: Request) -> Principal:
    """``principal``, with the database read kept off the event loop where it is a round trip."""
    token, state = _bearer(request), request.app.state.controller
    if _is_admin(token, state) or not state.store.db.shared:
        return _principal(token, state)
    return await asyncio.get_running_loop().run_in_executor(None, _principal, token, state)


async def require_admin(request: Request) -> Principal:
    who = await caller(request)
    if who.kind != "admin":
        raise HTTPException(403, "a node token cannot do this")
    return who


async def require_node(request: Request) -> Principal:
    who = await caller(request)
    if who.kind != "node":
        raise HTTPException(403, NODE_ONLY)
    return who


async def require_job_access(job_id: str, request: Request) -> Principal:
    """The admin reaches every job; a node reaches only its own."""
    who = await caller(request)
    if who.kind == "node" and who.job_id != job_id:
        raise HTTPException(403, "this node's token does not reach that job")
    return who
