"""An emergency checkpoint of a process group, uploaded file by file as its local write closes each file.

A process group's checkpoint (DCP files, one share per rank) is committed on the local tier before the
uploader takes it: for a periodic checkpoint that order costs nothing, but a stop's checkpoint is what the next
attempt waits for, and it reached the durable tier only after the whole local write, its checksums and the
local commit (a gang's pause, measured: 2.3 s of its 6.2 s to durable). So for an emergency (and for the timing
checkpoint that predicts one) each rank writes its files one after another, and an :class:`EarlyUpload` puts each
on the durable tier as soon as the local write has closed (and synced) it, while the next one is written. The
uploader then sends only what is left (rank 0's ``.metadata``, written last) and commits as always: the
manifest, with the checksums of the local commit, written by rank 0 once every rank's files are up. A reader
following the upload (a replacement's prefetch) gets each file as it lands.

The step's old manifest is removed before any file of it is replaced (the writer's fence, in persist.py), and a
superseded attempt starts no early upload. The threads are started from the training's thread, at its priority:
the training waits for an emergency's upload, and the writer thread they serve runs niced; the local write
itself runs at that priority too (:class:`TrainingPriority`).
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from .durable import DurableTier, UploadAbandoned
from .log import get_logger

log = get_logger()

EARLY_STREAMS = 4  # files in flight at once, for a store that does not say how many streams pay


class TrainingPriority:
    """One call made for another thread on a thread started here, from the training's thread, so at its
    priority: an emergency's local write is on the path of its early upload, and the writer thread that asks for
    it runs niced (a niced thread cannot raise its priority again); beside a loaded node's other processes it got
    a tenth of a core, and a gang's stop missed its deadline."""

    def __init__(self) -> None:
        self._call: queue.SimpleQueue = queue.SimpleQueue()
        self._result: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="runner-checkpoint-early-write", daemon=True)
        self._thread.start()

    def run(self, fn, *args):
        """``fn(*args)`` on this thread; its result, or its exception raised here."""
        self._call.put((fn, args))
        ok, value = self._result.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._call.put(None)

    def _serve(self) -> None:
        while (call := self._call.get()) is not None:
            fn, args = call
            try:
                self._result.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised in its thread
                self._result.put((False, exc))


class EarlyUpload:
    """Puts the files handed to :meth:`file_closed` under ``step`` of ``durable``, in the order given."""

    def __init__(self, durable: DurableTier, step: int, abandoned: threading.Event) -> None:
        self.durable, self.step, self.abandoned = durable, step, abandoned
        self._files: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._sent: list[str] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        streams = getattr(durable.fs, "upload_streams", None) or EARLY_STREAMS
        self._threads = [threading.Thread(target=self._run, name=f"runner-checkpoint-upload-early-{n}", daemon=True)
                         for n in range(streams)]
        for thread in self._threads:
            thread.start()
        self.priority = TrainingPriority()  # the local write this upload follows

    def file_closed(self, path: Path) -> None:
        """The local write closed ``path`` (a DCP writer's thread calls this): send it."""
        self._files.put(Path(path))

    def close(self) -> None:
        """No more files come; the threads end once the files handed over are sent (or skipped: an error, or
        ``abandoned``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.priority.close()
        for _ in self._threads:
            self._files.put(None)

    def finish(self) -> set[str]:
        """Close, wait until every file handed over is sent, and return their names; raise the first error (or
        UploadAbandoned once the upload was given up)."""
        self.close()
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error
        if self.abandoned.is_set():
            raise UploadAbandoned(f"{self.durable.location(self.step)}: upload abandoned")
        return set(self._sent)

    def active(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _run(self) -> None:
        while (path := self._files.get()) is not None:
            if self._error is not None or self.abandoned.is_set():
                continue  # drained: the uploader reports the error
            try:
                self.durable.put_file(self.step, path)
            except Exception as exc:  # noqa: BLE001 - reported by finish(), to the uploader
                with self._lock:
                    self._error = self._error or exc
                log.warning("uploading a file of the emergency checkpoint as it was written failed", step=self.step,
                            file=path.name, error=self.durable.describe(exc))
            else:
                with self._lock:
                    self._sent.append(path.name)
