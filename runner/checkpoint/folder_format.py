"""The folder layout: a training framework's own checkpoint folder as the payload of a runner checkpoint.

The framework (the Hugging Face Trainer, Lightning) writes its checkpoint the way it always does; the
integration moves or links those files into ``<local_dir>/.incoming-step-N`` (``incoming``) in the training
thread, and the writer thread moves them into the step's folder, checksums and fsyncs every file, and
writes the manifest last, exactly as for the library's own layouts. The durable upload, ``keep`` and the
restore (verify, fall back, fetch from the durable tier) are the same code.

Under torch.distributed every rank hands in the files its node holds (only the lowest rank of each local
folder does); a file name present on several nodes belongs to the lowest rank that has it. Payload folders
must be flat: a framework that writes sub-folders (DeepSpeed, sharded FSDP) is refused with a clear error.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .checksum import file_digest
from .errors import CheckpointError
from .local import fsync_file
from .manifest import FOLDER, MANIFEST_NAME, folder_name

INCOMING_PREFIX = ".incoming-"


def incoming_folder(root: Path, step: int) -> Path:
    """Where a payload waits for the writer thread: a hidden sibling of the step folders (never pruned)."""
    return Path(root) / f"{INCOMING_PREFIX}{folder_name(step)}"


def take_in(source: Path, target: Path, move: bool) -> bool:
    """Put the files of the framework's folder ``source`` into the empty folder ``target``, in the caller's
    thread (the framework may rewrite or rotate ``source`` as soon as we return). Moves them when ``move``,
    else hard-links them; copies where neither works (another filesystem). Returns True when it copied."""
    source, target = Path(source), Path(target)
    names = sorted(os.listdir(source))
    nested = [n for n in names if (source / n).is_dir()]
    if nested:
        raise CheckpointError(f"{source} holds sub-folders ({', '.join(nested)}); the runner commits flat checkpoint "
                              f"folders only (one process or DDP), not sharded ones (DeepSpeed, FSDP)")
    if MANIFEST_NAME in names:
        raise CheckpointError(f"{source} already holds a {MANIFEST_NAME}; it is a runner checkpoint, not a "
                              f"framework's folder")
    copied = False
    for name in names:
        try:
            if move:
                os.rename(source / name, target / name)
            else:
                os.link(source / name, target / name)
        except OSError:  # another filesystem, or links not allowed
            shutil.copy2(source / name, target / name)
            copied = True
    if move and copied:
        for name in names:
            (source / name).unlink(missing_ok=True)
    if move:
        shutil.rmtree(source, ignore_errors=True)
    return copied


class FolderFormat:
    """Writes a folder payload into the step folder: move, checksum, fsync (the manifest comes after)."""

    def __init__(self, comm=None) -> None:
        from .group import Solo

        self.comm = comm or Solo()

    def write(self, job, folder: Path) -> list[dict]:
        incoming: Path | None = job.staged
        names, error = [], None
        try:
            names = sorted(os.listdir(incoming)) if incoming is not None else []
        except OSError as exc:
            error = exc
        everyone = self.comm.gather(names)  # before anything else can raise: every rank must reach it
        if error is not None:
            raise error
        taken = set().union(*everyone[:self.comm.rank]) if self.comm.rank else set()
        for name in names:
            os.replace(incoming / name, folder / name)
        if incoming is not None:
            shutil.rmtree(incoming, ignore_errors=True)
        files = []
        for name in names:
            if name in taken:
                continue
            path = folder / name
            fsync_file(path)
            files.append({"name": name, "bytes": path.stat().st_size, "checksum": file_digest(path)})
        return files

    layout = FOLDER
    needs_room = False  # the files are moved in from the same disk

    @staticmethod
    def nbytes(job) -> int:  # noqa: ARG004 - the Persister's format interface
        return 0
