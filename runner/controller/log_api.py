"""The agent's log chunks (POST /v1/agent/logs), answered by the front door (runner/controller/front_door.py):
after the heartbeat, the request nodes send most often."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fastapi import HTTPException

from ..state.logs import Chunk, nodes_and_log_sizes
from . import reports
from .auth import live_node, node_caller, node_token_hash
from .front_door import AWAITED, LeanRoute, json_object
from .group_commit import Outcome

LOGS_PATH = "/v1/agent/logs"
MAX_CHUNK_BODY = 1 << 20  # an agent sends at most 256 KiB of output a chunk (agents/logship.py), base64 in JSON


@dataclass(frozen=True)
class ChunkRequest:
    """A chunk as it waits for its group: the caller's token hash, and its offset and bytes or the 422 of its
    body (answered only once the token is known to be a node's: a caller without one learns nothing)."""

    token_hash: str
    offset: int = 0
    data: bytes = b""
    refused: HTTPException | None = None


async def append_log(state, authorization: str, body: bytes) -> dict:
    """Append output of the calling node's attempt at its ``offset``; reply with the offset to send next.

    Output kept in files (SQLite) is appended at once, on the event loop: microseconds. Output kept in a shared
    database is written with the other chunks that arrive meanwhile on its lane, in one transaction
    (runner/controller/group_commit.py, :func:`store_chunks`), and answered once that commits."""
    if not state.log_commits:
        return store_chunk(state, authorization, body)
    token_hash = node_token_hash(authorization, state)
    try:
        offset, data = _chunk(body)
        request = ChunkRequest(token_hash, offset, data)
    except HTTPException as refused:
        request = ChunkRequest(token_hash, refused=refused)
    lane = state.log_commits[hash(token_hash) % len(state.log_commits)]  # a node's chunks: always one lane
    return await lane.run(request)


def store_chunk(state, authorization: str, body: bytes) -> dict:
    """The chunk of this request, stored in a transaction of its own (or appended to its file); the offset to
    send next."""
    node = node_caller(authorization, state)
    offset, data = _chunk(body)
    return {"offset": state.logs.append(node.job_id, node.attempt, offset, data, node=node.rank)}


def store_chunks(state, tx, requests: Sequence[ChunkRequest]) -> list[Outcome]:
    """A lane's ``write_group``: the callers' nodes and their streams' sizes in one read, the chunks in one batch
    (runner/state/logs.py), sent with the transaction's COMMIT where nothing follows it: two round trips on
    Postgres. Where the batch fails, its chunks are stored one by one in the transaction still open."""
    nodes, sizes = nodes_and_log_sizes(tx, list(dict.fromkeys(r.token_hash for r in requests)))
    outcomes: list[Outcome | None] = [None] * len(requests)
    chunks, where = [], []
    for i, request in enumerate(requests):
        try:
            node = live_node(nodes.get(request.token_hash))
            if request.refused is not None:
                raise request.refused
        except HTTPException as refused:
            outcomes[i] = (False, refused)
            continue
        chunks.append(Chunk(node.job_id, node.attempt, node.rank, request.offset, request.data))
        where.append(i)
    try:  # the batch's INSERT in a savepoint of its own
        stored = [(False, answer) if isinstance(answer, Exception) else (True, {"offset": answer})
                  for answer in state.logs.append_many_in(tx, chunks, sizes, last=True)]
    except Exception:  # one chunk's error: nothing of the batch was kept; store them one by one
        stored = [_append_alone(state, tx, chunk) for chunk in chunks]
    for i, outcome in zip(where, stored):
        outcomes[i] = outcome
    return outcomes  # type: ignore[return-value]


def _append_alone(state, tx, chunk: Chunk) -> Outcome:
    try:
        with tx.savepoint():
            return True, {"offset": state.logs.append_in(tx, chunk.job_id, chunk.attempt, chunk.offset, chunk.data,
                                                         node=chunk.node)}
    except Exception as exc:
        return False, exc


def _chunk(body: bytes) -> tuple[int, bytes]:
    """The body's ``offset`` and decoded ``data_b64``, refused (422) naming the field as FastAPI would."""
    chunk = json_object(body)
    offset, text = chunk.get("offset"), chunk.get("data_b64")
    if offset is None:
        raise HTTPException(422, "body.offset: Field required")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= reports.MAX_INT:
        raise HTTPException(422, f"body.offset: a byte offset is a whole number from 0 (got {str(offset)[:40]!r})")
    if not isinstance(text, str):
        raise HTTPException(422, "body.data_b64: Field required" if text is None
                            else "body.data_b64: Input should be a valid string")
    return offset, reports.base64_bytes(text, "data_b64")


ROUTE = LeanRoute(append_log, max_body=MAX_CHUNK_BODY, runs=AWAITED)
