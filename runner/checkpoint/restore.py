"""Find the newest checkpoint that verifies, on either tier, and load it.

Candidates are all committed checkpoints of both tiers (of every rank, under torch.distributed), newest
step first. The local copy is used when it is complete and verifies; otherwise what it lacks, or the
whole checkpoint when it is damaged, is fetched from the durable tier. Every file's size and checksum is
checked before anything is applied, so a damaged or partial checkpoint is skipped and never half-loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import rng
from .checksum import file_digest
from .dcp_format import METADATA_NAME
from .durable import NO_ROOM, DurableTier
from .errors import CheckpointError, CorruptCheckpointError, NoRoomToRestoreError, RestoreError
from .flat_read import read_flat
from .group import folder_identity
from .local import LocalTier, check_size
from .log import get_logger
from .manifest import FLAT, FOLDER, MANIFEST_NAME, Manifest

log = get_logger()


def read_folder(folder: Path, manifest: Manifest, pool=None) -> dict:
    """Verify every file of ``folder`` against ``manifest`` and rebuild the saved state (one pass: flat_read.py;
    ``pool``: memory made ready ahead, warm_pool.py)."""
    return read_flat(folder, manifest, pool)


def load_flat(objects: dict, extra: dict, state: dict, where: str) -> None:
    """Load a one-process checkpoint's state (read_folder) into the registered objects, ``extra`` and the RNGs."""
    saved = state["objects"]
    missing = [name for name in objects if name not in saved]
    if missing:
        raise RestoreError(f"{where} has no state for {', '.join(missing)}; register the same objects as the "
                           f"run that saved it, or point local_dir/durable_url elsewhere to start fresh")
    for name, obj in objects.items():
        try:
            obj.load_state_dict(saved[name])
        except Exception as exc:
            raise RestoreError(f"{where}: {name}.load_state_dict failed ({exc}); the checkpoint was saved "
                               f"by a different {name}. Use the same setup, or another checkpoint folder") from exc
    extra.update(state["extra"])
    rng.restore(state["rng"])


# ---------------------------------------------------------------------- any layout, one process or a group

@dataclass
class Restored:
    step: int
    location: str  # path or URL of the manifest the state came from
    world_size: int


def restore_into(local: LocalTier, durable: DurableTier | None, comm, folder_leader: bool, objects: dict,
                 extra: dict, apply_flat, max_step: int | None = None, apply_folder=None,
                 pool=None) -> Restored | None:
    """Load the newest checkpoint that verifies on every rank into ``objects``; None when there is none.

    Collective under torch.distributed (``comm`` is then the training thread's side group): the ranks
    agree on the candidates, each folder's leader makes its local copy complete and verified (fetching
    what it lacks from the durable tier: on a multi-node job a node's folder holds only its own ranks'
    files), and a candidate is used only when it verified for every rank.

    ``apply_folder(folder, manifest, where)`` is a framework integration's: it is given every verified
    candidate instead of ``apply_flat`` and raises RestoreError for one it cannot resume from. ``pool``
    (warm_pool.py): memory made ready ahead for a one-process checkpoint's tensors.
    """
    mine = set(s for s, _ in local.committed())
    durable_steps: set[int] = set()
    if durable is not None:
        try:
            durable_steps = set(durable.committed())
        except Exception as exc:  # noqa: BLE001 - an unreachable store leaves the local tier
            log.warning("durable tier unreadable; restoring from the local tier only",
                        url=durable.shown, error=durable.describe(exc))
    steps = sorted(set().union(*comm.gather(sorted(mine | durable_steps))), reverse=True)
    if max_step is not None:
        newer = [s for s in steps if s > max_step]
        if newer:
            log.warning("ignoring checkpoints newer than the one the controller handed over (fencing)",
                        max_step=max_step, ignored=sorted(newer))
        steps = [s for s in steps if s <= max_step]
    me = folder_identity(local.root)
    for step in steps:
        where, manifest, error = None, None, None
        if folder_leader:  # the manifest (and a DCP checkpoint's .metadata) here, verified
            try:
                where, manifest = _materialize_index(local, durable, step, in_local=step in mine,
                                                     in_durable=step in durable_steps)
            except (CheckpointError, OSError) as exc:
                error = exc
        if not _all_verified(comm, error, step):
            continue
        folder = local.folder(step)
        if manifest is None:  # a rank sharing its leader's folder
            try:
                manifest = local.read_manifest(folder)
                where = str(folder / MANIFEST_NAME)
            except (CheckpointError, OSError) as exc:
                error = exc
        needed = None if error is not None else _files_needed(folder, manifest, objects, apply_folder, comm)
        wanted = comm.gather((me, needed))
        # One process reading a flat checkpoint verifies each file as it reads it for the load, once; the check
        # ahead of the load (and the repair from the durable tier) then runs only when that read finds damage.
        one_pass = comm.world_size == 1 and folder_leader and apply_folder is None and manifest is not None \
            and manifest.layout == FLAT
        if folder_leader and error is None:  # the files the ranks of this folder read, fetched once here
            names = set()
            for where_from, theirs in wanted:
                if where_from == me:
                    names |= theirs
            try:
                manifest = _materialize_files(local, durable, step, manifest, names, in_durable=step in durable_steps,
                                              verify=not one_pass)
            except (CheckpointError, OSError) as exc:
                error = exc
        if not _all_verified(comm, error, step):
            continue
        try:
            if one_pass:
                apply_flat(_read_or_repair(local, durable, step, manifest, in_durable=step in durable_steps, pool=pool),
                           where)
            elif apply_folder is not None:
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


