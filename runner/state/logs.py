"""Job output kept in the database, for controllers that share one (with SQLite it stays in files:
runner/controller/logstore.py). The same interface and offsets: an agent sends each chunk with the offset it
starts at; a chunk already received is not stored twice, and a gap is refused so the agent resends from the end.

Each stored chunk is a row keyed by (job, attempt, node rank, start offset); the chunks of one stream are
contiguous, so its size is the end of its last chunk.
"""

from __future__ import annotations

from .db import Database

_STREAM = "job_id = ? AND attempt = ? AND node = ?"
_RACES = 5  # an agent sends one chunk at a time: more than one racing append is a retry at most


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

    def read(self, job_id: str, attempt: int, offset: int = 0, limit: int = 1 << 20, node: int = 0) -> bytes:
        rows = self.db.query(
            f"SELECT start, data FROM log_chunks WHERE {_STREAM} AND start < ? AND start + LENGTH(data) > ? "
            "ORDER BY start", (job_id, attempt, node, offset + limit, offset))
        if not rows:
            return b""
        joined = b"".join(bytes(row["data"]) for row in rows)
        skip = offset - rows[0]["start"]
        return joined[skip:skip + limit]


def _size(run, job_id: str, attempt: int, node: int) -> int:
    rows = run(f"SELECT start + LENGTH(data) AS size FROM log_chunks WHERE {_STREAM} ORDER BY start DESC LIMIT 1",
               (job_id, attempt, node))
    return int(rows[0]["size"]) if rows else 0
