"""Keeping RUNNER_HOME and the controller's data dir private: folders 0700, files 0600.

The data dir holds secrets at rest: jobs' ``env:`` values in the database and its WAL, job output in the logs,
the workdir archives, the tokens. The controller runs with umask 077, so whatever it (and a local node it
starts) creates is private from the start; what an older version left readable is tightened once at start.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
# Subfolders of the data dir whose files an older version wrote 0644 (node folders are private already).
TIGHTENED = ("logs", "workdirs")


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed, and make it 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def make_data_dir_private(data_dir: Path) -> None:
    """From now on this process creates private files; the data dir, its files, logs and workdirs become so."""
    os.umask(PRIVATE_UMASK)
    private_dir(data_dir)
    _tighten(data_dir, recurse=False)
    for name in TIGHTENED:
        if (data_dir / name).is_dir():
            _tighten(data_dir / name, recurse=True)


def _tighten(folder: Path, recurse: bool) -> None:
    """Take group and other bits off every file (and, recursing, every folder) under ``folder``."""
    for current, dirs, files in os.walk(folder):
        for name in files + (dirs if recurse else []):
            path = Path(current) / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
                os.chmod(path, stat.S_IMODE(mode) & ~0o077)
        if not recurse:
            return
