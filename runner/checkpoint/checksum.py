"""Fast file checksums: xxh3-64 when ``xxhash`` is installed, else zlib's crc32. The manifest names the one used."""

from __future__ import annotations

import zlib

try:
    import xxhash
except ImportError:  # pragma: no cover - depends on the environment
    xxhash = None

from .errors import CorruptCheckpointError

DEFAULT_ALGORITHM = "xxh3_64" if xxhash is not None else "crc32"


class _Crc32:
    def __init__(self) -> None:
        self._value = 0

    def update(self, data) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value & 0xFFFFFFFF:08x}"


def new_hasher(algorithm: str = DEFAULT_ALGORITHM):
    """Return an object with ``update(bytes)`` and ``hexdigest()`` for the named algorithm."""
    if algorithm == "crc32":
        return _Crc32()
    if algorithm == "xxh3_64":
        if xxhash is None:
            raise CorruptCheckpointError("this checkpoint uses xxh3_64 checksums: pip install xxhash to verify it")
        return xxhash.xxh3_64()
    raise CorruptCheckpointError(f"unknown checksum algorithm {algorithm!r} in the manifest")


def digest(data, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Checksum of one buffer."""
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def file_digest(path, algorithm: str = DEFAULT_ALGORITHM, chunk: int = 16 * 1024 * 1024) -> str:
    """Checksum of a file, read in chunks into one reused buffer."""
    hasher = new_hasher(algorithm)
    view = memoryview(bytearray(chunk))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            hasher.update(view[:n])
    return hasher.hexdigest()
