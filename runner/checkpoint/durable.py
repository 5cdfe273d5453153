"""The durable tier: any fsspec URL (file://, memory://, s3://, gs://, ...). Data first, manifest last.

Object stores have no atomic folder rename, so a checkpoint here is committed when its ``manifest.json``
object exists; the data parts are uploaded in parallel before it and nothing is ever renamed. A
restore downloads a checkpoint into the local tier and verifies it there.

Attempts of one job share this folder. Each attempt, when its Checkpointer starts, leaves a marker
(``attempts/JOB/attempt-00000007``); an attempt that sees a newer attempt's marker of its job is superseded:
it commits nothing more here and prunes nothing (retention.py). Another job's markers and checkpoints (a
job submitted again with the same URL) are not its attempts: they are ranked by step as any checkpoint.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import threading
from pathlib import Path

import fsspec

from .. import local_durable  # noqa: F401 - registers local-durable://, the local market's durable tier
from ..protocol.urls import hide_secrets, redact
from .checksum import DEFAULT_ALGORITHM, new_hasher
from .errors import CheckpointConfigError, CheckpointError, CorruptCheckpointError, NoRoomToRestoreError
from .daemon_pool import DaemonPool
from .log import get_logger
from .manifest import MANIFEST_NAME, Manifest, folder_name, step_of

log = get_logger()

UPLOAD_THREADS = 16
BUFFER_CHUNK = 8 << 20  # bytes of a buffer handed to the store's file object at a time
ATTEMPTS_FOLDER = "attempts"  # the attempt markers, beside the step folders (whose names it never matches)
_ATTEMPT_MARKER = re.compile(r"^attempt-(\d+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # the local disk cannot hold a fetched file


class UploadAbandoned(CheckpointError):
    """The caller gave up on an upload (an emergency checkpoint needs the bandwidth): no further file is sent."""


def _job_folder(job_id: str | None) -> str:
    return _UNSAFE.sub("_", job_id) if job_id else "_"
_BUCKET_STORES = ("s3", "s3a", "gs", "gcs")
_DRIVERS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
            "abfss": "adlfs", "hf": "huggingface_hub", "sftp": "paramiko", "ssh": "paramiko"}


def open_filesystem(url: str):
    """Resolve ``url`` to (filesystem, root path); raise CheckpointConfigError that names the fix (and shows the URL
    with its credentials as ``***``)."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    shown = redact(url)
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError as exc:
        raise CheckpointConfigError(
            f"durable_url {shown!r}: unknown scheme {scheme!r}; use a URL fsspec knows, such as "
            f"file:///path, s3://bucket/prefix or gs://bucket/prefix") from exc
    except ImportError as exc:
        package = _DRIVERS.get(scheme, f"the fsspec driver for {scheme}://")
        raise CheckpointConfigError(
            f"durable_url {shown!r} needs {package}: pip install {package}") from exc
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        package = _DRIVERS.get(scheme, f"the fsspec driver for {scheme}://")
        raise CheckpointConfigError(f"durable_url {shown!r} needs {package}: pip install {package}") from exc
    except Exception as exc:  # noqa: BLE001 - a driver's own construction error, reported with the URL
        raise CheckpointConfigError(f"durable_url {shown!r} cannot be opened: {hide_secrets(str(exc), url)}") from None
    return fs, root.rstrip("/")


def _unreachable(exc: BaseException) -> bool:
    """A connection that could not be made or timed out (botocore's errors are not OSErrors)."""
    names = " ".join(t.__name__ for t in type(exc).__mro__)
    return isinstance(exc, (ConnectionError, TimeoutError)) or "Connect" in names or "Timeout" in names


