"""Packing a job's workdir for the controller."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

EXCLUDED = {".git", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", "checkpoints"}
MAX_BYTES = 256 << 20


class WorkdirTooLarge(Exception):
    pass


def pack_workdir(folder: Path) -> bytes:
    """A gzipped tarball of ``folder`` without VCS data, caches, virtualenvs and local checkpoints."""

    def keep(info: tarfile.TarInfo):
        parts = Path(info.name).parts
        return None if any(p in EXCLUDED for p in parts) or info.name.endswith(".pyc") else info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        tar.add(folder, arcname=".", filter=keep)
    data = buffer.getvalue()
    if len(data) > MAX_BYTES:
        raise WorkdirTooLarge(f"workdir {folder} packs to {len(data) >> 20} MiB, over the 256 MiB limit; "
                              "move data sets out of it (read them from the durable URL instead)")
    return data