def _all_verified(comm, error: BaseException | None, step: int) -> bool:
    """True on every rank when no rank failed to make its folder's copy of ``step`` complete and verified.
    A RestoreError (a local disk too full to fetch it into) is raised on every rank: the checkpoint is good,
    and passing over it would start the training over."""
    if comm.all_true(error is None):
        return True
    refused = [text for text in comm.gather(_no_room_text(error)) if text]
    if refused:
        raise NoRoomToRestoreError(refused[0]) from error
    if error is not None:
        log.warning("skipping a checkpoint that does not verify", step=step, error=f"{type(error).__name__}: {error}")
    return False


def _no_room_text(error: BaseException | None) -> str | None:
    """What to tell the user when ``error`` says the local tier has no room for the checkpoint (None otherwise)."""
    if isinstance(error, NoRoomToRestoreError):
        return str(error)
    if isinstance(error, OSError) and error.errno in NO_ROOM:
        return f"{error}; free space there, or set local_dir (checkpoint.local_dir) to a larger disk"
    return None


def _files_needed(folder: Path, manifest: Manifest, objects: dict, apply_folder, comm) -> set[str]:
    """The files of the checkpoint this rank's load reads: under DCP, those its read plan names (a node
    fetches only its own ranks' shards); every file otherwise, or when the plan cannot be made (the load
    then says why)."""
    everything = {f["name"] for f in manifest.files}
    if apply_folder is not None or manifest.layout in (FLAT, FOLDER):
        return everything
    from . import dcp_format

    try:
        return dcp_format.files_needed(folder, objects, comm.rank, comm.world_size, manifest.world_size) & everything
    except Exception:  # noqa: BLE001 - another setup or a damaged .metadata: the load reports it
        return everything


def written_by(manifest: Manifest) -> str:
    """Who wrote a checkpoint, as people read it: 'the transformers 4.46.0 integration (GPT2LMHeadModel)'."""
    if manifest.layout != FOLDER:
        return "runner.checkpoint.Checkpointer"
    payload = manifest.payload or {}
    framework = f"{payload.get('framework', 'an unknown framework')} {payload.get('version', '')}".strip()
    model = f" ({payload['model']})" if payload.get("model") else ""
    return f"the {framework} integration{model}"


def _materialize_index(local: LocalTier, durable: DurableTier | None, step: int, in_local: bool,
                       in_durable: bool) -> tuple[str, Manifest]:
    """Make the local folder of ``step`` hold its manifest, committed, and (a DCP checkpoint) its verified
    ``.metadata``, which says where each item lies; the data files come with ``_materialize_files``."""
    folder = local.folder(step)
    manifest, where = None, str(folder / MANIFEST_NAME)
    if in_local:
        try:
            manifest = local.read_manifest(folder)
        except (CheckpointError, OSError) as exc:
            if not in_durable:
                raise
            log.warning("local manifest unreadable; using the durable one", step=step, error=str(exc))
    if manifest is None:
        if not in_durable:
            raise CorruptCheckpointError(f"{folder}: the manifest is missing here and the durable tier has no copy "
                                         f"of step {step}")
        manifest = durable.read_manifest(step)
        where = durable.location(step, MANIFEST_NAME)
        folder.mkdir(parents=True, exist_ok=True)
    index = [METADATA_NAME] if manifest.layout not in (FLAT, FOLDER) else []
    manifest = _fetch_verified(local, durable, step, manifest, index, in_durable)
    if not (folder / MANIFEST_NAME).is_file():
        local.commit(folder, manifest)  # the ranks sharing this folder read it; every file is verified before use
    return where, manifest


