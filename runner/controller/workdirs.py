"""Uploaded workdir archives as files under the data dir (a controller on SQLite; on Postgres they are
kept in the database: runner/state/workdirs.py). Addressed by sha256, written once, mode 0600."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Iterator


class FileWorkdirs:
    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}.tar.gz"

    def has(self, digest: str) -> bool:
        return self._path(digest).exists()

    def put(self, digest: str, data: bytes) -> None:
        target = self._path(digest)
        if target.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # a job's code may hold secrets too
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        tmp.replace(target)

    def stream(self, digest: str) -> Iterator[bytes]:
        with open(self._path(digest), "rb") as handle:
            while chunk := handle.read(1 << 20):
                yield chunk
