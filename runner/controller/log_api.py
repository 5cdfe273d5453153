"""The agent's log chunks (POST /v1/agent/logs), answered by the front door (runner/controller/front_door.py):
after the heartbeat, the request nodes send most often."""

from __future__ import annotations

from fastapi import HTTPException

from . import reports
from .auth import node_caller
from .front_door import AWAITED, LeanRoute, json_object

LOGS_PATH = "/v1/agent/logs"
MAX_CHUNK_BODY = 1 << 20  # an agent sends at most 256 KiB of output a chunk (agents/logship.py), base64 in JSON


async def append_log(state, authorization: str, body: bytes) -> dict:
    """Append output of the calling node's attempt at its ``offset``; reply with the offset to send next.

    Output kept in files (SQLite) is appended at once, on the event loop: microseconds. Output kept in a shared
    database is written with the other chunks that arrive meanwhile on its lane, in one transaction
    (runner/controller/group_commit.py), and answered once that commits."""
    if not state.log_commits:
        return store_chunk(state, authorization, body)
    lane = state.log_commits[hash(authorization) % len(state.log_commits)]  # a node's chunks: always one lane
    return await lane.run(lambda tx: store_chunk(state, authorization, body, tx))


def store_chunk(state, authorization: str, body: bytes, tx=None) -> dict:
    """The chunk of this request, stored (inside ``tx`` where given); the offset to send next."""
    node = node_caller(authorization, state, tx)
    chunk = json_object(body)
    offset, text = chunk.get("offset"), chunk.get("data_b64")
    if offset is None:
        raise HTTPException(422, "body.offset: Field required")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= reports.MAX_INT:
        raise HTTPException(422, f"body.offset: a byte offset is a whole number from 0 (got {str(offset)[:40]!r})")
    if not isinstance(text, str):
        raise HTTPException(422, "body.data_b64: Field required" if text is None
                            else "body.data_b64: Input should be a valid string")
    data = reports.base64_bytes(text, "data_b64")
    if tx is None:
        return {"offset": state.logs.append(node.job_id, node.attempt, offset, data, node=node.rank)}
    return {"offset": state.logs.append_in(tx, node.job_id, node.attempt, offset, data, node=node.rank)}


ROUTE = LeanRoute(append_log, max_body=MAX_CHUNK_BODY, runs=AWAITED)
