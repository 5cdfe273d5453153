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
from .errors import CheckpointError, CorruptCheckpointError
from .local import LocalTier, read_verified
from .log import get_logger
from .manifest import STATE_NAME, Manifest
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
