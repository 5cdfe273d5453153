"""Phase two of a save, in the background: commit on the local tier, then upload to the durable one.

Two threads, so that the durable tier can never hold up the training or the local tier:

* the **writer** writes each staged checkpoint into its local folder (its files fsynced, the manifest
  with every file's checksum written last), then hands the staged buffer back (``buffer_free``) so the
  next ``save`` can stage at once;
* the **uploader** takes the newest locally committed checkpoint (older ones still waiting are
  superseded), uploads its files in parallel, then the manifest. An upload gets a deadline, and one in
  flight is abandoned when an emergency checkpoint is waiting, so a notice is served from the local copy
  within its deadline whatever the store is doing.

An **emergency** checkpoint of one process does not wait for the local tier: its upload starts from the
staged buffer as soon as the state is staged, beside the local write (``_upload_from_buffer``). The time to
durable is what a short notice allows, and the local disk (its write and fsync) is then out of that path.
That upload runs at the training thread's priority (the training waits for it; the local write beside it
is the one to yield), and a notice's *timing* checkpoint takes the same path, so that its time predicts
the emergency's (agents/train_through.py). An upload abandoned for it stops at its next file, so that it
does not share the node's bandwidth with the emergency's.
It is as atomic as any upload (the manifest, with every file's checksum taken from the bytes as they are
sent, written last, so a crash mid-way leaves the previous checkpoint the newest) and is fenced the same way; the buffer
is handed back to staging once both the local write and the upload have read it.

Under torch.distributed both threads are collective (``Ranks.writer`` / ``Ranks.uploader``): the local
folder is committed once every rank's share is on disk, and the durable manifest is written by rank 0
only after every rank's files have landed. An emergency's files (and a timing checkpoint's) go up one by one
as the local write closes them (early_upload.py), and the uploader sends only what is left. When the local
disk fails (full, gone) on one process, the staged bytes go straight to the durable tier, so the bucket keeps
getting checkpoints.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from .checksum import DEFAULT_ALGORITHM, digest
from .daemon_pool import DaemonPool
from .durable import DurableTier
from .early_upload import EarlyUpload
from .errors import SupersededError
from .local import LocalTier, fsync_file, write_file
from .log import get_logger
from .manifest import DCP, FLAT, MANIFEST_NAME, STATE_NAME, Manifest
from .retention import Retention

log = get_logger()

PERSIST_NICENESS = 10
UPLOAD_TIMEOUT_FLOOR_S = 120.0  # an upload may take this long, or 4x the last good one, before it is abandoned
UPLOAD_TIMEOUT_FACTOR = 4.0


@dataclass
class SaveJob:
    step: int
    staged: object  # staging.Staged (one process) or a staged DCP state dict
    emergency: bool
    attempt: int | None
    job_id: str | None
    seq: int = 0
    started: float = field(default_factory=time.monotonic)
    local_done: threading.Event = field(default_factory=threading.Event)
    durable_done: threading.Event = field(default_factory=threading.Event)
    local_manifest: Path | None = None
    durable_manifest: str | None = None
    manifest: Manifest | None = None
    own_files: list[str] = field(default_factory=list)  # names this process wrote (it uploads those)
    in_memory: dict[str, bytes] | None = None  # the files, when the local tier could not take them
    error: BaseException | None = None
    durable_error: BaseException | None = None
    superseded: bool = False
    format: object = None  # overrides the Persister's format (a framework's folder: folder_format.py)
    payload: dict | None = None  # the manifest's payload (who wrote a folder checkpoint)
    upload_from_buffer: bool = False  # a timing checkpoint: uploaded as an emergency one is (``emergency`` is too)
    from_buffer: bool = False  # uploaded straight from the staged buffer, beside the local write
    replicated: bool = False  # every rank holds the whole state: each rank's restore reads every file
    readers: object = None  # _BufferReaders: the local write and that upload, both reading the staged buffer
    early: EarlyUpload | None = None  # a process group's emergency: its files sent as the local write closes them
    abandoned: threading.Event = field(default_factory=threading.Event)  # its upload was given up: stop sending
    staged_at: float | None = None  # monotonic: the state was staged and handed to the persister

    @property
    def staged_seconds(self) -> float | None:
        return None if self.staged_at is None else round(self.staged_at - self.started, 4)

    @property
    def finished(self) -> bool:
        return self.durable_done.is_set()


class FlatFormat:
    """One process: the staged buffer's parts and the pickled skeleton, one file each (staging.py)."""

    layout = FLAT

    def write(self, job: SaveJob, folder: Path) -> list[dict]:
        files = []
        for name, data in self.files(job):
            files.append({"name": name, "bytes": len(data), "checksum": write_file(folder / name, data, sync=False)})
        for entry in files:  # every file is on disk before the manifest is written
            fsync_file(folder / entry["name"])
        return files

    @staticmethod
    def files(job: SaveJob):
        for index, part in enumerate(job.staged.parts):
            yield f"data-{index:05d}.bin", part
        yield STATE_NAME, job.staged.skeleton

    def nbytes(self, job: SaveJob) -> int:
        return job.staged.nbytes


