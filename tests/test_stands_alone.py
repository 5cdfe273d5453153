"""The repository stands on its own: no file cites a document that is not in it, or a folder outside it.

The interfaces the project promises are written in docs/ (job-file.md, environment.md, restart-log.md,
api.md, protocol.md, ...); code, tests and docs cite those. A reader who clones the repository can follow
every citation.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Built from pieces, so that this file does not hold what it looks for.
OUTSIDE = ("CONTRACT" + " §", "../" + "shared", "FIELD" + "-NOTES")


def _repo_files() -> list[Path]:
    """Every file git tracks or would track (ignored build outputs and virtualenvs aside), outside .git."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):  # an unpacked source archive: walk the tree instead
        return [p for p in REPO.rglob("*") if p.is_file() and ".git" not in p.relative_to(REPO).parts]
    return [REPO / name for name in listed if name and (REPO / name).is_file()]


def test_no_file_points_outside_the_repository():
    found = []
    for path in _repo_files():
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}" for needle in OUTSIDE
                      if needle in line]
    assert not found, ("cite the repository's own docs (docs/*.md) instead of a document or folder outside it:\n"
                       + "\n".join(found))


def test_the_promised_interfaces_are_documented():
    """Each interface has its page in docs/, and the docs' index links it."""
    index = (REPO / "README.md").read_text()
    for page in ("job-file.md", "environment.md", "restart-log.md", "api.md", "protocol.md"):
        assert (REPO / "docs" / page).is_file(), page
        assert f"docs/{page}" in index, f"README.md does not link docs/{page}"
