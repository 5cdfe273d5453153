"""`runner submit` ships the workdir without .git, but with the commit it was at (for the run manifest)."""

from __future__ import annotations

import json
import subprocess
import tarfile

from runner.cli.workdir import pack_workdir
from runner.source import SOURCE_FILE


def _members(folder) -> dict[str, bytes]:
    with pack_workdir(folder) as packed, tarfile.open(fileobj=packed, mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_a_git_workdir_ships_its_commit_and_dirtiness_but_not_git(tmp_path):
    """The packed workdir has SOURCE_FILE with HEAD and whether tracked files changed, and no .git."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "train.py").write_text("print(2)\n")

    members = _members(tmp_path)
    assert json.loads(members[f"./{SOURCE_FILE}"]) == {"git_commit": head, "git_dirty": True}
    assert not any("/.git/" in name for name in members) and "./train.py" in members


def test_a_folder_outside_git_ships_no_source_record(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    assert list(_members(tmp_path)) == ["./train.py"]
