"""The job's workdir as it reaches a node: a gzipped tar from the controller, unpacked with no member escaping the
workdir and every file private to the node's user."""

from __future__ import annotations

import tarfile
from pathlib import Path


def extract_safely(tar: tarfile.TarFile, into: Path) -> None:
    """Extract the job's workdir with no member escaping ``into`` (tarfile's "data" filter where the
    Python has it, 3.10.12 and later; the same checks by hand before that), every member private to the
    node's user: a job's code may hold secrets, and tarfile sets the archive's modes, whatever the umask."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, filter=_private_data_member)
        return
    root = into.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or (target != root and root not in target.parents):
            raise tarfile.TarError(f"workdir archive member {member.name!r} is not a plain file inside the workdir")
        member.mode &= OWNER_ONLY
    tar.extractall(into)


OWNER_ONLY = 0o700


def _private_data_member(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    member = tarfile.data_filter(member, path)
    return member if member.mode is None else member.replace(mode=member.mode & OWNER_ONLY, deep=False)