class DcpFormat:
    """A process group: torch.distributed.checkpoint files (dcp_format.py)."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.layout = DCP

    def write(self, job: SaveJob, folder: Path) -> list[dict]:
        from . import dcp_format

        return dcp_format.write(job.staged, folder, self.comm,
                                on_closed=job.early.file_closed if job.early is not None else None)

    def nbytes(self, job: SaveJob) -> int:
        return 0  # unknown before DCP plans it; the last checkpoint's size stands in


class Persister:
    """Runs SaveJobs through the writer and the uploader; reports through the callbacks."""

    def __init__(self, local: LocalTier, durable: DurableTier | None, keep: int, on_local, on_durable,
                 *, on_failed=None, writer=None, uploader=None, fmt=None, folder_leader: bool = True,
                 retention: Retention | None = None) -> None:
        from .group import Solo

        self.local, self.durable, self.keep = local, durable, keep
        self.retention = retention or Retention(None, None)
        self._superseded_by: int | None = None  # the newer attempt that has started (it only ever grows)
        self._on_local, self._on_durable = on_local, on_durable
        self._on_failed = on_failed or (lambda job, tier, error: None)
        self.writer = writer or Solo()
        self.uploader = uploader or Solo()
        self.format = fmt or FlatFormat()
        self.folder_leader = folder_leader
        self.buffer_free = threading.Event()
        self.buffer_free.set()
        self.upload_timeout_s = UPLOAD_TIMEOUT_FLOOR_S
        self._last_bytes = 0
        self._queue: queue.Queue[SaveJob | None] = queue.Queue()
        self._pending: list[SaveJob] = []  # locally done, waiting for the uploader, oldest first
        self._uploading: int | None = None  # the step whose local folder the uploader is reading now
        self._pending_cond = threading.Condition()
        self._stopping = False
        self._from_buffer: list[threading.Thread] = []  # emergency uploads from the staged buffer
        self._early: list[EarlyUpload] = []  # process groups' emergency uploads, file by file as written
        self._writer = threading.Thread(target=self._write_loop, name="runner-checkpoint-write", daemon=True)
        self._writer.start()
        self._uploader = None
        if durable is not None:
            self._uploader = threading.Thread(target=self._upload_loop, name="runner-checkpoint-upload", daemon=True)
            self._uploader.start()

    def submit(self, job: SaveJob) -> None:
        job.staged_at = time.monotonic()
        self.buffer_free.clear()
        # Started from the caller's thread (the training's), not from the writer's: a thread inherits its
        # creator's priority, and the writer runs niced (see the module).
        job.readers = self._start_upload_from_buffer(job)
        if self._uploads_early(job):
            job.early = EarlyUpload(self.durable, job.step, job.abandoned)
        self._queue.put(job)

    def buffer_held_by_upload(self) -> bool:
        """Is the staged buffer still read by an upload from it (an emergency's or a timing checkpoint's)? A
        save now would wait for that upload's end."""
        return not self.buffer_free.is_set() and any(t.is_alive() for t in self._from_buffer)

    def stop(self, timeout: float = 10.0) -> None:
        """Let the writer and the uploader finish what they hold and end; wait for them (``timeout`` in all), so
        that no thread of ours is inside a collective when the process goes on to leave its process group."""
        self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in (self._writer, self._uploader, *self._from_buffer):
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def threads_ended(self) -> bool:
        """Has every thread of ours that issues collectives ended (after ``stop``)?"""
        return not any(thread is not None and thread.is_alive()
                       for thread in (self._writer, self._uploader, *self._from_buffer))

    # ------------------------------------------------------------------ the writer

    def _write_loop(self) -> None:
        _lower_priority()
        while (job := self._queue.get()) is not None:
            readers, job.readers = job.readers, None
            try:
                self._write_local(job)
            finally:
                if readers is not None:
                    readers.done()
                else:
                    job.staged = None  # views of the reused buffer: never touch them again
                    self.buffer_free.set()
                job.local_done.set()
            if job.from_buffer:
                continue  # its upload is under way already
            if self.durable is None or (job.error is not None and job.in_memory is None):
                job.durable_done.set()
            else:
                with self._pending_cond:
                    self._pending.append(job)
                    self._pending_cond.notify_all()
        with self._pending_cond:
            self._stopping = True
            self._pending_cond.notify_all()

    def _write_local(self, job: SaveJob) -> None:
        folder = self.local.folder(job.step)
        fmt = job.format or self.format
        if job.early is not None:
            self._open_early_upload(job)
        own, error = None, None
        try:
            if self.folder_leader:
                self._make_room(job, fmt)
                self.local.begin(job.step)
        except Exception as exc:  # noqa: BLE001 - a full or unwritable disk must not stop the training
            error = exc
        if self.writer.all_true(error is None):
            try:
                own = fmt.write(job, folder) if job.early is None else job.early.priority.run(fmt.write, job, folder)
            except Exception as exc:  # noqa: BLE001
                error = exc
        everyone = self.writer.gather(own)
        if error is None and any(files is None for files in everyone):
            failed = [rank for rank, files in enumerate(everyone) if files is None]
            error = OSError(f"rank(s) {failed} could not write their share of the checkpoint")
        if error is None:
            files = [entry for share in everyone for entry in share]
            job.own_files = [entry["name"] for entry in own]
            job.manifest = Manifest(job.step, files, DEFAULT_ALGORITHM, job.attempt, job.job_id, job.emergency,
                                    layout=fmt.layout, world_size=self.writer.world_size, payload=job.payload)
            try:
                if self.folder_leader:
                    self.local.commit(folder, job.manifest)
            except Exception as exc:  # noqa: BLE001
                error = exc
            if not self.writer.all_true(error is None) and error is None:
                error = OSError("another rank could not commit its local folder")
        if error is not None:
            self._local_failed(job, folder, error)
            return
        job.local_manifest = folder / MANIFEST_NAME
        self._last_bytes = job.manifest.bytes
        if self.writer.rank == 0 or self.folder_leader:  # every node's agent times its commits (Committed)
            self._safely(self._on_local, job)
        if self.folder_leader:
            self._safely(self._prune_local, job)

    def _local_failed(self, job: SaveJob, folder: Path, error: BaseException) -> None:
        job.error = error
        if job.early is not None:  # what it sent stays uncommitted: no manifest is written for this job
            job.abandoned.set()
            job.early.close()
        if self.folder_leader:
            self.local.discard(folder)
        fallback = (self.durable is not None and (job.format or self.format).layout == FLAT and job.staged is not None
                    and not job.from_buffer)
        log.warning("checkpoint not saved on the local tier" + ("; sending it to the durable tier directly"
                    if fallback else "; the previous checkpoint is kept and training goes on"),
                    step=job.step, path=str(getattr(error, "filename", None) or folder),
                    error=f"{type(error).__name__}: {error}")
        if self.writer.rank == 0:
            self._safely(lambda j: self._on_failed(j, "local", error), job)
        if fallback:  # copy out of the reused buffer, so staging can go on while the upload runs
            job.in_memory = {name: bytes(data) for name, data in FlatFormat.files(job)}
            job.own_files = list(job.in_memory)
            files = [{"name": n, "bytes": len(d), "checksum": digest(d)} for n, d in job.in_memory.items()]
            job.manifest = Manifest(job.step, files, DEFAULT_ALGORITHM, job.attempt, job.job_id, job.emergency)

    def _make_room(self, job: SaveJob, fmt) -> None:
        """When the disk cannot hold another checkpoint, drop all but the newest committed one first."""
        if not getattr(fmt, "needs_room", True):  # files moved in from the same disk take no more of it
            return
        need = max(fmt.nbytes(job), self._last_bytes)
        try:
            free = shutil.disk_usage(self.local.root if self.local.root.exists() else self.local.root.parent).free
        except OSError:
            return
        if need and free < need * 1.1:
            removed = self.local.prune(1)
            if removed:
                log.warning("local disk nearly full: removed older checkpoints before writing",
                            step=job.step, free_bytes=free, need_bytes=need, removed=[str(p) for p in removed])

    # ------------------------------------------------------------------ the uploader

    def _upload_loop(self) -> None:
        _lower_priority()
        while (job := self._next_upload()) is not None:
            committed = False
            try:
                committed = self._upload(job)
            finally:
                with self._pending_cond:
                    self._uploading = None
                if job.early is not None:  # fenced or failed before it was waited for: its threads end
                    job.early.close()
                job.durable_done.set()
            if committed and self.uploader.rank == 0:  # housekeeping, after the commit is announced: a store
                self._safely(self._prune_durable, job)  # that hangs here holds up no wait() and no close()

    def _next_upload(self) -> SaveJob | None:
        """The newest pending job, the same on every rank; older pending ones are superseded."""
        with self._pending_cond:
            while not self._pending and not self._stopping:
                self._pending_cond.wait()
            if not self._pending:
                return None
            newest = self._pending[-1].seq
        target = self.uploader.max_int(newest)
        with self._pending_cond:  # every rank's writer delivers the same jobs, in the same order
            while not any(j.seq >= target for j in self._pending):
                self._pending_cond.wait()
            chosen = next(j for j in self._pending if j.seq == target)
            superseded = [j for j in self._pending if j.seq < target]
            self._pending = [j for j in self._pending if j.seq > target]
            self._uploading = chosen.step
        for job in superseded:
            if job.early is not None:
                job.abandoned.set()
                job.early.close()
            job.superseded = True
            log.info("upload superseded by a newer checkpoint", step=job.step, newer=chosen.step)
            job.durable_done.set()
        return chosen

    def _emergency_waiting(self, uploading: EarlyUpload | None = None) -> bool:
        """Is an emergency checkpoint waiting for the durable tier, or being sent to it (other than ``uploading``)?"""
        with self._pending_cond:
            return (any(j.emergency for j in self._pending) or any(t.is_alive() for t in self._from_buffer)
                    or any(early is not uploading and early.active() for early in self._early))

    # ------------------------------------------------------------------ a process group's emergency, sent early

    def _uploads_early(self, job: SaveJob) -> bool:
        """Decided alike on every rank (the same job, the same configuration): see early_upload.py."""
        return ((job.emergency or job.upload_from_buffer) and self.durable is not None
                and (job.format or self.format).layout == DCP)

    def _open_early_upload(self, job: SaveJob) -> None:
        """The writer's fence for an early upload (collective, before any file is written): rank 0 checks that no
        newer attempt has started and removes the step's old manifest, so that no file of a committed checkpoint
        is replaced under it; where it cannot, the job's files go up after the local commit, as any checkpoint's."""
        error = self._fenced(job) if self.writer.rank == 0 else None
        if error is None and self.writer.rank == 0:
            try:
                self.durable.uncommit(job.step)
            except Exception as exc:  # noqa: BLE001 - the uploader tries again, and reports
                error = exc
        if self.writer.all_true(error is None):
            with self._pending_cond:
                self._early = [early for early in self._early if early.active()] + [job.early]
            return
        job.early.close()
        job.early = None

    # ------------------------------------------------------------------ an emergency's upload from the buffer

    def _start_upload_from_buffer(self, job: SaveJob) -> _BufferReaders | None:
        """Start the upload of an emergency checkpoint of one process from its staged buffer now, beside the local
        write; the readers of the buffer, or None when the job takes the usual path (after the local commit)."""
        if not ((job.emergency or job.upload_from_buffer) and self.durable is not None and self.uploader.world_size == 1
                and (job.format or self.format).layout == FLAT and job.staged is not None):
            return None
        job.from_buffer = True
        readers = _BufferReaders(job, self.buffer_free)
        files = dict(FlatFormat.files(job))
        thread = threading.Thread(target=self._upload_from_buffer, args=(job, files, readers), daemon=True,
                                  name="runner-checkpoint-upload-emergency")
        thread.start()  # before it is listed: stop() may join the list's threads at any time
        self._from_buffer = [t for t in self._from_buffer if t.is_alive()] + [thread]
        return readers

    def _upload_from_buffer(self, job: SaveJob, files: dict, readers: _BufferReaders) -> None:
        # Not niced: an emergency's training waits for this upload (a timing checkpoint's measures that one).
        started = time.monotonic()
        error, manifest = self._fenced(job), None
        try:
            if error is None:
                self.durable.uncommit(job.step)
                checksums = self.durable.put_buffers(job.step, files, DEFAULT_ALGORITHM)  # hashed as they go
                entries = [{"name": n, "bytes": memoryview(d).nbytes, "checksum": checksums[n]}
                           for n, d in files.items()]
                manifest = Manifest(job.step, entries, DEFAULT_ALGORITHM, job.attempt, job.job_id, job.emergency,
                                    layout=FLAT, world_size=1)
                job.own_files = job.own_files or list(files)
        except Exception as exc:  # noqa: BLE001 - an unreachable store must not stop the training
            error = exc
        finally:
            files = None
            readers.done()
        if error is None:
            error = self._fenced(job)  # again, just before the manifest, which is the commit
        if error is None:
            try:
                self.durable.write_manifest(manifest)
            except Exception as exc:  # noqa: BLE001
                error = exc
        if job.manifest is None:
            job.manifest = manifest  # the local commit sets its own, of the same bytes
        try:  # no pruning from here: the uploader may be committing an older checkpoint meanwhile
            self._settle_upload(job, error, started)
        finally:
            job.durable_done.set()

    def _upload(self, job: SaveJob) -> bool:
        """Upload one checkpoint and commit it (manifest last); True when committed."""
        started = time.monotonic()
        # A superseded attempt touches nothing of the folder: not even this step's files, which the newer
        # attempt may have written. Checked again just before the manifest, which is the commit.
        error = self._fenced(job) if self.uploader.rank == 0 else None
        if self.uploader.all_true(error is None):
            if self.uploader.rank == 0:
                self._safely(lambda j: self.durable.uncommit(j.step), job)
            self.uploader.barrier()  # the old manifest of this step is gone before any file is replaced
            error = self._put_files(job)
            ok = self.uploader.all_true(error is None)
            if ok and self.uploader.rank == 0:
                error = self._fenced(job)
                if error is None:
                    try:
                        self.durable.write_manifest(job.manifest)
                    except Exception as exc:  # noqa: BLE001
                        error = exc
        else:
            error = error or SupersededError("a newer attempt of this job has started")
        return self._settle_upload(job, error, started, committed=self.uploader.all_true(error is None))

    def _settle_upload(self, job: SaveJob, error: BaseException | None, started: float,
                       committed: bool | None = None) -> bool:
        """Record how an upload ended and report it; True when committed."""
        committed = error is None if committed is None else committed
        if not committed:
            error = error or OSError("another rank's files did not reach the durable tier")
            job.durable_error = error
            if job.error is None:
                job.error = error
            log.warning("checkpoint not uploaded; it is kept on the local tier only", step=job.step,
                        url=self.durable.location(job.step), error=self.durable.describe(error))
            if self.uploader.rank == 0:
                self._safely(lambda j: self._on_failed(j, "durable", error), job)
            return False
        job.durable_manifest = self.durable.location(job.step, MANIFEST_NAME)
        seconds = time.monotonic() - started
        self.upload_timeout_s = max(UPLOAD_TIMEOUT_FLOOR_S, UPLOAD_TIMEOUT_FACTOR * seconds)
        if self.uploader.rank == 0 or self.folder_leader:
            self._safely(self._on_durable, job)
        return True

    def _prune_durable(self, job: SaveJob) -> None:
        self.durable.prune(self.keep, attempt=job.attempt, protect=self.retention.protected(),
                           stale_above=self.retention.stale_above(), job_id=job.job_id)

    def _prune_local(self, job: SaveJob) -> None:
        # Never the folder an upload reads (now, or next): on a durable tier slower than the checkpoints come,
        # pruning it made every periodic upload fail (its files gone), so none reached the durable tier.
        with self._pending_cond:
            uploading = {j.step for j in self._pending} | {self._uploading}
        self.local.prune(self.keep, protect=self.retention.protected() | (uploading - {None}))

    def _fenced(self, job: SaveJob) -> SupersededError | None:
        """A SupersededError when a newer attempt of the job has started on the durable tier (rank 0 asks)."""
        if job.attempt is None:
            return None
        if self._superseded_by is None:
            try:
                newest = self.durable.newest_attempt(job.job_id)
            except Exception:  # noqa: BLE001 - an unreadable marker folder fences nothing; the upload may fail too
                newest = None
            if newest is not None and newest > job.attempt:
                self._superseded_by = newest
                log.warning("a newer attempt of this job has started: this process commits nothing more to the "
                            "durable tier (its local copies are kept)", attempt=job.attempt, newer_attempt=newest,
                            url=self.durable.shown)
        if self._superseded_by is None:
            return None
        return SupersededError(f"attempt {self._superseded_by} of this job has started; attempt {job.attempt} "
                               f"no longer commits to the durable tier")

    def _put_files(self, job: SaveJob) -> BaseException | None:
        """Upload this process's files; give up at the deadline, or for an emergency checkpoint waiting."""
        pool = DaemonPool(1, "runner-checkpoint-put")
        if job.in_memory is not None:
            future = pool.submit(self.durable.put_bytes, job.step, job.in_memory, what=f"upload of step {job.step}")
        else:
            future = pool.submit(self._put_own_files, job, what=f"upload of step {job.step}")
        deadline = time.monotonic() + self.upload_timeout_s
        try:
            while True:
                try:
                    future.result(timeout=0.05)
                    return None
                except FutureTimeout:
                    pass
                if time.monotonic() > deadline:
                    job.abandoned.set()
                    return TimeoutError(f"the upload took longer than {self.upload_timeout_s:.0f} s; abandoned")
                if not job.emergency and self._emergency_waiting(uploading=job.early):
                    job.abandoned.set()  # its files still to go would share the node's bandwidth with the emergency
                    return TimeoutError("abandoned for an emergency checkpoint")
        except Exception as exc:  # noqa: BLE001 - an unreachable store must not stop the training
            return exc
        finally:
            pool.shutdown(wait=False)  # an abandoned upload's thread stops at its next file (``abandoned``)

    def _put_own_files(self, job: SaveJob) -> None:
        names = job.own_files
        if job.early is not None:  # what it sent as the local write went on is up already
            sent = job.early.finish()
            names = [name for name in names if name not in sent]
        self.durable.put_files(job.step, job.local_manifest.parent, names, abandoned=job.abandoned)

    def _safely(self, fn, arg) -> None:
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001 - reporting and pruning are best effort
            error = self.durable.describe(exc) if self.durable is not None else f"{type(exc).__name__}: {exc}"
            log.warning("checkpoint housekeeping failed", action=getattr(fn, "__name__", str(fn)), error=error)


class _BufferReaders:
    """The local write and an emergency's upload read one staged buffer at once: it goes back to staging
    (``buffer_free``) once both are done with it."""

    def __init__(self, job: SaveJob, buffer_free: threading.Event) -> None:
        self._job, self._buffer_free = job, buffer_free
        self._left = 2
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._job.staged = None  # views of the reused buffer: never touch them again
            self._buffer_free.set()


def _lower_priority() -> None:
    try:  # on Linux a thread has its own nice value: let the training thread win the CPU
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PERSIST_NICENESS)
    except (AttributeError, OSError):
        pass
