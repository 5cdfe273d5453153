"""The controller's own wheel (runner/controller/agent_wheel.py): built from its source tree, or packed back
from an installed distribution, both installable and holding the same files."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

from runner import __version__
from runner.controller.agent_wheel import AgentWheel, repack_installed, source_tree
from runner.distribution import DIST_NAME, wheel_filename


def _members(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if not n.endswith(("/RECORD", "/INSTALLER", "/REQUESTED"))}


def test_the_wheel_of_a_source_tree_and_of_its_installed_copy_hold_the_same_files(tmp_path):
    """Built once from the source tree (and kept: a second ask builds nothing), installed with pip, then
    repacked from that install: the repacked wheel has the built one's files and installs again."""
    assert source_tree() is not None  # the tests run from a checkout
    wheel = AgentWheel(tmp_path / "cache")
    built = wheel.path()
    assert built.name == wheel_filename() and built.parent == tmp_path / "cache"
    assert wheel.path() == built and built.stat().st_mtime_ns == wheel.path().stat().st_mtime_ns
    assert not list((tmp_path / "cache").glob(".build-*"))  # the build folder is gone

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(site), str(built)], check=True, timeout=300)
    dist = importlib.metadata.PathDistribution(site / f"{DIST_NAME.replace('-', '_')}-{__version__}.dist-info")
    (tmp_path / "work").mkdir()
    repacked = repack_installed(tmp_path / "work", dist)
    assert repacked.name == wheel_filename()
    assert _members(repacked) == _members(built)

    again = tmp_path / "again"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(again), str(repacked)], check=True, timeout=300)
    assert (again / "runner" / "providers" / "bootstrap.sh").is_file() and (again / "agents" / "main.py").is_file()