class DurableTier:
    """Checkpoint folders under one fsspec URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.shown = redact(url)  # what messages and logs show: the URL with its credentials as ***
        self.fs, self.root = open_filesystem(url)
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self._probe()

    def __repr__(self) -> str:
        return f"DurableTier({self.shown!r})"

    def describe(self, exc: BaseException) -> str:
        """``exc`` as a message may show it: its type and text, with this URL's credentials as ``***``."""
        return hide_secrets(f"{type(exc).__name__}: {exc}", self.url)

    def _probe(self) -> None:
        """Touch the URL once so that missing credentials fail at construction, not at the first upload."""
        try:
            if self.protocol in _BUCKET_STORES:
                bucket = self.root.split("/", 1)[0]
                try:  # ls, not exists: exists() answers False for an endpoint it cannot reach
                    self.fs.ls(bucket, detail=False)
                except FileNotFoundError:
                    raise CheckpointConfigError(
                        f"durable_url {self.shown!r}: bucket {bucket!r} does not exist or is not visible with these "
                        f"credentials; create it, or fix the URL") from None
            self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            pass
        except CheckpointConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - credentials and permission errors differ by driver
            if _unreachable(exc):
                raise CheckpointConfigError(
                    f"durable_url {self.shown!r}: the store cannot be reached ({self.describe(exc)}). Check "
                    f"the endpoint (AWS_ENDPOINT_URL for S3-compatible stores) and the network") from None
            raise CheckpointConfigError(
                f"durable_url {self.shown!r} is not usable: {self.describe(exc)}. Check the credentials "
                f"for {self.protocol}:// (AWS: AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; "
                f"Google: GOOGLE_APPLICATION_CREDENTIALS) and that the bucket exists") from None

    def location(self, step: int, name: str = "") -> str:
        """Where a checkpoint (or one of its files) is, for messages: the credentials the root's path may hold (a
        query parameter kept in it) shown as ``***``, the step folder and file name after them as they are."""
        root = self.root if self.protocol in ("file", "local") else f"{self.protocol}://{self.root}"
        return posixpath.join(hide_secrets(root, self.url), folder_name(step), *([name] if name else []))

    def _path(self, step: int, name: str = "") -> str:
        return posixpath.join(self.root, folder_name(step), name) if name else posixpath.join(
            self.root, folder_name(step))

    def upload(self, folder: Path, manifest: Manifest) -> str:
        """Upload every file of a committed local checkpoint in parallel, then the manifest; return its URL."""
        self.uncommit(manifest.step)
        self.put_files(manifest.step, folder, [f["name"] for f in manifest.files])
        return self.write_manifest(manifest)

    def put_files(self, step: int, folder: Path, names: list[str], abandoned: threading.Event | None = None) -> None:
        """Upload some files of a local checkpoint folder in parallel (no manifest), in order: a store that says
        how many streams pay (``upload_streams``: one, for a tier held to one bandwidth) gets that many, so
        files complete one after another and a reader can follow them (agents/prefetch.py). Once ``abandoned``
        is set, no further file is started (UploadAbandoned): the caller gave up on this upload."""
        self.fs.makedirs(self._path(step), exist_ok=True)
        streams = getattr(self.fs, "upload_streams", None) or UPLOAD_THREADS

        def put(name: str) -> None:
            if abandoned is not None and abandoned.is_set():
                raise UploadAbandoned(f"{self.location(step)}: upload abandoned before {name}")
            self.fs.put_file(str(folder / name), self._path(step, name))

        with DaemonPool(min(streams, max(len(names), 1)), "runner-checkpoint-upload") as pool:
            futures = [pool.submit(put, n, what=f"upload of {folder / n} to {self.location(step, n)}") for n in names]
            try:
                for future in futures:
                    future.result()
            except UploadAbandoned:
                sent = sum(1 for f in futures if f.done() and f.exception() is None)
                log.info("upload abandoned: its remaining files are not sent", step=step, sent=sent,
                         not_sent=len(names) - sent)
                raise

    def put_file(self, step: int, path: Path) -> None:
        """Upload one file of a local checkpoint folder (no manifest)."""
        self.fs.makedirs(self._path(step), exist_ok=True)
        self.fs.put_file(str(path), self._path(step, path.name))

    def put_bytes(self, step: int, files: dict[str, bytes]) -> None:
        """Upload files held in memory (the local tier could not take them), in parallel (no manifest)."""
        self.fs.makedirs(self._path(step), exist_ok=True)
        with DaemonPool(min(UPLOAD_THREADS, max(len(files), 1)), "runner-checkpoint-upload") as pool:
            for future in [pool.submit(self.fs.pipe_file, self._path(step, n), d,
                                       what=f"upload to {self.location(step, n)}") for n, d in files.items()]:
                future.result()

    def put_buffers(self, step: int, files: dict[str, object], algorithm: str = DEFAULT_ALGORITHM) -> dict[str, str]:
        """Upload files held in memory as buffers (views of the staged buffer: no copy is made), each written in
        chunks through the store's own file object and checksummed in the same pass, in order and as many at
        once as :meth:`put_files` (no manifest); return each file's checksum."""
        self.fs.makedirs(self._path(step), exist_ok=True)
        streams = getattr(self.fs, "upload_streams", None) or UPLOAD_THREADS
        with DaemonPool(min(streams, max(len(files), 1)), "runner-checkpoint-upload") as pool:
            futures = {n: pool.submit(self._put_buffer, self._path(step, n), d, algorithm,
                                      what=f"upload to {self.location(step, n)}") for n, d in files.items()}
            return {name: future.result() for name, future in futures.items()}

    def _put_buffer(self, path: str, data, algorithm: str) -> str:
        hasher = new_hasher(algorithm)
        view = memoryview(data).cast("B")
        with self.fs.open(path, "wb") as sink:
            for start in range(0, len(view), BUFFER_CHUNK):
                chunk = view[start:start + BUFFER_CHUNK]
                hasher.update(chunk)
                sink.write(chunk)
        return hasher.hexdigest()

    def write_manifest(self, manifest: Manifest) -> str:
        """Commit a checkpoint whose files are all uploaded: write its manifest last; return its URL."""
        self.fs.pipe_file(self._path(manifest.step, MANIFEST_NAME), manifest.to_json())
        return self.location(manifest.step, MANIFEST_NAME)

    def uncommit(self, step: int) -> None:
        try:
            self.fs.rm_file(self._path(step, MANIFEST_NAME))
        except FileNotFoundError:
            pass

    def steps(self) -> list[int]:
        """Steps of every checkpoint folder (committed or not), newest first."""
        self.fs.invalidate_cache(self.root)
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted((s for s in (step_of(n) for n in names) if s is not None), reverse=True)

    def read_manifest(self, step: int) -> Manifest:
        path = self._path(step, MANIFEST_NAME)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{self.location(step, MANIFEST_NAME)} is missing") from exc
        return Manifest.from_json(data, self.location(step, MANIFEST_NAME))

    def committed(self) -> list[int]:
        """Steps that have a manifest, newest first."""
        out = []
        for step in self.steps():
            if self.fs.exists(self._path(step, MANIFEST_NAME)):
                out.append(step)
        return out

    def download(self, step: int, manifest: Manifest, folder: Path, names: list[str] | None = None) -> None:
        """Copy a checkpoint's files (or the named ones) into a local folder (verified when loaded)."""
        names = [f["name"] for f in manifest.files] if names is None else names
        with DaemonPool(min(UPLOAD_THREADS, max(len(names), 1)), "runner-checkpoint-download") as pool:
            futures = [pool.submit(self.fs.get_file, self._path(step, n), str(folder / n),
                                   what=f"download of {self.location(step, n)}") for n in names]
            no_room = None
            for name, future in zip(names, futures):
                try:
                    future.result()
                except FileNotFoundError as exc:
                    raise CorruptCheckpointError(
                        f"{self.location(step)}: a file is missing ({self.describe(exc)})") from None
                except OSError as exc:
                    if exc.errno not in NO_ROOM:
                        raise
                    (folder / name).unlink(missing_ok=True)  # a half-written file would keep the disk full
                    no_room = no_room or exc
        if no_room is not None:  # not damage: restore must not pass over this checkpoint and start fresh
            raise NoRoomToRestoreError(
                f"step {step} of {self.shown} cannot be fetched into {folder.parent}: {os.strerror(no_room.errno)}; "
                f"free space there, or set local_dir (checkpoint.local_dir) to a larger disk") from no_room

    # ------------------------------------------------------------------ attempts sharing the folder

    def mark_attempt(self, attempt: int, job_id: str | None) -> None:
        """Record that ``attempt`` of the job has started: its older attempts stop committing here from now on."""
        folder = posixpath.join(self.root, ATTEMPTS_FOLDER, _job_folder(job_id))
        self.fs.makedirs(folder, exist_ok=True)
        self.fs.pipe_file(posixpath.join(folder, f"attempt-{attempt:08d}"), b"")

    def newest_attempt(self, job_id: str | None) -> int | None:
        """The job's newest attempt that has started on this folder (None when none left a marker)."""
        folder = posixpath.join(self.root, ATTEMPTS_FOLDER, _job_folder(job_id))
        self.fs.invalidate_cache(folder)
        try:
            names = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return None
        found = [int(m.group(1)) for m in (_ATTEMPT_MARKER.match(n.rstrip("/").rsplit("/", 1)[-1]) for n in names) if m]
        return max(found) if found else None

    def writer_attempt(self, step: int, job_id: str | None) -> int | None:
        """The attempt of the job that committed ``step`` (from its manifest); None when another job (or no
        job) wrote it, or its manifest is unreadable."""
        try:
            manifest = self.read_manifest(step)
        except Exception:  # noqa: BLE001 - a damaged manifest counts as written by no known attempt
            return None
        if manifest.job_id != job_id:
            return None
        attempt = manifest.attempt
        return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None

    def prune(self, keep: int, attempt: int | None = None, protect: frozenset[int] = frozenset(),
              stale_above: int | None = None, job_id: str | None = None) -> list[int]:
        """Keep the ``keep`` newest committed checkpoints, and every step in ``protect``; drop older ones
        (manifest first) and uncommitted leftovers older than the newest kept one.

        With ``attempt`` of ``job_id`` (under the runner): a superseded attempt prunes nothing; checkpoints
        written by a newer attempt are never touched; an earlier attempt's above ``stale_above`` (a superseded
        attempt's, written after the job moved on) neither count as the newest nor stay (retention.py)."""
        committed = self.committed()
        if not committed:
            return []
        newer_attempts: set[int] = set()
        stale: set[int] = set()
        if attempt is not None:
            newest_attempt = self.newest_attempt(job_id)
            if newest_attempt is not None and newest_attempt > attempt:
                return []  # the newer attempt's retention decides now
            writers = {step: self.writer_attempt(step, job_id) for step in committed}
            newer_attempts = {s for s, w in writers.items() if w is not None and w > attempt}
            if stale_above is not None:
                stale = {s for s, w in writers.items() if w is not None and w < attempt and s > stale_above}
        stale -= protect
        counted = [s for s in committed if s not in newer_attempts and s not in stale]
        keep_steps = set(counted[:max(keep, 1)]) | set(protect) | newer_attempts
        newest = counted[0] if counted else None
        removed = []
        for step in self.steps():
            if step in keep_steps:
                continue
            if step not in stale and (newest is None or step >= newest):
                continue  # an upload in flight, or nothing of ours to rank it against
            self.uncommit(step)
            self.fs.rm(self._path(step), recursive=True)
            removed.append(step)
        return removed
