"""Find the newest checkpoint that verifies, on either tier, and load it.

Candidates are all committed checkpoints of both tiers (of every rank, under torch.distributed), newest
step first. The local copy is used when it is complete and verifies; otherwise what it lacks, or the
whole checkpoint when it is damaged, is fetched from the durable tier. Every file's size and checksum is
checked before anything is applied, so a damaged or partial checkpoint is skipped and never half-loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checksum import file_digest
from .durable import DurableTier
from .errors import CheckpointError, CorruptCheckpointError, RestoreError
from .local import LocalTier, check_size, read_verified
from .log import get_logger
from .manifest import FLAT, FOLDER, MANIFEST_NAME, STATE_NAME, Manifest
from .staging import rebuild

log = get_logger()


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


# ---------------------------------------------------------------------- any layout, one process or a group

@dataclass
class Restored:
    step: int
    location: str  # path or URL of the manifest the state came from
    world_size: int


def restore_into(local: LocalTier, durable: DurableTier | None, comm, folder_leader: bool, objects: dict,
                 extra: dict, apply_flat, max_step: int | None = None, apply_folder=None) -> Restored | None:
    """Load the newest checkpoint that verifies on every rank into ``objects``; None when there is none.

    Collective under torch.distributed (``comm`` is then the training thread's side group): the ranks
    agree on the candidates, each folder's leader makes its local copy complete and verified (fetching
    what it lacks from the durable tier: on a multi-node job a node's folder holds only its own ranks'
    files), and a candidate is used only when it verified for every rank.

    ``apply_folder(folder, manifest, where)`` is a framework integration's: it is given every verified
    candidate instead of ``apply_flat`` and raises RestoreError for one it cannot resume from.
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
            if apply_folder is not None:
                apply_folder(folder, manifest, where)
            elif manifest.layout == FOLDER:
                raise RestoreError(f"{where} was written by {written_by(manifest)}, not by runner.checkpoint."
                                   f"Checkpointer; resume it with that integration, or point local_dir/durable_url "
                                   f"elsewhere to start fresh")
            elif manifest.layout == FLAT:
                apply_flat(read_folder(folder, manifest), where)
            else:
                from . import dcp_format

                dcp_format.load(folder, objects, extra, comm, manifest.world_size)
        except (CheckpointError, OSError) as exc:  # RestoreError (another setup) included: told apart below
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


def written_by(manifest: Manifest) -> str:
    """Who wrote a checkpoint, as people read it: 'the transformers 4.46.0 integration (GPT2LMHeadModel)'."""
    if manifest.layout != FOLDER:
        return "runner.checkpoint.Checkpointer"
    payload = manifest.payload or {}
    framework = f"{payload.get('framework', 'an unknown framework')} {payload.get('version', '')}".strip()
    model = f" ({payload['model']})" if payload.get("model") else ""
    return f"the {framework} integration{model}"


def _materialize(local: LocalTier, durable: DurableTier | None, step: int, in_local: bool,
                 in_durable: bool) -> tuple[str, Manifest]:
    """Make the local folder of ``step`` hold every file of the checkpoint, verified; committed locally."""
    folder = local.folder(step)
    manifest, where, from_durable = None, str(folder / MANIFEST_NAME), False

    def fetch(names: list[str] | None) -> Manifest:
        nonlocal where, from_durable
        fetched = durable.read_manifest(step)
        where, from_durable = durable.location(step, MANIFEST_NAME), True
        folder.mkdir(parents=True, exist_ok=True)
        local.uncommit(folder)
        durable.download(step, fetched, folder, names=names(fetched) if names else None)
        return fetched

    if in_local:
        manifest = local.read_manifest(folder)
    missing = [] if manifest is None else [f["name"] for f in manifest.files if not (folder / f["name"]).is_file()]
    if manifest is None or missing:
        if not in_durable:
            raise CorruptCheckpointError(f"{folder}: files {missing} are missing here and the durable tier "
                                         f"has no copy of step {step}")
        manifest = fetch(lambda m: [f["name"] for f in m.files if not (folder / f["name"]).is_file()])
    try:
        verify_folder(folder, manifest)
    except CorruptCheckpointError as exc:
        if not in_durable or from_durable:
            raise
        log.warning("local copy damaged; fetching the durable one", step=step, error=str(exc))
        manifest = fetch(None)
        verify_folder(folder, manifest)
    if not (folder / MANIFEST_NAME).is_file():
        try:
            local.commit(folder, manifest)  # the local tier now holds a verified copy
        except OSError:
            pass
    return where, manifest


def verify_folder(folder: Path, manifest: Manifest) -> None:
    """Check every file's size and checksum, reading each file in chunks (none is held in memory)."""
    for entry in manifest.files:
        path = folder / entry["name"]
        check_size(path, entry)
        if file_digest(path, manifest.checksum) != entry["checksum"]:
            raise CorruptCheckpointError(f"{path} fails its {manifest.checksum} checksum")
