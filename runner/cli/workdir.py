"""Packing a job's workdir for the controller: streamed to a temporary file, refused as soon as it is too big."""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..source import SOURCE_FILE, source_record
from ..spec import SpecError
from ..spec.workdir import shipped

MAX_BYTES = 256 << 20


class WorkdirTooLarge(SpecError):
    """The packed workdir passes the controller's limit (bad input: exit 2)."""


class _Capped:
    """A write-only file that raises WorkdirTooLarge once more than ``limit`` bytes were written to it."""

    def __init__(self, out: BinaryIO, limit: int, folder: Path):
        self.out, self.limit, self.folder, self.written = out, limit, folder, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise WorkdirTooLarge(str(self.folder), [
                f"workdir: packs to more than {self.limit >> 20} MiB, the limit; move data sets out of it (read "
                "them from the durable URL instead), or add them to .git, .venv or checkpoints/, which are not sent"])
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def pack_workdir(folder: Path) -> BinaryIO:
    """A gzipped tarball of ``folder`` without VCS data, caches, virtualenvs and local checkpoints, in a temporary
    file rewound for reading; packing stops with WorkdirTooLarge as soon as it passes MAX_BYTES. A git
    repository's commit and dirtiness go with it as SOURCE_FILE, for the run manifest (runner/source.py)."""

    def keep(info: tarfile.TarInfo):
        return info if shipped(info.name) else None

    out = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=_Capped(out, MAX_BYTES, folder), mode="w:gz",
                          compresslevel=6) as tar:
            tar.add(folder, arcname=".", filter=keep)
            if (record := source_record(folder)) is not None:
                info = tarfile.TarInfo(f"./{SOURCE_FILE}")
                info.size, info.mode = len(record), 0o644  # mtime 0: the same source packs the same
                tar.addfile(info, io.BytesIO(record))
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return out
