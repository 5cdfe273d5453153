"""The source a job runs: its folder's git commit, and whether tracked files differ from that commit.

A job's workdir is shipped without ``.git`` (runner/spec/workdir.py), so ``runner submit`` records the
user's git state in the packed workdir as ``SOURCE_FILE``; the run manifest on the node reads it when the
folder it runs in is not a repository itself (runner/checkpoint/run_manifest.py). Standard library only.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SOURCE_FILE = ".runner-source.json"
GIT_TIMEOUT_S = 5.0


def _git(folder: str | Path | None, *args: str) -> str | None:
    """A git command's stdout in ``folder`` (None: the working directory), or None when it cannot answer."""
    try:
        done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: str | Path | None = None) -> tuple[str | None, bool | None]:
    """The commit checked out in ``folder`` and whether tracked files in it differ from that commit; (None, None)
    outside a repository (or without git)."""
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no", "--", ".")
    return commit.strip(), (None if status is None else bool(status.strip()))


def source_record(folder: str | Path) -> bytes | None:
    """What ``runner submit`` ships as SOURCE_FILE: the folder's git state as JSON; None outside a repository."""
    commit, dirty = git_state(folder)
    return None if commit is None else json.dumps({"git_commit": commit, "git_dirty": dirty}).encode()


def shipped_state(folder: str | Path | None = None) -> tuple[str | None, bool | None]:
    """The git state recorded in ``folder``'s SOURCE_FILE at submission; (None, None) when there is none."""
    try:
        record = json.loads((Path(folder or ".") / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(record, dict) or not isinstance(record.get("git_commit"), str):
        return None, None
    dirty = record.get("git_dirty")
    return record["git_commit"], dirty if isinstance(dirty, bool) else None
