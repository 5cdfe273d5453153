"""What of a job's workdir is shipped to its nodes, and the links that cannot be.

A node unpacks the workdir refusing every member that would land outside it (tarfile's "data" filter), so a
symbolic link with an absolute target, or one whose target leaves the workdir, would stop the job on every node.
It is refused here, on the user's machine, where it can be fixed.
"""

from __future__ import annotations

import os
from pathlib import Path

EXCLUDED = {".git", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", "checkpoints"}


def shipped(relative: str) -> bool:
    """Is this path (relative to the workdir) packed, or excluded as VCS data, a cache or a virtualenv?"""
    return not (any(part in EXCLUDED for part in Path(relative).parts) or relative.endswith(".pyc"))


def escaping_links(folder: Path) -> list[str]:
    """One problem line per shipped symbolic link that points outside ``folder`` or to an absolute path."""
    root = folder.resolve()
    problems = []
    for current, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED]
        for name in sorted(dirs + files):
            path = Path(current) / name
            relative = path.relative_to(root).as_posix()
            if not path.is_symlink() or not shipped(relative):
                continue
            target = os.readlink(path)
            inside = (path.parent / target).resolve()
            if os.path.isabs(target) or (inside != root and root not in inside.parents):
                problems.append(f"workdir: {relative} is a symbolic link to {target}, outside the workdir, which "
                                "nodes do not get; copy what it points to into the workdir, or make it a relative "
                                "link to a file inside it")
    return problems
