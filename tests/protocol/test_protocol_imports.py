"""runner.protocol stands alone: importing it (every module of it) in a fresh interpreter loads nothing but the
standard library and itself, so the checkpoint library in a training process, the agent and the controller may all
import it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import runner.protocol

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, sys
before = set(sys.modules)
for name in NAMES:
    importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_importing_the_protocol_loads_only_the_standard_library():
    names = ["runner.protocol"] + [f"runner.protocol.{m.name}" for m in pkgutil.iter_modules(runner.protocol.__path__)]
    assert len(names) >= 7, names  # environment, framing, messages, actions, events, states (and their base)
    result = subprocess.run([sys.executable, "-c", f"NAMES = {names!r}\n" + PROBE], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    outside = [name for name in loaded if name.split(".")[0] not in sys.stdlib_module_names
               and name != "runner" and not name.startswith("runner.protocol")]
    assert outside == [], f"runner.protocol pulls in {outside}"
    assert not any(name.startswith(("torch", "pydantic", "structlog", "agents")) for name in loaded)
