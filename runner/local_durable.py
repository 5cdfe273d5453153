"""``local-durable://``: the local market's durable tier, a folder of this machine as slow as a bucket.

A cloud node reaches its bucket at a few hundred MB/s; a local node's "bucket" is the same disk as its local
tier, so a checkpoint's upload and a restore's download would cost nothing. This fsspec filesystem is the
local filesystem, with its transfers held to a bandwidth per node and per direction (writes up, reads down)
when the node's processes are given one (``clouds.local.durable_mb_per_s``, passed on by the local provider
in :data:`RATE_VARIABLE` and :data:`BUCKET_VARIABLE`). Without them it is the plain local filesystem, so the
same URL opens anywhere (the controller, a user's shell).

Every process of a node shares its node's budget: each transfer reserves its bytes in a file-locked
reservation per direction (a leaky bucket with no burst), then sleeps until the reservation ends, so N MB take
no less than N / rate seconds whatever the number of threads or processes moving them. A transfer under way
may make up a quarter of a second it lost between its chunks (an oversleep, a slow write), so on a busy machine
it takes not much more either. MB is 10**6 bytes.

Like an object store, a file written here becomes visible under its name only once complete (it is written
under a hidden temporary name, ``.NAME.part-…``, and renamed), so a reader following a checkpoint as it is
uploaded (agents/prefetch.py) never copies half a file. With a bandwidth, an upload moves one file at a time
(:attr:`LocalDurableFileSystem.upload_streams`): the node's budget is shared by every stream, so parallel
streams would only make each file complete later.

Only the standard library and fsspec: the checkpoint library imports this.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
import time
from pathlib import Path

from fsspec import register_implementation
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

PROTOCOL = "local-durable"
RATE_VARIABLE = "LOCAL_DURABLE_MB_PER_S"  # the node's bandwidth per direction; unset or empty: unlimited
BUCKET_VARIABLE = "LOCAL_DURABLE_BUCKET_DIR"  # where the node's processes keep their shared reservations
CHUNK = 1 << 20  # bytes reserved and moved at a time
# What a transfer under way may make up of the time it lost between its chunks. Without it, each chunk's
# oversleep and write were lost for good: on a machine at load 9, 1 GB at 200 MB/s took 17 s, not 5.
CATCH_UP_SECONDS = 0.25
UP, DOWN = "up", "down"
PART_MARK = ".part-"  # a file being written: ``.NAME.part-PID-N`` beside its final name
_part_numbers = itertools.count()


def partial_name(path: str) -> str:
    """The hidden name a file is written under until it is complete."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}{PART_MARK}{os.getpid()}-{next(_part_numbers)}")