def _materialize_files(local: LocalTier, durable: DurableTier | None, step: int, manifest: Manifest,
                       names: set[str], in_durable: bool, verify: bool = True) -> Manifest:
    """Make the files ``names`` of ``step`` present and verified in its local folder, fetching from the
    durable tier those it lacks or that fail their checksum. ``verify=False``: check only their sizes (the
    caller reads them through their checksums and repairs with ``_read_or_repair``)."""
    return _fetch_verified(local, durable, step, manifest, [f["name"] for f in manifest.files if f["name"] in names],
                           in_durable, verify)


def _read_or_repair(local: LocalTier, durable: DurableTier | None, step: int, manifest: Manifest,
                    in_durable: bool, pool=None) -> dict:
    """A flat checkpoint's state, read and verified in one pass; when that finds a damaged file and the durable
    tier has the step, the local copy is repaired from it (as ``_fetch_verified`` does) and read again."""
    folder = local.folder(step)
    try:
        return read_folder(folder, manifest, pool)
    except CorruptCheckpointError as exc:
        if not in_durable:
            raise
        log.warning("local copy damaged; fetching the durable one", step=step, error=str(exc))
    manifest = _fetch_verified(local, durable, step, manifest, [f["name"] for f in manifest.files], in_durable)
    return read_folder(folder, manifest, pool)


def _fetch_verified(local: LocalTier, durable: DurableTier | None, step: int, manifest: Manifest,
                    names: list[str], in_durable: bool, verify: bool = True) -> Manifest:
    """Fetch what ``names`` lack here, verify them; a damaged local copy is replaced by the durable one (and
    its manifest, returned, when the two differ). ``verify=False`` checks sizes only."""
    folder = local.folder(step)
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        if not in_durable:
            raise CorruptCheckpointError(f"{folder}: files {missing} are missing here and the durable tier "
                                         f"has no copy of step {step}")
        durable.download(step, manifest, folder, names=missing)
    try:
        if verify:
            verify_files(folder, manifest, names)
        else:
            entries = {f["name"]: f for f in manifest.files}
            for name in names:
                check_size(folder / name, entries[name])
        return manifest
    except CorruptCheckpointError as exc:
        if not in_durable:
            raise
        log.warning("local copy damaged; fetching the durable one", step=step, error=str(exc))
    theirs = durable.read_manifest(step)
    if theirs.files != manifest.files:  # another write of this step: the durable tier's is the committed one
        local.uncommit(folder)
        names = [f["name"] for f in theirs.files if f["name"] in set(names) or f["name"] == METADATA_NAME]
    entries = {f["name"]: f for f in theirs.files}
    damaged = [n for n in names if not _verifies(folder / n, entries[n], theirs)]
    durable.download(step, theirs, folder, names=damaged)
    verify_files(folder, theirs, names)
    if not (folder / MANIFEST_NAME).is_file():
        local.commit(folder, theirs)
    return theirs


def _verifies(path: Path, entry: dict, manifest: Manifest) -> bool:
    try:
        check_size(path, entry)
    except CorruptCheckpointError:
        return False
    return file_digest(path, manifest.checksum) == entry["checksum"]


def verify_files(folder: Path, manifest: Manifest, names: list[str]) -> None:
    """Check the size and checksum of the files ``names`` of ``folder``, reading each in chunks."""
    wanted = set(names)
    verify_folder(folder, manifest, lambda entry: entry["name"] in wanted)


def verify_folder(folder: Path, manifest: Manifest, which=None) -> None:
    """Check every file's size and checksum (or those ``which(entry)`` picks), reading each file in chunks
    (none is held in memory)."""
    for entry in manifest.files:
        if which is not None and not which(entry):
            continue
        path = folder / entry["name"]
        check_size(path, entry)
        if file_digest(path, manifest.checksum) != entry["checksum"]:
            raise CorruptCheckpointError(f"{path} fails its {manifest.checksum} checksum")
