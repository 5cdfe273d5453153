"""Job output kept in the database, for controllers that share one (with SQLite it stays in files:
runner/controller/logstore.py). The same interface and offsets: an agent sends each chunk with the offset it
starts at; a chunk already received is not stored twice, and a gap is refused so the agent resends from the end.

Each stored chunk is a row keyed by (job, attempt, node rank, start offset); the chunks of one stream are
contiguous, so its size is the end of its last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Database, Tx, padded
from .rows import Node

_STREAM = "job_id = ? AND attempt = ? AND node = ?"
_RACES = 5  # an agent sends one chunk at a time: more than one racing append is a retry at most


@dataclass(frozen=True)
class Chunk:
    """Output of one stream (a job's attempt on one node) that starts at byte ``offset``."""

    job_id: str
    attempt: int
    node: int
    offset: int
    data: bytes

    @property
    def stream(self) -> tuple[str, int, int]:
        return self.job_id, self.attempt, self.node


class DatabaseLogStore:
    def __init__(self, db: Database):
        self.db = db

    def size(self, job_id: str, attempt: int, node: int = 0) -> int:
        return _size(self.db.query, job_id, attempt, node)

    def append(self, job_id: str, attempt: int, offset: int, data: bytes, node: int = 0) -> int:
        """Store ``data`` that starts at ``offset`` in a transaction of its own; return the new size (the offset
        to send next)."""
        with self.db.transaction(serialized=False) as tx:
            return self.append_in(tx, job_id, attempt, offset, data, node)

    def append_in(self, tx, job_id: str, attempt: int, offset: int, data: bytes, node: int = 0) -> int:
        """``append`` inside ``tx`` (a group of chunks committed together: runner/controller/group_commit.py);
        the chunk is stored once ``tx`` commits.

        Not serialized with the other writers (200 chunks a second at 2,000 nodes would queue behind every
        other write): a chunk is keyed by where it starts, so of two appends racing on one stream (a retry
        after a lost reply) the second finds its start taken (Postgres waits for the first to commit), reads
        the new end and stores only what is new."""
        for _ in range(_RACES):
            size = _size(tx.all, job_id, attempt, node)
            if offset > size:
                return size  # a gap: the agent resends from here
            new = bytes(data[size - offset:])
            if not new or tx.execute("INSERT INTO log_chunks (job_id, attempt, node, start, data) "
                                     "VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                                     (job_id, attempt, node, size, new)):
                return max(size, offset + len(data))
        raise RuntimeError(f"log stream {job_id}/{attempt}/{node}: {_RACES} appends raced this one; send it again")

    def append_many_in(self, tx: Tx, chunks: list[Chunk], sizes: dict[tuple[str, int, int], int] | None = None,
                       last: bool = False) -> list[int | Exception]:
        """``append_in`` for many chunks: the streams' sizes in one read (unless given: ``sizes``, as
        :func:`nodes_and_log_sizes` reads them), the new bytes in one multi-row INSERT, sent with a savepoint of its
        own in one round trip on Postgres (it raises, keeping nothing of the batch, where it fails); the offset to
        send next for each chunk, in order.

        A chunk whose start another controller took meanwhile (the INSERT skips it: its stream moved on), and a
        stream's second chunk in one call (a retry), are appended one by one after it, as ``append_in`` does, each
        in a savepoint of its own: one that fails (raced past its retries) is answered with its error, in the
        list, and loses only its own write.

        ``last``: nothing follows in ``tx``. Where no chunk is left to append one by one, the INSERT is then the
        transaction's last statement and goes out with its COMMIT (``Tx.all_in_savepoint_then_commit``), without
        ON CONFLICT: a start another controller took fails it before the COMMIT, and the caller stores the chunks
        one by one instead (runner/controller/log_api.py), each as ``append_in`` does."""
        if not chunks:
            return []
        if sizes is None:
            sizes = _sizes(tx, list(dict.fromkeys(chunk.stream for chunk in chunks)))
        answers: list[int | Exception | None] = [None] * len(chunks)
        rows, one_by_one, batched = [], [], set()
        for i, chunk in enumerate(chunks):
            if chunk.stream in batched:
                one_by_one.append(i)
                continue
            batched.add(chunk.stream)
            size = sizes.get(chunk.stream, 0)
            if chunk.offset > size:
                answers[i] = size  # a gap: the agent resends from here
                continue
            new = bytes(chunk.data[size - chunk.offset:])
            answers[i] = max(size, chunk.offset + len(chunk.data))
            if new:
                rows.append((i, (*chunk.stream, size, new)))
        if rows:
            then_commit = last and not one_by_one
            send = tx.all_in_savepoint_then_commit if then_commit else tx.all_in_savepoint
            stored = {(row["job_id"], int(row["attempt"]), int(row["node"]), int(row["start"]))
                      for row in send(
                          "INSERT INTO log_chunks (job_id, attempt, node, start, data) VALUES "
                          + ",".join(["(?,?,?,?,?)"] * len(rows))
                          + ("" if then_commit else " ON CONFLICT DO NOTHING")
                          + " RETURNING job_id, attempt, node, start",
                          tuple(value for _, row in rows for value in row))}
            one_by_one += [i for i, row in rows if row[:4] not in stored]
        for i in sorted(one_by_one):
            chunk = chunks[i]
            try:
                with tx.savepoint():
                    answers[i] = self.append_in(tx, chunk.job_id, chunk.attempt, chunk.offset, chunk.data, chunk.node)
            except Exception as exc:  # this chunk's own error: its savepoint undid its writes
                answers[i] = exc
        return answers  # type: ignore[return-value]

    def read(self, job_id: str, attempt: int, offset: int = 0, limit: int = 1 << 20, node: int = 0) -> bytes:
        rows = self.db.query(
            f"SELECT start, data FROM log_chunks WHERE {_STREAM} AND start < ? AND start + LENGTH(data) > ? "
            "ORDER BY start", (job_id, attempt, node, offset + limit, offset))
        if not rows:
            return b""
        joined = b"".join(bytes(row["data"]) for row in rows)
        skip = offset - rows[0]["start"]
        return joined[skip:skip + limit]


def nodes_and_log_sizes(tx: Tx, token_hashes: list[str]) -> tuple[dict[str, Node], dict[tuple[str, int, int], int]]:
    """The nodes of many tokens, by token hash (an unknown one absent), and the size of each one's stream (its
    attempt, its rank) that has output: ``Store.nodes_by_token_hashes`` and ``_sizes`` in one read."""
    nodes: dict[str, Node] = {}
    sizes: dict[tuple[str, int, int], int] = {}
    for start in range(0, len(token_hashes), 500):
        part = padded(token_hashes[start:start + 500])
        for row in tx.all(
                "SELECT n.*, (SELECT c.start + LENGTH(c.data) FROM log_chunks c WHERE c.job_id = n.job_id "
                "AND c.attempt = n.attempt AND c.node = n.rank ORDER BY c.start DESC LIMIT 1) AS log_size "
                f"FROM nodes n WHERE n.token_hash IN ({','.join('?' * len(part))})", tuple(part)):
            node = nodes[row["token_hash"]] = Node.from_row(row)
            if row["log_size"] is not None:
                sizes[(node.job_id, node.attempt, node.rank)] = int(row["log_size"])
    return nodes, sizes


def _sizes(tx: Tx, streams: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], int]:
    """The size of each stream that has output, in one read (each by the primary key's last entry)."""
    found = {}
    for start in range(0, len(streams), 300):
        part = padded(streams[start:start + 300])
        rows = tx.all(
            "SELECT s.column1 AS job_id, s.column2 AS attempt, s.column3 AS node, "
            "(SELECT c.start + LENGTH(c.data) FROM log_chunks c WHERE c.job_id = s.column1 AND c.attempt = s.column2 "
            "AND c.node = s.column3 ORDER BY c.start DESC LIMIT 1) AS size "
            f"FROM (VALUES {','.join(['(?,?,?)'] * len(part))}) AS s",
            tuple(value for stream in part for value in stream))
        found.update({(row["job_id"], int(row["attempt"]), int(row["node"])): int(row["size"])
                      for row in rows if row["size"] is not None})
    return found


def _size(run, job_id: str, attempt: int, node: int) -> int:
    rows = run(f"SELECT start + LENGTH(data) AS size FROM log_chunks WHERE {_STREAM} ORDER BY start DESC LIMIT 1",
               (job_id, attempt, node))
    return int(rows[0]["size"]) if rows else 0
