"""The fast local tier: one folder per checkpoint, files fsynced, the manifest written last and atomically.

A folder counts as committed only once ``manifest.json`` is in it. The manifest is written to a temporary
name, fsynced, moved into place with ``os.replace`` and the folder is fsynced, so a crash at any moment
leaves either no manifest or a complete one. Re-using a folder (a resumed attempt reaching the same step)
first removes its manifest, so a half-rewritten folder never looks committed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .checksum import DEFAULT_ALGORITHM, new_hasher
from .errors import CorruptCheckpointError
from .manifest import MANIFEST_NAME, Manifest, folder_name, step_of

CHUNK = 16 * 1024 * 1024


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: memoryview | bytes, algorithm: str = DEFAULT_ALGORITHM, sync: bool = True) -> str:
    """Write ``data`` to ``path`` and return its checksum (computed in the same pass); fsync unless told not
    to (a caller writing several files syncs them together afterwards, so writeback overlaps)."""
    hasher = new_hasher(algorithm)
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for start in range(0, len(view), CHUNK):
            chunk = view[start:start + CHUNK]
            hasher.update(chunk)
            while chunk:
                written = os.write(fd, chunk)
                chunk = chunk[written:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def check_size(path: Path, entry: dict) -> int:
    """The file's size, which must be the manifest entry's; a missing or resized file is corrupt."""
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path} is missing") from exc
    if size != entry["bytes"]:
        raise CorruptCheckpointError(f"{path} has {size} bytes, the manifest says {entry['bytes']}")
    return size


def read_verified(path: Path, entry: dict, algorithm: str) -> bytearray:
    """Read a whole file and check its size and checksum against the manifest entry."""
    size = check_size(path, entry)
    data = bytearray(size)
    view = memoryview(data)
    hasher = new_hasher(algorithm)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size:
            n = f.readinto(view[got:got + CHUNK])
            if not n:
                raise CorruptCheckpointError(f"{path} ended after {got} of {size} bytes")
            hasher.update(view[got:got + n])
            got += n
    if hasher.hexdigest() != entry["checksum"]:
        raise CorruptCheckpointError(f"{path} fails its {algorithm} checksum")
    return data


class LocalTier:
    """Checkpoint folders under one root directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().absolute()

    def __repr__(self) -> str:
        return f"LocalTier({str(self.root)!r})"

    def folder(self, step: int) -> Path:
        return self.root / folder_name(step)

    def begin(self, step: int) -> Path:
        """Make an empty folder for ``step``, uncommitting and clearing any earlier one of that name."""
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.folder(step)
        if folder.exists():
            self.uncommit(folder)
            shutil.rmtree(folder)
        folder.mkdir()
        return folder

    def commit(self, folder: Path, manifest: Manifest) -> Path:
        """Write the manifest last and atomically; the checkpoint is committed when this returns."""
        fsync_dir(folder)
        tmp = folder / (MANIFEST_NAME + ".tmp")
        write_file(tmp, manifest.to_json())
        final = folder / MANIFEST_NAME
        os.replace(tmp, final)
        fsync_dir(folder)
        return final

    def uncommit(self, folder: Path) -> None:
        try:
            (folder / MANIFEST_NAME).unlink()
            fsync_dir(folder)
        except FileNotFoundError:
            pass

    def discard(self, folder: Path) -> None:
        """Remove a folder that failed to commit; best effort (the disk may be full or gone)."""
        try:
            self.uncommit(folder)
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass

    def folders(self) -> list[tuple[int, Path]]:
        """Every checkpoint folder, committed or not, newest step first."""
        try:
            entries = list(self.root.iterdir())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        found = [(step_of(p.name), p) for p in entries if p.is_dir()]
        return sorted(((s, p) for s, p in found if s is not None), reverse=True)

    def committed(self) -> list[tuple[int, Path]]:
        """Folders that hold a manifest, newest step first (their checksums are checked at restore)."""
        return [(s, p) for s, p in self.folders() if (p / MANIFEST_NAME).is_file()]

    def read_manifest(self, folder: Path) -> Manifest:
        path = folder / MANIFEST_NAME
        try:
            return Manifest.from_json(path.read_bytes(), str(path))
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{path} is missing") from exc

    def prune(self, keep: int, protect: frozenset[int] = frozenset()) -> list[Path]:
        """Keep the ``keep`` newest committed folders and every step in ``protect`` (retention.py); drop older
        ones and uncommitted leftovers older than the newest committed one. The newest committed folder is
        never removed."""
        committed = self.committed()
        if not committed:
            return []
        keep_steps = {s for s, _ in committed[:max(keep, 1)]} | set(protect)
        newest = committed[0][0]
        removed = []
        for step, folder in self.folders():
            if step in keep_steps or step >= newest:
                continue
            self.discard(folder)
            removed.append(folder)
        return removed
