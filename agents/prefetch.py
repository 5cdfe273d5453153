"""Fetch the job's checkpoint into this node's local tier while the node gets ready.

A new node (a replacement prepared during a notice, or any relaunch) spends a cloud's minute or so on
`setup` before the job's process can start. Meanwhile this follower copies the newest checkpoint folder of
the job's durable tier into the node's local tier, file by file, so that ``restore()`` finds it on local disk
and reads only what is still missing from the durable tier:

- the newest *committed* checkpoint (what a relaunch resumes from), fetched during setup;
- a checkpoint *being uploaded* (the emergency checkpoint of the node on notice): every file is fetched as
  soon as it is complete on the durable tier (an object store shows an object only once complete; the local
  market's tier renames a file into place), so the download overlaps the upload and the handover waits for
  about one file, not for the whole checkpoint twice.

Nothing here decides what the job resumes from: the library still restores only the step the controller
hands over, verifies every file against that step's manifest (written last, once every file is on the
durable tier), and fetches again whatever is missing or damaged. A file copied while it was being written
(a store without atomic objects) is caught there: its size or checksum is wrong.

The agent needs no torch for this: only fsspec (and the checkpoint folders' naming, ``step-%08d``).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import threading
import time
from pathlib import Path

import structlog

from runner.protocol.urls import hide_secrets, redact

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.2
STALL_SECONDS = 30.0  # waiting for a step ends when nothing more arrives for this long
MANIFEST = "manifest.json"
_STEP_FOLDER = re.compile(r"^step-(\d{8,})$")  # runner/checkpoint/manifest.py's folder_name()


def step_folder(step: int) -> str:
    return f"step-{step:08d}"


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class CheckpointPrefetch:
    """Follows the newest checkpoint folder of ``durable_url`` into ``local_root`` (see the module)."""

    def __init__(self, durable_url: str, local_root: Path, poll_seconds: float = POLL_SECONDS,
                 target: int | None = None):
        self.durable_url = durable_url
        self.local_root = Path(local_root)
        self.poll_seconds = poll_seconds
        import fsspec  # here, not at the agent's start: only a node that prefetches pays for the import

        from runner import local_durable  # noqa: F401 - registers local-durable://

        self.fs, self.root = fsspec.core.url_to_fs(durable_url)
        self.root = self.root.rstrip("/")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._complete: set[int] = set()   # committed steps whose every file is here, of the right size
        self._committed: set[int] = set()  # steps seen with a manifest on the durable tier
        self._given_up: set[int] = set()   # steps this follower cannot make complete here (LocalFillIn)
        self._created: set[int] = set()    # local folders this follower made (it removes the superseded ones)
        self._passes = 0
        self.fetched_bytes = 0
        self._thread: threading.Thread | None = None
        self._target = target  # the step to fetch, when known (a relaunch's); else the newest

    def start(self) -> "CheckpointPrefetch":
        self._thread = threading.Thread(target=self._run, name="checkpoint-prefetch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wait_for(self, step: int, timeout: float) -> bool:
        """Wait until every file of committed ``step`` is here (True), or it is not coming (False): the durable
        tier has no folder of it after a full pass of the follower, nothing arrived for STALL_SECONDS, or
        ``timeout`` passed."""
        end = time.monotonic() + timeout
        with self._lock:
            self._target = step  # from now on the follower fetches this step, newest or not
            start_pass = self._passes
        progress, progress_at = self.fetched_bytes, time.monotonic()
        while time.monotonic() < end and not self._stop.is_set():
            with self._lock:
                if step in self._complete:
                    return True
                if step in self._given_up:
                    return False
                if self._passes > start_pass + 1 and step not in self._seen_steps:
                    return False
            if self.fetched_bytes != progress:
                progress, progress_at = self.fetched_bytes, time.monotonic()
            elif time.monotonic() - progress_at > STALL_SECONDS:
                return False
            time.sleep(0.05)
        return False

    # --- the follower -------------------------------------------------------------------
    _seen_steps: frozenset[int] = frozenset()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow_newest()
            except Exception as exc:  # noqa: BLE001 - a store that is away now may answer later
                log.warning("checkpoint prefetch: the durable tier did not answer; trying again",
                            url=redact(self.durable_url),
                            error=hide_secrets(f"{type(exc).__name__}: {exc}", self.durable_url))
                self._stop.wait(2.0)
            with self._lock:
                self._passes += 1
            self._stop.wait(self.poll_seconds)

    def _steps(self) -> list[int]:
        self.fs.invalidate_cache(self.root)
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = (_STEP_FOLDER.match(_base(n)) for n in names)
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def _follow_newest(self) -> None:
        steps = self._steps()
        with self._lock:
            self._seen_steps = frozenset(steps)
        with self._lock:
            target = self._target
        if target is not None and target not in steps:
            return
        if not steps:
            return
        step = target if target is not None else steps[0]
        remote, sizes = self._listing(step)
        if sizes is None:
            return
        manifest = None
        if MANIFEST in sizes:  # committed: its list of files is the truth (read before the files it names)
            try:
                manifest = json.loads(self.fs.cat_file(posixpath.join(remote, MANIFEST)))
            except (FileNotFoundError, ValueError):
                manifest = None
        if manifest is not None:
            wanted = {f["name"]: f.get("bytes") for f in manifest.get("files", []) if isinstance(f, dict)}
        else:
            wanted = {n: s for n, s in sizes.items() if n != MANIFEST and not n.startswith(".")}
        folder = self.local_root / step_folder(step)
        if not folder.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._created.add(step)
        self._drop_superseded(step)
        for name in sorted(wanted):
            if self._stop.is_set():
                return
            if "/" in name or (name.startswith(".") and manifest is None) or name not in sizes:
                # not (yet) on the durable tier; a name outside the folder is never copied, nor a hidden one
                # before the commit (an upload's temporary), but a committed one is (a gang's ``.metadata``)
                continue
            target = folder / name
            if target.is_file() and target.stat().st_size == wanted[name]:
                continue
            self._fetch(posixpath.join(remote, name), target)
        if manifest is not None:
            done = all((folder / n).is_file() and (folder / n).stat().st_size == b for n, b in wanted.items()
                       if "/" not in n)
            with self._lock:
                self._committed.add(step)
                if done and step not in self._complete:
                    self._complete.add(step)
                    log.info("checkpoint prefetched to the local tier", step=step, files=len(wanted),
                             fetched_mb=round(self.fetched_bytes / 1e6, 1))

    def _listing(self, step: int) -> tuple[str, dict | None]:
        """The durable folder of ``step`` and the size of each file there (None: no such folder)."""
        remote = posixpath.join(self.root, step_folder(step))
        self.fs.invalidate_cache(remote)
        try:
            entries = self.fs.ls(remote, detail=True)
        except FileNotFoundError:
            return remote, None
        return remote, {_base(e["name"]): e.get("size") for e in entries if e.get("type") != "directory"}

    def _fetch(self, source: str, target: Path) -> None:
        partial = target.with_name(f".{target.name}.prefetch")
        try:
            self.fs.get_file(source, str(partial))
            os.replace(partial, target)
        except BaseException:  # a full disk, a store gone mid-file: no half file is left to take the node's disk
            partial.unlink(missing_ok=True)
            raise
        self.fetched_bytes += target.stat().st_size

    def _drop_superseded(self, current: int) -> None:
        """Folders this follower made for other steps, never committed here: it follows another one now. The
        newest complete one stays: should the upload followed now miss the reclaim (an emergency checkpoint cut
        off), that is the step the controller hands over."""
        with self._lock:
            keep = {current, max(self._complete, default=None)}
            old = [s for s in self._created if s not in keep]
        for step in old:
            folder = self.local_root / step_folder(step)
            if not (folder / MANIFEST).exists():
                shutil.rmtree(folder, ignore_errors=True)
            with self._lock:
                self._created.discard(step)
                self._complete.discard(step)


class LocalFillIn(CheckpointPrefetch):
    """A kept gang node's follower for the step its gang stopped at (``target``).

    Each node's ranks write only their own share of a gang's checkpoint to their local tier; the other nodes'
    shares reach this node at the next attempt's ``restore()``, from the durable tier, inside the training pause.
    Started once this node's share of the stop's checkpoint is committed locally (its manifest, written last,
    names every node's files), this fetches each file the local folder lacks as soon as the durable tier has it
    whole, beside the other nodes' upload, so the restore finds the whole checkpoint here. It never writes a file
    this node's ranks wrote, and nothing before their local commit: a step never committed here is given up (the
    restore fetches what it needs, as without this).
    """

    def _follow_newest(self) -> None:
        steps = self._steps()
        with self._lock:
            self._seen_steps = frozenset(steps)
            step = self._target
        if step is None or step not in steps:
            return
        remote, sizes = self._listing(step)
        if sizes is None:
            return
        folder = self.local_root / step_folder(step)
        try:
            local = json.loads((folder / MANIFEST).read_text())
            wanted = {f["name"]: f.get("bytes") for f in local.get("files", []) if isinstance(f, dict)}
        except (OSError, ValueError, TypeError, KeyError):
            if MANIFEST in sizes:  # durable, and never committed here: nothing of this node's to fill in
                with self._lock:
                    self._given_up.add(step)
            return
        for name in sorted(wanted):
            if self._stop.is_set():
                return
            target = folder / name
            if "/" in name or target.exists() or sizes.get(name) != wanted[name]:
                continue  # this node's own, or not (yet) whole on the durable tier
            self._fetch(posixpath.join(remote, name), target)
        if all((folder / n).is_file() for n in wanted if "/" not in n):
            with self._lock:
                if step not in self._complete:
                    self._complete.add(step)
                    log.info("the other nodes' share of the checkpoint fetched to the local tier", step=step,
                             files=len(wanted), fetched_mb=round(self.fetched_bytes / 1e6, 1))


def resume_step(assignment: dict) -> int | None:
    """The step the controller hands this attempt (None: none, or a prepared node's not known yet)."""
    step = ((assignment.get("checkpoint") or {}).get("resume") or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None


def prefetch_for(assignment: dict, local_root: Path, target: int | None = None,
                 follower: type[CheckpointPrefetch] = CheckpointPrefetch) -> CheckpointPrefetch | None:
    """A follower for the assignment's durable tier, or None when the job has none."""
    url = (assignment.get("checkpoint") or {}).get("durable_url")
    if not url:
        return None
    try:
        return follower(url, local_root, target=target).start()
    except Exception as exc:  # noqa: BLE001 - a URL this agent cannot open: the job's restore says why
        log.warning("checkpoint prefetch unavailable", url=redact(url),
                    error=hide_secrets(f"{type(exc).__name__}: {exc}", url))
        return None


def local_checkpoint_root(assignment: dict, scratch_dir: Path) -> Path:
    """The node's local tier, as the job's process will see it (RUNNER_CHECKPOINT_DIR; a relative local_dir is
    relative to the workdir, the process's working directory)."""
    local_dir = (assignment.get("checkpoint") or {}).get("local_dir")
    if not local_dir:
        return scratch_dir / "checkpoints"
    path = Path(local_dir).expanduser()
    return path if path.is_absolute() else scratch_dir / "work" / path
