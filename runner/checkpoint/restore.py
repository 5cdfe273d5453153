"""Find the newest checkpoint that verifies, on either tier, and read it into memory.

Candidates are all committed checkpoints of both tiers, newest step first, the local copy before the
durable one of the same step. A candidate is read whole and checked (sizes and checksums of every file)
before anything is applied, so a damaged or partial checkpoint is skipped and never half-loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .durable import DurableTier
from .errors import CheckpointError, CorruptCheckpointError, RestoreError
from .local import LocalTier, read_verified
from .log import get_logger
from .manifest import FLAT, MANIFEST_NAME, STATE_NAME, Manifest
from .staging import rebuild

log = get_logger()


@dataclass
class Loaded:
    step: int
    manifest: Manifest
    location: str  # path or URL of the manifest the state came from
    state: dict


def read_folder(folder: Path, manifest: Manifest) -> dict:
    """Verify every file of ``folder`` against ``manifest`` and rebuild the saved state."""
    parts, skeleton = [], None
    for entry in manifest.files:
        data = read_verified(folder / entry["name"], entry, manifest.checksum)
        if entry["name"] == STATE_NAME:
            skeleton = bytes(data)
        else:
            parts.append(torch.frombuffer(data, dtype=torch.uint8))
    if skeleton is None:
        raise CorruptCheckpointError(f"{folder}: the manifest lists no {STATE_NAME}")
    try:
        return rebuild(skeleton, parts)
    except Exception as exc:  # noqa: BLE001 - an unpicklable skeleton is a damaged checkpoint
        raise CorruptCheckpointError(f"{folder / STATE_NAME} cannot be read: {exc}") from exc


def _load_local(local: LocalTier, folder: Path) -> Loaded:
    manifest = local.read_manifest(folder)
    return Loaded(manifest.step, manifest, str(folder / "manifest.json"), read_folder(folder, manifest))


def _load_durable(local: LocalTier, durable: DurableTier, step: int) -> Loaded:
    manifest = durable.read_manifest(step)
    folder = local.begin(step)
    try:
        durable.download(step, manifest, folder)
        state = read_folder(folder, manifest)
    except BaseException:
        local.discard(folder)
        raise
    try:
        local.commit(folder, manifest)  # the local tier now holds a verified copy
    except OSError:
        local.discard(folder)
    return Loaded(step, manifest, durable.location(step, "manifest.json"), state)


def load_newest(local: LocalTier, durable: DurableTier | None, max_step: int | None = None) -> Loaded | None:
    """The newest checkpoint that verifies (at most ``max_step`` when given), or None when there is none."""
    candidates = [(step, 0, folder) for step, folder in local.committed()]
    if durable is not None:
        try:
            candidates += [(step, 1, step) for step in durable.committed()]
        except Exception as exc:  # noqa: BLE001 - an unreachable store leaves the local tier
            log.warning("durable tier unreadable; restoring from the local tier only",
                        url=durable.url, error=f"{type(exc).__name__}: {exc}")
    if max_step is not None:
        newer = sorted({c[0] for c in candidates if c[0] > max_step})
        if newer:
            log.warning("ignoring checkpoints newer than the one the controller handed over (fencing)",
                        max_step=max_step, ignored=newer)
        candidates = [c for c in candidates if c[0] <= max_step]
    candidates.sort(key=lambda c: (-c[0], c[1]))
    for step, tier, where in candidates:
        try:
            if tier == 0:
                return _load_local(local, where)
            return _load_durable(local, durable, where)
        except (CheckpointError, OSError) as exc:
            log.warning("skipping a damaged checkpoint", step=step,
                        location=str(where) if tier == 0 else durable.location(step),
                        error=f"{type(exc).__name__}: {exc}")
    return None


# ---------------------------------------------------------------------- any layout, one process or a group

@dataclass
class Restored:
    step: int
    location: str  # path or URL of the manifest the state came from
    world_size: int


def restore_into(local: LocalTier, durable: DurableTier | None, comm, folder_leader: bool, objects: dict,
                 extra: dict, apply_flat, max_step: int | None = None) -> Restored | None:
    """Load the newest checkpoint that verifies on every rank into ``objects``; None when there is none.

    Collective under torch.distributed (``comm`` is then the training thread's side group): the ranks
    agree on the candidates, each folder's leader makes its local copy complete and verified (fetching
    what it lacks from the durable tier: on a multi-node job a node's folder holds only its own ranks'
    files), and a candidate is used only when it verified for every rank.
    """
    mine = set(s for s, _ in local.committed())
    durable_steps: set[int] = set()
    if durable is not None:
        try:
            durable_steps = set(durable.committed())
        except Exception as exc:  # noqa: BLE001 - an unreachable store leaves the local tier
            log.warning("durable tier unreadable; restoring from the local tier only",
                        url=durable.url, error=f"{type(exc).__name__}: {exc}")
    steps = sorted(set().union(*comm.gather(sorted(mine | durable_steps))), reverse=True)
    if max_step is not None:
        newer = [s for s in steps if s > max_step]
        if newer:
            log.warning("ignoring checkpoints newer than the one the controller handed over (fencing)",
                        max_step=max_step, ignored=sorted(newer))
        steps = [s for s in steps if s <= max_step]
    for step in steps:
        where, manifest, error = None, None, None
        if folder_leader:
            try:
                where, manifest = _materialize(local, durable, step, in_local=step in mine,
                                               in_durable=step in durable_steps)
            except (CheckpointError, OSError) as exc:
                error = exc
        if not comm.all_true(error is None):
            if error is not None:
                log.warning("skipping a checkpoint that does not verify", step=step,
                            error=f"{type(error).__name__}: {error}")
            continue
        folder = local.folder(step)
        try:
            if manifest is None:  # a rank sharing its leader's folder
                manifest = local.read_manifest(folder)
                where = str(folder / MANIFEST_NAME)
            if manifest.layout == FLAT:
                apply_flat(read_folder(folder, manifest), where)
            else:
                from . import dcp_format

                dcp_format.load(folder, objects, extra, comm, manifest.world_size)
        except RestoreError as exc:
            error = exc
        except (CheckpointError, OSError) as exc:
            error = exc
        outcomes = comm.gather(None if error is None else (isinstance(error, RestoreError), str(error)))
        failed = [(rank, o) for rank, o in enumerate(outcomes) if o is not None]
        if not failed:
            return Restored(step, where, manifest.world_size)
        setup_errors = [f"rank {rank}: {text}" for rank, (is_setup, text) in failed if is_setup]
        if setup_errors:
            raise RestoreError(str(error) if error is not None else "; ".join(setup_errors))
        log.warning("skipping a damaged checkpoint", step=step, errors=[text for _, (_, text) in failed])
    return None


def _materialize(local: LocalTier, durable: DurableTier | None, step: int, in_local: bool,
                 in_durable: bool) -> tuple[str, Manifest]:
    """Make the local folder of ``step`` hold every file of the checkpoint, verified; committed locally."""
    folder = local.folder(step)
    manifest, where = None, str(folder / MANIFEST_NAME)
    if in_local:
        manifest = local.read_manifest(folder)
    missing = [] if manifest is None else [f["name"] for f in manifest.files if not (folder / f["name"]).is_file()]
    if manifest is None or missing:
        if not in_durable:
            raise CorruptCheckpointError(f"{folder}: files {missing} are missing here and the durable tier "
                                         f"has no copy of step {step}")
        manifest = durable.read_manifest(step)
        where = durable.location(step, MANIFEST_NAME)
        folder.mkdir(parents=True, exist_ok=True)
        local.uncommit(folder)
        missing = [f["name"] for f in manifest.files if not (folder / f["name"]).is_file()]
        durable.download(step, manifest, folder, names=missing)
    try:
        verify_folder(folder, manifest)
    except CorruptCheckpointError as exc:
        if not in_durable or where.startswith(str(durable.location(step))):
            raise
        log.warning("local copy damaged; fetching the durable one", step=step, error=str(exc))
        manifest = durable.read_manifest(step)
        where = durable.location(step, MANIFEST_NAME)
        local.uncommit(folder)
        durable.download(step, manifest, folder)
        verify_folder(folder, manifest)
    if not (folder / MANIFEST_NAME).is_file():
        try:
            local.commit(folder, manifest)  # the local tier now holds a verified copy
        except OSError:
            pass
    return where, manifest


def verify_folder(folder: Path, manifest: Manifest) -> None:
    """Check every file's size and checksum without holding the files in memory."""
    from .dcp_format import file_checksum

    for entry in manifest.files:
        path = folder / entry["name"]
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{path} is missing") from exc
        if size != entry["bytes"]:
            raise CorruptCheckpointError(f"{path} has {size} bytes, the manifest says {entry['bytes']}")
        if file_checksum(path, manifest.checksum) != entry["checksum"]:
            raise CorruptCheckpointError(f"{path} fails its {manifest.checksum} checksum")