def is_partial(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return base.startswith(".") and PART_MARK in base


def throttle_environment(mb_per_s: float, bucket_dir: Path) -> dict[str, str]:
    """The variables that give a node's processes ``mb_per_s`` of durable bandwidth per direction."""
    bucket_dir.mkdir(parents=True, exist_ok=True)
    return {RATE_VARIABLE: repr(float(mb_per_s)), BUCKET_VARIABLE: str(bucket_dir)}


class Bandwidth:
    """One direction's budget: :meth:`take` blocks until ``nbytes`` fit in it."""

    _local_lock = threading.Lock()
    _local_next: dict[str, float] = {}  # without a bucket dir: this process's reservations, by direction

    def __init__(self, bytes_per_second: float, direction: str, bucket_dir: str | None):
        self.bytes_per_second = bytes_per_second
        self.direction = direction
        self.path = os.path.join(bucket_dir, direction) if bucket_dir else None

    def take(self, nbytes: int, catch_up: float = 0.0) -> None:
        """Block until ``nbytes`` fit. ``catch_up``: a transfer already under way may make up this many seconds
        it lost (a sleep that overslept, a slow write between chunks), never reserving before its own last
        chunk's end; so N MB still take at least N / rate, and on a busy machine not much more."""
        if nbytes <= 0:
            return
        now = time.monotonic()  # one clock for every process of the machine
        cost = nbytes / self.bytes_per_second
        if self.path is None:
            with self._local_lock:
                end = max(now - catch_up, self._local_next.get(self.direction, 0.0)) + cost
                self._local_next[self.direction] = end
        else:
            end = self._reserve_shared(now - catch_up, cost)
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _reserve_shared(self, now: float, cost: float) -> float:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            try:
                booked = float(text) if text else 0.0
            except ValueError:
                booked = 0.0
            end = max(now, booked) + cost
            os.ftruncate(fd, 0)
            os.pwrite(fd, repr(end).encode(), 0)
            return end
        finally:
            os.close(fd)  # releases the lock


def node_bandwidth(direction: str, mb_per_s: float | None = None) -> Bandwidth | None:
    """This node's budget for ``direction`` (``mb_per_s``, else the node's variable), None when unlimited."""
    if mb_per_s is None:
        raw = os.environ.get(RATE_VARIABLE, "").strip()
        if not raw:
            return None
        try:
            mb_per_s = float(raw)
        except ValueError:
            raise ValueError(f"{RATE_VARIABLE}={raw!r} is not a number of MB/s") from None
    if not mb_per_s > 0:
        raise ValueError(f"{PROTOCOL}: mb_per_s must be a positive number, not {mb_per_s!r}")
    return Bandwidth(mb_per_s * 1e6, direction, os.environ.get(BUCKET_VARIABLE) or None)


class _ThrottledFile(LocalFileOpener):
    """A local file whose reads take from the download budget and whose writes take from the upload one."""

    def __init__(self, path, mode, up: Bandwidth | None, down: Bandwidth | None, **kwargs):
        self._up, self._down = up, down
        self._catch_up = 0.0  # the first read or write waits its full share; later ones may make up lost time
        super().__init__(path, mode, **kwargs)

    def _take(self, bandwidth: Bandwidth | None, nbytes: int) -> None:
        if bandwidth is not None and nbytes:
            bandwidth.take(nbytes, self._catch_up)
            self._catch_up = CATCH_UP_SECONDS

    def read(self, *args, **kwargs):
        data = super().read(*args, **kwargs)
        self._take(self._down, len(data))
        return data

    def readinto(self, buffer):
        count = self.f.readinto(buffer)
        self._take(self._down, count)
        return count

    def write(self, data, *args, **kwargs):
        self._take(self._up, len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes)
        return super().write(data, *args, **kwargs)

    def close(self):
        final = self.__dict__.pop("_final", None)
        super().close()
        if final is not None:
            os.replace(self.path, final)  # complete: visible under its name
            self.path = final

    def __exit__(self, exc_type, exc_value, traceback):
        super().__exit__(exc_type, exc_value, traceback)
        final = self.__dict__.pop("_final", None)
        if final is None:
            return
        if exc_type is None:
            os.replace(self.path, final)
            self.path = final
        else:  # a failed write leaves nothing under the name
            try:
                os.unlink(self.path)
            except OSError:
                pass


class LocalDurableFileSystem(LocalFileSystem):
    """The local filesystem under ``local-durable://``, at the node's durable bandwidth (see the module)."""

    protocol = (PROTOCOL,)
    cachable = False  # the budget is read from the environment at construction: never hand out a stale one

    def __init__(self, mb_per_s: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.up = node_bandwidth(UP, mb_per_s)
        self.down = node_bandwidth(DOWN, mb_per_s)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for prefix in (PROTOCOL + "://", PROTOCOL + ":"):
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        return LocalFileSystem._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        return f"{PROTOCOL}://{self._strip_protocol(name)}"

    @property
    def upload_streams(self) -> int | None:
        """How many files an upload should move at once: one under a bandwidth (see the module), else None."""
        return 1 if self.up is not None else None

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        if self.auto_mkdir and ("w" in mode or "x" in mode or "a" in mode):
            self.makedirs(self._parent(path), exist_ok=True)
        if "w" in mode and "+" not in mode:  # complete, or not there at all
            opened = _ThrottledFile(partial_name(path), mode, self.up, self.down, fs=self, **kwargs)
            opened._final = path
            return opened
        return _ThrottledFile(path, mode, self.up, self.down, fs=self, **kwargs)

    def put_file(self, path1, path2, callback=None, **kwargs):
        """Upload a file of the node (not a path of this filesystem) at the upload bandwidth."""
        if self.up is None:
            return super().put_file(path1, path2, callback=callback, **kwargs)
        target = self._strip_protocol(path2)
        if self.auto_mkdir:
            self.makedirs(self._parent(target), exist_ok=True)
        partial = partial_name(target)
        try:
            with open(path1, "rb") as source, open(partial, "wb") as sink:
                _copy(source, sink, self.up)
            os.replace(partial, target)
        except BaseException:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise

    def get_file(self, path1, path2, callback=None, **kwargs):
        """Download to a file of the node (or a file object) at the download bandwidth."""
        if self.down is None:
            return super().get_file(path1, path2, callback=callback, **kwargs)
        source_path = self._strip_protocol(path1)
        if not os.path.isfile(source_path):
            if os.path.isdir(source_path):
                return os.makedirs(path2, exist_ok=True)
            raise FileNotFoundError(source_path)
        with open(source_path, "rb") as source:
            if hasattr(path2, "write"):
                _copy(source, path2, self.down)
            else:
                with open(path2, "wb") as sink:
                    _copy(source, sink, self.down)


def _copy(source, sink, bandwidth: Bandwidth) -> None:
    catch_up = 0.0  # the first chunk waits its full share: a new transfer gets no burst
    while chunk := source.read(CHUNK):
        bandwidth.take(len(chunk), catch_up)
        sink.write(chunk)
        catch_up = CATCH_UP_SECONDS


def register() -> None:
    """Make ``local-durable://`` known to fsspec in this process (the package's entry point does it too)."""
    register_implementation(PROTOCOL, LocalDurableFileSystem, clobber=True)


register()

__all__ = ["LocalDurableFileSystem", "PROTOCOL", "register", "throttle_environment"]
