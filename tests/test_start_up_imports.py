"""Processes started often load only what they use: a simulated node (once per launch) and the CLI's job
commands that read no job file (a test, a script or a person polling `runner status`) start without the store,
the job-file schema or pydantic, which cost them most of a second of CPU each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("runner.state", "runner.spec.schema", "runner.spec.load", "pydantic", "fsspec")


def _loaded(code: str) -> set[str]:
    """The HEAVY modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def test_a_simulated_node_starts_without_the_provider_behind_it():
    assert _loaded("import runner.providers.local.node, runner.providers.local.metadata") == set()


@pytest.mark.parametrize("command", ["status", "logs", "restarts", "jobs", "cancel", "preempt"])
def test_a_job_command_that_reads_no_job_file_starts_without_the_schema(command):
    code = f"from runner.cli.main import cli; cli.get_command(None, {command!r})"
    assert _loaded(code) == set()

