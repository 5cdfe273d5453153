"""Phase two of a save, in a background thread: write and commit on the local tier, then upload.

A thread rather than a process: the work is ``os.write``, ``fsync``, xxh3 and network I/O, all of which
release the GIL, and a thread reads the staged buffer in place where a process would need it in shared
memory (see docs/checkpointing.md for the measurement). Jobs run one at a time in order. The staged
buffer is handed back (``buffer_free``) as soon as the local files are written, so the next ``save`` can
stage while the previous checkpoint is still uploading.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .checksum import DEFAULT_ALGORITHM
from .durable import DurableTier
from .local import LocalTier, fsync_file, write_file
from .log import get_logger
from .manifest import STATE_NAME, Manifest
from .staging import Staged

log = get_logger()

PERSIST_NICENESS = 10


@dataclass
class SaveJob:
    step: int
    staged: Staged
    emergency: bool
    attempt: int | None
    job_id: str | None
    started: float = field(default_factory=time.monotonic)
    local_done: threading.Event = field(default_factory=threading.Event)
    durable_done: threading.Event = field(default_factory=threading.Event)
    local_manifest: Path | None = None
    durable_manifest: str | None = None
    manifest: Manifest | None = None
    error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self.durable_done.is_set()


class Persister:
    """Runs SaveJobs in order on one daemon thread; reports through ``on_local`` and ``on_durable``."""

    def __init__(self, local: LocalTier, durable: DurableTier | None, keep: int, on_local, on_durable) -> None:
        self.local, self.durable, self.keep = local, durable, keep
        self._on_local, self._on_durable = on_local, on_durable
        self.buffer_free = threading.Event()
        self.buffer_free.set()
        self._queue: queue.Queue[SaveJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="runner-checkpoint-persist", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> None:
        self.buffer_free.clear()
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        try:  # on Linux a thread has its own nice value: let the training thread win the CPU
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PERSIST_NICENESS)
        except (AttributeError, OSError):
            pass
        while (job := self._queue.get()) is not None:
            try:
                self._write_local(job)
            finally:
                job.staged = None  # the parts are views of the reused buffer: never touch them again
                self.buffer_free.set()
                job.local_done.set()
            try:
                if job.error is None and self.durable is not None:
                    self._upload(job)
            finally:
                job.durable_done.set()

    def _write_local(self, job: SaveJob) -> None:
        folder = None
        try:
            folder = self.local.begin(job.step)
            files = []
            for index, part in enumerate(job.staged.parts):
                name = f"data-{index:05d}.bin"
                files.append({"name": name, "bytes": len(part),
                              "checksum": write_file(folder / name, part, sync=False)})
            files.append({"name": STATE_NAME, "bytes": len(job.staged.skeleton),
                          "checksum": write_file(folder / STATE_NAME, job.staged.skeleton, sync=False)})
            for entry in files:  # every file is on disk before the manifest is written
                fsync_file(folder / entry["name"])
            job.manifest = Manifest(job.step, files, DEFAULT_ALGORITHM, job.attempt, job.job_id, job.emergency)
            job.local_manifest = self.local.commit(folder, job.manifest)
        except Exception as exc:  # noqa: BLE001 - a full or unwritable disk must not stop the training
            job.error = exc
            log.warning("checkpoint not saved; the previous checkpoint is kept and training goes on",
                        step=job.step, path=str(getattr(exc, "filename", None) or folder or self.local.root),
                        error=f"{type(exc).__name__}: {exc}")
            if folder is not None:
                self.local.discard(folder)
            return
        self._safely(self._on_local, job)
        self._safely(self.local.prune, self.keep)

    def _upload(self, job: SaveJob) -> None:
        try:
            job.durable_manifest = self.durable.upload(job.local_manifest.parent, job.manifest)
        except Exception as exc:  # noqa: BLE001 - an unreachable store must not stop the training
            job.error = exc
            log.warning("checkpoint not uploaded; it is kept on the local tier only",
                        step=job.step, url=self.durable.location(job.step), error=f"{type(exc).__name__}: {exc}")
            return
        self._safely(self._on_durable, job)
        self._safely(self.durable.prune, self.keep)

    @staticmethod
    def _safely(fn, arg) -> None:
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001 - reporting and pruning are best effort
            log.warning("checkpoint housekeeping failed", action=getattr(fn, "__name__", str(fn)),
                        error=f"{type(exc).__name__}: {exc}")
