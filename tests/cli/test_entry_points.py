"""The `runner` command is also `python -m runner` and `python -m runner.cli`, with the same exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import write_job


@pytest.mark.parametrize("module", ["runner", "runner.cli"])
def test_python_m_runs_the_runner_command_with_its_exit_codes(tmp_path, module):
    """A bad job file through `python -m MODULE validate` is exit 2 naming the key; a good one is exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["RUNNER_HOME"] = str(tmp_path / "home")
    bad = write_job(tmp_path / "bad", "name: ok\nrun: x\ncheckpoint: {keep: 0}\n")
    result = subprocess.run([sys.executable, "-m", module, "validate", str(bad)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 2 and "checkpoint.keep" in result.stderr, result.stderr
    good = write_job(tmp_path / "good", "name: ok\nrun: x\n")
    result = subprocess.run([sys.executable, "-m", module, "validate", str(good)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
