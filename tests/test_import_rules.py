"""The dependency rules of the architecture hold: `lint-imports` keeps every contract in .importlinter."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _lint_imports() -> subprocess.CompletedProcess:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    return subprocess.run([command, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_every_import_contract_is_kept():
    """Agents import neither the controller's side nor a cloud SDK; the checkpoint library needs only torch,
    fsspec and xxhash; the CLI reaches the controller over HTTP; the controller's side is layered (cli, the
    composition root, web, controller, scheduler, providers and cost policy, state, protocol), the database
    module and its migrations form no cycle, and runner.protocol imports nothing but the standard library. A broken rule prints the import at fault."""
    result = _lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = configparser.ConfigParser()
    contracts.read(REPO / ".importlinter")
    names = [contracts[s]["name"] for s in contracts.sections() if s.startswith("importlinter:contract:")]
    assert len(names) == 6
    for name in names:
        assert f"{name} KEPT" in result.stdout or f"{name}KEPT" in result.stdout, result.stdout
